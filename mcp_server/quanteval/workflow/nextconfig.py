"""apply_checkpoint for a nel-next config: what its model service takes from the checkpoint.

nel-next's service (`services.<name>`) holds what NEL 0.2.6 spreads over deployment and evaluation params:
the model path and served name, TP and server flags for a server nel-next starts (vllm, sglang), the protocol,
and `generation` (max_tokens, temperature, top_p). nel-next has no top_k field: it reaches the server through the
service's adapter proxy (`proxy.extra_body`), which merges it into every request (measured with vLLM's request log).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ruamel.yaml.comments import CommentedMap

from quanteval.models import ProgressFn, ToolError, no_progress
from quanteval.serving import checkpoint
from quanteval.workflow import nelconfig
from quanteval.workflow.nelconfig import MISSING, ApplyCheckpointInput, ApplyCheckpointOutput

MANAGED = ("vllm", "sglang")  # servers nel-next starts from a model path, with flags quanteval knows


def model_service(doc: Any, config_path: str) -> tuple[str, dict[str, Any]]:
    """The one model service a quanteval-built config has (a judge service would be a second one)."""
    services = doc.get("services") if isinstance(doc, dict) else None
    models = {name: s for name, s in (services or {}).items() if isinstance(s, dict) and (s.get("type") in (*MANAGED, "api"))}
    if len(models) != 1:
        found = ", ".join(f"{name} ({s.get('type')})" for name, s in (services or {}).items() if isinstance(s, dict)) or "none"
        raise ToolError(f"{config_path}: apply_checkpoint needs exactly one vllm, sglang or api service under services:, found {found}. "
                        "Set the service's values with set_config_value instead.")
    return next(iter(models.items()))


def apply_checkpoint_next(request: ApplyCheckpointInput, progress: ProgressFn = no_progress) -> ApplyCheckpointOutput:
    """nel-next: the service's model, served name, TP and server flags (managed servers), protocol by the chat template,
    max_tokens within the context, and the checkpoint's sampling where the config has none of its own."""
    config_path = Path(request.config_path).expanduser()
    name, service = model_service(nelconfig.load_config(config_path), request.config_path)
    progress(0, 2, "inspecting checkpoint")
    report = checkpoint.inspect_checkpoint(checkpoint.InspectCheckpointInput(checkpoint=request.checkpoint))
    progress(1, 2, "writing config")
    framework = service.get("type")
    prefix = f"services.{name}"
    old = _previous_checkpoint(service.get("model"), config_path) if framework in MANAGED else None
    changes: list[str] = []
    notes: list[str] = []

    def write(doc: CommentedMap, path: str, value: Any) -> None:
        before = nelconfig.value_at(doc, path)
        if before != value or not nelconfig.has_path(doc, path):
            nelconfig.set_path(doc, path, value)
            changes.append(f"{path}: {nelconfig.to_plain(before)!r} -> {nelconfig.to_plain(value)!r}")

    def mutate(doc: CommentedMap) -> None:
        changes.clear()
        notes.clear()
        if framework in MANAGED:
            _apply_server(doc, prefix, framework, report, request, write)
        protocol = "chat_completions" if report.chat_template else "completions"
        if nelconfig.value_at(doc, f"{prefix}.protocol") != protocol:
            write(doc, f"{prefix}.protocol", protocol)
            if framework == "api" and isinstance(service.get("url"), str) and service["url"] != MISSING:
                from quanteval.engines.nel_next import nelnext

                write(doc, f"{prefix}.url", nelnext.endpoint_url(service["url"], protocol))
            if protocol == "completions":
                notes.append(f"{report.checkpoint} has no chat template: the service uses the completions endpoint (prompts go to the model as they are).")
        _apply_generation(doc, prefix, report, old, write, notes)

    diff = nelconfig.edit_config(config_path, mutate)
    flags = report.deployment_flags.get(framework) if framework in MANAGED else None
    notes = list(dict.fromkeys(list(report.warnings) + (list(flags.notes) if flags else []) + notes))
    missing = nelconfig.missing_value_paths(nelconfig.load_config(config_path))
    return ApplyCheckpointOutput(config_path=request.config_path, changes=changes, diff=diff, missing_values=missing, notes=notes)


def _apply_server(doc: CommentedMap, prefix: str, framework: str, report: checkpoint.CheckpointReport,
                  request: ApplyCheckpointInput, write: nelconfig.WriteFn) -> None:
    """What nel-next's vllm/sglang service starts: the model, its served name, TP, and the checkpoint's server flags."""
    from quanteval.serving import frameworks

    write(doc, f"{prefix}.model", request.cluster_checkpoint_path or report.hf_handle or report.checkpoint)
    write(doc, f"{prefix}.served_model_name", request.served_model_name or report.hf_handle or Path(report.checkpoint).name)
    tp = request.tensor_parallel_size or (report.gpu_fit[0].tensor_parallel_size if report.gpu_fit else None)
    if tp:
        write(doc, f"{prefix}.tensor_parallel_size", tp)
    flags = report.deployment_flags.get(framework)
    additions = nelconfig.parse_extra_args(" ".join(shlex.quote(arg) for arg in flags.args)) if flags else []
    parser = frameworks.REASONING_PARSERS.get(report.architecture.model_type or "", {}).get(framework) if report.reasoning else None
    if parser:
        additions.append(("--reasoning-parser", parser))
    current = nelconfig.value_at(doc, f"{prefix}.extra_args") or []
    kept = nelconfig.parse_extra_args(" ".join(shlex.quote(str(arg)) for arg in current))
    needed = {flag for flag, _ in additions}
    owned = nelconfig.owned_flags(framework)
    merged = [option for option in kept if option[0] not in needed and option[0] not in owned] + additions
    argv = [part for flag, value in merged for part in ((flag,) if value is None else (flag, value))]
    if argv != list(current):
        write(doc, f"{prefix}.extra_args", argv)


def _apply_generation(doc: CommentedMap, prefix: str, report: checkpoint.CheckpointReport,
                      old: checkpoint.CheckpointReport | None, write: nelconfig.WriteFn, notes: list[str]) -> None:
    """max_tokens inside the context; temperature/top_p/top_k from generation_config.json where the config has none,
    or has the previous checkpoint's. build_config's greedy temperature 0.0 is a choice and is kept, with a note."""
    context = report.context_length
    path = f"{prefix}.generation.max_tokens"
    current = nelconfig.value_at(doc, path)
    if context:
        budget = nelconfig.generation_budget(context)
        old_budget = nelconfig.generation_budget(old.context_length) if old and old.context_length else None
        if current in (MISSING, None, old_budget) or (isinstance(current, int) and current >= context):
            if isinstance(current, int) and current >= context:
                notes.append(f"{path} was {current}, not below the context {context}: every request would be refused. Now {budget}.")
            write(doc, path, budget)
    wanted = report.generation_defaults
    previous = old.generation_defaults if old else {}
    for key, target in (("temperature", f"{prefix}.generation.temperature"), ("top_p", f"{prefix}.generation.top_p"),
                        ("top_k", f"{prefix}.proxy.extra_body.top_k")):
        want, have = wanted.get(key), nelconfig.value_at(doc, target)
        if want is None or have == want:
            continue
        if have is None or (key in previous and have == previous[key]):
            write(doc, target, want)
        else:
            notes.append(f"Kept {target} = {have}; the checkpoint's generation_config.json recommends {want}.")


def _previous_checkpoint(model: Any, config_path: Path) -> checkpoint.CheckpointReport | None:
    """The checkpoint the service pointed at before, when it is a local directory: its values are ours to replace."""
    if not isinstance(model, str) or model == MISSING:
        return None
    path = Path(model).expanduser()
    if not path.is_absolute():
        path = config_path.parent / path
    if not (path / "config.json").is_file():
        return None
    try:
        return checkpoint.inspect_checkpoint(checkpoint.InspectCheckpointInput(checkpoint=str(path)))
    except ToolError:
        return None
