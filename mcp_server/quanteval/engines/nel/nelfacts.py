"""The few NEL facts validation and launches need: what NEL 0.2.6's executors run here and require (read from its
source), and its config models, cached per NEL version so validation does not import NEL.

Importing NEL's config models costs about a second (nemo_evaluator pulls flask, structlog and
its adapters); validation needs only their field names and types. The first use per NEL
version imports NEL once, stores the models' JSON schemas in the state directory, and every
later process rebuilds equivalent pydantic models from that file: same fields, types,
defaults and extra="forbid", so the same pydantic error messages. (NEL's own model
validators only rewrite deprecated values; they are not carried over.)
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, create_model

from quanteval import envvars, kept
from quanteval.models import ToolError

CACHE_SCHEMA = 2
# The NEL models validation checks a config against, by the module that defines them.
MODELS = {
    "ApiEndpoint": "nemo_evaluator.api.api_dataclasses",
    "ConfigParams": "nemo_evaluator.api.api_dataclasses",
    "EvaluationConfig": "nemo_evaluator.api.api_dataclasses",
    "MountsModel": "nemo_evaluator_launcher.common.config_models",
    "EvaluationModel": "nemo_evaluator_launcher.common.config_models",
    "TaskModel": "nemo_evaluator_launcher.common.config_models",
}

# What NEL 0.2.6's executors run on this machine: the slurm executor opens an ssh ControlMaster and submits with
# `ssh ... sbatch` (executors/slurm/executor.py, common/ssh_utils.py) and uploads the run directories with `rsync -qcaz`
# over ssh (common/ssh_utils.rsync_upload), never scp; the local executor runs every task in Docker and starts each
# task's run.sh with bash (executors/local/executor.py).
EXECUTOR_PROGRAMS: dict[str, tuple[str, ...]] = {"slurm": ("ssh", "rsync"), "local": ("docker", "bash")}
# The `execution` keys an executor cannot submit without (NEL's SLURM template leaves them ???), with what each is.
REQUIRED_EXECUTION_KEYS: dict[str, dict[str, str]] = {
    "slurm": {"hostname": "the login node to ssh to", "account": "the SLURM account to charge"}}
REPLICATING_EXECUTORS = frozenset({"slurm"})  # they start execution.num_instances deployments; the others start one
EVALUATION_CHECKPOINT_MOUNT = "/checkpoint"  # where a local checkpoint is mounted in the evaluation container
REPEAT_KEYS = ("n_samples", "num_repeats", "repeats")  # params.extra keys NEL's harnesses use for repeats


def _package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ToolError(f"{package} is not installed in this Python ({sys.executable}). Install nemo-evaluator-launcher==0.2.6 "
                        f"into it (`{envvars.setup_command('setup')}` does).")
    return Path(next(iter(spec.submodule_search_locations)))


def configs_dir() -> Path:
    """NEL's packaged Hydra defaults (configs/execution/*.yaml, configs/deployment/*.yaml)."""
    return _package_dir("nemo_evaluator_launcher") / "configs"


@functools.cache
def packaged_defaults(group: str) -> dict[str, Any]:
    """NEL's packaged defaults of a config group ('deployment/sglang': tensor_parallel_size 8, image
    lmsysorg/sglang:latest; 'execution/slurm/default': walltime 01:00:00), read as a file: importing NEL takes seconds."""
    import yaml

    try:
        data = yaml.safe_load((configs_dir() / f"{group}.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, ToolError):
        return {}
    return data if isinstance(data, dict) else {}


@functools.cache
def _versions() -> str:
    found = []
    for distribution in ("nemo-evaluator-launcher", "nemo-evaluator"):
        try:
            found.append(f"{distribution}-{importlib.metadata.version(distribution)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{distribution}-none")
    return "_".join(found)


def _facts_from_nel() -> dict[str, Any]:
    import importlib

    from nemo_evaluator.adapters import adapter_config
    from nemo_evaluator_launcher.common import env_vars

    return {
        "schema": CACHE_SCHEMA,
        "models": {name: getattr(importlib.import_module(module), name).model_json_schema() for name, module in MODELS.items()},
        "env_var_prefixes": [env_vars.EnvVarFromHost.PREFIX, env_vars.EnvVarLiteral.PREFIX, env_vars.EnvVarRuntime.PREFIX],
        "adapter_keys": sorted(set(adapter_config.LegacyAdapterConfig.model_fields) | set(adapter_config.AdapterConfig.model_fields)),
    }


@functools.cache
def _facts() -> dict[str, Any]:
    try:
        cached = json.loads(kept.read("nel-facts", _versions()) or "{}")
        if cached.get("schema") == CACHE_SCHEMA:
            return cached
    except ValueError:
        pass
    facts = _facts_from_nel()
    kept.keep("nel-facts", _versions(), json.dumps(facts))  # one not written costs the next process the import again
    return facts


@functools.cache
def model(name: str) -> type[BaseModel]:
    """A pydantic model equivalent to NEL's `name` for validation (fields, types, defaults, extra)."""
    schema = _facts()["models"][name]
    return _build(name, schema, schema.get("$defs", {}))


def adapter_keys() -> frozenset[str]:
    """adapter_config fields nemo-evaluator knows: the flat (legacy) form NEL's templates use and the interceptor form."""
    return frozenset(_facts()["adapter_keys"])


_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool, "null": type(None)}


def _type(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        target = defs[name]
        return Literal[tuple(target["enum"])] if "enum" in target else _build(name, target, defs)
    if "enum" in schema:
        return Literal[tuple(schema["enum"])]
    if "const" in schema:
        return Literal[schema["const"]]
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return Union[tuple(_type(option, defs) for option in options)]  # noqa: UP007 (built at run time)
    kind = schema.get("type")
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        return list[_type(schema["items"], defs)] if "items" in schema else list[Any]
    if kind == "object":
        if "properties" in schema:
            return _build("Object", schema, defs)
        values = schema.get("additionalProperties")
        return dict[str, _type(values, defs)] if isinstance(values, dict) else dict[str, Any]
    return Any


def _build(name: str, schema: dict[str, Any], defs: dict[str, Any]) -> type[BaseModel]:
    required = set(schema.get("required", ()))
    fields: dict[str, Any] = {
        field: (_type(sub, defs), ... if field in required else sub.get("default"))
        for field, sub in schema.get("properties", {}).items()
    }
    extra = "forbid" if schema.get("additionalProperties") is False else "allow"
    return create_model(name, __config__=ConfigDict(extra=extra), **fields)


def check_env_var_value(raw: str) -> None:
    """NEL's rule for `env_vars` values (host:, lit: or runtime: prefix); ValueError with NEL's message if broken.

    A value with one of NEL's prefixes and no `${` is valid without asking NEL; anything else goes
    to NEL's own parser, so the message is NEL's (and the import is paid only for a broken config).
    """
    if raw.startswith(tuple(_facts()["env_var_prefixes"])) and "${" not in raw:
        return
    from nemo_evaluator_launcher.common.env_vars import parse_env_var_value

    parse_env_var_value(raw)
