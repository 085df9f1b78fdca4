"""NEL 0.2.6's apply_checkpoint: what a config with a server NEL starts (vllm, sglang, trtllm) takes from a checkpoint.

The model, TP, the checkpoint's server flags, the serving image, thinking, the token budget, sampling and the
evaluation tokenizer; each write is one `key: old -> new (why)` line, and a value a person chose is kept, with
a note.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap

from quanteval import configfile
from quanteval.clusters import executor as executors
from quanteval.configfile import MISSING, delete_path, get_path, has_path, set_path, to_plain, value_at, walk
from quanteval.engines.base import ApplyCheckpointInput, ApplyCheckpointOutput, unpinned_image
from quanteval.engines.nel.config import (
    CONTEXT_LENGTH_FLAGS,
    DUMMY_KEY_VALUE,
    GLOBAL_ADAPTER,
    GLOBAL_PARAMS,
    GLOBAL_TOKENIZER,
    NEL_COMMAND_FLAGS,
    SAMPLING_PARAMS,
    config_tasks,
    deployment_type,
    env_var_defined,
    execution_type,
    is_nemo_skills,
    merge_extra_args,
    model_source_report,
    mount_checkpoint_for_evaluation,
    reads_tokenizer,
    render_extra_args,
    sibling,
    template_params,
    thinking_setting,
)
from quanteval.engines.nel.nelfacts import EVALUATION_CHECKPOINT_MOUNT
from quanteval.models import ProgressFn, ToolError
from quanteval.serving import checkpoint, frameworks, quantformat
from quanteval.serving.serverflags import generation_budget, owned_flags, parse_extra_args

WriteFn = Callable[[CommentedMap, str, Any, str], None]  # (doc, dotted path, value, why): every change says why
RemoveFn = Callable[[CommentedMap, str, str], None]


@dataclass
class _Plan:
    """What apply_checkpoint computed from the checkpoint, before it touches the config."""
    config_path: Path
    framework: str
    report: checkpoint.CheckpointReport
    local_path: str | None
    served_name: str
    tp: int | None
    additions: list[tuple[str, str | None]]
    budget: int | None
    served_why: str = ""
    tp_why: str = ""
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def write(self, doc: CommentedMap, path: str, value: Any, why: str) -> None:
        old = value_at(doc, path)
        if old != value or not has_path(doc, path):
            set_path(doc, path, value)
            self.changes.append(f"{path}: {to_plain(old)!r} -> {to_plain(value)!r} ({why})")

    def remove(self, doc: CommentedMap, path: str, why: str) -> None:
        if has_path(doc, path):
            delete_path(doc, path)
            self.changes.append(f"{path}: removed ({why})")


def apply_checkpoint(request: ApplyCheckpointInput, progress: ProgressFn, check: configfile.Check) -> ApplyCheckpointOutput:
    """Recompute all a NEL config takes from the checkpoint (model, TP, server flags, token budget, sampling,
    thinking, tokenizer); `check` refuses a file that is no longer a config of this engine."""
    config_path = Path(request.config_path).expanduser()
    framework = deployment_type(configfile.load_config(config_path, check))
    if framework not in CONTEXT_LENGTH_FLAGS:
        raise ToolError(
            f"{request.config_path}: deployment is '{framework}'; apply_checkpoint configures a server NEL starts ({frameworks.one_of(frameworks.FRAMEWORKS)}). "
            "For an existing endpoint set target.api_endpoint.model_id/url with set_config_value; for NIM set deployment.image."
        )
    progress(0, 2, "inspecting checkpoint")
    report = checkpoint.inspect_checkpoint(checkpoint.InspectCheckpointInput(checkpoint=request.checkpoint))
    progress(1, 2, "writing config")
    plan = _plan(request, config_path, framework, report)
    diff = configfile.edit_config(config_path, lambda doc: _mutate(plan, doc), check)
    flags = report.deployment_flags.get(framework)
    # this framework's own verdict on the format (flags.notes) replaces the checkpoint's summary across frameworks
    summary = set(quantformat.format_warnings(report.quantization)) if flags else set()
    warnings = [warning for warning in report.warnings if warning not in summary]
    notes = list(dict.fromkeys(warnings + (list(flags.notes) if flags else []) + plan.notes))
    missing = configfile.missing_value_paths(configfile.load_config(config_path, check))
    return ApplyCheckpointOutput(config_path=request.config_path, changes=plan.changes, diff=diff, missing_values=missing, notes=notes)


def _plan(request: ApplyCheckpointInput, config_path: Path, framework: str, report: checkpoint.CheckpointReport) -> _Plan:
    handle = report.hf_handle
    if framework == "trtllm" and handle and not request.cluster_checkpoint_path:
        raise ToolError(f"{request.checkpoint}: NEL's TensorRT-LLM deployment reads a local checkpoint_path only. Give the checkpoint's directory (or cluster_checkpoint_path).")
    flags = report.deployment_flags.get(framework)
    additions = [option for option in parse_extra_args(" ".join(shlex.quote(arg) for arg in flags.args)) if option[0] not in NEL_COMMAND_FLAGS[framework]] if flags else []
    parser = frameworks.REASONING_PARSERS.get(report.architecture.model_type or "", {}).get(framework) if report.reasoning else None
    if parser:
        additions.append(("--reasoning-parser", parser))
    return _Plan(
        config_path=config_path, framework=framework, report=report,
        local_path=request.cluster_checkpoint_path or (None if handle else report.checkpoint),
        served_name=request.served_model_name or handle or Path(report.checkpoint).name,
        tp=request.tensor_parallel_size or (report.gpu_fit[0].tensor_parallel_size if report.gpu_fit else None),
        additions=additions, budget=generation_budget(report.context_length) if report.context_length else None,
        served_why="as asked" if request.served_model_name else
        f"the name requests use: the checkpoint's {'Hugging Face handle' if handle else 'folder name'}",
        tp_why="as asked" if request.tensor_parallel_size else
        f"what its weights need on {report.gpu_fit[0].gpu_type} (inspect_checkpoint's gpu_fit)" if report.gpu_fit else "",
    )


def _mutate(plan: _Plan, doc: CommentedMap) -> None:
    plan.changes.clear()
    plan.notes.clear()
    framework, write = plan.framework, plan.write
    old = model_source_report(doc, plan.config_path)  # what the config pointed at before: its values are ours to replace
    old_sources = {str(v) for v in (value_at(doc, "deployment.checkpoint_path"), value_at(doc, "deployment.hf_model_handle")) if v}
    if plan.local_path:
        write(doc, "deployment.checkpoint_path", plan.local_path, "the checkpoint the server loads")
        if framework != "trtllm":
            write(doc, "deployment.hf_model_handle", None, "the checkpoint is served from its path, not a handle")
    else:
        write(doc, "deployment.hf_model_handle", plan.report.hf_handle, "the checkpoint the server loads")
        write(doc, "deployment.checkpoint_path", None, "the checkpoint is served by its Hugging Face handle")
    write(doc, "deployment.served_model_name", plan.served_name, plan.served_why)
    if plan.tp:
        write(doc, "deployment.tensor_parallel_size", plan.tp, plan.tp_why)
    # The checkpoint's flags replace ours in place; an owned flag this checkpoint does not need goes.
    merged = parse_extra_args(merge_extra_args(str(value_at(doc, "deployment.extra_args") or ""), plan.additions))
    needed = {flag for flag, _ in plan.additions}
    write(doc, "deployment.extra_args", render_extra_args([o for o in merged if o[0] in needed or o[0] not in owned_flags(framework)]),
          f"the flags {framework} needs for this checkpoint: its context, format, reasoning parser; a previous "
          "checkpoint's are dropped, yours kept")
    _apply_image(doc, framework, write, plan.notes)
    _apply_thinking(doc, plan.report, write, plan.remove)
    _apply_generation(doc, plan.report, old, plan.budget, plan.report.context_length, write, plan.remove, plan.notes)
    _apply_tokenizer(doc, plan.report, old, old_sources, plan.local_path, write, plan.remove, plan.notes, plan.changes)
    _apply_skills_key(doc, write, plan.notes)


def _apply_skills_key(doc: CommentedMap, write: WriteFn, notes: list[str]) -> None:
    """NeMo-Skills tasks send an API key even to a self-deployed server: give DUMMY_API_KEY a dummy value."""
    task_names = [str(task.get("name")) for _, task in config_tasks(doc) if isinstance(task, dict)]
    if not any(is_nemo_skills(name) for name in task_names):
        return
    why = "NeMo-Skills tasks send an API key even to a self-deployed server"
    if not value_at(doc, "target.api_endpoint.api_key_name"):
        write(doc, "target.api_endpoint.api_key_name", "DUMMY_API_KEY", why)
    key_name = str(value_at(doc, "target.api_endpoint.api_key_name"))
    if key_name == "DUMMY_API_KEY" and not env_var_defined(doc, key_name):
        write(doc, f"evaluation.env_vars.{key_name}", DUMMY_KEY_VALUE, why + ": a dummy value, nothing to export")
        notes.append("NeMo-Skills tasks send an API key even to a self-deployed server: the config now gives DUMMY_API_KEY a dummy value (evaluation.env_vars), nothing to export.")



def _apply_image(doc: CommentedMap, framework: str, write: WriteFn, notes: list[str]) -> None:
    """A serving image that cannot move between the baseline and the quantized run: the release quanteval's facts
    for this framework were checked against, where the config names none (NEL's default is `:latest`) or a moving tag."""
    pinned = frameworks.PINNED_IMAGES.get(framework)
    current = value_at(doc, "deployment.image")
    if pinned and (current is None or unpinned_image(current)):
        write(doc, "deployment.image", pinned, f"the {framework} release quanteval's facts were checked against, in "
              f"place of {'a moving tag' if current else 'NEL default latest'}")
        notes.append(f"deployment.image pinned to {pinned}, the {framework} release quanteval's facts were checked against "
                     f"(was {current or 'unset: NEL default latest'}); use your own pinned tag if you serve another release.")


def _apply_thinking(doc: CommentedMap, report: checkpoint.CheckpointReport, write: WriteFn, remove: RemoveFn) -> None:
    """Thinking on for a chat template with a reasoning toggle (unless the config already chose); gone for one without."""
    key = f"{GLOBAL_ADAPTER}.params_to_add"
    added = value_at(doc, key)
    if report.reasoning:
        why = "the chat template has a reasoning toggle: thinking on, as the model is meant to run"
        if added == MISSING or (added is None and has_path(doc, key)):
            write(doc, key, CommentedMap(chat_template_kwargs=CommentedMap(enable_thinking=True)), why)
        elif isinstance(added, dict) and thinking_setting(doc) is None:
            write(doc, f"{key}.chat_template_kwargs.enable_thinking", True, why)
        return
    why = "the chat template has no reasoning toggle"
    if added == MISSING:  # NEL's template says: remove the field for models without a reasoning toggle
        remove(doc, key, why)
        return
    for path, _ in list(walk(doc)):
        if path.endswith("params_to_add.chat_template_kwargs") and has_path(doc, path):
            kwargs = get_path(doc, path)
            for name in ("enable_thinking", "thinking"):
                if isinstance(kwargs, dict) and name in kwargs:
                    remove(doc, f"{path}.{name}", why)
            if isinstance(kwargs, dict) and not kwargs:
                remove(doc, path, "empty")
            parent = path.rsplit(".", 1)[0]
            if has_path(doc, parent) and get_path(doc, parent) in ({}, None):
                remove(doc, parent, "empty")


def _apply_generation(
    doc: CommentedMap, report: checkpoint.CheckpointReport, old: checkpoint.CheckpointReport | None,
    budget: int | None, context: int | None, write: WriteFn, remove: RemoveFn, notes: list[str],
) -> None:
    """max_new_tokens within the serving context, and the checkpoint's sampling where nobody chose other values."""
    template = template_params()
    old_budget = generation_budget(old.context_length) if old and old.context_length else None
    if budget and context:
        for path, value in list(walk(doc)):
            if not path.endswith("config.params.max_new_tokens") or not isinstance(value, int) or isinstance(value, bool):
                continue
            is_global = path == f"{GLOBAL_PARAMS}.max_new_tokens"
            if value >= context or (is_global and (value in template.get("max_new_tokens", ()) or value == old_budget)):
                write(doc, path, budget, (f"{value} is not below the serving context {context}: every request would be "
                                          "refused" if value >= context else f"within the serving context {context}") +
                      f"; leaves {context - budget} tokens for the prompt")
    defaults = report.generation_defaults
    taken = []
    for key in SAMPLING_PARAMS:
        want = defaults.get(key)
        path = f"{GLOBAL_PARAMS}.{key}"
        if want is None:
            continue
        current = value_at(doc, path)
        if current is None or current in template.get(key, ()) or (old is not None and current == old.generation_defaults.get(key)):
            if current != want:
                write(doc, path, want, "the checkpoint's generation_config.json, in place of "
                      + ("none" if current is None else "NEL's template value" if current in template.get(key, ()) else
                         "the previous checkpoint's"))
                taken.append(f"{key} {want}")
        elif current != want:
            notes.append(f"Kept {path} = {current}; the checkpoint's generation_config.json recommends {want}.")
    top_k = defaults.get("top_k")
    top_k_path = f"{GLOBAL_ADAPTER}.params_to_add.top_k"
    current_top_k = value_at(doc, top_k_path)
    old_top_k = old.generation_defaults.get("top_k") if old else None
    if top_k is not None and (current_top_k is None or current_top_k == old_top_k):
        if current_top_k != top_k and isinstance(value_at(doc, f"{GLOBAL_ADAPTER}.params_to_add") or {}, dict):
            write(doc, top_k_path, top_k, "the checkpoint's generation_config.json, sent by the payload modifier: NEL "
                  "has no top_k param")
            taken.append(f"top_k {top_k} (sent by the payload modifier: NEL has no top_k param)")
    elif top_k is None and current_top_k is not None and current_top_k == old_top_k:
        remove(doc, top_k_path, "it came from the previous checkpoint's generation_config.json; this one's has none")
    if taken:
        notes.append(f"Sampling from the checkpoint's generation_config.json (NEL's template values replaced): {', '.join(taken)}.")


def _apply_tokenizer(
    doc: CommentedMap, report: checkpoint.CheckpointReport, old: checkpoint.CheckpointReport | None, old_sources: set[str],
    local_path: str | None, write: WriteFn, remove: RemoveFn, notes: list[str], changes: list[str],
) -> None:
    """The evaluation container's tokenizer: the HF handle, or on SLURM the checkpoint mounted at /checkpoint.

    Only lm-evaluation-harness, ruler and genai-perf tasks read it, and NEL warns about a parameter a task's command
    never reads: so it goes where the readers are, globally when every task reads it, else under each reading task,
    and nowhere without readers. With readers and no way to reach a local checkpoint from the evaluation container
    (NEL's local executor mounts nothing there) it stays ??? with a note.
    """
    handle = report.hf_handle
    tokenizer = handle or executors.for_name(execution_type(doc)).container_mount(local_path, EVALUATION_CHECKPOINT_MOUNT)
    entries = [(path, str(task.get("name"))) for path, task in config_tasks(doc) if isinstance(task, dict)]
    readers = [(path, name) for path, name in entries if reads_tokenizer(name)]
    if readers and len(readers) == len(entries):
        targets = [GLOBAL_TOKENIZER]
    else:
        targets = [f"{path}.nemo_evaluator_config.config.params.extra.tokenizer" for path, _ in readers]
    ours = {MISSING, EVALUATION_CHECKPOINT_MOUNT, *old_sources} | ({old.hf_handle} if old and old.hf_handle else set())
    present = [path for path, _ in walk(doc) if path.endswith("params.extra.tokenizer")]
    backend = next((value_at(doc, sibling(path, "tokenizer_backend")) for path in present if value_at(doc, path) in ours
                    and value_at(doc, sibling(path, "tokenizer_backend")) is not None), None)
    for path in present:
        if path in targets:
            continue
        if value_at(doc, path) not in ours:
            idle = [name for task_path, name in entries if (task_path, name) not in readers and not path.startswith(f"{task_path}.")]
            notes.append(f"Kept {path} = {value_at(doc, path)} (set by hand), though {', '.join(idle) or 'no task'} never read it: "
                         "NEL warns about it (dry_run's nel_warnings).")
            continue
        why = "no task in this config reads the evaluation tokenizer" if not readers else "set under the tasks that read it instead"
        remove(doc, path, why)
        remove(doc, sibling(path, "tokenizer_backend"), "goes with the tokenizer")
        if value_at(doc, path.rsplit(".", 1)[0]) == {}:
            remove(doc, path.rsplit(".", 1)[0], "empty")
    mounted = False
    for path in targets:
        current = value_at(doc, path)
        if current is not None and current not in ours:
            notes.append(f"Kept {path} = {current} (set by hand); check it is {report.hf_handle or 'the tokenizer of ' + Path(report.path).name}.")
            continue
        write(doc, path, tokenizer or MISSING, "the tokenizer " + ", ".join(name for _, name in readers) + " read: " + (
            "the checkpoint's Hugging Face handle" if handle else f"the checkpoint mounted at {tokenizer}" if tokenizer
            else "??? until you set it (see notes)"))
        if backend is not None:
            write(doc, sibling(path, "tokenizer_backend"), backend, "goes with the tokenizer")
        mounted = mounted or tokenizer == EVALUATION_CHECKPOINT_MOUNT
        if not tokenizer:
            notes.append(
                f"{path} is still ???: {', '.join(name for _, name in readers)} read it, and NEL's local executor cannot show a local "
                "checkpoint to the evaluation container. Set it to the model's Hugging Face handle (quanteval plan --set KEY=VALUE, "
                "or set_config_value)."
            )
    changes += mount_checkpoint_for_evaluation(doc, str(local_path) if mounted else None)
