"""How long inspect_checkpoint takes on a DeepSeek-R1-sized checkpoint versus a one-file one, and what it costs in memory.

    .venv/bin/python benchmarks/bench_inspect.py [--keep DIR]

Builds in a temp dir a DeepSeek-R1-shaped FP8 checkpoint: 163 shards, ~92k tensors with the real
model's names, shapes and dtypes (61 layers, 256 routed experts, 128x128 block scales). Each shard
is a real safetensors header followed by a sparse hole of the declared data size (os.truncate), so
the files have their true sizes (~690 GB in all) but use no disk. A second, one-file checkpoint is
the tiny bundled-style model. Prints, for both:
  - in-process inspect_checkpoint time (median of repeats),
  - `quanteval inspect` wall time as a user runs it (process start included),
  - the alternative a user would otherwise script: safetensors.safe_open over every shard to count
    parameters (the library path, also header-only),
and the peak Python memory growth (tracemalloc) while inspecting the big one.
Targets: big within 2x of small (as a user runs it), peak memory growth under 100 MB.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from factories import DTYPE_BYTES, make_checkpoint, write_safetensors  # noqa: E402

from quanteval.serving.checkpoint import InspectCheckpointInput, inspect_checkpoint  # noqa: E402

SHARDS = 163
HIDDEN, VOCAB, LAYERS, DENSE_LAYERS, EXPERTS = 7168, 129280, 61, 3, 256
MOE_INTER, DENSE_INTER, HEADS = 2048, 18432, 128
Q_LORA, KV_LORA, ROPE_DIM, NOPE_DIM, V_DIM = 1536, 512, 64, 128, 128


def _fp8_linear(tensors: dict, prefix: str, out_features: int, in_features: int) -> None:
    tensors[f"{prefix}.weight"] = ("F8_E4M3", [out_features, in_features])
    tensors[f"{prefix}.weight_scale_inv"] = ("F32", [math.ceil(out_features / 128), math.ceil(in_features / 128)])


def deepseek_r1_tensors() -> dict[str, tuple[str, list[int]]]:
    tensors: dict[str, tuple[str, list[int]]] = {"model.embed_tokens.weight": ("BF16", [VOCAB, HIDDEN])}
    for layer in range(LAYERS + 1):  # + the multi-token-prediction layer R1 ships as layer 61
        base = f"model.layers.{layer}"
        tensors[f"{base}.input_layernorm.weight"] = ("BF16", [HIDDEN])
        tensors[f"{base}.post_attention_layernorm.weight"] = ("BF16", [HIDDEN])
        attn = f"{base}.self_attn"
        _fp8_linear(tensors, f"{attn}.q_a_proj", Q_LORA, HIDDEN)
        tensors[f"{attn}.q_a_layernorm.weight"] = ("BF16", [Q_LORA])
        _fp8_linear(tensors, f"{attn}.q_b_proj", HEADS * (NOPE_DIM + ROPE_DIM), Q_LORA)
        _fp8_linear(tensors, f"{attn}.kv_a_proj_with_mqa", KV_LORA + ROPE_DIM, HIDDEN)
        tensors[f"{attn}.kv_a_layernorm.weight"] = ("BF16", [KV_LORA])
        _fp8_linear(tensors, f"{attn}.kv_b_proj", HEADS * (NOPE_DIM + V_DIM), KV_LORA)
        _fp8_linear(tensors, f"{attn}.o_proj", HIDDEN, HEADS * V_DIM)
        mlp = f"{base}.mlp"
        if layer < DENSE_LAYERS:
            for name, (out_f, in_f) in {"gate_proj": (DENSE_INTER, HIDDEN), "up_proj": (DENSE_INTER, HIDDEN), "down_proj": (HIDDEN, DENSE_INTER)}.items():
                _fp8_linear(tensors, f"{mlp}.{name}", out_f, in_f)
            continue
        tensors[f"{mlp}.gate.weight"] = ("BF16", [EXPERTS, HIDDEN])
        tensors[f"{mlp}.gate.e_score_correction_bias"] = ("F32", [EXPERTS])
        for expert in [*(f"experts.{e}" for e in range(EXPERTS)), "shared_experts"]:
            _fp8_linear(tensors, f"{mlp}.{expert}.gate_proj", MOE_INTER, HIDDEN)
            _fp8_linear(tensors, f"{mlp}.{expert}.up_proj", MOE_INTER, HIDDEN)
            _fp8_linear(tensors, f"{mlp}.{expert}.down_proj", HIDDEN, MOE_INTER)
    tensors["model.norm.weight"] = ("BF16", [HIDDEN])
    tensors["lm_head.weight"] = ("BF16", [VOCAB, HIDDEN])
    return tensors


def build_big(root: Path) -> int:
    root.mkdir(parents=True)
    config = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config", "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
        "hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS, "num_key_value_heads": HEADS,
        "vocab_size": VOCAB, "max_position_embeddings": 163840, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]},
    }  # fmt: skip
    (root / "config.json").write_text(json.dumps(config, indent=2))
    tensors = deepseek_r1_tensors()
    names = list(tensors)
    per_shard = math.ceil(len(names) / SHARDS)
    weight_map, total = {}, 0
    for index in range(SHARDS):
        shard = f"model-{index + 1:05d}-of-{SHARDS:06d}.safetensors"
        chunk = {name: tensors[name] for name in names[index * per_shard : (index + 1) * per_shard]}
        write_safetensors(root / shard, chunk, {"format": "pt"}, sparse=True)
        for name, (dtype, shape) in chunk.items():
            weight_map[name] = shard
            total += math.prod(shape) * DTYPE_BYTES[dtype]
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return len(names)


def in_process(path: Path, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        inspect_checkpoint(InspectCheckpointInput(checkpoint=str(path)))
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def cli(path: Path, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([str(REPO / ".venv" / "bin" / "quanteval"), "inspect", str(path)], check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def safetensors_library(path: Path, repeats: int) -> float:
    from safetensors import safe_open

    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        count = 0
        for shard in sorted(path.glob("*.safetensors")):
            with safe_open(str(shard), framework="numpy") as handle:
                for name in handle.keys():  # noqa: SIM118 - a safe_open handle is not iterable
                    count += math.prod(handle.get_slice(name).get_shape())
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="build here and keep the checkpoints")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-inspect-"))
    try:
        big, small = work / "deepseek-r1-shaped", work / "tiny-one-file"
        if not big.exists():
            started = time.perf_counter()
            tensor_count = build_big(big)
            print(f"built {big.name}: {SHARDS} shards, {tensor_count:,} tensors in {time.perf_counter() - started:.1f} s")
        if not small.exists():
            make_checkpoint(small, quant="FP8")
        report = inspect_checkpoint(InspectCheckpointInput(checkpoint=str(big)))
        print(
            f"big: {report.weights.tensor_count:,} tensors, {report.weights.parameter_count / 1e9:.1f} G parameters, "
            f"{report.weights.size_bytes / 1e9:.0f} GB declared on disk, min {report.gpu_fit[0].min_gpus} x H100"
        )

        tracemalloc.start()
        baseline, _ = tracemalloc.get_traced_memory()
        inspect_checkpoint(InspectCheckpointInput(checkpoint=str(big)))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()

        rows = [
            ("inspect_checkpoint, in process", in_process(big, args.repeats), in_process(small, args.repeats)),
            ("`quanteval inspect` (as a user runs it)", cli(big, args.repeats), cli(small, args.repeats)),
            ("safetensors.safe_open over every shard", safetensors_library(big, args.repeats), safetensors_library(small, args.repeats)),
        ]
        print(f"\n{'':42} {'big (163 shards)':>17} {'small (1 file)':>15} {'big/small':>10}")
        for label, big_s, small_s in rows:
            print(f"{label:42} {big_s * 1000:14.1f} ms {small_s * 1000:12.1f} ms {big_s / small_s:9.1f}x")
        print(
            f"\nbig one, in process: the full quanteval report takes {rows[0][1] / rows[2][1]:.1f}x the time the safetensors library "
            "(Rust) needs to count parameters alone"
            f"\npeak Python memory growth inspecting the big one: {(peak - baseline) / 1e6:.1f} MB (target < 100 MB)"
            f"\nbig/small as a user runs it: {rows[1][1] / rows[1][2]:.2f}x (target <= 2x)"
        )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
