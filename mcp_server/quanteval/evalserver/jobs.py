"""The eval server's core: slime's payload, the job queue, idempotency, cancellation and shutdown.

No HTTP here (faces/evalhttp) and no benchmark commands (nemo_skills, nel): a job runs its
benchmarks one after another through a backend; jobs of different rollouts run concurrently up to
`max_concurrent_jobs` and queue beyond it.

Idempotency: slime's client retries a request on any error or read timeout with the same payload.
A request whose key (the `Idempotency-Key` header, else rollout_id + a hash of the payload) matches
a queued, running or succeeded job attaches to that job instead of starting the evaluation again;
a failed or cancelled job is not reused, so a retry gets a fresh attempt. A job started by
`POST /evaluate` that no client waits for any more is cancelled after `orphan_grace_s`
(`POST /jobs` jobs are detached: they run to the end).
"""

from __future__ import annotations

import logging
import os
import queue
import shlex
import shutil
import subprocess
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from quanteval import forkserver, ledger
from quanteval.evalserver import nel, nemo_skills
from quanteval.evalserver.backend import Backend, BackendName, BenchmarkSpec, EvalRequest, ServerSettings, ShardCommand, tail_lines
from quanteval.localproc import stop_group
from quanteval.models import ToolError

log = logging.getLogger("quanteval.faces.evalserver")

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
FINISHED: tuple[JobStatus, ...] = ("succeeded", "failed", "cancelled")
FINISHED_JOBS_KEPT = 100  # finished jobs kept in memory for GET /jobs/<id> and idempotent retries (the ledger keeps all)


# The benchmark backends by the name ServerSettings.backend takes: each module implements Backend.
BACKENDS: dict[BackendName, Backend] = {"nemo-skills": nemo_skills, "nel": nel}  # type: ignore[dict-item]


def flatten_metrics(raw: dict[str, Any]) -> dict[str, float]:
    """`{bench: {"pass@1": {"accuracy": 70}}}` -> `{"bench/pass@1/accuracy": 70.0}`: numbers only."""
    flat: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}/{key}" if prefix else str(key), inner)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[prefix] = float(value)

    walk("", raw)
    return flat


# --------------------------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------------------------

Process = subprocess.Popen | forkserver.Started  # a command started cold, or by a fork server
FORKSERVER_LOG = "forkserver.log"


@dataclass
class Job:
    id: str
    key: str
    request: EvalRequest
    output_dir: Path
    detached: bool  # POST /jobs: runs to the end whether or not anyone waits
    status: JobStatus = "queued"
    runs: list[dict[str, Any]] = field(default_factory=list)
    raw_metrics: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    ledger_id: str | None = None
    waiters: int = 0
    orphaned_at: float | None = None
    cancel_reason: str | None = None
    processes: set[Process] = field(default_factory=set)

    def response(self) -> dict[str, Any]:
        commands = [run["command"] for run in self.runs]
        logs = [run["log_path"] for run in self.runs]
        errors = [f"{run['benchmark']}: {run['error']}" for run in self.runs if run.get("error")]
        if self.cancel_reason:
            errors.append(f"cancelled: {self.cancel_reason}")
        return {
            "job_id": self.id,
            "status": self.status,
            "rollout_id": self.request.rollout_id,
            "command": "\n".join(commands) if commands else None,
            "output_dir": str(self.output_dir),
            "log_path": logs[-1] if logs else None,
            "raw_metrics": self.raw_metrics,
            "metrics": flatten_metrics(self.raw_metrics),
            "runs": self.runs,
            "errors": errors,
        }


class ShuttingDown(Exception):
    """The server is stopping: no new jobs."""


class KeyReused(Exception):
    """A client's Idempotency-Key names a job of another payload."""


class EvalService:
    """Runs jobs: at most max_concurrent_jobs at once, the rest wait in order."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        self.backend = BACKENDS[settings.backend]
        settings.root.mkdir(parents=True, exist_ok=True)
        self._jobs: OrderedDict[str, Job] = OrderedDict()
        self._by_key: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(settings.max_concurrent_jobs)
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="eval-job")
        self.stopping: str | None = None  # the shutdown reason once shutdown began
        self._finished = {"succeeded": 0, "failed": 0, "cancelled": 0}
        self._reaper = threading.Thread(target=self._reap_orphans, name="eval-orphans", daemon=True)
        self._reaper.start()
        self._ledger_queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._ledger_writer = threading.Thread(target=self._write_ledger, name="eval-ledger", daemon=True)
        self._ledger_writer.start()
        # by (Python, preload, environment): the server that starts such commands, or None where none could start
        self._forkservers: dict[tuple, forkserver.ForkServer | None] = {}
        self._forkservers_lock = threading.Lock()

    # -- readiness ------------------------------------------------------------------------
    def backend_status(self) -> dict[str, Any]:
        return {"backend": self.settings.backend, **self.backend.readiness(self.settings)}

    def counts(self) -> dict[str, int]:
        """Jobs queued and running now, and finished since the server started (also those no longer in memory)."""
        with self._lock:
            states = [job.status for job in self._jobs.values()]
            return {"queued": states.count("queued"), "running": states.count("running"), **self._finished}

    def refuse(self, request: EvalRequest) -> str | None:
        """Why this request cannot succeed, said before any work starts (a 400), or None."""
        return self.backend.refuse(self.settings, request)

    # -- jobs -----------------------------------------------------------------------------
    def submit(self, request: EvalRequest, key: str | None = None, detached: bool = False) -> tuple[Job, bool]:
        """The job for this request: an existing one with the same key, or a new one; (job, attached)."""
        key = key or request.idempotency_key()
        with self._lock:
            if self.stopping:
                raise ShuttingDown(self.stopping)
            existing = self._by_key.get(key)
            if existing is not None and existing.request.idempotency_key() != request.idempotency_key():
                raise KeyReused(existing.id)  # attaching would answer this payload with another's results
            if existing is not None and existing.status not in ("failed", "cancelled"):
                existing.detached = existing.detached or detached
                return existing, True
            job_id = uuid.uuid4().hex[:16]
            out = self.settings.root / f"{int(time.time())}-rollout-{request.rollout_id}-{job_id[:6]}"
            job = Job(id=job_id, key=key, request=request, output_dir=out, detached=detached)
            self._jobs[job_id] = job
            self._by_key[key] = job
            self._forget_old_jobs()
        def record() -> None:
            job.ledger_id = ledger.add(
                "eval_job", status="queued", invocation_id=job_id, executor=self.settings.backend,
                details={"rollout_id": request.rollout_id, "benchmarks": [b.name for b in request.benchmarks],
                         "output_dir": str(out), "idempotency_key": key},
            ).id

        self._ledger_queue.put(record)
        self._pool.submit(self._run_job, job)
        return job, False

    def _forget_old_jobs(self) -> None:
        """Keep memory flat over days of evaluations: drop the oldest finished jobs beyond the limit."""
        finished = [job for job in self._jobs.values() if job.status in FINISHED]
        for job in finished[: max(0, len(finished) - FINISHED_JOBS_KEPT)]:
            del self._jobs[job.id]
            if self._by_key.get(job.key) is job:
                del self._by_key[job.key]

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def wait(self, job: Job, client_gone: Callable[[], bool], poll_s: float = 0.5) -> bool:
        """Block until the job finishes; False when the client went away first (the job may be orphaned)."""
        with self._lock:
            job.waiters += 1
            job.orphaned_at = None
        try:
            while not job.done.wait(poll_s):
                if client_gone():
                    return False
            return True
        finally:
            with self._lock:
                job.waiters -= 1
                if job.waiters == 0 and not job.detached and job.status not in FINISHED:
                    job.orphaned_at = time.monotonic()

    def _reap_orphans(self) -> None:
        while True:
            time.sleep(min(5.0, max(0.05, self.settings.orphan_grace_s / 4)))
            now = time.monotonic()
            with self._lock:
                orphans = [job for job in self._jobs.values()
                           if job.orphaned_at is not None and job.waiters == 0 and not job.detached
                           and job.status not in FINISHED and now - job.orphaned_at >= self.settings.orphan_grace_s]
            for job in orphans:
                log.warning("job %s (rollout %s): no client waited for %.0f s; cancelling it", job.id,
                            job.request.rollout_id, self.settings.orphan_grace_s)
                self.cancel(job, f"no client waited for its result for {self.settings.orphan_grace_s:.0f} s")

    def cancel(self, job: Job, reason: str) -> None:
        """Stop a job: no further benchmark starts, running process groups get SIGTERM then SIGKILL."""
        with self._lock:
            if job.status in FINISHED or job.cancel_reason:
                return
            job.cancel_reason = reason
            procs = list(job.processes)
        for proc in procs:
            kill_group(proc)

    def _set_status(self, job: Job, status: JobStatus) -> None:
        with self._lock:
            if status in FINISHED and job.status not in FINISHED:
                self._finished[status] += 1
            job.status = status
        details = None if status == "running" else {"metrics": flatten_metrics(job.raw_metrics)}
        message = f"cancelled: {job.cancel_reason}" if status == "cancelled" else None

        def record() -> None:
            if job.ledger_id:
                ledger.update(job.ledger_id, status=status, details=details, message=message)

        self._ledger_queue.put(record)

    def _write_ledger(self) -> None:
        """The ledger is a record, not a precondition for evaluating: one writer thread, in order, off the
        request's path (each SQLite write costs tens of ms on a busy disk); shutdown drains it."""
        while True:
            write = self._ledger_queue.get()
            if write is None:
                return
            try:
                write()
            except ToolError as exc:
                log.warning("ledger unavailable: %s", exc)
            except Exception:  # a ledger bug must not stop the writer for the days a training run lasts
                log.exception("ledger write failed")

    def _run_job(self, job: Job) -> None:
        with self._slots:
            try:
                if job.cancel_reason is None:
                    self._set_status(job, "running")
                    job.output_dir.mkdir(parents=True, exist_ok=True)
                    for bench in job.request.benchmarks:
                        if job.cancel_reason:  # shutdown or orphaned: start nothing more
                            break
                        job.runs.append(self._run_benchmark(job, bench))
                failed = any(run["status"] == "failed" for run in job.runs)
            except Exception as exc:  # a bug in this server must not leave a job hanging forever
                log.exception("job %s crashed", job.id)
                job.runs.append({"benchmark": "*", "status": "failed", "error": f"internal error: {type(exc).__name__}",
                                 "command": "", "log_path": None, "output_dir": str(job.output_dir)})
                failed = True
            job.finished_at = time.time()
            with self._lock:
                job.orphaned_at = None
            self._set_status(job, "cancelled" if job.cancel_reason else "failed" if failed else "succeeded")
            job.done.set()

    def _run_benchmark(self, job: Job, bench: BenchmarkSpec) -> dict[str, Any]:
        bench_dir = job.output_dir / bench.name
        bench_dir.mkdir(parents=True, exist_ok=True)
        run: dict[str, Any] = {"benchmark": bench.name, "output_dir": str(bench_dir), "status": "running"}
        started = time.monotonic()
        try:
            commands = self.backend.commands(self.settings, job.request, bench, bench_dir,
                                             f"rollout-{job.request.rollout_id}-{bench.name}")
        except ToolError as exc:
            return {**run, "status": "failed", "error": str(exc), "command": "", "log_path": None}
        run["command"] = "\n".join(shlex.join(c.argv) for c in commands)
        run["log_path"] = str(commands[0].log_path)
        if len(commands) > 1:
            run["shards"] = len(commands)
        exit_codes, forked = self._run_parallel(job, commands)
        if forked:
            run["forked"] = True  # from a warm Python that imported what the command's script imports (forkserver)
        run["duration_s"] = round(time.monotonic() - started, 3)
        if job.cancel_reason:
            return {**run, "status": "cancelled", "error": f"cancelled: {job.cancel_reason}"}
        for command, code in zip(commands, exit_codes, strict=True):
            if code != 0:
                reason = "timed out" if code is None else f"exited with code {code}"
                return {**run, "status": "failed", "log_path": str(command.log_path),
                        "error": f"`{Path(command.argv[0]).name} {command.argv[1]}` {reason}; see {command.log_path}",
                        "log_tail": tail_lines(command.log_path)}
        try:
            metrics = self.backend.metrics(self.settings, bench, bench_dir, commands,
                                           lambda more: self._run_parallel(job, more)[0])
        except ToolError as exc:
            return {**run, "status": "failed", "error": str(exc), "log_tail": tail_lines(commands[0].log_path)}
        job.raw_metrics[bench.name] = metrics
        return {**run, "status": "succeeded"}

    def _run_parallel(self, job: Job, commands: list[ShardCommand]) -> tuple[list[int | None], bool]:
        """Start every shard, wait for all: their exit codes (None: killed at the job timeout), and whether every
        one was forked from a warm Python."""
        procs: list[Process | None] = []
        for command in commands:
            command.output_dir.mkdir(parents=True, exist_ok=True)
            proc = self._start(command)
            if proc is None:
                procs.append(None)
                continue
            with self._lock:
                job.processes.add(proc)
                cancelled = job.cancel_reason is not None
            if cancelled:  # cancelled between the check and the start: stop it at once
                kill_group(proc)
            procs.append(proc)
        deadline = time.monotonic() + self.settings.job_timeout_s
        codes: list[int | None] = []
        for proc in procs:
            if proc is None:
                codes.append(127)
                continue
            try:
                codes.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                kill_group(proc)
                codes.append(None)
            with self._lock:
                job.processes.discard(proc)
        return codes, all(isinstance(proc, forkserver.Started) for proc in procs)

    def _start(self, command: ShardCommand) -> Process | None:
        """The command started in a session of its own, its output appended to its log: forked from a warm Python
        where its backend names what the script imports (command.preload), else as a process of its own; None (said
        in the log) when it cannot start."""
        env = {**os.environ, **command.env}
        if command.preload and (script := shutil.which(command.argv[0], path=env.get("PATH"))):
            server = self._forkserver(script, command.preload, command.attach, env)
            if server is not None:
                try:
                    return server.start(script, command.argv[1:], env, str(command.cwd or os.getcwd()), str(command.log_path))
                except forkserver.ColdStart as exc:
                    log.warning("%s: %s; starting its commands as processes of their own", command.argv[0], exc)
        with command.log_path.open("ab") as log_file:
            try:
                return subprocess.Popen(command.argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, cwd=command.cwd, start_new_session=True)
            except OSError as exc:
                log_file.write(f"cannot start {command.argv[0]}: {exc.strerror}\n".encode())
                return None

    def _forkserver(self, script: str, preload: str, attach: Mapping[str, tuple[str, ...]],
                    env: dict[str, str]) -> forkserver.ForkServer | None:
        """The warm Python for a console script's commands (started at its first command, its preload imported
        once), or None where the script is no Python's or the preload failed (then never asked again)."""
        python = forkserver.script_python(script)
        if python is None:
            return None
        key = (python, preload, tuple(sorted(attach.items())), tuple(sorted(env.items())))
        with self._forkservers_lock:
            if key in self._forkservers and ((server := self._forkservers[key]) is None or server.alive):
                return server
            if self.stopping:
                return None
            try:
                with (self.settings.root / FORKSERVER_LOG).open("ab") as server_log:
                    server = forkserver.ForkServer(python, preload, env, log=server_log, attach=attach)
            except forkserver.ColdStart as exc:
                log.warning("%s: %s; its commands start as processes of their own", script, exc)
                server = None
            self._forkservers[key] = server
            return server

    def shutdown(self, reason: str, wait_s: float = 30) -> None:
        """Refuse new jobs, cancel every queued and running one (their process groups too), wait for them."""
        with self._lock:
            self.stopping = reason
            jobs = [job for job in self._jobs.values() if job.status not in FINISHED]
        # in parallel: each cancel may wait out a grace period for a process group that ignores SIGTERM
        cancels = [threading.Thread(target=self.cancel, args=(job, reason), daemon=True) for job in jobs]
        for thread in cancels:
            thread.start()
        deadline = time.monotonic() + wait_s
        for thread in cancels:
            thread.join(max(0.0, deadline - time.monotonic()))
        for job in jobs:
            job.done.wait(max(0.0, deadline - time.monotonic()))
        self._pool.shutdown(wait=False, cancel_futures=True)
        for job in jobs:  # queued beyond the pool's threads: never started, so finish them here
            if not job.done.is_set() and job.status == "queued":
                self._set_status(job, "cancelled")
                job.done.set()
        with self._forkservers_lock:
            servers, self._forkservers = [server for server in self._forkservers.values() if server], {}
        for server in servers:  # the commands were stopped with their jobs; one still running stops with its server
            server.close()
        self._ledger_queue.put(None)  # every status written before this one goes in first
        self._ledger_writer.join(max(1.0, deadline - time.monotonic()))


def kill_group(proc: Process, grace_s: float = 10) -> None:
    """Stop the process group a command runs in (ns starts children of its own): SIGTERM, SIGKILL after grace_s."""
    stop_group(proc.pid, grace_s=grace_s, on_wait=proc.poll)
