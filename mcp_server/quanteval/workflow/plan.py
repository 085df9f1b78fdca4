"""`quanteval plan`: from a checkpoint and a list of benchmarks to a checked NEL config and the commands to run it.

It chains the registry's tools exactly as an assistant would call them — inspect_checkpoint,
build_config, add_tasks, apply_checkpoint, list_missing_values, validate_config, dry_run —
and gathers what a person needs to decide the next step into one report. Nothing here
launches GPU work: the report ends with the canary and full-run commands to run by hand.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from quanteval import configfile, engines, registry
from quanteval.clusters import executor as executors
from quanteval.models import ProgressFn, ToolError, no_progress
from quanteval.serving.frameworks import Execution, PlanDeployment
from quanteval.workflow import tasks

LIMIT_SAMPLES_OVERRIDE = "++evaluation.nemo_evaluator_config.config.params.limit_samples=10"

# validate_config rules whose findings list_missing_values already reports (shown once, as missing values).
LISTED_AS_MISSING = {"missing_value", "unset_env_var"}

# Benchmark bundle used to build the base config when --tasks replaces its tasks anyway.
DEFAULT_BUNDLE = {"chat_reasoning": "core_reasoning", "base": "general_knowledge"}

# Progress is reported as step n of this many.
TOTAL_STEPS = 7


class PlanRequest(BaseModel):
    model: str = Field(description="Checkpoint directory or Hugging Face handle already in the local HF cache.")
    tasks: list[str] = Field(default_factory=list, description="Recipe or catalogue task names; empty keeps the bundle's tasks.")
    execution: Execution = Field("local", description="Where NEL runs the jobs.")
    deployment: PlanDeployment = Field("vllm", description="Who serves the model.")
    model_type: Literal["chat_reasoning", "base"] = Field("chat_reasoning", description="chat_reasoning (chat endpoint) or base (completions).")
    output_dir: str | None = Field(None, description="execution.output_dir for the results (absolute on SLURM).")
    config: str | None = Field(None, description="Config file to write; default <model>-<execution>-<deployment>.yaml here.")
    force: bool = Field(False, description="Replace an existing config file.")
    host: str | None = Field(None, description=(
        "SLURM login host (ssh config alias): the plan asks the cluster for partition, GPUs per node, walltime and "
        "account (apply_cluster). Default: a --set execution.hostname value."))
    set_values: dict[str, str] = Field(
        default_factory=dict, description="Config keys to set after the checkpoint is applied: {key: YAML text}, e.g. SLURM account or tokenizer."
    )


class PlanStep(BaseModel):
    tool: str
    summary: str


class PlanReport(BaseModel):
    model: str
    config_path: str
    architecture: str | None
    quantization: str
    context_length: int | None
    tensor_parallel_size: int | None
    notes: list[str] = Field(description="Checkpoint warnings and framework notes worth reading before a run.")
    tasks: list[str] = Field(description="evaluation.tasks names in the written config.")
    skipped_tasks: list[str]
    missing_values: list[str] = Field(description="What still needs a value: dotted paths and env var names, never values.")
    validation_problems: list[str] = Field(
        description="'severity path: message Fix: ...' per problem validate_config found, other than the missing values."
    )
    cluster_unknowns: list[str] = Field(default_factory=list, description=(
        "SLURM: what no one has checked against the cluster yet (partition, GPUs per node, walltime), and how to settle it."))
    dry_run_ok: bool
    dry_run_detail: str
    canary_command: str
    canary_nel_command: str
    full_run_command: str
    full_run_nel_command: str
    steps: list[PlanStep] = Field(description="Each tool called, in order, with a one-line outcome.")

    @property
    def ready(self) -> bool:
        """Nothing left to fill, no validation error, NEL's dry-run passed: the canary can go."""
        return (self.dry_run_ok and not self.missing_values and not self.cluster_unknowns
                and not any(p.startswith("error") for p in self.validation_problems))


def _call(name: str, arguments: dict[str, Any]) -> BaseModel:
    spec = registry.get_tool(name)
    return registry.call_tool(spec, registry.parse_arguments(spec, arguments))


def default_config_path(model: str, execution: str, deployment: str) -> Path:
    stem = Path(model.rstrip("/")).name if Path(model).exists() else model.replace("/", "--")
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-") or "model"
    return Path.cwd() / f"{stem}-{execution}-{deployment}.yaml"


def make_plan(request: PlanRequest, progress: ProgressFn = no_progress) -> PlanReport:
    """Run the whole chain; a ToolError from any step stops it (nothing is launched either way)."""
    chain = _Chain(config_path=_checked_config_path(request), progress=progress)
    progress(0, TOTAL_STEPS, "inspecting the checkpoint")
    report = _call("inspect_checkpoint", {"checkpoint": request.model})
    quant = report.quantization
    quant_text = f"{quant.method or '?'} {quant.quant_algo or ''}".strip() if quant.detected else "none (unquantized)"
    chain.step("inspect_checkpoint", f"{report.architecture.architecture}, quantization {quant_text}")

    _build_base_config(request, chain)
    skipped = _add_tasks(request, chain)
    if request.output_dir:
        _set_output_dir(request.output_dir, request.execution, chain.config_path)
    warnings = _apply_checkpoint(request, chain, report.warnings)
    for key, value in request.set_values.items():  # the user's own values win over every default above
        chain.call("set_config_value", {"config_path": str(chain.config_path), "key": key, "yaml_value": value})
        chain.step("set_config_value", f"{key} = {value}")
    cluster_unknowns: list[str] = []
    if executors.for_name(request.execution).on_cluster:  # its login, partition and account: ask it for the placement
        progress(3, TOTAL_STEPS, "asking the cluster")
        cluster_unknowns = _place_on_cluster(request, chain)
    missing_values = _missing_values(chain)
    problems = _validation_problems(chain)
    dry_ok, dry_detail = _dry_run(chain, missing_values)
    progress(TOTAL_STEPS, TOTAL_STEPS, "done")

    config_path = chain.config_path
    config_doc = engines.load_config(config_path)
    task_names = [str(task.get("name")) for task in (config_doc.get("evaluation") or {}).get("tasks") or []]
    tensor_parallel = (config_doc.get("deployment") or {}).get("tensor_parallel_size")
    quoted = shlex.quote(str(config_path))
    return PlanReport(
        model=request.model,
        config_path=str(config_path),
        architecture=report.architecture.architecture,
        quantization=quant_text,
        context_length=report.context_length,
        tensor_parallel_size=int(tensor_parallel) if isinstance(tensor_parallel, int) else None,
        notes=list(dict.fromkeys([*warnings, *chain.notes])),
        tasks=task_names,
        skipped_tasks=skipped,
        missing_values=missing_values,
        validation_problems=problems,
        cluster_unknowns=cluster_unknowns,
        dry_run_ok=dry_ok,
        dry_run_detail=dry_detail,
        canary_command="quanteval call launch_canary --json " + shlex.quote(json.dumps({"config_path": str(config_path), "limit_samples": 10})),
        canary_nel_command=f"nel run --config {quoted} -o {LIMIT_SAMPLES_OVERRIDE}",
        full_run_command="quanteval call launch_full_run --json " + shlex.quote(json.dumps({"config_path": str(config_path)})),
        full_run_nel_command=f"nel run --config {quoted}",
        steps=chain.steps,
    )


# --- The chain's steps: each a tool call (or two), its outcome recorded on the _Chain ----------------------------


@dataclass
class _Chain:
    """The config being planned, and what the tools said about it so far."""

    config_path: Path
    progress: ProgressFn
    steps: list[PlanStep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def step(self, tool: str, summary: str) -> None:
        self.steps.append(PlanStep(tool=tool, summary=summary))

    def call(self, name: str, arguments: dict[str, Any]) -> BaseModel:
        """A tool call on the written config."""
        try:
            return _call(name, arguments)
        except ToolError as exc:  # the file exists now: say where, so the person can finish it by hand
            raise ToolError(f"{name}: {exc} The config written so far is {self.config_path}.") from None


def _checked_config_path(request: PlanRequest) -> Path:
    """The config file to write, refused before anything is written when it exists (without --force) or a task is misspelled."""
    config_path = Path(request.config).expanduser().resolve() if request.config else default_config_path(
        request.model, request.execution, request.deployment
    )
    if config_path.exists() and not request.force:
        raise ToolError(f"{config_path}: already exists. Pass --force to replace it, or --config to write another file.")
    for name in request.tasks:  # a misspelled task fails here, before any file is written
        tasks.resolve(name)
    return config_path


def _build_base_config(request: PlanRequest, chain: _Chain) -> None:
    chain.progress(1, TOTAL_STEPS, "building the base config")
    if chain.config_path.exists():  # --force: build_config never overwrites, so the old file goes first
        chain.config_path.unlink()
    built = _call(
        "build_config",
        {
            "execution": request.execution,
            "deployment": request.deployment,
            "model_type": request.model_type,
            "benchmarks": [DEFAULT_BUNDLE[request.model_type]],
            "config_path": str(chain.config_path),
        },
    )
    chain.step("build_config", f"wrote {built.config_path}")


def _add_tasks(request: PlanRequest, chain: _Chain) -> list[str]:
    """The requested tasks in place of the bundle's; returns the ones add_tasks skipped, with why."""
    if not request.tasks:
        return []
    chain.progress(2, TOTAL_STEPS, "adding tasks")
    added = chain.call("add_tasks", {"config_path": str(chain.config_path), "tasks": request.tasks, "replace": True})
    chain.step("add_tasks", f"added {', '.join(a.task for a in added.added)}")
    return [f"{item.requested} ({item.reason})" for item in added.skipped]


def _set_output_dir(output_dir: str, execution: str, config_path: Path) -> None:
    value = executors.for_name(execution).resolve_output_dir(output_dir)  # a cluster's is a path there, as written

    def set_output_dir(doc: Any) -> None:
        configfile.set_path(doc, "execution.output_dir", value)

    engines.edit_config(config_path, set_output_dir)


def _apply_checkpoint(request: PlanRequest, chain: _Chain, checkpoint_warnings: list[str]) -> list[str]:
    """Serve the checkpoint as the deployment needs; returns the checkpoint warnings still to show on their own."""
    if request.deployment == "none":
        chain.notes.append("deployment none: point target.api_endpoint.url and model_id at your running server (set_config_value).")
        return checkpoint_warnings
    # apply_checkpoint after add_tasks: it also sets per-task keys (the NeMo-Skills api_key_name).
    chain.progress(3, TOTAL_STEPS, "applying the checkpoint")
    applied = chain.call("apply_checkpoint", {"config_path": str(chain.config_path), "checkpoint": request.model})
    chain.notes += applied.notes
    chain.step("apply_checkpoint", f"{len(applied.changes)} change(s)")
    return []  # apply_checkpoint's notes hold the checkpoint's warnings, with this framework's own verdict


def _missing_values(chain: _Chain) -> list[str]:
    chain.progress(4, TOTAL_STEPS, "listing missing values")
    missing = chain.call("list_missing_values", {"config_path": str(chain.config_path)})
    missing_values = list(missing.missing_values) + [f"env {item.name}" for item in missing.unset_env_vars]
    chain.step("list_missing_values", f"{len(missing_values)} missing")
    return missing_values


def _validation_problems(chain: _Chain) -> list[str]:
    chain.progress(5, TOTAL_STEPS, "validating")
    validation = chain.call("validate_config", {"config_path": str(chain.config_path)})
    problems = [
        f"{p.severity} {p.key}: {p.message} Fix: {p.fix}" for p in validation.problems if p.rule not in LISTED_AS_MISSING
    ]
    chain.step("validate_config", f"{len(problems)} problem(s)")
    return problems


def _dry_run(chain: _Chain, missing_values: list[str]) -> tuple[bool, str]:
    """NEL's dry-run: whether it passed, and what it rendered or the first line of why not."""
    chain.progress(6, TOTAL_STEPS, "NEL dry-run")
    dry = chain.call("dry_run", {"config_path": str(chain.config_path)})
    first_error = (dry.error or "failed").strip().splitlines()[0] if not dry.ok else ""
    # NEL stops on the first missing value, which the list above already names: say so once, not twice.
    names = [item.removeprefix("env ") for item in missing_values]
    if first_error and any(name in first_error for name in names):
        first_error = "stopped on a value listed under 'still needs a value'"
    dry_detail = (
        f"{len(dry.scripts)} script(s) rendered" + (f" in {dry.invocation_dir}" if dry.invocation_dir else "")
        if dry.ok
        else first_error
    )
    chain.step("dry_run", "ok" if dry.ok else "failed")
    return dry.ok, dry_detail


# What a SLURM job needs that only the cluster can tell, and what NEL does when no one says (its packaged defaults).
CLUSTER_FACTS = ("execution.partition (none set: sbatch picks the cluster's default partition, whatever its GPUs)",
                 "GPUs per node, execution.gres (NEL's default gpu:8, whatever the model needs)",
                 "execution.walltime (NEL's default 01:00:00, whatever the partition allows)")


def _place_on_cluster(request: PlanRequest, chain: _Chain) -> list[str]:
    """With a login host, ask the cluster as the skill does (apply_cluster writes partition, gres, walltime, a lone
    account and the ssh config's user); without one, or when it does not answer, what stays unknown."""
    host = request.host or (request.set_values.get("execution.hostname") or "").strip("'\" ") or None
    if not host:
        return [f"{fact}: re-run with --host YOUR_LOGIN_ALIAS and the plan asks the cluster" for fact in CLUSTER_FACTS]
    if request.host:
        chain.call("set_config_value", {"config_path": str(chain.config_path), "key": "execution.hostname", "value": host})
    try:
        placed = _call("apply_cluster", {"config_path": str(chain.config_path), "host": host})
    except ToolError as exc:
        chain.step("apply_cluster", f"{host} did not answer")
        return [f"{fact}: {host} could not be asked ({exc}); check it with quanteval call ssh_check, then re-run"
                for fact in CLUSTER_FACTS]
    placement = placed.placement
    written = ", ".join(f"{key.removeprefix('execution.')} {value}" for key, value in placement.values.items())
    chain.step("apply_cluster", f"{host}: {written or 'nothing to change'}")
    chain.notes += placement.warnings + placement.notes
    if placement.partition is None:
        return [f"execution.partition: no partition of {host} fits this model ({'; '.join(placement.warnings) or 'see cluster_info'})"]
    return []


def _how_to_fill(item: str) -> str:
    """One missing item with the way to give it: `export` for an env var, `--set` for a config key."""
    from quanteval.envvars import KNOWN_ENV_VARS

    if item.startswith("env "):
        name = item.removeprefix("env ")
        note = KNOWN_ENV_VARS.get(name)
        return f"{name}: export {name}=...  (then re-run)" + (f" — {note}" if note else "")
    if item == "execution.hostname":
        return f"{item}: re-run with --host YOUR_LOGIN_ALIAS (the plan then asks the cluster for partition, GPUs, walltime)"
    return f"{item}: re-run with --set {item}=VALUE (or quanteval call set_config_value)"


def format_plan(plan: PlanReport) -> str:
    """The readable summary `quanteval plan` prints."""
    lines = [
        f"model:         {plan.model}",
        f"architecture:  {plan.architecture or 'unknown'}",
        f"quantization:  {plan.quantization}",
        f"context:       {plan.context_length or 'unknown'}",
        f"tensor para.:  {plan.tensor_parallel_size or 'unknown'}",
    ]
    lines += [f"note:          {note}" for note in plan.notes]
    lines += [
        "",
        f"config:        {plan.config_path}",
        f"tasks:         {', '.join(plan.tasks) or 'none'}",
    ]
    lines += [f"skipped:       {item}" for item in plan.skipped_tasks]
    if plan.missing_values:
        lines.append("still needs a value (only you can give these):")
        lines += [f"  - {_how_to_fill(name)}" for name in plan.missing_values]
    else:
        lines.append("missing values: none")
    if plan.validation_problems:
        lines.append("validation:")
        lines += [f"  - {problem}" for problem in plan.validation_problems]
    else:
        lines.append("validation:    no problems beyond the missing values" if plan.missing_values else "validation:    no problems")
    if plan.cluster_unknowns:
        lines.append("not checked against the cluster:")
        lines += [f"  - {item}" for item in plan.cluster_unknowns]
    lines.append(f"NEL dry-run:   {'ok' if plan.dry_run_ok else 'FAILED'}: {plan.dry_run_detail}")
    lines += [
        "",
        "ready for a canary"
        if plan.ready
        else "not ready yet: give what is listed above as still needed or not checked, then re-check with:\n"
        f"  quanteval call dry_run --json {shlex.quote(json.dumps({'config_path': plan.config_path}))}",
        "canary (10 samples per task):",
        f"  {plan.canary_command}",
        f"  or: {plan.canary_nel_command}",
        "full run (refused until a canary of this config passed):",
        f"  {plan.full_run_command}",
        f"  or: {plan.full_run_nel_command}",
    ]
    return "\n".join(lines)
