"""The evaluation chain as one consistent model: apply_checkpoint recomputes everything it
owns, validate_config catches budget/sampling/thinking contradictions, compare_results refuses to call
differently configured runs or different model families comparable."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest
import yaml
from factories import make_checkpoint
from mcp import Client
from results_factory import DEPLOYMENT, EXAMPLES, make_invocation, make_task

from quanteval import configfile, engines
from quanteval.faces.server import build_server
from quanteval.workflow import compare, nelconfig, validation
from quanteval.workflow.compare import CompareResultsInput
from quanteval.workflow.nelconfig import ApplyCheckpointInput, BuildConfigInput
from quanteval.workflow.tasks import AddTasksInput, add_tasks
from quanteval.workflow.validation import ValidateConfigInput

NVFP4 = EXAMPLES / "qwen3-tiny-nvfp4"
PARAMS = ("evaluation", "nemo_evaluator_config", "config", "params")


@pytest.fixture(autouse=True)
def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_dummy")
    monkeypatch.setenv("USER", "tester")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def qwen3_bf16(root: Path, **generation: object) -> Path:
    """The NVFP4 example's BF16 sibling (same family), with extra generation_config.json keys."""
    path = make_checkpoint(root, chat_template="reasoning", model_type="qwen3", max_position_embeddings=40960)
    config = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps(config | generation))
    return path


def built(tmp_path: Path, name: str, execution: str = "local", deployment: str = "sglang") -> Path:
    result = nelconfig.build_config(BuildConfigInput(execution=execution, deployment=deployment, model_type="chat_reasoning",
                                                     benchmarks=["core_reasoning"], config_path=str(tmp_path / name)))
    return Path(result.config_path)


def apply(config: Path, checkpoint: Path | str, **extra: object) -> nelconfig.ApplyCheckpointOutput:
    return nelconfig.apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint=str(checkpoint), **extra))


def at(config: Path, *keys: str) -> object:
    node: object = yaml.safe_load(config.read_text())
    for key in keys:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def problems(config: Path) -> list[tuple[str, str, str]]:
    result = validation.validate_config(ValidateConfigInput(config_path=str(config)))
    return [(p.severity, p.rule, p.key) for p in result.problems]


# --- item 1: token budget vs context -----------------------------------------------------------


def test_apply_checkpoint_sets_a_budget_that_fits_the_serving_context(tmp_path: Path) -> None:
    config = built(tmp_path, "q.yaml")
    assert at(config, *PARAMS, "max_new_tokens") == 131072  # NEL's template: above every context here
    result = apply(config, NVFP4)
    assert "--context-length 40960" in str(at(config, "deployment", "extra_args"))
    assert at(config, *PARAMS, "max_new_tokens") == 32768  # 8192 tokens left for the prompt
    assert any("131072 -> 32768 (131072 is not below the serving context 40960: every request would be refused" in change
               for change in result.changes)  # the reason is the change's own
    assert not [p for p in problems(config) if p[1].startswith("budget")]


def test_a_task_budget_above_the_context_is_lowered_and_an_ns_override_is_flagged(tmp_path: Path) -> None:
    config = built(tmp_path, "q.yaml")
    engines.edit_config(config, lambda doc: configfile.set_path(doc, "evaluation.tasks[ns_gpqa].nemo_evaluator_config.config.params.max_new_tokens", 65536))
    apply(config, NVFP4)
    gpqa = next(task for task in at(config, "evaluation", "tasks") if task["name"] == "ns_gpqa")
    assert gpqa["nemo_evaluator_config"]["config"]["params"]["max_new_tokens"] == 32768
    args_key = "evaluation.tasks[ns_gpqa].nemo_evaluator_config.config.params.extra.args"
    engines.edit_config(config, lambda doc: configfile.set_path(doc, args_key, "++prompt_config=eval/aai/mcq-4choices ++inference.tokens_to_generate=50000"))
    assert ("error", "budget_exceeds_context", args_key) in problems(config)


def test_a_smaller_context_flag_is_what_the_budget_must_fit(tmp_path: Path) -> None:
    config = built(tmp_path, "q.yaml")
    apply(config, NVFP4)
    engines.edit_config(config, lambda doc: configfile.set_path(doc, "deployment.extra_args", "--context-length 16384 --reasoning-parser qwen3"))
    found = [p for p in validation.validate_config(ValidateConfigInput(config_path=str(config))).problems if p.rule == "budget_exceeds_context"]
    assert [p.key for p in found] == ["evaluation.nemo_evaluator_config.config.params.max_new_tokens"]
    assert "--context-length" in found[0].message and "12288" in found[0].fix


# --- item 2: sampling ---------------------------------------------------------------------------


def test_checkpoint_sampling_replaces_template_values_and_says_so(tmp_path: Path) -> None:
    checkpoint = qwen3_bf16(tmp_path / "qwen3-bf16", top_k=20)
    config = built(tmp_path, "q.yaml")
    result = apply(config, checkpoint)
    assert at(config, *PARAMS, "temperature") == 0.6 and at(config, *PARAMS, "top_p") == 0.95
    adapter = at(config, "evaluation", "nemo_evaluator_config", "target", "api_endpoint", "adapter_config")
    assert adapter["params_to_add"] == {"chat_template_kwargs": {"enable_thinking": True}, "top_k": 20}
    assert [note for note in result.notes if "generation_config.json" in note] == [
        "Sampling from the checkpoint's generation_config.json (NEL's template values replaced): temperature 0.6, "
        "top_k 20 (sent by the payload modifier: NEL has no top_k param)."
    ]
    assert not [p for p in problems(config) if p[1] == "sampling_differs_from_checkpoint"]


def test_a_users_sampling_is_kept_noted_and_warned_about(tmp_path: Path) -> None:
    config = built(tmp_path, "q.yaml")
    engines.edit_config(config, lambda doc: configfile.set_path(doc, "evaluation.nemo_evaluator_config.config.params.temperature", 0.2))
    result = apply(config, NVFP4)
    assert at(config, *PARAMS, "temperature") == 0.2
    assert any("Kept evaluation.nemo_evaluator_config.config.params.temperature = 0.2" in note and "0.6" in note for note in result.notes)
    assert ("warning", "sampling_differs_from_checkpoint", "evaluation.nemo_evaluator_config.config.params.temperature") in problems(config)


# --- item 3: re-applying leaves nothing stale ---------------------------------------------------


def test_baseline_config_from_a_copy_equals_one_built_for_the_baseline(tmp_path: Path) -> None:
    """The documented way to make the baseline config: copy the quantized one, apply the baseline checkpoint."""
    baseline = qwen3_bf16(tmp_path / "qwen3-bf16", top_k=20)
    quantized = built(tmp_path, "quantized.yaml", execution="slurm")
    # IFEval reads the evaluation tokenizer: the checkpoint is mounted into its container, and the mount must follow
    add_tasks(AddTasksInput(config_path=str(quantized), tasks=["lm-evaluation-harness.ifeval"]))
    apply(quantized, NVFP4, cluster_checkpoint_path="/lustre/models/qwen3-nvfp4")
    copy = tmp_path / "baseline-from-copy.yaml"
    shutil.copy(quantized, copy)
    result = apply(copy, baseline, cluster_checkpoint_path="/lustre/models/qwen3-bf16")
    fresh = built(tmp_path, "baseline-fresh.yaml", execution="slurm")
    add_tasks(AddTasksInput(config_path=str(fresh), tasks=["lm-evaluation-harness.ifeval"]))
    apply(fresh, baseline, cluster_checkpoint_path="/lustre/models/qwen3-bf16")
    assert yaml.safe_load(copy.read_text()) == yaml.safe_load(fresh.read_text())
    assert at(copy, "execution", "mounts", "evaluation") == {"/lustre/models/qwen3-bf16": "/checkpoint"}  # the old mount is gone
    assert ("deployment.checkpoint_path: '/lustre/models/qwen3-nvfp4' -> '/lustre/models/qwen3-bf16' (the checkpoint the "
            "server loads)") in result.changes
    assert ("execution.mounts.evaluation: removed /lustre/models/qwen3-nvfp4 -> /checkpoint (another checkpoint's mount at "
            "the same place)") in result.changes


def test_switching_to_a_model_without_thinking_removes_every_qwen3_setting(tmp_path: Path) -> None:
    config = built(tmp_path, "q.yaml")
    apply(config, NVFP4)
    assert "--kv-cache-dtype fp8_e4m3" in str(at(config, "deployment", "extra_args"))  # the NVFP4 example's FP8 KV cache
    result = apply(config, EXAMPLES / "llama-tiny-bf16")
    doc = yaml.safe_load(config.read_text())
    # no --reasoning-parser, no --kv-cache-dtype (a BF16 KV cache), the new context
    assert doc["deployment"]["extra_args"] == "--context-length 4096"
    assert doc["deployment"]["served_model_name"] == "llama-tiny-bf16"
    assert "params_to_add" not in doc["evaluation"]["nemo_evaluator_config"]["target"]["api_endpoint"]["adapter_config"]
    assert at(config, *PARAMS, "max_new_tokens") == 3072  # the previous checkpoint's budget was ours: recomputed
    assert any("enable_thinking: removed" in change for change in result.changes)
    # (the 4096-token Llama is too short for the bundle's tasks: context_too_small_for_task, test_task_context's business)
    assert not [p for p in problems(config) if (p[0] == "error" and p[1] != "context_too_small_for_task")
                or p[1] in ("thinking_without_toggle", "sampling_differs_from_checkpoint")]
    again = apply(config, EXAMPLES / "llama-tiny-bf16")
    assert again.changes == [] and again.diff == ""


def test_a_stale_thinking_toggle_is_flagged(tmp_path: Path) -> None:
    config = built(tmp_path, "q.yaml")
    apply(config, NVFP4)
    engines.edit_config(config, lambda doc: configfile.set_path(doc, "deployment.checkpoint_path", str(EXAMPLES / "llama-tiny-bf16")))
    found = problems(config)
    toggle = "evaluation.nemo_evaluator_config.target.api_endpoint.adapter_config.params_to_add.chat_template_kwargs.enable_thinking"
    assert ("warning", "thinking_without_toggle", toggle) in found
    assert ("error", "context_too_long", "deployment.extra_args") in found  # the Qwen3 context is left too


# --- items 4, 5: comparability ------------------------------------------------------------------


def pair(tmp_path: Path, base: dict, cand: dict, task: str = "ns_gpqa") -> tuple[Path, Path]:
    base_dir, cand_dir = tmp_path / "baseline", tmp_path / "candidate"
    make_task(make_invocation(base_dir, "b0000001"), task, **({"value": 0.60, "stderr": 0.01} | base))
    make_task(make_invocation(cand_dir, "c0000001"), task, **({"value": 0.58, "stderr": 0.01} | cand))
    return base_dir, cand_dir


def compared(tmp_path: Path, base_dir: Path, cand_dir: Path, **extra: object) -> compare.CompareResultsOutput:
    return compare.compare_results(CompareResultsInput(baseline=str(base_dir), candidate=str(cand_dir), max_drop=5,
                                                       output_dir=str(tmp_path / "report"), **extra))


def test_identical_settings_are_comparable_with_the_right_delta(tmp_path: Path) -> None:
    fp8 = DEPLOYMENT | {"checkpoint_path": str(EXAMPLES / "llama-tiny-fp8")}  # same family, another precision
    result = compared(tmp_path, *pair(tmp_path, {}, {"deployment": fp8}))
    assert result.comparability == "comparable", result.reasons
    row = result.comparisons[0]
    assert row.delta == pytest.approx(-0.02) and row.delta_stderr == pytest.approx(0.01 * 2**0.5)
    assert result.acceptability == "acceptable"
    assert {item.item: item.status for item in result.checklist} == dict.fromkeys(compare.CHECK_ITEMS, "same")


PS = "ns_gpqa"
ONE_DIFFERENCE = {
    "prompt config": (
        {"extra": {"args": "++prompt_config=eval/aai/mcq-4choices"}}, {"extra": {"args": "++prompt_config=eval/aai/mcq-4choices-boxed"}}, "extra_args",
    ),
    "other extra.args": ({"extra": {"args": "++prompt_config=x"}}, {"extra": {"args": "++prompt_config=x ++inference.random_seed=2"}}, "extra_args"),
    "system prompt": ({"extra": {"system_message": "Be brief."}}, {}, "prompts"),
    "system prompt interceptor": ({"interceptors": [{"name": "system_message", "config": {"system_message": "/think"}}]}, {}, "prompts"),
    "thinking via payload_modifier": (
        {"interceptors": [{"name": "payload_modifier", "config": {"params_to_add": {"chat_template_kwargs": {"enable_thinking": True}}}}]},
        {"interceptors": [{"name": "payload_modifier", "config": {"params_to_add": {"chat_template_kwargs": {"enable_thinking": False}}}}]},
        "reasoning",
    ),
    "temperature": ({"temperature": 0.6}, {"temperature": 1.0}, "generation"),
    "top_k via NeMo-Skills args": ({"extra": {"args": "++inference.top_k=20"}}, {"extra": {"args": "++inference.top_k=-1"}}, "extra_args"),
    "repeats": ({"extra": {"num_repeats": 5}}, {"extra": {"num_repeats": 1}}, "repeats"),
    "limit_samples": ({"limit_samples": 100, "count": 100}, {"limit_samples": 50, "count": 50}, "samples"),
    "max tokens": ({"max_new_tokens": 32768}, {"max_new_tokens": 8192}, "generation"),
    "serving image": ({}, {"deployment": DEPLOYMENT | {"image": "vllm/vllm-openai:v0.12.0"}}, "serving"),
    "KV-cache quantization": ({}, {"deployment": DEPLOYMENT | {"extra_args": "--max-model-len 4096 --kv-cache-dtype fp8_e4m3"}}, "serving"),
    "served context": ({}, {"deployment": DEPLOYMENT | {"extra_args": "--max-model-len 2048"}}, "model"),
}


@pytest.mark.parametrize("difference", list(ONE_DIFFERENCE))
def test_each_single_difference_is_not_comparable_and_named(tmp_path: Path, difference: str) -> None:
    base, cand, item = ONE_DIFFERENCE[difference]
    result = compared(tmp_path, *pair(tmp_path, base, cand))
    assert result.comparability == "not comparable", result.reasons
    assert [i.item for i in result.checklist if i.status == "different"] == [item] or (
        difference == "top_k via NeMo-Skills args" and {i.item for i in result.checklist if i.status == "different"} == {"extra_args", "generation"})
    assert any(f"{item} differs" in reason for reason in result.reasons)
    assert result.acceptability == "inconclusive"


def test_a_candidate_served_with_its_own_kv_cache_is_comparable_and_the_kv_cache_is_named(tmp_path: Path) -> None:
    """apply_checkpoint serves an FP8-KV checkpoint with --kv-cache-dtype and its BF16 baseline without: that flag is
    the candidate's quantization, not a serving difference, and the reasons say part of the delta is the KV cache."""
    fp8 = DEPLOYMENT | {"checkpoint_path": str(EXAMPLES / "llama-tiny-fp8"), "extra_args": "--max-model-len 4096 --kv-cache-dtype fp8"}
    # the checkpoints as evaluate_quantization passes them (NEL 0.2.6's reader records none of its own)
    result = compared(tmp_path, *pair(tmp_path, {}, {"deployment": fp8}), baseline_checkpoint=str(EXAMPLES / "llama-tiny-bf16"),
                      candidate_checkpoint=str(EXAMPLES / "llama-tiny-fp8"))
    assert result.comparability == "comparable", result.reasons
    assert [i.item for i in result.checklist if i.status != "same"] == []
    assert "KV cache: the baseline's is 16-bit, the candidate's FP8: part of the delta is the KV cache" in " ".join(result.reasons)
    # another KV-cache dtype than the checkpoint's is a serving choice: not comparable, named as such
    other = compared(tmp_path, *pair(tmp_path / "other", {}, {"deployment": fp8 | {"extra_args": "--max-model-len 4096 --kv-cache-dtype fp8_e5m2"}}))
    assert other.comparability == "not comparable"
    assert any("serving differs [--kv-cache-dtype]" in reason for reason in other.reasons), other.reasons


def test_a_kv_cache_difference_between_the_checkpoints_is_named_only_when_there_is_one(tmp_path: Path) -> None:
    """What compare_results adds to its reasons for each pair of checkpoints (their quantization facts as inspected)."""
    from quanteval.serving.checkpoint import InspectCheckpointInput, inspect_checkpoint

    def difference(baseline: str, candidate: str) -> str | None:
        quant = [inspect_checkpoint(InspectCheckpointInput(checkpoint=str(EXAMPLES / name))).quantization
                 for name in (baseline, candidate)]
        return compare._kv_difference(*quant)

    bf16, fp8, nvfp4 = "llama-tiny-bf16", "llama-tiny-fp8", "qwen3-tiny-nvfp4"
    named = difference(bf16, fp8)
    assert named is not None and named.startswith("KV cache: the baseline's is 16-bit, the candidate's FP8:")
    assert (difference(fp8, bf16) or "").startswith("KV cache: the baseline's is FP8, the candidate's 16-bit:")
    assert difference(fp8, nvfp4) is None  # both FP8 KV (NVFP4 weights)
    assert difference(bf16, bf16) is None
    assert compare._kv_difference(None, None) is None  # a checkpoint not readable here: not guessed


def test_a_different_model_family_is_not_comparable(tmp_path: Path) -> None:
    qwen = DEPLOYMENT | {"checkpoint_path": str(NVFP4), "extra_args": "--max-model-len 40960"}
    result = compared(tmp_path, *pair(tmp_path, {}, {"deployment": qwen}))
    assert result.comparability == "not comparable"
    reason = next(r for r in result.reasons if "model differs" in r)
    assert "architecture" in reason and "model_type" in reason and "served_context" in reason


def test_an_unreadable_checkpoint_is_inconclusive_until_a_local_copy_is_given(tmp_path: Path) -> None:
    on_cluster = DEPLOYMENT | {"checkpoint_path": "/lustre/models/llama-tiny-fp8"}
    base_dir, cand_dir = pair(tmp_path, {"deployment": on_cluster}, {"deployment": on_cluster | {"checkpoint_path": "/lustre/models/llama-tiny-bf16"}})
    result = compared(tmp_path, base_dir, cand_dir)
    assert result.comparability == "inconclusive"
    assert any("baseline_checkpoint" in reason for reason in result.reasons)
    given = compared(tmp_path, base_dir, cand_dir, baseline_checkpoint=str(EXAMPLES / "llama-tiny-bf16"), candidate_checkpoint=str(EXAMPLES / "llama-tiny-fp8"))
    assert given.comparability == "comparable", given.reasons


def test_a_run_without_nels_resolved_config_is_inconclusive_on_serving(tmp_path: Path) -> None:
    result = compared(tmp_path, *pair(tmp_path, {}, {"deployment": None}))
    assert result.comparability == "inconclusive"
    assert {i.item for i in result.checklist if i.status == "unknown"} == {"model", "serving"}


def test_compare_over_mcp_takes_local_checkpoint_copies(tmp_path: Path) -> None:
    on_cluster = DEPLOYMENT | {"checkpoint_path": "/lustre/models/llama"}
    base_dir, cand_dir = pair(tmp_path, {"deployment": on_cluster}, {"deployment": on_cluster})
    arguments = {"baseline": str(base_dir), "candidate": str(cand_dir), "max_drop": 5, "output_dir": str(tmp_path / "mcp"),
                 "baseline_checkpoint": str(EXAMPLES / "llama-tiny-bf16"), "candidate_checkpoint": str(NVFP4)}

    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool("compare_results", arguments)

    result = anyio.run(go)
    assert not result.is_error
    assert result.structured_content["comparability"] == "not comparable"
    assert any("model differs" in reason for reason in result.structured_content["reasons"])
