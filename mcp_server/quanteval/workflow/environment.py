"""check_environment: what is installed and reachable here. Reports; never fails because something is absent."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from quanteval import __version__, engines, envvars, ledger
from quanteval.clusters.slurm import PartitionInfo
from quanteval.clusters.ssh import ssh_config_hosts, ssh_config_path
from quanteval.envvars import KNOWN_ENV_VARS, set_env_var_names
from quanteval.localproc import DEBIAN_PACKAGES, missing_programs
from quanteval.models import StrictModel, ToolError
from quanteval.serving.frameworks import FRAMEWORK_INFO, VLLM_VENV_DEFAULT, VLLM_VENV_ENV, vllm_venv, vllm_venv_version
from quanteval.workflow import evaluate_cluster

PACKAGES = ["quanteval", "nemo-evaluator-launcher", "nemo-evaluator", "mcp", "pydantic", "paramiko",
            "safetensors", "torch", "sglang", "vllm", "nemo-skills"]


class CheckEnvironmentInput(StrictModel):
    probe_gpus: bool = Field(True, description="nvidia-smi (5 s).")
    executor: Literal["local", "slurm"] | None = Field(None, description="Execution; null: both.")
    host: str | None = Field(None, description="A SLURM alias to check too.")
    cluster: evaluate_cluster.ClusterSettings | None = Field(None, description="As evaluate's.")


class LocalBinary(BaseModel):
    executor: str = Field(description="The NEL executor that runs this binary on this machine.")
    binary: str
    path: str | None = Field(description="Where it is on PATH, or null when missing.")
    debian_package: str = Field(description="The Debian/Ubuntu package that provides it (apt-get install ...).")


class GpuInfo(BaseModel):
    index: int
    name: str
    memory_mib: int | None = None


class Workspace(BaseModel):
    path: str
    has_checkpoints: bool = Field(description="Contains a config.json somewhere within two levels.")


class ServingOption(BaseModel):
    where: Literal["vllm", "gpu", "docker", "slurm", "endpoint"] = Field(description=(
        "vllm: vLLM on this machine, without a GPU its CPU build (what evaluate_quantization and a local vllm "
        "launch_deployment start); gpu: servers on this machine's GPUs; docker: NEL's local executor; slurm: a "
        "cluster; endpoint: a server already running."))
    available: bool
    detail: str = Field(description="What was found (versions, paths, hosts, URLs).")
    how_to_get: str | None = Field(None, description="When not available: what makes it available.")


class ClusterCheck(BaseModel):
    """What a cluster evaluation (evaluate_quantization with host) finds on the cluster."""
    host: str
    reachable: bool
    detail: str = Field(description="Why it cannot be reached, else its login user and answer time.")
    default_partition: str | None = None
    partitions: list[PartitionInfo] = Field(default_factory=list, description="State, nodes, GPUs per node (GRES), time limit.")
    nel_next: str | None = Field(None, description="nel's path there; null when missing (see missing).")
    vllm: str | None = Field(None, description="The vLLM release the jobs serve with; null when missing.")
    output_dir: str | None = Field(None, description="Where evaluations write there by default.")
    missing: list[str] = Field(default_factory=list, description="What a cluster evaluation lacks there, each with its fix.")


class EnvironmentReport(BaseModel):
    python: str
    platform: str
    quanteval: str
    packages: dict[str, str | None] = Field(description=(
        "Installed version per package in this Python (vllm: the vLLM local deployments start, from its own venv); "
        "null when not installed."))
    nel_on_path: str | None = Field(description="Path of the `nel` executable, or null.")
    quanteval_cli: str | None = Field(None, description=(
        "Path of the `quanteval` command (CI runs `quanteval evaluate` / `quanteval gate`; elsewhere: pip install the "
        "checkout), or null."))
    docker_daemon: bool = Field(description="A Docker daemon answers on its socket (NEL's local executor needs one).")
    docker_detail: str
    gpus: list[GpuInfo]
    gpu_detail: str
    ssh_hosts: list[str] = Field(description="Host aliases from ~/.ssh/config (no wildcards).")
    executor_binaries: list[LocalBinary] = Field(default_factory=list, description=(
        "Every local program the chosen NEL executor runs (slurm: ssh, rsync; local: docker, bash), found or missing."))
    env_vars_set: list[str] = Field(description="Known env vars that are set (names only, never values).")
    env_vars_unset: list[str]
    workspace_root: str | None = Field(description="MODELOPT_WORKSPACE_ROOT, when set.")
    workspaces: list[Workspace]
    serving: list[ServingOption] = Field(description="Where a model can be served from here, and how to get the rest.")
    example_benchmarks: list[str] = Field(default_factory=list, description=(
        "Benchmarks shipped in quanteval's checkout, by absolute path (BYOB .py/.jsonl for nel-next's benchmarks "
        "list); a skills map there, as NEMO_SKILLS_EXTRA_BENCHMARK_MAP, names skills://tiny_math and tiny_mcq."))
    cluster: ClusterCheck | None = Field(None, description="With host: what evaluate_quantization finds there.")
    notes: list[str]


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _docker_status() -> tuple[bool, str]:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return False, f"DOCKER_HOST={host} is not a unix socket; not probed"
    path = host.removeprefix("unix://")
    if not Path(path).exists():
        return False, f"no Docker socket at {path}"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(2)
            sock.connect(path)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            answer = sock.recv(256)
        ok = b" 200 " in answer.split(b"\r\n", 1)[0]
        return ok, "daemon answered /_ping" if ok else "socket exists but the daemon did not answer OK"
    except OSError as exc:
        return False, f"socket {path} not answering: {exc.strerror or exc}"


def _gpus(probe: bool) -> tuple[list[GpuInfo], str]:
    if not probe:
        return [], "not probed"
    smi = shutil.which("nvidia-smi")
    if not smi:
        return [], "nvidia-smi not found"
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=5, check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        return [], f"nvidia-smi failed: {type(exc).__name__}"
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit():
            memory = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
            gpus.append(GpuInfo(index=int(parts[0]), name=parts[1], memory_mib=memory))
    return gpus, f"{len(gpus)} GPU(s) from nvidia-smi"


def _workspaces(root: str | None) -> list[Workspace]:
    if not root or not Path(root).is_dir():
        return []
    found = []
    for entry in sorted(Path(root).iterdir())[:200]:
        if entry.is_dir():
            has = any(entry.glob("config.json")) or any(entry.glob("*/config.json"))
            found.append(Workspace(path=str(entry), has_checkpoints=has))
    return found


def _local_vllm() -> ServingOption:
    """The vLLM a local deployment starts (deploy's launcher: QUANTEVAL_VLLM_LAUNCHER, `vllm` on PATH, else the venv)."""
    launcher_env = FRAMEWORK_INFO["vllm"].launcher_env
    if os.environ.get(launcher_env, "").strip():
        return ServingOption(where="vllm", available=True, detail=f"${launcher_env} replaces the vLLM launcher")
    on_path = shutil.which("vllm")
    if on_path:
        return ServingOption(where="vllm", available=True, detail=f"`vllm` on PATH: {on_path}")
    venv = vllm_venv()
    version = vllm_venv_version(venv)
    if version:
        return ServingOption(where="vllm", available=True, detail=(
            f"{version} in {venv}: serves small models on this CPU (plan_deployment checks a checkpoint against its "
            "CPU kernels)"))
    return ServingOption(
        where="vllm", available=False, detail=f"no `vllm` on PATH and no vLLM in {venv}",
        how_to_get=f"run `{envvars.setup_command('setup-vllm', VLLM_VENV_ENV)}`: it builds vLLM's CPU build into {venv} "
                   f"(${VLLM_VENV_ENV}, default {VLLM_VENV_DEFAULT})")


def _slurm_option() -> ServingOption:
    sbatch = shutil.which("sbatch")
    hosts = ssh_config_hosts()
    missing = missing_programs("NEL's slurm executor", engines.by_name("nel").run.local_programs["slurm"])
    reach = (f"ssh hosts: {', '.join(hosts[:10])}" if hosts else "no ssh host configured") + (
        "; runs go over ssh to the config's execution.hostname (ssh_check tests a host)")
    if missing:
        return ServingOption(where="slurm", available=False, detail=f"sbatch: {sbatch or 'not on PATH'}; {reach}",
                             how_to_get=missing)
    if sbatch or hosts:
        return ServingOption(where="slurm", available=True, detail=(
            f"sbatch on PATH ({sbatch}): a SLURM client is installed here; {reach}" if sbatch else f"no sbatch here; {reach}"))
    return ServingOption(where="slurm", available=False, detail=f"no sbatch on PATH; {reach}",
                         how_to_get=f"add the cluster's login node to {ssh_config_path()}, then ssh_check")


def _endpoints() -> ServingOption:
    try:
        ready = [record for record in ledger.find(kind="deployment", status="ready", limit=20)]
    except ToolError as exc:
        return ServingOption(where="endpoint", available=False, detail=f"the ledger could not be read: {exc}")
    urls = [f"{record.id}: {record.details.get('endpoint_url') or record.host}" for record in ready]
    if urls:
        return ServingOption(where="endpoint", available=True, detail=(
            "deployments recorded ready (deployment_status confirms): " + "; ".join(urls)))
    return ServingOption(where="endpoint", available=False, detail="no deployment recorded ready in the ledger",
                         how_to_get="launch_deployment, or give a config the URL of a server you run (target.api_endpoint)")


def serving_options(gpus: list[GpuInfo], gpu_detail: str, docker_ok: bool, docker_detail: str) -> list[ServingOption]:
    """Where a model can be served from this machine: vLLM on the CPU, GPUs, Docker, SLURM, endpoints already up."""
    gpu = ServingOption(where="gpu", available=bool(gpus), detail=gpu_detail if not gpus else ", ".join(
        f"{g.index}: {g.name}" for g in gpus[:16]), how_to_get=None if gpus else (
        "no GPU here: vLLM's CPU build serves small models; larger or FP8/FP4 ones need a SLURM cluster or an endpoint"))
    docker = ServingOption(where="docker", available=docker_ok, detail=docker_detail, how_to_get=None if docker_ok else (
        "start a Docker daemon (apt-get install docker.io) for NEL's local executor; nel-next and vLLM's CPU build "
        "do not need one"))
    return [_local_vllm(), gpu, docker, _slurm_option(), _endpoints()]


def _nel_programs(executor: str | None) -> dict[str, tuple[str, ...]]:
    """The programs NEL 0.2.6 runs on this machine for a run on the executor (every executor when None)."""
    programs = engines.by_name("nel").run.local_programs
    return {executor: programs[executor]} if executor else dict(programs)


def executor_binaries(executor: str | None = None) -> list[LocalBinary]:
    """The local binaries NEL's executor (both when None) runs, each with where PATH has it."""
    return [LocalBinary(executor=name, binary=binary, path=shutil.which(binary), debian_package=DEBIAN_PACKAGES[binary])
            for name, programs in _nel_programs(executor).items() for binary in programs]


# The checkout's examples (absent from an installed wheel): mcp_server/quanteval -> the repository root.
EXAMPLE_BENCHMARKS = Path(__file__).resolve().parents[3] / "examples" / "benchmarks"


def _example_benchmarks() -> list[str]:
    found = [*EXAMPLE_BENCHMARKS.glob("*.py"), *EXAMPLE_BENCHMARKS.glob("*.jsonl"), *EXAMPLE_BENCHMARKS.glob("*/benchmark_map.json")]
    return sorted(str(path) for path in found)


def check_cluster(host: str, settings: evaluate_cluster.ClusterSettings) -> ClusterCheck:
    """The cluster as evaluate_quantization's preflight asks it (the same probe), reported instead of refused."""
    try:
        found = evaluate_cluster.probe(host, settings, {}, make_output_dir=False)  # a read-only tool
    except ToolError as exc:
        return ClusterCheck(host=host, reachable=False, detail=str(exc))
    missing = [m for m in (found.nel_next_missing, found.vllm_missing, found.output_dir_unwritable) if m]
    return ClusterCheck(
        host=host, reachable=True, detail=f"user {found.info.user}, partitions answered in {found.info.query_s:.1f} s",
        default_partition=found.info.default_partition, partitions=found.info.partitions, nel_next=found.nel,
        vllm=found.vllm_release, output_dir=found.output_dir, missing=missing)


def check_environment(request: CheckEnvironmentInput) -> EnvironmentReport:
    """Use first: what can serve a model here (vLLM on CPU, GPUs, Docker, SLURM, endpoints), versions, ssh hosts,
    env vars; what is missing, how to get it.
    """
    if request.host is None and request.cluster is not None:
        raise ToolError("cluster: given without host. Give host, the cluster's login alias in ~/.ssh/config, or leave "
                        "cluster out.")
    docker_ok, docker_detail = _docker_status()
    gpus, gpu_detail = _gpus(request.probe_gpus)
    set_names = set_env_var_names()
    # `nel` comes with the nemo-evaluator-launcher package, so look beside this interpreter too (an unactivated venv).
    nel = shutil.which("nel") or shutil.which("nel", path=str(Path(sys.executable).parent))
    root = os.environ.get("MODELOPT_WORKSPACE_ROOT")
    notes = []
    if not nel:
        notes.append("`nel` is not on PATH: install nemo-evaluator-launcher==0.2.6 (quanteval uses its Python API).")
    binaries = executor_binaries(request.executor)
    notes += [message for name, programs in _nel_programs(request.executor).items()
              if (message := missing_programs(f"NEL's {name} executor", programs))]
    if not docker_ok:
        notes.append("No Docker daemon: NEL's local executor cannot run here; use execution: slurm or a remote host.")
    serving = serving_options(gpus, gpu_detail, docker_ok, docker_detail)
    available = [option.where for option in serving if option.available]
    notes.append(f"Can serve here: {', '.join(available) or 'nothing yet'} (see serving).")
    notes += [f"No vLLM on this machine: {option.how_to_get}." for option in serving
              if option.where == "vllm" and option.how_to_get]
    if root and not Path(root).is_dir():
        notes.append(f"MODELOPT_WORKSPACE_ROOT={root} is not a directory.")
    cluster = check_cluster(request.host, request.cluster or evaluate_cluster.ClusterSettings()) if request.host else None
    if cluster is not None:
        notes += [f"Cluster {cluster.host}: " + (
            "cannot be reached (see cluster.detail)." if not cluster.reachable else
            f"{len(cluster.missing)} thing(s) a cluster evaluation needs are missing (see cluster.missing)."
            if cluster.missing else "nel-next and vLLM found; evaluate_quantization can run there.")]
    return EnvironmentReport(
        python=sys.version.split()[0],
        platform=f"{platform.system()} {platform.machine()}",
        quanteval=__version__,
        packages={name: _version(name) for name in PACKAGES} | {"vllm": _version("vllm") or vllm_venv_version()},
        nel_on_path=nel,
        quanteval_cli=shutil.which("quanteval") or shutil.which("quanteval", path=str(Path(sys.executable).parent)),
        docker_daemon=docker_ok,
        docker_detail=docker_detail,
        gpus=gpus,
        gpu_detail=gpu_detail,
        ssh_hosts=ssh_config_hosts(),
        executor_binaries=binaries,
        env_vars_set=sorted(set_names),
        env_vars_unset=sorted(set(KNOWN_ENV_VARS) - set(set_names)),
        workspace_root=root,
        workspaces=_workspaces(root),
        serving=serving,
        example_benchmarks=_example_benchmarks(),
        cluster=cluster,
        notes=notes,
    )
