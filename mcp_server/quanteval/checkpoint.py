"""inspect_checkpoint: facts about a checkpoint from its config files and safetensors headers (never tensor data).

The report models below are the contract other domains build on (nelconfig.apply_checkpoint,
deploy.plan_deployment): fields may be added, not renamed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress

Framework = Literal["vllm", "sglang", "trtllm"]


class InspectCheckpointInput(StrictModel):
    path: str = Field(description="Checkpoint directory, or a Hugging Face handle (org/name) already in the local HF cache.")


class ArchitectureInfo(BaseModel):
    architecture: str | None = Field(None, description="First entry of config.json `architectures`.")
    model_type: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    vocab_size: int | None = None
    torch_dtype: str | None = None


class WeightsInfo(BaseModel):
    parameter_count: int = Field(0, description="Sum of tensor element counts from safetensors headers.")
    tensor_count: int = 0
    shard_count: int = 0
    dtype_parameters: dict[str, int] = Field(default_factory=dict, description="Parameters per safetensors dtype.")
    size_bytes: int = Field(0, description="Bytes of all weight files on disk.")
    missing_shards: list[str] = Field(default_factory=list, description="Shards named in the index but absent.")


class QuantizationInfo(BaseModel):
    detected: bool = False
    method: str | None = Field(None, description="modelopt, compressed-tensors, awq, gptq, fp8, bitsandbytes, ...")
    quant_algo: str | None = Field(None, description="ModelOpt quant_algo: FP8, NVFP4, W4A16_AWQ, MIXED_PRECISION, ...")
    kv_cache_quant_algo: str | None = None
    group_size: int | None = None
    exclude_modules: list[str] = Field(default_factory=list)
    producer: str | None = Field(None, description="Tool and version that wrote the checkpoint, e.g. 'modelopt 0.29.0'.")
    source_file: str | None = Field(None, description="The file that said so (hf_quant_config.json, config.json, ...).")


class GpuFit(BaseModel):
    gpu_type: str = Field(description="H100 (80 GB), H200 (141 GB) or B200 (180 GB).")
    memory_gb: float
    min_gpus: int = Field(description="Fewest GPUs that hold the weights with KV-cache headroom.")
    tensor_parallel_size: int = Field(description="Smallest TP >= min_gpus that divides the attention heads.")


class FrameworkFlags(BaseModel):
    framework: Framework
    args: list[str] = Field(description="Server arguments the checkpoint needs (context length, trust-remote-code, quantization).")
    quantization: str | None = Field(None, description="The --quantization value, only where this framework needs one.")
    notes: list[str] = Field(default_factory=list)


class CheckpointReport(BaseModel):
    path: str = Field(description="Resolved local directory that was read.")
    hf_handle: str | None = Field(None, description="The HF handle, when the input was one.")
    architecture: ArchitectureInfo
    weights: WeightsInfo
    quantization: QuantizationInfo
    context_length: int | None = Field(None, description="max_position_embeddings (or the model's own equivalent).")
    trust_remote_code: bool = Field(False, description="config.json has auto_map: servers need --trust-remote-code.")
    reasoning: bool = Field(False, description="The chat template has a thinking/reasoning toggle.")
    tool_calling: bool = Field(False, description="The chat template renders tools.")
    weight_memory_gb: float = 0.0
    gpu_fit: list[GpuFit] = Field(default_factory=list)
    deployment_flags: dict[str, FrameworkFlags] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    files_read: list[str] = Field(default_factory=list)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ToolError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise ToolError(f"{path}: expected a JSON object")
    return data


def inspect_checkpoint(request: InspectCheckpointInput, progress: ProgressFn = no_progress) -> CheckpointReport:
    """Read a checkpoint's config files and safetensors headers (never tensor data) and report architecture,
    parameter count, quantization (ModelOpt quant_algo, KV-cache, excluded modules), context length,
    trust-remote-code, GPU memory fit and per-framework deployment flags, with warnings. Use it before
    building a config or planning a deployment for a local checkpoint or a cached HF handle."""
    root = Path(request.path).expanduser()
    if not root.is_dir():
        raise ToolError(f"{root}: no such checkpoint directory")
    config_path = root / "config.json"
    if not config_path.is_file():
        raise ToolError(f"{root}: no config.json; point at the folder that holds the checkpoint's config.json")
    config = _read_json(config_path)
    return CheckpointReport(
        path=str(root.resolve()),
        architecture=ArchitectureInfo(
            architecture=(config.get("architectures") or [None])[0],
            model_type=config.get("model_type"),
        ),
        weights=WeightsInfo(),
        quantization=QuantizationInfo(),
        context_length=config.get("max_position_embeddings"),
        files_read=["config.json"],
    )


def format_report(report: CheckpointReport) -> str:
    """A short human-readable summary for `quanteval inspect`."""
    arch = report.architecture
    quant = report.quantization
    lines = [
        f"checkpoint: {report.path}",
        f"architecture: {arch.architecture} ({arch.model_type})",
        f"parameters: {report.weights.parameter_count:,}",
        f"quantization: {quant.method or 'none'} {quant.quant_algo or ''}".rstrip(),
        f"context length: {report.context_length}",
    ]
    lines += [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines)
