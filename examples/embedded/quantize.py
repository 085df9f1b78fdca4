"""Quantized variants of the embedded model, made with llm-compressor (CPU).

    .venv-quantize/bin/python examples/embedded/quantize.py

Reads examples/checkpoints/tiny-add-bf16/ and writes
  examples/checkpoints/tiny-add-w8a8/    llm-compressor W8A8 (int8 weights per output channel, symmetric; int8
                                         activations per token, dynamic), saved compressed (compressed-tensors,
                                         format int-quantized). vLLM's CPU backend serves it.
  examples/checkpoints/tiny-add-w2-rtn/  llm-compressor round-to-nearest 2-bit weights (symmetric int2, see
                                         LOSSY below), *stored dequantized in bf16*: no 2- or 4-bit kernel runs on this
                                         CPU (vLLM: W4A16 needs `cpu_gemm_wna16`, absent here), so the fake-quantized
                                         weights (the exact values the int2 codes dequantize to) are written into a
                                         plain LlamaForCausalLM checkpoint. QUANT_NOTE.md in the folder says so.

  examples/checkpoints/tiny-add-w4a16/   llm-compressor W4A16 (int4 weights, groups of 128), saved compressed: the
                                         format vLLM's CPU build cannot run; the tests use it for the refusal.

All use llm-compressor's `oneshot` with a QuantizationModifier and no calibration data: W8A8's activations are
dynamic (scales per token at run time) and weight scales come from the weights themselves (min-max observer),
so neither scheme has anything to calibrate. Tokenizer files and generation_config.json are copied into each
variant. Before writing, each variant's greedy accuracy on the benchmark is measured in-process (PyTorch,
the quantization emulated by compressed-tensors) and printed; the served numbers are in README.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CKPTS = HERE.parent / "checkpoints"
SRC = CKPTS / "tiny-add-bf16"
BENCH = HERE.parent / "benchmarks" / "tiny_add.jsonl"
COPY_FILES = ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]

# The lossy variant: int4, symmetric, one scale per group of LOSSY_GROUP input columns (0 = per output channel).
LOSSY_BITS = 2  # int4 and int3 round-to-nearest keep this model at 100%; int2 loses ~8 points
LOSSY_GROUP = 0


def log(msg: str) -> None:
    print(msg, flush=True)


def load_bf16(src: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(src, dtype=torch.bfloat16)


def bench_problems():
    probs = []
    for line in BENCH.read_text().splitlines():
        row = json.loads(line)
        a, b = (int(x) for x in row["question"].split("+"))
        probs.append((a, b))
    return probs


def accuracy(model, tokenizer) -> float:
    sys.path.insert(0, str(HERE))
    from train import greedy_accuracy  # the same greedy loop train.py reports with

    return greedy_accuracy(model, tokenizer, bench_problems())


def copy_side_files(src: Path, dst: Path) -> None:
    for name in COPY_FILES:
        shutil.copy2(src / name, dst / name)


def make_w8a8(src: Path, dst: Path, tokenizer) -> float:
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model = load_bf16(src)
    recipe = QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])
    oneshot(model=model, recipe=recipe)
    acc = accuracy(model, tokenizer)  # forward emulates int8 weights + dynamic per-token int8 activations
    shutil.rmtree(dst, ignore_errors=True)
    model.save_pretrained(dst, save_compressed=True)
    copy_side_files(src, dst)
    return acc


def make_w4a16(src: Path, dst: Path) -> None:
    """llm-compressor's W4A16 preset (int4 weights, groups of 128): what vLLM's CPU build cannot run (no
    `cpu_gemm_wna16`). Kept for the tests: quanteval must refuse it before launch and explain the crash if forced."""
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model = load_bf16(src)
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme="W4A16", ignore=["lm_head"]))
    shutil.rmtree(dst, ignore_errors=True)
    model.save_pretrained(dst, save_compressed=True)
    copy_side_files(src, dst)


def make_rtn(src: Path, dst: Path, tokenizer, bits: int, group: int) -> float:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    wargs = QuantizationArgs(
        num_bits=bits,
        type="int",
        symmetric=True,
        dynamic=False,
        strategy="group" if group else "channel",
        group_size=group or None,
        observer="minmax",  # plain round-to-nearest against the per-channel / per-group absmax
    )
    scheme = QuantizationScheme(targets=["Linear"], weights=wargs)
    model = load_bf16(src)
    oneshot(model=model, recipe=QuantizationModifier(config_groups={"group_0": scheme}, ignore=["lm_head"]))

    # Fold the emulation into the weights: W <- dequant(quant(W)) with llm-compressor's own scales.
    fq = {}
    for name, module in model.named_modules():
        if getattr(module, "quantization_scheme", None) is not None and hasattr(module, "weight_scale"):
            fq[name + ".weight"] = fake_quantize(
                module.weight, module.weight_scale, module.weight_zero_point, module.quantization_scheme.weights
            ).to(torch.bfloat16)
    acc_emulated = accuracy(model, tokenizer)

    plain = load_bf16(src)  # a fresh, unquantized model object: standard config.json, no quantization_config
    state = plain.state_dict()
    for k, w in fq.items():
        assert state[k].shape == w.shape, k
        state[k].copy_(w)
    acc_plain = accuracy(plain, tokenizer)
    log(f"  {len(fq)} Linear weights fake-quantized; accuracy emulated {acc_emulated:.3f}, folded bf16 {acc_plain:.3f}")
    levels = {k: torch.unique(w.float().reshape(w.shape[0], -1)[0]).numel() for k, w in list(fq.items())[:1]}
    log(f"  distinct values in row 0 of {next(iter(levels))}: {next(iter(levels.values()))} (<= {2 ** bits})")
    shutil.rmtree(dst, ignore_errors=True)
    plain.save_pretrained(dst, safe_serialization=True)
    copy_side_files(src, dst)
    gran = f"groups of {group} input columns" if group else "one scale per output channel"
    (dst / "QUANT_NOTE.md").write_text(
        f"# tiny-add-w{bits}-rtn: fake-quantized, stored in bf16\n\n"
        f"Every Linear layer except `lm_head` has int{bits} round-to-nearest weights (symmetric, {gran}, min-max "
        f"scales), computed by llm-compressor {_version('llmcompressor')} (`oneshot` + `QuantizationModifier`, no "
        f"calibration data). The weights are stored **dequantized in bf16** (value = int{bits} code x scale): no "
        f"{bits}-bit kernel runs on this CPU, so this checkpoint is a plain `LlamaForCausalLM` that any engine "
        f"serves as BF16. It has the accuracy of a {bits}-bit weight model, not its size or speed. Embeddings, norms "
        f"and `lm_head` are unchanged from `tiny-add-bf16`.\n\n"
        f"Made by `examples/embedded/quantize.py`; measured results in `examples/embedded/README.md`.\n"
    )
    return acc_plain


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", type=Path, default=SRC)
    ap.add_argument("--out-dir", type=Path, default=CKPTS)
    ap.add_argument("--bits", type=int, default=LOSSY_BITS, help="lossy variant: weight bits")
    ap.add_argument("--group", type=int, default=LOSSY_GROUP, help="lossy variant: group size (0 = per channel)")
    ap.add_argument("--only", choices=["w8a8", "rtn", "w4a16"], default=None)
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(0)
    t0 = time.time()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.src)
    base = load_bf16(args.src)
    log(f"llmcompressor {_version('llmcompressor')}, compressed-tensors {_version('compressed-tensors')}, "
        f"torch {torch.__version__}")
    log(f"tiny-add-bf16: greedy accuracy {accuracy(base, tokenizer):.3f}")
    del base
    if args.only in (None, "w8a8"):
        dst = args.out_dir / "tiny-add-w8a8"
        acc = make_w8a8(args.src, dst, tokenizer)
        log(f"tiny-add-w8a8: greedy accuracy (emulated) {acc:.3f} -> {dst}")
    if args.only in (None, "rtn"):
        dst = args.out_dir / f"tiny-add-w{args.bits}-rtn"
        acc = make_rtn(args.src, dst, tokenizer, args.bits, args.group)
        log(f"tiny-add-w{args.bits}-rtn: greedy accuracy {acc:.3f} -> {dst}")
    if args.only in (None, "w4a16"):
        dst = args.out_dir / "tiny-add-w4a16"
        make_w4a16(args.src, dst)
        log(f"tiny-add-w4a16: written (vLLM's CPU build cannot run it) -> {dst}")
    log(f"done in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
