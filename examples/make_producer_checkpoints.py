"""Write tests/data/producers/: checkpoints made by the real quantizers, tensor bytes zeroed.

Each fixture is a tiny random model (Llama, Qwen3, Qwen3-MoE, Mixtral; hidden 64, 2 layers, vocab 128; hidden 128
where a scheme packs 128-wide groups or blocks) quantized on CPU by ModelOpt, llm-compressor, auto-round or
bitsandbytes, then saved by that producer's own export code. Only the files a loader reads for its decisions are
kept: config.json, hf_quant_config.json, generation_config.json,
tokenizer files, model.safetensors.index.json and the safetensors files with their headers kept byte for byte
(names, dtypes, shapes, offsets) and the data section replaced by zeros of the same length, so they stay valid
safetensors and compress to nothing in git. tests/data/producers/manifest.json records, per fixture, the producer
and its version, the recipe, what the producer was asked to write (weights, activations, KV cache, group size,
ignored layers, MoE), each unquantized model's parameter count, and, for a scheme that cannot be written on CPU,
the producer's error (ModelOpt NVFP4_AWQ_LITE and auto_quantize with NVFP4: "amax must be a CUDA tensor for dynamic
block quantization"). One workaround is applied and recorded: llm-compressor's AWQ pins memory, which needs an
accelerator, so pinning is skipped (see no_pinned_memory).

The producers need torch and must not enter the project's venv, so they live in a venv of their own:

    python3 -m venv /work/producers-venv
    /work/producers-venv/bin/pip install torch==2.13.0          # the local CPU wheel; other pins pull CUDA builds
    /work/producers-venv/bin/pip install -c <(echo torch==2.13.0) \
        nvidia-modelopt==0.47.0 llmcompressor==0.14.0.1 compressed-tensors==0.19.0 auto-round==0.15.1 \
        bitsandbytes==0.50.2 transformers==5.17.0 safetensors==0.8.0
    /work/producers-venv/bin/python examples/make_producer_checkpoints.py    # every scheme, ~25 min on 2 busy cores
    /work/producers-venv/bin/python examples/make_producer_checkpoints.py modelopt-fp8 llmcompressor-nvfp4

Naming some fixtures rewrites only those and keeps the other manifest entries.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
import struct
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "producers"
MANIFEST = OUT / "manifest.json"

# Files a loader reads to decide how to serve a checkpoint; everything else a producer writes is left out.
KEEP_FILES = (
    "config.json",
    "hf_quant_config.json",
    "generation_config.json",
    "quantize_config.json",
    "quantization_config.json",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)

VOCAB = 128  # one id per ASCII character, so the tokenizer file stays a few KB
SEQ = 32
CALIB_SAMPLES = 8
DIMS = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}
# Schemes with 128-wide groups or blocks cannot pack a 64-wide input ("partial blocks are not supported"),
# so they get a model whose every linear input is 128 wide.
WIDE = {**DIMS, "hidden_size": 128, "intermediate_size": 128, "head_dim": 32}


# --- tiny models -------------------------------------------------------------------------------------------


def make_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(i): i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=chr(0)))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token=chr(0), pad_token=chr(1), bos_token=chr(2), eos_token=chr(3)
    )


BASE = Path(tempfile.gettempdir()) / "quanteval-producer-bases"


def make_model(kind: str):
    """A random bf16 model, saved and loaded back the way users load one (producers read its config from disk)."""
    import torch
    import transformers

    base = BASE / kind
    if not (base / "config.json").exists():
        torch.manual_seed(0)
        if kind == "llama-wide":
            config = transformers.LlamaConfig(**WIDE)
            cls = transformers.LlamaForCausalLM
        elif kind == "llama":
            config = transformers.LlamaConfig(**DIMS)
            cls = transformers.LlamaForCausalLM
        elif kind == "qwen3":
            config = transformers.Qwen3Config(**DIMS)
            cls = transformers.Qwen3ForCausalLM
        elif kind == "qwen3moe":
            config = transformers.Qwen3MoeConfig(
                **DIMS, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, decoder_sparse_step=1
            )
            cls = transformers.Qwen3MoeForCausalLM
        elif kind == "mixtral":
            config = transformers.MixtralConfig(**DIMS, num_local_experts=4, num_experts_per_tok=2)
            cls = transformers.MixtralForCausalLM
        else:
            raise ValueError(kind)
        config.bos_token_id, config.eos_token_id, config.pad_token_id = 2, 3, 1
        model = cls(config).to(torch.bfloat16)
        model.generation_config = transformers.GenerationConfig(bos_token_id=2, eos_token_id=3, pad_token_id=1)
        model.save_pretrained(base)
        make_tokenizer().save_pretrained(base)
    return transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16).eval()


def calib_ids():
    import torch

    g = torch.Generator().manual_seed(1)
    return [torch.randint(4, VOCAB, (1, SEQ), generator=g) for _ in range(CALIB_SAMPLES)]


def calib_texts() -> list[str]:
    import random

    rng = random.Random(1)
    return ["".join(chr(rng.randrange(32, 127)) for _ in range(SEQ * 4)) for _ in range(CALIB_SAMPLES)]


# --- ModelOpt ------------------------------------------------------------------------------------------------


def modelopt_cfg(name: str, *extra: str) -> dict:
    import modelopt.torch.quantization as mtq

    cfg = copy.deepcopy(getattr(mtq, name))
    for more in extra:  # KV-cache configs are partial: their entries go after the base entries
        cfg["quant_cfg"] = list(cfg["quant_cfg"]) + list(copy.deepcopy(getattr(mtq, more))["quant_cfg"])
    return cfg


def modelopt_mixed_cfg() -> dict:
    """Layer 0 FP8, layer 1 W4A8_AWQ: the per-layer route to ModelOpt's MIXED_PRECISION export."""
    fp8 = modelopt_cfg("FP8_DEFAULT_CFG")
    w4a8 = modelopt_cfg("W4A8_AWQ_BETA_CFG")

    def layer_entries(cfg: dict, layer: int) -> list[dict]:
        out = []
        for entry in cfg["quant_cfg"]:
            if entry.get("quantizer_name") in ("*weight_quantizer", "*input_quantizer") and "cfg" in entry:
                out.append({**entry, "quantizer_name": f"*layers.{layer}.*{entry['quantizer_name'][1:]}"})
        return out

    base = [e for e in fp8["quant_cfg"] if e.get("quantizer_name") not in ("*weight_quantizer", "*input_quantizer")]
    return {"quant_cfg": base[:1] + layer_entries(fp8, 0) + layer_entries(w4a8, 1) + base[1:], "algorithm": w4a8["algorithm"]}


def run_modelopt(cfg: Callable[[], dict], shard: str | None = None):
    def run(out: Path, tokenizer, model_kind: str) -> None:
        import modelopt.torch.quantization as mtq
        import torch
        from modelopt.torch.export import export_hf_checkpoint

        model = make_model(model_kind)
        ids = calib_ids()

        def forward_loop(m):
            with torch.no_grad():
                for x in ids:
                    m(x)

        mtq.quantize(model, cfg(), forward_loop)
        kwargs = {"max_shard_size": shard} if shard else {}
        export_hf_checkpoint(model, export_dir=out, **kwargs)
        tokenizer.save_pretrained(out)

    return run


def run_modelopt_auto_quantize(formats: list[str]):
    def run(out: Path, tokenizer, model_kind: str) -> None:
        import modelopt.torch.quantization as mtq
        import torch
        from modelopt.torch.export import export_hf_checkpoint

        model = make_model(model_kind)
        ids = calib_ids()
        mtq.auto_quantize(
            model,
            constraints={"effective_bits": 6.0},
            quantization_formats=[modelopt_cfg(f) for f in formats],
            data_loader=ids,
            forward_step=lambda m, x: m(x),
            loss_func=lambda output, x: output.logits.float().logsumexp(-1).mean(),
            num_calib_steps=len(ids),
            num_score_steps=len(ids),
        )
        with torch.no_grad():
            model(ids[0])
        export_hf_checkpoint(model, export_dir=out)
        tokenizer.save_pretrained(out)

    return run


# --- llm-compressor ------------------------------------------------------------------------------------------


def run_llmcompressor(recipe: Callable[[], object]):
    def run(out: Path, tokenizer, model_kind: str) -> None:
        from datasets import Dataset
        from llmcompressor import oneshot

        model = make_model(model_kind)
        ids = calib_ids()
        dataset = Dataset.from_dict(
            {"input_ids": [x[0].tolist() for x in ids], "attention_mask": [[1] * SEQ for _ in ids]}
        )
        oneshot(
            model=model,
            tokenizer=tokenizer,
            dataset=dataset,
            recipe=recipe(),
            max_seq_length=SEQ,
            num_calibration_samples=len(ids),
            output_dir=str(out),
        )

    return run


def no_pinned_memory() -> None:
    """AWQModifier pins its calibration caches (a speed-up for host-to-GPU copies) unconditionally, and pinning
    needs an accelerator; with nothing to copy to, skipping it changes no result."""
    from llmcompressor.pipelines.cache import IntermediatesCache

    IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None


def qmod(**kwargs):
    from llmcompressor.modifiers.quantization import QuantizationModifier

    return QuantizationModifier(**kwargs)


def gptq(**kwargs):
    from llmcompressor.modifiers.quantization import GPTQModifier

    return GPTQModifier(**kwargs)


def awq(**kwargs):
    from llmcompressor.modifiers.awq import AWQModifier

    no_pinned_memory()
    return AWQModifier(**kwargs)


KV_FP8 = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def llmc_mixed():
    """Attention projections W8A8 (int8), MLP W4A16: two config groups in one recipe."""
    return qmod(
        config_groups={
            "attention": {
                "targets": ["re:.*self_attn.*proj$"],
                "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"},
                "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
            },
            "mlp": {
                "targets": ["re:.*mlp.*proj$"],
                "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32},
            },
        },
        ignore=["lm_head"],
    )


# --- auto-round and bitsandbytes -----------------------------------------------------------------------------


def run_autoround(fmt: str):
    def run(out: Path, tokenizer, model_kind: str) -> None:
        from auto_round import AutoRound

        model = make_model(model_kind)
        ar = AutoRound(
            model,
            tokenizer,
            scheme="W4A16",
            dataset=calib_texts(),
            iters=20,  # the default is 200; 20 keeps the run short and writes the same format
            nsamples=CALIB_SAMPLES,
            seqlen=SEQ,
            batch_size=2,
            device_map="cpu",
            enable_torch_compile=False,  # compiling on CPU takes longer than the whole tuning
        )
        ar.quantize_and_save(output_dir=str(out), format=fmt)
        # auto-round writes into a subfolder for some formats; lift its files up
        subdirs = [p for p in out.iterdir() if p.is_dir()]
        if not (out / "config.json").exists() and len(subdirs) == 1:
            for f in subdirs[0].iterdir():
                shutil.move(str(f), out / f.name)

    return run


def run_bnb(**bnb):
    def run(out: Path, tokenizer, model_kind: str) -> None:
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        make_model(model_kind)
        model = AutoModelForCausalLM.from_pretrained(
            BASE / model_kind, quantization_config=BitsAndBytesConfig(**bnb), device_map="cpu"
        )
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)

    return run


# --- the schemes ---------------------------------------------------------------------------------------------


def fp8(dynamic: bool | None) -> dict:
    return {"format": "fp8_e4m3", "bits": 8, "dynamic": dynamic}


def w(fmt: str, bits: int, group_size: int | None = None, strategy: str | None = None, block=None) -> dict:
    return {"format": fmt, "bits": bits, "group_size": group_size, "strategy": strategy, "block": block}


def a(fmt: str, bits: int, dynamic: bool | None, group_size: int | None = None) -> dict:
    return {"format": fmt, "bits": bits, "dynamic": dynamic, "group_size": group_size}


@dataclass
class Scheme:
    name: str
    producer: str  # distribution name, for its version
    model: str
    recipe: str
    run: Callable[[Path, object, str], None]  # (output dir, tokenizer, model kind)
    weights: dict | None
    activations: dict | None = None
    kv_cache: dict | None = None
    ignored: list[str] = field(default_factory=lambda: ["lm_head"])
    notes: str = ""
    kv_only: bool = False

    def __post_init__(self) -> None:
        # the 128-wide groups/blocks need the wide model (see WIDE)
        group = (self.weights or {}).get("group_size") or 0
        if self.model == "llama" and (group >= 128 or (self.weights or {}).get("block")):
            self.model = "llama-wide"

    @property
    def moe(self) -> bool:
        return self.model in ("qwen3moe", "mixtral")


MO = "nvidia-modelopt"
LC = "llmcompressor"
NVFP4_W = w("nvfp4", 4, 16, "group")
NVFP4_A = a("nvfp4", 4, "local", 16)  # "local": per-block scales computed at run time, global scale calibrated
MX4_W = w("mxfp4", 4, 32, "group")
MX8_W = w("mxfp8", 8, 32, "group")


def cfgf(*names: str):
    return lambda: modelopt_cfg(*names)


SCHEMES: list[Scheme] = [
    # ModelOpt: mtq.quantize with its named config, then export_hf_checkpoint
    Scheme("modelopt-fp8", MO, "llama", "FP8_DEFAULT_CFG (max_shard_size=64KB, so the index is written)",
           run_modelopt(cfgf("FP8_DEFAULT_CFG"), shard="64KB"),
           w("fp8_e4m3", 8, None, "tensor"), a("fp8_e4m3", 8, False)),
    Scheme("modelopt-fp8-kv", MO, "llama", "FP8_DEFAULT_CFG + FP8_KV_CFG", run_modelopt(cfgf("FP8_DEFAULT_CFG", "FP8_KV_CFG")),
           w("fp8_e4m3", 8, None, "tensor"), a("fp8_e4m3", 8, False), {"format": "fp8_e4m3", "bits": 8}),
    Scheme("modelopt-fp8-per-channel-per-token", MO, "llama", "FP8_PER_CHANNEL_PER_TOKEN_CFG",
           run_modelopt(cfgf("FP8_PER_CHANNEL_PER_TOKEN_CFG")),
           w("fp8_e4m3", 8, None, "channel"), a("fp8_e4m3", 8, True)),
    Scheme("modelopt-fp8-pb-wo", MO, "llama", "FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG (128x128 blocks)",
           run_modelopt(cfgf("FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG")),
           w("fp8_e4m3", 8, None, "block", [128, 128])),
    Scheme("modelopt-nvfp4", MO, "qwen3", "NVFP4_DEFAULT_CFG", run_modelopt(cfgf("NVFP4_DEFAULT_CFG")),
           NVFP4_W, NVFP4_A),
    Scheme("modelopt-nvfp4-moe", MO, "qwen3moe", "NVFP4_DEFAULT_CFG", run_modelopt(cfgf("NVFP4_DEFAULT_CFG")),
           NVFP4_W, NVFP4_A, ignored=["lm_head", "*mlp.gate"]),
    Scheme("modelopt-nvfp4-experts-only", MO, "qwen3moe", "NVFP4_EXPERTS_ONLY_CFG",
           run_modelopt(cfgf("NVFP4_EXPERTS_ONLY_CFG")), NVFP4_W, NVFP4_A,
           ignored=["lm_head", "*self_attn*", "*mlp.gate"], notes="only the experts' linears are quantized"),
    Scheme("modelopt-nvfp4-mixtral-moe", MO, "mixtral", "NVFP4_DEFAULT_CFG", run_modelopt(cfgf("NVFP4_DEFAULT_CFG")),
           NVFP4_W, NVFP4_A, ignored=["lm_head", "*block_sparse_moe.gate"]),
    Scheme("modelopt-nvfp4-kv", MO, "qwen3", "NVFP4_DEFAULT_CFG + NVFP4_KV_CFG",
           run_modelopt(cfgf("NVFP4_DEFAULT_CFG", "NVFP4_KV_CFG")), NVFP4_W, NVFP4_A, {"format": "nvfp4", "bits": 4}),
    Scheme("modelopt-w4a16-nvfp4", MO, "qwen3", "W4A16_NVFP4_CFG", run_modelopt(cfgf("W4A16_NVFP4_CFG")), NVFP4_W),
    Scheme("modelopt-int4-awq", MO, "llama", "INT4_AWQ_CFG (block 128)", run_modelopt(cfgf("INT4_AWQ_CFG")),
           w("int4", 4, 128, "group")),
    Scheme("modelopt-w4a8-awq", MO, "llama", "W4A8_AWQ_BETA_CFG", run_modelopt(cfgf("W4A8_AWQ_BETA_CFG")),
           w("int4", 4, 128, "group"), a("fp8_e4m3", 8, False)),
    Scheme("modelopt-int8-sq", MO, "llama", "INT8_SMOOTHQUANT_CFG", run_modelopt(cfgf("INT8_SMOOTHQUANT_CFG")),
           w("int8", 8, None, "channel"), a("int8", 8, False)),
    Scheme("modelopt-int8-wo", MO, "llama", "INT8_WEIGHT_ONLY_CFG", run_modelopt(cfgf("INT8_WEIGHT_ONLY_CFG")),
           w("int8", 8, None, "channel")),
    Scheme("modelopt-mxfp4", MO, "llama", "MXFP4_DEFAULT_CFG", run_modelopt(cfgf("MXFP4_DEFAULT_CFG")),
           MX4_W, a("mxfp4", 4, True, 32)),
    Scheme("modelopt-mxfp8", MO, "llama", "MXFP8_DEFAULT_CFG", run_modelopt(cfgf("MXFP8_DEFAULT_CFG")),
           MX8_W, a("mxfp8", 8, True, 32)),
    Scheme("modelopt-w4a8-nvfp4-fp8", MO, "llama", "W4A8_NVFP4_FP8_CFG", run_modelopt(cfgf("W4A8_NVFP4_FP8_CFG")),
           w("nvfp4", 4, 32, "group"), a("fp8_e4m3", 8, False), notes="FP4 E2M1 weights in blocks of 32 with FP8 scales"),
    Scheme("modelopt-mixed-fp8-w4a8-awq", MO, "llama-wide", "per-layer quant_cfg: layer 0 FP8_DEFAULT_CFG, layer 1 W4A8_AWQ_BETA_CFG",
           run_modelopt(modelopt_mixed_cfg), None, None,
           notes="mixed precision: layers.0 FP8 (w8a8 fp8, per-tensor), layers.1 W4A8_AWQ (int4 group 128, fp8 activations)"),
    Scheme("modelopt-nvfp4-awq-lite", MO, "llama", "NVFP4_AWQ_LITE_CFG", run_modelopt(cfgf("NVFP4_AWQ_LITE_CFG")),
           NVFP4_W, NVFP4_A),
    Scheme("modelopt-auto-quantize-nvfp4-fp8", MO, "llama", "mtq.auto_quantize over NVFP4_DEFAULT_CFG and FP8_DEFAULT_CFG, effective_bits 6",
           run_modelopt_auto_quantize(["NVFP4_DEFAULT_CFG", "FP8_DEFAULT_CFG"]), None, None,
           notes="per-layer choice between NVFP4 and FP8"),
    Scheme("modelopt-auto-quantize-fp8-int4-awq", MO, "llama-wide", "mtq.auto_quantize over FP8_DEFAULT_CFG and INT4_AWQ_CFG, effective_bits 6",
           run_modelopt_auto_quantize(["FP8_DEFAULT_CFG", "INT4_AWQ_CFG"]), None, None,
           ignored=[],
           notes="per-layer choice between FP8 and INT4 AWQ, lm_head included (auto_quantize itself runs on CPU; "
                 "with NVFP4 among the formats it does not)"),
    # llm-compressor: oneshot with random calibration ids, saved compressed (compressed-tensors format)
    Scheme("llmcompressor-fp8-dynamic", LC, "llama", "QuantizationModifier(scheme=FP8_DYNAMIC)",
           run_llmcompressor(lambda: qmod(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head"])),
           w("fp8_e4m3", 8, None, "channel"), a("fp8_e4m3", 8, True)),
    Scheme("llmcompressor-fp8-static", LC, "llama", "QuantizationModifier(scheme=FP8)",
           run_llmcompressor(lambda: qmod(targets="Linear", scheme="FP8", ignore=["lm_head"])),
           w("fp8_e4m3", 8, None, "tensor"), a("fp8_e4m3", 8, False)),
    Scheme("llmcompressor-fp8-block", LC, "llama", "QuantizationModifier(scheme=FP8_BLOCK)",
           run_llmcompressor(lambda: qmod(targets="Linear", scheme="FP8_BLOCK", ignore=["lm_head"])),
           w("fp8_e4m3", 8, None, "block", [128, 128]), a("fp8_e4m3", 8, True, 128)),
    Scheme("llmcompressor-kv-fp8", LC, "llama", "QuantizationModifier(kv_cache_scheme=fp8 static per-tensor) only",
           run_llmcompressor(lambda: qmod(kv_cache_scheme=KV_FP8)),
           None, None, {"format": "fp8_e4m3", "bits": 8}, ignored=[], kv_only=True),
    Scheme("llmcompressor-w4a16-gptq", LC, "llama", "GPTQModifier(scheme=W4A16)",
           run_llmcompressor(lambda: gptq(targets="Linear", scheme="W4A16", ignore=["lm_head"])),
           w("int4", 4, 128, "group")),
    Scheme("llmcompressor-w4a16-rtn", LC, "llama", "QuantizationModifier(scheme=W4A16)",
           run_llmcompressor(lambda: qmod(targets="Linear", scheme="W4A16", ignore=["lm_head"])),
           w("int4", 4, 128, "group")),
    Scheme("llmcompressor-w4a16-awq", LC, "llama", "AWQModifier(scheme=W4A16_ASYM)",
           run_llmcompressor(lambda: awq(targets="Linear", scheme="W4A16_ASYM", ignore=["lm_head"])),
           w("int4", 4, 128, "group"),
           notes="IntermediatesCache.pin_memory patched to a no-op: unpatched, AWQ raises 'Cannot access accelerator "
                 "device when none is available' on CPU (it pins calibration caches unconditionally)"),
    Scheme("llmcompressor-w8a8-int8", LC, "llama", "GPTQModifier(scheme=W8A8)",
           run_llmcompressor(lambda: gptq(targets="Linear", scheme="W8A8", ignore=["lm_head"])),
           w("int8", 8, None, "channel"), a("int8", 8, True)),
    Scheme("llmcompressor-w8a16", LC, "llama", "GPTQModifier(scheme=W8A16)",
           run_llmcompressor(lambda: gptq(targets="Linear", scheme="W8A16", ignore=["lm_head"])),
           w("int8", 8, 128, "group")),
    Scheme("llmcompressor-nvfp4", LC, "qwen3", "QuantizationModifier(scheme=NVFP4)",
           run_llmcompressor(lambda: qmod(targets="Linear", scheme="NVFP4", ignore=["lm_head"])),
           NVFP4_W, NVFP4_A),
    Scheme("llmcompressor-nvfp4a16", LC, "qwen3", "QuantizationModifier(scheme=NVFP4A16)",
           run_llmcompressor(lambda: qmod(targets="Linear", scheme="NVFP4A16", ignore=["lm_head"])),
           NVFP4_W),
    Scheme("llmcompressor-mxfp4", LC, "llama", "QuantizationModifier(scheme=MXFP4)",
           run_llmcompressor(lambda: qmod(targets="Linear", scheme="MXFP4", ignore=["lm_head"])),
           MX4_W, a("mxfp4", 4, True, 32)),
    Scheme("llmcompressor-w4afp8", LC, "llama", "QuantizationModifier(scheme=W4AFP8)",
           run_llmcompressor(lambda: qmod(targets="Linear", scheme="W4AFP8", ignore=["lm_head"])),
           w("int4", 4, 128, "group"), a("fp8_e4m3", 8, True)),  # per-token dynamic
    Scheme("llmcompressor-mixed-w8a8-w4a16", LC, "llama", "QuantizationModifier(config_groups: attention W8A8 int8, mlp W4A16 g32)",
           run_llmcompressor(llmc_mixed), None, None,
           notes="mixed: self_attn projections int8 per-channel weights + dynamic per-token int8 activations; "
                 "mlp projections int4 group 32 weight-only"),
    Scheme("llmcompressor-fp8-dynamic-moe", LC, "qwen3moe", "QuantizationModifier(scheme=FP8_DYNAMIC, ignore lm_head and router gates)",
           run_llmcompressor(lambda: qmod(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head", "re:.*mlp.gate$"])),
           w("fp8_e4m3", 8, None, "channel"), a("fp8_e4m3", 8, True), ignored=["lm_head", "re:.*mlp.gate$"]),
    Scheme("llmcompressor-nvfp4-moe", LC, "qwen3moe", "QuantizationModifier(scheme=NVFP4, ignore lm_head and router gates)",
           run_llmcompressor(lambda: qmod(targets="Linear", scheme="NVFP4", ignore=["lm_head", "re:.*mlp.gate$"])),
           NVFP4_W, NVFP4_A, ignored=["lm_head", "re:.*mlp.gate$"]),
    # auto-round: its default scheme (W4A16, group 128, symmetric)
    Scheme("autoround-w4a16", "auto-round", "llama", "AutoRound(scheme=W4A16, iters=20) format=auto_round",
           run_autoround("auto_round"), w("int4", 4, 128, "group")),
    Scheme("autoround-w4a16-gptq", "auto-round", "llama", "AutoRound(scheme=W4A16, iters=20) format=auto_gptq",
           run_autoround("auto_gptq"), w("int4", 4, 128, "group")),
    # bitsandbytes through transformers' BitsAndBytesConfig, then save_pretrained
    Scheme("bnb-nf4", "bitsandbytes", "llama", "BitsAndBytesConfig(load_in_4bit, nf4, bf16 compute)",
           run_bnb(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype="bfloat16"),
           w("nf4", 4, None, "group"), notes="nf4 blocks of 64 (bitsandbytes' default, not written in the config)"),
    Scheme("bnb-int8", "bitsandbytes", "llama", "BitsAndBytesConfig(load_in_8bit)", run_bnb(load_in_8bit=True),
           w("int8", 8, None, "channel")),
]


# --- writing the fixtures ------------------------------------------------------------------------------------


def zeroed_copy(src: Path, dst: Path) -> None:
    """Copy a safetensors file keeping its header bytes and replacing the data section with zeros."""
    raw = src.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    dst.write_bytes(raw[: 8 + header_len] + bytes(len(raw) - 8 - header_len))


def keep(src: Path, dst: Path) -> list[str]:
    dst.mkdir(parents=True)
    kept = []
    for f in sorted(src.iterdir()):
        if f.suffix == ".safetensors":
            zeroed_copy(f, dst / f.name)
        elif f.name in KEEP_FILES:
            shutil.copyfile(f, dst / f.name)
        else:
            continue
        kept.append(f.name)
    return kept


def version(dist: str) -> str:
    return metadata.version(dist)


def entry(scheme: Scheme) -> dict:
    return {
        "producer": scheme.producer,
        "producer_version": version(scheme.producer),
        "model": scheme.model,
        "recipe": scheme.recipe,
        "intent": {
            "weights": scheme.weights,
            "activations": scheme.activations,
            "kv_cache": scheme.kv_cache,
            "ignored": scheme.ignored,
            "moe": scheme.moe,
            "kv_only": scheme.kv_only,
            "notes": scheme.notes,
        },
    }


def build(scheme: Scheme, tokenizer) -> dict:
    record = entry(scheme)
    target = OUT / scheme.name
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ckpt"
        out.mkdir()
        try:
            scheme.run(out, tokenizer, scheme.model)
            if not (out / "config.json").exists():
                raise RuntimeError(f"the producer wrote no config.json (wrote {sorted(p.name for p in out.iterdir())})")
        except BaseException as exc:  # a producer may raise anything, even SystemExit; keep going with the others
            if isinstance(exc, KeyboardInterrupt):
                raise
            traceback.print_exc()  # the full story goes to the log; the manifest keeps the last line
            last = traceback.extract_tb(exc.__traceback__)[-1]
            record["status"] = "failed"
            record["error"] = f"{type(exc).__name__}: {str(exc).strip()[:600]}"
            record["error_at"] = f"{Path(last.filename).name}:{last.lineno} in {last.name}"
            return record
        record["status"] = "written"
        record["files"] = keep(out, target)
    return record


KINDS = ("llama", "llama-wide", "qwen3", "qwen3moe", "mixtral")


@functools.cache
def parameter_count(kind: str) -> int:
    return sum(p.numel() for p in make_model(kind).parameters())


def write_manifest(fixtures: dict[str, dict]) -> None:
    manifest = {
        "about": "Checkpoints written by real quantizers on tiny random models (CPU), tensor bytes zeroed. "
        "Made by examples/make_producer_checkpoints.py; 'intent' is what the producer was asked to write.",
        "versions": {d: version(d) for d in ("torch", "transformers", MO, LC, "compressed-tensors", "auto-round", "bitsandbytes", "safetensors")},
        "models": {"llama/qwen3/qwen3moe/mixtral": DIMS, "llama-wide": WIDE,
                   "qwen3moe": "num_experts 4, top-2, moe_intermediate_size 64",
                   "mixtral": "num_local_experts 4, top-2"},
        # parameters of each unquantized model: what a logical (unpacked, scales left out) count should give
        "parameter_count": {kind: parameter_count(kind) for kind in KINDS},
        "fixtures": {name: fixtures[name] for name in sorted(fixtures)},
    }
    MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n")


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    wanted = set(argv)
    unknown = wanted - {s.name for s in SCHEMES}
    if unknown:
        raise SystemExit(f"unknown fixtures: {sorted(unknown)}")
    OUT.mkdir(parents=True, exist_ok=True)
    old = json.loads(MANIFEST.read_text()) if MANIFEST.exists() and wanted else {}
    fixtures = dict(old.get("fixtures", {}))
    for scheme in SCHEMES:
        if wanted and scheme.name not in wanted:
            continue
        record = build(scheme, make_tokenizer())  # a fresh one: producers set truncation on the one they get
        fixtures[scheme.name] = record
        write_manifest(fixtures)  # after every scheme, so an interrupted run keeps what it made
        print(f"{scheme.name}: {record['status']} {record.get('error', '')[:200]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
