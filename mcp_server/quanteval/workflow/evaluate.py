"""evaluate_quantization: the whole question in one call — how much accuracy did the candidate lose?

It runs the workflow's own tools in the skill's order, for the baseline and then the candidate checkpoint:
plan_deployment (refuses what the framework cannot serve here) -> launch_deployment -> deployment_status (ready, what
is really served) -> build_config (nel-next, the served endpoint's values in its one write) -> validate_config -> dry_run ->
launch_canary -> wait_for_run -> validate_run -> launch_full_run (gated by that canary's verdict) -> wait_for_run ->
validate_run -> stop_deployment; then compare_results on the two full runs and gate_results on them, under the
user's rule (max_drop in points at a confidence: the `nel gate` policy for it is written next to the report) or a
given `nel gate` policy: the release verdict (GO / NO-GO / INCONCLUSIVE) with the reason per benchmark.

A candidate whose canary fails where the baseline's passed with the same settings is the answer, not a config fix:
ANOMALOUS (a broken quantization or a serving bug), with a few of its responses.

Resumable: every finished full run is a ledger record carrying its evaluation key (checkpoint contents, benchmarks,
limits), so a second call reuses what finished — the baseline of one candidate is the baseline of the next.
Interrupted (Ctrl-C, SIGTERM, a failure): the server it started is stopped (one still starting is recorded as
cancelled), the run in flight is killed and recorded as cancelled, and the next call starts that checkpoint again.
One call per output directory at a time: a second one is refused, naming the first (a kernel lock in the directory,
gone with the call however it ends).

Bound to the engine that evaluates a served model in one call (nel-next, its input's `engine`: the one engine that
evaluates on this machine without Docker), found by that capability (`engines.evaluating()`: what stops the
benchmarks, what the server says it serves, the config values for an endpoint, what a run recorded beside its scores)
and stopping a run through its record (`engines.for_record`); it imports no engine's own package.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from quanteval import configfile, engines, ledger, paths
from quanteval.clusters import slurm
from quanteval.clusters.executor import JobStatus
from quanteval.engines.base import ACTIVE
from quanteval.engines.recipes import recipe_for_benchmark
from quanteval.engines.runresults import ValidateRunInput, ValidateRunOutput
from quanteval.envvars import state_dir
from quanteval.localproc import available_memory_bytes, free_port, interrupts_held, require_writable_dir, tied_to_this_process
from quanteval.models import ProgressFn, StrictModel, ToolError, cancellation_point, no_progress, pause
from quanteval.serving import deploy, frameworks
from quanteval.serving.checkpoint import InspectCheckpointInput, inspect_checkpoint, unquantized_warning
from quanteval.serving.deployment import Serving
from quanteval.serving.frameworks import FRAMEWORK_INFO
from quanteval.workflow import (
    anomaly,
    background,
    compare,
    evaluate_cluster,
    nelconfig,
    release,
    results,
    runs,
    sampling,
    validation,
)
from quanteval.workflow.comparison_report import redraw_with_noise
from quanteval.workflow.gate import RULE_POLICY_NAME, GateResultsInput, GateResultsOutput, gate_results, load_policy
from quanteval.workflow.noise import NoiseFloor, noise_floor, verdict_within_noise
from quanteval.workflow.paired import DEFAULT_CONFIDENCE, Confidence, MaxDropPoints

Role = Literal["baseline", "candidate", "noise-floor"]  # noise-floor: the baseline again, on the other numeric path
Verdict = Literal["acceptable", "not acceptable", "inconclusive", "suspect", "anomalous"]
T = TypeVar("T")

VERDICT_OF_GATE = {"GO": "acceptable", "NO-GO": "not acceptable", "INCONCLUSIVE": "inconclusive"}
RESPONSES_SHOWN = 3
PROGRESS_EVERY_S = 5.0  # while a run goes on, one progress line per this many seconds
DEFAULT_MAX_TOKENS = 1024
STEPS_PER_CHECKPOINT = 8
STARTING = ("starting", "loading")  # a deployment's statuses before it is ready
LOCK_NAME = ".quanteval-evaluate.lock"  # in the output directory, held while a call uses it


class EvaluateQuantizationInput(StrictModel):
    baseline_checkpoint: str = Field(description="Reference checkpoint directory (e.g. BF16).")
    candidate_checkpoint: str = Field(description="Quantized checkpoint directory to judge.")
    benchmarks: list[str] = Field(min_length=1, description=(
        "BYOB .py files, skills://NAME or built-in names."))
    engine: Literal["nel-next"] = Field("nel-next", description=(
        "nel-next (NEL 0.2.6: the step-by-step tools)."))
    execution: Literal["local"] = Field("local", description="This machine.")
    host: str | None = Field(None, description="Omit: here; a SLURM alias: a job per run.")
    cluster: evaluate_cluster.ClusterSettings | None = Field(None, description=(
        "With host: partition, account, walltime, gpus_per_node, paths."))
    framework: Literal["vllm"] = Field("vllm", description="Serves both.")
    eager: bool = Field(False, description="Serve both with --enforce-eager (not the default path).")
    noise_floor: bool = Field(False, description="Also serve the baseline on its other numeric path: serving noise.")
    output_dir: str | None = Field(None, description="Configs, runs, report; default: the state dir.")
    canary_problems: int = Field(10, ge=1, le=10000, description="Problems per benchmark in each canary.")
    max_problems: int | None = Field(None, ge=1, description="Problems per benchmark in the full runs; default all.")
    max_tokens: int | None = Field(None, ge=1, description="Generation budget; default min(1024, half the served context).")
    repeats: sampling.Repeats = None
    temperature: sampling.Temperature = None
    top_p: sampling.TopP = None
    max_length_change: release.MaxLengthChange = None
    max_drop: MaxDropPoints = None
    confidence: Confidence = DEFAULT_CONFIDENCE
    reference_scores: compare.ReferenceScores
    reference_tolerance: compare.ReferenceTolerance = anomaly.REFERENCE_TOLERANCE_POINTS
    policy: str | None = Field(None, description=(
        "Instead of max_drop: a `nel gate --policy` YAML, checked before serving."))
    startup_timeout_s: float = Field(900, gt=0, description="Seconds a server may take to start.")
    run_timeout_s: float = Field(3600, gt=0, description="Seconds one canary or full run may take.")


class CheckpointEvaluation(BaseModel):
    role: Role
    checkpoint: str
    reused: bool = Field(description="True when a finished full run of the same checkpoint and settings was reused from the ledger.")
    deployment_record_id: str | None = None
    served_model_name: str | None = None
    served_context: int | None = Field(None, description="max_model_len the server reported.")
    config_path: str | None = None
    canary_record_id: str | None = None
    full_run_record_id: str | None = Field(None, description="None when the candidate's canary failed (verdict anomalous).")
    run_dir: str | None = None
    serving: Serving | None = Field(None, description="How its server computed: framework, release, numeric path, flags.")
    seconds: dict[str, float] = Field(default_factory=dict, description="Wall time per stage: serve, config, canary, full_run.")
    cluster: evaluate_cluster.ClusterPlacement | None = None


class Response(BaseModel):
    problem_idx: int | None
    expected: str | None
    response: str | None = Field(description="The model's answer, at most 300 characters.")


class EvaluateQuantizationOutput(BaseModel):
    verdict: Verdict = Field(description="By the gate under max_drop (or policy); without either, compare_results' "
                             "acceptability. suspect: check the serving (or the baseline is off its published score; "
                             "never acceptable); anomalous: the candidate failed the canary "
                             "its baseline passed (broken quantization or serving bug).")
    comparability: str
    table_markdown: str
    comparisons: list[compare.TaskComparison]
    reasons: list[str]
    baseline: CheckpointEvaluation
    candidate: CheckpointEvaluation
    report_html: str | None
    report_markdown: str | None
    chart_png: str | None
    gate: GateResultsOutput | None = Field(None, description="gate_results on the two full runs under the rule or policy.")
    policy_path: str | None = Field(None, description=f"The `nel gate` policy ({RULE_POLICY_NAME}) that states max_drop, "
                                    "written next to the report: `nel gate --policy` on it agrees (at 95%).")
    responses: list[Response] = Field(default_factory=list, description="anomalous: a few of the candidate canary's answers.")
    noise_floor: list[NoiseFloor] = Field(default_factory=list, description="With noise_floor: per benchmark, the baseline's "
                                          "flips between its two serving paths next to the quantization's.")
    noise_floor_run: CheckpointEvaluation | None = Field(None, description="The baseline's run on the other numeric path.")
    outputs: list[release.OutputCheck] = Field(default_factory=list, description=(
        "Per benchmark and side: completion tokens, truncated and failed responses with denominators, tokens/s."))
    weights: release.WeightsBought | None = Field(None, description="Weight bytes on disk per side; SIZE_NOT_REDUCED named.")
    served_memory: release.ServedMemoryBought | None = Field(None, description=(
        "KV cache capacity and memory each side's vLLM log reports; unverified where not printed."))
    seconds: dict[str, float] = Field(description="Wall time per stage across both checkpoints, and in total.")


def evaluation_key(checkpoint_dir: Path, request: EvaluateQuantizationInput) -> str:
    """Same checkpoint contents and settings -> same key (paths and mtimes of its files, not the candidate)."""
    files = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in checkpoint_dir.iterdir() if p.is_file())
    settings = {"benchmarks": [_benchmark_fingerprint(b) for b in request.benchmarks], "engine": request.engine,
                "framework": request.framework, "max_problems": request.max_problems, "max_tokens": request.max_tokens,
                # a run served another way (numeric path, release) is not this evaluation's
                "eager": request.eager, "framework_version": _framework_release(request)}
    asked = sampling.sampling_values(request.temperature, request.top_p)
    if (request.repeats or 1) > 1 or asked:  # only when asked: a one-pass run finished before these settings is still reused
        settings |= {"repeats": request.repeats, "sampling": asked}
    blob = json.dumps([str(checkpoint_dir.resolve()), files, settings], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _framework_release(request: EvaluateQuantizationInput) -> str | None:
    """The vLLM that serves: this machine's venv, or the cluster's (host and venv: its release is asked there)."""
    if not on_cluster(request):
        return frameworks.vllm_venv_version()
    return f"{request.host}:{(request.cluster or evaluate_cluster.ClusterSettings()).vllm_venv or 'vllm on the PATH'}"


def on_cluster(request: EvaluateQuantizationInput) -> bool:
    return request.host not in (None, "local")


def _dir_of(record: ledger.Record) -> str | None:
    """Where this process reads a run's files: its own directory here, the fetched copy of a cluster's run."""
    return record.details.get("run_dir") or record.details.get("results_dir")


def _benchmark_ref(name: str) -> str:
    return str(Path(name).expanduser().resolve()) if name.endswith(".py") else name


def _benchmark_fingerprint(name: str) -> str | list[Any]:
    """A BYOB file by path plus the size and mtime of it and its data files (same stem), so an edit re-runs."""
    if not name.endswith(".py"):
        return name
    path = Path(_benchmark_ref(name))
    siblings = sorted(path.parent.glob(f"{path.stem}.*")) if path.parent.is_dir() else []
    return [str(path), [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in siblings if p.is_file()]]


def _finished_run(key: str) -> ledger.Record | None:
    """The newest finished full run of the same evaluation, to reuse; under --root only one whose files lie inside."""
    from quanteval.workflow import confine

    for record in ledger.find(kind="full_run", status="succeeded", limit=200):
        if record.details.get("evaluation_key") == key and Path(_dir_of(record) or "").is_dir() \
                and confine.visible(record):
            return record
    return None


def _wait(record_id: str, timeout_s: float, what: str, progress: ProgressFn, step: float, total: float) -> ledger.Record:
    deadline = time.monotonic() + timeout_s
    reported: tuple[str, float] = ("", 0.0)
    while True:
        cancellation_point()
        status = runs.run_status(runs.RunRef(record_id=record_id))
        if status.status not in ACTIVE:
            return ledger.get(record_id)
        if time.monotonic() > deadline:
            runs.kill_run(runs.RunRef(record_id=record_id))
            raise ToolError(f"{what} {record_id} did not finish within {timeout_s:.0f} s; it was killed. Raise run_timeout_s.")
        if status.status != reported[0] or time.monotonic() - reported[1] >= PROGRESS_EVERY_S:
            progress(step, total, f"{what} {record_id}: {status.status}")
            reported = (status.status, time.monotonic())
        time.sleep(0.25)  # local runs: a status read is a file read and a /proc scan


def _every(seconds: float, progress: ProgressFn, step: float, total: float, prefix: str) -> ProgressFn:
    """A reporter for a sub-step that reports often: forwards one message per `seconds` (or when it changes) at `step`.

    Every report (forwarded or not) is where an MCP call learns it was cancelled; a forwarded one resets a client's timeout.
    """
    last: list[Any] = ["", 0.0]

    def report(_done: float, _total: float | None = None, message: str | None = None) -> None:
        cancellation_point()
        if message != last[0] or time.monotonic() - last[1] >= seconds:
            progress(step, total, f"{prefix}: {message}")
            last[:] = [message, time.monotonic()]

    return report


def _require_pass(record: ledger.Record, what: str, max_error_share: float = ValidateRunInput.model_fields["max_error_share"].default) -> ValidateRunOutput:
    if record.status != "succeeded" and _dir_of(record):
        engine = engines.evaluating()
        failed = engine.evaluation.failed_benchmarks(Path(_dir_of(record) or ""))  # what the engine itself recorded
        if failed:
            named = "; ".join(f"{Path(name).stem}: {error}" for name, error in list(failed.items())[:3])
            raise ToolError(f"{what} {record.id} {record.status}: {engine.name} reports {named}. Logs: {record.details.get('log_path')}")
    if record.status != "succeeded":
        logs = runs.run_logs(runs.RunLogsInput(record_id=record.id, lines=20))
        diagnosis = logs.diagnosis
        why = (f"{diagnosis.failure_class}: {diagnosis.line or ' / '.join(diagnosis.last_lines[-3:])} ({diagnosis.advice})"
               if diagnosis else record.details.get("error") or record.status)
        logs_at = record.details.get("log_path")  # a cluster run's are named in `what`
        raise ToolError(f"{what} {record.id} {record.status}: {why}." + (f" Logs: {logs_at}" if logs_at else ""))
    report = results.validate_run(ValidateRunInput(run=record.id, max_error_share=max_error_share))
    # a full run's setup was vouched for by its canary: a score at 0 or at chance there is the comparison's to judge
    if report.verdict != "pass" and not (report.verdict == "suspect" and record.kind == "full_run"):
        said = f"{what} {record.id} did not pass validate_run ({report.verdict}): {'; '.join(report.reasons[:3])}"
        if any(finding.check == "http_errors" and finding.severity == "fail" for task in report.tasks for finding in task.findings):
            raise RequestsUnanswered(said)
        raise ToolError(said)
    return report


class RequestsUnanswered(ToolError):
    """A run whose requests got no answer (the endpoint down or unreachable): the serving's failure, never a verdict
    on the checkpoint, whichever side it is."""


class CanaryFailed(ToolError):
    """A canary that ran and failed validate_run: for the candidate, the answer when the baseline's passed."""

    def __init__(self, message: str, record: ledger.Record, config_path: str):
        super().__init__(message)
        self.record, self.config_path = record, config_path
        self.launched: deploy.LaunchDeploymentResult | None = None  # the server it ran against, named in the answer
        self.served: dict = {}
        self.placement: evaluate_cluster.ClusterPlacement | None = None  # on a cluster: its job and node


def _require_canary_pass(record: ledger.Record, what: str, config_path: str) -> ValidateRunOutput:
    try:
        return _require_pass(record, what)
    except RequestsUnanswered:
        raise
    except ToolError as exc:
        if record.status in ("succeeded", "failed"):  # it ran to its end: not killed, timed out or cancelled
            raise CanaryFailed(str(exc), record, config_path) from None
        raise


def _plan(checkpoint_dir: Path, request: EvaluateQuantizationInput, check_args: bool = True) -> deploy.DeploymentPlan:
    # A port of its own: a fixed default (8000) collides with any other server started on this machine meanwhile (the
    # only machine it serves on: its input takes no other host).
    port = free_port()
    eager = [FRAMEWORK_INFO[request.framework].eager_flag] if request.eager else []
    plan = deploy.plan_deployment(deploy.PlanDeploymentInput(checkpoint=str(checkpoint_dir), framework=request.framework,
                                                             host=request.host, port=port, check_args=check_args,
                                                             extra_args=[flag for flag in eager if flag]))
    errors = [w.message for w in plan.warnings if w.level == "error"]
    if errors:
        raise ToolError(f"{checkpoint_dir}: {request.framework} cannot serve it here: {errors[0]}")
    return plan


def cluster_tensor_parallel_size(request: EvaluateQuantizationInput) -> int:
    """The GPUs a side's job needs: the larger tensor-parallel size of the two sides' plans (the fewest GPUs that hold
    each checkpoint's weights)."""
    return max(_plan(Path(path).expanduser(), request, check_args=False).tensor_parallel_size
               for path in (request.baseline_checkpoint, request.candidate_checkpoint))


def _launch(plan: deploy.DeploymentPlan, request: EvaluateQuantizationInput) -> deploy.LaunchDeploymentResult:
    """The evaluation's own server: it stops when this process ends, even SIGKILLed (it has no use without it)."""
    with tied_to_this_process():
        return deploy.launch_deployment(deploy.LaunchDeploymentInput(plan=plan, host=request.host,
                                                                     startup_timeout_s=request.startup_timeout_s))


def _ready(checkpoint_dir: Path, launched: deploy.LaunchDeploymentResult, request: EvaluateQuantizationInput,
           loading: ProgressFn) -> dict:
    """Waits for the server; one that does not become ready is stopped. What it says it serves (/v1/models)."""
    status = deploy.deployment_status(deploy.DeploymentStatusInput(
        record_id=launched.record_id, wait_s=request.startup_timeout_s, chat_probe=False), progress=loading)
    if status.status != "ready":
        deploy.stop_deployment(deploy.StopDeploymentInput(record_id=launched.record_id))
        raise ToolError(f"{checkpoint_dir}: the {request.framework} server did not become ready ({status.status}): "
                        f"{status.message} Log: {status.log_path}")
    return engines.evaluating().evaluation.served_facts(launched.endpoint_url or "") or {}


def _room_beside(launched: deploy.LaunchDeploymentResult) -> bool:
    """Whether a second server of the same size fits beside this one now (twice its memory, as it grows while
    loading, and a GiB to spare): else the candidate's server starts only when the baseline's is stopped."""
    held = deploy.deployment_memory_bytes(launched.record_id)
    return held is not None and available_memory_bytes() >= 2 * held + 2**30


def _write_config(workdir: Path, launched: deploy.LaunchDeploymentResult, served: dict, request: EvaluateQuantizationInput,
                  launched_checkpoint: str, job: _InJob | None = None) -> str:
    """The side's nel-next config: against the endpoint `launched` serves, or (job) serving it inside each run's own
    cluster job."""
    config_path = workdir / "config.yaml"
    if config_path.exists():
        config_path.unlink()  # our own file from an earlier, unfinished call: its endpoint is gone
    context = served.get("max_model_len")
    budget = request.max_tokens or (min(DEFAULT_MAX_TOKENS, context // 2) if isinstance(context, int) else DEFAULT_MAX_TOKENS)
    # A base model (no chat template) is asked through the completions endpoint: the chat endpoint refuses it.
    has_template = inspect_checkpoint(InspectCheckpointInput(checkpoint=launched_checkpoint)).chat_template
    protocol = "chat_completions" if has_template else "completions"
    values = engines.evaluating().evaluation.endpoint_values(
        launched.endpoint_url or "", protocol, launched.served_model_name, budget, job.output_dir if job else str(workdir / "runs"),
        len(request.benchmarks), request.max_problems, request.repeats or 1,
        sampling.sampling_values(request.temperature, request.top_p))
    if job:
        values = engines.evaluating().evaluation.serve_in_job(
            values, job.model_path, launched.served_model_name, launched.port, job.command, request.startup_timeout_s,
            job.placement)
    built = nelconfig.build_config(nelconfig.BuildConfigInput(  # written once, its values in it
        engine=engines.evaluating().name, execution="slurm" if job else request.execution,
        deployment=request.framework if job else "none", model_type="chat_reasoning",
        benchmarks=[_benchmark_ref(b) for b in request.benchmarks], config_path=str(config_path)), values)
    checked = validation.validate_config(validation.ValidateConfigInput(config_path=built.config_path))
    if not checked.valid:
        first = next(p for p in checked.problems if p.severity == "error")
        raise ToolError(f"{built.config_path}: {first.key}: {first.message} {first.fix}")
    dry = runs.dry_run(runs.DryRunInput(config_path=built.config_path))
    if not dry.ok:
        raise ToolError(f"{built.config_path}: dry-run failed: {dry.error}")
    return built.config_path


class _Checkpoint:
    """One side of the comparison while it is evaluated: its directory, key, and the server started for it."""

    def __init__(self, role: Role, checkpoint: str, request: EvaluateQuantizationInput, root: Path) -> None:
        self.role = role
        self.dir = Path(checkpoint).expanduser().resolve()
        if not self.dir.is_dir():
            raise ToolError(f"{role}_checkpoint: {checkpoint} is not a directory.")
        self.key = evaluation_key(self.dir, request)
        self.done = _finished_run(self.key)
        self.workdir = root / f"{role}-{self.dir.name[:60]}-{self.key[:8]}"  # a person finds it by name; the key keeps it unique
        self.request = request  # its own: the noise floor's is the baseline's on the other numeric path
        self.launched: deploy.LaunchDeploymentResult | None = None
        self.launched_at = 0.0
        self.seconds: dict[str, float] = {}
        self.evaluation: CheckpointEvaluation | None = None  # the noise floor's, when evaluated beside the others
        self.failure: ToolError | None = None  # the noise floor's, when it could not be measured

    def launch(self, plan: deploy.DeploymentPlan, request: EvaluateQuantizationInput) -> None:
        self.launched_at = time.monotonic()
        self.launched = _launch(plan, request)

    def stop(self, interrupted: bool = False) -> None:
        """Stop its server; one still starting when the call was interrupted (Ctrl-C, SIGTERM) is recorded cancelled."""
        if self.launched is None:
            return
        record_id = self.launched.record_id
        starting = interrupted and ledger.get(record_id).status in STARTING
        with interrupts_held():  # a second Ctrl-C must not leave the server running
            deploy.stop_deployment(deploy.StopDeploymentInput(record_id=record_id, grace_s=10 if starting else 20))
            if starting:
                ledger.update(record_id, status="cancelled",
                              message="cancelled: evaluate_quantization was interrupted while the server started")
        self.launched = None

    def reused(self) -> CheckpointEvaluation:
        done = self.done
        assert done is not None
        return CheckpointEvaluation(role=self.role, checkpoint=str(self.dir), reused=True, full_run_record_id=done.id,
                                    run_dir=_dir_of(done), config_path=done.config_path,
                                    served_model_name=done.details.get("served", {}).get("id"),
                                    served_context=done.details.get("served", {}).get("max_model_len"),
                                    serving=_serving(_run_facts(done)))


def _evaluate_sides(request: EvaluateQuantizationInput, root: Path, progress: ProgressFn, floor: _Checkpoint | None = None,
                    ) -> tuple[CheckpointEvaluation, CheckpointEvaluation | CanaryFailed]:
    """Baseline then candidate (or the candidate's failed canary, when the baseline's passed), then the noise floor's
    side when given (its evaluation or failure kept on it), overlapped where it costs nothing: vLLM's own check of
    every plan (seconds of imports) runs beside the baseline's server start, whose plan is launched unchecked and whose
    check must pass before any run; and each next server loads while the side before runs, when memory allows (at
    most two servers: the one whose runs go on and the next one loading)."""
    if on_cluster(request):  # the noise floor's side goes in beside the others
        baseline, candidate = _evaluate_on_cluster(request, progress, [
            _Checkpoint("baseline", request.baseline_checkpoint, request, root),
            _Checkpoint("candidate", request.candidate_checkpoint, request, root)], floor)
        assert isinstance(baseline, CheckpointEvaluation)
        return baseline, candidate
    sides = [_Checkpoint("baseline", request.baseline_checkpoint, request, root),
             _Checkpoint("candidate", request.candidate_checkpoint, request, root), *([floor] if floor else [])]
    started = time.monotonic()
    try:
        checked = {side.role: _in_background(_plan, side.dir, side.request) for side in sides if side.done is None}
        answers = []
        for index, side in enumerate(sides):
            if side is floor:
                try:
                    side.evaluation = _serve_and_run(sides, index, checked, progress, started)
                except ToolError as exc:  # said in the answer; the comparison stands without it
                    side.failure = exc
                    side.stop()
                continue
            try:
                answers.append(_serve_and_run(sides, index, checked, progress, started))
            except CanaryFailed as failed:
                if index == 0:
                    raise  # the baseline's own canary: an error to fix, not a verdict
                return answers[0], failed
        return answers[0], answers[1]
    except BaseException as exc:
        for side in sides:  # the server of a side that failed or was interrupted, and one started early
            side.stop(interrupted=not isinstance(exc, Exception))
        raise
    finally:
        for side in sides:
            side.stop()


def _serve_and_run(sides: list[_Checkpoint], index: int, checked: dict[str, Future[deploy.DeploymentPlan]],
                   progress: ProgressFn, started: float) -> CheckpointEvaluation:
    """The side's server (launched now unless it loads already) until ready, the next side's launched beside it when
    memory allows, then its runs (its finished run reused instead when there is one)."""
    side, request = sides[index], sides[index].request
    offset, total = index * STEPS_PER_CHECKPOINT, _total(request)
    if side.done is not None:
        progress(offset + STEPS_PER_CHECKPOINT, total, f"{side.role}: reusing full run {side.done.id}")
        return side.reused()
    mark = time.monotonic() if index else started
    if side.launched is None:
        progress(offset, total, f"{side.role}: starting {request.framework} on {side.dir.name}")
        first = not any(other.launched_at for other in sides)  # its check is not done yet: not waited for
        side.launch(_plan(side.dir, request, check_args=False) if first else checked[side.role].result(), request)
    assert side.launched is not None
    try:
        served = _ready(side.dir, side.launched, request, _every(PROGRESS_EVERY_S, progress, offset, total, side.role))
    except ToolError:
        checked[side.role].result()  # vLLM's own refusal of the checkpoint explains it better than its log
        raise
    checked[side.role].result()  # refused by vLLM's own check: no run on a server that should not serve
    side.seconds["serve"] = time.monotonic() - mark
    if index and side.launched_at < mark:
        side.seconds[f"serve_beside_{sides[index - 1].role}"] = mark - side.launched_at
    following = sides[index + 1] if index + 1 < len(sides) else None
    if following is not None and following.done is None and _room_beside(side.launched):
        progress(offset + 1, total, f"{following.role}: starting {request.framework} on {following.dir.name} "
                 f"while the {side.role} runs")
        following.launch(checked[following.role].result(), following.request)
    return _run_both_runs(side, served, request, progress, offset)


def _in_background(function: Callable[..., T], *args: Any) -> Future[T]:
    """function(*args) in a daemon thread: an interrupted call stops its servers and ends at once instead of waiting
    for it (vLLM's plan check may take minutes on a loaded machine; it starts nothing that outlives it)."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(function(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever asks for the result
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True, name="quanteval-background").start()
    return future


def _total(request: EvaluateQuantizationInput) -> int:
    """Progress steps of the whole call: each side's, the comparison, and the noise floor's side when asked."""
    return (3 if request.noise_floor else 2) * STEPS_PER_CHECKPOINT + 1


def _run_both_runs(side: _Checkpoint, served: dict, request: EvaluateQuantizationInput, progress: ProgressFn,
                   offset: int) -> CheckpointEvaluation:
    """Config, canary and full run against the side's ready server, which is stopped at the end."""
    role, launched, seconds, total = side.role, side.launched, side.seconds, _total(request)
    assert launched is not None
    side.workdir.mkdir(parents=True, exist_ok=True)
    active: str | None = None
    try:
        progress(offset + 1, total, f"{role}: serving {launched.served_model_name} (context {served.get('max_model_len')})")
        mark = time.monotonic()
        config_path = _write_config(side.workdir, launched, served, request, str(side.dir))
        seconds["config"] = time.monotonic() - mark
        progress(offset + 2, total, f"{role}: config validated, launching the canary")
        mark = time.monotonic()
        with tied_to_this_process():  # the evaluation's own runs, as its servers: they end with it, SIGKILL included
            canary = runs.launch_canary(runs.LaunchCanaryInput(config_path=config_path, limit_samples=request.canary_problems))
        active = canary.record_id
        finished = _wait(canary.record_id, request.run_timeout_s, f"{role} canary", progress, offset + 3, total)
        try:
            passed = _require_canary_pass(finished, f"{role} canary", config_path)
        except CanaryFailed as failed:
            failed.launched, failed.served = launched, served
            raise
        seconds["canary"] = time.monotonic() - mark
        progress(offset + 4, total, f"{role}: canary passed, launching the full run")
        mark = time.monotonic()
        with tied_to_this_process():
            full = runs.launch_full_run(runs.LaunchFullRunInput(config_path=config_path), validated={canary.record_id: passed})
        active = full.record_id
        ledger.update(full.record_id, details={"evaluation_key": side.key, "checkpoint": str(side.dir), "served": served})
        finished = _wait(full.record_id, request.run_timeout_s, f"{role} full run", progress, offset + 5, total)
        active = None
        # requests that got no answer are the verdict's to count (workflow/samples.py: left out of the pairing, no
        # verdict above their share), not a reason to answer nothing
        _require_pass(finished, f"{role} full run", max_error_share=1.0)
        seconds["full_run"] = time.monotonic() - mark
        facts = _add_run_facts(finished, {"checkpoint": str(side.dir), "served": served})
    except BaseException:
        if active is not None:
            with interrupts_held():
                _cancel(active)
        raise
    finally:
        progress(offset + 6, total, f"{role}: stopping the server")
        side.stop()
    return CheckpointEvaluation(role=role, checkpoint=str(side.dir), reused=False, deployment_record_id=launched.record_id,
                                served_model_name=launched.served_model_name, served_context=served.get("max_model_len"),
                                config_path=config_path, canary_record_id=canary.record_id, full_run_record_id=full.record_id,
                                run_dir=finished.details["run_dir"], serving=_serving(facts),
                                seconds={k: round(v, 1) for k, v in seconds.items()})


def _run_facts(record: ledger.Record) -> dict[str, Any]:
    """What quanteval recorded beside the record's run (its checkpoint, what was served and how): its engine keeps it."""
    return engines.evaluating().evaluation.read_run_facts(Path(_dir_of(record) or "")) or {}


def _add_run_facts(record: ledger.Record, facts: dict[str, Any]) -> dict[str, Any]:
    """The run's facts with these added (compare_results and validate_run read them); returns them all."""
    merged = {**_run_facts(record), **facts}
    engines.evaluating().evaluation.write_run_facts(Path(_dir_of(record) or ""), merged)
    if "run_facts" in record.details:  # a cluster run's facts live in its record (its fetched copy is rewritten from it)
        ledger.update(record.id, details={"run_facts": merged})
    return merged


def _serving(run_facts: dict[str, Any]) -> Serving | None:
    """How a full run's server computed, as recorded with the run (None for a run served outside quanteval)."""
    recorded = run_facts.get("serving")
    return Serving.model_validate(recorded) if recorded else None


def _cancel(record_id: str) -> None:
    """An interrupted run: stopped and recorded as cancelled, so a later call does not take it for finished."""
    record = ledger.get(record_id)
    if record.status not in ACTIVE:
        return  # it finished (succeeded or failed) before the interruption: its own status stands
    with contextlib.suppress(ToolError):  # kill_run's own path; one that did not stop is left to its owner's watchdog
        engines.for_record(record).run.kill(record, no_progress)
    ledger.update(record_id, status="cancelled", message="cancelled: evaluate_quantization was interrupted")


def check_request(request: EvaluateQuantizationInput) -> Path:
    """What would fail or measure nothing is refused now, not after minutes of serving; the output root, writable."""
    if Path(request.baseline_checkpoint).expanduser().resolve() == Path(request.candidate_checkpoint).expanduser().resolve():
        raise ToolError("baseline_checkpoint and candidate_checkpoint are the same directory: nothing to compare.")
    for name in request.benchmarks:
        if name.endswith(".py") and not Path(name).expanduser().is_file():
            raise ToolError(f"benchmarks: {name}: no such BYOB file.")
    if request.policy and request.max_drop is not None:
        raise ToolError("max_drop and policy both given: give max_drop (points, with confidence) for one rule on every "
                        "benchmark, or a `nel gate` policy for tiers per benchmark, not both.")
    if request.policy:
        load_policy(Path(request.policy).expanduser())
    evaluation = engines.evaluating().evaluation
    run = evaluation.benchmark_names(request.benchmarks) if request.reference_scores else None
    if run is not None and (unrun := sorted(set(request.reference_scores) - set(run))):
        raise ToolError(f"reference_scores: {', '.join(unrun)} {'names' if len(unrun) == 1 else 'name'} no benchmark this "
                        f"evaluation runs (it runs: {', '.join(run)}). Key each reference score (points 0-100) by one of "
                        "them, or drop it.")
    found = evaluation.evaluation_problems(request.benchmarks)
    if refused := [p for p in found if p.severity == "error"]:
        raise ToolError(" ".join(f"{p.key}: {p.message} {p.fix}" for p in refused))
    root = Path(request.output_dir).expanduser() if request.output_dir else state_dir() / "evaluations"
    require_writable_dir(root, "output_dir", "Choose a writable directory.")
    if on_cluster(request):  # all the cluster must have, asked before any job is submitted
        settings = request.cluster or evaluate_cluster.ClusterSettings()
        evaluate_cluster.preflight(request.host or "", settings, evaluate_cluster.cluster_checkpoints(
            settings, request.baseline_checkpoint, request.candidate_checkpoint), request.startup_timeout_s,
            cluster_tensor_parallel_size(request))
    elif request.cluster is not None:
        raise ToolError("cluster: given without host. Give host, the cluster's login alias in ~/.ssh/config, or leave "
                        "cluster out to evaluate on this machine.")
    return root


def evaluate_quantization(request: EvaluateQuantizationInput, progress: ProgressFn = no_progress) -> EvaluateQuantizationOutput:
    """Use to answer "how much accuracy did this quantized checkpoint lose?" in one call, here or on SLURM (host):
    serves both, canary, full runs, paired comparison, gate; ANOMALOUS if only the candidate fails its canary.
    Resumable. 60 s client timeout: start_evaluation.
    """
    request, chosen = resolve_protocol(request)
    root = check_request(request)
    notes = [*chosen, *_sampling_notes(request)]
    for note in notes:  # before minutes of serving: what these settings can decide
        progress(0, _total(request), note)
    with _only_call_on(root):
        return _evaluate_and_compare(request, root, progress, notes)


def resolve_protocol(request: EvaluateQuantizationInput) -> tuple[EvaluateQuantizationInput, list[str]]:
    """The request with the sampling both sides run filled in (sampling.protocol: the user's values, else the
    benchmark recipes', else greedy at 1 repeat), and the notes saying where each value came from."""
    recipes = {name: None if name.endswith(".py") else recipe_for_benchmark(name) for name in request.benchmarks}
    repeats, temperature, top_p, notes = sampling.protocol(recipes, request.repeats, request.temperature, request.top_p)
    return request.model_copy(update={"repeats": repeats, "temperature": temperature, "top_p": top_p}), notes


def _sampling_notes(request: EvaluateQuantizationInput) -> list[str]:
    """What the sampling can decide, from each benchmark's size: max_problems, else what the engine counts (only
    when there is a margin to decide at all)."""
    sizes = {} if request.max_problems or request.max_drop is None else \
        engines.evaluating().evaluation.benchmark_sizes(request.benchmarks)
    named = {Path(name).stem if name.endswith(".py") else name: request.max_problems or sizes.get(name)
             for name in request.benchmarks}
    return sampling.notes_before(named, request.repeats or 1, request.temperature, request.max_drop, request.confidence)


@contextlib.contextmanager
def _only_call_on(root: Path) -> Iterator[None]:
    """One evaluate_quantization per output directory at a time; a second is refused, naming the first. The lock is
    the kernel's (flock), so it ends with the call or its process, however that ends: a lock file left behind by a
    killed call is never in the way."""
    path = root / LOCK_NAME
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = path.read_text(errors="replace").strip()[:200] or "another process"
            raise ToolError(f"output_dir: {root} is in use by another evaluate_quantization ({holder}). Wait for it to "
                            "finish (a second call then reuses its finished runs), or give this one another output_dir.") from None
        os.ftruncate(descriptor, 0)
        os.write(descriptor, f"pid {os.getpid()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}".encode())
        yield
    finally:
        os.close(descriptor)  # releases the lock


def _evaluate_and_compare(request: EvaluateQuantizationInput, root: Path, progress: ProgressFn,
                          notes: list[str] | None = None) -> EvaluateQuantizationOutput:
    started = time.monotonic()
    floor_side = _floor_side(request, root)
    baseline, candidate = _evaluate_sides(request, root, progress, floor_side)
    if isinstance(candidate, CanaryFailed):
        return _anomalous(baseline, candidate, request, started)
    progress(_total(request) - 1, _total(request), "comparing")
    mark = time.monotonic()
    report_dir = root / f"compare-{Path(baseline.config_path or '').parent.name}-vs-{Path(candidate.config_path or '').parent.name}"
    both = {"baseline": baseline.full_run_record_id or "", "candidate": candidate.full_run_record_id or ""}
    pair = results.read_pair(both["baseline"], both["candidate"])  # each run's bundles read once, for compare and gate
    compared = compare.compare_results(compare.CompareResultsInput(
        **both, max_drop=request.max_drop, confidence=request.confidence, output_dir=str(report_dir),
        baseline_checkpoint=baseline.checkpoint, candidate_checkpoint=candidate.checkpoint, reference_scores=request.reference_scores,
        reference_tolerance=request.reference_tolerance, max_length_change=request.max_length_change), runs=pair)
    # the rule in points is written as nel gate's policy by gate_results itself, next to the report
    gated = gate_results(GateResultsInput(**both, policy=request.policy, max_drop=request.max_drop, output_dir=str(report_dir),
                                          max_length_change=request.max_length_change), request.confidence, pair) \
        if request.policy or request.max_drop is not None else None
    policy_path = gated.policy if gated else None
    seconds = {stage: round(baseline.seconds.get(stage, 0) + candidate.seconds.get(stage, 0), 1)
               for stage in ("serve", "config", "canary", "full_run")}
    seconds["compare"] = round(time.monotonic() - mark, 1)
    verdict = _verdict(compared, gated)
    memory = release.served_memory_bought(_server_log(baseline), _server_log(candidate))
    reasons = [*compared.reasons, serving_note(baseline.serving, candidate.serving), memory.message,
               *(_sampling_notes(request) if notes is None else notes)]
    reasons += checkpoint_notes(baseline.checkpoint, candidate.checkpoint)
    reasons += [line for side in (baseline, candidate) if (line := _where_it_ran(side))]
    floor, floor_run = [], None
    if request.noise_floor:
        mark = time.monotonic()
        floor, floor_run, said = _noise_floor(request, floor_side, report_dir, baseline, compared, progress)
        redraw_with_noise(compared, None if request.max_drop is None else request.max_drop / 100, floor)
        failing = {row.task for row in compared.comparisons if row.verdict == "not acceptable"}
        failing |= {row.benchmark for row in gated.benchmarks if row.status == "BREACH"} if gated else set()
        verdict, changed = verdict_within_noise(verdict, floor, failing)
        reasons = [*([changed] if changed else []), *reasons, *said]
        beside = floor_side.evaluation.seconds if floor_side and floor_side.evaluation else {}  # spent in _evaluate_sides
        seconds["noise_floor"] = round(time.monotonic() - mark + sum(beside.values()), 1)
    seconds["total"] = round(time.monotonic() - started, 1)
    return EvaluateQuantizationOutput(
        verdict=verdict, comparability=compared.comparability, table_markdown=compared.table_markdown,
        comparisons=compared.comparisons, reasons=reasons, baseline=baseline, candidate=candidate,
        report_html=compared.report_html, report_markdown=compared.report_markdown, chart_png=compared.chart_png, gate=gated,
        policy_path=str(policy_path) if request.max_drop is not None else None, noise_floor=floor,
        noise_floor_run=floor_run, seconds=seconds, outputs=compared.outputs, weights=compared.weights, served_memory=memory)


def _server_log(side: CheckpointEvaluation) -> str | None:
    """The side's server log, where this machine has it (a cluster job's stays on the cluster: unverified)."""
    try:
        path = Path(ledger.get(side.deployment_record_id).details.get("log_path") or "") if side.deployment_record_id else None
        return path.read_text(errors="replace") if path and path.is_file() else None
    except (ToolError, OSError):
        return None


def _floor_side(request: EvaluateQuantizationInput, root: Path) -> _Checkpoint | None:
    """With noise_floor: the baseline once more, on the framework's other numeric path (None where it has one)."""
    if not request.noise_floor or FRAMEWORK_INFO[request.framework].eager_flag is None:
        return None
    other = request.model_copy(update={"eager": not request.eager})
    return _Checkpoint("noise-floor", request.baseline_checkpoint, other, root)


def _noise_floor(request: EvaluateQuantizationInput, side: _Checkpoint | None, report_dir: Path,
                 baseline: CheckpointEvaluation, compared: compare.CompareResultsOutput, progress: ProgressFn,
                 ) -> tuple[list[NoiseFloor], CheckpointEvaluation | None, list[str]]:
    """The baseline served and run again on the framework's other numeric path (beside the candidate's runs, by
    _evaluate_sides, or now), compared with its own run."""
    flag = FRAMEWORK_INFO[request.framework].eager_flag
    if flag is None or side is None:
        return [], None, [f"Noise floor: {request.framework} has one numeric path here; nothing measured."]
    path = f"with {flag}" if side.request.eager else f"without {flag} (the default path)"
    try:
        if side.failure is not None:
            raise side.failure
        run = side.evaluation or _evaluate_alone(side, side.request, progress)
    except ToolError as exc:
        return [], None, [f"Noise floor not measured: the baseline served {path} failed: {exc}"]
    same = compare.compare_results(compare.CompareResultsInput(
        baseline=baseline.full_run_record_id or "", candidate=run.full_run_record_id or "", confidence=request.confidence,
        output_dir=str(report_dir / "noise-floor"), baseline_checkpoint=baseline.checkpoint,
        candidate_checkpoint=baseline.checkpoint))
    rows = noise_floor(compared.comparisons, same.comparisons, path)
    return rows, run, [row.message for row in rows]


def _evaluate_alone(side: _Checkpoint, request: EvaluateQuantizationInput, progress: ProgressFn) -> CheckpointEvaluation:
    """One more side, served and run on its own (its finished run reused as any other)."""
    if side.done is not None:
        return side.reused()
    if on_cluster(request):
        (run,) = _evaluate_on_cluster(request, progress, [side])
        if isinstance(run, CanaryFailed):
            raise run
        return run
    offset = 2 * STEPS_PER_CHECKPOINT
    try:
        progress(offset, _total(request), f"{side.role}: starting {request.framework} on {side.dir.name}")
        side.launch(_plan(side.dir, request), request)
        assert side.launched is not None
        served = _ready(side.dir, side.launched, request, _every(PROGRESS_EVERY_S, progress, offset, _total(request), side.role))
        side.seconds["serve"] = time.monotonic() - side.launched_at
        return _run_both_runs(side, served, request, progress, offset)
    except BaseException as exc:
        side.stop(interrupted=not isinstance(exc, Exception))
        raise


@dataclass
class _InJob:
    """How a side is served inside its runs' own cluster jobs (evaluate_cluster)."""
    model_path: str
    command: list[str]
    output_dir: str
    placement: dict[str, Any]


CLUSTER_POLL_S = 3.0  # from one poll's start to the next: a side's poll is a few ssh round trips (squeue, chain file)
# How SLURM itself, not the run, ended a job (the engine records such a run as failed).
SLURM_ENDED = {"TIMEOUT": "at its walltime", "NODE_FAIL": "because its node failed (NODE_FAIL)",
               "PREEMPTED": "for a job of higher priority (PREEMPTED)", "BOOT_FAIL": "as its node failed to boot (BOOT_FAIL)",
               "DEADLINE": "at its deadline (DEADLINE)"}


def _evaluate_on_cluster(request: EvaluateQuantizationInput, progress: ProgressFn, checkpoints: list[_Checkpoint],
                         optional: _Checkpoint | None = None) -> list[CheckpointEvaluation | CanaryFailed]:
    """Every side's canary submitted at once; as each passes, its full run; as each ends, its results fetched here.
    A candidate canary that failed is returned as such (the verdict's to judge against the baseline's); any other
    failure is an error, and an interruption or error cancels every job still queued or running (scancel). The
    `optional` side (the noise floor's) runs beside them: its evaluation or failure is kept on it, never the call's."""
    settings = request.cluster or evaluate_cluster.ClusterSettings()
    paths = evaluate_cluster.cluster_checkpoints(settings, request.baseline_checkpoint, request.candidate_checkpoint)
    progress(0, _total(request), f"asking {request.host} for its partitions, paths, nel-next and vLLM")
    cluster = evaluate_cluster.preflight(request.host or "", settings, paths, request.startup_timeout_s,
                                         cluster_tensor_parallel_size(request))
    ports = evaluate_cluster.job_ports(len(checkpoints) + 1, cluster.ephemeral_ports)
    sides = [_ClusterSide(checkpoint, cluster, checkpoint.request, port) for checkpoint, port in zip(checkpoints, ports[:-1], strict=True)]
    extra = _ClusterSide(optional, cluster, optional.request, ports[-1]) if optional is not None else None
    total = _total(request)
    submitting: list[Future[None]] = []
    every = [*sides, *([extra] if extra else [])]
    try:
        for side in every:
            if side.adopted is not None:
                progress(0, total, f"{side.role}: picking up its {side.stage.replace('_', ' ')} {side.adopted.id} "
                         f"(SLURM job {side.placement.jobs.get(side.stage, '?')}), left by a call that ended before it")
            elif side.side.done is None:
                progress(0, total, f"{side.role}: writing its config and submitting its canary to {cluster.host}")
                submitting.append(_in_background(side.submit_canary))  # every side's at once: tens of seconds each
        for side, future in zip([s for s in every if s.adopted is None and s.side.done is None], submitting, strict=True):
            side.guarded(future.result, side is extra)
        while not all(side.finished for side in every):
            began = time.monotonic()
            for side in every:  # a poll of a side is a few ssh round trips: a cancel is seen before the next side's
                cancellation_point()
                side.guarded(lambda side=side: side.step(progress, total), side is extra)
            if not all(side.finished for side in every):  # a client that left may SIGKILL this process 4 s later:
                pause(CLUSTER_POLL_S - (time.monotonic() - began))  # its jobs are cancelled first
    except BaseException:
        with interrupts_held():  # a second Ctrl-C must not leave a job holding the cluster's GPUs
            concurrent.futures.wait(submitting)  # a submission under way ends with its job recorded, then cancelled
            _cancel_sides(cluster.host, every)
        raise
    if extra is not None and optional is not None:
        optional.evaluation = extra.answer if isinstance(extra.answer, CheckpointEvaluation) else None
    answers = [side.answer for side in sides]
    for side, answer in zip(sides, answers, strict=True):
        if isinstance(answer, CanaryFailed) and (side.role != "candidate" or any(
                not isinstance(other, CheckpointEvaluation) for other in answers if other is not answer)):
            raise answer  # a baseline's failed canary is an error to fix, not a verdict
    return answers  # type: ignore[return-value]


def _release(canary_id: str) -> None:
    """A canary's job that serves on for a full run which will not come ends now (kill_run of an ended run tells it);
    a cluster that does not answer leaves it to its own limit (jobserving.NEXT_RUN_WAIT_S)."""
    with contextlib.suppress(ToolError):
        runs.kill_run(runs.RunRef(record_id=canary_id))


def _cancel_sides(host: str, sides: list[_ClusterSide]) -> None:
    """Every side's queued or running job scancelled in one round trip, then each side's run recorded cancelled: an
    MCP client that left SIGKILLs this server 4 s after closing stdin, and under load each side's own cancel (a status
    poll, then scancel) took longer. Their jobs have no auto-resume successor (jobserving), so the scancel is all of it;
    a cluster that did not answer is left to each side's own cancel, which says so in its record."""
    active = {side: side.active for side in sides if side.active is not None}
    try:
        if job_ids := [job_id for side in active for job_id in side.job_ids]:
            slurm.scancel(host, job_ids)
    except ToolError:
        with concurrent.futures.ThreadPoolExecutor(max(len(active), 1)) as pool:
            list(pool.map(lambda side: side.cancel(), active))
        return
    for side, record_id in active.items():
        ledger.update(record_id, status="cancelled", message="cancelled: evaluate_quantization was interrupted",
                      only_from=ACTIVE)
        side.active = None


class _ClusterSide:
    """One side on the cluster: its config, its canary's job, then its full run's; polled until it has an answer."""

    def __init__(self, side: _Checkpoint, cluster: evaluate_cluster.Cluster, request: EvaluateQuantizationInput,
                 port: int) -> None:
        self.side, self.cluster, self.request, self.role, self.port = side, cluster, request, side.role, port
        self.stage = "done" if side.done is not None else "config"
        self.answer: CheckpointEvaluation | CanaryFailed | None = side.reused() if side.done is not None else None
        self.active: str | None = None  # the record of the run whose job is queued or running
        self.canary_id = self.full_id = ""
        self.config_path, self.served, self.serving = "", {}, None
        self.placement = cluster.placement("baseline" if side.role == "noise-floor" else side.role)
        self.said, self.said_at, self.started = "", 0.0, time.monotonic()
        self.adopted = self._adopt() if self.answer is None else None

    def _adopt(self) -> ledger.Record | None:
        """The run of this evaluation that a process which died left behind (its jobs queued, running or ended since),
        picked up where it is: its canary or full run is polled again, not submitted a second time."""
        record = _left_behind(self.side.key)
        if record is None:
            return None
        recorded = record.details
        self.config_path, self.served = record.config_path or "", recorded.get("served") or {}
        self.serving = Serving.model_validate(recorded["serving"]) if recorded.get("serving") else None
        self.placement.jobs.update((recorded.get("placement") or {}).get("jobs") or {})
        self.placement.nodes.update((recorded.get("placement") or {}).get("nodes") or {})
        self.stage, self.active = record.kind, record.id
        self.canary_id = record.id if record.kind == "canary" else recorded.get("canary_record_id", "")
        self.full_id = record.id if record.kind == "full_run" else ""
        self._note_job(record.id, record.kind)
        return record

    def _keep(self, record_id: str) -> None:
        """What a later call needs to pick this run up after this process died (_adopt), in the run's record."""
        ledger.update(record_id, details={
            "evaluation_key": self.side.key, "checkpoint": str(self.side.dir), "served": self.served,
            "serving": self.serving.model_dump() if self.serving else None, "canary_record_id": self.canary_id,
            "placement": {"jobs": self.placement.jobs, "nodes": self.placement.nodes}})

    @property
    def finished(self) -> bool:
        return self.answer is not None

    def guarded(self, step: Callable[[], Any], optional: bool) -> None:
        """step(); for the optional side a failure ends it (kept on its _Checkpoint) instead of the call."""
        if self.finished:
            return
        try:
            step()
        except ToolError as exc:
            if not optional:
                raise
            self.cancel()
            self.side.failure, self.answer = exc, exc  # type: ignore[assignment]

    def submit_canary(self) -> None:
        mark = time.monotonic()
        plan = _plan(self.side.dir, self.request, check_args=False)
        port = self.port  # not the plan's: that one is free here, not on the job's node
        where = "baseline" if self.role == "noise-floor" else self.role
        command = evaluate_cluster.server_command(self.cluster, where, plan.server_args, plan.env, port)
        context = _option(plan.server_args, "--max-model-len")
        self.served = {"id": plan.served_model_name, **({"max_model_len": int(context)} if context else {})}
        self.serving = plan.serving.model_copy(update={
            "version": self.cluster.vllm_release, "launcher": shlex.join(self.cluster.vllm_launcher),
            "device": "cpu" if self.cluster.vllm_cpu else "gpu"})
        endpoint = deploy.LaunchDeploymentResult(
            record_id="", host=self.cluster.host, status="planned", port=port, served_model_name=plan.served_model_name,
            endpoint_url=f"http://localhost:{port}/v1/chat/completions", command=shlex.join(command), log_path="")
        self.side.workdir.mkdir(parents=True, exist_ok=True)
        job = _InJob(model_path=self.placement.checkpoint, command=command, placement=self.cluster.job_values(),
                     output_dir=f"{self.cluster.output_dir.rstrip('/')}/{self.side.workdir.name}")
        self.config_path = _write_config(self.side.workdir, endpoint, self.served, self.request, str(self.side.dir), job)
        self.side.seconds["config"] = round(time.monotonic() - mark, 1)
        canary = runs.launch_canary(runs.LaunchCanaryInput(config_path=self.config_path,
                                                           limit_samples=self.request.canary_problems))
        self.canary_id = self.active = canary.record_id
        self.stage, self.started = "canary", time.monotonic()
        self._note_job(canary.record_id, "canary")
        self._keep(canary.record_id)

    def _note_job(self, record_id: str, stage: str) -> None:
        jobs = ledger.get(record_id).details.get("slurm_jobs") or []
        if jobs:
            self.placement.jobs[stage] = ", ".join(job["job_id"] for job in jobs)

    @property
    def job_ids(self) -> list[str]:
        """The SLURM jobs of its current stage."""
        return [job_id for ids in self.placement.jobs.get(self.stage, "").split(", ") if (job_id := ids.strip())]

    def step(self, progress: ProgressFn, total: int) -> None:
        """One poll of its active run: progress with its job's SLURM state, and the next stage once it ended."""
        if self.finished or self.active is None:
            return
        status = runs.run_status(runs.RunRef(record_id=self.active))
        job_ids = self.job_ids
        slurm_jobs = evaluate_cluster.job_facts(self.cluster.host, job_ids) if job_ids else {}
        for job in slurm_jobs.values():
            if job.state == "RUNNING" and job.reason:
                self.placement.nodes[self.stage] = job.reason
            if job.state != "PENDING" and f"{self.stage}_queue" not in self.side.seconds:  # the wait, apart from the run
                self.side.seconds[f"{self.stage}_queue"] = round(time.monotonic() - self.started, 1)
        said = f"{self.role} {self.stage.replace('_', ' ')} {self.active}: " + "; ".join(
            f"job {job_id} {evaluate_cluster.job_line(slurm_jobs.get(job_id))}" for job_id in job_ids) if job_ids else status.status
        if said != self.said or time.monotonic() - self.said_at >= PROGRESS_EVERY_S:
            step = {"canary": 3, "full_run": 5}.get(self.stage, 0) + STEPS_PER_CHECKPOINT * (self.role == "candidate")
            progress(step, total, said)
            self.said, self.said_at = said, time.monotonic()
        if status.status in ACTIVE:
            if time.monotonic() - self.started > self.request.run_timeout_s:
                runs.kill_run(runs.RunRef(record_id=self.active))
                raise ToolError(f"{self.role} {self.stage.replace('_', ' ')} {self.active} did not finish within "
                                f"{self.request.run_timeout_s:.0f} s; its job was cancelled. Raise run_timeout_s.")
            return
        finished = ledger.get(self.active)
        self.active = None
        if ended_by_slurm := [job for job in status.jobs if job.slurm_state in SLURM_ENDED]:
            raise ToolError(self._ended_by_slurm(ended_by_slurm[0], slurm_jobs))
        if self.stage == "canary":
            self._canary_ended(finished)
        else:
            self._full_run_ended(finished)

    def _ended_by_slurm(self, job: JobStatus, seen: dict[str, slurm.SlurmJob]) -> str:
        """Why SLURM, not the run, ended its job, and what to change: never a bare "failed". Not the checkpoint's doing,
        so an answer of neither side: the call fails (the other sides' jobs cancelled)."""
        job_id = job.current_slurm_job_id or job.slurm_job_id or "?"
        run = f"{self.role} {self.stage.replace('_', ' ')} {self.canary_id if self.stage == 'canary' else self.full_id}"
        if job.slurm_state == "TIMEOUT":
            given = seen[job_id].time_limit if job_id in seen else self.cluster.walltime
            limit = slurm.slurm_time(seconds) if (seconds := slurm.slurm_seconds(given)) else given  # squeue says 1:00
            return (f"{run}: SLURM job {job_id} was killed by its walltime (TIMEOUT) after {limit}{self._where(self.stage)}. "
                    f"Raise cluster.walltime (now {self.cluster.walltime}) and call again; what already finished is reused.")
        return (f"{run}: SLURM ended job {job_id} {SLURM_ENDED[job.slurm_state or '']}{self._where(self.stage)}; nel-next "
                "submits it with --no-requeue, so SLURM does not rerun it. Call again to run it anew; what already "
                "finished is reused.")

    def _where(self, stage: str) -> str:
        """The run's job, node and log folder on the cluster, for an answer that says it failed."""
        node = self.placement.nodes.get(stage)
        record_id = self.canary_id if stage == "canary" else self.full_id
        jobs = (ledger.get(record_id).details.get("slurm_jobs") or []) if record_id else []
        logs = f", logs {jobs[0]['remote_dir']}/logs" if jobs else ""
        return f" (SLURM job {self.placement.jobs.get(stage, '?')} on {self.cluster.host}{f', node {node}' if node else ''}{logs})"

    def _canary_ended(self, finished: ledger.Record) -> None:
        try:
            passed = _require_canary_pass(finished, f"{self.role} canary{self._where('canary')}", self.config_path)
        except BaseException as failed:
            _release(finished.id)  # its job serves on for a full run that will not come
            if not isinstance(failed, CanaryFailed):
                raise
            failed.served, failed.placement = self.served, self.placement
            if self.role != "candidate":
                raise  # the baseline's own canary: an error to fix, not a verdict (the other side's jobs are cancelled)
            self.answer, self.stage = failed, "done"
            return
        self.side.seconds["canary"] = round(time.monotonic() - self.started, 1)
        try:  # into the canary's job where it serves on, else a job of its own
            full = runs.launch_full_run(runs.LaunchFullRunInput(config_path=self.config_path), validated={finished.id: passed})
        except BaseException:
            _release(finished.id)
            raise
        self.full_id = self.active = full.record_id
        self.stage, self.started = "full_run", time.monotonic()
        self._note_job(full.record_id, "full_run")
        if self.placement.jobs.get("full_run") == self.placement.jobs.get("canary") and "canary" in self.placement.nodes:
            # in the canary's job, so on its node: a short full run may end between two polls that would have seen it
            self.placement.nodes["full_run"] = self.placement.nodes["canary"]
        self._keep(full.record_id)

    def _full_run_ended(self, finished: ledger.Record) -> None:
        _require_pass(finished, f"{self.role} full run{self._where('full_run')}", max_error_share=1.0)
        self.side.seconds["full_run"] = round(time.monotonic() - self.started, 1)
        facts = _add_run_facts(ledger.get(finished.id), {
            "checkpoint": str(self.side.dir), "served": self.served,
            "serving": self.serving.model_dump() if self.serving else None, "cluster": self.placement.model_dump()})
        self.stage = "done"
        self.answer = CheckpointEvaluation(
            role=self.role, checkpoint=str(self.side.dir), reused=False, served_model_name=self.served.get("id"),
            served_context=self.served.get("max_model_len"), config_path=self.config_path, canary_record_id=self.canary_id,
            full_run_record_id=finished.id, run_dir=_dir_of(ledger.get(finished.id)), serving=_serving(facts),
            seconds=dict(self.side.seconds), cluster=self.placement)

    def cancel(self) -> None:
        if self.active is not None:
            _cancel(self.active)
            self.active = None


def _left_behind(key: str) -> ledger.Record | None:
    """The newest run of the evaluation with this key when a call that died left it to go on: its canary or full run
    still queued or running as last recorded, or its canary passed; None when the newest ended otherwise (failed,
    killed, cancelled: a new call starts afresh) or there is none."""
    for record in ledger.find(kinds=["full_run", "canary"], limit=200):
        if record.details.get("evaluation_key") != key:
            continue
        passed_canary = record.kind == "canary" and record.status == "succeeded"
        return record if record.status in ACTIVE or passed_canary else None
    return None


def _option(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None


def _where_it_ran(side: CheckpointEvaluation) -> str | None:
    """The report's line of where a side ran on a cluster: host, partition, nodes, GRES, jobs and the vLLM."""
    placed = side.cluster
    if placed is None:
        return None
    jobs = ", ".join(f"{stage.replace('_', ' ')} job {job}" + (f" on {placed.nodes[stage]}" if stage in placed.nodes else "")
                     for stage, job in placed.jobs.items())
    return (f"Ran on {placed.host} ({side.role}): partition {placed.partition}, GRES {placed.gres or 'none'}, {jobs or 'no job'}; "
            f"served by {placed.vllm} from {placed.checkpoint}; nel-next {placed.nel_next}.")


def serving_note(baseline: Serving | None, candidate: Serving | None) -> str:
    """How both sides were served, in a line; the eager path said as a choice that moves answers."""
    if baseline is None or candidate is None:
        return "Serving: not recorded for one side (a run served outside quanteval); the comparability checklist says more."
    def said(serving: Serving) -> str:
        path = ("its default numeric path" if serving.numerics == "default" else
                f"the eager numeric path ({FRAMEWORK_INFO[serving.framework].eager_flag}, as asked: answers differ from the "
                "default path's on a share of problems, so compare only with runs served this way)")
        return f"{serving.version or serving.framework} on {serving.device}, {path}"
    if said(baseline) == said(candidate):
        return f"Served: both sides by {said(baseline)}."
    return f"Served differently: the baseline by {said(baseline)}; the candidate by {said(candidate)}."


def checkpoint_notes(baseline: str, candidate: str) -> list[str]:
    """What the two checkpoints' own files say about the comparison, each read once: a candidate that carries no
    quantization at all (a mislabelled upload compares two unquantized checkpoints), and a generation_config.json that
    differs (a quantized checkpoint often ships one unlike its baseline's, or a model card's sampling boilerplate):
    both sides are asked with the config's one sampling, and the difference is said."""
    def report(checkpoint: str) -> Any:
        try:
            return inspect_checkpoint(InspectCheckpointInput(checkpoint=checkpoint))
        except ToolError:
            return None
    base, cand = report(baseline), report(candidate)
    notes = []
    if cand is not None and (unquantized := unquantized_warning(cand)):
        notes.append(f"Candidate: {unquantized}")
    base_sampling = base.generation_defaults if base is not None else {}
    cand_sampling = cand.generation_defaults if cand is not None else {}
    if base_sampling != cand_sampling:
        notes.append(f"Sampling: the checkpoints' generation_config.json differ (baseline {base_sampling or 'none'}, "
                     f"candidate {cand_sampling or 'none'}); both sides were asked with the same sampling, the config's, "
                     "taken from neither file.")
    return notes


def _verdict(compared: compare.CompareResultsOutput, gated: GateResultsOutput | None) -> Verdict:
    """The gate decides under the rule; a suspect serving or runs not known comparable keep compare's verdict."""
    if gated is None or compared.acceptability == "suspect" or compared.comparability != "comparable":
        return compared.acceptability
    # the gate's release verdict: nel gate's, unless a rule beside it blocks; a size not reduced blocks it too
    return release.verdict_after(VERDICT_OF_GATE[gated.release_verdict], [], compared.weights)[0]  # type: ignore[return-value]


def _max_tokens(config_path: str | None) -> Any:
    config = configfile.to_plain(configfile.load_config(config_path)) if config_path else None
    return configfile.value_at(config or {}, "services.model.generation.max_tokens")


def _canary_responses(record: ledger.Record) -> list[Response]:
    answers = engines.evaluating().evaluation.responses(Path(_dir_of(record) or ""), RESPONSES_SHOWN)
    return [Response.model_validate(answer) for answer in answers]


def _anomalous(baseline: CheckpointEvaluation, failed: CanaryFailed, request: EvaluateQuantizationInput,
               started: float) -> EvaluateQuantizationOutput:
    """The candidate failed a canary the baseline passed with the same generation budget: that is the verdict."""
    budget = _max_tokens(failed.config_path)
    if budget != _max_tokens(baseline.config_path):
        raise failed  # not the same settings: the failure may be the settings', so it stays an error to fix
    run_dir = _dir_of(failed.record)
    why = (f"ANOMALOUS: the candidate's canary failed ({failed}) where the baseline's passed with the same settings "
           f"(max_tokens {budget}, same benchmarks and server flags): a broken quantization or a serving bug, not a "
           "setting to raise. Its answers are below; check the checkpoint (inspect_checkpoint) and its serving.")
    launched = failed.launched
    if run_dir:  # so validate_run on this canary says what the verdict says
        _add_run_facts(failed.record, {"anomalous": {
            "baseline_run": baseline.canary_record_id or baseline.full_run_record_id, "max_tokens": budget}})
    candidate = CheckpointEvaluation(role="candidate", checkpoint=str(Path(request.candidate_checkpoint).expanduser().resolve()),
                                     reused=False, config_path=failed.config_path, canary_record_id=failed.record.id,
                                     run_dir=run_dir, deployment_record_id=launched.record_id if launched else None,
                                     served_model_name=launched.served_model_name if launched else None,
                                     served_context=failed.served.get("max_model_len"),
                                     serving=_serving(_run_facts(failed.record)) if run_dir else None,
                                     cluster=failed.placement)
    return EvaluateQuantizationOutput(
        verdict="anomalous", comparability="inconclusive", table_markdown="", comparisons=[],
        reasons=[why, *checkpoint_notes(baseline.checkpoint, candidate.checkpoint)],
        baseline=baseline, candidate=candidate, report_html=None, report_markdown=None, chart_png=None,
        responses=_canary_responses(failed.record) if run_dir else [], seconds={"total": round(time.monotonic() - started, 1)})


class StartEvaluationOutput(BaseModel):
    record_id: str = Field(description="The evaluation's ledger record: wait_for_run, run_status and kill_run take it.")
    status: str
    log_path: str
    message: str


def start_evaluation(request: EvaluateQuantizationInput) -> StartEvaluationOutput:
    """evaluate_quantization as a job, for clients that time out (60 s): wait_for_run (timeout_s 45) until it ends
    gives the answer; kill_run stops it.
    """
    check_request(request)
    policy = paths.CALL_POLICY.get()  # the job runs in a process of its own: it confines itself to the same root
    record = background.start(request.model_dump(mode="json"), root=policy.root if policy is not None else None)
    return StartEvaluationOutput(record_id=record.id, status=record.status, log_path=record.details["log_path"],
                                 message=f"Started. wait_for_run record_id={record.id} timeout_s=45 until it finishes.")
