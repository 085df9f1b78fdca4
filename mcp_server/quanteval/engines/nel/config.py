"""NEL 0.2.6's config knowledge: its skeleton (build_config from NEL's templates), the facts later steps read
(execution and deployment type, tasks, env vars, server flags, generation settings), and its checkpoint facts.

apply_checkpoint's writing lives in engines/nel/apply.py, the validation rules in engines/nel/rules*.py.
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from pathlib import Path
from typing import Any, Literal

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from quanteval.configfile import MISSING, list_at, parse_config_text, to_plain, value_at
from quanteval.engines import catalogue
from quanteval.engines.base import env_references
from quanteval.engines.nel.nelexec import UNRESOLVED
from quanteval.engines.nel.nelfacts import EVALUATION_CHECKPOINT_MOUNT
from quanteval.engines.recipes import recipes_by_task
from quanteval.models import ToolError
from quanteval.serving import checkpoint, frameworks
from quanteval.serving.serverflags import parse_extra_args

# ---------------------------------------------------------------------------
# The skeleton: NEL's own templates, merged as `nel skills build-config` does

ModelType = Literal["base", "chat_reasoning"]
Export = Literal["none", "mlflow", "wandb"]


def benchmark_bundles() -> dict[str, list[str]]:
    """Benchmark bundles per model type, as NEL's own build-config defines them."""
    from nemo_evaluator_launcher.common.build_config import _SUPPORTED_BENCHMARKS_BY_MODEL_TYPE

    return {model_type: sorted(bundles) for model_type, bundles in _SUPPORTED_BENCHMARKS_BY_MODEL_TYPE.items()}


def _templates_dir() -> Path:
    # NEL resolves templates with MultiplexedPath.joinpath(a, b), which Python 3.11 rejects;
    # joining one segment at a time works on every version.
    import importlib.resources

    return Path(str(importlib.resources.files("nemo_evaluator_launcher.resources") / "config_templates"))


def _merge(base: CommentedMap, override: CommentedMap) -> None:
    """NEL's deep_merge (mappings merge, lists extend, scalars replace), keeping comments and order."""
    for key, value in override.items():
        current = base.get(key)
        if key in base and isinstance(current, dict) and isinstance(value, dict):
            _merge(current, value)
        elif key in base and isinstance(current, list) and isinstance(value, list):
            current.extend(value)
        else:
            base[key] = value
            if key in override.ca.items:
                base.ca.items[key] = override.ca.items[key]



def build_config_document(execution: str, deployment: str, model_type: str, benchmarks: list[str], export: str) -> CommentedMap:
    """The merged config, from NEL's templates in NEL's order (execution, export, model type, bundles, deployment)."""
    templates = _templates_dir()
    parts = [f"execution/{execution}.yaml", f"export/{export}.yaml", f"evaluation/{model_type}/default.yaml"]
    parts += [f"evaluation/{model_type}/{bundle}.yaml" for bundle in benchmarks]
    parts.append(f"deployment/{deployment}.yaml")
    doc = CommentedMap()
    for part in parts:
        file = templates / part
        _merge(doc, parse_config_text(file.read_text(encoding="utf-8"), str(file)))
    # Hydra needs _self_ last in defaults, exactly as NEL's build-config arranges it.
    defaults = doc.setdefault("defaults", CommentedSeq())
    for index in reversed(range(len(defaults))):
        if defaults[index] == "_self_":
            del defaults[index]
    defaults.append("_self_")
    for entry in defaults:  # drop the blank lines that ended each template's defaults block
        if isinstance(entry, CommentedMap):
            entry.ca.items.clear()
    return doc


def build_problem(deployment: str, model_type: str, benchmarks: list[str]) -> str | None:
    supported = benchmark_bundles()[model_type]
    unknown = [name for name in benchmarks if name not in supported]
    return f"benchmarks {unknown} are not bundles for model_type '{model_type}'; choose from {supported}" if unknown else None


def config_stem(execution: str, deployment: str, model_type: str, benchmarks: list[str]) -> str:
    """NEL configs keep their historical names: execution_deployment_modeltype_bundles."""
    return f"{execution}_{deployment}_{model_type}_{'_'.join(sorted(benchmarks))}"[:120]


def skeleton(execution: str, deployment: str, model_type: str, benchmarks: list[str], export: str,
             directory: Path) -> tuple[CommentedMap, list[str]]:
    doc = build_config_document(execution, deployment, model_type, benchmarks, export)
    tasks = [str(task.get("name")) for task in doc.get("evaluation", {}).get("tasks", []) if isinstance(task, dict)]
    return doc, tasks


# ---------------------------------------------------------------------------
# Facts about a config every later step needs

def deployment_type(doc: Any) -> str:
    """vllm, sglang, nim, trtllm, none, ...: deployment.type, else the `deployment:` entry of defaults."""
    deployment = doc.get("deployment")
    if isinstance(deployment, dict) and isinstance(deployment.get("type"), str):
        return str(deployment["type"])
    for entry in doc.get("defaults") or []:
        if isinstance(entry, dict) and isinstance(entry.get("deployment"), str):
            return str(entry["deployment"])
    return "none"


def execution_type(doc: Any) -> str:
    """local or slurm (lepton, ...): execution.type, else the `execution:` entry of defaults."""
    execution = doc.get("execution")
    if isinstance(execution, dict) and isinstance(execution.get("type"), str):
        return str(execution["type"])
    for entry in doc.get("defaults") or []:
        if isinstance(entry, dict) and isinstance(entry.get("execution"), str):
            return str(entry["execution"]).split("/")[0]
    return "local"


def config_tasks(doc: Any) -> list[tuple[str, Any]]:
    """(path, task mapping) for every entry of evaluation.tasks, paths by name where unique."""
    evaluation = doc.get("evaluation")
    task_list = evaluation.get("tasks") if isinstance(evaluation, dict) else None
    if not isinstance(task_list, list):
        return []
    names = [task.get("name") for task in task_list if isinstance(task, dict)]
    found = []
    for index, task in enumerate(task_list):
        name = task.get("name") if isinstance(task, dict) else None
        unique = isinstance(name, str) and names.count(name) == 1 and not re.search(r"[.\[\]]", name)
        found.append((f"evaluation.tasks[{name if unique else index}]", task))
    return found




def env_var_references(doc: Any) -> list[tuple[str, str]]:
    """(path, variable name) for every `host:VAR` value and every `${oc.env:VAR}` without a default (engines.base's
    env_references). `target.api_endpoint.api_key_name` counts too: NEL forwards that variable from the host.
    """
    references = env_references(doc)
    target = doc.get("target")
    endpoint = target.get("api_endpoint") if isinstance(target, dict) else None
    key_name = endpoint.get("api_key_name") if isinstance(endpoint, dict) else None
    if isinstance(key_name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_name) and not env_var_defined(doc, key_name):
        references.append(("target.api_endpoint.api_key_name", key_name))
    return references



def env_var_needs(doc: Any) -> dict[str, list[str]]:
    """{variable: keys or recipe:<name> that need it}: `host:` and `${oc.env:}` references, and the tasks' recipes."""
    needed: dict[str, list[str]] = {}
    for path, name in env_var_references(doc):
        needed.setdefault(name, []).append(path)
    recipes = recipes_by_task()
    for _, task in config_tasks(doc):
        recipe = recipes.get(str(task.get("name"))) if isinstance(task, dict) else None
        for name in recipe.env_vars if recipe else []:
            if not env_var_defined(doc, name):  # e.g. DUMMY_API_KEY: lit:dummy, written by apply_checkpoint
                needed.setdefault(name, []).append(f"recipe:{recipe.name}")
    return needed


def env_var_defined(doc: Any, name: str) -> bool:
    """The config itself gives `name` a value (env_vars or evaluation.env_vars), so the host need not."""
    for mapping in (doc.get("env_vars"), (doc.get("evaluation") or {}).get("env_vars") if isinstance(doc.get("evaluation"), dict) else None):
        if isinstance(mapping, dict) and isinstance(mapping.get(name), str) and not str(mapping[name]).startswith("host:"):
            return True
    return False



# ---------------------------------------------------------------------------
# extra_args: server flags as (flag, value) options

# Flags NEL's own deployment command already passes (configs/deployment/*.yaml): repeating them in
# extra_args makes the server see them twice; their values belong in the deployment keys.
NEL_COMMAND_FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        "--tensor-parallel-size": "deployment.tensor_parallel_size",
        "--pipeline-parallel-size": "deployment.pipeline_parallel_size",
        "--data-parallel-size": "deployment.data_parallel_size",
        "--port": "deployment.port",
        "--trust-remote-code": "(always passed by NEL's vLLM command)",
        "--served-model-name": "deployment.served_model_name",
        "--gpu-memory-utilization": "deployment.gpu_memory_utilization",
    },
    "sglang": {
        "--model-path": "deployment.checkpoint_path / deployment.hf_model_handle",
        "--host": "(always 0.0.0.0 in NEL's SGLang command)",
        "--port": "deployment.port",
        "--served-model-name": "deployment.served_model_name",
        "--tp-size": "deployment.tensor_parallel_size",
        "--tensor-parallel-size": "deployment.tensor_parallel_size",  # SGLang's long alias of --tp-size
        "--dp-size": "deployment.data_parallel_size",
        "--data-parallel-size": "deployment.data_parallel_size",
        "--pp-size": "deployment.pipeline_parallel_size",
        "--pipeline-parallel-size": "deployment.pipeline_parallel_size",
    },
    "trtllm": {
        "--tp_size": "deployment.tensor_parallel_size",
        "--pp_size": "deployment.pipeline_parallel_size",
        "--host": "(always 0.0.0.0 in NEL's TensorRT-LLM command)",
        "--port": "deployment.port",
        "--backend": "(always pytorch in NEL's TensorRT-LLM command)",
        "--trust_remote_code": "(always passed by NEL's TensorRT-LLM command)",
    },
}

CONTEXT_LENGTH_FLAGS = {name: info.context_flag for name, info in frameworks.FRAMEWORK_INFO.items()}


def render_extra_args(options: list[tuple[str, str | None]]) -> str:
    return " ".join(flag if value is None else f"{flag} {shlex.quote(value)}" for flag, value in options)


def merge_extra_args(current: str, additions: list[tuple[str, str | None]]) -> str:
    """Add or replace flags: one occurrence per flag, the addition's value wins, order kept."""
    options = parse_extra_args(current)
    for flag, value in additions:
        positions = [i for i, (existing, _) in enumerate(options) if existing == flag]
        if positions:
            options[positions[0]] = (flag, value)
            options = [option for i, option in enumerate(options) if i not in positions[1:]]
        else:
            options.append((flag, value))
    return render_extra_args(options)



# ---------------------------------------------------------------------------
# Generation settings and the checkpoint behind a config

GLOBAL_PARAMS = "evaluation.nemo_evaluator_config.config.params"
GLOBAL_ADAPTER = "evaluation.nemo_evaluator_config.target.api_endpoint.adapter_config"
GLOBAL_TOKENIZER = f"{GLOBAL_PARAMS}.extra.tokenizer"
SAMPLING_PARAMS = ("temperature", "top_p")  # NEL params; top_k has none, so it reaches the server through params_to_add
DUMMY_KEY_VALUE = "lit:dummy"  # NeMo-Skills sends some key; a self-deployed server ignores it

# NeMo-Skills overrides in a task's extra.args that set generation: they come after NEL's own flags, so they win.
_NS_INFERENCE = re.compile(r"^\+{0,2}inference\.(tokens_to_generate|temperature|top_p|top_k)=(.*)$")
_NS_TO_PARAM = {"tokens_to_generate": "max_new_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}


def _scalar(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None if text in ("null", "None") else text


def ns_generation_overrides(args: Any) -> dict[str, Any]:
    """{param: value} for the generation settings a NeMo-Skills extra.args string overrides (last one wins)."""
    if not isinstance(args, str):
        return {}
    try:
        tokens = shlex.split(args)
    except ValueError:
        return {}
    found: dict[str, Any] = {}
    for token in tokens:
        match = _NS_INFERENCE.match(token)
        if match:
            found[_NS_TO_PARAM[match.group(1)]] = _scalar(match.group(2).strip("'\""))
    return found



def task_generation(doc: Any, task_path: str) -> dict[str, tuple[Any, str]]:
    """Effective max_new_tokens / temperature / top_p / top_k of one task: {param: (value, key that set it)}.

    NEL merges evaluation.nemo_evaluator_config under the task's own; NeMo-Skills `++inference.*` in
    extra.args overrides both; top_k reaches the server only through the payload modifier (params_to_add).
    """
    found: dict[str, tuple[Any, str]] = {}
    for prefix in ("evaluation.nemo_evaluator_config", f"{task_path}.nemo_evaluator_config"):
        params = value_at(doc, f"{prefix}.config.params")
        if isinstance(params, dict):
            for key in ("max_new_tokens", *SAMPLING_PARAMS):
                if params.get(key) is not None and params.get(key) != MISSING:
                    found[key] = (params[key], f"{prefix}.config.params.{key}")
        added = value_at(doc, f"{prefix}.target.api_endpoint.adapter_config.params_to_add")
        if isinstance(added, dict):
            for key in ("top_k", "max_tokens", *SAMPLING_PARAMS):
                if added.get(key) is not None:
                    found["max_new_tokens" if key == "max_tokens" else key] = (added[key], f"{prefix}.target.api_endpoint.adapter_config.params_to_add.{key}")
    task_params = value_at(doc, f"{task_path}.nemo_evaluator_config.config.params.extra.args")
    global_args = value_at(doc, f"{GLOBAL_PARAMS}.extra.args")
    for where, args in ((f"{GLOBAL_PARAMS}.extra.args", global_args), (f"{task_path}.nemo_evaluator_config.config.params.extra.args", task_params)):
        for key, value in ns_generation_overrides(args).items():
            found[key] = (value, where)
    return found


def thinking_setting(doc: Any) -> tuple[Any, str] | None:
    """(enable_thinking value, key) as the payload modifier sends it to every task, or None."""
    key = "evaluation.nemo_evaluator_config.target.api_endpoint.adapter_config.params_to_add.chat_template_kwargs"
    kwargs = value_at(doc, key)
    names = [name for name in ("enable_thinking", "thinking") if name in kwargs] if isinstance(kwargs, dict) else []
    return (kwargs[names[-1]], f"{key}.{names[-1]}") if names else None


def serving_context(doc: Any, report: checkpoint.CheckpointReport | None) -> tuple[int | None, str]:
    """The context the server will run with: its context-length flag, else the checkpoint's own limit."""
    framework = deployment_type(doc)
    flag = CONTEXT_LENGTH_FLAGS.get(framework)
    raw = value_at(doc, "deployment.extra_args")
    if flag and isinstance(raw, str):
        try:
            values = dict(parse_extra_args(raw))
        except ToolError:
            values = {}
        if str(values.get(flag) or "").isdigit():
            return int(str(values[flag])), f"deployment.extra_args {flag}"
    if report and report.context_length:
        return report.context_length, "the checkpoint's max_position_embeddings"
    return None, ""


@cache
def template_params() -> dict[str, set[Any]]:
    """NEL's template params (temperature 1.0, max_new_tokens 131072, ...): values nobody chose for this model."""
    values: dict[str, Any] = {}
    for model_type in ("base", "chat_reasoning"):
        file = _templates_dir() / "evaluation" / model_type / "default.yaml"
        params = value_at(parse_config_text(file.read_text(encoding="utf-8"), str(file)), GLOBAL_PARAMS)
        for key, value in to_plain(params or {}).items():
            if not isinstance(value, (dict, list)):
                values.setdefault(key, set()).add(value)
    return values


def model_source_report(doc: Any, config_path: Path) -> checkpoint.CheckpointReport | None:
    """inspect_checkpoint's report for the config's model when it is readable here (local path or cached HF handle)."""
    deployment = doc.get("deployment")
    if not isinstance(deployment, dict):
        return None
    local, handle = deployment.get("checkpoint_path"), deployment.get("hf_model_handle")
    if isinstance(local, str) and local not in ("", MISSING):
        path = Path(local).expanduser()
        if not path.is_absolute():
            path = config_path.parent / path
        if (path / "config.json").is_file():
            return inspect_cached(str(path.resolve()), (path / "config.json").stat().st_mtime_ns)
    elif isinstance(handle, str) and handle not in ("", MISSING):
        # The HF cache layout (models--org--name/refs/main); refs/main changes when a new revision lands.
        repo = checkpoint.hf_hub_cache() / ("models--" + handle.replace("/", "--"))
        ref = repo / "refs" / "main"
        if repo.is_dir():
            return inspect_cached(handle, (ref if ref.is_file() else repo).stat().st_mtime_ns)
    return None


@cache
def inspect_cached(path: str, mtime_ns: int) -> checkpoint.CheckpointReport | None:
    try:
        return checkpoint.inspect_checkpoint(checkpoint.InspectCheckpointInput(checkpoint=path))
    except ToolError:
        return None  # a broken checkpoint is inspect_checkpoint's to report, not a config problem


def mount_checkpoint_for_evaluation(doc: CommentedMap, local_path: str | None) -> list[str]:
    """execution.mounts.evaluation[<checkpoint>] = /checkpoint, replacing any other checkpoint mounted there.

    A mapping key, not a dotted path: it holds dots and slashes. Returns one change line per edit.
    """
    changes = []
    execution = doc.get("execution")
    mounts = execution.get("mounts") if isinstance(execution, dict) else None
    evaluation = mounts.get("evaluation") if isinstance(mounts, dict) else None
    if isinstance(evaluation, dict):
        for source in [key for key, target in evaluation.items() if target == EVALUATION_CHECKPOINT_MOUNT and key != local_path]:
            del evaluation[source]
            changes.append(f"execution.mounts.evaluation: removed {source} -> {EVALUATION_CHECKPOINT_MOUNT} (another "
                           "checkpoint's mount at the same place)")
    if local_path is None:
        return changes
    execution = doc.setdefault("execution", CommentedMap())
    if not isinstance(execution.get("mounts"), dict):
        execution["mounts"] = CommentedMap()
    if not isinstance(execution["mounts"].get("evaluation"), dict):
        execution["mounts"]["evaluation"] = CommentedMap()
    if execution["mounts"]["evaluation"].get(local_path) != EVALUATION_CHECKPOINT_MOUNT:
        execution["mounts"]["evaluation"][local_path] = EVALUATION_CHECKPOINT_MOUNT
        changes.append(f"execution.mounts.evaluation: {local_path} -> {EVALUATION_CHECKPOINT_MOUNT} (the evaluation "
                       "container reads the checkpoint's tokenizer there)")
    return changes



def is_nemo_skills(name: str) -> bool:
    return any(entry.harness == "nemo_skills" for entry in catalogue.lookup(name))


def sibling(path: str, key: str) -> str:
    return f"{path.rsplit('.', 1)[0]}.{key}"


def reads_tokenizer(name: str) -> bool:
    return any(entry.reads_tokenizer for entry in catalogue.lookup(name))



# ---------------------------------------------------------------------------
# what a local launch touches (`quanteval-mcp --root` confines it)

DOCKER_MOUNT_FLAGS = ("-v", "--volume", "--mount")
# NEL writes mounted host paths into run.sh unquoted (`-v {{ mount }}`): the shell would expand or split anything else.
_SHELL_PLAIN_PATH = re.compile(r"^[\w./@%+=:,~-]+$")


def mounts_host_path(docker_args: str) -> bool:
    """Do these extra docker arguments mount a host path (-v/--volume/--mount), which no key of the config names?"""
    try:
        words = shlex.split(docker_args)
    except ValueError:
        words = docker_args.split()
    return any(word.split("=")[0] in DOCKER_MOUNT_FLAGS for word in words)


def launch_paths(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, path) for every local path a run of this config on this machine writes, mounts or runs: the output
    directory (scripts and results), the checkpoint and cache (mounted into the server container), execution.mounts
    (the mapping's keys are host paths) and each task's dataset_dir. `doc` is the config as NEL composed and resolved
    it (nelexec's `resolved`): a path NEL could not resolve is refused, since where it points cannot be known."""
    execution, deployment = doc.get("execution") or {}, doc.get("deployment") or {}
    found = [("execution.output_dir", execution.get("output_dir")), ("deployment.checkpoint_path", deployment.get("checkpoint_path")),
             ("deployment.cache_path", deployment.get("cache_path"))]
    for role, mounts in (execution.get("mounts") or {}).items():
        if isinstance(mounts, dict):
            found += [(f"execution.mounts.{role}", source) for source in mounts]
    for path, task in config_tasks(doc):
        if isinstance(task, dict):
            found.append((f"{path}.dataset_dir", task.get("dataset_dir")))
    docker_args = execution.get("extra_docker_args")
    if isinstance(docker_args, str) and mounts_host_path(docker_args):
        raise ToolError("execution.extra_docker_args: mounts a host path (-v/--volume/--mount), which this server's workspace root (--root) "
                        "cannot check. Use execution.mounts (checked) or deployment.checkpoint_path instead.")
    for key, value in found:
        if isinstance(value, str) and value.startswith(UNRESOLVED):
            reason = value[len(UNRESOLVED):].splitlines()[0]
            raise ToolError(f"{key}: NEL cannot resolve it here ({reason}), so where it points cannot be checked against this "
                            "server's workspace root (--root). Set the variable, or write the path itself.")
        if isinstance(value, str) and value not in (MISSING, "") and not _SHELL_PLAIN_PATH.match(value):
            raise ToolError(f"{key}: {value!r} holds characters the shell would expand or split in NEL's run.sh ($, quotes, "
                            "spaces, ...), so where it points cannot be checked against this server's workspace root (--root). "
                            "Write the plain path.")
    return [(key, value) for key, value in found if isinstance(value, str) and value not in (MISSING, "")]


# ---------------------------------------------------------------------------
# add_tasks


def task_key(config_name: str) -> str:
    """`harness.task` where the name resolves to one task, so ns_gpqa and nemo_skills.ns_gpqa compare equal."""
    if "." in config_name:
        return config_name
    entries = catalogue.lookup(config_name)
    return entries[0].qualified_name if len(entries) == 1 else config_name


def _tasks_list(doc: CommentedMap) -> CommentedSeq:
    evaluation = doc.setdefault("evaluation", CommentedMap())
    if not isinstance(evaluation, dict):
        raise ToolError("evaluation must be a mapping. Fix the config or rebuild it with build_config.")
    return list_at(evaluation, "tasks", "evaluation.tasks")


def task_keys(doc: CommentedMap, clear: bool) -> set[str]:
    if clear:
        _tasks_list(doc).clear()
    return {task_key(str(item.get("name"))) for item in _tasks_list(doc) if isinstance(item, dict) and item.get("name")}


def add_task(doc: CommentedMap, qualified_name: str, fragment: dict[str, Any], repeats: int | None) -> str:
    """The item (its recipe's or NEL's default) appended to evaluation.tasks as it is."""
    _tasks_list(doc).append(fragment)
    return str(fragment.get("name"))
