"""The cluster tools: ssh_check, slurm_queue, cluster_info, remote_grep and check_registry_credentials, with their
input and output models. The SSH layer they stand on is clusters.ssh, the SLURM client clusters.slurm.
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Literal

from pydantic import BaseModel, Field

from quanteval import redact
from quanteval.clusters.slurm import ClusterInfo, SlurmJob, check_job_ids, check_user, describe_cluster, sacct, squeue
from quanteval.clusters.ssh import LOCAL, HostSettings, keep_open, open_connection, run_remote
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress

# --- ssh_check --------------------------------------------------------------------------------------

PROBED_COMMANDS = ["sbatch", "squeue", "sacct", "srun", "enroot", "docker", "rsync"]


class SshCheckInput(StrictModel):
    host: str = Field(description="ssh config alias (or user@alias); 'local': this machine.")
    trust_host_key: bool = Field(
        False,
        description="Trust an unknown or changed host key; only after the person confirmed its fingerprint.",
    )


class SshCheckResult(BaseModel):
    host: str
    hostname: str = Field(description="Address connected to (after ssh config).")
    port: int
    user: str = Field(description="User logged in as, reported by the host (whoami).")
    remote_hostname: str = Field(description="The host's own name (hostname).")
    via_proxy_jump: str | None
    host_key_fingerprint: str | None = Field(description="SHA256 fingerprint of the server's host key (null for local).")
    host_key_added: bool = Field(description="True when this call wrote the host key into known_hosts (trust_host_key).")
    known_hosts_file: str | None
    commands: dict[str, bool] = Field(description="Whether each of sbatch, squeue, sacct, srun, enroot, docker, rsync is on the host's PATH.")
    latency_ms: float = Field(description="Round trip of one trivial command on the open connection.")
    notes: list[str]


def ssh_check(request: SshCheckInput, progress: ProgressFn = no_progress) -> SshCheckResult:
    """Use first for a cluster host, and when a remote tool cannot connect: identity, SLURM and container commands,
    latency, or what is wrong.
    """
    progress(0, 3, f"connecting to {request.host}")
    probe = "whoami; hostname; " + "".join(
        f"command -v {c} >/dev/null 2>&1 && echo have:{c}; " for c in PROBED_COMMANDS
    )
    settings: HostSettings | None = None
    fingerprint_text: str | None = None
    added = False
    key_note: str | None = None
    if request.host != LOCAL:
        conn = open_connection(request.host, request.trust_host_key)
        settings = conn.settings
        fingerprint_text, added, key_note = conn.host_key_fingerprint, conn.host_key_added, conn.host_key_note
        keep_open(request.host, conn)
        progress(1, 3, "probing commands")
    result = run_remote(request.host, probe, timeout=30)
    if result.exit_code != 0 and not result.stdout:
        raise ToolError(f"{request.host}: the probe command failed ({result.stderr.strip()[-300:]}). Check the login shell.")
    lines = result.stdout.splitlines()
    progress(2, 3, "measuring latency")
    started = time.monotonic()
    run_remote(request.host, "true", timeout=30)
    latency = (time.monotonic() - started) * 1000
    commands = {c: f"have:{c}" in lines for c in PROBED_COMMANDS}
    notes: list[str] = []
    if key_note:
        notes.append(key_note)
    if not commands["sbatch"]:
        notes.append("No sbatch on PATH: not a SLURM login node (NEL's slurm executor cannot submit here).")
    if not commands["enroot"]:
        notes.append("No enroot: fine on a login node; compute nodes need pyxis/enroot for NEL's containers.")
    progress(3, 3, "done")
    return SshCheckResult(
        host=request.host,
        hostname=settings.hostname if settings else LOCAL,
        port=settings.port if settings else 0,
        user=lines[0] if lines else "",
        remote_hostname=lines[1] if len(lines) > 1 else "",
        via_proxy_jump=settings.proxy_jump if settings else None,
        host_key_fingerprint=fingerprint_text,
        host_key_added=added,
        known_hosts_file=str(settings.known_hosts_files[0]) if settings else None,
        commands=commands,
        latency_ms=round(latency, 1),
        notes=notes,
    )


# --- slurm_queue ------------------------------------------------------------------------------------


class SlurmQueueInput(StrictModel):
    host: str = Field(description="SLURM login host (ssh alias), or 'local'.")
    user: str | None = Field(None, description="Only this user's jobs.")
    job_ids: list[str] = Field(default_factory=list, description="Only these job ids, e.g. ['1234', '1235_7'].")
    include_finished: bool = Field(
        False, description="Also finished jobs (sacct)."
    )
    limit: int = Field(50, ge=1, le=500, description="Jobs per page.")
    offset: int = Field(0, ge=0, description="Jobs to skip (next_offset of the last page).")


class SlurmQueueResult(BaseModel):
    host: str
    jobs: list[SlurmJob]
    total: int = Field(description="Jobs matching the filters, over all pages.")
    offset: int
    next_offset: int | None = Field(description="Offset of the next page; null when this is the last page.")
    finished_source: Literal["sacct", "sacct -c"] | None = Field(description="Where finished jobs came from, when asked for.")
    notes: list[str]


def slurm_queue(request: SlurmQueueInput, progress: ProgressFn = no_progress) -> SlurmQueueResult:
    """Use to see a host's SLURM queue: jobs by user and ids, with state, pending reason and exit code. Paginated."""
    check_job_ids(request.job_ids)
    check_user(request.user)
    progress(0, 2, f"squeue on {request.host}")
    jobs = {job.job_id: job for job in squeue(request.host, user=request.user, job_ids=request.job_ids,
                                              all_states=request.include_finished)}
    notes: list[str] = []
    finished_source: Literal["sacct", "sacct -c"] | None = None
    if request.include_finished:
        progress(1, 2, f"sacct on {request.host}")
        finished_source, finished, note = sacct(request.host, user=request.user, job_ids=request.job_ids)
        if note:
            notes.append(note)
        for job in finished:
            if job.job_id in jobs:  # squeue still remembers it; sacct adds the exit code
                jobs[job.job_id].exit_code = job.exit_code
            else:
                jobs[job.job_id] = job
    ordered = sorted(jobs.values(), key=lambda j: _job_sort_key(j.job_id), reverse=True)
    page = ordered[request.offset : request.offset + request.limit]
    end = request.offset + len(page)
    progress(2, 2, "done")
    return SlurmQueueResult(
        host=request.host, jobs=page, total=len(ordered), offset=request.offset, next_offset=end if end < len(ordered) else None,
        finished_source=finished_source, notes=notes,
    )


def _job_sort_key(job_id: str) -> tuple[int, int]:
    base, _, task = job_id.partition("_")
    return (int(base) if base.isdigit() else 0, int(task) if task.isdigit() else -1)


# --- cluster_info -----------------------------------------------------------------------------------


class ClusterInfoInput(StrictModel):
    host: str = Field(description="SLURM login host (ssh alias), or 'local'.")
    partition: str | None = Field(None, pattern=r"^[\w.-]+$", description="Only this partition (default: all).")


def cluster_info(request: ClusterInfoInput, progress: ProgressFn = no_progress) -> ClusterInfo:
    """Use before filling a SLURM config, or when sbatch refuses a job: partitions (state, time limit, nodes, GPUs per
    node and type) and your accounts.
    """
    progress(0, 1, f"scontrol on {request.host}")
    info = describe_cluster(request.host)
    if request.partition:
        chosen = [p for p in info.partitions if p.name == request.partition]
        if not chosen:
            names = ", ".join(p.name for p in info.partitions) or "none"
            raise ToolError(f"partition: '{request.partition}' does not exist on {request.host}. Partitions: {names}.")
        info.partitions = chosen
    progress(1, 1, "done")
    return info


# --- remote_grep ------------------------------------------------------------------------------------



class RemoteGrepInput(StrictModel):
    host: str = Field(description="ssh alias, or 'local'.")
    path: str = Field(description="File or directory (recursive) on that host.")
    patterns: list[str] = Field(
        min_length=1,
        description="grep -E patterns; a line matching any is reported.",
    )
    ignore_case: bool = Field(True, description="Match regardless of case.")
    max_lines: int = Field(50, ge=1, le=1000, description="Most matching lines to return; the rest are counted.")


class GrepMatch(BaseModel):
    file: str
    line: int
    text: str = Field(description=f"The matching line, secrets masked, cut to {redact.MAX_LINE_CHARS} characters.")


class RemoteGrepResult(BaseModel):
    host: str
    path: str
    matches: list[GrepMatch]
    truncated: bool = Field(description="More lines matched than max_lines.")
    notes: list[str]


def remote_grep(request: RemoteGrepInput, progress: ProgressFn = no_progress) -> RemoteGrepResult:
    """Use to find errors in a host's files without copying them: grep -E over a file or folder; matches with
    file:line.
    """
    if any("\n" in p or "\0" in p for p in request.patterns):
        raise ToolError("patterns: a pattern contains a newline or NUL. Pass one line per pattern.")
    if "\0" in request.path:
        raise ToolError("path: contains a NUL byte. Pass a plain path.")
    progress(0, 1, f"grep on {request.host}")
    args = ["grep", "-rnHIZ", "-E"] + (["-i"] if request.ignore_case else [])
    for pattern in request.patterns:
        args += ["-e", pattern]  # -e: a pattern starting with '-' stays a pattern
    args += ["--", request.path]  # --: a path starting with '-' stays a path
    grep = " ".join(shlex.quote(a) for a in args)
    # Matches are cut at max_lines+1 by head; grep's own exit status is reported as the last stderr line.
    script = f'{grep} | head -n {request.max_lines + 1}; echo "::grep-exit:${{PIPESTATUS[0]}}" >&2'
    result = run_remote(request.host, f"bash -c {shlex.quote(script)}", timeout=120)
    stderr, _, status = result.stderr.rstrip().rpartition("::grep-exit:")
    stderr = stderr.strip()[-300:]
    # grep exits 1 for "no match" and 141 (SIGPIPE) when head stopped reading: more matches than asked for.
    if (not status.isdigit() or int(status) not in (0, 1, 141)) and not result.stdout:
        raise ToolError(f"{request.host}:{request.path}: grep failed ({stderr or result.stderr.strip()[-300:]}). Check the path and patterns.")
    matches = []
    secrets = redact.secret_values()
    for raw in result.stdout.splitlines():
        file, sep, rest = raw.partition("\0")
        number, _, text = rest.partition(":")
        if not sep or not number.isdigit():
            continue
        matches.append(GrepMatch(file=file, line=int(number), text=redact.shown_lines([text], secrets)[0]))
    truncated = len(matches) > request.max_lines
    notes = [f"grep reported: {stderr}"] if stderr else []
    progress(1, 1, "done")
    return RemoteGrepResult(host=request.host, path=request.path, matches=matches[: request.max_lines], truncated=truncated, notes=notes)


# --- check_registry_credentials ---------------------------------------------------------------------

# Runs on the host: reads the netrc-style enroot credentials file and prints only machine names and
# whether a login/password is present. Secrets never leave the host, so they cannot leak here.
_CREDENTIALS_SCRIPT = r"""
f="${ENROOT_CONFIG_PATH:-$HOME/.config/enroot}/.credentials"
echo "file:$f"
[ -e "$f" ] || { echo "missing"; exit 0; }
[ -r "$f" ] || { echo "unreadable"; exit 0; }
echo "mode:$(stat -c %a "$f")"
awk '
  { for (i = 1; i <= NF; i++) {
      if (skip) { skip = 0; continue }
      if ($i == "machine") { if (m != "") print "entry:" m ":" l ":" p; m = $(i+1); l = 0; p = 0; i++ }
      else if ($i == "default") { if (m != "") print "entry:" m ":" l ":" p; m = "(default)"; l = 0; p = 0 }
      else if ($i == "login") { l = 1; skip = 1 }
      else if ($i == "password") { p = 1; skip = 1 }
  } }
  END { if (m != "") print "entry:" m ":" l ":" p }' "$f"
"""


class CheckRegistryCredentialsInput(StrictModel):
    host: str = Field(description="ssh alias, or 'local'.")
    registry: str | None = Field(
        None, description="Registry that must have an entry, e.g. 'nvcr.io'."
    )


class RegistryEntry(BaseModel):
    machine: str = Field(description="Registry host named in the file.")
    has_login: bool
    has_password: bool


class RegistryCredentialsResult(BaseModel):
    host: str
    credentials_file: str = Field(description="Path of the enroot credentials file on the host.")
    exists: bool
    entries: list[RegistryEntry] = Field(description="Registries with an entry. Never contains logins, passwords or tokens.")
    registry: str | None
    registry_ok: bool | None = Field(description="Whether `registry` has an entry with a password; null if no registry was asked for.")
    notes: list[str]


def check_registry_credentials(request: CheckRegistryCredentialsInput) -> RegistryCredentialsResult:
    """Use before a SLURM run pulls from nvcr.io or another private registry: the registries in the host's enroot
    credentials (names only).
    """
    if request.registry is not None and not re.fullmatch(r"[A-Za-z0-9.-]+(:\d+)?", request.registry):
        raise ToolError(f"registry: '{request.registry}' is not a registry host name. Use e.g. 'nvcr.io'.")
    result = run_remote(request.host, f"bash -c {shlex.quote(_CREDENTIALS_SCRIPT)}", timeout=30)
    lines = result.stdout.splitlines()
    path = next((line[5:] for line in lines if line.startswith("file:")), "~/.config/enroot/.credentials")
    notes: list[str] = []
    entries: list[RegistryEntry] = []
    exists = "missing" not in lines
    for line in lines:
        if line.startswith("entry:"):
            machine, login, password = line[6:].rsplit(":", 2)
            entries.append(RegistryEntry(machine=machine, has_login=login == "1", has_password=password == "1"))
        elif line.startswith("mode:") and line[5:].strip()[-2:] != "00":
            notes.append(f"{path} is readable by other users (mode {line[5:].strip()}); run chmod 600 on it.")
    if "unreadable" in lines:
        notes.append(f"{path} exists but cannot be read by this user.")
    if not exists:
        notes.append(
            f"{path} does not exist: enroot pulls from private registries will fail. Add lines like "
            "'machine nvcr.io login $oauthtoken password <NGC_API_KEY>' (mode 600)."
        )
    registry_ok = None
    if request.registry:
        wanted = request.registry.lower()
        registry_ok = any(e.machine.lower() == wanted and e.has_password for e in entries)
        if not registry_ok:
            notes.append(
                f"No entry with a password for {request.registry}: add 'machine {request.registry} login <user> "
                f"password <token>' to {path}."
            )
    return RegistryCredentialsResult(
        host=request.host, credentials_file=path, exists=exists, entries=entries, registry=request.registry,
        registry_ok=registry_ok, notes=notes,
    )
