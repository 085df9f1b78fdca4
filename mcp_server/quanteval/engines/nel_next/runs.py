"""nel-next's run lifecycle: a run is a `nel eval run` child on this machine (its record keeps run_dir, pid and the
overrides), or one sbatch job per shard on a SLURM cluster (its record keeps slurm_jobs), watched by the SLURM executor.
"""

from __future__ import annotations

import os
import re
import shlex
import time
from pathlib import Path

from quanteval import failures, ledger
from quanteval.clusters import executor as executors
from quanteval.clusters.executor import JobStatus, LogFailures, Unreachable, read_log_failures
from quanteval.engines.base import (
    ACTIVE,
    MAX_HITS,
    MAX_SCRIPTS,
    CanarySpec,
    Composed,
    DryRunOutput,
    FailureHit,
    KillRunOutput,
    LaunchOutput,
    LogTail,
    Refreshed,
    RenderedScript,
    ResumeRunOutput,
    RunLogsOutput,
    overall_status,
)
from quanteval.engines.launchplan import LaunchPlan
from quanteval.engines.nel_next import clustertypes, config, nelnext, nextresults, servers, skills
from quanteval.engines.rendering import rendered_script
from quanteval.models import ProgressFn, ToolError
from quanteval.redact import secret_values, shown_line, shown_lines
from quanteval.serving.deployment import serving_at

local_programs = {name: row.binaries for name, row in clustertypes.CLUSTER_TYPES.items()}
NOT_FINISHED = "its job ended ({how}) without finishing it"


def read_launch(config_path: str, overrides: list[str]) -> nelnext.NextReading:
    """What a launch plan keeps of the config: nel-next's own reading (its schema check, one child)."""
    return nelnext.check_schema(config_path, overrides)


def launch_paths(plan: LaunchPlan) -> list[tuple[str, Path]]:
    return config.launch_paths(plan.reading, plan.config_path)

def compose(plan: LaunchPlan) -> Composed:
    return Composed(config_hash=nelnext.config_hash(plan.config_path, plan.override_list),
                    tasks=plan.reading.benchmarks)


def dry_run(plan: LaunchPlan, progress: ProgressFn) -> DryRunOutput:
    """nel-next has nothing to render for the local cluster: its own schema check is the dry-run."""
    config_path, overrides, checked = plan.config_path, plan.override_list, plan.reading
    error = None
    if not checked.ok:
        error = "; ".join(f"{p['path'] or '(config)'}: {p['message']}" for p in checked.problems[:5])
    command = [*nelnext.nel_command(), "eval", "run", config_path, *[x for o in overrides for x in ("-O", o)]]
    record = ledger.add("dry_run", status="failed" if error else "passed", config_path=config_path,
                        config_hash=nelnext.config_hash(config_path, overrides), executor=checked.cluster,
                        details={"engine": "nel-next", "error": error, "overrides": overrides}, message=error)
    text = shlex.join(command)
    scripts = [RenderedScript(name="nel eval run", path=None, size_bytes=len(text), head=[text])]
    if error is None:
        scripts += skills_prompts((checked.resolved or {}).get("benchmarks") or [])
    if error is None and (cluster := clustertypes.of(checked.cluster)) and cluster.submits:
        rendered, error = nelnext.render_sbatch(config_path, overrides)
        secrets = secret_values()
        scripts += [rendered_script(path.name, path, body, secrets) for path, body in rendered[:MAX_SCRIPTS]]
        if error:
            ledger.update(record.id, status="failed", details={"error": error}, message=error)
    return DryRunOutput(ok=error is None, record_id=record.id, config_hash=record.config_hash, executor=checked.cluster,
                        invocation_id=None, invocation_dir=None, scripts=scripts, secrets_files_protected=[], error=error)


def skills_prompts(benchmarks: list[dict]) -> list[RenderedScript]:
    """What each skills:// benchmark's first problem is sent as (nel-next's system prompt and template rendering)."""
    names = skills.skills_names(benchmarks)
    if not names:
        return []
    found = skills.probe(list(names.values()))
    shown = []
    for index, name in names.items():
        bench, item = found.benchmarks.get(name), benchmarks[index]
        rendered = skills.rendered_prompt(item, bench) if bench else None
        if rendered is None:
            continue
        system = (item.get("solver") or {}).get("system_prompt")
        source = f"NeMo-Skills {prompt}" if (prompt := skills.prompt_name(item)) else (
            "instruction_template" if item.get("instruction_template") else "the bare problem: no instruction_template")
        lines = ([f"[system] {system}"] if system else []) + [f"[user] {line}" if i == 0 else line
                                                              for i, line in enumerate(rendered.splitlines())]
        shown.append(RenderedScript(name=f"prompt of skills://{name}, problem 1 ({source})", path=bench.data_file,
                                    size_bytes=len(rendered), head=lines[:40]))
    return shown


# ---------------------------------------------------------------- launch


def check_launchable(plan: LaunchPlan) -> None:
    """Refuse before the run is recorded: a config nel-next rejects, a machine without what the launch runs here, or a
    cluster without the files its job reads by path. The one launch check: launch trusts the plan it passed."""
    if problem := nelnext.launch_blocker(plan.reading) or nelnext.node_files_blocker(plan.reading, plan.config_path):
        raise ToolError(problem)


def _run_dir(config_path: str, cluster: clustertypes.ClusterType, checked: nelnext.NextReading, kind: str) -> Path:
    """A directory of its own for the run under output.dir: here, relative to the config as nel-next resolves it; on a
    cluster, the path there as written."""
    here = cluster.executor.local_path(Path(config_path).parent / Path(str(checked.output_dir)).expanduser())
    base = Path(str(checked.output_dir)) if here is None else here
    return base / f"{kind.replace('_', '-')}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid() % 10000:04d}"


def _model_facts(plan: LaunchPlan) -> dict:
    """The checkpoint and served facts behind the config's model service, recorded with the run: compare_results
    checks from them that baseline and candidate are one model family served alike (by a server quanteval started:
    its framework, release and numeric path)."""
    try:
        _, service = config.model_service(plan.doc, plan.config_path)
    except ToolError:
        return {}
    directory, served = config.service_model(service)
    url = service.get("url")
    serving = serving_at(url) if service.get("type") == "api" and isinstance(url, str) else None
    return {"checkpoint": directory, "served": served or {}, "serving": serving}


def launch(record: ledger.Record, plan: LaunchPlan, tasks: list[str], canary: CanarySpec | None, details: dict,
           progress: ProgressFn) -> LaunchOutput:
    """nel-next runs every benchmark of the config: `tasks` narrows nothing here. The plan was checked
    (check_launchable) before the record was written."""
    kind, config_path, overrides, checked = record.kind, plan.config_path, plan.override_list, plan.reading
    progress(1, 3, f"starting the nel-next {kind.replace('_', ' ')}")
    extra: list[str] = []
    notes: list[str] = []
    if canary:
        extra = nelnext.canary_overrides(len(checked.benchmarks), canary.limit, canary.repeats)
        notes.append(f"The canary runs max_problems={canary.limit}" + (f" and repeats={canary.repeats}" if canary.repeats else "")
                     + " per benchmark; the full run uses the config's.")
    cluster = clustertypes.launched(checked.cluster)
    run_dir = _run_dir(config_path, cluster, checked, kind)
    if cluster.submits:  # nel-next's submit takes no -o: each run's own directory on the cluster as output.dir
        extra.append(f"output.dir={run_dir.as_posix()}")
    extra += servers.port_overrides(plan.doc, overrides)
    if not details.get("checkpoint"):
        details = {**details, **_model_facts(plan)}
    details = {**details, "canary_overrides": extra, "limit_samples": canary.limit if canary else None,
               "repeats": canary.repeats if canary else None}
    continued = _in_canary_job(record, config_path, overrides, extra, checked, details) if cluster.submits else None
    if continued is not None:
        record = continued
    else:
        extra = [*extra, *([] if canary else nelnext.without_hold(checked.resolved or {}))]  # no next run to serve on for
        record = nelnext.launch(record, config_path, overrides, extra, checked, cluster, run_dir, details)
    jobs = record.details.get("slurm_jobs")
    progress(3, 3, f"submitted to {record.host}: SLURM job {', '.join(j['job_id'] for j in jobs)}" if jobs
             else f"running in {run_dir}")
    return LaunchOutput(record_id=record.id, kind=kind, invocation_id=record.invocation_id or "",
                        config_hash=record.config_hash or "", executor=record.executor or executors.LOCAL.name,
                        host=record.host, status=record.status, gate=details.get("gate"), notes=notes)


def _in_canary_job(record: ledger.Record, config_path: str, overrides: list[str], extra: list[str],
                   checked: nelnext.NextReading, details: dict) -> ledger.Record | None:
    """A full run in the job of the canary that vouched for it, where that job serves on for it (nel_cli's hold: a
    cluster evaluation's canary): no second job, no second server start. None where it does not."""
    vouched_by = details.get("vouched_by")
    if record.kind != "full_run" or not vouched_by:
        return None
    run_overrides = [*overrides, *extra]
    return nelnext.continue_in_job(record, ledger.get(vouched_by), config_path, run_overrides,
                                   nelnext.with_overrides(checked.resolved or {}, extra),
                                   {**details, "overrides": overrides, "run_overrides": run_overrides,
                                    "tasks": checked.benchmarks})


# ---------------------------------------------------------------- state, through the run's executor


def _ended(statuses: list[JobStatus]) -> bool:
    return all(job.status not in ("pending", "running", "resuming") for job in statuses)


def refresh(record: ledger.Record) -> Refreshed:
    """The run's jobs as its executor reports them (the local `nel eval run`, or one SLURM job per shard); once all
    ended, what nel-next itself recorded decides: a job can end well with a benchmark failed (`nel eval run` has
    exited 0 with one, a SLURM job has ended COMPLETED with one), or with one never finished."""
    if not record.invocation_id or record.kind == "dry_run" or record.status in ("killed", "cancelled"):
        return Refreshed(record=record, jobs=[], reachable=True, message=record.details.get("error"))
    try:
        executor, jobs = executors.for_name(record.executor), nelnext.jobs(record.details)
        statuses = executor.states(jobs)
        outcome = nextresults.run_outcome(results_dir(record)) if _ended(statuses) else None
        if outcome is not None:
            executor.cancel_unrunnable(jobs, statuses)
    except Unreachable as exc:
        ledger.update(record.id, message=f"status poll failed: {exc}")
        return Refreshed(record=ledger.get(record.id), jobs=[], reachable=False,
                         message=f"{exc}. Status unchanged ({record.status}); retry run_status later.")
    message = None
    if outcome is not None:
        benchmarks = list(record.details.get("tasks") or [])
        failed = {name: shown_line(str(error)) for name, error in outcome.failed.items()}
        how = ", ".join(job.note for job in statuses if job.note) or "exit 0"
        failed.update({name: NOT_FINISHED.format(how=how) for name in benchmarks if name not in outcome.completed and name not in failed})
        if failed or not benchmarks:
            message = "; ".join(f"{name}: {error}" for name, error in failed.items())[:500] or "no benchmark completed"
            statuses = [job.model_copy(update={"status": "failed" if job.status == "succeeded" else job.status,
                                               "note": job.note or f"nel-next failed {', '.join(failed) or 'every benchmark'}"})
                        for job in statuses]
    status = overall_status([job.status for job in statuses])
    updated = ledger.update(record.id, status=status, details={"jobs": {job.job_id: job.status for job in statuses},
                                                               "error": message},
                            message=message if message and record.status != status else None,
                            only_from=(record.status,))  # not over a kill or cancel written since the read
    return Refreshed(record=updated, jobs=statuses, reachable=True, message=message)


def results_dir(record: ledger.Record) -> Path:
    """The run's directory, where this process can read it: the run's own here; for a run on a SLURM cluster a fresh
    local copy, shards merged."""
    return nelnext.fetch_results(executors.for_name(record.executor), record.details)


def results_location(record: ledger.Record) -> str:
    return record.id  # nel-next's results reader reads a run it recorded by its id, fetching it from a cluster


def poll_interval_s(record: ledger.Record) -> float:
    return executors.for_name(record.executor).poll_interval_s


def record_paths(record: ledger.Record, resuming: bool) -> list[tuple[str, Path]]:
    """The run's config, run directory and log here; resuming re-reads the config with the run's overrides, so every
    path that launch reads too. None for a run on a SLURM cluster."""
    executor = executors.for_name(record.executor)
    found = [("config_path", record.config_path), *((key, record.details.get(key)) for key in ("run_dir", "log_path"))]
    paths = executor.local_paths(found)
    if paths and resuming and record.config_path:
        overrides = record.details.get("run_overrides") or record.details.get("overrides") or []
        paths += config.launch_paths(nelnext.check_schema(record.config_path, overrides), record.config_path)
    return paths


# ---------------------------------------------------------------- logs, kill, resume


def _log_lines(record: ledger.Record, lines: int) -> tuple[str, list[str]]:
    """Where the run's log is, and its lines: the local child's log file, or each shard's SLURM job logs (up to its
    last four jobs: nel-next's logs/slurm-ID.log, the eval's output tee'd in)."""
    try:
        return executors.for_name(record.executor).log_lines(nelnext.jobs(record.details), max(lines, 200))
    except Unreachable as exc:
        raise ToolError(f"run_logs: {exc}; retry when the cluster answers.") from None


# The log nel-next's SLURM job script writes per service (slurm_gen: logs/server-NAME-JOBID.log, and a link
# server-NAME.log to the newest, left out here as a copy)
JOB_SERVER_LOG = re.compile(r"/server-.+-\d+\.log$")


def _server_logs(record: ledger.Record, lines: int) -> LogFailures:
    """The output of the run's managed servers: a local run's logs/ (servers.py); on a cluster, each job's
    server-NAME-JOBID.log in its logs/ (one ssh call per job directory)."""
    run_dir = record.details.get("run_dir")
    executor = executors.for_name(record.executor)
    here = executor.local_path(run_dir) if run_dir else None
    if here is not None:
        return read_log_failures(sorted(here.glob(servers.SERVER_LOG_GLOB)), lines)
    tails: list[tuple[str, list[str]]] = []
    hits: list[tuple[str, int, str]] = []
    if not record.details.get("slurm_jobs"):
        return tails, hits
    for job in {job.remote_dir: job for job in nelnext.cluster_jobs(record.details)}.values():  # shards share one
        try:
            job_tails, job_hits = executor.log_failures(job, lines, MAX_HITS)
        except Unreachable:
            continue
        tails += [(file, tail) for file, tail in job_tails if JOB_SERVER_LOG.search(file)]
        hits += [hit for hit in job_hits if JOB_SERVER_LOG.search(hit[0])]
    return tails, hits


def logs(record: ledger.Record, lines: int, job_id: str | None, progress: ProgressFn) -> RunLogsOutput:
    path, content = _log_lines(record, lines)
    server_tails, server_hits = _server_logs(record, lines)
    secrets = secret_values()
    shown = shown_lines(content, secrets)  # the log masked as one block: a key wrapped onto the next line is masked on both
    found = [(path, number, text, shown[number - 1].strip()) for number, text in enumerate(content, 1) if failures.classify(text)]
    found += [(file, number, text, shown_line(text, secrets)) for file, number, text in server_hits]
    hits = [FailureHit(failure_class=failures.classify(text) or "exception", file=file, line=number, text=masked)
            for file, number, text, masked in found]
    tail = shown_lines(content[-lines:], secrets)
    tails = [LogTail(job_id="nel eval run", file=path, lines=tail),
             *(LogTail(job_id=f"model server ({Path(file).name})", file=file, lines=shown_lines(server_tail, secrets))
               for file, server_tail in server_tails)]
    record = refresh(record).record if record.status in ACTIVE else record
    diagnosis = None
    if record.status == "failed":
        error = record.details.get("error")
        last = ([error] if error else []) + tail + [line for server in tails[1:] for line in server.lines]
        diagnosis = failures.diagnose([(hit.file, hit.line, hit.text) for hit in hits], last)
    classes = [name for name in failures.FAILURE_ADVICE if any(hit.failure_class == name for hit in hits)]
    return RunLogsOutput(record_id=record.id, invocation_id=record.invocation_id, tails=tails, failures=hits[:MAX_HITS],
                         failures_truncated=len(hits) > MAX_HITS, failure_classes=classes, diagnosis=diagnosis)


LIVE = (*ACTIVE, "launching")  # the statuses kill_run may change to killed


def kill(record: ledger.Record, progress: ProgressFn) -> KillRunOutput:
    # A stop changes only a live status: a run that ended (since the last poll too) keeps its outcome, so a canary
    # that succeeded still lets the full run through the gate.
    record = refresh(record).record if record.status in LIVE else record
    if record.status not in LIVE:
        if nelnext.release_hold(record):  # its job serves on for a next run that will not come now: it ends
            ledger.update(record.id, message="kill_run: its job, serving on for a next run, was told none comes")
        return KillRunOutput(record_id=record.id, status=record.status, jobs=[])
    jobs = nelnext.jobs(record.details)
    try:
        how = executors.for_name(record.executor).cancel(jobs)
    except Unreachable as exc:
        raise ToolError(f"kill_run: {exc}; nothing was cancelled, retry.") from None
    except ToolError as exc:
        raise ToolError(f"kill_run: {record.id}: {exc}") from None
    updated = ledger.update(record.id, status="killed", message=f"kill_run: {how}", only_from=LIVE)
    return KillRunOutput(record_id=record.id, status=updated.status,
                         jobs=[JobStatus(job_id=job.job_id, status="killed") for job in jobs])


def resume(record: ledger.Record, progress: ProgressFn) -> ResumeRunOutput:
    try:
        statuses = executors.for_name(record.executor).states(nelnext.jobs(record.details))
    except Unreachable as exc:
        raise ToolError(f"resume_run: {exc}; retry when the cluster answers.") from None
    if not _ended(statuses):
        raise ToolError(f"{record.id} is still queued or running; resume_run is for a killed or failed run.")
    status, details, message = nelnext.resume(record.config_path or "", record.details)
    updated = ledger.update(record.id, status=status, details={**details, "exit_code": None, "error": None}, message=message)
    return ResumeRunOutput(record_id=updated.id, invocation_id=updated.invocation_id or "", status=updated.status)
