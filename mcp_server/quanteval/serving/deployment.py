"""A deployment as every host of one sees it: the plan, the launch request and its result, what a probe of the server
found, and the DeploymentHost protocol each host's module (serving.deploy_local, serving.deploy_slurm) implements.

How a server computes is part of what it serves (`Serving`): the same weights answer differently on another numeric
path. Measured with vLLM CPU 0.32 on a weak model (26% of 200 problems, greedy): `--enforce-eager` against vLLM's
default compiled path changed 38 answers, while BF16 -> W8A8 under one path changed 9; each path is deterministic
run to run. So two sides of a comparison are served alike, on the framework's default path unless asked otherwise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

from quanteval import ledger
from quanteval.models import StrictModel
from quanteval.serving.frameworks import Framework


class PlanWarning(BaseModel):
    level: Literal["error", "warning"] = Field(description="'error': the server will not start or serve correctly this way.")
    message: str


class ParserCheck(BaseModel):
    checked: bool = Field(description="Whether the framework's own argument parser was run on the server arguments.")
    ok: bool | None = Field(None, description="The parser accepted the arguments (None when not checked).")
    message: str
    resolved: dict[str, Any] = Field(default_factory=dict, description=(
        "What the framework's own config code resolves for a local checkpoint (vLLM: quantization, max_model_len, "
        "head_size, dtype, served_model_name); empty when not run."))
    this_machine: dict[str, Any] = Field(default_factory=dict, description=(
        "Measured on the machine quanteval runs on, not on the plan's GPU host: vllm_cpu_gemm_wna16, whether this "
        "machine's vLLM CPU build has its 4-bit weight-only GEMM (decides only whether W4A16 serves on this CPU)."))


class KernelPath(BaseModel):
    """The GEMM kernels the framework runs this checkpoint's format with on the plan's GPU (serving.frameworks'
    facts), and what they make of the accuracy measured there."""

    gpu: str
    compute_capability: float
    kernel: str | None = Field(description=(
        "int8 CUTLASS scaled-mm, Marlin FP4/FP8 weight-only kernels, native FP8 / FP4 (NVFP4) GEMM, ...; null: not "
        "served on this GPU, or no fact known (meaning says which)."))
    weight_only: bool | None = Field(description=(
        "True: activations enter the GEMMs 16-bit, whatever the checkpoint stores; null: unknown."))
    activations: str = Field(description="What the GEMMs take as activations: int8, FP8, FP4 (NVFP4), 16-bit, per layer.")
    meaning: str = Field(description="What is quantized there, and whether the accuracy measured is the one that ships.")


class Serving(BaseModel):
    """What two sides of a comparison must share for their delta to be the checkpoints' alone."""

    framework: Framework
    version: str | None = Field(None, description="The framework release installed here; null where it runs elsewhere.")
    launcher: str = Field(description="The command prefix that starts it (a stand-in or wrapper shows here).")
    device: Literal["gpu", "cpu"]
    numerics: Literal["default", "eager"] = Field(description=(
        "default: the framework's own path (CUDA graphs, torch.compile); eager: without them, which moves answers."))
    flags: list[str] = Field(default_factory=list, description="Server flags given beyond what the checkpoint decides.")


def serving_at(url: str) -> dict[str, Any] | None:
    """The serving of the live quanteval deployment answering at `url` (same host and port), from its record; None
    for a server quanteval did not start."""
    where = urlsplit(url).netloc
    for record in ledger.find(kind="deployment", limit=200):
        endpoint = record.details.get("endpoint_url")
        if record.status in ("loading", "ready") and endpoint and urlsplit(endpoint).netloc == where:
            return record.details.get("serving")
    return None


class DeploymentPlan(BaseModel):
    framework: Framework
    host: str | None = Field(None, description="The SLURM host alias the plan is for; null for this machine.")
    device: Literal["gpu", "cpu"] = Field("gpu", description="cpu: vLLM's CPU backend on this machine (no GPU here).")
    checkpoint: str = Field(description="What the server loads: the resolved checkpoint directory, or the HF handle.")
    served_model_name: str
    bind_address: str = Field(description="Address the server listens on.")
    port: int
    tensor_parallel_size: int
    gpu_type: str | None = None
    launcher: list[str] = Field(description="argv prefix that starts the server (replaceable via QUANTEVAL_<FRAMEWORK>_LAUNCHER).")
    server_args: list[str] = Field(description="Arguments after the launcher.")
    argv: list[str] = Field(description="The whole command: launcher + server_args.")
    command: str = Field(description="argv as one shell-quoted line.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables (no secrets) to set for the server.")
    warnings: list[PlanWarning] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    parser_check: ParserCheck
    serving: Serving
    kernel_path: KernelPath | None = Field(None, description=(
        "With gpu_type: the kernel path the framework takes for this checkpoint's format on that GPU's compute "
        "capability. Null on this machine's CPU and without gpu_type (name the GPU to learn it)."))


class LaunchDeploymentInput(StrictModel):
    plan: DeploymentPlan | None = Field(None, description="A plan from plan_deployment, as returned; or give checkpoint.")
    checkpoint: str | None = Field(None, description="Checkpoint to plan and launch in one step.")
    framework: Framework = Field("sglang", description="Framework when launching from checkpoint.")
    host: str | None = Field(
        None, description="SLURM login host alias for an sbatch job; omit (or 'local'): this machine."
    )
    port: int | None = Field(
        None, ge=1, le=65535,
        description="Port instead of the plan's; a busy explicit port is an error.",
    )
    startup_timeout_s: float = Field(
        1800, gt=0, description="Loading time before status 'timed_out'."
    )
    force: bool = Field(False, description="Launch even though the plan has error-level warnings.")
    # Patterns keep these single #SBATCH words: a newline would add lines to the job script.
    partition: str | None = Field(None, pattern=r"^[\w.,-]+$", description="SLURM partition (SLURM only).")
    account: str | None = Field(None, pattern=r"^[\w.-]+$", description="SLURM account (SLURM only).")
    time_limit: str = Field("04:00:00", pattern=r"^[\d:-]+$", description="SLURM time limit HH:MM:SS or D-HH:MM:SS (SLURM only).")
    remote_workdir: str = Field(
        ".quanteval/deployments", description="Directory on the host (relative to home) for job scripts and logs."
    )
    gpus_per_node: int | None = Field(
        None, ge=0, description="GPUs to request; default the plan's tensor_parallel_size."
    )


class LaunchDeploymentResult(BaseModel):
    record_id: str = Field(description="Ledger id; pass it to deployment_status and stop_deployment.")
    host: str | None = Field(None, description="The SLURM host alias; null for this machine.")
    status: str
    port: int
    endpoint_url: str | None = Field(None, description="OpenAI-compatible chat endpoint (SLURM: known once the job runs).")
    served_model_name: str
    command: str
    log_path: str = Field(description="Server log (on the SLURM host for SLURM jobs).")
    pid: int | None = None
    job_id: str | None = None
    notes: list[str] = Field(default_factory=list)


class Probe(BaseModel):
    health: int | None = None
    models: list[str] = Field(default_factory=list)
    max_model_len: int | None = None
    chat_latency_s: float | None = None
    chat_reply: str | None = None
    chat_error: str | None = None


def chat_body(name: str) -> dict[str, Any]:
    return {"model": name, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}


def read_models(probe: Probe, models: dict[str, Any]) -> None:
    data = [m for m in models.get("data", []) if isinstance(m, dict)]
    probe.models = [m.get("id") for m in data]
    lengths = [m["max_model_len"] for m in data if isinstance(m.get("max_model_len"), int)]
    probe.max_model_len = lengths[0] if lengths else None


def read_chat(probe: Probe, status: int, text: str) -> None:
    try:
        body = json.loads(text)
    except ValueError:
        body = {}
    if status == 200 and body.get("choices"):
        message = body["choices"][0].get("message") or {}
        # a reasoning model may spend 8 tokens thinking: its reply is then only reasoning_content
        probe.chat_reply = str(message.get("content") or message.get("reasoning_content") or "")[:200]
    else:
        probe.chat_error = f"HTTP {status}: {text[:300]}"


def with_option(args: list[str], flag: str, value: str) -> list[str]:
    args = list(args)
    if flag in args:
        args[args.index(flag) + 1] = value
    else:
        args += [flag, value]
    return args


@dataclass(frozen=True)
class Observation:
    """What a deployment host saw of its server: its process or job, the probe of its endpoint, its log."""

    process: str  # local: running / exited with code N; SLURM: the job state
    running: bool
    probe: Probe
    log_text: str
    endpoint: str | None  # the chat-completions URL; None while a SLURM job's node is unknown
    exit_code: int | None = None  # known for local servers only (a job's exit code needs accounting)
    owner_ended: bool = False  # local: the process it was tied to (an evaluation) ended, and stopped it


class DeploymentHost(Protocol):
    """Where a server runs: this machine or a SLURM job. One module per host implements it; `NAME` is the executor
    (clusters/executor.py) its ledger records name, which watches and stops its process or job."""

    NAME: str

    def launch(self, plan: DeploymentPlan, request: LaunchDeploymentInput) -> LaunchDeploymentResult: ...

    def observe(self, record: ledger.Record, chat: bool) -> Observation: ...

    def stop(self, record: ledger.Record, grace_s: float) -> tuple[bool, str, list[int]]:
        """(stopped, what was done, processes still alive)."""
        ...

    def memory_bytes(self, record: ledger.Record) -> int | None:
        """Memory the running server holds on this machine; None where it runs elsewhere."""
        ...

    def gone(self, record: ledger.Record) -> bool:
        """Known without asking anything remote that the server no longer runs (list_runs settles such records)."""
        ...
