"""inspect_checkpoint: facts about a checkpoint from its config files and safetensors headers (never tensor data).

The report models below are the contract other domains build on (nelconfig.apply_checkpoint,
deploy.plan_deployment): fields may be added, not renamed. The sizing facts (GPU_TYPES, the memory
rule) live here once; what the serving frameworks do with a format lives in quanteval.serving.frameworks.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, Field, ValidationError

from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress
from quanteval.serving import frameworks
from quanteval.serving.frameworks import Framework

# --- Fact tables --------------------------------------------------------------------------------

# Nominal memory per GPU type inspect_checkpoint sizes for, in GB (10^9 bytes), as sold.
GPU_TYPES: dict[str, float] = {name: frameworks.GPUS[name].memory_gb for name in frameworks.SIZED_GPUS}

# Memory rule: the weights may fill at most this fraction of the GPUs' total memory; the rest is
# KV cache, activations and CUDA graphs (SGLang's --mem-fraction-static defaults sit near 0.85-0.9).
WEIGHT_MEMORY_FRACTION = 0.85
# Tensor parallelism stays inside one node; beyond that, nodes are added (pipeline parallel).
MAX_GPUS_PER_NODE = 8

# Tensors that hold quantization metadata (scales, zero points, permutations), not model parameters.
_AUX_TENSOR_SUFFIXES = (
    "weight_scale", "weight_scale_2", "weight_scale_inv", "input_scale", "pre_quant_scale", "k_scale",
    "v_scale", "qzeros", "scales", "g_idx", "absmax", "quant_map", "nested_absmax", "nested_quant_map",
    "weight_zero_point", "weight_shape", "weight_global_scale", "input_global_scale", "quant_state.bitsandbytes__nf4",
    "quant_state.bitsandbytes__fp4", "SCB", "weight_format", "input_zero_point", "k_zero_point", "v_zero_point",
    "weight_g_idx", "input_quant_scale", "weight_quant_scale", "k_proj.k_scale", "v_proj.v_scale",
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
    head_dim: int | None = Field(None, description="Attention head size: config head_dim, else hidden_size / num_attention_heads.")
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


class TensorPrecision(BaseModel):
    """How one kind of tensor is stored or computed: weights, activations (inputs to the GEMMs) or KV cache."""

    bits: int | None = Field(None, description="Bits per value; None when the config does not say.")
    kind: str | None = Field(None, description="int, float (FP8/FP4), nvfp4, mxfp4, mxfp8, nf4 ...")
    group_size: int | None = Field(None, description="Values sharing one scale; None for per-channel/per-tensor scales.")
    dynamic: bool | None = Field(
        None, description="Activations: scales computed per batch at run time (true) or stored in the checkpoint (false)."
    )
    source: str | None = Field(None, description="The file this fact came from.")


class QuantizationInfo(BaseModel):
    detected: bool = False
    method: str | None = Field(None, description="modelopt, compressed-tensors, awq, gptq, fp8, bitsandbytes, ...")
    quant_algo: str | None = Field(
        None, description="ModelOpt quant_algo as the producer spelled it: FP8, NVFP4, W4A16_AWQ, fp8_pb_wo, MIXED_PRECISION, ..."
    )
    format: str = Field("none", description="The format key serving facts are kept under (frameworks.format_key).")
    kv_cache_quant_algo: str | None = None
    group_size: int | None = None
    weight_bits: int | None = None
    weights: TensorPrecision | None = Field(None, description="Weight precision; None when not quantized.")
    activations: TensorPrecision | None = Field(
        None, description="Activation precision; None when activations stay 16-bit (weight-only quantization)."
    )
    kv_cache: TensorPrecision | None = Field(None, description="KV-cache precision; None when the KV cache stays 16-bit.")
    exclude_modules: list[str] = Field(default_factory=list)
    layer_algos: dict[str, int] = Field(
        default_factory=dict, description="MIXED_PRECISION: number of quantized layers per quant_algo."
    )
    # Layer name -> quant_algo (MIXED_PRECISION): checked layer by layer against the scheme a framework serves the mix
    # with. Hundreds of entries on a large model, so kept out of tool answers (layer_algos sums it up).
    quantized_layers: dict[str, str] = Field(default_factory=dict, exclude=True)
    producer: str | None = Field(None, description="Tool and version that wrote the checkpoint, e.g. 'modelopt 0.29.0'.")
    source_file: str | None = Field(None, description="The file that named the method (hf_quant_config.json, config.json, ...).")
    sources: dict[str, str] = Field(
        default_factory=dict, description="Where each fact came from: fact name -> file (config.json, hf_quant_config.json)."
    )


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


def _module_bits(config: dict) -> list[tuple[re.Pattern[str], int]]:
    """compressed-tensors config groups that target modules by regex ("re:.*mlp.*proj$"), with their weight bits:
    a mixed checkpoint (int8 attention, int4 MLP) packs each module at its own width."""
    qc = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config") or {}
    found = []
    for group in (qc.get("config_groups") or {}).values() if isinstance(qc, dict) else []:
        bits = (group.get("weights") or {}).get("num_bits") if isinstance(group, dict) else None
        for target in group.get("targets") or [] if isinstance(bits, int) else []:
            if isinstance(target, str) and target.startswith("re:"):
                try:
                    found.append((re.compile(target[3:]), bits))
                except re.error:
                    continue
    return found


def _packing_factor(name: str, dtype: str, quant: QuantizationInfo, module_bits: list[tuple[re.Pattern[str], int]]) -> int | None:
    """How many logical weights one stored element holds; None for a packed tensor of unknown layout."""
    if dtype not in ("U8", "I32", "U32") or not name.endswith((".weight", ".qweight", ".weight_packed")):
        return 1
    if quant.method == "modelopt" and dtype == "U8":
        return 2  # ModelOpt stores every 4-bit format (NVFP4, INT4 AWQ) two values per uint8
    module = name.rsplit(".", 1)[0]
    bits = next((b for pattern, b in module_bits if pattern.match(module)), quant.weight_bits)
    if bits and bits < _DTYPE_BITS[dtype]:
        return _DTYPE_BITS[dtype] // bits  # GPTQ/AWQ/compressed-tensors: 8 int4 (or 4 int8) per int32
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
    files: list[Path], missing: list[str], quant: QuantizationInfo, progress: ProgressFn,
    module_bits: list[tuple[re.Pattern[str], int]] | None = None,
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
                factor = _packing_factor(name, dtype, quant, module_bits or [])
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
    if isinstance(scheme, dict) and scheme.get("num_bits") == 4 and scheme.get("type") == "float":
        return "NVFP4"
    if isinstance(scheme, dict) and scheme.get("num_bits"):
        return f"{scheme.get('type', 'int').upper()}{scheme['num_bits']}"
    return None


def _kv_precision(algo: str | None, source: str | None) -> TensorPrecision | None:
    upper = (algo or "").upper()
    if not upper or upper == "NONE":
        return None
    if "FP4" in upper:
        return TensorPrecision(bits=4, kind="nvfp4" if "NV" in upper else "float", source=source)
    bits = next((int(b) for b in re.findall(r"\d+", upper)), None)
    return TensorPrecision(bits=bits, kind="float" if upper.startswith("FP") or upper.startswith("FLOAT") else "int", source=source)


def _scheme_precision(scheme: Any, source: str, activation: bool = False) -> TensorPrecision | None:
    """A compressed-tensors style scheme ({num_bits, type, group_size, dynamic, strategy}) as a TensorPrecision."""
    if not isinstance(scheme, dict) or not isinstance(scheme.get("num_bits"), int):
        return None
    bits, kind, group = scheme["num_bits"], str(scheme.get("type") or "int"), scheme.get("group_size")
    if kind == "float" and bits == 4:
        kind = {16: "nvfp4", 32: "mxfp4"}.get(group, "float")
    elif kind == "float" and bits == 8 and group == 32:
        kind = "mxfp8"
    dynamic = scheme.get("dynamic")
    return TensorPrecision(
        bits=bits,
        kind=kind,
        group_size=_int(group),
        dynamic=(dynamic in (True, "local")) if activation and dynamic is not None else None,
        source=source,
    )


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


def _count_layer_algos(layers: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for layer_cfg in layers.values():
        algo = layer_cfg.get("quant_algo", "?") if isinstance(layer_cfg, dict) else str(layer_cfg)
        counts[algo] = counts.get(algo, 0) + 1
    return counts


class _Facts:
    """Facts gathered from several files: the first file that has a value gives it, and is recorded as its source."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def offer(self, fact: str, value: Any, source: str) -> None:
        if fact not in self.values and value not in (None, [], {}, ""):
            self.values[fact] = value
            self.sources[fact] = source

    def get(self, fact: str) -> Any:
        return self.values.get(fact)


def _from_modelopt(qc: dict | None, hf_quant: dict | None) -> QuantizationInfo:
    """ModelOpt writes config.json quantization_config (newer releases) and hf_quant_config.json; several facts
    (group size for W4A16_AWQ, W4A8_AWQ, MXFP8, W4A8_NVFP4_FP8) are only in the latter. Each fact comes from
    the first file that has it, config.json first (what servers read first)."""
    facts = _Facts()
    groups: list[dict] = []
    if qc is not None:
        groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
        algo = qc.get("quant_algo")
        if not algo and groups:
            group_algos = {_algo_from_group(g) for g in groups}
            algo = group_algos.pop() if len(group_algos) == 1 else ("MIXED_PRECISION" if group_algos else None)
        facts.offer("quant_algo", algo, "config.json")
        facts.offer("producer", _producer(qc.get("producer")), "config.json")
        facts.offer("kv_cache_quant_algo", qc.get("kv_cache_quant_algo") or _kv_algo(qc.get("kv_cache_scheme")), "config.json")
        facts.offer("exclude_modules", qc.get("ignore") or qc.get("exclude_modules"), "config.json")
        facts.offer("quantized_layers", qc.get("quantized_layers"), "config.json")
    if hf_quant is not None:
        section = hf_quant.get("quantization") if isinstance(hf_quant.get("quantization"), dict) else hf_quant
        facts.offer("quant_algo", section.get("quant_algo"), "hf_quant_config.json")
        facts.offer("producer", _producer(hf_quant.get("producer")), "hf_quant_config.json")
        facts.offer("kv_cache_quant_algo", section.get("kv_cache_quant_algo"), "hf_quant_config.json")
        facts.offer("exclude_modules", section.get("exclude_modules"), "hf_quant_config.json")
        facts.offer("quantized_layers", section.get("quantized_layers"), "hf_quant_config.json")
    algo = facts.get("quant_algo")
    canonical = frameworks.modelopt_algo(algo)
    mixed = canonical == "MIXED_PRECISION"
    # Group size: per layer for MIXED_PRECISION (as in hf_quant_config.json), not one for the model.
    if not mixed:
        if qc is not None:
            facts.offer("group_size", _int(qc.get("group_size")), "config.json")
            sizes = {(g.get("weights") or {}).get("group_size") for g in groups} - {None}
            facts.offer("group_size", sizes.pop() if len(sizes) == 1 else None, "config.json")
        if hf_quant is not None:
            section = hf_quant.get("quantization") if isinstance(hf_quant.get("quantization"), dict) else hf_quant
            facts.offer("group_size", section.get("group_size"), "hf_quant_config.json")
    if canonical in ("MXFP4", "MXFP8") and facts.get("group_size") is None:
        facts.offer("group_size", 32, "format")  # the MX block size is fixed by the format; ModelOpt writes none for MXFP4
    source_file = "config.json" if qc is not None else "hf_quant_config.json"
    info = QuantizationInfo(
        detected=bool(algo),
        method="modelopt",
        quant_algo=algo,
        kv_cache_quant_algo=facts.get("kv_cache_quant_algo"),
        group_size=facts.get("group_size"),
        exclude_modules=list(facts.get("exclude_modules") or []),
        producer=facts.get("producer"),
        source_file=source_file,
    )
    layers = facts.get("quantized_layers")
    if isinstance(layers, dict):
        info.layer_algos = _count_layer_algos(layers)
        info.quantized_layers = {str(name): str(cfg.get("quant_algo", "?") if isinstance(cfg, dict) else cfg) for name, cfg in layers.items()}
    elif mixed:
        info.layer_algos = {algo_: len(g.get("targets") or []) for g in groups if (algo_ := _algo_from_group(g))}
    precision = frameworks.MODELOPT_ALGOS.get(canonical or "")
    algo_source = facts.sources.get("quant_algo")
    if precision and precision.weights:
        w = precision.weights
        info.weights = TensorPrecision(bits=w.bits, kind=w.kind, group_size=info.group_size, source=algo_source)
        info.weight_bits = w.bits
    if precision and precision.activations:
        a = precision.activations
        info.activations = TensorPrecision(bits=a.bits, kind=a.kind, dynamic=a.dynamic, source=algo_source)
    if mixed and isinstance(layers, dict):
        bits = {frameworks.MODELOPT_ALGOS[c].weights.bits for a in info.layer_algos  # type: ignore[union-attr]
                if (c := frameworks.modelopt_algo(a)) and frameworks.MODELOPT_ALGOS[c].weights}
        info.weight_bits = bits.pop() if len(bits) == 1 else None
    info.kv_cache = _kv_precision(info.kv_cache_quant_algo, facts.sources.get("kv_cache_quant_algo"))
    info.sources = dict(facts.sources)
    return info


def _from_compressed_tensors(qc: dict, info: QuantizationInfo) -> None:
    groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
    weights = [p for g in groups if (p := _scheme_precision(g.get("weights"), "config.json"))]
    acts = [_scheme_precision(g.get("input_activations"), "config.json", activation=True) for g in groups]
    if weights:
        # Several groups (mixed schemes): report what they share, None where they differ.
        first = weights[0]
        same = all(w == first for w in weights)
        info.weights = first if same else TensorPrecision(
            bits=first.bits if all(w.bits == first.bits for w in weights) else None, source="config.json")
        info.weight_bits = info.weights.bits
        info.group_size = info.weights.group_size
    if acts and all(a is not None for a in acts):
        first_act = acts[0]
        info.activations = first_act if all(a == first_act for a in acts) else TensorPrecision(source="config.json")
    elif any(a is not None for a in acts):
        info.activations = TensorPrecision(source="config.json")  # some groups quantize activations, some do not
    info.kv_cache_quant_algo = _kv_algo(qc.get("kv_cache_scheme"))
    info.kv_cache = _scheme_precision(qc.get("kv_cache_scheme"), "config.json") if isinstance(qc.get("kv_cache_scheme"), dict) \
        else _kv_precision(info.kv_cache_quant_algo, "config.json")
    if qc.get("version"):  # llm-compressor writes the compressed-tensors release that packed the weights
        info.producer = f"compressed-tensors {qc['version']}"


def _from_other_config_json(qc: dict, method: str) -> QuantizationInfo:
    info = QuantizationInfo(detected=True, method=method, source_file="config.json")
    info.exclude_modules = list(qc.get("modules_to_not_convert") or qc.get("ignore") or qc.get("ignored_layers") or [])
    if method in ("gptq", "awq", "auto-round", "gptq_marlin", "awq_marlin"):
        info.weight_bits = qc.get("bits") or qc.get("w_bit")
        info.group_size = qc.get("group_size") or qc.get("q_group_size")
        info.weights = TensorPrecision(bits=info.weight_bits, kind="int", group_size=info.group_size, source="config.json")
        act_bits = qc.get("act_bits")
        if isinstance(act_bits, int) and act_bits < 16:
            info.activations = TensorPrecision(bits=act_bits, kind=str(qc.get("act_data_type") or "int"),
                                               dynamic=qc.get("act_dynamic"), source="config.json")
        version = qc.get("autoround_version") or (method == "auto-round" and qc.get("version"))
        if version:
            info.producer = f"auto-round {version}"
    elif method == "fp8":
        info.weight_bits = 8
        block = qc.get("weight_block_size")
        info.group_size = block[-1] if isinstance(block, list) and block else None
        info.weights = TensorPrecision(bits=8, kind="float", group_size=info.group_size, source="config.json")
        scheme = qc.get("activation_scheme")
        info.activations = TensorPrecision(bits=8, kind="float", dynamic=scheme != "static", source="config.json")
    elif method == "bitsandbytes":
        four_bit = bool(qc.get("load_in_4bit") or qc.get("_load_in_4bit"))
        info.weight_bits = 4 if four_bit else 8
        info.weights = TensorPrecision(
            bits=info.weight_bits, kind=str(qc.get("bnb_4bit_quant_type") or "nf4") if four_bit else "int", source="config.json"
        )
        if not four_bit:  # LLM.int8(): int8 GEMMs on activations quantized per row at run time (outliers in 16-bit)
            info.activations = TensorPrecision(bits=8, kind="int", dynamic=True, source="config.json")
    elif method == "compressed-tensors":
        _from_compressed_tensors(qc, info)
    info.sources = {"method": "config.json"} | ({"producer": "config.json"} if info.producer else {})
    return info


def _from_quantize_config(data: dict) -> QuantizationInfo:
    return QuantizationInfo(
        detected=True,
        method=str(data.get("quant_method") or "gptq"),  # AutoGPTQ wrote this file without naming itself
        weight_bits=data.get("bits"),
        group_size=data.get("group_size"),
        weights=TensorPrecision(bits=data.get("bits"), kind="int", group_size=data.get("group_size"), source="quantize_config.json"),
        source_file="quantize_config.json",
        sources={"method": "quantize_config.json"},
    )


def _detect_quantization(
    config: dict, text_config: dict, hf_quant: dict | None, quantize_cfg: dict | None, warnings: list[str]
) -> QuantizationInfo:
    """config.json quantization_config first (branching on quant_method), merged with hf_quant_config.json for
    ModelOpt; the side files otherwise; disagreement is a warning."""
    qc = config.get("quantization_config") or text_config.get("quantization_config")
    qc = qc if isinstance(qc, dict) else None
    method = str((qc or {}).get("quant_method") or "").lower()
    if qc is not None and not method:
        warnings.append("config.json: quantization_config has no quant_method; servers may not recognise it.")
    hf_section = (hf_quant.get("quantization") if isinstance((hf_quant or {}).get("quantization"), dict) else hf_quant) or {}
    found: list[QuantizationInfo] = []
    if method == "modelopt" or (not method and hf_section.get("quant_algo")):
        found.append(_from_modelopt(qc if method == "modelopt" else None, hf_quant if hf_section.get("quant_algo") else None))
    elif method:
        found.append(_from_other_config_json(qc or {}, method))
        if hf_section.get("quant_algo"):
            found.append(_from_modelopt(None, hf_quant))
    if quantize_cfg is not None:
        found.append(_from_quantize_config(quantize_cfg))
    if not found:
        return QuantizationInfo()
    chosen = found[0]
    if chosen.method == "modelopt" and qc is not None and hf_section.get("quant_algo"):
        in_config, in_side = str(qc.get("quant_algo") or ""), str(hf_section.get("quant_algo") or "")
        if in_config and in_side and in_config.upper() != in_side.upper():
            warnings.append(
                f"Quantization config files disagree: config.json says modelopt {in_config}, hf_quant_config.json says "
                f"modelopt {in_side}. Servers read config.json first; remove or fix the stale file."
            )
    for other in found[1:]:
        same_algo = not (other.quant_algo and chosen.quant_algo) or other.quant_algo.upper() == chosen.quant_algo.upper()
        if other.method == chosen.method and same_algo:
            continue
        warnings.append(
            f"Quantization config files disagree: {chosen.source_file} says {chosen.method} {chosen.quant_algo or ''}".rstrip()
            + f", {other.source_file} says {other.method} {other.quant_algo or ''}".rstrip()
            + f". Servers read {chosen.source_file} first; remove or fix the stale file."
        )
    weights = chosen.weights
    chosen.format = frameworks.format_key(
        chosen.method, chosen.quant_algo, chosen.layer_algos, weights.kind if weights else None, weights.bits if weights else None
    )
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


def framework_verdict(framework: str, quant: QuantizationInfo, gpu: str | None = None) -> frameworks.Verdict:
    """What `framework` makes of this checkpoint's quantization on `gpu`, mixed layers checked one by one."""
    return frameworks.verdict(framework, quant.format, algo_label(quant), gpu, quant.kv_cache_quant_algo, quant.quantized_layers)


def algo_label(quant: QuantizationInfo) -> str:
    if quant.quant_algo:
        return quant.quant_algo
    weights, acts = quant.weights, quant.activations
    if weights and weights.bits:
        scheme = f"W{weights.bits}A{acts.bits if acts and acts.bits else 16}"
        return f"{quant.method} {scheme}" + (f" ({weights.kind})" if weights.kind and weights.kind != "int" else "")
    return str(quant.method)


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


def format_warnings(quant: QuantizationInfo) -> list[str]:
    """Hardware needs derived from the format (not from who produced it), summed up across the frameworks.

    Each framework's own verdict says the same for that framework (deployment_flags notes), so a caller
    that has settled on one framework shows that verdict instead of these.
    """
    warnings: list[str] = []
    if quant.detected:
        label = algo_label(quant)
        for framework in frameworks.FRAMEWORKS:
            for level, message in framework_verdict(framework, quant).findings:
                if level == "error":
                    warnings.append(message)
        natives = {s.native_capability for f in frameworks.FRAMEWORKS if (s := frameworks.support(f, quant.format)).fallback and s.native_capability}
        fp4_layers = sorted(a for a in quant.layer_algos if "NVFP4" in a.upper())  # NVFP4 inside a mix needs Blackwell too
        if frameworks.BLACKWELL in natives or fp4_layers:
            if fp4_layers:
                label = f"{label} (its {', '.join(fp4_layers)} layers)"
            warnings.append(
                f"{label} runs natively on Blackwell (B200). On Hopper (H100/H200) SGLang and vLLM serve it through Marlin "
                "weight-only kernels: activations stay 16-bit, so accuracy measured there is not the accuracy that ships on Blackwell."
            )
        weights_kind = quant.weights.kind if quant.weights else None
        acts = quant.activations
        if (weights_kind == "float" and quant.weight_bits == 8) or (acts and acts.kind == "float" and acts.bits == 8):
            warnings.append("FP8 needs compute capability >= 8.9 (Ada, Hopper, Blackwell) for FP8 tensor cores.")
    return warnings


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


# --- The tool -----------------------------------------------------------------------------------


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
    weights = _read_weights(files, missing, quant, progress, _module_bits(config) if quant.method == "compressed-tensors" else None)

    architecture = ArchitectureInfo(
        architecture=(config.get("architectures") or [None])[0],
        model_type=config.get("model_type"),
        num_layers=_int(pick("num_hidden_layers", "n_layer", "num_layers")),
        hidden_size=_int(pick("hidden_size", "n_embd", "d_model")),
        num_attention_heads=_int(pick("num_attention_heads", "n_head")),
        num_kv_heads=_int(pick("num_key_value_heads", "num_kv_heads", "n_head_kv")) or _int(pick("num_attention_heads", "n_head")),
        head_dim=_int(pick("head_dim")) or _head_dim(_int(pick("hidden_size", "n_embd", "d_model")), _int(pick("num_attention_heads", "n_head"))),
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
