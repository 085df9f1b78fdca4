"""Where a run executes, behind one interface: this machine ("local") or a SLURM cluster over SSH ("slurm").

An engine starts its runs (here through LocalExecutor.start; on SLURM with its own submit command); the executor then
answers for the jobs through the verbs every executor implements (the extras only some have are no-ops on the others),
and says where a run's files lie and what its settings mean, so that no engine asks which executor a run has. A job is
the executor's own handle: a LocalJob (a process group under the exit-code wrapper) or a ClusterJob (a SLURM job and
its chain), which `adopt` makes of what an engine recorded of a job it submitted. docs/ARCHITECTURE.md's Executor
section walks through the verbs; a new executor is one class here with them, and one line in EXECUTORS.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import shutil
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from quanteval import failures, localproc
from quanteval.clusters import slurm as slurm_client
from quanteval.clusters import ssh
from quanteval.models import ToolError

SSH_TIMEOUT_S = 60.0
ACTIVE = ("pending", "running", "resuming")  # the JobStatus.status of a job that holds or waits for resources


class JobStatus(BaseModel):
    """One job of a run as its executor reports it."""
    job_id: str = Field(description="NEL job id (<invocation>.<task index>).")
    status: str = Field(description="pending, running, resuming, succeeded, failed, killed or unknown.")
    slurm_job_id: str | None = None
    current_slurm_job_id: str | None = Field(None, description="Latest job of NEL's auto-resume chain, when it moved on.")
    restart_job_id: str | None = Field(None, description="NEL's paired restart job waiting behind the current one.")
    slurm_state: str | None = None
    progress: int | None = Field(None, description="Requests completed so far, when NEL tracks it.")
    note: str | None = None


class ClusterJob(BaseModel):
    """A job an engine submitted to a cluster, as the executor needs to find it again."""
    job_id: str = Field(description="The engine's name for the job (NEL's <invocation>.<index>, nel-next's shard).")
    hostname: str
    username: str
    remote_dir: str = Field(description="The job's run directory on the cluster.")
    slurm_job_id: str
    chain_file: str | None = Field(None, description=(
        "File in remote_dir listing every SLURM job of the job's auto-resume chain; None for a lone job (a deployment)."))
    retries_failed: bool = Field(False, description=(
        "The chain's successor also reruns a FAILED job (nel-next's cluster.max_retries), not only a walltime end."))
    done_file: str | None = Field(None, description=(
        "File in remote_dir the job writes once its run is over while the job serves on for a next run (its text: the "
        "run's exit code); None: the run ends with its job."))

    @property
    def login(self) -> str:
        return f"{self.username}@{self.hostname}"

    @property
    def directory(self) -> str:  # as LocalJob's: the job's run directory, on its side
        return self.remote_dir


class LocalJob(BaseModel):
    """A job on this machine: a process group started under the exit-code wrapper, its log and the file its exit code
    goes to (any later process can read it), in a directory of its own."""
    job_id: str
    pgid: int
    directory: str
    exit_file: str
    log_path: str
    owner_pid: int = 0  # the process it stops with (localproc.tied_to_this_process); 0: it outlives its starter


class Unreachable(Exception):
    """The cluster could not be asked (ssh failed or slurmctld did not answer); nothing is known about the job."""


LOG_READ_BYTES = 256 * 1024  # a local log's tail is read from its last bytes, not the whole file
# A job's log tails [(file, last lines)] and its lines of a known failure class [(file, line number, text)].
LogFailures = tuple[list[tuple[str, list[str]]], list[tuple[str, int, str]]]


def read_log_failures(paths: Iterable[Path], lines: int) -> LogFailures:
    """Log files on this machine: each one's last `lines` lines, and every line failures.classify knows."""
    tails: list[tuple[str, list[str]]] = []
    hits: list[tuple[str, int, str]] = []
    for path in paths:
        content = path.read_text(errors="replace").splitlines()
        tails.append((str(path), content[-lines:]))
        hits.extend((str(path), number, text) for number, text in enumerate(content, 1) if failures.classify(text))
    return tails, hits


class Executor(ABC):
    name: ClassVar[str]
    poll_interval_s: ClassVar[float] = 1.0
    # Its jobs run on a cluster's nodes, placed by login node, partition and account (apply_cluster asks the cluster).
    on_cluster: ClassVar[bool] = False

    # ---- where a run's files lie
    def local_path(self, value: str | Path) -> Path | None:
        """A path of a run as this process reaches it (expanded, made absolute against this process's directory, as
        NEL does); None on an executor whose paths lie on another machine."""
        return None

    def local_paths(self, pairs: Iterable[tuple[str, Any]]) -> list[tuple[str, Path]]:
        """(what, path) for each pair with a value whose path lies on this machine: none on an executor elsewhere, which
        never reads `pairs` (a generator's queries for the paths are then never made)."""
        return []

    def results_location(self, host: str | None, directory: str) -> str:
        """A run's results directory as validate_run and compare_results take it: the path (host:path on a cluster)."""
        return str(directory)

    def resolve_output_dir(self, value: str) -> str:
        """An output directory as a config should hold it: as written, a path on the side where the run writes."""
        return value

    # ---- what a run's settings (apply_cluster's vocabulary: hostname, gres, gpus_per_node) mean on this executor
    def output_dir_problem(self, value: str) -> tuple[str, str] | None:
        """(why, fix) when the jobs cannot write to this output directory as written; None when they can."""
        return None

    def login_host(self, settings: Mapping[str, Any]) -> str | None:
        """The host a run logs in to, from its settings (a cluster's login node); None for a run that logs in nowhere."""
        return None

    def gpus_per_node(self, settings: Mapping[str, Any], default_gres: str) -> int | None:
        """The GPUs each node of the run has, from its settings (`default_gres`: the engine's when none is set); None
        where the run is not placed on nodes (the deployment then takes what this machine has)."""
        return None

    def container_mount(self, path: str | None, mount_point: str) -> str | None:
        """Where the evaluation container sees `path` of the run's host: `mount_point` on an executor that mounts it
        there (the config's execution.mounts.evaluation); None on one that mounts nothing."""
        return None

    # ---- the job verbs: `jobs` are this executor's own handles (LocalJob, ClusterJob)
    @abstractmethod
    def states(self, jobs: list[Any]) -> list[JobStatus]:
        """Each job's state now: pending, running, resuming, succeeded, failed, killed or unknown."""

    @abstractmethod
    def cancel(self, jobs: list[Any], grace_s: float = 10.0) -> str:
        """Stop the jobs (and what they started); what was done. Raises ToolError when one did not stop."""

    @abstractmethod
    def log_lines(self, jobs: list[Any], lines: int) -> tuple[str, list[str]]:
        """Where the jobs' logs are, and their last lines (about `lines` per job)."""

    @abstractmethod
    def fetch(self, job: Any, into: Path, patterns: tuple[str, ...], directory: str | None = None) -> Path:
        """The files matching `patterns` under the job's directory (or `directory`, on the job's side), where this
        process can read them: that directory itself on this machine, else a fresh copy under `into`."""

    @abstractmethod
    def log_failures(self, job: Any, lines: int, max_hits: int) -> LogFailures:
        """The job's log tails (`lines` each) and its lines of a known failure class (about `max_hits` candidates)."""

    def adopt(self, job_id: str, recorded: Mapping[str, Any]) -> Any | None:
        """This executor's handle for a job an engine submitted itself, from what the engine recorded of it (by
        ClusterJob's field names); None when the executor cannot watch a job it did not start (a local process group
        is known only to its starter): the engine's own API then answers for it."""
        return None

    # ---- extras only some executors have: no-ops on the others, which never read `jobs` (the engine may pass a
    # generator whose queries are then never made)
    def protect_secrets(self, jobs: Iterable[Any]) -> None:
        """Make the .secrets.env files the engine copied to the jobs' side private there."""
        return None

    def cancel_leftovers(self, jobs: Iterable[Any]) -> None:
        """Cancel what the jobs' chains moved on to (the current job and its restart job) after the engine cancelled
        the jobs it knows; raises Unreachable when their side could not be asked."""
        return None

    def cancel_unrunnable(self, jobs: Iterable[Any], statuses: Iterable[JobStatus]) -> None:
        """Cancel what the jobs left queued that can never start (a restart job behind a job that completed); raises
        Unreachable when their side could not be asked."""
        return None


class LocalExecutor(Executor):
    """This machine: quanteval's own process groups (one reaper: localproc) or NEL's Docker executor runs the jobs."""
    name: ClassVar[str] = "local"

    def start(self, job_id: str, argv: list[str], directory: Path, env: dict[str, str], *, log_name: str,
              exit_name: str) -> LocalJob:
        """argv in a session of its own, its output appended to DIRECTORY/log_name and its exit code written to
        DIRECTORY/exit_name by the wrapper (tied to this process inside localproc.tied_to_this_process)."""
        exit_file = directory / exit_name
        exit_file.unlink(missing_ok=True)
        with open(directory / log_name, "ab") as log:
            child = subprocess.Popen(localproc.exit_code_wrapper(f"quanteval-{job_id}".replace(" ", "-"), exit_file, argv),
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=directory, env=env,
                                     start_new_session=True)
        localproc.adopt(child)
        return LocalJob(job_id=job_id, pgid=child.pid, directory=str(directory), exit_file=str(exit_file),
                        log_path=str(directory / log_name), owner_pid=localproc.owner_pid())

    @staticmethod
    def written_code(job: LocalJob) -> int | None:
        """The exit code the wrapper wrote, None before it did (-1 for a file that is not a number)."""
        path = Path(job.exit_file)
        text = path.read_text().strip() if path.is_file() else ""
        try:
            return int(text) if text else None
        except ValueError:
            return -1

    @staticmethod
    def running(job: LocalJob) -> bool:
        """Whether anything of the job's process group is alive (an ended child of ours is reaped first: no zombie)."""
        localproc.reap()
        return bool(localproc.group_members(job.pgid))

    def exit_code(self, job: LocalJob) -> int | None:
        """The job's exit code once it ended, None while it runs. A group gone without one counts as killed (-9)."""
        if (code := self.written_code(job)) is not None:
            return code
        if self.running(job):
            return None
        # The wrapper writes the code, then exits: it may have done both since the first read (seen in CI as a
        # finished run recorded as killed). Only a group gone with still no code is a killed run.
        code = self.written_code(job)
        return -9 if code is None else code

    @staticmethod
    def owner_ended(job: LocalJob) -> bool:
        """Whether the process the job was tied to has ended (the wrapper then stops the job: it was the owner's)."""
        return job.owner_pid > 0 and not localproc.alive(job.owner_pid)

    def stop(self, job: LocalJob, grace_s: float) -> tuple[bool, str, list[int]]:
        """SIGTERM the job's group, SIGKILL what is left after grace_s: (stopped, what was done, pids still alive)."""
        return localproc.stop_group(job.pgid, grace_s, on_wait=lambda: self.running(job))

    def states(self, jobs: list[LocalJob]) -> list[JobStatus]:
        statuses = []
        for job in jobs:
            code = self.exit_code(job)
            status = "running" if code is None else "succeeded" if code == 0 else "failed"
            note = None if code in (None, 0) else "killed (no exit code)" if code == -9 else f"exit {code}"
            statuses.append(JobStatus(job_id=job.job_id, status=status, note=note))
        return statuses

    def cancel(self, jobs: list[LocalJob], grace_s: float = 10.0) -> str:
        how = "already stopped"
        for job in jobs:
            stopped, how, _left = self.stop(job, grace_s)
            if not stopped:
                raise ToolError(f"{job.job_id} did not stop ({how}); kill process group {job.pgid}.")
        return how

    def log_lines(self, jobs: list[LocalJob], lines: int) -> tuple[str, list[str]]:
        content: list[str] = []
        for job in jobs:
            path = Path(job.log_path)
            if path.is_file():
                with open(path, "rb") as handle:
                    handle.seek(max(0, path.stat().st_size - LOG_READ_BYTES))
                    content += handle.read().decode(errors="replace").splitlines()[-lines:]
        return ", ".join(job.log_path for job in jobs), content

    def fetch(self, job: LocalJob, into: Path, patterns: tuple[str, ...], directory: str | None = None) -> Path:
        return Path(directory or job.directory)

    def log_failures(self, job: LocalJob, lines: int, max_hits: int) -> LogFailures:
        path = Path(job.log_path)
        return read_log_failures([path] if path.is_file() else [], lines)

    def local_path(self, value: str | Path) -> Path:
        return Path(value).expanduser().absolute()

    def local_paths(self, pairs: Iterable[tuple[str, Any]]) -> list[tuple[str, Path]]:
        return [(what, self.local_path(str(value))) for what, value in pairs if value]

    def resolve_output_dir(self, value: str) -> str:
        return str(Path(value).expanduser().resolve())  # one path, whatever directory the run is started from


class EngineManagedExecutor(Executor):
    """An executor the engine knows and quanteval does not drive itself (NEL's lepton, ...): the engine's own API
    answers for its jobs, and the verbs here refuse."""
    poll_interval_s: ClassVar[float] = 10.0  # the engine asks a platform's API over the network, as a cluster costs

    def __init__(self, name: str) -> None:
        self.name = name  # type: ignore[misc]

    def _refuse(self) -> ToolError:
        return ToolError(f"runs on the {self.name!r} executor are watched through their engine's own commands, not by quanteval")

    def states(self, jobs: list[Any]) -> list[JobStatus]:
        raise self._refuse()

    def cancel(self, jobs: list[Any], grace_s: float = 10.0) -> str:
        raise self._refuse()

    def log_lines(self, jobs: list[Any], lines: int) -> tuple[str, list[str]]:
        raise self._refuse()

    def fetch(self, job: Any, into: Path, patterns: tuple[str, ...], directory: str | None = None) -> Path:
        raise self._refuse()

    def log_failures(self, job: Any, lines: int, max_hits: int) -> LogFailures:
        raise self._refuse()


DONE = " (done file)"  # _chains' key suffix for what a job's done_file says


class SlurmExecutor(Executor):
    """A SLURM cluster reached over quanteval's pooled SSH connections; all of a run's SLURM shell is here."""
    name: ClassVar[str] = "slurm"
    poll_interval_s: ClassVar[float] = 10.0  # each poll is an SSH round trip and a squeue
    on_cluster: ClassVar[bool] = True

    def run(self, job: ClusterJob, command: str, timeout: float = SSH_TIMEOUT_S) -> str:
        """Run a command on the job's login node; stdout comes back, Unreachable when ssh fails."""
        try:
            return ssh.run_remote(job.login, command, timeout=timeout).stdout
        except ToolError as exc:
            raise Unreachable(f"ssh {job.hostname} failed: {exc}") from None

    def output_dir_problem(self, value: str) -> tuple[str, str] | None:
        if value.startswith("/"):
            return None
        return (f"output_dir '{value}' is relative; SLURM jobs run on compute nodes and need an absolute path on "
                "shared storage.", "Use an absolute path such as /lustre/<project>/<user>/nel-results.")

    def login_host(self, settings: Mapping[str, Any]) -> str | None:
        hostname = settings.get("hostname")
        return None if hostname is None else str(hostname)

    def gpus_per_node(self, settings: Mapping[str, Any], default_gres: str) -> int | None:
        explicit = settings.get("gpus_per_node")
        if isinstance(explicit, int) and not isinstance(explicit, bool) and explicit:
            return explicit
        gres = settings.get("gres", default_gres)
        match = re.search(r"gpu(?::[\w.-]+)?:(\d+)$", str(gres)) if gres else None
        return int(match.group(1)) if match else None

    def container_mount(self, path: str | None, mount_point: str) -> str | None:
        return mount_point if path else None

    def results_location(self, host: str | None, directory: str) -> str:
        return f"{host}:{directory}" if host else str(directory)

    def adopt(self, job_id: str, recorded: Mapping[str, Any]) -> ClusterJob:
        return ClusterJob(job_id=job_id, **recorded)

    def protect_secrets(self, jobs: Iterable[ClusterJob]) -> None:
        """NEL rsyncs .secrets.env to the cluster mode 644: make it private there too."""
        for job in jobs:
            self.run(job, f"chmod 600 {shlex.quote(job.remote_dir)}/.secrets.env 2>/dev/null; true")

    def cancel_leftovers(self, jobs: Iterable[ClusterJob]) -> None:
        """NEL cancels a job's first SLURM job only; once auto-resume moved on, the chain's current job and its restart
        job are what runs, so those of a job still active are cancelled too."""
        by_id = {job.job_id: job for job in jobs}
        for status in self.job_states(list(by_id.values())):
            leftovers = [job_id for job_id in (status.current_slurm_job_id, status.restart_job_id) if job_id]
            if leftovers and status.status in ACTIVE:
                self.scancel(by_id[status.job_id], leftovers)

    def cancel_unrunnable(self, jobs: Iterable[ClusterJob], statuses: Iterable[JobStatus]) -> None:
        """Every job NEL and nel-next submit queues its auto-resume restart job behind it (afternotok): once the job
        COMPLETED that dependency can never be met, and SLURM keeps the restart job PENDING (DependencyNeverSatisfied)
        for good unless the cluster sets kill_invalid_depend; it clutters the user's queue and counts against the
        submit limits of their QOS. Cancelled once the run is seen to have completed: the jobs SLURM says wait on it, not
        a job the queue only seems to pair with it (the same name: another run's job of the same benchmark)."""
        by_id = {job.job_id: job for job in jobs}
        completed: dict[str, tuple[ClusterJob, list[str]]] = {}  # per login: one scancel for all of a sharded run's jobs
        for status in statuses:
            if status.slurm_state == "COMPLETED" and status.restart_job_id and (job := by_id.get(status.job_id)):
                completed.setdefault(job.login, (job, []))[1].append(status.current_slurm_job_id or status.slurm_job_id)
        for job, slurm_job_ids in completed.values():
            try:
                slurm_client.cancel_successors(job.login, job.username, slurm_job_ids)
            except ToolError as exc:
                raise Unreachable(f"ssh {job.hostname} failed: {exc}") from None

    def log_failures(self, job: ClusterJob, lines: int, max_hits: int) -> LogFailures:
        """Grepped on the cluster, in the job's logs/ (one ssh call); only the lines of a known class are hits."""
        logs = f"{job.remote_dir}/logs"
        tails, hits = failures.parse_grep(self.run(job, failures.grep_command(logs, max_hits, tail_lines=lines)), logs)
        return tails, [hit for hit in hits if failures.classify(hit[2])]

    def states(self, jobs: list[ClusterJob]) -> list[JobStatus]:
        return self.job_states(jobs)

    def cancel(self, jobs: list[ClusterJob], grace_s: float = 10.0) -> str:
        for job in jobs:
            self.cancel_chain(job)
        return "scancel of the job chain"

    def log_lines(self, jobs: list[ClusterJob], lines: int) -> tuple[str, list[str]]:
        """The newest SLURM logs of each job (up to the last four of its chain)."""
        content: list[str] = []
        for job in jobs:
            content += self.tail_job_logs(job, lines)
        return ", ".join(f"{job.hostname}:{job.remote_dir}/logs" for job in jobs), content

    def fetch(self, job: ClusterJob, into: Path, patterns: tuple[str, ...], directory: str | None = None) -> Path:
        """A fresh copy of the files matching `patterns` (none yet: an empty folder)."""
        shutil.rmtree(into, ignore_errors=True)  # our own mirror: nothing the cluster has since removed survives
        into.mkdir(parents=True)
        with contextlib.suppress(ToolError):  # no directory yet: the job has not started, and has no files
            ssh.fetch_tree(job.hostname, directory or job.remote_dir, into, list(patterns))
        return into

    def job_states(self, jobs: list[ClusterJob]) -> list[JobStatus]:
        """Per cluster login: the job chain files, `squeue -t all` for the user, then sacct for jobs the queue forgot."""
        by_login: dict[str, list[ClusterJob]] = {}
        for job in jobs:
            by_login.setdefault(job.login, []).append(job)
        return [status for host_jobs in by_login.values() for status in self._login_states(host_jobs)]

    def _chains(self, host_jobs: list[ClusterJob]) -> dict[str, list[str]]:
        """Each job's chain (by job_id) and, under (job_id, DONE), what its done_file says: one round trip."""
        files = {job.job_id: f"{job.remote_dir}/{job.chain_file}" for job in host_jobs if job.chain_file}
        files.update({job.job_id + DONE: f"{job.remote_dir}/{job.done_file}" for job in host_jobs if job.done_file})
        try:
            return slurm_client.job_chains(host_jobs[0].login, files, timeout=SSH_TIMEOUT_S) if files else {}
        except ToolError as exc:
            raise Unreachable(f"ssh {host_jobs[0].hostname} failed: {exc}") from None

    def _login_states(self, host_jobs: list[ClusterJob]) -> list[JobStatus]:
        first = host_jobs[0]
        chains = self._chains(host_jobs)
        # the newest of the chain and the recorded id: a resubmitted job is recorded before it writes the chain
        latest_ids = {job.job_id: max([*chains.get(job.job_id, []), job.slurm_job_id],
                                      key=lambda i: int(i) if i.isdigit() else -1) for job in host_jobs}
        try:  # the user's whole queue: the restart jobs queued behind these are in it
            queue = slurm_client.job_states(first.login, list(latest_ids.values()), user=first.username)
        except ToolError as exc:
            raise Unreachable(f"ssh {first.hostname}: {exc}") from None
        statuses = []
        for job in host_jobs:
            latest = latest_ids[job.job_id]
            state = _slurm_state(queue[latest].state if latest in queue else "")
            restart = _restart_job(latest, queue)
            status, note = _map_slurm(state, restart, latest != job.slurm_job_id, job.retries_failed)
            if (said := chains.get(job.job_id + DONE)) and status != "pending":  # ended, though its job serves on
                status, note = ("succeeded", None) if said[0] == "0" else ("failed", f"its run exited {said[0]}")
            statuses.append(JobStatus(job_id=job.job_id, status=status, slurm_job_id=job.slurm_job_id,
                                      current_slurm_job_id=latest if latest != job.slurm_job_id else None,
                                      restart_job_id=restart, slurm_state=state, note=note))
        return statuses

    def scancel(self, job: ClusterJob, slurm_job_ids: list[str]) -> None:
        """scancel these SLURM jobs of the job's login (leftovers of a chain, not the chain itself)."""
        try:
            slurm_client.scancel(job.login, slurm_job_ids)
        except ToolError as exc:
            raise Unreachable(str(exc)) from None

    def cancel_chain(self, job: ClusterJob) -> None:
        """scancel every job of the job's chain and the auto-resume successors queued behind them (afternotok)."""
        try:
            slurm_client.cancel_chain(job.login, job.username, job.chain_file and f"{job.remote_dir}/{job.chain_file}",
                                      job.slurm_job_id, timeout=SSH_TIMEOUT_S)
        except ToolError as exc:
            raise Unreachable(f"ssh {job.hostname} failed: {exc}") from None

    def stop(self, job: ClusterJob, grace_s: float) -> tuple[bool, str, list[int]]:
        """scancel the job's chain and wait up to grace_s for SLURM to end it: (stopped, what was done, no pids: none of
        it runs here), as LocalExecutor.stop answers for a process group."""
        self.cancel_chain(job)
        deadline = time.monotonic() + grace_s
        while (status := self.job_states([job])[0]).status in ACTIVE:
            if time.monotonic() >= deadline:
                return False, f"scancel {job.slurm_job_id} (job still {status.slurm_state})", []
            time.sleep(0.5)
        return True, f"scancel {job.slurm_job_id}", []

    def tail_job_logs(self, job: ClusterJob, lines: int, last_files: int = 4) -> list[str]:
        """The last `lines` lines of the newest SLURM logs under logs/ (up to `last_files` jobs of the chain, oldest
        first: a retry's fresh log alone hides why the first one failed). Ordered by job id, not by time: a killed
        job's processes may still write its log after its successor started (seen under load)."""
        logs = f"{shlex.quote(job.remote_dir)}/logs"
        text = self.run(job, f"for f in $(ls {logs}/slurm-*.log 2>/dev/null | sort -V | tail -{last_files}); "
                             f'do echo "==> $f <=="; tail -n {lines} "$f"; done')
        return text.splitlines()


def _slurm_state(state_field: str) -> str:
    return state_field.split()[0].rstrip("+") if state_field.strip() else "UNKNOWN"


def _restart_job(latest: str, queue: dict[str, slurm_client.SlurmJob]) -> str | None:
    """NEL's paired restart job behind `latest`: it depends on it (afternotok:<latest>) while `latest` runs, and keeps
    the job name once SLURM has cleared the satisfied dependency and starts it."""
    latest_name = queue[latest].name if latest in queue else None
    for job_id, entry in queue.items():
        if entry.state not in ("PENDING", "CONFIGURING", "RUNNING") or not job_id.isdigit() or not latest.isdigit():
            continue
        if f":{latest}" in (entry.dependency or "") or (
                int(job_id) > int(latest) and latest_name and entry.name == latest_name):
            return job_id
    return None


def _map_slurm(state: str, restart_job: str | None, resumed: bool, retries_failed: bool = False) -> tuple[str, str | None]:
    """retries_failed: the chain's successor also reruns a FAILED job (nel-next's infra retries, cluster.max_retries),
    where NEL 0.2.6's restart job only continues after walltime."""
    if state == "FAILED" and retries_failed and restart_job:
        return "resuming", f"failed; nel-next's auto-resume job {restart_job} retries it (cluster.max_retries)"
    if state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
        return ("resuming", "restart job queued after walltime") if resumed else ("pending", None)
    if state in slurm_client.ACTIVE_JOB_STATES:  # running, suspended, completing, signalled, staging out, ...
        return "running", "resumed after walltime by NEL's restart job" if resumed else None
    if state == "COMPLETED":
        return "succeeded", None
    if state in ("TIMEOUT", "PREEMPTED", "NODE_FAIL"):
        if restart_job:
            return "resuming", f"{state.lower()}; NEL's paired restart job {restart_job} continues the run"
        return "failed", f"{state.lower()} and no restart job queued (max_walltime reached?); resume_run restarts it"
    if state == "CANCELLED":
        return "killed", "cancelled (scancel or kill_run)"
    if state == "UNKNOWN":
        return "unknown", "SLURM no longer knows this job and accounting has no record of it"
    return "failed", f"SLURM state {state}"


LOCAL = LocalExecutor()
SLURM = SlurmExecutor()
# Every executor by the name stored in run records.
EXECUTORS: dict[str, Executor] = {executor.name: executor for executor in (SLURM, LOCAL)}
# What a record or config that names no executor ran on: records made before executors were recorded, configs without
# execution.type or cluster.type (both engines' default).
UNNAMED = LOCAL
# Executors an engine runs itself, which quanteval records but does not drive: NEL 0.2.6's lepton, nel-next's docker.
ENGINE_MANAGED = ("lepton", "docker")
KNOWN = (*EXECUTORS, *ENGINE_MANAGED)


def for_name(name: str | None) -> Executor:
    """The executor a config or record names; UNNAMED for none. An unknown name is refused with the known ones (as NEL
    and nel-next refuse it): a typo must not run as some other executor."""
    if not name:
        return UNNAMED
    if name in ENGINE_MANAGED:
        return EngineManagedExecutor(name)
    if (executor := EXECUTORS.get(name)) is None:
        raise ToolError(f"unknown executor {name!r}: the known ones are {', '.join(KNOWN)}. "
                        "Set execution.type (NEL 0.2.6) or cluster.type (nel-next) to one of them.")
    return executor
