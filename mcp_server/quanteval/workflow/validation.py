"""validate_config: every problem in a NEL config at once, offline, in tens of milliseconds.

`nel run --dry-run` takes seconds, stops at the first `???`, only warns on a misspelled
param and knows nothing about the checkpoint. The rules here read the config once and
compare it with what NEL, nemo-evaluator and the checkpoint itself define: NEL's packaged
defaults (known keys), NEL's own pydantic models (evaluation section), nemo-evaluator's
models (params, target), the task catalogue and recipes, and inspect_checkpoint's facts.
Every problem names its path, a severity and a concrete fix.
"""

from __future__ import annotations

import difflib
import os
import re
import shlex
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from quanteval.engines import engine_of
from quanteval.engines.nel import nelfacts
from quanteval.models import StrictModel, ToolError
from quanteval.serving import checkpoint, frameworks
from quanteval.workflow import nelconfig, tasks

Severity = Literal["error", "warning"]


class Problem(BaseModel):
    key: str = Field(description="Dotted path of the offending key (tasks by name), or the override / flag concerned.")
    severity: Severity = Field(description="error: NEL or the server will fail or silently do the wrong thing; warning: worth a look.")
    rule: str = Field(description="Short rule id, e.g. missing_value, unknown_key, unknown_task, wrong_framework_flag.")
    message: str
    fix: str = Field(description="What to change, concretely.")


class ValidateConfigInput(StrictModel):
    config_path: str = Field(description="The NEL config file (.yaml).")
    overrides: list[str] = Field(
        default_factory=list,
        description="Overrides you will pass to `nel run -o`, checked too.",
    )
    check_env: bool = Field(
        True, description="Report needed env vars unset here (false if the run starts elsewhere)."
    )


class ValidateConfigOutput(BaseModel):
    config_path: str
    valid: bool = Field(description="True when there is no error (warnings allowed).")
    errors: int
    warnings: int
    problems: list[Problem] = Field(description="Every problem found, in file order; at most 200.")
    elapsed_ms: float


MAX_PROBLEMS = 200

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


def known_execution_keys() -> frozenset[str]:
    return _nel_default_keys("execution") | EXTRA_EXECUTION_KEYS


def known_deployment_keys() -> frozenset[str]:
    return _nel_default_keys("deployment") | EXTRA_DEPLOYMENT_KEYS


# A Hydra override: optional +, ++ or ~ prefix, a key path, "=", a value (~key may stand alone).
_OVERRIDE = re.compile(r"^(?P<prefix>\+\+|\+|~)?(?P<key>[A-Za-z_][\w\-]*(?:\.[\w\-]+)*)(?P<eq>=(?P<value>.*))?$", re.S)


# ---------------------------------------------------------------------------
# The pass


@dataclass
class _Context:
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
            self._report = nelconfig.model_source_report(self.doc, self.config_path)
        return self._report


def _close(word: str, known: set[str] | frozenset[str]) -> str | None:
    matches = difflib.get_close_matches(word, sorted(known), n=1, cutoff=0.75)
    return matches[0] if matches else None


def _is_unresolved(value: Any) -> bool:
    """??? (reported once, by the missing-value rule) or an interpolation checked only at run time."""
    return value == nelconfig.MISSING or (isinstance(value, str) and "${" in value)


def _check_keys(ctx: _Context, mapping: Any, prefix: str, known: set[str] | frozenset[str], what: str) -> None:
    """Unknown keys: a near miss of a known key is an error (a typo NEL would silently ignore), others a warning."""
    if not isinstance(mapping, dict):
        return
    for key in mapping:
        if key in known:
            continue
        path = f"{prefix}.{key}" if prefix else str(key)
        near = _close(str(key), known)
        if near:
            ctx.add(path, "error", "unknown_key", f"'{key}' is not a {what} key; it looks like a misspelling of '{near}'.", f"Rename '{key}' to '{near}'.")
        else:
            ctx.add(path, "warning", "unknown_key", f"'{key}' is not a {what} key NEL knows; it is probably ignored.", f"Remove it, or check the spelling against: {', '.join(sorted(known))}.")


def _check_missing(ctx: _Context) -> None:
    deployment = ctx.section("deployment")
    for path in nelconfig.missing_value_paths(ctx.doc):
        fix = f"Set it with set_config_value (path '{path}')."
        if path == "deployment.hf_model_handle" and isinstance(deployment.get("checkpoint_path"), str) and deployment["checkpoint_path"] != nelconfig.MISSING:
            fix = "checkpoint_path is set, so set hf_model_handle to null (never both)."
        elif path.startswith("deployment.") or path.endswith("params.extra.tokenizer") or path.endswith("params_to_add"):
            fix += " apply_checkpoint fills the deployment, tokenizer and reasoning values from the checkpoint."
        ctx.add(path, "error", "missing_value", "Still ??? — NEL stops at the first one it meets.", fix)


def _check_top_level(ctx: _Context) -> None:
    _check_keys(ctx, ctx.doc, "", TOP_LEVEL_KEYS, "top-level")
    _check_keys(ctx, ctx.section("execution"), "execution", known_execution_keys(), "execution")
    _check_keys(ctx, ctx.section("deployment"), "deployment", known_deployment_keys(), "deployment")
    target = ctx.section("target")
    _check_keys(ctx, target, "target", {"api_endpoint"}, "target")
    endpoint = target.get("api_endpoint")
    if isinstance(endpoint, dict):
        # adapter_config and api_key: known issues with their own rules (_check_known_issues)
        plain = {key: value for key, value in nelconfig.to_plain(endpoint).items() if key not in ("adapter_config", "api_key")}
        _pydantic_problems(ctx, nelfacts.model("ApiEndpoint"), plain, "target.api_endpoint", {})
    mounts = ctx.section("execution").get("mounts")
    if isinstance(mounts, dict):
        _pydantic_problems(ctx, nelfacts.model("MountsModel"), nelconfig.to_plain(mounts), "execution.mounts", {})


def _loc_path(prefix: str, loc: tuple, task_paths: dict[int, str]) -> str:
    path = prefix
    for index, part in enumerate(loc):
        if isinstance(part, int):
            path = task_paths.get(part, f"{path}[{part}]") if index == 1 and loc[0] == "tasks" else f"{path}[{part}]"
        else:
            path = f"{path}.{part}" if path else str(part)
    return path


def _pydantic_problems(ctx: _Context, model: type[BaseModel], data: Any, prefix: str, task_paths: dict[int, str], skip_extra: bool = False) -> None:
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
                near = _close(key, known)
                fix = f"Rename '{key}' to '{near}'." if near else f"Remove it; allowed keys: {', '.join(sorted(known))}."
                ctx.add(path, "error", "unknown_key", f"'{key}' is not allowed here" + (f"; did you mean '{near}'?" if near else "."), fix)
            elif not _is_unresolved(value):
                ctx.add(path, "error", "wrong_type", f"{error['msg']} (got {value!r}).", "Give a value of the expected type.")


def _check_evaluation(ctx: _Context) -> None:
    evaluation = ctx.doc.get("evaluation")
    if not isinstance(evaluation, dict):
        ctx.add("evaluation", "error", "wrong_type", "evaluation must be a mapping with a `tasks:` list.", "Start from build_config, or add `evaluation: {tasks: [{name: <task>}]}`.")
        return
    task_list = evaluation.get("tasks")
    if not isinstance(task_list, list) or not task_list:
        ctx.add("evaluation.tasks", "error", "no_tasks", "There are no tasks to run.", "Add tasks with add_tasks (recipes or NEL task names).")
    task_paths = {index: path for index, (path, _) in enumerate(nelconfig.config_tasks(ctx.doc))}
    _pydantic_problems(ctx, nelfacts.model("EvaluationModel"), nelconfig.to_plain(evaluation), "evaluation", task_paths)
    _check_nemo_evaluator_config(ctx, evaluation.get("nemo_evaluator_config"), "evaluation.nemo_evaluator_config")
    for path, task in nelconfig.config_tasks(ctx.doc):
        if isinstance(task, dict):
            _check_nemo_evaluator_config(ctx, task.get("nemo_evaluator_config"), f"{path}.nemo_evaluator_config")


def _check_nemo_evaluator_config(ctx: _Context, section: Any, prefix: str) -> None:
    if not isinstance(section, dict):
        return
    _check_keys(ctx, section, prefix, NEMO_EVALUATOR_CONFIG_KEYS, "nemo_evaluator_config")
    config = section.get("config")
    if isinstance(config, dict):
        plain = nelconfig.to_plain(config)
        params = plain.pop("params", None)
        _pydantic_problems(ctx, nelfacts.model("EvaluationConfig"), plain, f"{prefix}.config", {})
        if isinstance(params, dict):
            _check_params(ctx, nelfacts.model("ConfigParams"), params, f"{prefix}.config.params")
            _check_extra_args(ctx, params.get("extra"), f"{prefix}.config.params.extra")
    target = section.get("target")
    if isinstance(target, dict):
        _check_keys(ctx, target, f"{prefix}.target", {"api_endpoint"}, "nemo_evaluator_config.target")
        endpoint = target.get("api_endpoint")
        if isinstance(endpoint, dict):
            plain = {key: value for key, value in nelconfig.to_plain(endpoint).items() if key != "adapter_config"}
            _pydantic_problems(ctx, nelfacts.model("ApiEndpoint"), plain, f"{prefix}.target.api_endpoint", {})


def _check_params(ctx: _Context, model: type[BaseModel], params: dict, prefix: str) -> None:
    known = set(model.model_fields)
    for key in params:
        if key in known:
            continue
        near = _close(key, known)
        if near:
            ctx.add(f"{prefix}.{key}", "error", "unknown_param", f"'{key}' is not a nemo-evaluator param; it looks like a misspelling of '{near}' (NEL only warns and the value is lost).", f"Rename '{key}' to '{near}'.")
        else:
            ctx.add(f"{prefix}.{key}", "warning", "unknown_param", f"'{key}' is not a nemo-evaluator param ({', '.join(sorted(known))}).", f"Harness-specific settings go under {prefix}.extra.{key}.")
    _pydantic_problems(ctx, model, {key: value for key, value in params.items() if key in known}, prefix, {}, skip_extra=True)


def _check_extra_args(ctx: _Context, extra: Any, prefix: str) -> None:
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
def _nel_default(relative: str) -> dict:
    """One packaged NEL default (configs/<relative>.yaml) as plain data; {} when NEL has none by that name."""
    import yaml

    file = nelfacts.configs_dir() / f"{relative}.yaml"
    data = yaml.safe_load(file.read_text(encoding="utf-8")) if file.is_file() else None
    return {key: value for key, value in (data or {}).items() if key != "defaults"}


def _merged(base: dict, override: dict) -> dict:
    result = dict(base)
    for key, value in override.items():
        result[key] = _merged(result[key], value) if isinstance(result.get(key), dict) and isinstance(value, dict) else value
    return result


def _composed(ctx: _Context) -> dict:
    """The config as Hydra composes it: NEL's defaults for the chosen executor and deployment under the file's keys."""
    execution_default = next(
        (str(entry["execution"]) for entry in ctx.doc.get("defaults") or [] if isinstance(entry, dict) and "execution" in entry), ctx.execution
    )
    base = _merged(_nel_default("default"), {"execution": _nel_default(f"execution/{execution_default}"), "deployment": _nel_default(f"deployment/{ctx.deployment}")})
    return _merged(base, nelconfig.to_plain(ctx.doc))


def _check_overrides(ctx: _Context, overrides: list[str]) -> None:
    if not overrides:
        return
    plain = _composed(ctx)
    for override in overrides:
        match = _OVERRIDE.match(override.strip())
        path = f"override '{override}'"
        if not match or (not match.group("eq") and match.group("prefix") != "~"):
            ctx.add(path, "error", "malformed_override", "Not a Hydra override: expected [+|++|~]key.path=value.", "Write it like ++evaluation.nemo_evaluator_config.config.params.limit_samples=10.")
            continue
        exists = _hydra_key_exists(plain, match.group("key"))
        prefix = match.group("prefix")
        if not prefix and not exists:
            parent_key, _, last = match.group("key").rpartition(".")
            parent = _hydra_node(plain, parent_key) if parent_key else plain
            near = _close(last, set(parent)) if isinstance(parent, dict) else None
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


def _hydra_key_exists(plain: Any, key: str) -> bool:
    return _hydra_node(plain, key) is not _ABSENT


def _check_tasks(ctx: _Context, recipes: dict[str, tasks.Recipe]) -> None:
    evaluation_params = _params_at(ctx.section("evaluation").get("nemo_evaluator_config"))
    for path, task in nelconfig.config_tasks(ctx.doc):
        if not isinstance(task, dict):
            ctx.add(path, "error", "wrong_type", "A task entry must be a mapping with a `name:`.", "Write it as `- name: <task>`.")
            continue
        name = task.get("name")
        if not isinstance(name, str) or not name.strip():
            ctx.add(path, "error", "missing_value", "The task has no name.", "Add `name: <task>`; list_tasks shows the names.")
            continue
        entries = tasks.lookup(name)
        if not entries:
            suggestions = tasks.suggest(name)
            hint = f"Did you mean: {', '.join(suggestions)}?" if suggestions else "list_tasks shows every task."
            ctx.add(f"{path}.name", "error", "unknown_task", f"'{name}' is not a task NEL knows.", hint)
            continue
        if len(entries) > 1:
            choices = ", ".join(entry.qualified_name for entry in entries)
            ctx.add(f"{path}.name", "error", "ambiguous_task", f"'{name}' exists in several harnesses: {choices}.", f"Use the qualified name, e.g. {entries[0].qualified_name}.")
        recipe = recipes.get(name)
        if recipe and recipe.judge:
            task_params = _params_at(task.get("nemo_evaluator_config"))
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
                if not os.environ.get(variable) and not nelconfig.env_var_defined(ctx.doc, variable):
                    ctx.add(f"{path}", "warning", "unset_env_var", f"The '{recipe.name}' recipe needs {variable}, which is unset here.", f"export {variable}=... before the run (see env.example).")


def _params_at(section: Any) -> dict:
    if not isinstance(section, dict):
        return {}
    config = section.get("config")
    params = config.get("params") if isinstance(config, dict) else None
    return params if isinstance(params, dict) else {}


def _check_env_vars(ctx: _Context) -> None:
    mappings: list[tuple[str, Any]] = [("env_vars", ctx.doc.get("env_vars")), ("evaluation.env_vars", ctx.section("evaluation").get("env_vars"))]
    mappings.append(("deployment.env_vars", ctx.section("deployment").get("env_vars")))
    mappings += [(f"{path}.env_vars", task.get("env_vars")) for path, task in nelconfig.config_tasks(ctx.doc) if isinstance(task, dict)]
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
    for path, name in nelconfig.env_var_references(ctx.doc):
        if name in seen or os.environ.get(name):
            continue
        seen.add(name)
        ctx.add(path, "error", "unset_env_var", f"{name} is unset here; NEL resolves it when the run starts and fails without it.", f"export {name}=... (see env.example), or remove the reference.")


def _extra_args(ctx: _Context) -> list[tuple[str, str | None]]:
    raw = ctx.section("deployment").get("extra_args")
    if not isinstance(raw, str):
        return []
    try:
        return nelconfig.parse_extra_args(raw)
    except ToolError:  # reported by the malformed_extra_args rule
        return []


def _int_at(section: dict, key: str, default: int | None = None) -> int | None:
    value = section.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _check_deployment(ctx: _Context) -> None:  # noqa: C901
    deployment = ctx.section("deployment")
    framework = ctx.deployment
    raw_args = deployment.get("extra_args")
    if raw_args is not None and not isinstance(raw_args, str):
        ctx.add("deployment.extra_args", "error", "wrong_type", f"extra_args must be one string of server flags, got {type(raw_args).__name__}.", 'Write it as a string: extra_args: "--max-model-len 8192".')
    elif isinstance(raw_args, str):
        try:
            shlex.split(raw_args)
        except ValueError as exc:
            ctx.add("deployment.extra_args", "error", "malformed_extra_args", f"Cannot split the flags: {exc}.", "Balance the quotes in extra_args.")
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "port"):
        value = deployment.get(key)
        if key in deployment and not _is_unresolved(value) and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            ctx.add(f"deployment.{key}", "error", "wrong_type", f"{key} must be a positive integer, got {value!r}.", f"Set deployment.{key} to an integer such as 1.")
    gpu_memory = deployment.get("gpu_memory_utilization")
    if gpu_memory is not None and not _is_unresolved(gpu_memory) and (not isinstance(gpu_memory, (int, float)) or not 0 < gpu_memory <= 1):
        ctx.add("deployment.gpu_memory_utilization", "error", "wrong_type", f"gpu_memory_utilization must be a fraction in (0, 1], got {gpu_memory!r}.", "Use e.g. 0.9.")

    options = _extra_args(ctx)
    flags = [flag for flag, _ in options]
    for flag in sorted({flag for flag in flags if flags.count(flag) > 1}):
        ctx.add("deployment.extra_args", "warning", "duplicate_flag", f"{flag} appears {flags.count(flag)} times; the server takes the last.", f"Keep one {flag}.")
    if framework in nelconfig.NEL_COMMAND_FLAGS:
        for flag in flags:
            owner = nelconfig.NEL_COMMAND_FLAGS[framework].get(flag)
            if owner:
                ctx.add("deployment.extra_args", "error", "flag_set_by_nel", f"{flag} is already in NEL's {framework} command; passing it again conflicts.", f"Remove {flag} from extra_args" + (f" and set {owner}." if owner.startswith("deployment.") else "."))
                continue
            for other, spelled in frameworks.FRAMEWORK_FLAGS.items():
                if other == framework or flag not in spelled or flag in frameworks.SHARED_FLAGS or flag in frameworks.FRAMEWORK_FLAGS.get(framework, {}):
                    continue
                equivalent = spelled[flag].get(framework)
                fix = f"Replace {flag} with {equivalent}." if equivalent else f"Remove {flag}; {framework} has no such flag."
                ctx.add("deployment.extra_args", "error", "wrong_framework_flag", f"{flag} is a {other} flag; the {framework} server rejects it.", fix)
                break

    has_path = isinstance(deployment.get("checkpoint_path"), str) and deployment["checkpoint_path"] not in ("", nelconfig.MISSING)
    has_handle = isinstance(deployment.get("hf_model_handle"), str) and deployment["hf_model_handle"] not in ("", nelconfig.MISSING)
    if has_path and has_handle:
        ctx.add("deployment.hf_model_handle", "error", "both_model_sources", "Both checkpoint_path and hf_model_handle are set; NEL serves hf_model_handle and ignores the local checkpoint.", "Keep one: set hf_model_handle to null to serve the local checkpoint (or checkpoint_path to null).")
    if framework in ("vllm", "sglang") and not has_path and not has_handle and "???" not in (deployment.get("checkpoint_path"), deployment.get("hf_model_handle")):
        ctx.add("deployment.checkpoint_path", "error", "no_model_source", "Neither checkpoint_path nor hf_model_handle is set: the server has nothing to load.", "Run apply_checkpoint with the checkpoint directory or HF handle.")
    if framework in ("vllm", "sglang", "trtllm"):
        _check_against_checkpoint(ctx, options)


def _check_against_checkpoint(ctx: _Context, options: list[tuple[str, str | None]]) -> None:
    report = ctx.checkpoint_report()
    if report is None:
        return
    framework = ctx.deployment
    values = dict(options)
    length_flag = nelconfig.CONTEXT_LENGTH_FLAGS[framework]
    length = values.get(length_flag)
    if report.context_length and length and length.isdigit() and int(length) > report.context_length:
        ctx.add(
            "deployment.extra_args",
            "error",
            "context_too_long",
            f"{length_flag} {length} exceeds the checkpoint's max_position_embeddings ({report.context_length}); the server refuses to start.",
            f"Use {length_flag} {report.context_length} (apply_checkpoint writes it).",
        )
    quantization = values.get("--quantization")
    if quantization and framework in ("vllm", "sglang"):
        _check_quantization_flag(ctx, report, quantization)
    if framework == "sglang" and report.trust_remote_code and "--trust-remote-code" not in values:
        ctx.add("deployment.extra_args", "error", "trust_remote_code", "The checkpoint ships its own model code (auto_map) and SGLang needs --trust-remote-code to load it.", "Add --trust-remote-code to extra_args.")
    deployment = ctx.section("deployment")
    tp = _int_at(deployment, "tensor_parallel_size")
    heads = report.architecture.num_attention_heads
    if tp and heads and heads % tp:
        ctx.add("deployment.tensor_parallel_size", "error", "tp_heads", f"tensor_parallel_size {tp} does not divide the model's {heads} attention heads.", f"Use a divisor of {heads}, e.g. {max(d for d in (1, 2, 4, 8) if heads % d == 0)}.")


def _check_quantization_flag(ctx: _Context, report: checkpoint.CheckpointReport, value: str) -> None:
    quant = report.quantization
    expected = frameworks.support(ctx.deployment, quant.format).resolves_as if quant.detected else None
    if not quant.detected:
        if value != "fp8":  # --quantization fp8 quantizes a BF16 model on the fly; every other value needs a quantized checkpoint
            ctx.add("deployment.extra_args", "error", "quantization_mismatch", f"--quantization {value}, but the checkpoint is not quantized.", "Remove --quantization (or point checkpoint_path at the quantized checkpoint).")
        return
    if not frameworks.quantization_flag_fits(value, quant.method, quant.quant_algo, quant.format):
        fix = "Remove --quantization: the server reads the checkpoint's quantization config itself" + (
            f" (it resolves it as {expected})." if expected else ".")
        found = " ".join(part for part in (quant.method, quant.quant_algo) if part)
        ctx.add("deployment.extra_args", "error", "quantization_mismatch", f"--quantization {value} contradicts the checkpoint ({found}); the server fails to load it.", fix)


def _check_execution(ctx: _Context) -> None:
    execution = ctx.section("execution")
    output_dir = execution.get("output_dir")
    if ctx.execution == "slurm":
        if isinstance(output_dir, str) and not _is_unresolved(output_dir) and not output_dir.startswith("/"):
            ctx.add("execution.output_dir", "error", "slurm_output_dir", f"output_dir '{output_dir}' is relative; SLURM jobs run on compute nodes and need an absolute path on shared storage.", "Use an absolute path such as /lustre/<project>/<user>/nel-results.")
        for key, what in (("hostname", "the login node to ssh to"), ("account", "the SLURM account to charge")):
            value = execution.get(key)
            if key not in execution or value is None or (isinstance(value, str) and not value.strip()):
                ctx.add(f"execution.{key}", "error", f"slurm_{key}", f"execution.{key} ({what}) is not set.", f"Set execution.{key}.")
        _check_ssh_user(ctx, execution)
    elif output_dir is not None and (not isinstance(output_dir, str) or not output_dir.strip()):
        ctx.add("execution.output_dir", "error", "wrong_type", "output_dir must be a directory path.", "Set execution.output_dir, e.g. nel-results.")
    for key in ("num_nodes", "num_instances", "ntasks_per_node"):
        value = execution.get(key)
        if key in execution and not _is_unresolved(value) and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            ctx.add(f"execution.{key}", "error", "wrong_type", f"{key} must be a positive integer, got {value!r}.", f"Set execution.{key} to an integer such as 1.")
    nodes = _int_at(execution, "num_nodes", 1) or 1
    instances = _int_at(execution, "num_instances", 1) or 1
    if instances > 1 and ctx.execution != "slurm":
        ctx.add("execution.num_instances", "warning", "num_instances", "num_instances only applies to the SLURM executor.", "Remove it, or run on SLURM.")
    if instances > 1 and ctx.deployment == "none":
        ctx.add("execution.num_instances", "error", "num_instances", "num_instances > 1 replicates a deployment, but deployment is none.", "Set num_instances to 1, or let NEL deploy the model.")
    if nodes % instances:
        ctx.add("execution.num_instances", "error", "num_instances", f"num_nodes {nodes} is not a multiple of num_instances {instances}: every instance needs the same number of nodes.", f"Use num_nodes {instances * max(1, nodes // instances)} or a num_instances that divides {nodes}.")
    if ctx.execution == "slurm" and ctx.deployment in ("vllm", "sglang", "trtllm"):
        _check_gpus_per_node(ctx, nodes // instances if nodes % instances == 0 else 1)


_ENV_INTERPOLATION = re.compile(r"^\$\{oc\.env:(\w+)(?:,([^}]*))?\}$")


def _check_ssh_user(ctx: _Context, execution: dict) -> None:
    """NEL logs in as `execution.username@execution.hostname`, so username overrides the ssh config's User for that
    host (NEL's template: ${oc.env:USER}). A username other than the User the ssh config names (as OpenSSH resolves
    it, `ssh -G`) fails the launch while ssh_check and cluster_info, which log in as that User, succeed."""
    from quanteval.clusters import remote

    hostname = execution.get("hostname")
    if not isinstance(hostname, str) or not hostname.strip() or _is_unresolved(hostname) or "@" in hostname:
        return
    configured = execution.get("username", "${oc.env:USER}")  # NEL's default when the key is absent
    source = "set in the config"
    if isinstance(configured, str) and (match := _ENV_INTERPOLATION.match(configured.strip())):
        configured, source = os.environ.get(match.group(1), match.group(2)), f"{configured.strip()}, from ${match.group(1)}"
    if not isinstance(configured, str) or not configured or _is_unresolved(configured):
        return  # unset env var or another interpolation: reported elsewhere, or known only at run time
    try:
        ssh_user = remote.ssh_user(hostname.strip())
    except ToolError:
        return  # an unreadable ssh config: ssh_check says what is wrong with it
    # The local login name is also OpenSSH's default when the config names no User: then nothing says which is right.
    if ssh_user == configured or ssh_user == remote.local_user():
        return
    ctx.add("execution.username", "error", "ssh_user_mismatch",
            f"execution.username is '{configured}' ({source}), but the ssh config names User {ssh_user} for Host {hostname}. "
            f"NEL logs in as {configured}@{hostname}, overriding the ssh config, and fails to connect, while ssh_check and "
            f"cluster_info log in as {ssh_user}.",
            f"Set execution.username: {ssh_user} (apply_cluster writes it), or change User for Host {hostname} in the ssh config if {configured} is right.")


def _gpus_per_node(execution: dict) -> int | None:
    explicit = _int_at(execution, "gpus_per_node")
    if explicit:
        return explicit
    gres = execution.get("gres", "gpu:8")  # NEL's SLURM default
    match = re.search(r"gpu(?::[\w.-]+)?:(\d+)$", str(gres)) if gres else None
    return int(match.group(1)) if match else None


def _check_gpus_per_node(ctx: _Context, nodes_per_instance: int) -> None:
    execution, deployment = ctx.section("execution"), ctx.section("deployment")
    gpus = _gpus_per_node(execution)
    tp = _int_at(deployment, "tensor_parallel_size", 8 if ctx.deployment in ("vllm", "sglang", "trtllm") else 1)
    pp = _int_at(deployment, "pipeline_parallel_size", 1) or 1
    dp = _int_at(deployment, "data_parallel_size", 1) or 1
    if not gpus or not tp:
        return
    if tp > gpus:
        ctx.add("deployment.tensor_parallel_size", "error", "tp_exceeds_node", f"tensor_parallel_size {tp} exceeds the {gpus} GPUs per node (execution.gres).", f"Use tensor_parallel_size <= {gpus}; span nodes with pipeline_parallel_size instead.")
    elif tp * pp * dp > gpus * nodes_per_instance:
        ctx.add(
            "deployment.data_parallel_size",
            "error",
            "parallelism_exceeds_gpus",
            f"tensor {tp} x pipeline {pp} x data {dp} = {tp * pp * dp} GPUs per instance, but an instance has {nodes_per_instance} node(s) x {gpus} GPUs.",
            "Lower data_parallel_size / pipeline_parallel_size, or raise execution.num_nodes.",
        )


def _check_pre_cmd(ctx: _Context) -> None:
    if os.environ.get("NEMO_EVALUATOR_TRUST_PRE_CMD") == "1":
        return
    places = [("evaluation.pre_cmd", ctx.section("evaluation").get("pre_cmd")), ("deployment.pre_cmd", ctx.section("deployment").get("pre_cmd"))]
    places += [(f"{path}.pre_cmd", task.get("pre_cmd")) for path, task in nelconfig.config_tasks(ctx.doc) if isinstance(task, dict)]
    for path, command in places:
        if isinstance(command, str) and command.strip():
            ctx.add(path, "error", "pre_cmd_untrusted", "NEL refuses to run a pre_cmd unless NEMO_EVALUATOR_TRUST_PRE_CMD=1 (the dry-run only warns).", "Read the command; if you trust it, export NEMO_EVALUATOR_TRUST_PRE_CMD=1. Otherwise remove pre_cmd.")


def _check_self_deployment_key(ctx: _Context) -> None:
    if ctx.deployment in ("none", "nim"):
        return
    endpoint = ctx.section("target").get("api_endpoint")
    if isinstance(endpoint, dict) and endpoint.get("api_key_name"):
        return
    names = [str(task.get("name")) for _, task in nelconfig.config_tasks(ctx.doc) if isinstance(task, dict)]
    if any(entry.harness == "nemo_skills" for name in names for entry in tasks.lookup(name)):
        ctx.add("target.api_endpoint.api_key_name", "error", "nemo_skills_api_key", "NeMo-Skills tasks send an API key even to a self-deployed server, and none is named: the run fails without one.", "Set target.api_endpoint.api_key_name: DUMMY_API_KEY (apply_checkpoint does) and export DUMMY_API_KEY=dummy.")


def unpinned_image(image: Any) -> bool:
    """A container image that names no fixed build: tagged `latest`, or with neither tag nor digest (Docker reads it
    as `latest`). A digest (@sha256:...), a local image file (.sqsh) or an unresolved value is not flagged."""
    if not isinstance(image, str) or not image.strip() or _is_unresolved(image):
        return False
    image = image.strip()
    if "@" in image or image.startswith(("/", "./", "../", "~")) or image.endswith(".sqsh"):
        return False
    name = image.rsplit("/", 1)[-1]  # a registry port (host:5000/...) is not a tag
    return ":" not in name or name.split(":", 1)[1] in ("", "latest")


def _check_images(ctx: _Context) -> None:
    """The serving image and any task container the config names must be pinned: `latest` moves between runs, so
    a baseline and a quantized run can silently use different servers."""
    places = [("deployment.image", ctx.section("deployment").get("image"))] if ctx.deployment != "none" else []
    places += [(f"{path}.container", task.get("container")) for path, task in nelconfig.config_tasks(ctx.doc) if isinstance(task, dict)]
    for path, image in places:
        inherited = ""
        if image is None and path == "deployment.image":  # not set here: NEL serves with its packaged default
            image = nelfacts.packaged_defaults(f"deployment/{ctx.deployment}").get("image")
            inherited = f" (NEL's default for {ctx.deployment}: the config sets no deployment.image)"
        if unpinned_image(image):
            ctx.problems.append(_unpinned_image_problem(path, image, inherited))


def _unpinned_image_problem(path: str, image: str, inherited: str = "") -> Problem:
    repository = image.strip().removesuffix(":").removesuffix(":latest")
    return Problem(key=path, severity="warning", rule="unpinned_image", message=(
        f"'{image}'{inherited} is not pinned (tag latest or no tag): it can change between the baseline and the quantized "
        "run, which then compare different builds."),
        fix=f"Pin it: {repository}:<version> (the tag the model card recommends) or {repository}@sha256:<digest>.")


# Names the interceptor docs print for the request/response logging limits; nemo-evaluator reads max_logged_*.
MISNAMED_LOGGING_KEYS = {"max_requests": "max_logged_requests", "max_responses": "max_logged_responses"}
MIN_PROMPT_TOKENS = 1024  # below this, a long prompt (GPQA, few-shot) plus the budget overflows the context


def _check_known_issues(ctx: _Context) -> None:
    """The pitfalls ModelOpt's evaluation skill and NEL's docs list as known issues, as rules with a fix."""
    target = ctx.section("target").get("api_endpoint")
    if isinstance(target, dict) and "adapter_config" in target:
        ctx.add(
            "target.api_endpoint.adapter_config", "error", "adapter_config_ignored",
            "NEL builds each task's adapter from evaluation.nemo_evaluator_config (and the task's own); the top-level target.api_endpoint.adapter_config is never read.",
            "Move it to evaluation.nemo_evaluator_config.target.api_endpoint.adapter_config.",
        )
    if isinstance(target, dict) and "api_key" in target:
        ctx.add(
            "target.api_endpoint.api_key", "error", "api_key_removed",
            "NEL removed target.api_endpoint.api_key (a key in the config would be a secret on disk); it fails with 'Extra inputs are not permitted'.",
            "Delete api_key; export the key in an env var and set target.api_endpoint.api_key_name to that variable's NAME.",
        )
    adapters = [(path, value) for path, value in nelconfig.walk(ctx.doc) if path.endswith("api_endpoint.adapter_config") and isinstance(value, dict)]
    for path, adapter in adapters:
        if isinstance(adapter.get("interceptors"), list):
            ctx.add(
                f"{path}.interceptors", "warning", "interceptors_replace_defaults",
                "An explicit interceptors list replaces nemo-evaluator's whole default chain (caching, reasoning stripping, response stats...).",
                "Use the flat adapter_config fields instead (process_reasoning_traces, params_to_add, max_logged_requests, ...), or list every interceptor you need.",
            )
        for key in adapter:
            if key in MISNAMED_LOGGING_KEYS:
                ctx.add(f"{path}.{key}", "error", "logging_key_name", f"'{key}' is the docs' name; nemo-evaluator reads {MISNAMED_LOGGING_KEYS[key]} and ignores this.", f"Rename '{key}' to '{MISNAMED_LOGGING_KEYS[key]}'.")
            elif key not in nelfacts.adapter_keys():
                near = _close(str(key), nelfacts.adapter_keys())
                ctx.add(f"{path}.{key}", "error" if near else "warning", "unknown_adapter_key", f"'{key}' is not an adapter_config field nemo-evaluator knows.", f"Rename it to '{near}'." if near else "Remove it.")
    for path, task in nelconfig.config_tasks(ctx.doc):
        name = str(task.get("name")) if isinstance(task, dict) else ""
        if any(entry.reads_tokenizer for entry in tasks.lookup(name)) if name else False:
            params = [nelconfig.value_at(ctx.doc, f"{prefix}.config.params.extra.tokenizer") for prefix in ("evaluation.nemo_evaluator_config", f"{path}.nemo_evaluator_config")]
            if not any(value is not None for value in params):
                ctx.add(f"{path}", "error", "tokenizer_missing", f"'{name}' reads params.extra.tokenizer (its harness counts tokens or builds prompts with it), and none is set.", "Set evaluation.nemo_evaluator_config.config.params.extra.tokenizer to the model's HF handle (apply_checkpoint does when it can).")


def _check_endpoint_vs_chat_template(ctx: _Context) -> None:
    """A checkpoint without a chat template (a base model, many exports) cannot answer a chat endpoint: the server
    refuses the request. NEL sends a task to its `endpoint_type`, else the first endpoint type the task supports."""
    if ctx.deployment not in ("vllm", "sglang", "trtllm"):
        return
    report = ctx.checkpoint_report()
    if report is None or report.chat_template:
        return
    for path, task in nelconfig.config_tasks(ctx.doc):
        if not isinstance(task, dict) or not isinstance(task.get("name"), str):
            continue
        entries = tasks.lookup(task["name"])
        supported = entries[0].endpoint_types if len(entries) == 1 else []
        endpoint = task.get("endpoint_type") or (supported[0] if supported else None)
        if endpoint != "chat":
            continue
        if "completions" in supported:
            fix = f"Set {path}.endpoint_type: completions (the task supports it), or add a chat template to the checkpoint."
        else:
            fix = "This task supports only the chat endpoint: remove it (base-model tasks: build_config model_type base), or add a chat template to the checkpoint."
        ctx.add(path, "error", "no_chat_template", f"'{task['name']}' goes to the chat endpoint, and {report.checkpoint} has no chat template: the server refuses every request.", fix)


def task_context_problem(task: str, recipe: tasks.Recipe | None, context: int | None, budget: int | None,
                         context_flag: str) -> tuple[str, str, str, str] | None:
    """(severity, rule, message, fix) when a task cannot work within the served context or its token budget, from the
    figures its recipe gives (longest prompt, smallest answer budget); None when fine or unknown."""
    if not recipe or not recipe.prompt_tokens or not recipe.answer_tokens or not context:
        return None
    need = recipe.prompt_tokens + recipe.answer_tokens
    if context < need:
        return ("error", "context_too_small_for_task",
                f"'{task}' needs a context of {need} tokens (prompts up to ~{recipe.prompt_tokens}, answers up to {recipe.answer_tokens}: "
                f"recipe {recipe.name}); the served context is {context}.",
                f"Serve a context of at least {need} ({context_flag}) if the model allows it, or drop '{task}'.")
    if budget is not None and budget < recipe.answer_tokens:
        return ("warning", "budget_truncates_answers",
                f"max tokens {budget} is below the {recipe.answer_tokens} '{task}' answers need (recipe {recipe.name}): truncated answers score 0.",
                f"Set it to at least {recipe.answer_tokens}; the {context}-token context leaves room up to {context - recipe.prompt_tokens}.")
    return None


def _check_task_budget(ctx: _Context, task_path: str, task_name: str, budget: tuple[Any, str] | None, context: int | None, where: str,
                       recipes: dict[str, tasks.Recipe], seen: set[tuple[str, str]]) -> None:
    """max tokens vs the served context, and the context vs what the task's recipe says it needs."""
    if context and budget and isinstance(budget[0], int) and not isinstance(budget[0], bool) and (budget[1], "budget") not in seen:
        seen.add((budget[1], "budget"))
        fit = nelconfig.generation_budget(context)
        if budget[0] >= context:
            ctx.add(budget[1], "error", "budget_exceeds_context",
                    f"max tokens {budget[0]} >= the serving context {context} ({where}): the server refuses every request (prompt + max tokens must fit).",
                    f"Set it to {fit} (apply_checkpoint does), or raise the context if the model allows it.")
        elif context - budget[0] < MIN_PROMPT_TOKENS:
            fix = f"Use {fit}." if fit < budget[0] else f"The context itself is short: serve at least {budget[0] + MIN_PROMPT_TOKENS} tokens if the model allows it."
            ctx.add(budget[1], "warning", "budget_leaves_no_prompt_room",
                    f"max tokens {budget[0]} leaves {context - budget[0]} tokens of the {context}-token context ({where}) for the prompt; longer prompts are refused.",
                    fix)
    budget_value = budget[0] if budget and isinstance(budget[0], int) and not isinstance(budget[0], bool) else None
    found = task_context_problem(task_name, recipes.get(task_name), context, budget_value,
                                 frameworks.FRAMEWORK_INFO[ctx.deployment].context_flag)
    if found:
        ctx.add(task_path, *found)


def _check_generation(ctx: _Context) -> None:
    """Budget vs serving context, sampling vs the checkpoint's generation_config.json, thinking vs the chat template."""
    if ctx.deployment not in ("vllm", "sglang", "trtllm"):
        return
    report = ctx.checkpoint_report()
    context, where = nelconfig.serving_context(ctx.doc, report)
    recipes = nelconfig.recipes_by_task()
    seen: set[tuple[str, str]] = set()
    for task_path, task in nelconfig.config_tasks(ctx.doc):
        if not isinstance(task, dict):
            continue
        generation = nelconfig.task_generation(ctx.doc, task_path)
        _check_task_budget(ctx, task_path, str(task.get("name")), generation.get("max_new_tokens"), context, where, recipes, seen)
        if report is None:
            continue
        for key in ("temperature", "top_p", "top_k"):
            want = report.generation_defaults.get(key)
            have = generation.get(key)
            if want is None or have is None or not isinstance(have[0], (int, float)) or have[0] == want or (have[1], key) in seen:
                continue
            if have[1].startswith("evaluation.tasks["):  # a task's own sampling is the benchmark's choice (greedy RULER, ...)
                continue
            seen.add((have[1], key))
            ctx.add(have[1], "warning", "sampling_differs_from_checkpoint",
                    f"{key} {have[0]} differs from the checkpoint's generation_config.json ({want}); scores measured off the model's recommended sampling can be lower.",
                    f"Set {key} to {want} (apply_checkpoint does when the config still has NEL's template value), or keep it on purpose for both baseline and candidate.")
    if report is None:
        return
    thinking = nelconfig.thinking_setting(ctx.doc)
    if thinking is not None and not report.reasoning:
        ctx.add(thinking[1], "warning", "thinking_without_toggle",
                "The checkpoint's chat template has no thinking/reasoning toggle: this kwarg does nothing (or the template rejects it), and it differs from a run of a reasoning model.",
                "Remove it (apply_checkpoint does when it switches to this checkpoint).")
    options = dict(_extra_args(ctx))
    stripped = any(value is True for path, value in nelconfig.walk(ctx.doc) if path.endswith("adapter_config.process_reasoning_traces"))
    if report.reasoning and (thinking is None or thinking[0] is not False) and "--reasoning-parser" not in options and not stripped:
        ctx.add("deployment.extra_args", "error", "reasoning_text_scored",
                "The model thinks (reasoning chat template) but nothing separates the reasoning from the answer: no --reasoning-parser and process_reasoning_traces is off, so the thinking text is scored.",
                "Add --reasoning-parser to extra_args (apply_checkpoint picks it), or set adapter_config.process_reasoning_traces: true.")
    quantization = options.get("--quantization")
    flags = report.deployment_flags.get(ctx.deployment)
    for note in flags.notes if flags else []:
        if note.startswith("error: "):  # the framework cannot load this format (or some of a mix's layers)
            key = "deployment.checkpoint_path" if (ctx.doc.get("deployment") or {}).get("checkpoint_path") else "deployment.hf_model_handle"
            ctx.add(key, "error", "checkpoint_not_servable", note.removeprefix("error: "),
                    f"Serve it with the framework or export the message names; {ctx.deployment} fails at load otherwise.")
    if quantization and flags and flags.quantization is None and report.quantization.method == "modelopt" and frameworks.quantization_flag_fits(quantization, report.quantization.method, report.quantization.quant_algo, report.quantization.format):
        ctx.add("deployment.extra_args", "warning", "quantization_flag_unneeded",
                f"--quantization {quantization} is not needed: {ctx.deployment} reads the checkpoint's ModelOpt config itself, and a stale flag breaks the next checkpoint.",
                "Remove --quantization (apply_checkpoint does).")


def load_plain(path: Path) -> dict:
    """The config as plain data via libyaml: validation needs no comments, and this is ~10x faster than round-trip."""
    import yaml

    if not path.is_file():
        raise ToolError(f"{path}: no such config file. Create one with build_config, or check the path.")
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise ToolError(f"{path}: invalid YAML at {where}: {exc.problem or exc.context or 'invalid YAML'}. Fix the YAML syntax there.") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ToolError(f"{path}: the top level must be a mapping (keys like `execution:`, `evaluation:`).")
    return doc


def validate_document(doc: Any, config_path: Path, overrides: list[str] | None = None, check_env: bool = True) -> list[Problem]:
    """Every problem in a parsed config (the rules behind validate_config)."""
    ctx = _Context(doc=doc, config_path=config_path, deployment=nelconfig.deployment_type(doc), execution=nelconfig.execution_type(doc), check_env=check_env)
    recipes = nelconfig.recipes_by_task()
    _check_missing(ctx)
    _check_top_level(ctx)
    _check_evaluation(ctx)
    _check_tasks(ctx, recipes)
    _check_env_vars(ctx)
    _check_deployment(ctx)
    _check_execution(ctx)
    _check_pre_cmd(ctx)
    _check_self_deployment_key(ctx)
    _check_images(ctx)
    _check_known_issues(ctx)
    _check_generation(ctx)
    _check_endpoint_vs_chat_template(ctx)
    _check_overrides(ctx, overrides or [])
    return ctx.problems


def validate_config(request: ValidateConfigInput) -> ValidateConfigOutput:
    """Use after every edit and before dry_run: checks a NEL config offline in milliseconds; each finding with its key and
    fix.
    """
    started = time.perf_counter()
    path = Path(request.config_path).expanduser()
    doc = load_plain(path)
    if engine_of(doc) == "nel-next":
        problems = validate_next_document(doc, path, request.overrides)
    else:
        problems = validate_document(doc, path, request.overrides, request.check_env)
    errors = sum(problem.severity == "error" for problem in problems)
    return ValidateConfigOutput(
        config_path=request.config_path,
        valid=errors == 0,
        errors=errors,
        warnings=len(problems) - errors,
        problems=problems[:MAX_PROBLEMS],
        elapsed_ms=round((time.perf_counter() - started) * 1000, 1),
    )


# ---------------------------------------------------------------------------
# nel-next configs: nel-next's own EvalConfig is the schema oracle; our chain rules on top.

SERVED_FACTS_TIMEOUT_S = 3.0


def served_facts(url: str) -> dict[str, Any] | None:
    """What an OpenAI-compatible server says it serves (/v1/models): id, root (vLLM: the model directory) and
    max_model_len. None when it does not answer: the rules that need it are then skipped, not guessed."""
    import httpx

    from quanteval.engines.nel_next import nelnext

    models_url = nelnext.endpoint_url(url, "chat_completions").rsplit("/chat/completions", 1)[0] + "/models"
    try:
        answer = httpx.get(models_url, timeout=SERVED_FACTS_TIMEOUT_S)
        data = answer.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    return data[0] if data and isinstance(data[0], dict) else None


def service_model(service: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """The checkpoint directory behind a nel-next service and what its server says it serves: a managed server's
    model path, or for an endpoint (type api) the model root vLLM reports in /v1/models. None where unknown."""
    url = service.get("url")
    served = served_facts(url) if service.get("type") == "api" and isinstance(url, str) and "???" not in url else None
    candidate = service.get("model") if service.get("type") in ("vllm", "sglang") else (served or {}).get("root")
    found = isinstance(candidate, str) and Path(candidate).expanduser().is_dir()
    return (str(Path(candidate).expanduser().resolve()) if found else None), served


def _next_checkpoint(directory: str | None) -> checkpoint.CheckpointReport | None:
    if directory is None:
        return None
    try:
        return checkpoint.inspect_checkpoint(checkpoint.InspectCheckpointInput(checkpoint=directory))
    except ToolError:
        return None


def _next_service_rules(name: str, service: dict[str, Any], problems: list[Problem]) -> int | None:
    """The service's own rules; returns its served context (the server's max_model_len, else the checkpoint's)."""
    prefix = f"services.{name}"
    directory, served = service_model(service)
    report = _next_checkpoint(directory)
    generation = service.get("generation") or {}
    context = (served or {}).get("max_model_len") or (report.context_length if report else None)
    budget = generation.get("max_tokens")
    if isinstance(budget, str) and budget.isdigit():
        budget = int(budget)
    if isinstance(context, int) and isinstance(budget, int) and budget >= context:
        source = "the server's max_model_len" if served and served.get("max_model_len") else "the checkpoint's context"
        problems.append(Problem(key=f"{prefix}.generation.max_tokens", severity="error", rule="budget_exceeds_context",
                                message=f"max_tokens {budget} is not below {source} ({context}): the server answers 400 to every request.",
                                fix=f"Set max_tokens below {context} minus the longest prompt (e.g. {max(1, context // 2)})."))
    protocol = service.get("protocol")
    if report is not None and protocol == "chat_completions" and not report.chat_template:
        problems.append(Problem(key=f"{prefix}.protocol", severity="error", rule="no_chat_template",
                                message=f"{report.checkpoint} has no chat template, so the chat endpoint refuses requests.",
                                fix="Use protocol: completions (a base model) with benchmarks that take plain prompts, or add a chat template to the checkpoint."))
    if report is not None and report.generation_defaults.get("temperature") not in (None, 0, 0.0) and generation.get("temperature") is None:
        problems.append(Problem(key=f"{prefix}.generation.temperature", severity="warning", rule="sampling_unset",
                                message=f"temperature is unset; the checkpoint's generation_config.json uses {report.generation_defaults['temperature']}.",
                                fix="Set it explicitly (0.0 for a greedy, reproducible comparison), the same for baseline and candidate."))
    if served is not None and isinstance(service.get("model"), str) and service["model"] not in ("???", served.get("id")):
        problems.append(Problem(key=f"{prefix}.model", severity="error", rule="served_name_mismatch",
                                message=f"the server at {service['url']} serves '{served.get('id')}', not '{service['model']}': every request gets 404.",
                                fix=f"Set {prefix}.model to {served.get('id')}."))
    return context if isinstance(context, int) else None


NEXT_PROTOCOL_PATHS = {"chat_completions": "/chat/completions", "completions": "/completions", "responses": "/responses"}


def _next_slurm_url_rule(name: str, service: dict[str, Any], problems: list[Problem]) -> None:
    """nel-next 0.3.0 on SLURM appends the protocol's path to an api service's url (slurm_gen: ${URL}/chat/completions),
    while its local runs strip it: a url that already ends with it works here and 404s on every request there."""
    url, suffix = str(service.get("url") or ""), NEXT_PROTOCOL_PATHS.get(str(service.get("protocol") or "chat_completions"), "")
    if service.get("type") == "api" and suffix and url.rstrip("/").endswith(suffix):
        base = url.rstrip("/")[: -len(suffix)]
        problems.append(Problem(key=f"services.{name}.url", severity="error", rule="url_path_doubled_on_slurm",
                                message=f"nel-next's SLURM job appends {suffix} to {url}: every request goes to {url.rstrip('/')}{suffix} and fails.",
                                fix=f"Set it to the base URL {base} (local runs take it too)."))


def skills_benchmark_problems(benchmarks: list[Any]) -> list[Problem]:
    """What stops nel-next's skills:// benchmarks from measuring anything: a NeMo-Skills that does not fit nel-next,
    or a METRICS_TYPE nel-next does not grade. Shared by validate_config and evaluate_quantization's pre-flight."""
    from quanteval.engines.nel_next import nelnext

    problems: list[Problem] = []
    skills = [i for i, bench in enumerate(benchmarks) if str((bench or {}).get("name", "")).startswith("skills://")]
    if skills and (why := nelnext.skills_problem()):
        problems.append(Problem(key=f"benchmarks[{skills[0]}]", severity="error", rule="skills_unavailable",
                                message=f"skills:// benchmarks run NeMo-Skills inside nel-next, and {why}: the benchmark fails at start.",
                                fix="Install the NeMo-Skills release your nel-next names into its venv (QUANTEVAL_NEL_NEXT_VENV), "
                                    "or run the benchmark with NEL 0.2.6's ns_* task (its container brings NeMo-Skills)."))
    names = {i: str(benchmarks[i]["name"])[len("skills://"):] for i in skills}
    types = nelnext.skills_metrics_types(sorted(set(names.values()))) if skills else {}
    for index, name in names.items():
        params = (benchmarks[index] or {}).get("params") or {}
        metrics_type = params.get("eval_type") if isinstance(params, dict) and params.get("eval_type") else types.get(name)
        if why := nelnext.skills_grading_problem(name, metrics_type):
            problems.append(Problem(key=f"benchmarks[{index}].name", severity="error", rule="skills_not_graded",
                                    message=f"{why}: the comparison would say nothing was lost while measuring nothing.",
                                    fix=f"Run it with NEL 0.2.6's NeMo-Skills task (its container runs `ns eval`, which grades "
                                        f"'{metrics_type}'), or use a nel-next benchmark that grades its own answers."))
    return problems


def validate_next_document(doc: dict[str, Any], config_path: Path, overrides: list[str] | None = None) -> list[Problem]:
    """A nel-next config: values still ???, nel-next's own schema (its pydantic EvalConfig, run in its venv), then
    the chain rules a schema cannot know: budget vs served context, chat endpoint vs chat template, sampling,
    the served model name."""
    from quanteval.engines.nel_next import nelnext

    problems = [Problem(key=key, severity="error", rule="missing_value", message=f"{key} is still ???.",
                        fix="Fill it: apply_checkpoint, the values deployment_status gives, or set_config_value.")
                for key, value in nelconfig.walk(doc) if value == nelnext.MISSING]
    if problems:
        return problems  # nel-next's schema would only repeat them, less clearly
    for key, value in nelconfig.walk(doc):  # e.g. NEL's `username: ${oc.env:USER}` pasted into a nel-next config
        if isinstance(value, str) and "${oc." in value:
            problems.append(Problem(key=key, severity="error", rule="omegaconf_interpolation", message=(
                f"{key}: {value!r} is OmegaConf syntax (NEL's); nel-next expands only ${{VAR}} and ${{VAR:-default}} and "
                "would use the text as it is."), fix="Write ${VAR} (or ${VAR:-default}) for an environment variable, or the value itself."))
    checked = nelnext.check_schema(str(config_path), overrides)
    for problem in checked.get("problems", []):
        problems.append(Problem(key=problem["path"] or "(config)", severity="error", rule="nel_next_schema",
                                message=f"nel-next rejects it: {problem['message']}",
                                fix="Correct the key or value as nel-next's schema says (extra keys are forbidden)."))
    contexts: dict[str, int | None] = {}
    on_slurm = isinstance(doc.get("cluster"), dict) and doc["cluster"].get("type") == "slurm"
    for name, service in (doc.get("services") or {}).items():
        if isinstance(service, dict):
            contexts[str(name)] = _next_service_rules(str(name), service, problems)
            if on_slurm:
                _next_slurm_url_rule(str(name), service, problems)
    cluster = doc.get("cluster") if isinstance(doc.get("cluster"), dict) else {}
    images = [("cluster.eval_image", cluster.get("eval_image"))]  # the container nel-next's SLURM job evaluates in
    images += [(f"services.{name}.image", service.get("image")) for name, service in (doc.get("services") or {}).items()
               if isinstance(service, dict)]
    problems += [_unpinned_image_problem(path, image) for path, image in images if unpinned_image(image)]
    for index, bench in enumerate(doc.get("benchmarks") or []):
        solver = (bench or {}).get("solver") or {}
        service = (doc.get("services") or {}).get(solver.get("service"), {}) if isinstance(doc.get("services"), dict) else {}
        budget = ((solver.get("generation") or {}).get("max_tokens") or (service.get("generation") or {}).get("max_tokens")) if isinstance(service, dict) else None
        found = task_context_problem(str((bench or {}).get("name")), tasks.recipe_for_benchmark(str((bench or {}).get("name", ""))),
                                     contexts.get(str(solver.get("service"))), budget if isinstance(budget, int) else None,
                                     "--max-model-len for vLLM, --context-length for SGLang")
        if found:
            severity, rule, message, fix = found
            problems.append(Problem(key=f"benchmarks[{index}]", severity=severity, rule=rule, message=message, fix=fix))
    problems += skills_benchmark_problems(doc.get("benchmarks") or [])
    for index, bench in enumerate(doc.get("benchmarks") or []):
        bench_name = str((bench or {}).get("name", ""))
        if bench_name.endswith(".py") and not Path(bench_name).is_absolute() and not (Path.cwd() / bench_name).is_file():
            problems.append(Problem(key=f"benchmarks[{index}].name", severity="error", rule="benchmark_file_missing",
                                    message=f"{bench_name}: nel-next resolves a BYOB file against the directory it runs in; no such file here.",
                                    fix="Give the file's absolute path."))
    return problems
