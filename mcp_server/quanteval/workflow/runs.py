"""The run lifecycle tools: dry-run, canary, gated full run, status, logs, kill, resume, list.

One engine-neutral body each: the engine is picked once, from the config's shape (`engines.for_config`) at launch and
from the ledger record (`engines.for_record`) afterwards; engines/<engine>/runs.py does the engine's part and the
executor (clusters/executor.py) answers for the jobs. Every dry-run, canary and full run is recorded in the ledger with
a hash of its composed config; the hash ignores the canary's own limit, so a canary and the full run of the same
config share it — that is what the full-run gate checks.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from quanteval import engines, ledger, paths
from quanteval.clusters import executor as executors
from quanteval.engines import commands, launchplan
from quanteval.engines.base import (
    ACTIVE,
    CanarySpec,
    DryRunOutput,
    JobStatus,
    KillRunOutput,
    LaunchOutput,
    LaunchPlan,
    ResumeRunOutput,
    RunKind,
    RunLogsOutput,
    RunRole,
)
from quanteval.engines.runresults import ValidateRunInput, ValidateRunOutput
from quanteval.evalserver import liveness
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress, pause
from quanteval.workflow import background, results

# list_runs also lists the servers: a deployment or eval server left running is visible, and stop_* takes its id.
LISTED = ledger.kinds("run", "evaluation", "server")
ListedKind = Literal[LISTED]  # type: ignore[valid-type]


def _config_file(config_path: str) -> str:
    path = Path(config_path).expanduser()
    if not path.is_file():
        raise ToolError(f"{config_path}: no such config file. Create one with build_config, or pass the right path.")
    return str(path.resolve())


def _launchable(config_path: str, overrides: list[str]) -> LaunchPlan:
    """The config read once for this launch, once nothing in it or the overrides would run as a shell command by
    accident (engines/commands.py) and its engine says this machine can launch it."""
    plan = launchplan.plan(config_path, overrides)
    if refusal := commands.launch_refusal(plan):
        raise ToolError(refusal)
    plan.engine.run.check_launchable(plan)
    return plan


# ---------------------------------------------------------------- dry_run


class DryRunInput(StrictModel):
    config_path: str = Field(description="The config file (.yaml).")
    overrides: list[str] = Field(default_factory=list, description=(
        "Overrides as for `nel run -o`; a new key needs '++'."))


def dry_run(request: DryRunInput, progress: ProgressFn = no_progress) -> DryRunOutput:
    """Use after validate_config, before launch_canary: the engine's own dry-run: what would run (secrets masked) or
    the engine's error.
    """
    plan = launchplan.plan(_config_file(request.config_path), request.overrides)
    return plan.engine.run.dry_run(plan, progress)


# ---------------------------------------------------------------- launches


class LaunchCanaryInput(StrictModel):
    config_path: str = Field(description="The evaluation config (the full run uses the same).")
    limit_samples: int = Field(10, ge=1, le=100000, description="Samples per task.")
    tasks: list[str] = Field(default_factory=list, description=(
        "Only these tasks of the config; empty = all."))
    overrides: list[str] = Field(default_factory=list, description=(
        "Overrides as for `nel run -o` (new key: '++'); give launch_full_run the same ones."))
    repeats: int | None = Field(1, ge=1, le=1000, description=(
        "Repeats per sample where the config repeats; null: the config's, as the full run."))


def launch_canary(request: LaunchCanaryInput, progress: ProgressFn = no_progress) -> LaunchOutput:
    """Use after a passing dry_run: launches a canary (limit_samples per task), returns its record_id at once;
    launch_full_run needs it to pass. Poll with wait_for_run.
    """
    plan = _launchable(_config_file(request.config_path), request.overrides)
    return _launch(plan, "canary", request.tasks, CanarySpec(limit=request.limit_samples, repeats=request.repeats), {},
                   progress)


def _launch(plan: LaunchPlan, kind: RunKind, tasks: list[str], canary: CanarySpec | None, details: dict,
            progress: ProgressFn) -> LaunchOutput:
    """Record, then launch, for every engine: the record is written before anything starts, so a ledger that cannot
    be written stops the launch here (and a retry never starts a second, unrecorded copy). A launch that fails or is
    interrupted before the engine recorded its outcome is recorded as failed or cancelled."""
    engine = plan.engine
    record = ledger.add(kind, status="launching", config_path=plan.config_path,
                        details={**details, "engine": engine.name, "overrides": plan.override_list, "tasks": tasks},
                        message=f"recorded; launching through {engine.name}")
    try:
        return engine.run.launch(record, plan, tasks, canary, details, progress)
    except BaseException as exc:
        interrupted = not isinstance(exc, Exception)  # Ctrl-C, SIGTERM (raised as KeyboardInterrupt), exit
        with contextlib.suppress(ToolError):
            if ledger.get(record.id).status == "launching":
                # a ToolError's message is written for the person; anything else may carry what it must not
                error = "interrupted" if interrupted else str(exc)[:500] if isinstance(exc, ToolError) else \
                    f"internal error ({type(exc).__name__})"
                ledger.update(record.id, status="cancelled" if interrupted else "failed", details={"error": error},
                              message=f"launch {'cancelled' if interrupted else 'failed'}: {error}")
        raise


class LaunchFullRunInput(StrictModel):
    config_path: str = Field(description="The evaluation config whose canary passed.")
    overrides: list[str] = Field(default_factory=list, description="The same overrides the canary was launched with.")
    tasks: list[str] = Field(default_factory=list, description="Only these tasks of the config; empty = all.")
    force: bool = Field(False, description=(
        "Skip the canary gate; only if the person asks. Needs reason."))
    allow_suspect_canary: bool = Field(False, description=(
        "Accept a suspect canary (all wrong, or at chance) the person confirms. Needs reason."))
    reason: str | None = Field(None, description="Why (with force or allow_suspect_canary; recorded).")


def _canary_verdict(canary: ledger.Record, report: ValidateRunOutput | None) -> tuple[str, str]:
    """This finished canary's validate_run verdict (scores present, errors and truncation low, a plausible score) and
    what it says; "unreadable" when validate_run could not read it. report: the one its caller already read."""
    try:
        report = report or results.validate_run(ValidateRunInput(run=engines.for_record(canary).run.results_location(canary)))
    except ToolError as exc:
        return "unreadable", f"validate_run could not read it: {exc}"
    reasons = f" ({'; '.join(report.reasons[:3])})" if report.reasons else ""
    return report.verdict, f"validate_run verdict: {report.verdict}{reasons}"


def _gate(config_hash_value: str, tasks: list[str], progress: ProgressFn, allow_suspect: bool = False,
          validated: dict[str, ValidateRunOutput] | None = None) -> tuple[str, str]:
    """The passing canary that vouches for a full run of these tasks (what the gate says, its record id), or a
    ToolError saying why there is none. A suspect canary (it ran, but every answer is wrong or at chance) vouches only
    when the person allowed it: a setup problem found on 10 problems is not run again on all of them. validated:
    canaries' reports already read, by id."""
    canaries = ledger.find(kind="canary", config_hash=config_hash_value, limit=20)
    if not canaries:
        raise ToolError(
            f"Full run refused: no canary has run for this config (hash {config_hash_value}). Run launch_canary on "
            "the same config and overrides, wait until run_status says succeeded, then launch the full run.")
    problems, suspect = [], []
    for canary in canaries:
        if canary.status in ACTIVE and canary.invocation_id:
            progress(0.5, 3, f"refreshing canary {canary.id}")
            canary = engines.for_record(canary).run.refresh(canary).record
        if canary.status != "succeeded":
            problems.append(f"{canary.id}: {canary.status}")
            continue
        untested = sorted(set(tasks) - set(canary.details.get("tasks", [])))
        if untested:
            problems.append(f"{canary.id}: did not run {', '.join(untested)}")
            continue
        verdict, why = _canary_verdict(canary, (validated or {}).get(canary.id))
        ledger.update(canary.id, details={"validation": why, "validation_passed": verdict == "pass"}, message=f"gate check: {why}")
        if verdict == "pass":
            return f"canary {canary.id} ({canary.invocation_id}) passed: {why}", canary.id
        if verdict == "suspect" and allow_suspect:
            return (f"canary {canary.id} ({canary.invocation_id}) suspect, accepted by the person (allow_suspect_canary): "
                    f"{why}", canary.id)
        (suspect if verdict == "suspect" else problems).append(f"{canary.id}: {why}")
    if suspect:
        raise ToolError(
            f"Full run refused: the canary of this config (hash {config_hash_value}) ran, but its score is suspect "
            f"({'; '.join(suspect[:2])}). Read a few of its answers, fix the setup (protocol, chat template, stop words, "
            "answer format) and launch a new canary. If the model is truly this weak, call again with "
            "allow_suspect_canary=true and a reason.")
    raise ToolError(
        f"Full run refused: no canary of this config (hash {config_hash_value}) has passed ({'; '.join(problems[:5])}). "
        "Wait for a running canary (run_status), or read run_logs of the failed one, fix the config and launch a "
        "new canary. To override, call again with force=true and a reason.")


def launch_full_run(request: LaunchFullRunInput, progress: ProgressFn = no_progress, validated: dict[str, ValidateRunOutput] | None = None) -> LaunchOutput:
    """Use after the canary passed: launches the full run of the same config (refused without a passing canary unless
    force). Returns its record_id at once.
    """
    config_path = _config_file(request.config_path)
    if request.force and not (request.reason and request.reason.strip()):
        raise ToolError("force: a full run without a passing canary needs a written reason. Pass reason='...'.")
    if request.allow_suspect_canary and not (request.reason and request.reason.strip()):
        raise ToolError("allow_suspect_canary: a full run on a suspect canary needs a written reason (why the score is "
                        "the model's, not the setup's). Pass reason='...'.")
    progress(0, 3, "checking the canary gate")
    plan = _launchable(config_path, request.overrides)
    composed = plan.engine.run.compose(plan)
    if request.force:
        gate, canary_id = f"forced: {request.reason.strip()}", None
    else:
        gate, canary_id = _gate(composed.config_hash, request.tasks or composed.tasks, progress,
                                request.allow_suspect_canary, validated)
    explained = request.force or request.allow_suspect_canary
    details = {"gate": gate, "vouched_by": canary_id, "forced": request.force,
               "reason": request.reason.strip() if explained and request.reason else None}
    return _launch(plan, "full_run", request.tasks, None, details, progress)


# ---------------------------------------------------------------- status


class RunRef(StrictModel):
    record_id: str = Field(description="The run's record_id (or its NEL 0.2.6 invocation id).")


class RunStatusOutput(BaseModel):
    record_id: str
    kind: str
    invocation_id: str | None
    status: str = Field(description=(
        "launching, submitted, pending, running, resuming, succeeded, failed, killed, cancelled or unknown."))
    executor: str | None
    host: str | None
    reachable: bool = Field(description="False when the cluster could not be asked; status is then the last known one.")
    message: str | None
    jobs: list[JobStatus]
    history: list[ledger.Event] = Field(description="Status changes recorded in the ledger, oldest first (last 20).")
    progress: str | None = Field(None, description="An evaluation (start_evaluation): its last progress line.")
    result: dict[str, Any] | None = Field(None, description="An evaluation that succeeded: evaluate_quantization's answer.")


def _record(run: str) -> tuple[ledger.Record, RunRole | background.Runs]:
    record = ledger.get(run.strip())
    return record, _runs(record)


def _runs(record: ledger.Record) -> RunRole | background.Runs:
    """What answers the run tools for this record: a run's engine, an evaluation's job; a server is refused."""
    if ledger.family(record.kind) == "run":
        return engines.for_record(record).run
    if record.kind != background.KIND:
        where = {"deployment": "deployment_status and stop_deployment take it (the deploy toolset: over MCP, enable_toolsets "
                               'with ["deploy"] if they are not listed)',
                 "eval_server": 'eval_server_status and stop_eval_server take it (the evalserver toolset: enable_toolsets with '
                                '["evalserver"] if they are not listed)'}
        raise ToolError(f"{record.id} is a {record.kind}, not a run: {where.get(record.kind, 'list_runs shows what it is')}.")
    return background.RUNS


def run_status(request: RunRef, progress: ProgressFn = no_progress) -> RunStatusOutput:
    """Use to poll a canary or full run: each job's status, with the ledger's history."""
    progress(0, 1, "asking the executor")
    record, runs = _record(request.record_id)
    refreshed = runs.refresh(record)
    record = refreshed.record
    progress(1, 1, record.status)
    return RunStatusOutput(record_id=record.id, kind=record.kind, invocation_id=record.invocation_id,
                           status=record.status, executor=record.executor, host=record.host,
                           reachable=refreshed.reachable, message=refreshed.message, jobs=refreshed.jobs,
                           history=ledger.events(record.id)[-20:], progress=refreshed.progress, result=refreshed.result)


class WaitForRunInput(StrictModel):
    record_id: str = Field(description="The run's record_id (or its NEL 0.2.6 invocation id).")
    timeout_s: float = Field(45, ge=0, le=3600, description="Longest wait, in seconds (default: under a 60 s client timeout).")


def wait_for_run(request: WaitForRunInput, progress: ProgressFn = no_progress) -> RunStatusOutput:
    """Use instead of polling run_status (a run or start_evaluation's job): answers when the status changes or after
    timeout_s; call again while it runs."""
    status = run_status(RunRef(record_id=request.record_id))
    if status.status not in ACTIVE:
        return status
    record, runs = _record(request.record_id)
    started = time.monotonic()
    progress(*_steps(record.id, status))
    while (remaining := request.timeout_s - (time.monotonic() - started)) > 0:
        pause(min(runs.poll_interval_s(record), remaining))  # a cancelled call (the client left, SIGTERM) stops within a fraction of it
        now = run_status(RunRef(record_id=request.record_id))
        if now.status != status.status:
            return now
        progress(*_steps(record.id, now))
    return run_status(RunRef(record_id=request.record_id))


def _steps(record_id: str, status: RunStatusOutput) -> tuple[float, float | None, str]:
    """Progress in the run's own units, as the CLI prints them: an evaluation's workflow step of its steps in all (its
    name as the message); a run's jobs finished of its jobs. The same step again while it lasts: each report tells the
    client the call is alive."""
    if status.kind == background.KIND:
        step = background.progress_step(ledger.get(record_id))
        return step if step is not None else (0, None, f"{status.status}: starting")
    finished = sum(job.status not in ACTIVE for job in status.jobs)
    jobs = f"{finished} of {len(status.jobs)} job(s) finished" if status.jobs else "no job reported yet"
    return finished, len(status.jobs) or None, f"{status.status}: {jobs}"


# ---------------------------------------------------------------- logs


class RunLogsInput(StrictModel):
    record_id: str = Field(description="The run's record_id (or its NEL 0.2.6 invocation id).")
    lines: int = Field(50, ge=1, le=500, description="Last lines of each log file.")
    job: str | None = Field(None, description="Only this NEL 0.2.6 job id (<invocation>.<index>).")


def run_logs(request: RunLogsInput, progress: ProgressFn = no_progress) -> RunLogsOutput:
    """Use when a run failed or to watch a canary: log tails, failure lines and, when failed, a diagnosis and its fix.
    """
    record, runs = _record(request.record_id)
    return runs.logs(record, request.lines, request.job, progress)


# ---------------------------------------------------------------- kill / resume


def kill_run(request: RunRef, progress: ProgressFn = no_progress) -> KillRunOutput:
    """Use when a run is wrong or stuck: stops it through its engine (NEL 0.2.6: with its restart job) and records it as killed."""
    record, runs = _record(request.record_id)
    if record.kind == "dry_run":
        raise ToolError(f"{record.id} is a dry-run; nothing runs. list_runs kind=canary or full_run shows runs.")
    return runs.kill(record, progress)


def resume_run(request: RunRef, progress: ProgressFn = no_progress) -> ResumeRunOutput:
    """Use after a kill or a transient failure: re-runs the run's scripts under the same invocation id (config edits need a
    new canary).
    """
    record, runs = _record(request.record_id)
    if record.kind == "dry_run" or not record.invocation_id and runs is not background.RUNS:
        raise ToolError(f"{record.id} never ran (a dry-run or a failed launch); use launch_canary instead.")
    return runs.resume(record, progress)


# ---------------------------------------------------------------- list_runs


class ListRunsInput(StrictModel):
    kind: ListedKind | None = Field(None, description="Only this kind; default all.")
    status: str | None = Field(None, description="Only this status, e.g. running, failed.")
    offset: int = Field(0, ge=0, description="Records to skip (newest first).")
    limit: int = Field(20, ge=1, le=100, description="Page size.")


class RunSummary(BaseModel):
    record_id: str
    kind: str
    status: str
    invocation_id: str | None
    config_path: str | None
    config_hash: str | None
    executor: str | None
    host: str | None
    created_at: float
    updated_at: float
    note: str | None = Field(description="The failure message; a full run: why it was allowed; a server: where it listens; an evaluation: its progress.")


class ListRunsOutput(BaseModel):
    total: int = Field(description="Records matching the filters.")
    offset: int
    next_offset: int | None = Field(description="Offset of the next page; null at the end.")
    runs: list[RunSummary]


def list_runs(request: ListRunsInput) -> ListRunsOutput:
    """Use to find a record_id: runs, evaluations, deployments and eval servers (one left running shows here),
    newest first. Paginated.
    """
    from quanteval.workflow import confine

    kinds: list[ledger.RecordKind] = [request.kind] if request.kind else list(LISTED)
    if paths.CALL_POLICY.get() is not None:  # over MCP: only what the call may see (--root), paged after filtering
        every = ledger.find(kinds=kinds, status=request.status, limit=-1)  # SQLite: no limit
        seen = [record for record in every if confine.visible(record)]
        page, total = seen[request.offset:request.offset + request.limit], len(seen)
    else:
        page = ledger.find(kinds=kinds, status=request.status, limit=request.limit, offset=request.offset)
        total = ledger.count(kinds=kinds, status=request.status)
    page = [_settled(record) for record in page]
    next_offset = request.offset + len(page) if request.offset + len(page) < total else None
    return ListRunsOutput(total=total, offset=request.offset, next_offset=next_offset, runs=[
        RunSummary(record_id=record.id, kind=record.kind, status=record.status, invocation_id=record.invocation_id,
                   config_path=record.config_path, config_hash=record.config_hash, executor=record.executor,
                   host=record.host, created_at=record.created_at, updated_at=record.updated_at,
                   note=_note(record))
        for record in page])


def _settled(record: ledger.Record) -> ledger.Record:
    """A record that says it is live, checked against its process where that is on this machine: an evaluation,
    server or run whose process is gone (its owner died and took it, a crash, kill -9) shows how it ended, never as
    loading or running. A run is asked only where its executor is as cheap to ask as a process here (its poll
    interval): a cluster's runs, a round trip each, are asked by run_status and wait_for_run."""
    from quanteval.serving import deploy

    if record.kind == "deployment":
        return deploy.settle(record)
    if record.kind == liveness.KIND and record.status == "running":
        return liveness.settle(record, message="its process is gone (list_runs)")
    if record.status == "running" and ledger.family(record.kind) in ("run", "evaluation"):
        runs = _runs(record)
        return runs.refresh(record).record if runs.poll_interval_s(record) <= executors.LOCAL.poll_interval_s else record
    return record


def _note(record: ledger.Record) -> str | None:
    details = record.details
    if details.get("error"):
        return str(details["error"])[:300]
    if record.kind == "full_run":
        return details.get("gate")
    if ledger.family(record.kind) == "server":  # where it listens, so a forgotten one can be found and stopped
        return details.get("endpoint_url") or (f"port {details['port']}" if "port" in details else None)
    return background.progress_line(record) if record.kind == background.KIND else None
