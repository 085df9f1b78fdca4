"""Build small but real checkpoint folders: real config files and real safetensors files.

`make_checkpoint` writes a tiny Llama/Qwen-shaped model in the on-disk layout each
quantization tool really produces (tensor names, dtypes and packed shapes, config
files), so inspection is tested against the formats users bring, not against mocks.
The bundled examples (examples/make_checkpoints.py) and the benchmarks use it too.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

# Bytes per element of each safetensors dtype.
DTYPE_BYTES = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip

# `quant` values make_checkpoint understands. ModelOpt quant_algo names are upper case;
# the other producers are named by their config.json quant_method.
MODELOPT_ALGOS = ("FP8", "NVFP4", "W4A16_AWQ", "W4A8_AWQ", "W8A8_SQ_PER_CHANNEL", "MIXED_PRECISION")
OTHER_METHODS = ("gptq", "awq", "compressed-tensors", "fp8", "bitsandbytes")

MODELOPT_PRODUCER = {"name": "modelopt", "version": "0.33.0"}

REASONING_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}{{- '</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)
PLAIN_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def write_safetensors(
    path: Path,
    tensors: dict[str, tuple[str, list[int]]],
    metadata: dict[str, str] | None = None,
    *,
    sparse: bool = False,
) -> int:
    """Write a valid safetensors file (zeros as data) and return its size in bytes.

    With sparse=True the data region is a hole made by os.truncate: the file has its
    full declared size but takes no disk space (for benchmark-sized checkpoints).
    """
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, (dtype, shape) in tensors.items():
        nbytes = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # the format pads the header to 8 bytes with spaces
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<Q", len(header_bytes)))
        handle.write(header_bytes)
        if not sparse:
            handle.write(bytes(offset))
    if sparse:
        os.truncate(path, 8 + len(header_bytes) + offset)
    return 8 + len(header_bytes) + offset


def _linear(prefix: str, out_features: int, in_features: int, algo: str | None) -> dict[str, tuple[str, list[int]]]:
    """The tensors one nn.Linear becomes under each quantization format."""
    if algo is None:
        return {f"{prefix}.weight": ("BF16", [out_features, in_features])}
    if algo in ("FP8", "compressed-tensors"):
        return {
            f"{prefix}.weight": ("F8_E4M3", [out_features, in_features]),
            f"{prefix}.weight_scale": ("F32", []),
            f"{prefix}.input_scale": ("F32", []),
        }
    if algo == "fp8":  # HF fine-grained FP8 (DeepSeek style): 128x128 block scales, dynamic activations
        return {
            f"{prefix}.weight": ("F8_E4M3", [out_features, in_features]),
            f"{prefix}.weight_scale_inv": ("F32", [math.ceil(out_features / 128), math.ceil(in_features / 128)]),
        }
    if algo == "NVFP4":  # two FP4 values per uint8, one FP8 scale per 16 values, one global scale
        return {
            f"{prefix}.weight": ("U8", [out_features, in_features // 2]),
            f"{prefix}.weight_scale": ("F8_E4M3", [out_features, in_features // 16]),
            f"{prefix}.weight_scale_2": ("F32", []),
            f"{prefix}.input_scale": ("F32", []),
        }
    if algo == "NVFP4_AWQ":  # NVFP4 plus the AWQ smoothing scale ModelOpt folds into the input
        return {**_linear(prefix, out_features, in_features, "NVFP4"), f"{prefix}.pre_quant_scale": ("BF16", [in_features])}
    if algo in ("W4A16_AWQ", "W4A8_AWQ"):  # ModelOpt INT4 AWQ: two int4 per uint8, per-128-group scales
        tensors = {
            f"{prefix}.weight": ("U8", [out_features, in_features // 2]),
            f"{prefix}.weight_scale": ("BF16", [out_features, math.ceil(in_features / 128)]),
            f"{prefix}.pre_quant_scale": ("BF16", [in_features]),
        }
        if algo == "W4A8_AWQ":
            tensors[f"{prefix}.input_scale"] = ("F32", [])
            tensors[f"{prefix}.weight_scale_2"] = ("F32", [])
        return tensors
    if algo == "W8A8_SQ_PER_CHANNEL":
        return {
            f"{prefix}.weight": ("I8", [out_features, in_features]),
            f"{prefix}.weight_scale": ("F32", [out_features]),
            f"{prefix}.input_scale": ("F32", []),
            f"{prefix}.pre_quant_scale": ("BF16", [in_features]),
        }
    if algo == "gptq":  # eight int4 per int32 along the input dimension
        groups = math.ceil(in_features / 128)
        return {
            f"{prefix}.qweight": ("I32", [in_features // 8, out_features]),
            f"{prefix}.qzeros": ("I32", [groups, out_features // 8]),
            f"{prefix}.scales": ("F16", [groups, out_features]),
            f"{prefix}.g_idx": ("I32", [in_features]),
        }
    if algo == "awq":  # AutoAWQ GEMM: eight int4 per int32 along the output dimension
        groups = math.ceil(in_features / 128)
        return {
            f"{prefix}.qweight": ("I32", [in_features, out_features // 8]),
            f"{prefix}.qzeros": ("I32", [groups, out_features // 8]),
            f"{prefix}.scales": ("F16", [groups, out_features]),
        }
    if algo == "bitsandbytes":  # nf4: two values per uint8, flattened, with an absmax per 64 values
        count = out_features * in_features
        return {
            f"{prefix}.weight": ("U8", [count // 2, 1]),
            f"{prefix}.weight.absmax": ("F32", [count // 64]),
            f"{prefix}.weight.quant_map": ("F32", [16]),
        }
    raise ValueError(f"unknown quantization format {algo!r}")


def _mixed_layer_algo(layer: int) -> str:
    """MIXED_PRECISION checkpoints here: even layers FP8, odd layers NVFP4."""
    return "FP8" if layer % 2 == 0 else "NVFP4"


def _tensors(config: dict, layers: int, quant: str | None) -> dict[str, tuple[str, list[int]]]:
    hidden = config["hidden_size"]
    inter = config["intermediate_size"]
    heads = config["num_attention_heads"]
    kv_heads = config["num_key_value_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    vocab = config["vocab_size"]
    qk_norm = config["model_type"] == "qwen3"

    tensors: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("BF16", [vocab, hidden])}
    for layer in range(layers):
        algo = _mixed_layer_algo(layer) if quant == "MIXED_PRECISION" else quant
        base = f"model.layers.{layer}"
        tensors[f"{base}.input_layernorm.weight"] = ("BF16", [hidden])
        tensors[f"{base}.post_attention_layernorm.weight"] = ("BF16", [hidden])
        tensors.update(_linear(f"{base}.self_attn.q_proj", heads * head_dim, hidden, algo))
        tensors.update(_linear(f"{base}.self_attn.k_proj", kv_heads * head_dim, hidden, algo))
        tensors.update(_linear(f"{base}.self_attn.v_proj", kv_heads * head_dim, hidden, algo))
        tensors.update(_linear(f"{base}.self_attn.o_proj", hidden, heads * head_dim, algo))
        if qk_norm:
            tensors[f"{base}.self_attn.q_norm.weight"] = ("BF16", [head_dim])
            tensors[f"{base}.self_attn.k_norm.weight"] = ("BF16", [head_dim])
        if quant in MODELOPT_ALGOS:  # ModelOpt exports FP8 KV-cache scales on the attention projections
            tensors[f"{base}.self_attn.k_proj.k_scale"] = ("F32", [])
            tensors[f"{base}.self_attn.v_proj.v_scale"] = ("F32", [])
        tensors.update(_linear(f"{base}.mlp.gate_proj", inter, hidden, algo))
        tensors.update(_linear(f"{base}.mlp.up_proj", inter, hidden, algo))
        tensors.update(_linear(f"{base}.mlp.down_proj", hidden, inter, algo))
    tensors["model.norm.weight"] = ("BF16", [hidden])
    tensors["lm_head.weight"] = ("BF16", [vocab, hidden])  # lm_head stays unquantized (excluded) everywhere
    return tensors


def _group_size(algo: str) -> int | None:
    return {"NVFP4": 16, "W4A16_AWQ": 128, "W4A8_AWQ": 128}.get(algo)


def _modelopt_legacy(quant: str, layers: int) -> dict:
    """hf_quant_config.json as ModelOpt's unified HF export writes it."""
    quantization: dict[str, object] = {"quant_algo": quant, "kv_cache_quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    if _group_size(quant):
        quantization["group_size"] = _group_size(quant)
    if quant == "MIXED_PRECISION":
        quantization["quantized_layers"] = {
            f"model.layers.{layer}.{module}": (
                {"quant_algo": algo, "group_size": 16} if (algo := _mixed_layer_algo(layer)) == "NVFP4" else {"quant_algo": algo}
            )
            for layer in range(layers)
            for module in (
                "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
            )  # fmt: skip
        }
    return {"producer": MODELOPT_PRODUCER, "quantization": quantization}


def _scheme(algo: str, group_size: int | None) -> dict:
    """A compressed-tensors style config group for one ModelOpt algorithm (as ModelOpt converts it)."""
    if algo == "FP8":
        return {
            "input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
            "weights": {"dynamic": False, "num_bits": 8, "type": "float"},
        }
    if algo == "NVFP4":
        fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": group_size or 16}
        return {"input_activations": dict(fp4), "weights": dict(fp4)}
    if algo == "W4A16_AWQ":
        return {"weights": {"dynamic": False, "num_bits": 4, "type": "int", "group_size": group_size or 128}}
    if algo == "W4A8_AWQ":
        return {
            "input_activations": {"dynamic": False, "num_bits": 8, "type": "float", "group_size": group_size or 128},
            "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": group_size or 128},
        }
    return {
        "input_activations": {"dynamic": False, "num_bits": 8, "type": "int"},
        "weights": {"dynamic": False, "num_bits": 8, "type": "int", "strategy": "channel"},
    }


def _modelopt_config_json(quant: str, layers: int) -> dict:
    """config.json quantization_config as newer ModelOpt writes it (compressed-tensors look, quant_method modelopt)."""
    legacy = _modelopt_legacy(quant, layers)["quantization"]
    if quant == "MIXED_PRECISION":
        by_algo: dict[str, list[str]] = {}
        for name, layer_cfg in legacy["quantized_layers"].items():
            by_algo.setdefault(layer_cfg["quant_algo"], []).append(name)
        groups = {
            f"group_{i}": {**_scheme(algo, None), "targets": sorted(names)} for i, (algo, names) in enumerate(by_algo.items())
        }
    else:
        groups = {"group_0": {**_scheme(quant, _group_size(quant)), "targets": ["Linear"]}}
    config: dict[str, object] = {
        "config_groups": groups,
        "ignore": ["lm_head"],
        "quant_algo": quant,
        "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"},
        "producer": MODELOPT_PRODUCER,
        "quant_method": "modelopt",
    }
    if quant == "MIXED_PRECISION":
        config["quantized_layers"] = legacy["quantized_layers"]
    return config


def _other_quantization_config(quant: str) -> dict:
    if quant == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
    if quant == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm", "zero_point": True}
    if quant == "fp8":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
    if quant == "bitsandbytes":
        return {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "_load_in_4bit": True}
    return {  # compressed-tensors FP8 (llm-compressor "FP8" scheme)
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False},
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }


def make_checkpoint(
    root: Path,
    *,
    quant: str | None = None,
    legacy_modelopt: bool = True,
    shards: int = 1,
    layers: int = 2,
    auto_map: bool = False,
    chat_template: str | None = None,
    max_position_embeddings: int = 4096,
    **config_overrides: object,
) -> Path:
    """Write a tiny checkpoint into `root` (created) and return `root`.

    quant: None (BF16), a ModelOpt quant_algo (MODELOPT_ALGOS) written to hf_quant_config.json
    when legacy_modelopt else to config.json quantization_config (quant_method modelopt), or
    one of OTHER_METHODS ("gptq" also writes quantize_config.json). shards > 1 writes
    model-0000i-of-0000n.safetensors plus model.safetensors.index.json. chat_template
    goes into tokenizer_config.json ("reasoning" and "plain" name the built-in ones).
    config_overrides replace or add config.json keys (e.g. model_type="qwen3").
    """
    if quant is not None and quant not in MODELOPT_ALGOS + OTHER_METHODS:
        raise ValueError(f"unknown quant {quant!r}; one of {MODELOPT_ALGOS + OTHER_METHODS}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    model_type = str(config_overrides.get("model_type", "llama"))
    config: dict[str, object] = {
        "architectures": ["Qwen3ForCausalLM" if model_type == "qwen3" else "LlamaForCausalLM"],
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 256,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "transformers_version": "4.51.0",
    }
    config.update(config_overrides)
    if auto_map:
        config["auto_map"] = {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}
    if quant in MODELOPT_ALGOS:
        if legacy_modelopt:
            (root / "hf_quant_config.json").write_text(json.dumps(_modelopt_legacy(quant, layers), indent=2))
        else:
            config["quantization_config"] = _modelopt_config_json(quant, layers)
    elif quant is not None:
        config["quantization_config"] = _other_quantization_config(quant)
        if quant == "gptq":
            (root / "quantize_config.json").write_text(
                json.dumps({"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "quant_method": "gptq"}, indent=2)
            )
    (root / "config.json").write_text(json.dumps(config, indent=2))
    (root / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2, "temperature": 0.6, "top_p": 0.95, "do_sample": True}, indent=2)
    )
    template = {"reasoning": REASONING_TEMPLATE, "plain": PLAIN_TEMPLATE}.get(chat_template or "", chat_template)
    tokenizer_config: dict[str, object] = {"bos_token": "<s>", "eos_token": "</s>", "model_max_length": max_position_embeddings}
    if template:
        tokenizer_config["chat_template"] = template
    (root / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))

    tensors = _tensors(config, layers, quant)
    metadata = {"format": "pt"}
    if shards <= 1:
        write_safetensors(root / "model.safetensors", tensors, metadata)
        return root
    names = list(tensors)
    per_shard = math.ceil(len(names) / shards)
    weight_map: dict[str, str] = {}
    total = 0
    for index in range(shards):
        shard_name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {name: tensors[name] for name in names[index * per_shard : (index + 1) * per_shard]}
        write_safetensors(root / shard_name, chunk, metadata)
        for name, (dtype, shape) in chunk.items():
            weight_map[name] = shard_name
            total += math.prod(shape) * DTYPE_BYTES[dtype]
    (root / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    return root


ATTENTION = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def make_modelopt_mix(root: Path, *, attention: str = "FP8", mlp: str = "NVFP4_AWQ", layers: int = 2) -> Path:
    """A ModelOpt auto_quantize export (MIXED_PRECISION) with one format for the attention projections and one for the
    MLPs, written as ModelOpt 0.47 writes it: hf_quant_config.json's per-layer `quantized_layers` (NVFP4 and AWQ layers
    with group_size, AWQ ones with has_zero_point/pre_quant_scale), config.json's quantization_config (config groups
    per format plus the same map), and per layer the tensors the format stores (packed uint8 weights, weight_scale,
    weight_scale_2, pre_quant_scale, input_scale). ModelOpt needs CUDA to make NVFP4_AWQ, so the data is zeros."""
    make_checkpoint(root, chat_template="plain", layers=layers)
    config = json.loads((root / "config.json").read_text())
    algos = {f"model.layers.{layer}.{module}": (attention if module in ATTENTION else mlp)
             for layer in range(layers) for module in ATTENTION + MLP}

    def entry(algo: str) -> dict:
        if algo in ("NVFP4_AWQ", "W4A8_AWQ", "W4A16_AWQ"):
            return {"quant_algo": algo, "group_size": 16 if algo == "NVFP4_AWQ" else 128, "has_zero_point": False, "pre_quant_scale": True}
        return {"quant_algo": algo, "group_size": 16} if algo == "NVFP4" else {"quant_algo": algo}

    quantized_layers = {name: entry(algo) for name, algo in algos.items()}
    (root / "hf_quant_config.json").write_text(json.dumps({"producer": MODELOPT_PRODUCER, "quantization": {
        "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None, "quantized_layers": quantized_layers}}, indent=2))
    fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    schemes = {"NVFP4_AWQ": {"input_activations": dict(fp4), "weights": dict(fp4)}}
    groups = {f"group_{i}": {**schemes.get(algo, _scheme(algo, None)), "targets": sorted(n for n, a in algos.items() if a == algo)}
              for i, algo in enumerate(dict.fromkeys(algos.values()))}
    config["quantization_config"] = {"config_groups": groups, "quantized_layers": quantized_layers, "ignore": [],
                                     "quant_algo": "MIXED_PRECISION", "producer": MODELOPT_PRODUCER, "quant_method": "modelopt"}
    (root / "config.json").write_text(json.dumps(config, indent=2))
    tensors = {name: spec for name, spec in _tensors(config, layers, None).items() if not any(name.startswith(f"{m}.") for m in algos)}
    for name, algo in algos.items():
        out_features, in_features = next(spec[1] for n, spec in _tensors(config, layers, None).items() if n == f"{name}.weight")
        tensors.update(_linear(name, out_features, in_features, algo))
    write_safetensors(root / "model.safetensors", tensors, {"format": "pt"})
    return root


def noise_checkpoint(source: Path, root: Path, seed: int = 0) -> Path:
    """`source` (a real BF16 checkpoint) with every linear layer's weight replaced by Gaussian noise of the same
    shape, dtype and standard deviation: a quantization gone wrong. Embeddings, norms and configs are kept."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, root)
    tensors = load_file(str(source / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    for name, tensor in tensors.items():
        if tensor.ndim == 2 and "embed" not in name:  # every linear layer, lm_head included
            noise = torch.randn(tensor.shape, generator=generator) * tensor.float().std()
            tensors[name] = noise.to(tensor.dtype)
    save_file(tensors, str(root / "model.safetensors"), metadata={"format": "pt"})
    return root


def next_config_against(tmp_path: Path, url: str, model_type: str = "chat_reasoning", model: str = "m") -> str:
    """A nel-next config of the tiny_add benchmark (examples/benchmarks) pointed at `url`, built and filled with the
    config tools a user calls (build_config, set_config_value); a closed port makes every request fail at once."""
    from quanteval.workflow.nelconfig import BuildConfigInput, SetConfigValueInput, build_config, set_config_value

    bench = Path(__file__).resolve().parent.parent / "examples" / "benchmarks" / "tiny_add.py"
    config = build_config(BuildConfigInput(engine="nel-next", execution="local", deployment="none", model_type=model_type,
                                           benchmarks=[str(bench)], config_path=str(tmp_path / "eval.yaml"))).config_path
    for key, value in {"services.model.url": url, "services.model.model": model,
                       "services.model.generation.max_tokens": 16, "output.dir": str(tmp_path / "out")}.items():
        set_config_value(SetConfigValueInput(config_path=config, key=key, value=value))
    return config
