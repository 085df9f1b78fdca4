"""The SLURM client: the one place quanteval writes squeue, sacct, scontrol, sinfo, sacctmgr, sbatch and scancel
command lines and reads what they print. Runs, deployments and the cluster tools all come here; every command
goes over the pooled SSH connection of clusters.ssh (or a local bash for the host `local`). (NEL's own SLURM
executor and nel-next still run `ssh`/`sbatch` themselves.)
"""

from __future__ import annotations

import re
import shlex
import time
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from quanteval.clusters.ssh import run_remote
from quanteval.models import ToolError

_JOB_ID = re.compile(r"^\d+(_\d+)?$")
_USER = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]*$")
# '|'-separated; the pending reason / node list (%R) is free text, so it comes last.
_SQUEUE_FORMAT = "%i|%j|%u|%T|%P|%M|%l|%D|%E|%R"
_SACCT_FIELDS = "JobID,JobName,User,State,Partition,Elapsed,Timelimit,NNodes,ExitCode"
# Job states in which a job still holds or waits for resources.
ACTIVE_JOB_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                               "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT"})


class SlurmJob(BaseModel):
    job_id: str
    name: str
    user: str
    state: str = Field(description="SLURM state: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, ...")
    partition: str
    elapsed: str
    time_limit: str
    nodes: str
    reason: str | None = Field(None, description="Pending reason or node list (squeue %R).")
    dependency: str | None = Field(None, description="Remaining dependency, e.g. afternotok:1234(unfulfilled) (squeue %E).")
    exit_code: str | None = Field(None, description="exit:signal, for finished jobs from sacct.")
    source: Literal["squeue", "sacct", "sacct -c"]


def said_by(command: str, stderr: str) -> str:
    """What `command` itself printed to stderr: SLURM's tools start each line with their name ("sbatch: error: ..."),
    and a login shell's rc files print before them (a pyenv rehash, a module system), which would push the reason
    out of a bounded message. All of stderr when no line is the command's."""
    own = [line for line in stderr.splitlines() if line.startswith(f"{command}:")]
    return "\n".join(own) if own else stderr.strip()


def slurm_error(host: str, command: str, stderr: str) -> ToolError:
    """A failed SLURM command as an error a person can act on (not a login node, no config, controller down)."""
    text = said_by(command, stderr)[-400:]
    if "command not found" in text:
        return ToolError(f"{host}: {command} not found. Use a SLURM login node (check with ssh_check).")
    if "configuration source" in text or "Unable to process configuration file" in text:
        return ToolError(
            f"{host}: {command} finds no usable SLURM configuration (slurm.conf missing or broken). Use the "
            f"cluster's login node, or point SLURM_CONF there at the cluster's slurm.conf. ({text[-200:]})"
        )
    if re.search(r"Unable to contact slurm controller|Socket timed out|Connection refused|Zero Bytes", text, re.I):
        return ToolError(
            f"{host}: SLURM controller not answering ({text}). Transient if slurmctld is restarting: call again in a minute."
        )
    return ToolError(f"{host}: {command} failed: {text}")


def check_job_ids(job_ids: list[str] | tuple[str, ...]) -> None:
    bad = [j for j in job_ids if not _JOB_ID.match(j)]
    if bad:
        raise ToolError(f"job_ids: {bad} are not SLURM job ids. Use numbers like '1234' or array ids like '1234_5'.")


def check_user(user: str | None) -> None:
    if user is not None and not _USER.match(user):
        raise ToolError(f"user: '{user}' is not a user name. Use a plain login name.")


def squeue(host: str, *, user: str | None = None, job_ids: list[str] | tuple[str, ...] = (),
           all_states: bool = False) -> list[SlurmJob]:
    """Jobs SLURM's queue knows (with all_states, also those finished within MinJobAge)."""
    check_job_ids(job_ids)
    check_user(user)
    filters = (f" -u {user}" if user else "") + (f" -j {','.join(job_ids)}" if job_ids else "")
    result = run_remote(host, f"squeue -h{' -t all' if all_states else ''} -o '{_SQUEUE_FORMAT}'{filters}", timeout=90)
    if result.exit_code != 0:
        # squeue -j with only unknown (long finished) ids fails with "Invalid job id"; sacct may still know them.
        if job_ids and "Invalid job id" in result.stderr:
            return []
        raise slurm_error(host, "squeue", result.stderr)
    jobs = []
    for line in result.stdout.splitlines():
        parts = line.split("|", 9)
        if len(parts) != 10:
            continue
        job_id, name, user_name, state, partition, elapsed, limit, nodes, dependency, reason = parts
        jobs.append(SlurmJob(job_id=job_id, name=name, user=user_name, state=state, partition=partition,
                             elapsed=elapsed, time_limit=limit, nodes=nodes, reason=reason or None,
                             dependency=dependency if dependency not in ("", "(null)") else None, source="squeue"))
    return jobs


def sacct(host: str, *, user: str | None = None, job_ids: list[str] | tuple[str, ...] = ()
          ) -> tuple[Literal["sacct", "sacct -c"] | None, list[SlurmJob], str | None]:
    """Finished jobs from accounting, or from the job completion log (`sacct -c`) when accounting is off.

    Returns (source, jobs, note); source is None and note says why when neither answered.
    """
    check_job_ids(job_ids)
    check_user(user)
    filters = (f" -u {user}" if user else " -a") + (f" -j {','.join(job_ids)}" if job_ids else "")
    result = run_remote(host, f"sacct -n -P -X -o {_SACCT_FIELDS}{filters}", timeout=90)
    source: Literal["sacct", "sacct -c"] = "sacct"
    if result.exit_code != 0 and "accounting storage is disabled" in result.stderr.lower():
        source = "sacct -c"
        result = run_remote(host, f"sacct -c -n -P -o {_SACCT_FIELDS}", timeout=90)
    if result.exit_code != 0:
        return None, [], f"finished jobs unavailable: {source} failed ({result.stderr.strip()[-200:]})"
    jobs = []
    for line in result.stdout.splitlines():
        parts = line.split("|")
        if len(parts) != 9 or "." in parts[0]:  # job steps (1234.batch) are not jobs
            continue
        job_id, name, user_name, state, partition, elapsed, limit, nodes, exit_code = parts
        user_name = user_name.split("(")[0]  # sacct -c prints root(0)
        if source == "sacct -c" and ((user and user_name != user) or (job_ids and job_id not in job_ids)):
            continue  # sacct -c ignores -u/-j
        jobs.append(SlurmJob(job_id=job_id, name=name, user=user_name, state=(state.split() or ["UNKNOWN"])[0],
                             partition=partition, elapsed=elapsed, time_limit=limit, nodes=nodes, exit_code=exit_code,
                             source=source))
    note = "accounting storage is off on this cluster; finished jobs come from the job completion log (sacct -c)" if source == "sacct -c" else None
    return source, jobs, note


def job_states(host: str, job_ids: list[str], *, user: str | None = None) -> dict[str, SlurmJob]:
    """What SLURM knows about these jobs: the queue first (with `user`, all of that user's jobs: those queued behind
    these too), accounting for those it has forgotten. The one poll of job state, for runs and deployments alike."""
    jobs = {job.job_id: job for job in squeue(host, user=user, job_ids=() if user else job_ids, all_states=True)}
    forgotten = [job_id for job_id in job_ids if job_id not in jobs]
    if forgotten:
        _, finished, _ = sacct(host, job_ids=forgotten)
        jobs.update({job.job_id: job for job in finished if job.job_id in forgotten})
    return jobs


def scancel(host: str, job_ids: list[str]) -> None:
    """Cancel jobs; cancelling one that already ended is not an error."""
    check_job_ids(job_ids)
    if not job_ids:
        return
    result = run_remote(host, f"scancel {' '.join(job_ids)}", timeout=60)
    if result.exit_code != 0 and "Invalid job id" not in result.stderr and "already completing or completed" not in result.stderr:
        raise slurm_error(host, "scancel", result.stderr)


def sbatch(host: str, directory: str, script: str, file_name: str = "job.sbatch") -> tuple[str, str]:
    """Write `script` into `directory` (created; relative to the login home) and submit it from there.

    Returns (job id, absolute directory). A rejected submission raises ToolError with sbatch's reason.
    """
    marker = "QUANTEVAL_EOF"
    if marker in script or not re.fullmatch(r"[\w.-]+", file_name):
        raise ToolError(f"sbatch: the job script cannot contain {marker} and {file_name!r} must be a plain file name.")
    quoted = shlex.quote(directory)
    command = (f"mkdir -p {quoted} && cd {quoted} && cat > {file_name} <<'{marker}'\n{script}{marker}\n"
               f"sbatch --parsable {file_name} && pwd")
    result = run_remote(host, command, timeout=90)
    if result.exit_code != 0:
        raise ToolError(f"sbatch on {host} failed: {said_by('sbatch', result.stderr)[-500:]}")
    job_line, absolute_dir = (result.stdout.strip().splitlines() + ["", ""])[:2]
    return job_line.split(";")[0].strip(), absolute_dir


def cancel_chain(host: str, user: str, chain_file: str | None, job_id: str, timeout: float = 60) -> None:
    """scancel a job chain: `job_id`, the ids its chain file lists (one per resubmission; none without one), and the
    auto-resume successors queued behind any of them (`afternotok:<id>` dependencies of `user`'s jobs). Raises
    ToolError only when the host cannot be reached; ids that already ended are no error."""
    check_job_ids([job_id])
    listed = f"cat {shlex.quote(chain_file)} 2>/dev/null; " if chain_file else ""
    ids = f"$( ({listed}echo {job_id}) | sort -u)"
    alternatives = f"$(echo {ids} | tr ' ' '|')"
    run_remote(host, f"scancel {ids} {_successors(user, alternatives)}", timeout=timeout)


def cancel_successors(host: str, user: str, job_ids: list[str], timeout: float = 60) -> None:
    """scancel `user`'s jobs queued behind any of `job_ids` by an afternotok dependency (auto-resume's restart jobs),
    and nothing else. Raises ToolError only when the host cannot be reached."""
    check_job_ids(job_ids)
    run_remote(host, f"scancel {_successors(user, '|'.join(job_ids))} 2>/dev/null; true", timeout=timeout)


def _successors(user: str, alternatives: str) -> str:
    """Shell text for the ids of `user`'s jobs that depend afternotok on one of `alternatives` (an ERE alternation
    of job ids): squeue %E names each as afternotok:ID(state), so job 3's pattern does not take job 31's."""
    return (f"$(squeue -h -u {shlex.quote(user)} -o '%i %E' | grep -E \"afternotok:({alternatives})\\(\" | "
            "cut -d' ' -f1)")


def job_chains(host: str, chain_files: dict[str, str], timeout: float = 60) -> dict[str, list[str]]:
    """The job ids each chain file lists (a run's submissions and resubmissions, one id per line or word), read in
    one round trip; `chain_files` maps a caller's key to the file's path. A missing file lists none."""
    command = "; ".join(f"echo @@CHAIN {shlex.quote(key)}; cat {shlex.quote(path)} 2>/dev/null; echo"
                        for key, path in chain_files.items())
    chains: dict[str, list[str]] = {}
    current = None
    for line in run_remote(host, command, timeout=timeout).stdout.splitlines():
        if line.startswith("@@CHAIN "):
            current = line.split(maxsplit=1)[1]
            chains[current] = []
        elif current and line.strip():
            chains[current].extend(line.split())
    return chains


def one_node_script(job_name: str, time_limit: str, commands: list[str], *, output: str, gpus_per_node: int = 0,
                    partition: str | None = None, account: str | None = None, env: dict[str, str] | None = None) -> str:
    """A batch script for one task on one node: the #SBATCH header, `env` exported, then `commands` as they are.
    The caller keeps line breaks out of every value (each must stay one line of the script)."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --output={output}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        f"#SBATCH --time={time_limit}",
    ]
    lines += [f"#SBATCH --gpus-per-node={gpus_per_node}"] if gpus_per_node else []
    lines += [f"#SBATCH --partition={partition}"] if partition else []
    lines += [f"#SBATCH --account={account}"] if account else []
    lines += [f"export {key}={shlex.quote(value)}" for key, value in (env or {}).items()]
    return "\n".join([*lines, *commands]) + "\n"


# --- describe_cluster ------------------------------------------------------------------------------

# GPU type names as clusters spell them in GRES (h100, nvidia_h100_80gb_hbm3, gb200, ...) -> the GPU
# names quanteval sizes and checks formats for (frameworks.GPUS). First match wins.
GPU_NAME_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"b200|b100|gb200|b300|blackwell", re.I), "B200"),
    (re.compile(r"h200", re.I), "H200"),
    (re.compile(r"h100|h800|gh200|hopper", re.I), "H100"),
    (re.compile(r"l40s", re.I), "L40S"),
    (re.compile(r"a100|a800|ampere", re.I), "A100"),
]
_GRES_GPU = re.compile(r"(?:^|,)gpu:(?:([^:,()]+):)?(\d+)")
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z_:]*)=")
# sinfo's compact node states a job can start on now; a suffix (* not responding, ~ powered off, ...) says otherwise.
_USABLE_NODE_STATES = {"idle", "mix", "alloc", "comp"}
# Nodes come from sinfo, grouped (partition, node count, state, GRES, features): one line per kind of node, so a
# cluster of thousands of nodes answers in a few lines (scontrol show node would be megabytes).
_CLUSTER_SCRIPT = (
    "echo @@user; whoami; echo @@partitions; scontrol -o show partition 2>&1; echo \"@@rc $?\"; "
    "echo @@nodes; sinfo -h -o '%R|%D|%t|%G|%f' 2>&1; echo \"@@rc $?\"; "
    # sacctmgr needs slurmdbd; without it the answer is an error, which is fine: accounts stay unknown.
    "echo @@accounts; timeout 15 sacctmgr -n -P show assoc where user=\"$(whoami)\" format=Account,Partition 2>&1; "
    "echo \"@@rc $?\""
)


def gpu_model(name: str | None) -> str | None:
    """quanteval's GPU name (H100, B200, ...) for a GRES type or node feature, or None when unknown."""
    return next((model for pattern, model in GPU_NAME_PATTERNS if name and pattern.search(name)), None)


def slurm_seconds(text: str | None) -> int | None:
    """SLURM's time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds; None for UNLIMITED/NONE."""
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        raise ValueError(f"not a SLURM time: {text!r}")
    days, first, second, third = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
    elif third is not None:  # HH:MM:SS
        hours, minutes, seconds = int(first), int(second), int(third)
    else:  # MM[:SS]
        hours, minutes, seconds = 0, int(first), int(second or 0)
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def slurm_time(seconds: int) -> str:
    """Seconds as SLURM's [D-]HH:MM:SS."""
    days, rest = divmod(int(seconds), 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _fields(line: str) -> dict[str, str]:
    """`scontrol -o` key=value pairs; a value runs to the next key (values such as OS= hold spaces)."""
    keys = list(_KEY.finditer(line))
    return {match.group(1): line[match.end(): keys[i + 1].start() if i + 1 < len(keys) else len(line)].strip()
            for i, match in enumerate(keys)}


class GpuGroup(BaseModel):
    gres_type: str | None = Field(description="GPU type as SLURM names it in GRES (e.g. h100); null when untyped (gres gpu:8).")
    gpu_model: str | None = Field(description="quanteval's name for it (H100, H200, B200, A100, L40S); null when not recognised.")
    gpus_per_node: int
    nodes: int


class PartitionInfo(BaseModel):
    name: str
    default: bool = Field(description="The partition jobs land in when none is named.")
    state: str = Field(description="UP, DOWN, DRAIN or INACTIVE.")
    max_time: str = Field(description="Walltime limit as SLURM prints it (UNLIMITED when none).")
    max_time_s: int | None = Field(description="Walltime limit in seconds; null when unlimited.")
    default_time_s: int | None = Field(description="Walltime a job gets when it asks for none; null when the limit applies.")
    nodes: int
    usable_nodes: int = Field(description="Nodes that are up and not drained (idle, mixed or allocated).")
    gpus_per_node: int = Field(description="GPUs of the partition's largest node (0: no GPU GRES).")
    gpus: list[GpuGroup] = Field(description="GPU kinds in the partition, by node count.")
    gpu_model: str | None = Field(description="The one GPU model of every node, null when none, mixed or unrecognised.")
    features: list[str] = Field(description="Node features (usable with --constraint).")
    allowed_accounts: list[str] | None = Field(description="Accounts allowed to submit here; null when all are.")


class ClusterInfo(BaseModel):
    host: str
    user: str = Field(description="Login user on the cluster.")
    partitions: list[PartitionInfo]
    default_partition: str | None
    accounts: list[str] | None = Field(description="SLURM accounts this user may charge (sacctmgr); null when not visible.")
    query_s: float = Field(description="Seconds the cluster took to answer (one SSH round trip).")
    notes: list[str]


def describe_cluster(host: str) -> ClusterInfo:
    """Partitions with their GPUs, time limits and node states, and the user's accounts, in one SSH round trip."""
    started = time.monotonic()
    result = run_remote(host, _CLUSTER_SCRIPT, timeout=90)
    elapsed = time.monotonic() - started
    partition_lines, partition_rc = _section_lines(result.stdout, "partitions")
    node_lines, node_rc = _section_lines(result.stdout, "nodes")
    for lines, code in ((partition_lines, partition_rc), (node_lines, node_rc)):
        if code != 0:
            raise slurm_error(host, "scontrol", "\n".join(lines) or result.stderr)
    groups = [_NodeGroup.parse(line) for line in node_lines if line.count("|") == 4]
    partitions = []
    for line in partition_lines:
        if not line.startswith("PartitionName="):
            continue
        fields = _fields(line)
        partitions.append(_partition(fields, [g for g in groups if g and g.partition == fields["PartitionName"]]))
    user_lines, _ = _section_lines(result.stdout, "user")
    account_lines, account_rc = _section_lines(result.stdout, "accounts")
    notes: list[str] = []
    accounts: list[str] | None = None
    if account_rc == 0:
        accounts = sorted({line.split("|")[0] for line in account_lines if line.split("|")[0]})
    else:
        reason = (" ".join(account_lines) or "no answer")[:200]
        notes.append(f"Accounts not visible (sacctmgr: {reason}); ask the cluster admins which account to charge.")
    default = next((p.name for p in partitions if p.default), None)
    return ClusterInfo(host=host, user=user_lines[0] if user_lines else "", partitions=partitions,
                       default_partition=default, accounts=accounts, query_s=round(elapsed, 3), notes=notes)


def _section_lines(stdout: str, name: str) -> tuple[list[str], int | None]:
    """The lines printed under @@name and the exit code that followed them (None when none was printed)."""
    marker = f"@@{name}\n"
    if marker not in stdout:
        return [], None
    text = stdout.split(marker, 1)[1]
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("@@rc "):
            return lines, int(line[5:]) if line[5:].isdigit() else None
        if line.startswith("@@"):
            return lines, None
        if line:
            lines.append(line)
    return lines, None


@dataclass(frozen=True)
class _NodeGroup:
    """One sinfo line: `count` nodes of a partition with the same state, GRES and features."""

    partition: str
    count: int
    state: str
    gres: str
    features: tuple[str, ...]

    @classmethod
    def parse(cls, line: str) -> _NodeGroup | None:
        partition, count, state, gres, features = line.split("|")
        if not count.isdigit():
            return None
        return cls(partition, int(count), state, gres,
                   tuple(f for f in features.split(",") if f and f != "(null)"))

    @property
    def usable(self) -> bool:
        return self.state in _USABLE_NODE_STATES  # a suffixed state (down*, idle~, drain) is not in the set


def _partition(fields: dict[str, str], members: list[_NodeGroup]) -> PartitionInfo:
    counts: dict[tuple[str | None, int], int] = {}
    models: dict[str | None, str | None] = {}
    for group in members:
        for gres_type, count in _GRES_GPU.findall(group.gres):
            key = (gres_type or None, int(count))
            counts[key] = counts.get(key, 0) + group.count
            # Untyped GRES (gpu:8): the model may be named by a node feature instead (Feature=h100).
            feature_models = {gpu_model(f) for f in group.features} - {None}
            models[gres_type or None] = gpu_model(gres_type) or (feature_models.pop() if len(feature_models) == 1 else None)
    gpus = sorted((GpuGroup(gres_type=gres_type, gpu_model=models.get(gres_type), gpus_per_node=per_node, nodes=n)
                   for (gres_type, per_node), n in counts.items()), key=lambda g: -g.nodes)
    total = sum(group.count for group in members)
    distinct_models = {g.gpu_model for g in gpus}
    allowed = fields.get("AllowAccounts", "ALL")
    max_time = fields.get("MaxTime", "UNLIMITED")
    return PartitionInfo(
        name=fields["PartitionName"], default=fields.get("Default") == "YES", state=fields.get("State", "UNKNOWN"),
        max_time=max_time, max_time_s=_seconds_or_none(max_time), default_time_s=_seconds_or_none(fields.get("DefaultTime")),
        nodes=total, usable_nodes=sum(group.count for group in members if group.usable),
        gpus_per_node=max((g.gpus_per_node for g in gpus), default=0), gpus=gpus,
        gpu_model=next(iter(distinct_models)) if len(distinct_models) == 1 and sum(g.nodes for g in gpus) == total else None,
        features=sorted({f for group in members for f in group.features}),
        allowed_accounts=None if allowed == "ALL" else allowed.split(","),
    )


def _seconds_or_none(text: str | None) -> int | None:
    try:
        return slurm_seconds(text)
    except ValueError:
        return None
