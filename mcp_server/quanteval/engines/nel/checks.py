"""NEL 0.2.6's validation rules, part one: the pass's context, known keys and types (NEL's own pydantic models), tasks,
env vars, overrides. Part two (engines/nel/rules.py) checks deployment, execution, images and generation.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from quanteval.configfile import MISSING, missing_value_paths, to_plain
from quanteval.engines import catalogue
from quanteval.engines.base import Problem, Severity
from quanteval.engines.nel import nelfacts
from quanteval.engines.nel.config import config_tasks, env_var_defined, env_var_references, model_source_report
from quanteval.engines.recipes import Recipe
from quanteval.models import ToolError
from quanteval.serving import checkpoint
from quanteval.serving.serverflags import parse_extra_args

# ---------------------------------------------------------------------------
# Known keys, from NEL's packaged defaults plus keys NEL's code reads that no default names.

TOP_LEVEL_KEYS = {"defaults", "execution", "deployment", "evaluation", "target", "env_vars", "auxiliary_deployments", "export", "hydra"}
EXTRA_EXECUTION_KEYS = {"type", "auto_export", "env_vars", "mounts", "gpus_per_node", "evaluation_gpu_visible", "lepton_platform", "deployment", "proxy"}
EXTRA_DEPLOYMENT_KEYS = {"type", "hf_model_handle", "checkpoint_path", "cache_path", "multiple_instances", "pre_cmd", "lepton_config", "env_vars", "n_tasks"}
NEMO_EVALUATOR_CONFIG_KEYS = {"config", "target", "metadata"}


@cache
def _nel_default_keys(section: str) -> frozenset[str]:
    """Keys of every packaged NEL default for `section` (execution or deployment)."""
    import yaml

    keys: set[str] = set()
    for file in (nelfacts.configs_dir() / section).rglob("*.yaml"):
        data = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        keys |= {key for key in data if key != "defaults"}
    return frozenset(keys)


# A Hydra override: optional +, ++ or ~ prefix, a key path, "=", a value (~key may stand alone).
_OVERRIDE = re.compile(r"^(?P<prefix>\+\+|\+|~)?(?P<key>[A-Za-z_][\w\-]*(?:\.[\w\-]+)*)(?P<eq>=(?P<value>.*))?$", re.S)


# ---------------------------------------------------------------------------
# The pass


@dataclass
class Context:
    doc: Any
    config_path: Path
    deployment: str
    execution: str
    check_env: bool
    problems: list[Problem] = field(default_factory=list)
    _report: Any = None
    _report_read: bool = False

    def add(self, path: str, severity: Severity, rule: str, message: str, fix: str) -> None:
        self.problems.append(Problem(key=path, severity=severity, rule=rule, message=message, fix=fix))

    def section(self, name: str) -> dict:
        value = self.doc.get(name)
        return value if isinstance(value, dict) else {}

    def checkpoint_report(self) -> checkpoint.CheckpointReport | None:
        """inspect_checkpoint's report when the checkpoint is readable here: a local checkpoint_path or a cached hf_model_handle."""
        if not self._report_read:
            self._report_read = True
            self._report = model_source_report(self.doc, self.config_path)
        return self._report


def close(word: str, known: set[str] | frozenset[str]) -> str | None:
    matches = difflib.get_close_matches(word, sorted(known), n=1, cutoff=0.75)
    return matches[0] if matches else None


def is_unresolved(value: Any) -> bool:
    """??? (reported once, by the missing-value rule) or an interpolation checked only at run time."""
    return value == MISSING or (isinstance(value, str) and "${" in value)


def _check_keys(ctx: Context, mapping: Any, prefix: str, known: set[str] | frozenset[str], what: str) -> None:
    """Unknown keys: a near miss of a known key is an error (a typo NEL would silently ignore), others a warning."""
    if not isinstance(mapping, dict):
        return
    for key in mapping:
        if key in known:
            continue
        path = f"{prefix}.{key}" if prefix else str(key)
        near = close(str(key), known)
        if near:
            ctx.add(path, "error", "unknown_key", f"'{key}' is not a {what} key; it looks like a misspelling of '{near}'.", f"Rename '{key}' to '{near}'.")
        else:
            ctx.add(path, "warning", "unknown_key", f"'{key}' is not a {what} key NEL knows; it is probably ignored.", f"Remove it, or check the spelling against: {', '.join(sorted(known))}.")


def check_missing(ctx: Context) -> None:
    deployment = ctx.section("deployment")
    for path in missing_value_paths(ctx.doc):
        fix = f"Set it with set_config_value (path '{path}')."
        if path == "deployment.hf_model_handle" and isinstance(deployment.get("checkpoint_path"), str) and deployment["checkpoint_path"] != MISSING:
            fix = "checkpoint_path is set, so set hf_model_handle to null (never both)."
        elif path.startswith("deployment.") or path.endswith("params.extra.tokenizer") or path.endswith("params_to_add"):
            fix += " apply_checkpoint fills the deployment, tokenizer and reasoning values from the checkpoint."
        ctx.add(path, "error", "missing_value", "Still ??? — NEL stops at the first one it meets.", fix)


def check_top_level(ctx: Context) -> None:
    _check_keys(ctx, ctx.doc, "", TOP_LEVEL_KEYS, "top-level")
    for section, extra in (("execution", EXTRA_EXECUTION_KEYS), ("deployment", EXTRA_DEPLOYMENT_KEYS)):
        _check_keys(ctx, ctx.section(section), section, _nel_default_keys(section) | extra, section)
    target = ctx.section("target")
    _check_keys(ctx, target, "target", {"api_endpoint"}, "target")
    endpoint = target.get("api_endpoint")
    if isinstance(endpoint, dict):
        # adapter_config and api_key: known issues with their own rules (_check_known_issues)
        plain = {key: value for key, value in to_plain(endpoint).items() if key not in ("adapter_config", "api_key")}
        pydantic_problems(ctx, nelfacts.model("ApiEndpoint"), plain, "target.api_endpoint", {})
    mounts = ctx.section("execution").get("mounts")
    if isinstance(mounts, dict):
        pydantic_problems(ctx, nelfacts.model("MountsModel"), to_plain(mounts), "execution.mounts", {})


def _loc_path(prefix: str, loc: tuple, task_paths: dict[int, str]) -> str:
    path = prefix
    for index, part in enumerate(loc):
        if isinstance(part, int):
            path = task_paths.get(part, f"{path}[{part}]") if index == 1 and loc[0] == "tasks" else f"{path}[{part}]"
        else:
            path = f"{path}.{part}" if path else str(part)
    return path


def pydantic_problems(ctx: Context, model: type[BaseModel], data: Any, prefix: str, task_paths: dict[int, str], skip_extra: bool = False) -> None:
    try:
        model.model_validate(data)
    except ValidationError as exc:
        for error in exc.errors():
            loc = tuple(error["loc"])
            path = _loc_path(prefix, loc, task_paths)
            value = error.get("input")
            if error["type"] == "extra_forbidden":
                if skip_extra:
                    continue
                key = str(loc[-1])
                known = set(model.model_fields)
                parent = data
                for part in loc[:-1]:
                    parent = parent[part] if isinstance(parent, (dict, list)) else None
                if len(loc) >= 2 and loc[0] == "tasks":
                    known = set(nelfacts.model("TaskModel").model_fields)
                near = close(key, known)
                fix = f"Rename '{key}' to '{near}'." if near else f"Remove it; allowed keys: {', '.join(sorted(known))}."
                ctx.add(path, "error", "unknown_key", f"'{key}' is not allowed here" + (f"; did you mean '{near}'?" if near else "."), fix)
            elif not is_unresolved(value):
                ctx.add(path, "error", "wrong_type", f"{error['msg']} (got {value!r}).", "Give a value of the expected type.")


def check_evaluation(ctx: Context) -> None:
    evaluation = ctx.doc.get("evaluation")
    if not isinstance(evaluation, dict):
        ctx.add("evaluation", "error", "wrong_type", "evaluation must be a mapping with a `tasks:` list.", "Start from build_config, or add `evaluation: {tasks: [{name: <task>}]}`.")
        return
    task_list = evaluation.get("tasks")
    if not isinstance(task_list, list) or not task_list:
        ctx.add("evaluation.tasks", "error", "no_tasks", "There are no tasks to run.", "Add tasks with add_tasks (recipes or NEL task names).")
    task_paths = {index: path for index, (path, _) in enumerate(config_tasks(ctx.doc))}
    pydantic_problems(ctx, nelfacts.model("EvaluationModel"), to_plain(evaluation), "evaluation", task_paths)
    _check_nemo_evaluator_config(ctx, evaluation.get("nemo_evaluator_config"), "evaluation.nemo_evaluator_config")
    for path, task in config_tasks(ctx.doc):
        if isinstance(task, dict):
            _check_nemo_evaluator_config(ctx, task.get("nemo_evaluator_config"), f"{path}.nemo_evaluator_config")


def _check_nemo_evaluator_config(ctx: Context, section: Any, prefix: str) -> None:
    if not isinstance(section, dict):
        return
    _check_keys(ctx, section, prefix, NEMO_EVALUATOR_CONFIG_KEYS, "nemo_evaluator_config")
    config = section.get("config")
    if isinstance(config, dict):
        plain = to_plain(config)
        params = plain.pop("params", None)
        pydantic_problems(ctx, nelfacts.model("EvaluationConfig"), plain, f"{prefix}.config", {})
        if isinstance(params, dict):
            _check_params(ctx, nelfacts.model("ConfigParams"), params, f"{prefix}.config.params")
            _check_extra_args(ctx, params.get("extra"), f"{prefix}.config.params.extra")
    target = section.get("target")
    if isinstance(target, dict):
        _check_keys(ctx, target, f"{prefix}.target", {"api_endpoint"}, "nemo_evaluator_config.target")
        endpoint = target.get("api_endpoint")
        if isinstance(endpoint, dict):
            plain = {key: value for key, value in to_plain(endpoint).items() if key != "adapter_config"}
            pydantic_problems(ctx, nelfacts.model("ApiEndpoint"), plain, f"{prefix}.target.api_endpoint", {})


def _check_params(ctx: Context, model: type[BaseModel], params: dict, prefix: str) -> None:
    known = set(model.model_fields)
    for key in params:
        if key in known:
            continue
        near = close(key, known)
        if near:
            ctx.add(f"{prefix}.{key}", "error", "unknown_param", f"'{key}' is not a nemo-evaluator param; it looks like a misspelling of '{near}' (NEL only warns and the value is lost).", f"Rename '{key}' to '{near}'.")
        else:
            ctx.add(f"{prefix}.{key}", "warning", "unknown_param", f"'{key}' is not a nemo-evaluator param ({', '.join(sorted(known))}).", f"Harness-specific settings go under {prefix}.extra.{key}.")
    pydantic_problems(ctx, model, {key: value for key, value in params.items() if key in known}, prefix, {}, skip_extra=True)


def _check_extra_args(ctx: Context, extra: Any, prefix: str) -> None:
    """NeMo-Skills `extra.args`: Hydra overrides for `ns eval`; adding a key takes ++."""
    if not isinstance(extra, dict) or "args" not in extra:
        return
    args = extra["args"]
    path = f"{prefix}.args"
    if not isinstance(args, str):
        ctx.add(path, "error", "wrong_type", f"extra.args must be one string of overrides, got {type(args).__name__}.", "Write it as a string, e.g. \"++prompt_config=eval/aai/mcq-4choices ++inference.tokens_to_generate=null\".")
        return
    try:
        tokens = shlex.split(args)
    except ValueError as exc:
        ctx.add(path, "error", "malformed_override", f"Cannot split the overrides: {exc}.", "Balance the quotes in extra.args.")
        return
    for token in tokens:
        match = _OVERRIDE.match(token)
        if not match or (not match.group("eq") and match.group("prefix") != "~"):
            ctx.add(path, "error", "malformed_override", f"'{token}' is not a Hydra override (key=value).", f"Write it as ++{token.lstrip('+')}=<value>, or remove it.")
        elif not match.group("prefix"):
            ctx.add(path, "warning", "override_needs_plus", f"'{token}' has no ++: NeMo-Skills rejects it if the key is not already in its config.", f"Write ++{token}.")


@cache
def nel_default(relative: str) -> dict:
    """One packaged NEL default (configs/<relative>.yaml) as plain data; {} when NEL has none by that name."""
    import yaml

    file = nelfacts.configs_dir() / f"{relative}.yaml"
    data = yaml.safe_load(file.read_text(encoding="utf-8")) if file.is_file() else None
    return {key: value for key, value in (data or {}).items() if key != "defaults"}


def merged(base: dict, override: dict) -> dict:
    result = dict(base)
    for key, value in override.items():
        result[key] = merged(result[key], value) if isinstance(result.get(key), dict) and isinstance(value, dict) else value
    return result


def _composed(ctx: Context) -> dict:
    """The config as Hydra composes it: NEL's defaults for the chosen executor and deployment under the file's keys."""
    execution_default = next(
        (str(entry["execution"]) for entry in ctx.doc.get("defaults") or [] if isinstance(entry, dict) and "execution" in entry), ctx.execution
    )
    base = merged(nel_default("default"), {"execution": nel_default(f"execution/{execution_default}"), "deployment": nel_default(f"deployment/{ctx.deployment}")})
    return merged(base, to_plain(ctx.doc))


def check_overrides(ctx: Context, overrides: list[str]) -> None:
    if not overrides:
        return
    plain = _composed(ctx)
    for override in overrides:
        match = _OVERRIDE.match(override.strip())
        path = f"override '{override}'"
        if not match or (not match.group("eq") and match.group("prefix") != "~"):
            ctx.add(path, "error", "malformed_override", "Not a Hydra override: expected [+|++|~]key.path=value.", "Write it like ++evaluation.nemo_evaluator_config.config.params.limit_samples=10.")
            continue
        exists = _hydra_node(plain, match.group("key")) is not _ABSENT
        prefix = match.group("prefix")
        if not prefix and not exists:
            parent_key, _, last = match.group("key").rpartition(".")
            parent = _hydra_node(plain, parent_key) if parent_key else plain
            near = close(last, set(parent)) if isinstance(parent, dict) else None
            hint = f"If you meant the existing key, write {parent_key + '.' if parent_key else ''}{near}=...; to add a new key use ++{override}." if near else f"Use ++{override} (adds or replaces)."
            ctx.add(path, "error", "override_needs_plus", f"'{match.group('key')}' is neither in the config nor in NEL's defaults: Hydra fails to override a key that does not exist.", hint)
        elif prefix == "+" and exists:
            ctx.add(path, "error", "override_key_exists", f"'{match.group('key')}' already exists: `+` only adds new keys and Hydra fails.", f"Use {override[1:]} or +{override}.")
        elif prefix == "~" and not exists:
            ctx.add(path, "error", "override_key_missing", f"'{match.group('key')}' is not in the config, so it cannot be deleted.", "Drop this override or fix the key path.")


_ABSENT = object()


def _hydra_node(plain: Any, key: str) -> Any:
    node = plain
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _ABSENT
    return node


def check_tasks(ctx: Context, recipes: dict[str, Recipe]) -> None:
    evaluation_params = params_at(ctx.section("evaluation").get("nemo_evaluator_config"))
    for path, task in config_tasks(ctx.doc):
        if not isinstance(task, dict):
            ctx.add(path, "error", "wrong_type", "A task entry must be a mapping with a `name:`.", "Write it as `- name: <task>`.")
            continue
        name = task.get("name")
        if not isinstance(name, str) or not name.strip():
            ctx.add(path, "error", "missing_value", "The task has no name.", "Add `name: <task>`; list_tasks shows the names.")
            continue
        entries = catalogue.lookup(name)
        if not entries:
            suggestions = catalogue.suggest(name)
            hint = f"Did you mean: {', '.join(suggestions)}?" if suggestions else "list_tasks shows every task."
            ctx.add(f"{path}.name", "error", "unknown_task", f"'{name}' is not a task NEL knows.", hint)
            continue
        if len(entries) > 1:
            choices = ", ".join(entry.qualified_name for entry in entries)
            ctx.add(f"{path}.name", "error", "ambiguous_task", f"'{name}' exists in several harnesses: {choices}.", f"Use the qualified name, e.g. {entries[0].qualified_name}.")
        recipe = recipes.get(name)
        if recipe and recipe.judge:
            task_params = params_at(task.get("nemo_evaluator_config"))
            judge = (task_params.get("extra") or {}).get("judge") or (evaluation_params.get("extra") or {}).get("judge")
            if not isinstance(judge, dict) or not judge.get("api_key"):
                ctx.add(
                    f"{path}.nemo_evaluator_config.config.params.extra.judge",
                    "error",
                    "judge_missing",
                    f"'{name}' is scored by an LLM judge, but no judge (extra.judge.api_key) is configured.",
                    f"Add the judge block from the '{recipe.name}' recipe (get_task_recipe), e.g. extra.judge.api_key: JUDGE_API_KEY with env_vars JUDGE_API_KEY: host:JUDGE_API_KEY.",
                )
        if ctx.check_env and recipe:
            for variable in recipe.env_vars:
                if not os.environ.get(variable) and not env_var_defined(ctx.doc, variable):
                    ctx.add(f"{path}", "warning", "unset_env_var", f"The '{recipe.name}' recipe needs {variable}, which is unset here.", f"export {variable}=... before the run (see env.example).")


def params_at(section: Any) -> dict:
    if not isinstance(section, dict):
        return {}
    config = section.get("config")
    params = config.get("params") if isinstance(config, dict) else None
    return params if isinstance(params, dict) else {}


def check_env_vars(ctx: Context) -> None:
    mappings: list[tuple[str, Any]] = [("env_vars", ctx.doc.get("env_vars")), ("evaluation.env_vars", ctx.section("evaluation").get("env_vars"))]
    mappings.append(("deployment.env_vars", ctx.section("deployment").get("env_vars")))
    mappings += [(f"{path}.env_vars", task.get("env_vars")) for path, task in config_tasks(ctx.doc) if isinstance(task, dict)]
    for prefix, mapping in mappings:
        if not isinstance(mapping, dict):
            continue
        for name, raw in mapping.items():
            try:
                nelfacts.check_env_var_value(str(raw))
            except ValueError as exc:
                ctx.add(f"{prefix}.{name}", "error", "env_var_prefix", str(exc).split(" Run the migration")[0], f"Write {name}: host:{name} (from this machine), lit:<value> or runtime:<VAR>.")
    if not ctx.check_env:
        return
    seen: set[str] = set()
    for path, name in env_var_references(ctx.doc):
        if name in seen or os.environ.get(name):
            continue
        seen.add(name)
        ctx.add(path, "error", "unset_env_var", f"{name} is unset here; NEL resolves it when the run starts and fails without it.", f"export {name}=... (see env.example), or remove the reference.")


def extra_args(ctx: Context) -> list[tuple[str, str | None]]:
    raw = ctx.section("deployment").get("extra_args")
    if not isinstance(raw, str):
        return []
    try:
        return parse_extra_args(raw)
    except ToolError:  # reported by the malformed_extra_args rule
        return []


