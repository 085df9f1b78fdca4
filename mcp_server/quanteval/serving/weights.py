"""Reading a checkpoint's files: JSON configs and safetensors headers (tensor data only for one weight row, to tell an
unquantized checkpoint from a dequantized one), and the weights facts
(parameters, logical parameters of packed low-bit weights, dtypes, bytes) summed from the headers.

WeightsInfo is part of inspect_checkpoint's report contract: fields may be added, not renamed.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, Field, PrivateAttr

from quanteval.models import ProgressFn, ToolError
from quanteval.serving.quantformat import QuantizationInfo

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
    row_values: list[int] | None = Field(None, description=(
        "Without a quantization config, all weights 16/32-bit: [distinct values, length] of one projection weight's "
        "first row. A handful of values in a long row: quantized and stored dequantized."))
    # name and shape of the first full-width (unpacked) tensor seen per SHAPED suffix: what checkpoint checks the
    # config against
    _shapes: dict[str, tuple[str, list[int]]] = PrivateAttr(default_factory=dict)


# The tensors whose shape states a config value, by name suffix; read in dtypes that store one value per element
# (packed low-bit weights are narrower than the model).
SHAPED = ("embed_tokens.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")
_UNPACKED = frozenset({"BF16", "F16", "F32", "F8_E4M3", "F8_E5M2", "I8"})


# --- Reading files ------------------------------------------------------------------------------


def read_json(path: Path) -> dict:
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


def module_bits(config: dict) -> list[tuple[re.Pattern[str], int]]:
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


def _packing_factor(name: str, dtype: str, quant: QuantizationInfo, bits_by_module: list[tuple[re.Pattern[str], int]]) -> int | None:
    """How many logical weights one stored element holds; None for a packed tensor of unknown layout."""
    if dtype not in ("U8", "I32", "U32") or not name.endswith((".weight", ".qweight", ".weight_packed")):
        return 1
    if quant.method == "modelopt" and dtype == "U8":
        return 2  # ModelOpt stores every 4-bit format (NVFP4, INT4 AWQ) two values per uint8
    module = name.rsplit(".", 1)[0]
    bits = next((b for pattern, b in bits_by_module if pattern.match(module)), quant.weight_bits)
    if bits and bits < _DTYPE_BITS[dtype]:
        return _DTYPE_BITS[dtype] // bits  # GPTQ/AWQ/compressed-tensors: 8 int4 (or 4 int8) per int32
    return None if quant.detected else 1


def weight_files(root: Path, files_read: list[str], warnings: list[str]) -> tuple[list[Path], list[str]]:
    """The safetensors shards to read (from the index when there is one) and the ones the index names but lacks."""
    index_path = root / "model.safetensors.index.json"
    if index_path.is_file():
        files_read.append(index_path.name)
        index = read_json(index_path)
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


def read_weights(
    files: list[Path], missing: list[str], quant: QuantizationInfo, progress: ProgressFn,
    bits_by_module: list[tuple[re.Pattern[str], int]] | None = None,
) -> WeightsInfo:
    # Plain locals in the loop: a DeepSeek-R1-sized checkpoint has ~92k tensors.
    tensor_count = parameter_count = weight_bytes = size_bytes = 0
    logical: int | None = 0
    dtype_parameters: dict[str, int] = {}
    shapes: dict[str, tuple[str, list[int]]] = {}
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
            if len(shapes) < len(SHAPED) and dtype in _UNPACKED and len(shape) == 2 and name.endswith(SHAPED):
                shapes.setdefault(next(suffix for suffix in SHAPED if name.endswith(suffix)), (name, shape))
            if logical is not None and not name.endswith(_AUX_TENSOR_SUFFIXES):
                factor = _packing_factor(name, dtype, quant, bits_by_module or [])
                logical = None if factor is None else logical + count * factor
        if data_end > data_bytes:
            raise ToolError(
                f"{path}: truncated: its tensors need {data_end} bytes of data but only {data_bytes} follow the header. Re-download it."
            )
        if len(files) > 1:
            progress(number, len(files), f"read header {number}/{len(files)}: {path.name}")
    info = WeightsInfo(
        parameter_count=parameter_count,
        logical_parameter_count=logical,
        tensor_count=tensor_count,
        shard_count=len(files) + len(missing),
        dtype_parameters=dtype_parameters,
        weight_bytes=weight_bytes,
        size_bytes=size_bytes,
        missing_shards=missing,
    )
    info._shapes = shapes
    return info


# A projection weight's row read to tell a full-precision checkpoint from a quantized one stored dequantized: per
# output channel a b-bit grid has at most 2**b values, a trained weight about as many as the row is long.
_ROW_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4}
_MAX_ROW_READ = 4096


def row_values(files: list[Path]) -> list[int] | None:
    """[distinct values, length] of the first row of the first file's longest-rowed 2-D `*proj.weight` (at most
    4096 values, 16 KiB read); None when the first file has none in a 16/32-bit dtype."""
    if not files:
        return None
    header, data_bytes = read_safetensors_header(files[0])
    candidates = [(entry["shape"][1], name) for name, entry in header.items() if name != "__metadata__"
                  and name.endswith("proj.weight") and isinstance(entry, dict) and entry.get("dtype") in _ROW_ITEMSIZE
                  and len(entry.get("shape") or []) == 2]
    if not candidates:
        return None
    length, name = max(candidates)
    entry = header[name]
    itemsize, count = _ROW_ITEMSIZE[entry["dtype"]], min(length, _MAX_ROW_READ)
    with files[0].open("rb") as handle:
        handle.seek(files[0].stat().st_size - data_bytes + entry["data_offsets"][0])
        raw = handle.read(itemsize * count)
    return [len({raw[i:i + itemsize] for i in range(0, len(raw), itemsize)}), count]
