"""What a checkpoint's quantization is, read from its config files, and what that format means for serving.

config.json quantization_config (branching on quant_method), ModelOpt's hf_quant_config.json and AutoGPTQ's
quantize_config.json become one QuantizationInfo (weights, activations, KV cache, mixed layers, producer), each
fact with the file it came from. QuantizationInfo is part of inspect_checkpoint's report contract: fields may be
added, not renamed. What each serving framework does with a format lives in quanteval.serving.frameworks.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

from quanteval.serving import frameworks

# --- Models -------------------------------------------------------------------------------------


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


def config_int(value: Any) -> int | None:
    """An int from a config file, or None (a bool is not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


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
        group_size=config_int(group),
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
            facts.offer("group_size", config_int(qc.get("group_size")), "config.json")
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


def detect_quantization(
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


# --- What the format means ---------------------------------------------------------------------


def framework_verdict(framework: str, quant: QuantizationInfo, gpu: str | None = None) -> frameworks.Verdict:
    """What `framework` makes of this checkpoint's quantization on `gpu`, mixed layers checked one by one."""
    return frameworks.verdict(framework, quant.format, algo_label(quant), gpu, quant.kv_cache_quant_algo, quant.quantized_layers)


def algo_label(quant: QuantizationInfo) -> str:
    """The format as people name it: ModelOpt's quant_algo, else the method and its WxAy scheme."""
    if quant.quant_algo:
        return quant.quant_algo
    weights, acts = quant.weights, quant.activations
    if weights and weights.bits:
        scheme = f"W{weights.bits}A{acts.bits if acts and acts.bits else 16}"
        return f"{quant.method} {scheme}" + (f" ({weights.kind})" if weights.kind and weights.kind != "int" else "")
    return str(quant.method)


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
