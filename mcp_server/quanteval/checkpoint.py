"""inspect_checkpoint: facts about a checkpoint from its config files and safetensors headers (never tensor data).

The report models below are the contract other domains build on (nelconfig.apply_checkpoint,
deploy.plan_deployment): fields may be added, not renamed. The fact tables (GPU_TYPES,
MODELOPT_QUANT_ALGOS, the memory rule) live here once; import them rather than restating them.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field, ValidationError

from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress

Framework = Literal["vllm", "sglang", "trtllm"]

# --- Fact tables --------------------------------------------------------------------------------

# Nominal memory per GPU, in GB (10^9 bytes), as sold.
GPU_TYPES: dict[str, float] = {"H100": 80.0, "H200": 141.0, "B200": 180.0}
BLACKWELL_GPUS = frozenset({"B200"})

# Memory rule: the weights may fill at most this fraction of the GPUs' total memory; the rest is
# KV cache, activations and CUDA graphs (SGLang's --mem-fraction-static defaults sit near 0.85-0.9).
WEIGHT_MEMORY_FRACTION = 0.85
# Tensor parallelism stays inside one node; beyond that, nodes are added (pipeline parallel).
MAX_GPUS_PER_NODE = 8


@dataclass(frozen=True)
class QuantAlgoFacts:
    """What serving frameworks need to know about one ModelOpt quant_algo."""

    weight_bits: int | None
    needs_blackwell: bool = False  # NVFP4 kernels: SGLang errors on Hopper, vLLM falls back to Marlin W4A16
    trtllm_only: bool = False  # not in vLLM's or SGLang's ModelOpt algorithm lists
    fp8_compute: bool = False  # FP8 tensor cores: compute capability >= 8.9 (Ada, Hopper, Blackwell)
    # --quantization values, only where the framework cannot infer them from the checkpoint's config.
    # vLLM and SGLang map FP8* to modelopt/modelopt_fp8 and *FP4* to modelopt_fp4 themselves; for
    # MIXED_PRECISION older SGLang releases inferred `w4afp8` from hf_quant_config.json (wrong for
    # FP8/NVFP4 mixes), so both get the explicit modelopt_mixed, which matches the config and is safe.
    vllm_quantization: str | None = None
    sglang_quantization: str | None = None


MODELOPT_QUANT_ALGOS: dict[str, QuantAlgoFacts] = {
    "FP8": QuantAlgoFacts(8, fp8_compute=True),
    "FP8_PER_CHANNEL_PER_TOKEN": QuantAlgoFacts(8, fp8_compute=True),
    "FP8_PB_WO": QuantAlgoFacts(8, fp8_compute=True),
    "MXFP8": QuantAlgoFacts(8, needs_blackwell=True),
    "NVFP4": QuantAlgoFacts(4, needs_blackwell=True),
    "W4A16_NVFP4": QuantAlgoFacts(4, needs_blackwell=True),
    "NVFP4_AWQ": QuantAlgoFacts(4, needs_blackwell=True),
    "W4A16_AWQ": QuantAlgoFacts(4, trtllm_only=True),
    "W4A8_AWQ": QuantAlgoFacts(4, trtllm_only=True),
    "W8A16": QuantAlgoFacts(8, trtllm_only=True),
    "W8A8_SQ_PER_CHANNEL": QuantAlgoFacts(8, trtllm_only=True),
    "MIXED_PRECISION": QuantAlgoFacts(None, vllm_quantization="modelopt_mixed", sglang_quantization="modelopt_mixed"),
}

# Tensors that hold quantization metadata (scales, zero points, permutations), not model parameters.
_AUX_TENSOR_SUFFIXES = (
    "weight_scale", "weight_scale_2", "weight_scale_inv", "input_scale", "pre_quant_scale", "k_scale",
    "v_scale", "qzeros", "scales", "g_idx", "absmax", "quant_map", "nested_absmax", "nested_quant_map",
    "weight_zero_point", "weight_shape", "weight_global_scale", "input_global_scale", "quant_state.bitsandbytes__nf4",
    "quant_state.bitsandbytes__fp4",
)  # fmt: skip
_DTYPE_BITS = {
    "F64": 64, "I64": 64, "U64": 64, "F32": 32, "I32": 32, "U32": 32, "F16": 16, "BF16": 16, "I16": 16,
    "U16": 16, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "I8": 8, "U8": 8, "BOOL": 8, "F4": 4, "F6_E2M3": 6,
    "F6_E3M2": 6,
}  # fmt: skip

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
    vocab_size: int | None = None
    torch_dtype: str | None = None
    multimodal: bool = Field(False, description="The language model's settings come from config.json `text_config`.")


class WeightsInfo(BaseModel):
    parameter_count: int = Field(0, description="Sum of tensor element counts from safetensors headers.")
    logical_parameter_count: int | None = Field(
        None,
        description="Model parameters with packed low-bit weights unpacked (NVFP4/INT4 in uint8: x2, INT4 in int32: x8) "
        "and quantization scales/zeros left out; None when the packing is not known.",
    )
    tensor_count: int = 0
    shard_count: int = 0
    dtype_parameters: dict[str, int] = Field(default_factory=dict, description="Parameters per safetensors dtype.")
    weight_bytes: int = Field(0, description="Bytes of tensor data the headers declare (what a server loads).")
    size_bytes: int = Field(0, description="Bytes of all weight files on disk.")
    missing_shards: list[str] = Field(default_factory=list, description="Shards named in the index but absent.")


class QuantizationInfo(BaseModel):
    detected: bool = False
    method: str | None = Field(None, description="modelopt, compressed-tensors, awq, gptq, fp8, bitsandbytes, ...")
    quant_algo: str | None = Field(None, description="ModelOpt quant_algo: FP8, NVFP4, W4A16_AWQ, MIXED_PRECISION, ...")
    kv_cache_quant_algo: str | None = None
    group_size: int | None = None
    weight_bits: int | None = None
    exclude_modules: list[str] = Field(default_factory=list)
    layer_algos: dict[str, int] = Field(
        default_factory=dict, description="MIXED_PRECISION: number of quantized layers per quant_algo."
    )
    producer: str | None = Field(None, description="Tool and version that wrote the checkpoint, e.g. 'modelopt 0.29.0'.")
    source_file: str | None = Field(None, description="The file that said so (hf_quant_config.json, config.json, ...).")


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


def _read_json(path: Path) -> dict:
    try:
        # The stdlib parser shares repeated strings: a DeepSeek-sized index (~8 MB, 92k entries naming
        # 163 shards) peaks at ~34 MB here, against ~135 MB with orjson.
        data = json.loads(path.read_bytes())
    except json.JSONDecodeError as exc:
        raise ToolError(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}. Fix or re-download the file.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolError(f"{path}: cannot be read ({type(exc).__name__}). Check the file's permissions and encoding.") from None
    if not isinstance(data, dict):
        raise ToolError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _read_optional_json(root: Path, name: str, files_read: list[str]) -> dict | None:
    path = root / name
    if not path.is_file():
        return None
    files_read.append(name)
    return _read_json(path)


def read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON) and the bytes left for tensor data.

    Reads only the header, never tensor data. Raises ToolError naming the file when the header is
    cut short, longer than the file, or not JSON; callers check tensor offsets against the bytes left.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise ToolError(f"{path}: truncated safetensors file ({size} bytes, shorter than the 8-byte header length). Re-download it.")
            (header_len,) = struct.unpack("<Q", prefix)
            if 8 + header_len > size:
                raise ToolError(
                    f"{path}: header length {header_len} is larger than the file ({size} bytes): truncated or not a safetensors file. Re-download it."
                )
            raw = handle.read(header_len)
    except OSError as exc:
        raise ToolError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__}).") from None
    try:
        header = orjson.loads(raw)  # ~1.6x faster than json on the 163 headers of a DeepSeek-sized checkpoint
    except orjson.JSONDecodeError:
        raise ToolError(f"{path}: safetensors header is not valid JSON: corrupt file. Re-download it.") from None
    if not isinstance(header, dict):
        raise ToolError(f"{path}: safetensors header is not a JSON object: corrupt file. Re-download it.")
    return header, size - 8 - header_len


# --- Weights ------------------------------------------------------------------------------------


def _packing_factor(name: str, dtype: str, quant: QuantizationInfo) -> int | None:
    """How many logical weights one stored element holds; None for a packed tensor of unknown layout."""
    if dtype not in ("U8", "I32", "U32") or not name.endswith((".weight", ".qweight", ".weight_packed")):
        return 1
    if quant.method == "modelopt" and dtype == "U8":
        return 2  # ModelOpt stores every 4-bit format (NVFP4, INT4 AWQ) two values per uint8
    if quant.weight_bits and quant.weight_bits < 8:
        return _DTYPE_BITS[dtype] // quant.weight_bits  # GPTQ/AWQ/compressed-tensors: 8 int4 per int32
    return None if quant.detected else 1


def _weight_files(root: Path, files_read: list[str], warnings: list[str]) -> tuple[list[Path], list[str]]:
    """The safetensors shards to read (from the index when there is one) and the ones the index names but lacks."""
    index_path = root / "model.safetensors.index.json"
    if index_path.is_file():
        files_read.append(index_path.name)
        index = _read_json(index_path)
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ToolError(f"{index_path}: no `weight_map` object. Re-download the index file.")
        names = sorted(set(weight_map.values()))
        present = [root / name for name in names if (root / name).is_file()]
        missing = [name for name in names if not (root / name).is_file()]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            warnings.append(
                f"{index_path.name} names {len(missing)} shard(s) that are missing: {shown}. The download is incomplete; "
                "parameter counts and sizes cover only the shards present."
            )
        return present, missing
    return sorted(root.glob("*.safetensors")), []


def _read_weights(
    files: list[Path], missing: list[str], quant: QuantizationInfo, progress: ProgressFn
) -> WeightsInfo:
    # Plain locals in the loop: a DeepSeek-R1-sized checkpoint has ~92k tensors.
    tensor_count = parameter_count = weight_bytes = size_bytes = 0
    logical: int | None = 0
    dtype_parameters: dict[str, int] = {}
    for number, path in enumerate(files, start=1):
        header, data_bytes = read_safetensors_header(path)
        size_bytes += path.stat().st_size
        data_end = 0
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
                count = math.prod(shape)
            except (KeyError, TypeError, ValueError):
                raise ToolError(f"{path}: tensor {name!r} has no valid dtype/shape/data_offsets in the header: corrupt file. Re-download it.") from None
            tensor_count += 1
            parameter_count += count
            dtype_parameters[dtype] = dtype_parameters.get(dtype, 0) + count
            weight_bytes += end - begin
            if end > data_end:
                data_end = end
            if logical is not None and not name.endswith(_AUX_TENSOR_SUFFIXES):
                factor = _packing_factor(name, dtype, quant)
                logical = None if factor is None else logical + count * factor
        if data_end > data_bytes:
            raise ToolError(
                f"{path}: truncated: its tensors need {data_end} bytes of data but only {data_bytes} follow the header. Re-download it."
            )
        if len(files) > 1:
            progress(number, len(files), f"read header {number}/{len(files)}: {path.name}")
    return WeightsInfo(
        parameter_count=parameter_count,
        logical_parameter_count=logical,
        tensor_count=tensor_count,
        shard_count=len(files) + len(missing),
        dtype_parameters=dtype_parameters,
        weight_bytes=weight_bytes,
        size_bytes=size_bytes,
        missing_shards=missing,
    )


# --- Quantization detection ---------------------------------------------------------------------


def _producer(value: Any) -> str | None:
    if isinstance(value, dict) and value.get("name"):
        return f"{value['name']} {value.get('version', '')}".strip()
    return None


def _kv_algo(scheme: Any) -> str | None:
    if isinstance(scheme, str):
        return scheme
    if isinstance(scheme, dict) and scheme.get("num_bits") == 8 and scheme.get("type") == "float":
        return "FP8"
    if isinstance(scheme, dict) and scheme.get("num_bits"):
        return f"{scheme.get('type', 'int').upper()}{scheme['num_bits']}"
    return None


def _algo_from_group(group: dict) -> str | None:
    """The ModelOpt quant_algo one compressed-tensors style config group describes (ModelOpt's own mapping, reversed)."""
    weights = group.get("weights") or {}
    acts = group.get("input_activations") or {}
    bits, kind, group_size = weights.get("num_bits"), weights.get("type"), weights.get("group_size")
    if bits == 8 and kind == "float":
        if group_size == 32:
            return "MXFP8"
        return "FP8_PER_CHANNEL_PER_TOKEN" if weights.get("strategy") == "channel" else "FP8"
    if bits == 4 and kind == "float":
        if acts.get("num_bits") == 4:
            return "NVFP4"
        if acts.get("num_bits") == 8:
            return "W4A8_AWQ" if (group_size or 0) >= 128 else "W4A8_NVFP4_FP8"
        return "W4A16_NVFP4"
    if bits == 4 and kind == "int":
        return "W4A16_AWQ"
    if bits == 8 and kind == "int":
        return "W8A8_SQ_PER_CHANNEL" if acts else "W8A16"
    return None


def _from_modelopt_config_json(qc: dict) -> QuantizationInfo:
    groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
    quant_algo = qc.get("quant_algo")
    if not quant_algo:
        group_algos = {_algo_from_group(g) for g in groups}
        quant_algo = group_algos.pop() if len(group_algos) == 1 else ("MIXED_PRECISION" if group_algos else None)
    # MIXED_PRECISION group sizes are per layer (as in hf_quant_config.json), not one for the model.
    group_sizes = set() if quant_algo == "MIXED_PRECISION" else {g.get("weights", {}).get("group_size") for g in groups} - {None}
    info = QuantizationInfo(
        detected=True,
        method="modelopt",
        quant_algo=quant_algo,
        kv_cache_quant_algo=_kv_algo(qc.get("kv_cache_scheme")),
        group_size=qc.get("group_size") or (group_sizes.pop() if len(group_sizes) == 1 else None),
        exclude_modules=list(qc.get("ignore") or qc.get("exclude_modules") or []),
        producer=_producer(qc.get("producer")),
        source_file="config.json",
    )
    layers = qc.get("quantized_layers")
    if isinstance(layers, dict):
        info.layer_algos = _count_layer_algos(layers)
    elif quant_algo == "MIXED_PRECISION":
        info.layer_algos = {
            algo: len(g.get("targets") or []) for g in groups if (algo := _algo_from_group(g))
        }
    return info


def _count_layer_algos(layers: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for layer_cfg in layers.values():
        algo = layer_cfg.get("quant_algo", "?") if isinstance(layer_cfg, dict) else str(layer_cfg)
        counts[algo] = counts.get(algo, 0) + 1
    return counts


def _from_other_config_json(qc: dict, method: str) -> QuantizationInfo:
    info = QuantizationInfo(detected=True, method=method, source_file="config.json")
    info.exclude_modules = list(qc.get("modules_to_not_convert") or qc.get("ignore") or qc.get("ignored_layers") or [])
    if method in ("gptq", "awq", "auto-round", "gptq_marlin", "awq_marlin"):
        info.weight_bits = qc.get("bits") or qc.get("w_bit")
        info.group_size = qc.get("group_size") or qc.get("q_group_size")
    elif method == "fp8":
        info.weight_bits = 8
        block = qc.get("weight_block_size")
        info.group_size = block[-1] if isinstance(block, list) and block else None
    elif method == "bitsandbytes":
        info.weight_bits = 4 if qc.get("load_in_4bit") or qc.get("_load_in_4bit") else 8
    elif method == "compressed-tensors":
        groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
        bits = {(g.get("weights") or {}).get("num_bits") for g in groups} - {None}
        sizes = {(g.get("weights") or {}).get("group_size") for g in groups} - {None}
        info.weight_bits = bits.pop() if len(bits) == 1 else None
        info.group_size = sizes.pop() if len(sizes) == 1 else None
        info.kv_cache_quant_algo = _kv_algo(qc.get("kv_cache_scheme"))
    return info


def _from_hf_quant_config(data: dict) -> QuantizationInfo:
    section = data.get("quantization") if isinstance(data.get("quantization"), dict) else data
    info = QuantizationInfo(
        detected=bool(section.get("quant_algo")),
        method="modelopt",
        quant_algo=section.get("quant_algo"),
        kv_cache_quant_algo=section.get("kv_cache_quant_algo"),
        group_size=section.get("group_size"),
        exclude_modules=list(section.get("exclude_modules") or []),
        producer=_producer(data.get("producer")),
        source_file="hf_quant_config.json",
    )
    if isinstance(section.get("quantized_layers"), dict):
        info.layer_algos = _count_layer_algos(section["quantized_layers"])
    return info


def _from_quantize_config(data: dict) -> QuantizationInfo:
    return QuantizationInfo(
        detected=True,
        method=str(data.get("quant_method") or "gptq"),  # AutoGPTQ wrote this file without naming itself
        weight_bits=data.get("bits"),
        group_size=data.get("group_size"),
        source_file="quantize_config.json",
    )


def _detect_quantization(
    config: dict, text_config: dict, hf_quant: dict | None, quantize_cfg: dict | None, warnings: list[str]
) -> QuantizationInfo:
    """config.json quantization_config first (branching on quant_method), then the side files; disagreement is a warning."""
    found: list[QuantizationInfo] = []
    qc = config.get("quantization_config") or text_config.get("quantization_config")
    if isinstance(qc, dict):
        method = str(qc.get("quant_method") or "").lower()
        if method == "modelopt":
            found.append(_from_modelopt_config_json(qc))
        elif method:
            found.append(_from_other_config_json(qc, method))
        else:
            warnings.append("config.json: quantization_config has no quant_method; servers may not recognise it.")
    if hf_quant is not None:
        legacy = _from_hf_quant_config(hf_quant)
        if legacy.detected:
            found.append(legacy)
    if quantize_cfg is not None:
        found.append(_from_quantize_config(quantize_cfg))
    if not found:
        return QuantizationInfo()
    chosen = found[0]
    for other in found[1:]:
        same_method = other.method == chosen.method
        same_algo = other.quant_algo is None or chosen.quant_algo is None or other.quant_algo == chosen.quant_algo
        if not (same_method and same_algo):
            warnings.append(
                f"Quantization config files disagree: {chosen.source_file} says {chosen.method} {chosen.quant_algo or ''}".rstrip()
                + f", {other.source_file} says {other.method} {other.quant_algo or ''}".rstrip()
                + f". Servers read {chosen.source_file} first; remove or fix the stale file."
            )
    if chosen.method == "modelopt":
        facts = MODELOPT_QUANT_ALGOS.get(chosen.quant_algo or "")
        chosen.weight_bits = chosen.weight_bits or (facts.weight_bits if facts else None)
        if chosen.kv_cache_quant_algo is None and hf_quant is not None and chosen.source_file == "config.json":
            chosen.kv_cache_quant_algo = _from_hf_quant_config(hf_quant).kv_cache_quant_algo
    return chosen


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
    facts = MODELOPT_QUANT_ALGOS.get(quant.quant_algo or "") if quant.method == "modelopt" else None
    needs_blackwell = bool(facts and facts.needs_blackwell) or any(
        MODELOPT_QUANT_ALGOS.get(a, QuantAlgoFacts(None)).needs_blackwell for a in quant.layer_algos
    )
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
        note = None
        if tp is None:
            tp = MAX_GPUS_PER_NODE
            note = f"No tensor-parallel size from {per_node} to {MAX_GPUS_PER_NODE} divides the {heads} attention heads; plan the split by hand."
        elif needs_blackwell and gpu not in BLACKWELL_GPUS:
            note = "NVFP4 kernels need Blackwell: SGLang fails on this GPU, vLLM falls back to slower Marlin W4A16."
        elif nodes > 1:
            note = f"{nodes} nodes: tensor parallel {tp} within a node, pipeline parallel {nodes} across nodes."
        fits.append(GpuFit(gpu_type=gpu, memory_gb=memory_gb, min_gpus=min_gpus, tensor_parallel_size=tp, nodes=nodes, note=note))
    return fits


def _deployment_flags(context_length: int | None, trust_remote_code: bool, quant: QuantizationInfo) -> dict[str, FrameworkFlags]:
    facts = MODELOPT_QUANT_ALGOS.get(quant.quant_algo or "") if quant.method == "modelopt" else None
    flags: dict[str, FrameworkFlags] = {}
    for framework, length_flag, remote_flag in (
        ("vllm", "--max-model-len", "--trust-remote-code"),
        ("sglang", "--context-length", "--trust-remote-code"),
        ("trtllm", "--max_seq_len", "--trust_remote_code"),
    ):
        args: list[str] = [length_flag, str(context_length)] if context_length else []
        if trust_remote_code:
            args.append(remote_flag)
        quantization = None
        notes: list[str] = []
        if framework == "vllm" and facts:
            quantization = facts.vllm_quantization
        if framework == "sglang" and facts:
            quantization = facts.sglang_quantization
        if quantization:
            args += ["--quantization", quantization]
        if facts and facts.trtllm_only and framework != "trtllm":
            notes.append(f"{quant.quant_algo} is a TensorRT-LLM format: {framework}'s ModelOpt loader does not serve it.")
        # NVFP4 on Hopper is said once, in the report's warnings (not again per framework).
        if quant.method == "modelopt" and quantization is None and framework != "trtllm" and facts and not facts.trtllm_only:
            notes.append("Reads the ModelOpt config itself; no --quantization needed.")
        if quant.kv_cache_quant_algo == "FP8" and framework in ("vllm", "sglang"):
            notes.append("Checkpoint has FP8 KV-cache scales; `--kv-cache-dtype fp8_e4m3` uses them (optional).")
        flags[framework] = FrameworkFlags(framework=framework, args=args, quantization=quantization, notes=notes)
    return flags


def _quant_warnings(quant: QuantizationInfo, weights: WeightsInfo) -> list[str]:
    warnings = []
    algos = {quant.quant_algo} | set(quant.layer_algos) if quant.method == "modelopt" else set()
    if any(MODELOPT_QUANT_ALGOS.get(a or "", QuantAlgoFacts(None)).needs_blackwell for a in algos):
        warnings.append(
            "NVFP4 kernels need Blackwell GPUs (B200): on Hopper (H100/H200) SGLang and vLLM fall back to Marlin weight-only "
            "kernels, so the model serves, slower, and the accuracy measured there is not the accuracy that ships on Blackwell."
        )
    trtllm_only = sorted(a for a in algos if a and MODELOPT_QUANT_ALGOS.get(a, QuantAlgoFacts(None)).trtllm_only)
    if trtllm_only:
        warnings.append(
            f"{', '.join(trtllm_only)} is a TensorRT-LLM format: vLLM and SGLang ModelOpt loaders do not serve it; deploy with TensorRT-LLM."
        )
    if any(MODELOPT_QUANT_ALGOS.get(a or "", QuantAlgoFacts(None)).fp8_compute for a in algos):
        warnings.append("FP8 needs compute capability >= 8.9 (Ada, Hopper, Blackwell).")
    if quant.method == "modelopt" and quant.quant_algo and quant.quant_algo not in MODELOPT_QUANT_ALGOS:
        warnings.append(f"quant_algo {quant.quant_algo} is not one quanteval knows; check that your server supports it.")
    low_bit = {"F8_E4M3", "F8_E5M2", "I8"}
    if not quant.detected and low_bit & set(weights.dtype_parameters):
        warnings.append(
            f"Weights hold {', '.join(sorted(low_bit & set(weights.dtype_parameters)))} tensors but no quantization config was found; "
            "the checkpoint may be missing hf_quant_config.json or config.json quantization_config."
        )
    return warnings


# --- The tool -----------------------------------------------------------------------------------


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def inspect_checkpoint(request: InspectCheckpointInput, progress: ProgressFn = no_progress) -> CheckpointReport:
    """Use before build_config or plan_deployment: reads a checkpoint's configs and safetensors headers and
    reports architecture, size, quantization, context length, GPU fit and framework flags.
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
    config = _read_json(config_path)
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    model = text_config or config  # multimodal configs keep the language model's shape under text_config

    def pick(*keys: str) -> Any:
        return next((model[k] for k in keys if model.get(k) is not None), None) or next(
            (config[k] for k in keys if config.get(k) is not None), None
        )

    hf_quant = _read_optional_json(root, "hf_quant_config.json", files_read)
    quantize_cfg = _read_optional_json(root, "quantize_config.json", files_read)
    generation = _read_optional_json(root, "generation_config.json", files_read) or {}
    tokenizer_config = _read_optional_json(root, "tokenizer_config.json", files_read)

    quant = _detect_quantization(config, text_config, hf_quant, quantize_cfg, warnings)
    files, missing = _weight_files(root, files_read, warnings)
    if not files and not missing:
        warnings.append(f"{root}: no *.safetensors files; parameter count and memory estimate are unavailable.")
    weights = _read_weights(files, missing, quant, progress)

    architecture = ArchitectureInfo(
        architecture=(config.get("architectures") or [None])[0],
        model_type=config.get("model_type"),
        num_layers=_int(pick("num_hidden_layers", "n_layer", "num_layers")),
        hidden_size=_int(pick("hidden_size", "n_embd", "d_model")),
        num_attention_heads=_int(pick("num_attention_heads", "n_head")),
        num_kv_heads=_int(pick("num_key_value_heads", "num_kv_heads", "n_head_kv")) or _int(pick("num_attention_heads", "n_head")),
        vocab_size=_int(pick("vocab_size")),
        torch_dtype=pick("torch_dtype", "dtype"),
        multimodal=bool(text_config),
    )
    context_length = _int(pick("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions"))
    trust_remote_code = bool(config.get("auto_map"))
    template = _chat_template(root, tokenizer_config, files_read)
    weight_memory_gb = round(weights.weight_bytes / 1e9, 3)
    warnings += _quant_warnings(quant, weights)
    return CheckpointReport(
        checkpoint=str(root.resolve()),
        hf_handle=hf_handle,
        architecture=architecture,
        weights=weights,
        quantization=quant,
        context_length=context_length,
        trust_remote_code=trust_remote_code,
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


def _human_bytes(count: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} B"


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
