"""evaluate_quantization as a job of its own process, for clients that give up on a request after a fixed time.

The MCP Inspector CLI and the TypeScript SDK's client time a request out at 60 s and (by default) neither asks for
progress, so no notification can keep a minutes-long tools/call alive; the Inspector CLI also starts a new stdio server
per call, so the evaluation must outlive the server that started it. start_evaluation records an `evaluation` in the
ledger, then starts `python -m quanteval.workflow.evaluate_job RECORD` in its own session and returns; the job writes
its progress and, at the end, its result into the record. wait_for_run / run_status read it, kill_run stops it (the
job stops the servers and runs it started, as evaluate_quantization does when interrupted).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from quanteval import failures, ledger, paths, redact
from quanteval.clusters.executor import LOCAL, LocalJob
from quanteval.engines.base import FailureHit, KillRunOutput, LogTail, Refreshed, ResumeRunOutput, RunLogsOutput
from quanteval.models import ProgressFn, ToolError

KIND: ledger.RecordKind = "evaluation"
JOB_MODULE = "quanteval.workflow.evaluate_job"
STOP_GRACE_S = 60.0  # the job stops a vLLM server (20 s grace) and a nel-next run before it exits
JOB, LOG_NAME, EXIT_NAME = "evaluation", "job.log", "exit_code"



def start(request: dict[str, Any], root: Path | None = None) -> ledger.Record:
    """Record the evaluation, then start its process; the record carries the pid, log and result paths (and the
    workspace root of the MCP server that started it, which the job keeps to)."""
    jobs = paths.make_dir(paths.call_state_dir() / "evaluations" / "jobs")  # checked before anything is recorded
    record = ledger.add(KIND, status="running", executor="local",
                        details={"request": request, "root": str(root) if root is not None else None})
    job_dir = paths.make_dir(jobs / record.id)
    log_path, result_path = job_dir / LOG_NAME, job_dir / "result.json"
    ledger.update(record.id, details={"log_path": str(log_path), "result_path": str(result_path)})  # before the job reads them
    package_root = str(Path(__file__).resolve().parents[2])  # the job imports this same quanteval
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    job = LOCAL.start(JOB, [sys.executable, "-m", JOB_MODULE, record.id], job_dir, env, log_name=LOG_NAME, exit_name=EXIT_NAME)
    return ledger.update(record.id, details={"pid": job.pgid, "pgid": job.pgid, "started_at": time.time()})


def _job(record: ledger.Record) -> LocalJob:
    """The evaluation's process as LocalExecutor finds it again, from its record."""
    log_path = Path(record.details["log_path"])
    return LocalJob(job_id=JOB, pgid=record.details["pgid"], directory=str(log_path.parent),
                    exit_file=str(log_path.parent / EXIT_NAME), log_path=str(log_path))


def refresh(record: ledger.Record) -> ledger.Record:
    """The record, marked failed when its process is gone without having said how it ended (killed -9, a crash)."""
    if record.status == "running" and "pgid" in record.details and not LOCAL.running(_job(record)):
        # only while still running: it may have recorded how it ended between the read and now
        record = ledger.update(record.id, status="failed", only_from=("running",), details={"error": (
            f"the evaluation process ended without a result; its log: {record.details.get('log_path')}")})
    return record


def progress_step(record: ledger.Record) -> tuple[float, float | None, str] | None:
    """The job's last step, as evaluate_quantization reported it (the CLI prints it `[8/25] message`): its number,
    the steps in all, and what it is doing; None before the first."""
    seen = record.details.get("progress")
    if not seen:
        return None
    return float(seen["done"]), float(seen["total"]) if seen.get("total") else None, str(seen.get("message") or "")


def progress_line(record: ledger.Record) -> str | None:
    step = progress_step(record)
    if step is None:
        return None
    done, total, message = step
    return ((f"[{done:g}/{total:g}] " if total else "") + message).strip()


def result(record: ledger.Record) -> dict[str, Any] | None:
    """evaluate_quantization's answer, once the job succeeded."""
    path = record.details.get("result_path")
    if record.status != "succeeded" or not path:
        return None
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def kill(record: ledger.Record) -> ledger.Record:
    """SIGTERM: the job stops its server and run and records itself cancelled; SIGKILL after STOP_GRACE_S."""
    if record.status == "running" and "pgid" in record.details:
        _stopped, _how, _left = LOCAL.stop(_job(record), STOP_GRACE_S)
    record = ledger.get(record.id)
    if record.status == "running":
        record = ledger.update(record.id, status="cancelled", message="cancelled: kill_run")
    return record


def interrupt_on_sigterm() -> None:
    """In the job: SIGTERM (kill_run) interrupts like Ctrl-C, so evaluate_quantization's cleanup runs."""
    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)


class Runs:
    """An evaluation's part of the run tools (run_status, wait_for_run, run_logs, kill_run), as a run's engine's RunRole."""

    def refresh(self, record: ledger.Record) -> Refreshed:
        record = refresh(record)
        return Refreshed(record=record, jobs=[], reachable=True, message=record.details.get("error"),
                         progress=progress_line(record), result=result(record))

    def poll_interval_s(self, record: ledger.Record) -> float:
        return LOCAL.poll_interval_s

    def logs(self, record: ledger.Record, lines: int, job_id: str | None, progress: ProgressFn) -> RunLogsOutput:
        """The job's own log (its progress, and the error that ended it), read like a run's; its servers and runs
        have their own records (list_runs; deployment_status for a server)."""
        path = Path(str(record.details.get("log_path") or ""))
        try:
            content = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
        except OSError:
            content = []
        secrets = redact.secret_values()
        hits = [FailureHit(failure_class=found, file=str(path), line=number, text=redact.shown_line(text, secrets))
                for number, text in enumerate(content, 1) if (found := failures.classify(text))]
        error = record.details.get("error")
        diagnosis = failures.diagnose([(hit.file, hit.line, hit.text) for hit in hits], ([error] if error else []) + content[-lines:]) \
            if record.status == "failed" else None
        return RunLogsOutput(record_id=record.id, invocation_id=record.invocation_id, failures=hits[:50], failures_truncated=len(hits) > 50,
                             tails=[LogTail(job_id=JOB, file=str(path), lines=redact.shown_lines(content[-lines:], secrets))],
                             failure_classes=[name for name in failures.FAILURE_ADVICE if any(h.failure_class == name for h in hits)],
                             diagnosis=diagnosis)

    def kill(self, record: ledger.Record, progress: ProgressFn) -> KillRunOutput:
        progress(0, 1, f"stopping {record.id} and the servers and runs it started")
        return KillRunOutput(record_id=record.id, status=kill(record).status, jobs=[])

    def resume(self, record: ledger.Record, progress: ProgressFn) -> ResumeRunOutput:
        raise ToolError(f"{record.id} is an evaluation: call start_evaluation again; it reuses every full run that finished.")


RUNS = Runs()
