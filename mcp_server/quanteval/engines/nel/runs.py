"""NEL 0.2.6's run lifecycle: dry-run, launch, state, logs, kill and resume through NEL's Python API.

Every NEL call runs in a child process (engines/nel/nelexec.py) with a timeout, so NEL's prints never reach the MCP
stdout and a dead host never hangs a tool. The record's executor answers for the run's jobs where it adopts them: the
SLURM executor reads the cluster directly (one ssh call: the job chain file NEL's auto-resume writes, `squeue -t all`,
and `sacct` for purged jobs) because NEL reports every ssh or sacct hiccup as FAILED; a walltime TIMEOUT with NEL's
paired restart job queued is reported as `resuming`, never as a failure. NEL's other jobs (its local Docker
containers, lepton's) are NelApiExecutor's: NEL's API answers for them.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from quanteval import failures, ledger
from quanteval.clusters import executor as executors
from quanteval.clusters.executor import Executor, JobStatus, LogFailures, Unreachable, read_log_failures
from quanteval.engines.base import (
    ACTIVE,
    FINISHED,
    MAX_HITS,
    MAX_SCRIPTS,
    CanarySpec,
    Composed,
    DryRunOutput,
    FailureHit,
    KillRunOutput,
    LaunchOutput,
    LaunchPlan,
    LogTail,
    NelWarning,
    Reading,
    Refreshed,
    ResumeRunOutput,
    RunLogsOutput,
    overall_status,
)
from quanteval.engines.nel import config, nelexec
from quanteval.engines.nel.nelfacts import EXECUTOR_PROGRAMS, REPEAT_KEYS
from quanteval.engines.rendering import rendered_script, secrets_files
from quanteval.localproc import missing_programs
from quanteval.models import ProgressFn, ToolError
from quanteval.redact import scrub, secret_values, shown_line, shown_lines

LIMIT_SAMPLES_OVERRIDE = "++evaluation.nemo_evaluator_config.config.params.limit_samples={}"
REPEAT_OVERRIDE = "++{prefix}.nemo_evaluator_config.config.params.extra.{key}={value}"
DRY_RUN_TIMEOUT_S = 180.0
LAUNCH_TIMEOUT_S = 600.0
QUERY_TIMEOUT_S = 120.0
NEL_STATE = {"success": "succeeded", "failed": "failed", "killed": "killed", "pending": "pending", "running": "running"}
local_programs = EXECUTOR_PROGRAMS
NEL_CHAIN_FILE = ".slurm_job_id.list"  # NEL 0.2.6 lists a run's SLURM jobs (its auto-resume chain) here


def _nel(op: str, timeout: float, **args: object) -> dict:
    answer = nelexec.call(op, timeout, **args)
    if not answer.get("ok"):
        raise ToolError(f"NEL: {scrub(answer.get('error', 'unknown error'))}")
    return answer



def compose(plan: LaunchPlan) -> Composed:
    config_path, overrides = plan.config_path, plan.override_list
    answer = _nel("hash", QUERY_TIMEOUT_S, config_path=config_path, overrides=overrides)
    return Composed(config_hash=answer["config_hash"], tasks=answer["tasks"])


def check_launchable(plan: LaunchPlan) -> None:
    """Refuse a launch before NEL runs when this machine lacks what the config's executor runs here."""
    execution = config.execution_type(plan.doc)
    programs = EXECUTOR_PROGRAMS.get(execution, ())
    # NEL fails on a missing one with a bare Errno 2; Docker is asked as the run starts, daemon and all (a dry run
    # needs none)
    if "docker" not in programs and (problem := missing_programs(f"NEL's {execution} executor", programs)):
        raise ToolError(f"{plan.config_path}: not launched. {problem} Then launch again (check_environment lists them).")


@dataclass(frozen=True)
class NelReading(Reading):
    error: str | None = None  # NEL's message where it cannot compose the config (its launch would fail the same way)


def read_launch(config_path: str, overrides: list[str]) -> NelReading:
    """NEL's own reading of the config with the overrides (one warm child): composed from its defaults and config
    groups, overridden and interpolated, the same uninterpolated (`raw`), the group files it composes or would compose
    if written; or NEL's error when it cannot compose it."""
    answer = nelexec.call("resolved", QUERY_TIMEOUT_S, config_path=config_path, overrides=overrides)
    if not answer.get("ok"):
        return NelReading(error=scrub(answer.get("error", "unknown error")))
    return NelReading(resolved=answer["config"], raw=answer["raw"], files_read=answer["depends_on"])


def launch_paths(plan: LaunchPlan) -> list[tuple[str, Path]]:
    """Every local path a launch of the config with these overrides uses, as NEL composes and resolves them (NEL makes
    a relative path absolute against its working directory, this process's); none for a run elsewhere."""
    if (doc := plan.reading.resolved) is None:
        raise ToolError(f"NEL: {isinstance(plan.reading, NelReading) and plan.reading.error or 'the config could not be composed'}")

    def found() -> Iterator[tuple[str, str]]:  # read only for a run here: a cluster's paths are not checked (or refused) here
        yield from config.launch_paths(doc)

    return executors.for_name(config.execution_type(doc)).local_paths(found())


# ---------------------------------------------------------------- dry-run


def _split_printed_scripts(printed: str) -> list[tuple[str, str]]:
    """SLURM dry-run scripts exist only in NEL's printout: sections headed '=== Task N ==='."""
    sections = re.split(r"=+ Task (\d+) =+\n", printed)
    scripts = []
    for index, body in zip(sections[1::2], sections[2::2], strict=True):
        body = re.split(r"\n-+ Secrets \(redacted\)|\nTo submit jobs", body)[0].strip("\n")
        scripts.append((f"task{index}/run.sub", body + "\n"))
    return scripts


def _rendered_files(answer: dict) -> tuple[Path | None, list[Path], list[tuple[str, Path | None, str]]]:
    """Where NEL rendered a run on this machine, the .secrets.env files it left there (private from creation), and its scripts;
    a SLURM dry-run's scripts exist only in NEL's printout."""
    if not answer.get("ok"):
        return None, [], []
    if (output_dir := executors.for_name(answer.get("executor")).local_path(answer["output_dir"])) is None:
        return None, [], [(name, None, body) for name, body in _split_printed_scripts(answer.get("printed", ""))]
    candidates = sorted(output_dir.glob(f"*-{answer.get('invocation_id')}"))
    if not candidates:
        return None, [], []
    invocation_dir = candidates[-1]
    protected = secrets_files(invocation_dir)
    scripts = [(str(path.relative_to(invocation_dir)), path, path.read_text(errors="replace"))
               for path in sorted([*invocation_dir.glob("*.sh"), *invocation_dir.glob("*/run.sh")])]
    return invocation_dir, protected, scripts


def dry_run(plan: LaunchPlan, progress: ProgressFn) -> DryRunOutput:
    config_path, overrides = plan.config_path, plan.override_list
    progress(0, 2, "NEL dry-run (composes the config and renders the scripts, ~5 s)")
    answer = nelexec.call("run", DRY_RUN_TIMEOUT_S, config_path=config_path, overrides=overrides,
                          extra_overrides=[], tasks=[], dry_run=True)
    progress(1, 2, "collecting rendered scripts")
    invocation_dir, protected, scripts = _rendered_files(answer)
    secrets = secret_values(protected)
    rendered = [rendered_script(name, path, body, secrets) for name, path, body in scripts[:MAX_SCRIPTS]]
    warnings = [NelWarning(task=w.get("task"), message=scrub(w["message"], secrets)) for w in answer.get("warnings") or []]
    error = None if answer.get("ok") else scrub(answer.get("error", ""), secrets)
    record = ledger.add("dry_run", status="passed" if answer.get("ok") else "failed", config_path=config_path,
                        config_hash=answer.get("config_hash"), invocation_id=answer.get("invocation_id"),
                        executor=answer.get("executor"), host=answer.get("host"),
                        details={"engine": "nel", "invocation_dir": str(invocation_dir) if invocation_dir else None,
                                 "error": error, "overrides": overrides}, message=error)
    progress(2, 2, "done")
    return DryRunOutput(ok=bool(answer.get("ok")), record_id=record.id, config_hash=answer.get("config_hash"),
                        executor=answer.get("executor"), invocation_id=answer.get("invocation_id"),
                        invocation_dir=str(invocation_dir) if invocation_dir else None, scripts=rendered,
                        nel_warnings=warnings, secrets_files_protected=[str(path) for path in protected], error=error)


# ---------------------------------------------------------------- launch


def repeat_overrides(doc: dict, repeats: int) -> tuple[list[str], list[str]]:
    """Overrides that run every repeated task `repeats` times, and a note per task changed.

    Repeats live in params.extra (num_repeats for NeMo-Skills, n_samples for simple-evals) of a task or of the
    evaluation-wide nemo_evaluator_config; a task's own value wins over the global one, so each is overridden where
    the config sets it, by list index (task names may hold dots, which NEL's task-name override sugar cannot take).
    """
    evaluation = doc.get("evaluation")
    evaluation = evaluation if isinstance(evaluation, dict) else {}
    task_list = evaluation.get("tasks") if isinstance(evaluation.get("tasks"), list) else []
    places = [("evaluation", "every task", evaluation)]
    places += [(f"evaluation.tasks.{index}", str(task.get("name")), task) for index, task in enumerate(task_list)
               if isinstance(task, dict)]
    overrides, notes = [], []
    for prefix, name, node in places:
        params = ((node.get("nemo_evaluator_config") or {}).get("config") or {}).get("params") or {}
        extra = params.get("extra") or {}
        for key in REPEAT_KEYS:
            value = extra.get(key)
            if isinstance(value, int) and value != repeats:
                overrides.append(REPEAT_OVERRIDE.format(prefix=prefix, key=key, value=repeats))
                notes.append(f"{name}: the canary runs {key}={repeats} (config: {value}); the full run uses {value}.")
    return overrides, notes


def launch(record: ledger.Record, plan: LaunchPlan, tasks: list[str], canary: CanarySpec | None, details: dict,
           progress: ProgressFn) -> LaunchOutput:
    config_path, overrides = plan.config_path, plan.override_list
    kind = record.kind
    extra: list[str] = []
    notes: list[str] = []
    if canary:
        progress(0, 3, "composing the config")
        repeat, notes = repeat_overrides(plan.doc, canary.repeats) if canary.repeats else ([], [])
        extra = [LIMIT_SAMPLES_OVERRIDE.format(canary.limit), *repeat]
        details = {**details, "limit_samples": canary.limit, "repeats": canary.repeats, "canary_overrides": repeat}
    progress(1, 3, f"submitting the {kind.replace('_', ' ')} through NEL")
    answer = nelexec.call("run", LAUNCH_TIMEOUT_S, config_path=config_path, overrides=overrides, extra_overrides=extra,
                          tasks=tasks, dry_run=False)
    details = {**details, "engine": "nel", "overrides": overrides}
    if not answer.get("ok"):
        error = scrub(answer.get("error", "unknown error"))
        ledger.update(record.id, status="failed", config_hash=answer.get("config_hash"), executor=answer.get("executor"),
                      host=answer.get("host"), details={**details, "error": error}, message=f"launch failed: {error}")
        raise ToolError(f"NEL could not launch the {kind.replace('_', ' ')}: {error}")
    progress(2, 3, "recording the run")
    record = ledger.update(record.id, status="submitted", config_hash=answer["config_hash"],
                           invocation_id=answer["invocation_id"], executor=answer["executor"], host=answer.get("host"),
                           details={**details, "tasks": tasks or answer.get("tasks", [])}, message="submitted through NEL")
    _protect_remote_secrets(record)
    progress(3, 3, f"submitted as {answer['invocation_id']}")
    return LaunchOutput(record_id=record.id, kind=kind, invocation_id=record.invocation_id or "",
                        config_hash=answer["config_hash"], executor=answer["executor"], host=answer.get("host"),
                        status=record.status, gate=details.get("gate"), notes=notes)


def _protect_remote_secrets(record: ledger.Record) -> None:
    """NEL rsyncs .secrets.env to a cluster mode 644; its executor makes them private there (a no-op elsewhere)."""
    executor = executors.for_name(record.executor)
    try:
        executor.protect_secrets(_adopted(executor, record))
    except (Unreachable, ToolError) as exc:
        ledger.update(record.id, message=f"could not chmod the remote .secrets.env: {exc}")


# ---------------------------------------------------------------- the jobs and who answers for them


class NelJob(BaseModel):
    """A job NEL's API answers for: NEL's job id, its invocation and the output directory NEL recorded for it."""
    job_id: str
    invocation_id: str
    output_dir: str | None = None

    def log_files(self) -> list[Path]:
        """NEL writes a job's logs under its task directory's logs/ and the invocation's."""
        if not self.output_dir:
            return []
        task_dir = Path(self.output_dir)
        return sorted(path for directory in (task_dir / "logs", task_dir.parent / "logs") if directory.is_dir()
                      for path in directory.iterdir() if path.is_file())


class NelApiExecutor(Executor):
    """The jobs of NEL's executors that quanteval cannot watch itself (local: NEL's Docker containers, not quanteval's
    process groups; lepton): NEL's API answers for them (status, kill) and their logs are read where NEL writes them.
    Only the jobs are NEL's: where the run's files lie is `place`'s, the executor of the same name."""

    def __init__(self, place: Executor) -> None:
        self.place = place
        self.name = place.name  # type: ignore[misc]

    def states(self, jobs: list[NelJob]) -> list[JobStatus]:
        statuses = []
        for invocation in dict.fromkeys(job.invocation_id for job in jobs):
            answer = _nel("status", QUERY_TIMEOUT_S, invocation_id=invocation)
            statuses += [JobStatus(job_id=row["job_id"] or invocation, status=NEL_STATE.get(row["status"], "unknown"),
                                   progress=row.get("progress"), note=row.get("error")) for row in answer["jobs"]]
        return statuses

    def cancel(self, jobs: list[NelJob], grace_s: float = 10.0) -> str:
        for invocation in dict.fromkeys(job.invocation_id for job in jobs):
            _nel("kill", QUERY_TIMEOUT_S, invocation_id=invocation)
        return "killed through NEL"

    def log_lines(self, jobs: list[NelJob], lines: int) -> tuple[str, list[str]]:
        tails = [tail for job in jobs for tail in read_log_failures(job.log_files(), lines)[0]]
        return ", ".join(file for file, _ in tails), [line for _, content in tails for line in content]

    def fetch(self, job: NelJob, into: Path, patterns: tuple[str, ...], directory: str | None = None) -> Path:
        if not (directory or job.output_dir):
            raise ToolError(f"{job.job_id}: NEL recorded no output directory for it.")
        return Path(directory or job.output_dir or "")

    def log_failures(self, job: NelJob, lines: int, max_hits: int) -> LogFailures:
        return read_log_failures(job.log_files(), lines)


# ---------------------------------------------------------------- state


def _jobs(record: ledger.Record) -> list[dict]:
    if not record.invocation_id:
        raise ToolError(f"{record.id}: this {record.kind} has no NEL invocation (its launch failed); nothing to ask.")
    jobs = _nel("jobs", QUERY_TIMEOUT_S, invocation_id=record.invocation_id)["jobs"]
    if not jobs:
        raise ToolError(f"{record.id}: NEL's execution database has no jobs for invocation {record.invocation_id} "
                        "(was NEMO_EVALUATOR_EXEC_DB_FILE changed?).")
    return jobs


def _recorded(job: dict) -> dict[str, Any]:
    """What NEL recorded of a job, by ClusterJob's field names, for the record's executor to adopt (NEL's SLURM jobs
    record their login, run directory and job id; its other jobs none of these)."""
    data = job["data"]
    return {"hostname": data.get("hostname"), "username": data.get("username"), "remote_dir": data.get("remote_rundir_path"),
            "slurm_job_id": str(data.get("slurm_job_id")), "chain_file": NEL_CHAIN_FILE}


def _watch(record: ledger.Record, jobs: list[dict]) -> tuple[Executor, list[Any]]:
    """The executor that answers for the run's jobs and its handles for them: the record's executor where it adopts
    NEL's jobs (SLURM: read from the cluster itself), else NelApiExecutor over the same place."""
    executor = executors.for_name(record.executor)
    handles = [executor.adopt(job["job_id"], _recorded(job)) for job in jobs]
    if all(handle is not None for handle in handles):
        return executor, handles
    return NelApiExecutor(executor), [NelJob(job_id=job["job_id"], invocation_id=record.invocation_id or "",
                                             output_dir=job["data"].get("output_dir")) for job in jobs]


def _adopted(executor: Executor, record: ledger.Record) -> Iterator[Any]:
    """The run's jobs as the executor adopts them, asked of NEL only once the executor reads them: an executor without
    the extra they are passed to (protect_secrets, cancel_leftovers) never does."""
    for job in _jobs(record):
        yield executor.adopt(job["job_id"], _recorded(job))


def refresh(record: ledger.Record) -> Refreshed:
    """Ask NEL/SLURM for the current state and record a change in the ledger; an unreachable cluster changes nothing."""
    if not record.invocation_id or record.kind == "dry_run":
        return Refreshed(record=record, jobs=[], reachable=True, message=record.details.get("error"))
    jobs = _jobs(record)
    try:
        executor, handles = _watch(record, jobs)
        statuses = executor.states(handles)
        status = overall_status([job.status for job in statuses])
        if status in FINISHED:
            executor.cancel_unrunnable(handles, statuses)
    except Unreachable as exc:
        ledger.update(record.id, message=f"status poll failed: {exc}")
        return Refreshed(record=ledger.get(record.id), jobs=[], reachable=False,
                         message=f"{exc}. Status unchanged ({record.status}); retry run_status later.")
    updated = ledger.update(record.id, status=status, details={"jobs": {job.job_id: job.status for job in statuses}},
                            only_from=(record.status,))  # not over a kill or cancel written since the read
    return Refreshed(record=updated, jobs=statuses, reachable=True, message=None)


def results_location(record: ledger.Record) -> str:
    """The invocation directory as validate_run takes it: a local path, or host:path for SLURM (from NEL's job records)."""
    data = _jobs(record)[0]["data"]
    if "remote_rundir_path" in data:
        return f"{data['hostname']}:{Path(data['remote_rundir_path']).parent}"
    return str(Path(data["output_dir"]).parent)


def poll_interval_s(record: ledger.Record) -> float:
    return executors.for_name(record.executor).poll_interval_s


def record_paths(record: ledger.Record, resuming: bool) -> list[tuple[str, Path]]:
    """The run's config, the directory a dry-run rendered into and each job's output directory (its run.sh, which
    resume re-runs, and its logs), as NEL recorded them; none for a run elsewhere (NEL is then not asked for its jobs)."""
    def found() -> Iterator[tuple[str, Any]]:
        yield "config_path", record.config_path
        yield "invocation_dir", record.details.get("invocation_dir")
        if record.invocation_id and record.kind != "dry_run":
            yield from ((f"job {job['job_id']} output_dir", job["data"].get("output_dir")) for job in _jobs(record))

    return executors.for_name(record.executor).local_paths(found())


# ---------------------------------------------------------------- logs


def logs(record: ledger.Record, lines: int, job_id: str | None, progress: ProgressFn) -> RunLogsOutput:
    jobs = [job for job in _jobs(record) if job_id in (None, job["job_id"])]
    if not jobs:
        raise ToolError(f"job: {job_id} is not part of {record.invocation_id}. run_status lists its jobs.")
    tails: list[LogTail] = []
    hits: list[FailureHit] = []
    secrets = secret_values()
    executor, handles = _watch(record, jobs)
    for index, (job, handle) in enumerate(zip(jobs, handles, strict=True)):
        progress(index, len(jobs), f"reading logs of {job['job_id']}")
        try:  # a job's log tails and its lines of known failure classes: grepped on the cluster, or read here
            job_tails, job_hits = executor.log_failures(handle, lines, MAX_HITS * 2)
        except Unreachable as exc:
            raise ToolError(f"{record.host}: {exc}. Check the host with ssh_check and retry.") from None
        tails.extend(LogTail(job_id=job["job_id"], file=file, lines=shown_lines(lines, secrets)) for file, lines in job_tails)
        hits.extend(FailureHit(failure_class=failures.classify(text) or "exception", file=file, line=number,
                               text=shown_line(text, secrets)) for file, number, text in job_hits)
    classes = [name for name in failures.FAILURE_ADVICE if any(hit.failure_class == name for hit in hits)]
    diagnosis = None
    if record.status in ACTIVE:  # the diagnosis is for a run that has failed: ask whether it has
        record = refresh(record).record
    if record.status == "failed":
        last = [line for tail in tails for line in tail.lines]
        diagnosis = failures.diagnose([(hit.file, hit.line, hit.text) for hit in hits], last)
    return RunLogsOutput(record_id=record.id, invocation_id=record.invocation_id, tails=tails,
                         failures=hits[:MAX_HITS], failures_truncated=len(hits) > MAX_HITS, failure_classes=classes,
                         diagnosis=diagnosis)


# ---------------------------------------------------------------- kill / resume


def _cancel_chain_leftovers(record: ledger.Record) -> None:
    """NEL cancels the first SLURM job only; once auto-resume moved on, the chain's current job and its restart job are
    what runs, so the executor cancels those as well (a no-op where jobs have no chain)."""
    executor = executors.for_name(record.executor)
    try:
        executor.cancel_leftovers(_adopted(executor, record))
    except Unreachable as exc:
        ledger.update(record.id, message=f"kill: could not check the restart chain: {exc}")


def kill(record: ledger.Record, progress: ProgressFn) -> KillRunOutput:
    progress(0, 2, "killing through NEL")
    answer = _nel("kill", QUERY_TIMEOUT_S, invocation_id=record.invocation_id or "")
    results = [JobStatus(job_id=row["job_id"] or "", status="killed" if row["status"] == "killed" else "unknown",
                         note=row.get("error")) for row in answer["jobs"]]
    progress(1, 2, "cancelling the rest of the auto-resume chain")
    _cancel_chain_leftovers(record)
    refreshed = refresh(ledger.get(record.id))
    status = refreshed.record.status
    if any(job.status == "killed" for job in results) and (status in ACTIVE or not refreshed.reachable):
        # scancel / docker stop was accepted; the executor may still be winding the job down.
        status = ledger.update(record.id, status="killed", message="kill_run").status
    elif status in ACTIVE or not refreshed.reachable:
        errors = "; ".join(f"{job.job_id}: {job.note}" for job in results if job.note) or "no job was killed"
        raise ToolError(f"kill_run: NEL could not stop {record.invocation_id} ({errors}). It is still {status}; "
                        "check the host with ssh_check and retry.")
    progress(2, 2, status)
    return KillRunOutput(record_id=record.id, status=status, jobs=results)


def resume(record: ledger.Record, progress: ProgressFn) -> ResumeRunOutput:
    progress(0, 1, "resuming through NEL")
    answer = _nel("resume", LAUNCH_TIMEOUT_S, invocation_id=record.invocation_id)
    updated = ledger.update(record.id, status="submitted", message="resumed through NEL")
    progress(1, 1, "resumed")
    return ResumeRunOutput(record_id=updated.id, invocation_id=answer["invocation_id"], status=updated.status)
