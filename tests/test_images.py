"""Unpinned images (what `latest` means changes under a run): `latest` or no tag is a validate_config warning, and two runs served from the
same unpinned image are not provably the same serving in compare_results' checklist."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from results_factory import DEPLOYMENT, make_invocation, make_task
from tiers import REPO

from quanteval.engines.base import unpinned_image
from quanteval.workflow import validation
from quanteval.workflow.compare import CompareResultsInput, compare_results
from quanteval.workflow.validation import ValidateConfigInput

CHECKPOINT = REPO / "examples" / "checkpoints" / "llama-tiny-bf16"


@pytest.mark.parametrize("image,unpinned", [
    ("lmsysorg/sglang:latest", True),
    ("lmsysorg/sglang", True),                       # no tag: Docker pulls latest
    ("registry.local:5000/team/sglang", True),       # the port is not a tag
    ("registry.local:5000/team/sglang:v0.5.6", False),
    ("nvcr.io#nvidia/eval-factory/nemo_skills:latest", True),  # enroot spelling
    ("lmsysorg/sglang@sha256:" + "a" * 64, False),
    ("lmsysorg/sglang:latest@sha256:" + "b" * 64, False),  # the digest pins it whatever the tag says
    ("/lustre/images/sglang.sqsh", False),
    ("???", False),
    ("${oc.env:SGLANG_IMAGE}", False),
])
def test_unpinned_image(image: str, unpinned: bool) -> None:
    assert unpinned_image(image) is unpinned


def _config(tmp_path: Path, image: str | None, container: str | None) -> Path:
    """An SGLang-on-SLURM config with one NeMo-Skills task, serving image and task container as given."""
    deployment = {"checkpoint_path": str(CHECKPOINT), "hf_model_handle": None, "served_model_name": "llama-tiny",
                  "tensor_parallel_size": 1, "data_parallel_size": 1, "extra_args": "--context-length 4096"}
    if image is not None:
        deployment["image"] = image
    task: dict = {"name": "ns_gpqa"}
    if container is not None:
        task["container"] = container
    doc = {
        "defaults": [{"execution": "slurm/default"}, {"deployment": "sglang"}, "_self_"],
        "execution": {"hostname": "login.example", "username": "tester", "account": "acct",
                      "output_dir": "/lustre/tester/nel-results", "gres": "gpu:8"},
        "deployment": deployment,
        "target": {"api_endpoint": {"api_key_name": "DUMMY_API_KEY"}},
        "evaluation": {"nemo_evaluator_config": {"config": {"params": {
            "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 2048, "parallelism": 8,
            "extra": {"tokenizer": "Qwen/Qwen3-8B"}}}}, "tasks": [task]},
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _image_problems(config: Path) -> list[tuple[str, str, str]]:
    result = validation.validate_config(ValidateConfigInput(config_path=str(config), check_env=False))
    return [(p.severity, p.rule, p.key) for p in result.problems if p.rule == "unpinned_image"]


def test_latest_serving_image_and_untagged_task_container_are_warnings(tmp_path: Path) -> None:
    config = _config(tmp_path, "lmsysorg/sglang:latest", "nvcr.io/nvidia/eval-factory/nemo_skills")
    problems = _image_problems(config)
    assert ("warning", "unpinned_image", "deployment.image") in problems
    assert [key for _, _, key in problems if key != "deployment.image"] == ["evaluation.tasks[ns_gpqa].container"]
    result = validation.validate_config(ValidateConfigInput(config_path=str(config), check_env=False))
    fix = next(p.fix for p in result.problems if p.key == "deployment.image")
    assert "lmsysorg/sglang:<version>" in fix and "@sha256:" in fix
    # a warning, not an error (the 4096-token tiny model is too short for GPQA itself: test_task_context's business)
    assert not [p for p in result.problems if p.severity == "error" and p.rule != "context_too_small_for_task"]


def test_pinned_images_pass(tmp_path: Path) -> None:
    assert _image_problems(_config(tmp_path, "lmsysorg/sglang:v0.5.6", "nvcr.io/nvidia/eval-factory/nemo_skills:26.01")) == []
    assert _image_problems(_config(tmp_path, "lmsysorg/sglang@sha256:" + "c" * 64, None)) == []


def _serving_item(result):
    return next(item for item in result.checklist if item.item == "serving")


def test_two_runs_on_the_same_latest_image_are_not_provably_the_same_serving(tmp_path: Path) -> None:
    base = make_invocation(tmp_path / "bf16", "b0000002")
    cand = make_invocation(tmp_path / "fp8", "c0000002")
    latest = DEPLOYMENT | {"type": "sglang", "image": "lmsysorg/sglang:latest", "extra_args": "--context-length 4096"}
    make_task(base, value=0.80, stderr=0.02, deployment=latest)
    make_task(cand, value=0.79, stderr=0.02, deployment=latest)
    result = compare_results(CompareResultsInput(baseline=str(base), candidate=str(cand), max_drop=10,
                                                 output_dir=str(tmp_path / "report")))
    item = _serving_item(result)
    assert item.status == "unknown"
    assert "unpinned" in item.candidate and "lmsysorg/sglang:latest" in item.candidate
    assert result.comparability == "inconclusive"
    assert any("serving could not be checked" in reason and "unpinned" in reason for reason in result.reasons)


def test_two_runs_on_the_same_pinned_image_are_the_same_serving(tmp_path: Path) -> None:
    base = make_invocation(tmp_path / "bf16", "b0000003")
    cand = make_invocation(tmp_path / "fp8", "c0000003")
    make_task(base, value=0.80, stderr=0.02)  # vllm/vllm-openai:v0.11.0
    make_task(cand, value=0.79, stderr=0.02)
    result = compare_results(CompareResultsInput(baseline=str(base), candidate=str(cand), max_drop=10,
                                                 output_dir=str(tmp_path / "report")))
    assert _serving_item(result).status == "same"
    assert result.comparability == "comparable"


def test_an_image_inherited_from_nels_default_is_warned_and_apply_checkpoint_pins_it(tmp_path: Path) -> None:
    """The issue's runs: no deployment.image in the config, so NEL served lmsysorg/sglang:latest (its packaged default)."""
    from quanteval.serving.frameworks import PINNED_IMAGES
    from quanteval.workflow.nelconfig import ApplyCheckpointInput, apply_checkpoint

    config = _config(tmp_path, None, "nvcr.io/nvidia/eval-factory/nemo_skills:26.01")
    problems = {key: p for p in validation.validate_config(ValidateConfigInput(config_path=str(config), check_env=False)).problems
                if p.rule == "unpinned_image" for key in [p.key]}
    assert "lmsysorg/sglang:latest" in problems["deployment.image"].message and "NEL's default" in problems["deployment.image"].message
    applied = apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint=str(CHECKPOINT)))
    assert yaml.safe_load(config.read_text())["deployment"]["image"] == PINNED_IMAGES["sglang"]
    assert any("pinned to lmsysorg/sglang:v0.5.23" in n for n in applied.notes)
    assert _image_problems(config) == []
    # a pinned image the person chose stays
    mine = _config(tmp_path, "lmsysorg/sglang:v0.5.6", None)
    apply_checkpoint(ApplyCheckpointInput(config_path=str(mine), checkpoint=str(CHECKPOINT)))
    assert yaml.safe_load(mine.read_text())["deployment"]["image"] == "lmsysorg/sglang:v0.5.6"


def test_nel_next_images_unpinned_are_warned_and_pinned_ones_pass(tmp_path: Path) -> None:
    """nel-next names its images elsewhere: a managed server's services.<name>.image and the SLURM job's
    cluster.eval_image. The same rule holds for both, and nel-next's own schema still accepts the config."""
    from quanteval.workflow.nelconfig import BuildConfigInput, SetConfigValueInput, build_config, set_config_value

    config = build_config(BuildConfigInput(engine="nel-next", execution="slurm", deployment="vllm", model_type="chat_reasoning",
                                           benchmarks=[str(REPO / "examples" / "benchmarks" / "tiny_add.py")],
                                           config_path=str(tmp_path / "next.yaml"))).config_path
    values = {"services.model.model": str(CHECKPOINT), "services.model.served_model_name": "llama-tiny",
              "services.model.generation.max_tokens": 64, "cluster.hostname": "login.example", "cluster.account": "acct",
              "cluster.node_pools.default.partition": "batch", "output.dir": "/lustre/tester/runs",
              "services.model.image": "vllm/vllm-openai", "cluster.eval_image": "nvcr.io/nvidia/nemo-evaluator:26.06"}
    for key, value in values.items():
        set_config_value(SetConfigValueInput(config_path=config, key=key, value=value))
    result = validation.validate_config(ValidateConfigInput(config_path=config, check_env=False))
    assert not [p for p in result.problems if p.rule == "nel_next_schema"], result.problems
    assert _image_problems(Path(config)) == [("warning", "unpinned_image", "services.model.image")]
    set_config_value(SetConfigValueInput(config_path=config, key="services.model.image", value="vllm/vllm-openai:v0.33.0"))
    set_config_value(SetConfigValueInput(config_path=config, key="cluster.eval_image", value="nvcr.io/nvidia/nemo-evaluator:latest"))
    assert _image_problems(Path(config)) == [("warning", "unpinned_image", "cluster.eval_image")]
