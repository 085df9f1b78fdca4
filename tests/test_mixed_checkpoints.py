"""A ModelOpt auto_quantize checkpoint nobody here made: NVFP4_AWQ for the MLPs + FP8 attention (MIXED_PRECISION), as
ModelOpt 0.47 writes it on an H100. SGLang 0.5.23 resolves it as w4afp8 (an int4 scheme) and vLLM as modelopt_mixed;
neither loads the NVFP4_AWQ layers. Every tool on the way to a canary must say so, name the layers and what would
serve them, and keep the Hopper note its NVFP4 layers call for. (SGLang's and vLLM's own per-layer dispatch confirm
the verdicts in test_frameworks.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import make_modelopt_mix

from quanteval.serving.checkpoint import InspectCheckpointInput, inspect_checkpoint
from quanteval.serving.deploy import PlanDeploymentInput, plan_deployment
from quanteval.workflow.nelconfig import ApplyCheckpointInput, BuildConfigInput, apply_checkpoint, build_config
from quanteval.workflow.validation import ValidateConfigInput, validate_config


@pytest.fixture
def mix(tmp_path: Path) -> Path:
    return make_modelopt_mix(tmp_path / "qwen-mix", attention="FP8", mlp="NVFP4_AWQ")


def test_inspect_says_no_framework_loads_the_nvfp4_awq_layers_and_never_no_flag_needed(mix):
    report = inspect_checkpoint(InspectCheckpointInput(checkpoint=str(mix)))
    assert report.quantization.layer_algos == {"FP8": 8, "NVFP4_AWQ": 6}
    assert "quantized_layers" not in report.quantization.model_dump()  # per-layer map stays out of the answer
    for framework, scheme in (("sglang", "w4afp8"), ("vllm", "modelopt_mixed")):
        notes = report.deployment_flags[framework].notes
        errors = [n for n in notes if n.startswith("error")]
        assert len(errors) == 1 and f"serves this mix as {scheme}" in errors[0], notes
        assert "6 linear layers stored as NVFP4_AWQ (e.g. model.layers.0.mlp.gate_proj)" in errors[0]
        assert "re-export those layers" in errors[0] and "NVFP4 without AWQ" in errors[0]
        assert not any("no --quantization needed" in n for n in notes)
        assert any(n.startswith("warning") and "NVFP4_AWQ layers run natively on Blackwell" in n for n in notes), notes


def test_a_mix_of_fp8_and_plain_nvfp4_still_serves_with_its_hopper_note(tmp_path):
    report = inspect_checkpoint(InspectCheckpointInput(checkpoint=str(make_modelopt_mix(tmp_path / "ok", mlp="NVFP4"))))
    for framework in ("sglang", "vllm"):
        notes = report.deployment_flags[framework].notes
        assert not [n for n in notes if n.startswith("error")], notes
        assert any("Blackwell" in n for n in notes)


def test_plan_on_h100_refuses_and_names_the_layers(mix):
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(mix), framework="sglang", gpu_type="H100", check_args=False))
    errors = [w.message for w in plan.warnings if w.level == "error"]
    assert any("NVFP4_AWQ" in e and "w4afp8" in e for e in errors), errors
    assert any(w.level == "warning" and "on H100" in w.message and "Marlin" in w.message for w in plan.warnings)


@pytest.mark.parametrize("deployment", ["sglang", "vllm"])
def test_apply_checkpoint_and_validate_config_do_not_call_it_ready(mix, tmp_path, deployment):
    config = build_config(BuildConfigInput(execution="local", deployment=deployment, model_type="chat_reasoning",
                                           benchmarks=["core_reasoning"], config_path=str(tmp_path / "eval.yaml"))).config_path
    applied = apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(mix)))
    assert any("cannot load 6 linear layers stored as NVFP4_AWQ" in n for n in applied.notes), applied.notes
    assert any("Blackwell" in n for n in applied.notes)
    result = validate_config(ValidateConfigInput(config_path=config))
    servable = [p for p in result.problems if p.rule == "checkpoint_not_servable"]
    assert not result.valid and len(servable) == 1 and servable[0].key == "deployment.checkpoint_path"
    assert "NVFP4_AWQ" in servable[0].message
