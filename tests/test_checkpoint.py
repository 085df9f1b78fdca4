"""inspect_checkpoint against real checkpoint folders in every layout users bring, and every bad input."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from factories import MODELOPT_ALGOS, OTHER_METHODS, make_checkpoint, write_safetensors  # noqa: E402

from quanteval.models import ToolError  # noqa: E402
from quanteval.serving.checkpoint import (  # noqa: E402
    GPU_TYPES,
    CheckpointReport,
    InspectCheckpointInput,
    format_report,
    inspect_checkpoint,
)
from quanteval.serving.frameworks import MODELOPT_ALGOS as MODELOPT_FACTS  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "checkpoints"
# The tiny factory model: 2 layers, hidden 64, 4 heads, 2 kv heads, head_dim 16, intermediate 128, vocab 256.
BF16_PARAMS = 256 * 64 * 2 + 2 * (2 * 64 + 64 * 64 + 2 * (32 * 64) + 64 * 64 + 3 * 128 * 64) + 64


def inspect(path: Path | str) -> CheckpointReport:
    return inspect_checkpoint(InspectCheckpointInput(checkpoint=str(path)))


def error_of(path: Path | str) -> str:
    with pytest.raises(ToolError) as caught:
        inspect(path)
    return str(caught.value)


# --- Bundled examples --------------------------------------------------------------------------


def test_bundled_bf16_example_reports_an_unquantized_llama():
    report = inspect(EXAMPLES / "llama-tiny-bf16")
    arch = report.architecture
    assert (arch.architecture, arch.model_type, arch.num_layers, arch.hidden_size) == ("LlamaForCausalLM", "llama", 2, 64)
    assert (arch.num_attention_heads, arch.num_kv_heads, arch.vocab_size, arch.torch_dtype) == (4, 2, 256, "bfloat16")
    assert report.weights.parameter_count == report.weights.logical_parameter_count == BF16_PARAMS
    assert report.weights.dtype_parameters == {"BF16": BF16_PARAMS}
    assert report.weights.weight_bytes == 2 * BF16_PARAMS
    assert report.weights.size_bytes == (EXAMPLES / "llama-tiny-bf16" / "model.safetensors").stat().st_size
    assert report.quantization.detected is False and report.quantization.method is None
    assert report.context_length == 4096 and not report.trust_remote_code
    assert not report.reasoning and not report.tool_calling
    assert report.generation_defaults == {"temperature": 0.6, "top_p": 0.95}
    assert report.deployment_flags["vllm"].args == ["--max-model-len", "4096"]
    assert report.deployment_flags["sglang"].args == ["--context-length", "4096"]
    assert report.deployment_flags["trtllm"].args == ["--max_seq_len", "4096"]
    assert all(flags.quantization is None for flags in report.deployment_flags.values())
    # a structural fixture: its weights are placeholders, one value per row, and the report says so
    assert report.weights.row_values == [1, 128] and len(report.warnings) == 1
    assert report.warnings[0].startswith("constant weights: a weight row of 128 holds one value")
    assert report.files_read == ["config.json", "generation_config.json", "tokenizer_config.json"]


@pytest.mark.parametrize(("checkpoint", "said"), [
    ("tiny-add-bf16", "no quantization: no quantization config, only BF16 weights, and a weight row of 512 holds"),
    ("tiny-add-w2-rtn", "stored dequantized: no quantization config and BF16 weights, but a weight row of 512 holds 4 "),
    ("tiny-add-w8a8", None), ("tiny-add-w4a16", None), ("qwen3-tiny-nvfp4", None),
])
def test_a_checkpoint_without_quantization_is_named_for_what_it_is(checkpoint, said, tmp_path):
    """Real producers' checkpoints: the trained BF16 model, llm-compressor's int2 RTN stored dequantized (a grid of 4
    values per row), and real quantized formats (no such warning). A BF16 copy under a quantized name is still BF16."""
    report = inspect_checkpoint(InspectCheckpointInput(checkpoint=str(EXAMPLES / checkpoint)))
    found = [w for w in report.warnings if w.startswith(("no quantization", "stored dequantized"))]
    assert found == ([] if said is None else [found[0]]) and (said is None or found[0].startswith(said)), report.warnings
    if checkpoint == "tiny-add-bf16":
        import shutil

        from quanteval.workflow.evaluate import checkpoint_notes

        renamed = tmp_path / "tiny-add-int8-v2"
        shutil.copytree(EXAMPLES / checkpoint, renamed)
        notes = checkpoint_notes(str(EXAMPLES / checkpoint), str(renamed))
        assert notes == [f"Candidate: {found[0]}"]  # in evaluate's answer, beside the verdict


def test_bundled_fp8_example_reads_the_legacy_modelopt_file():
    quant = inspect(EXAMPLES / "llama-tiny-fp8").quantization
    source = "hf_quant_config.json"
    assert quant.model_dump() == {
        "detected": True,
        "method": "modelopt",
        "quant_algo": "FP8",
        "format": "FP8",
        "kv_cache_quant_algo": "FP8",
        "group_size": None,
        "weight_bits": 8,
        "weights": {"bits": 8, "kind": "float", "group_size": None, "dynamic": None, "source": source},
        "activations": {"bits": 8, "kind": "float", "group_size": None, "dynamic": False, "source": source},
        "kv_cache": {"bits": 8, "kind": "float", "group_size": None, "dynamic": None, "source": source},
        "exclude_modules": ["lm_head"],
        "layer_algos": {},
        "producer": "modelopt 0.33.0",
        "source_file": source,
        "sources": {"quant_algo": source, "producer": source, "kv_cache_quant_algo": source, "exclude_modules": source},
    }


def test_bundled_nvfp4_example_reads_config_json_and_flags_blackwell():
    report = inspect(EXAMPLES / "qwen3-tiny-nvfp4")
    quant = report.quantization
    assert (quant.method, quant.quant_algo, quant.group_size, quant.source_file) == ("modelopt", "NVFP4", 16, "config.json")
    assert quant.kv_cache_quant_algo == "FP8" and quant.exclude_modules == ["lm_head"]
    assert report.architecture.model_type == "qwen3"
    assert report.reasoning and report.tool_calling
    assert report.context_length == 40960
    # NVFP4 packs two values per uint8: the logical count is the BF16 model's (plus Qwen3's q/k norms).
    assert report.weights.logical_parameter_count == BF16_PARAMS + 2 * 2 * 16
    assert report.weights.parameter_count < report.weights.logical_parameter_count
    # Hopper serves NVFP4 through Marlin, weight-only: a warning about what the accuracy measures, not an error.
    assert any("Blackwell" in w and "accuracy" in w for w in report.warnings)
    assert not any("cannot load" in w or "needs compute capability" in w for w in report.warnings)
    assert [fit.note is not None for fit in report.gpu_fit] == [True, True, False]  # H100, H200 yes; B200 no
    assert "Marlin" in report.gpu_fit[0].note
    assert report.deployment_flags["sglang"].quantization is None  # SGLang infers modelopt_fp4 itself
    assert quant.activations is not None and quant.activations.bits == 4


# --- Every quantization layout ----------------------------------------------------------------


@pytest.mark.parametrize("legacy", [True, False], ids=["hf_quant_config", "config_json"])
@pytest.mark.parametrize("algo", MODELOPT_ALGOS)
def test_modelopt_formats_are_detected_in_both_file_layouts(tmp_path: Path, algo: str, legacy: bool):
    report = inspect(make_checkpoint(tmp_path / "ckpt", quant=algo, legacy_modelopt=legacy))
    quant = report.quantization
    assert quant.detected and quant.method == "modelopt" and quant.quant_algo == algo
    assert quant.source_file == ("hf_quant_config.json" if legacy else "config.json")
    assert quant.kv_cache_quant_algo == "FP8"
    assert quant.exclude_modules == ["lm_head"]
    assert quant.producer == "modelopt 0.33.0"
    assert quant.group_size == {"NVFP4": 16, "W4A16_AWQ": 128, "W4A8_AWQ": 128}.get(algo)
    assert report.weights.logical_parameter_count == BF16_PARAMS  # packing undone, scales left out
    assert not any("disagree" in w for w in report.warnings)


@pytest.mark.parametrize("algo", ["W4A16_AWQ", "W4A8_AWQ", "W8A8_SQ_PER_CHANNEL"])
def test_tensorrt_llm_formats_are_errors_for_vllm_and_sglang(tmp_path: Path, algo: str):
    report = inspect(make_checkpoint(tmp_path / "ckpt", quant=algo))
    assert any(algo in w and "SGLang cannot load" in w and "trtllm" in w for w in report.warnings)
    assert any(algo in w and "vLLM cannot load" in w for w in report.warnings)
    for framework in ("vllm", "sglang"):
        assert any(n.startswith("error:") and "cannot load" in n for n in report.deployment_flags[framework].notes)
    assert not any("cannot load" in n for n in report.deployment_flags["trtllm"].notes)


@pytest.mark.parametrize("legacy", [True, False], ids=["hf_quant_config", "config_json"])
def test_mixed_precision_with_nvfp4_layers_is_read_by_the_servers_themselves(tmp_path: Path, legacy: bool):
    report = inspect(make_checkpoint(tmp_path / "ckpt", quant="MIXED_PRECISION", legacy_modelopt=legacy))
    quant = report.quantization
    assert quant.layer_algos == {"FP8": 7, "NVFP4": 7} and quant.format == "MIXED_PRECISION:nvfp4"
    for flags in report.deployment_flags.values():  # SGLang resolves modelopt_mixed from the config itself
        assert flags.quantization is None and "--quantization" not in flags.args
    assert any("modelopt_mixed" in n for n in report.deployment_flags["sglang"].notes)


def _mix(tmp_path: Path, layers: dict[str, str]) -> Path:
    root = make_checkpoint(tmp_path / "ckpt", quant="FP8")
    (root / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.47.0"}, "quantization": {
        "quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": None,
        "quantized_layers": {name: {"quant_algo": algo} for name, algo in layers.items()}}}))
    config = json.loads((root / "config.json").read_text())
    config.pop("quantization_config", None)
    (root / "config.json").write_text(json.dumps(config))
    return root


def test_fp8_attention_with_w4a8_awq_experts_is_what_sglangs_w4afp8_loads(tmp_path: Path):
    """The DeepSeek-R1-W4AFP8 shape: SGLang resolves it as w4afp8 itself (no flag) and loads both layer kinds; vLLM's
    mixed loader has no W4A8_AWQ method, so it says so for vLLM."""
    report = inspect(_mix(tmp_path, {"model.layers.0.mlp.experts.0.gate_proj": "W4A8_AWQ", "model.layers.0.self_attn.q_proj": "FP8"}))
    assert report.quantization.format == "MIXED_PRECISION:w4afp8"
    sglang = report.deployment_flags["sglang"]
    assert "--quantization" not in sglang.args and not [n for n in sglang.notes if n.startswith("error")]
    assert any("(resolves it as w4afp8); no --quantization needed" in n for n in sglang.notes)
    vllm_errors = [n for n in report.deployment_flags["vllm"].notes if n.startswith("error")]
    assert vllm_errors and "1 experts layer stored as W4A8_AWQ (e.g. model.layers.0.mlp.experts.0.gate_proj)" in vllm_errors[0]
    assert "Serve it with SGLang (framework 'sglang')" in vllm_errors[0]


def test_w4a8_awq_in_a_dense_layer_loads_nowhere_though_sglang_resolves_it(tmp_path: Path):
    """w4afp8 gives every linear layer the FP8 method: a dense W4A8_AWQ layer's packed int4 weights do not fit it."""
    report = inspect(_mix(tmp_path, {"model.layers.0.mlp.gate_proj": "W4A8_AWQ", "model.layers.0.self_attn.q_proj": "FP8"}))
    for framework in ("sglang", "vllm"):
        notes = report.deployment_flags[framework].notes
        assert any(n.startswith("error") and "stored as W4A8_AWQ" in n and "Neither SGLang nor vLLM" in n for n in notes), notes
        assert not any("no --quantization needed" in n for n in notes)


def test_fp8_and_nvfp4_need_no_quantization_flag(tmp_path: Path):
    for algo in ("FP8", "NVFP4"):
        report = inspect(make_checkpoint(tmp_path / algo, quant=algo))
        assert not any("--quantization" in flags.args for flags in report.deployment_flags.values())
        assert any("no --quantization needed" in n for n in report.deployment_flags["sglang"].notes)


@pytest.mark.parametrize(
    ("method", "bits", "group_size"),
    [("gptq", 4, 128), ("awq", 4, 128), ("compressed-tensors", 8, None), ("fp8", 8, 128), ("bitsandbytes", 4, None)],
)
def test_other_quantization_methods(tmp_path: Path, method: str, bits: int, group_size: int | None):
    report = inspect(make_checkpoint(tmp_path / "ckpt", quant=method))
    quant = report.quantization
    assert (quant.detected, quant.method, quant.weight_bits, quant.group_size) == (True, method, bits, group_size)
    assert quant.quant_algo is None and quant.source_file == "config.json"
    assert report.weights.logical_parameter_count == BF16_PARAMS
    assert not any("disagree" in w for w in report.warnings)  # gptq also has a matching quantize_config.json
    assert all(flags.quantization is None for flags in report.deployment_flags.values())


def test_compressed_tensors_is_not_mistaken_for_modelopt(tmp_path: Path):
    # Both put config_groups/ignore in quantization_config; only quant_method tells them apart.
    quant = inspect(make_checkpoint(tmp_path / "ckpt", quant="compressed-tensors")).quantization
    assert quant.method == "compressed-tensors" and quant.exclude_modules == ["lm_head"]


def test_gptq_quantize_config_json_alone_is_enough(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt", quant="gptq")
    config = json.loads((root / "config.json").read_text())
    del config["quantization_config"]
    (root / "config.json").write_text(json.dumps(config))
    report = inspect(root)
    assert (report.quantization.method, report.quantization.weight_bits, report.quantization.source_file) == (
        "gptq",
        4,
        "quantize_config.json",
    )
    assert "quantize_config.json" in report.files_read


def test_conflicting_quantization_files_are_a_warning_naming_both(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt", quant="FP8", legacy_modelopt=False)
    (root / "hf_quant_config.json").write_text(
        json.dumps({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16}})
    )
    report = inspect(root)
    assert report.quantization.quant_algo == "FP8" and report.quantization.source_file == "config.json"
    [warning] = [w for w in report.warnings if "disagree" in w]
    assert "config.json says modelopt FP8" in warning and "hf_quant_config.json says modelopt NVFP4" in warning


@pytest.mark.parametrize("algo", ["FP8", "NVFP4", "W4A16_AWQ", "MIXED_PRECISION"])
def test_modelopt_quant_algo_is_derived_from_config_groups_when_absent(tmp_path: Path, algo: str):
    root = make_checkpoint(tmp_path / "ckpt", quant=algo, legacy_modelopt=False)
    config = json.loads((root / "config.json").read_text())
    del config["quantization_config"]["quant_algo"]
    (root / "config.json").write_text(json.dumps(config))
    assert inspect(root).quantization.quant_algo == algo


def test_both_modelopt_files_agreeing_is_not_a_conflict(tmp_path: Path):
    # Real ModelOpt exports write hf_quant_config.json and config.json quantization_config together.
    legacy = make_checkpoint(tmp_path / "legacy", quant="NVFP4")
    root = make_checkpoint(tmp_path / "both", quant="NVFP4", legacy_modelopt=False)
    (root / "hf_quant_config.json").write_text((legacy / "hf_quant_config.json").read_text())
    report = inspect(root)
    assert report.quantization.source_file == "config.json" and report.quantization.quant_algo == "NVFP4"
    assert "hf_quant_config.json" in report.files_read
    assert not any("disagree" in w for w in report.warnings)


def test_unlabelled_fp8_weights_are_a_warning(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt", quant="FP8")
    (root / "hf_quant_config.json").unlink()
    report = inspect(root)
    assert not report.quantization.detected
    assert any("F8_E4M3" in w and "no quantization config" in w for w in report.warnings)


# --- Shards, layouts, templates ----------------------------------------------------------------


@pytest.mark.parametrize("quant", [None, "NVFP4", "gptq"])
def test_sharded_checkpoint_matches_the_single_file_one(tmp_path: Path, quant: str | None):
    single = inspect(make_checkpoint(tmp_path / "one", quant=quant))
    calls: list[tuple[float, float | None, str | None]] = []
    root = make_checkpoint(tmp_path / "sharded", quant=quant, shards=3)
    sharded = inspect_checkpoint(InspectCheckpointInput(checkpoint=str(root)), progress=lambda p, t=None, m=None: calls.append((p, t, m)))
    assert sharded.weights.shard_count == 3 and single.weights.shard_count == 1
    for field in ("parameter_count", "logical_parameter_count", "tensor_count", "dtype_parameters", "weight_bytes"):
        assert getattr(sharded.weights, field) == getattr(single.weights, field)
    assert sharded.weights.size_bytes == sum(p.stat().st_size for p in root.glob("*.safetensors"))
    assert "model.safetensors.index.json" in sharded.files_read
    assert [(p, t) for p, t, _ in calls] == [(1, 3), (2, 3), (3, 3)]
    assert "model-00003-of-00003.safetensors" in calls[-1][2]


def test_multimodal_text_config_supplies_the_language_model_shape(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt", quant="NVFP4", legacy_modelopt=False)
    config = json.loads((root / "config.json").read_text())
    text_keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size", "max_position_embeddings")
    text_config = {key: config.pop(key) for key in text_keys}
    text_config["model_type"] = "qwen2"
    config.update(architectures=["Qwen2_5_VLForConditionalGeneration"], model_type="qwen2_5_vl", text_config=text_config, vision_config={"depth": 2})
    (root / "config.json").write_text(json.dumps(config))
    report = inspect(root)
    arch = report.architecture
    assert (arch.architecture, arch.model_type, arch.multimodal) == ("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", True)
    assert (arch.num_layers, arch.hidden_size, arch.num_attention_heads, arch.num_kv_heads, arch.vocab_size) == (2, 64, 4, 2, 256)
    assert report.context_length == 4096
    assert report.quantization.quant_algo == "NVFP4"


def test_auto_map_means_trust_remote_code_for_every_framework(tmp_path: Path):
    report = inspect(make_checkpoint(tmp_path / "ckpt", auto_map=True, max_position_embeddings=131072))
    assert report.trust_remote_code
    assert report.deployment_flags["vllm"].args == ["--max-model-len", "131072", "--trust-remote-code"]
    assert report.deployment_flags["sglang"].args == ["--context-length", "131072", "--trust-remote-code"]
    assert report.deployment_flags["trtllm"].args == ["--max_seq_len", "131072", "--trust_remote_code"]


def test_chat_templates_reveal_reasoning_and_tools(tmp_path: Path):
    plain = inspect(make_checkpoint(tmp_path / "plain", chat_template="plain"))
    assert not plain.reasoning and not plain.tool_calling
    thinking = inspect(make_checkpoint(tmp_path / "thinking", chat_template="reasoning"))
    assert thinking.reasoning and thinking.tool_calling
    # Newer transformers write the template to chat_template.jinja instead of tokenizer_config.json.
    root = make_checkpoint(tmp_path / "jinja")
    (root / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}<think>\n")
    jinja = inspect(root)
    assert jinja.reasoning and not jinja.tool_calling and "chat_template.jinja" in jinja.files_read


def test_gpu_fit_for_a_large_sparse_checkpoint_reads_only_headers(tmp_path: Path):
    """A 1.2 TB (sparse) checkpoint inspects in well under a second: tensor data is never read."""
    root = make_checkpoint(tmp_path / "big", num_attention_heads=128, num_key_value_heads=128, head_dim=4)
    (root / "model.safetensors").unlink()
    # 600 G BF16 parameters = 1.2 TB of declared weights, as 60 sparse files of 20 GB.
    for shard in range(60):
        write_safetensors(root / f"part-{shard:02d}.safetensors", {f"w{shard}": ("BF16", [100_000, 100_000])}, sparse=True)
    started = time.perf_counter()
    report = inspect(root)
    assert time.perf_counter() - started < 2.0
    assert report.weights.weight_bytes == 1_200_000_000_000
    assert report.weight_memory_gb == 1200.0
    fits = {fit.gpu_type: fit for fit in report.gpu_fit}
    assert set(fits) == set(GPU_TYPES)
    # Rule: weights <= 85% of total GPU memory; TP is a power of two <= 8 dividing the heads; more nodes beyond 8.
    assert (fits["H100"].min_gpus, fits["H100"].nodes, fits["H100"].tensor_parallel_size) == (18, 3, 8)
    assert (fits["H200"].min_gpus, fits["H200"].nodes, fits["H200"].tensor_parallel_size) == (11, 2, 8)
    assert (fits["B200"].min_gpus, fits["B200"].nodes, fits["B200"].tensor_parallel_size) == (8, 1, 8)
    assert "pipeline parallel" in (fits["H100"].note or "")


def test_tensor_parallel_size_divides_the_attention_heads(tmp_path: Path):
    # 100 GB of weights on H100: 2 GPUs would do, but 6 heads only split 1, 2 or 3 ways: TP 2.
    root = make_checkpoint(tmp_path / "ckpt", num_attention_heads=6, num_key_value_heads=6)
    write_safetensors(root / "model.safetensors", {"w": ("BF16", [50_000, 1_000_000])}, sparse=True)
    fit = next(f for f in inspect(root).gpu_fit if f.gpu_type == "H100")
    assert (fit.min_gpus, fit.tensor_parallel_size) == (2, 2)
    # 200 GB needs 3 GPUs; neither TP 4 nor TP 8 divides 6 heads, so TP 3.
    write_safetensors(root / "model.safetensors", {"w": ("BF16", [100_000, 1_000_000])}, sparse=True)
    fit = next(f for f in inspect(root).gpu_fit if f.gpu_type == "H100")
    assert (fit.min_gpus, fit.tensor_parallel_size, fit.note) == (3, 3, None)


def test_hf_handle_resolves_through_the_local_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "hf" / "hub"
    snapshot = cache / "models--nvidia--Tiny-FP8" / "snapshots" / "0123abcd"
    make_checkpoint(snapshot, quant="FP8")
    (cache / "models--nvidia--Tiny-FP8" / "refs").mkdir()
    (cache / "models--nvidia--Tiny-FP8" / "refs" / "main").write_text("0123abcd")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    report = inspect("nvidia/Tiny-FP8")
    assert report.hf_handle == "nvidia/Tiny-FP8"
    assert report.checkpoint == str(snapshot.resolve())
    assert report.quantization.quant_algo == "FP8"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HOME")
    assert inspect("nvidia/Tiny-FP8").checkpoint == str(snapshot.resolve())


# --- Bad input ---------------------------------------------------------------------------------


def test_missing_directory(tmp_path: Path):
    message = error_of(tmp_path / "nope")
    assert str(tmp_path / "nope") in message and "no such checkpoint directory" in message


def test_a_file_instead_of_a_directory(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    assert "is a file" in error_of(tmp_path / "config.json")


def test_no_config_json(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt")
    (root / "config.json").unlink()
    assert "no config.json" in error_of(root)


@pytest.mark.parametrize("name", ["config.json", "hf_quant_config.json", "tokenizer_config.json", "model.safetensors.index.json"])
def test_malformed_json_names_the_file_and_line(tmp_path: Path, name: str):
    root = make_checkpoint(tmp_path / "ckpt", quant="FP8", shards=2)
    (root / name).write_text('{\n  "a": 1,\n  oops\n}')
    message = error_of(root)
    assert str(root / name) in message and "malformed JSON at line 3" in message


def test_json_that_is_not_an_object(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt")
    (root / "config.json").write_text("[1, 2]")
    assert "expected a JSON object" in error_of(root)


@pytest.mark.parametrize(
    ("name", "change"),
    [
        ("hf_quant_config.json", lambda d: d["quantization"].update(group_size="big")),
        ("config.json", lambda d: d.update(num_hidden_layers=2, torch_dtype={"not": "a dtype"})),
    ],
)
def test_config_value_of_the_wrong_type_is_a_clear_error(tmp_path: Path, name: str, change):
    root = make_checkpoint(tmp_path / "ckpt", quant="NVFP4")
    data = json.loads((root / name).read_text())
    change(data)
    (root / name).write_text(json.dumps(data))
    message = error_of(root)
    assert name in message and "unusable value" in message


def test_truncated_safetensors(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt")
    weights = root / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 100)
    message = error_of(root)
    assert str(weights) in message and "truncated" in message


def test_header_length_larger_than_the_file(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt")
    weights = root / "model.safetensors"
    weights.write_bytes(struct.pack("<Q", 10**9) + b'{"a": 1}')
    message = error_of(root)
    assert str(weights) in message and "header length 1000000000 is larger than the file" in message


def test_file_shorter_than_the_header_length_field(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt")
    (root / "model.safetensors").write_bytes(b"\x01\x02")
    assert "truncated safetensors file" in error_of(root)


def test_header_that_is_not_json(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt")
    (root / "model.safetensors").write_bytes(struct.pack("<Q", 8) + b"not json" + bytes(16))
    assert "header is not valid JSON" in error_of(root)


def test_header_entry_without_offsets(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt")
    header = b'{"w":{"dtype":"BF16","shape":[2]}}'
    header += b" " * (-len(header) % 8)
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    assert "data_offsets" in error_of(root)


def test_index_pointing_at_missing_shards_is_reported(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt", shards=3)
    (root / "model-00002-of-00003.safetensors").unlink()
    report = inspect(root)
    assert report.weights.missing_shards == ["model-00002-of-00003.safetensors"]
    assert report.weights.shard_count == 3
    [warning] = [w for w in report.warnings if "missing" in w]
    assert "model.safetensors.index.json" in warning and "model-00002-of-00003.safetensors" in warning
    assert report.weights.parameter_count < BF16_PARAMS  # only what is present is counted, and the warning says so


def test_index_without_weight_map(tmp_path: Path):
    root = make_checkpoint(tmp_path / "ckpt", shards=2)
    (root / "model.safetensors.index.json").write_text('{"metadata": {}}')
    assert "no `weight_map`" in error_of(root)


def test_hf_handle_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    message = error_of("meta-llama/Llama-3.1-8B-Instruct")
    assert "meta-llama/Llama-3.1-8B-Instruct" in message and "not in the HF cache" in message
    assert "huggingface-cli download" in message


def test_hf_cache_ref_pointing_at_a_missing_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    repo_dir = tmp_path / "models--org--name"
    (repo_dir / "snapshots").mkdir(parents=True)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text("deadbeef")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert "deadbeef" in error_of("org/name")


def test_input_rejects_unknown_keys():
    with pytest.raises(ValueError):
        InspectCheckpointInput.model_validate({"checkpoint": "x", "chekpoint": "y"})


# --- The human summary and the CLI -------------------------------------------------------------


def test_format_report_summarises_what_a_person_needs():
    text = format_report(inspect(EXAMPLES / "qwen3-tiny-nvfp4"))
    for expected in (
        "Qwen3ForCausalLM (qwen3)",
        "quant_algo NVFP4",
        "group size 16",
        "KV cache FP8",
        "[config.json, modelopt 0.33.0]",
        "reasoning toggle yes",
        "x B200 (180 GB), TP 1",
        "sglang:        --context-length 40960",
        "warning:",
    ):
        assert expected in text


def test_cli_inspect_prints_the_summary_and_json(cli_env: dict[str, str]):
    path = str(EXAMPLES / "llama-tiny-fp8")
    summary = subprocess.run(["quanteval", "inspect", path], capture_output=True, text=True, env=cli_env, timeout=60)
    assert summary.returncode == 0, summary.stderr
    assert "quant_algo FP8" in summary.stdout
    as_json = subprocess.run(["quanteval", "inspect", path, "--json"], capture_output=True, text=True, env=cli_env, timeout=60)
    assert json.loads(as_json.stdout)["quantization"]["quant_algo"] == "FP8"


def test_cli_bad_input_is_a_one_line_error(tmp_path: Path, cli_env: dict[str, str]):
    result = subprocess.run(
        ["quanteval", "call", "inspect_checkpoint", "--json", json.dumps({"checkpoint": str(tmp_path / "missing")})],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert "no such checkpoint directory" in result.stderr and "Traceback" not in result.stderr


def test_every_modelopt_algo_in_the_factory_is_in_the_fact_table():
    assert set(MODELOPT_ALGOS) <= set(MODELOPT_FACTS)
    assert set(OTHER_METHODS) == {"gptq", "awq", "compressed-tensors", "fp8", "bitsandbytes"}


@pytest.mark.parametrize(("key", "value"), [("intermediate_size", 256), ("hidden_size", 256), ("vocab_size", 999)])
def test_a_config_that_contradicts_its_weights_is_named_and_no_plan_serves_it(tmp_path: Path, key: str, value: int):
    """tiny-add-bf16's weights under a config.json with one size changed. vLLM (CPU build) served the narrower MLP
    without a word, loading a slice of each weight, and answered every problem wrong (the canary then blamed the
    protocol); now inspect names the contradiction and plan_deployment refuses, so nothing is served."""
    import shutil

    from quanteval.serving.deploy import LaunchDeploymentInput, PlanDeploymentInput, launch_deployment, plan_deployment

    broken = tmp_path / "misdescribed"
    shutil.copytree(EXAMPLES / "tiny-add-bf16", broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, key: value}))
    said = [warning for warning in inspect(broken).warnings if warning.startswith(f"config.json says {key} {value}, but ")]
    assert len(said) == 1 and "does not describe these weights" in said[0], inspect(broken).warnings
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(broken), framework="vllm", check_args=False))
    assert [w.message for w in plan.warnings if w.level == "error"] == said
    with pytest.raises(ToolError, match=f"config.json says {key} {value}"):
        launch_deployment(LaunchDeploymentInput(plan=plan))
    assert not [w for w in inspect(EXAMPLES / "tiny-add-bf16").warnings if w.startswith("config.json says")]
