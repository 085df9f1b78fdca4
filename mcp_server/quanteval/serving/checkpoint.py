"""inspect_checkpoint: facts about a checkpoint from its config files and safetensors headers (never tensor data).

The report models are the contract other domains build on (nelconfig.apply_checkpoint, deploy.plan_deployment):
fields may be added, not renamed. The report's quantization part (QuantizationInfo) is read in
quanteval.serving.quantformat, its weights part (WeightsInfo) in quanteval.serving.weights. The sizing facts
(GPU_TYPES, the memory rule) live here once; what the serving frameworks do with a format lives in
quanteval.serving.frameworks.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, ValidationError

from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress
from quanteval.serving import frameworks
from quanteval.serving.frameworks import Framework
from quanteval.serving.quantformat import (
    QuantizationInfo,
    TensorPrecision,
    config_int,
    detect_quantization,
    format_warnings,
    framework_verdict,
)
from quanteval.serving.weights import WeightsInfo, module_bits, read_json, read_weights, row_values, weight_files

# --- Fact tables --------------------------------------------------------------------------------

# Nominal memory per GPU type inspect_checkpoint sizes for, in GB (10^9 bytes), as sold.
GPU_TYPES: dict[str, float] = {name: frameworks.GPUS[name].memory_gb for name in frameworks.SIZED_GPUS}

# Memory rule: the weights may fill at most this fraction of the GPUs' total memory; the rest is
# KV cache, activations and CUDA graphs (SGLang's --mem-fraction-static defaults sit near 0.85-0.9).
WEIGHT_MEMORY_FRACTION = 0.85
# Tensor parallelism stays inside one node; beyond that, nodes are added (pipeline parallel).
MAX_GPUS_PER_NODE = 8

# --- Report models ------------------------------------------------------------------------------


class InspectCheckpointInput(StrictModel):
    checkpoint: str = Field(description="Checkpoint directory, or HF handle (org/name) in the local cache.")


class ArchitectureInfo(BaseModel):
    architecture: str | None = Field(None, description="First entry of config.json `architectures`.")
    model_type: str | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = Field(None, description="Attention head size: config head_dim, else hidden_size / num_attention_heads.")
    vocab_size: int | None = None
    torch_dtype: str | None = None
    multimodal: bool = Field(False, description="The language model's settings come from config.json `text_config`.")


class GpuFit(BaseModel):
    gpu_type: str = Field(description="H100 (80 GB), H200 (141 GB) or B200 (180 GB).")
    memory_gb: float
    min_gpus: int = Field(description="Fewest GPUs that hold the weights with KV-cache headroom.")
    tensor_parallel_size: int = Field(
        description="Per node: the smallest power of two >= the GPUs needed that divides the attention heads, else the smallest such divisor."
    )
    nodes: int = Field(1, description="Nodes of 8 GPUs needed (pipeline parallel across nodes when > 1).")
    note: str | None = None


class FrameworkFlags(BaseModel):
    framework: Framework
    args: list[str] = Field(description="Server arguments the checkpoint needs (context length, trust-remote-code, quantization).")
    quantization: str | None = Field(None, description="The --quantization value, only where this framework needs one.")
    notes: list[str] = Field(default_factory=list)


class CheckpointReport(BaseModel):
    checkpoint: str = Field(description="Resolved local directory that was read.")
    hf_handle: str | None = Field(None, description="The HF handle, when the input was one.")
    architecture: ArchitectureInfo
    weights: WeightsInfo
    quantization: QuantizationInfo
    context_length: int | None = Field(None, description="max_position_embeddings (or the model's own equivalent).")
    trust_remote_code: bool = Field(False, description="config.json has auto_map: servers need --trust-remote-code.")
    chat_template: bool = Field(True, description=(
        "The tokenizer has a chat template (tokenizer_config.json or chat_template.jinja). Without one a chat endpoint "
        "refuses requests: evaluate a base model through a completions endpoint."))
    reasoning: bool = Field(False, description="The chat template has a thinking/reasoning toggle.")
    tool_calling: bool = Field(False, description="The chat template renders tools.")
    generation_defaults: dict[str, float | int] = Field(
        default_factory=dict, description="Sampling defaults from generation_config.json (temperature, top_p, top_k, ...)."
    )
    weight_memory_gb: float = 0.0
    gpu_fit: list[GpuFit] = Field(default_factory=list)
    deployment_flags: dict[str, FrameworkFlags] = Field(default_factory=dict)
    warnings: list[str] = Field(default_factory=list)
    files_read: list[str] = Field(default_factory=list)
    _conflicts: list[str] = PrivateAttr(default_factory=list)  # config_conflicts, among the warnings: plans refuse them


# --- Locating the checkpoint --------------------------------------------------------------------

_HF_HANDLE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hf_hub_cache() -> Path:
    """The local HF hub cache, resolved the way huggingface_hub does (HF_HUB_CACHE, HF_HOME/hub, default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def _resolve_hf_handle(handle: str) -> Path:
    """The snapshot directory of a cached HF model (refs/main), without touching the network."""
    cache = hf_hub_cache()
    repo_dir = cache / ("models--" + handle.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        raise ToolError(
            f"{handle}: not a local directory and not in the HF cache {cache} (no {repo_dir.name}). "
            f"Download it first (`huggingface-cli download {handle}`), set HF_HUB_CACHE/HF_HOME to the cache that has it, "
            "or pass the checkpoint directory."
        )
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        snapshot = snapshots / ref.read_text(encoding="utf-8").strip()
        if snapshot.is_dir():
            return snapshot
        raise ToolError(f"{ref}: points at snapshot {snapshot.name}, which is not in {snapshots}. Re-download {handle}.")
    candidates = [p for p in snapshots.iterdir() if p.is_dir()]
    if len(candidates) == 1:
        return candidates[0]
    raise ToolError(
        f"{repo_dir}: no refs/main and {len(candidates)} snapshots; pass the snapshot directory you want "
        f"({snapshots}/<revision>)."
    )


def _locate(path: str) -> tuple[Path, str | None]:
    root = Path(path).expanduser()
    if root.is_dir():
        return root, None
    if root.exists():
        raise ToolError(f"{root}: is a file; pass the checkpoint directory that holds config.json")
    if _HF_HANDLE.match(path) and not path.startswith((".", "~")):
        return _resolve_hf_handle(path), path
    raise ToolError(f"{root}: no such checkpoint directory. Pass a directory with config.json or a cached HF handle (org/name).")


# --- Reading files ------------------------------------------------------------------------------


def _read_optional_json(root: Path, name: str, files_read: list[str]) -> dict | None:
    path = root / name
    if not path.is_file():
        return None
    files_read.append(name)
    return read_json(path)


# --- Chat template, memory, flags ---------------------------------------------------------------


def _chat_template(root: Path, tokenizer_config: dict | None, files_read: list[str]) -> str:
    template: Any = (tokenizer_config or {}).get("chat_template") or ""
    if isinstance(template, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        template = "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    jinja = root / "chat_template.jinja"  # newer transformers save the template as its own file
    if jinja.is_file():
        files_read.append(jinja.name)
        template = f"{template}\n{jinja.read_text(encoding='utf-8', errors='replace')}"
    return str(template)


_REASONING_MARKERS = ("enable_thinking", "<think>", "reasoning_content", "thinking", "reasoning")
_TOOL_MARKERS = re.compile(r"\btools\b|tool_calls|\btool_call\b")


def _gpu_fit(weight_bytes: int, num_heads: int | None, quant: QuantizationInfo) -> list[GpuFit]:
    fits = []
    for gpu, memory_gb in GPU_TYPES.items():
        usable = memory_gb * 1e9 * WEIGHT_MEMORY_FRACTION
        min_gpus = max(1, math.ceil(weight_bytes / usable))
        nodes = math.ceil(min_gpus / MAX_GPUS_PER_NODE)
        per_node = math.ceil(min_gpus / nodes)
        heads = num_heads or MAX_GPUS_PER_NODE
        # A power of two first (what kernels and NCCL like best), then any divisor of the heads.
        tp = next((t for t in (1, 2, 4, 8) if t >= per_node and heads % t == 0), None) or next(
            (t for t in range(per_node, MAX_GPUS_PER_NODE + 1) if heads % t == 0), None
        )
        # What the format means on this GPU, framework by framework (errors first).
        hardware = [
            message
            for f in frameworks.FRAMEWORKS
            for level, message in sorted(framework_verdict(f, quant, gpu).findings)
            if gpu in message
        ] if quant.detected else []
        note = None
        if tp is None:
            tp = MAX_GPUS_PER_NODE
            note = f"No tensor-parallel size from {per_node} to {MAX_GPUS_PER_NODE} divides the {heads} attention heads; plan the split by hand."
        elif hardware:
            note = " ".join(hardware)
        elif nodes > 1:
            note = f"{nodes} nodes: tensor parallel {tp} within a node, pipeline parallel {nodes} across nodes."
        fits.append(GpuFit(gpu_type=gpu, memory_gb=memory_gb, min_gpus=min_gpus, tensor_parallel_size=tp, nodes=nodes, note=note))
    return fits


def _head_dim(hidden: int | None, heads: int | None) -> int | None:
    return hidden // heads if hidden and heads else None


def _config_value(config: dict, text_config: dict, *keys: str) -> Any:
    """The first of `keys` the language model's config sets, else config.json's: multimodal configs keep the
    language model's shape under text_config."""
    model = text_config or config
    return next((model[k] for k in keys if model.get(k) is not None), None) or next(
        (config[k] for k in keys if config.get(k) is not None), None
    )


def _architecture(config: dict, text_config: dict) -> ArchitectureInfo:
    def pick(*keys: str) -> int | None:
        return config_int(_config_value(config, text_config, *keys))

    heads = pick("num_attention_heads", "n_head")
    return ArchitectureInfo(
        architecture=(config.get("architectures") or [None])[0],
        model_type=config.get("model_type"),
        num_layers=pick("num_hidden_layers", "n_layer", "num_layers"),
        hidden_size=pick("hidden_size", "n_embd", "d_model"),
        num_attention_heads=heads,
        num_kv_heads=pick("num_key_value_heads", "num_kv_heads", "n_head_kv") or heads,
        head_dim=pick("head_dim") or _head_dim(pick("hidden_size", "n_embd", "d_model"), heads),
        vocab_size=pick("vocab_size"),
        torch_dtype=_config_value(config, text_config, "torch_dtype", "dtype"),
        multimodal=bool(text_config),
    )


def _deployment_flags(context_length: int | None, trust_remote_code: bool, quant: QuantizationInfo) -> dict[str, FrameworkFlags]:
    flags: dict[str, FrameworkFlags] = {}
    for framework in frameworks.FRAMEWORKS:
        info = frameworks.FRAMEWORK_INFO[framework]
        args: list[str] = [info.context_flag, str(context_length)] if context_length else []
        if trust_remote_code:
            args.append(info.trust_remote_code_flag)
        verdict = framework_verdict(framework, quant)
        notes = [f"{level}: {message}" for level, message in verdict.findings] + verdict.notes
        support = frameworks.support(framework, quant.format)
        loads = not any(level == "error" for level, _ in verdict.findings)
        if quant.detected and loads and not support.rejected and not support.unverified and support.resolves_as and not verdict.quantization:
            notes.append(f"Reads the checkpoint's quantization config itself (resolves it as {support.resolves_as}); no --quantization needed.")
        flags[framework] = FrameworkFlags(framework=framework, args=args + verdict.args, quantization=verdict.quantization, notes=notes)  # type: ignore[arg-type]
    return flags


def _quant_warnings(quant: QuantizationInfo, weights: WeightsInfo) -> list[str]:
    warnings = format_warnings(quant)
    if quant.method == "modelopt" and quant.quant_algo and frameworks.modelopt_algo(quant.quant_algo) is None:
        warnings.append(f"quant_algo {quant.quant_algo} is not one quanteval knows; check that your server supports it.")
    low_bit = {"F8_E4M3", "F8_E5M2", "I8"}
    if not quant.detected and low_bit & set(weights.dtype_parameters):
        warnings.append(
            f"Weights hold {', '.join(sorted(low_bit & set(weights.dtype_parameters)))} tensors but no quantization config was found; "
            "the checkpoint may be missing hf_quant_config.json or config.json quantization_config."
        )
    return warnings


# Any tensor stored below 16 bits, packed ones included (U8, I32): a checkpoint without one is not quantized.
LOW_BIT_DTYPES = {"F8_E4M3", "F8_E5M2", "I8", "U8", "I32"}


DEQUANTIZED_MAX_VALUES, DEQUANTIZED_MIN_ROW = 16, 64  # at most 4-bit codes in a row long enough to tell


def carries_no_quantization(report: CheckpointReport) -> bool:
    """No quantization config and 16/32-bit weights off any quantization grid (read from a weight row): whatever its
    name, no loss of it is quantization's."""
    if report.weights.row_values is None:
        return False
    values, length = report.weights.row_values
    return not (1 < values <= DEQUANTIZED_MAX_VALUES and length >= DEQUANTIZED_MIN_ROW)


def unquantized_warning(report: CheckpointReport) -> str | None:
    """A checkpoint with no quantization config and only 16/32-bit weights is not quantized, whatever its name, unless
    its weights sit on a quantization grid (stored dequantized): said either way, so that one evaluated as a quantized
    candidate is named for what it is."""
    if report.weights.row_values is None:
        return None
    values, length = report.weights.row_values
    dtypes = ", ".join(sorted(report.weights.dtype_parameters))
    if values <= 1:
        return (f"constant weights: a weight row of {length} holds one value ({dtypes}, no quantization config): "
                "untrained or zeroed weights, not a model to evaluate.")
    if values <= DEQUANTIZED_MAX_VALUES and length >= DEQUANTIZED_MIN_ROW:
        return (f"stored dequantized: no quantization config and {dtypes} weights, but a weight row of {length} holds "
                f"{values} distinct values: quantized weights (at most 4-bit) at full-precision storage, so it has "
                "the quantized accuracy, not the quantized size or speed.")
    return (f"no quantization: no quantization config, only {dtypes} weights, and a weight row of {length} holds "
            f"{values} distinct values: this checkpoint is not quantized (a full-precision baseline is; a quantized "
            "candidate is not).")


# The config values each SHAPED tensor's (rows, columns) state.
_SHAPE_STATES = {"embed_tokens.weight": ("vocab_size", "hidden_size"),
                 "mlp.gate_proj.weight": ("intermediate_size", "hidden_size"),
                 "mlp.up_proj.weight": ("intermediate_size", "hidden_size"),
                 "mlp.down_proj.weight": ("hidden_size", "intermediate_size")}


def config_conflicts(weights: WeightsInfo, config: dict, text_config: dict) -> list[str]:
    """Where config.json contradicts the weights' own shapes. vLLM builds the model from the config and loads what
    fits: a narrower config serves a slice of each weight without a word (every answer wrong), a wider one fails."""
    found: dict[str, str] = {}
    for suffix, (name, shape) in weights._shapes.items():
        for size, key in zip(shape, _SHAPE_STATES[suffix], strict=True):
            said = config_int(_config_value(config, text_config, key))
            if said is not None and said != size and key not in found:
                found[key] = (f"config.json says {key} {said}, but {name} is {shape[0]} x {shape[1]} ({size}): the "
                              "config does not describe these weights (a server builds the model from the config and "
                              "loads a slice of each weight, or fails). Fix config.json from the weights' producer.")
    return list(found.values())


# --- The tool -----------------------------------------------------------------------------------


def inspect_checkpoint(request: InspectCheckpointInput, progress: ProgressFn = no_progress) -> CheckpointReport:
    """Use before build_config or plan_deployment: a checkpoint's architecture, size, quantization, context length, GPU fit
    and framework flags.
    """
    root, hf_handle = _locate(request.checkpoint)
    try:
        return _inspect(root, hf_handle, progress)
    except ValidationError as exc:  # a config value of the wrong type (e.g. "group_size": "big")
        error = exc.errors()[0]
        where = _MODEL_SOURCES.get(exc.title, "a config file")
        raise ToolError(
            f"{root}: {where} has an unusable value for {'.'.join(str(p) for p in error['loc'])} "
            f"({error['input']!r}: {error['msg']}). Fix that value in the file."
        ) from None


# Which files feed each report model, to name them when a value has the wrong type.
_MODEL_SOURCES = {
    "QuantizationInfo": "the quantization config (config.json quantization_config, hf_quant_config.json or quantize_config.json)",
    "ArchitectureInfo": "config.json",
    "CheckpointReport": "config.json or generation_config.json",
}


def _inspect(root: Path, hf_handle: str | None, progress: ProgressFn) -> CheckpointReport:
    config_path = root / "config.json"
    if not config_path.is_file():
        raise ToolError(f"{root}: no config.json; point at the folder that holds the checkpoint's config.json")
    files_read = ["config.json"]
    warnings: list[str] = []
    config = read_json(config_path)
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    hf_quant = _read_optional_json(root, "hf_quant_config.json", files_read)
    quantize_cfg = _read_optional_json(root, "quantize_config.json", files_read)
    generation = _read_optional_json(root, "generation_config.json", files_read) or {}
    tokenizer_config = _read_optional_json(root, "tokenizer_config.json", files_read)

    quant = detect_quantization(config, text_config, hf_quant, quantize_cfg, warnings)
    files, missing = weight_files(root, files_read, warnings)
    if not files and not missing:
        warnings.append(f"{root}: no *.safetensors files; parameter count and memory estimate are unavailable.")
    weights = read_weights(files, missing, quant, progress, module_bits(config) if quant.method == "compressed-tensors" else None)
    if not quant.detected and weights.dtype_parameters and not LOW_BIT_DTYPES & set(weights.dtype_parameters):
        weights.row_values = row_values(files)

    architecture = _architecture(config, text_config)
    context_length = config_int(_config_value(config, text_config, "max_position_embeddings", "max_sequence_length", "seq_length", "n_positions"))
    trust_remote_code = bool(config.get("auto_map"))
    template = _chat_template(root, tokenizer_config, files_read)
    weight_memory_gb = round(weights.weight_bytes / 1e9, 3)
    conflicts = config_conflicts(weights, config, text_config)
    warnings += _quant_warnings(quant, weights) + conflicts
    report = CheckpointReport(
        checkpoint=str(root.resolve()),
        hf_handle=hf_handle,
        architecture=architecture,
        weights=weights,
        quantization=quant,
        context_length=context_length,
        trust_remote_code=trust_remote_code,
        chat_template=bool(template.strip()),
        reasoning=any(marker in template for marker in _REASONING_MARKERS),
        tool_calling=bool(_TOOL_MARKERS.search(template)),
        generation_defaults={
            k: v for k, v in generation.items()
            if k in ("temperature", "top_p", "top_k", "max_new_tokens", "repetition_penalty") and isinstance(v, (int, float))
        },  # fmt: skip
        weight_memory_gb=weight_memory_gb,
        gpu_fit=_gpu_fit(weights.weight_bytes, architecture.num_attention_heads, quant) if weights.weight_bytes else [],
        deployment_flags=_deployment_flags(context_length, trust_remote_code, quant),
        warnings=warnings,
        files_read=files_read,
    )
    if unquantized := unquantized_warning(report):
        report.warnings.append(unquantized)
    report._conflicts = conflicts
    return report


def _human_bytes(count: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


def _precision_text(p: TensorPrecision) -> str:
    text = f"{p.bits or '?'}-bit {p.kind or ''}".strip()
    if p.dynamic is not None:
        text += " dynamic" if p.dynamic else " static"
    return text


def format_report(report: CheckpointReport) -> str:
    """A short human-readable summary for `quanteval inspect`."""
    arch = report.architecture
    quant = report.quantization
    weights = report.weights
    params = f"{weights.parameter_count:,} stored"
    if weights.logical_parameter_count is not None and weights.logical_parameter_count != weights.parameter_count:
        params += f" ({weights.logical_parameter_count:,} logical, packed low-bit weights unpacked)"
    dtypes = ", ".join(f"{dtype} {count:,}" for dtype, count in sorted(weights.dtype_parameters.items(), key=lambda kv: -kv[1]))
    lines = [
        f"checkpoint:    {report.checkpoint}" + (f"  (HF {report.hf_handle})" if report.hf_handle else ""),
        f"architecture:  {arch.architecture} ({arch.model_type}{', multimodal' if arch.multimodal else ''}): "
        f"{arch.num_layers} layers, hidden {arch.hidden_size}, {arch.num_attention_heads} heads / {arch.num_kv_heads} kv, vocab {arch.vocab_size}",
        f"parameters:    {params}",
        f"tensors:       {weights.tensor_count:,} in {weights.shard_count} file(s); dtypes: {dtypes or 'none'}",
        f"size:          {_human_bytes(weights.size_bytes)} on disk, {_human_bytes(weights.weight_bytes)} of weights",
    ]
    if quant.detected:
        details = [f"method {quant.method}"]
        if quant.quant_algo:
            details.append(f"quant_algo {quant.quant_algo}")
        if quant.weight_bits:
            details.append(f"{quant.weight_bits}-bit weights")
        if quant.group_size:
            details.append(f"group size {quant.group_size}")
        if quant.kv_cache_quant_algo:
            details.append(f"KV cache {quant.kv_cache_quant_algo}")
        details.append("activations " + (_precision_text(quant.activations) if quant.activations else "16-bit (weight-only)"))
        if quant.layer_algos:
            details.append("layers " + ", ".join(f"{a}: {n}" for a, n in quant.layer_algos.items()))
        if quant.exclude_modules:
            shown = ", ".join(quant.exclude_modules[:4]) + (" ..." if len(quant.exclude_modules) > 4 else "")
            details.append(f"excluded {shown}")
        source = f" [{quant.source_file}" + (f", {quant.producer}]" if quant.producer else "]")
        lines.append(f"quantization:  {'; '.join(details)}{source}")
    else:
        lines.append("quantization:  none detected")
    lines.append(
        f"context:       {report.context_length}; trust-remote-code {'yes' if report.trust_remote_code else 'no'}; "
        f"reasoning toggle {'yes' if report.reasoning else 'no'}; tool calling {'yes' if report.tool_calling else 'no'}"
    )
    if report.generation_defaults:
        lines.append("sampling:      " + ", ".join(f"{k}={v}" for k, v in report.generation_defaults.items()))
    for fit in report.gpu_fit:
        lines.append(
            f"fits on:       {fit.min_gpus} x {fit.gpu_type} ({fit.memory_gb:g} GB), TP {fit.tensor_parallel_size}"
            + (f", {fit.nodes} nodes" if fit.nodes > 1 else "")
            + (f"  ! {fit.note}" if fit.note else "")
        )
    for name, flags in report.deployment_flags.items():
        lines.append(f"{name + ':':<15}{' '.join(flags.args) or '(no extra flags)'}")
    lines += [f"warning:       {w}" for w in report.warnings]
    return "\n".join(lines)
