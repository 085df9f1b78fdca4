"""A served context the tasks cannot use is an error naming the task and the context it needs (from its recipe), for
both engines; the budget warning never proposes the value the config already has. The issue's case: a 512-token
context with AIME and GPQA."""

from __future__ import annotations

from factories import make_checkpoint
from tiers import requires

from quanteval.workflow.nelconfig import (
    ApplyCheckpointInput,
    BuildConfigInput,
    SetConfigValueInput,
    apply_checkpoint,
    build_config,
    set_config_value,
)
from quanteval.workflow.tasks import AddTasksInput, add_tasks
from quanteval.workflow.validation import ValidateConfigInput, validate_config


def _problems(config: str) -> dict[tuple[str, str], object]:
    return {(p.rule, p.key): p for p in validate_config(ValidateConfigInput(config_path=config)).problems}


def test_a_512_token_context_is_an_error_for_aime_and_gpqa_naming_what_each_needs(tmp_path):
    config = build_config(BuildConfigInput(execution="local", deployment="vllm", model_type="chat_reasoning", benchmarks=["core_reasoning"],
                                           config_path=str(tmp_path / "eval.yaml"))).config_path
    add_tasks(AddTasksInput(config_path=config, tasks=["aime2025"]))
    apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(make_checkpoint(tmp_path / "short", chat_template="plain",
                                                                                              max_position_embeddings=512))))
    problems = _problems(config)
    aime = problems[("context_too_small_for_task", "evaluation.tasks[ns_aime2025]")]
    assert aime.severity == "error" and "17408" in aime.message and "512" in aime.message and "--max-model-len" in aime.fix
    gpqa = problems[("context_too_small_for_task", "evaluation.tasks[ns_gpqa]")]
    assert "6144" in gpqa.message
    budget = [p for (rule, _), p in problems.items() if rule == "budget_leaves_no_prompt_room"]
    assert budget and all("Use 384." not in p.fix for p in budget), [p.fix for p in budget]  # 384 is what apply_checkpoint wrote


def test_a_long_enough_context_with_a_short_budget_warns_that_answers_are_truncated(tmp_path):
    config = build_config(BuildConfigInput(execution="local", deployment="vllm", model_type="chat_reasoning", benchmarks=["core_reasoning"],
                                           config_path=str(tmp_path / "eval.yaml"))).config_path
    add_tasks(AddTasksInput(config_path=config, tasks=["aime2025"]))
    apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(make_checkpoint(tmp_path / "long", chat_template="plain",
                                                                                              max_position_embeddings=65536))))
    set_config_value(SetConfigValueInput(config_path=config, key="evaluation.nemo_evaluator_config.config.params.max_new_tokens", value=2048))
    problems = _problems(config)
    assert not [key for rule, key in problems if rule == "context_too_small_for_task"]
    truncated = problems[("budget_truncates_answers", "evaluation.tasks[ns_aime2025]")]
    assert truncated.severity == "warning" and "16384" in truncated.fix


@requires("nel-next", "slow")
def test_a_nel_next_skills_benchmark_is_checked_against_its_recipe_too(tmp_path):
    config = build_config(BuildConfigInput(engine="nel-next", execution="local", deployment="vllm", model_type="chat_reasoning",
                                           benchmarks=["skills://aime25"], config_path=str(tmp_path / "next.yaml"))).config_path
    apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(make_checkpoint(tmp_path / "short", chat_template="plain",
                                                                                              max_position_embeddings=512))))
    problems = _problems(config)
    aime = problems[("context_too_small_for_task", "benchmarks[0]")]
    assert "recipe aime2025" in aime.message and "17408" in aime.message


@requires("nel-next", "nemo-skills", "slow")
def test_a_skills_benchmark_nel_next_does_not_grade_is_an_error_not_a_verdict_of_zero_loss(tmp_path):
    """nel-next 0.3.0 grades NeMo-Skills' math and multichoice metrics; ifbench's 'if' falls back to exact match of the
    whole response (both runs score ~0, 'nothing lost'). The metrics type is read from NeMo-Skills' own dataset module."""
    config = build_config(BuildConfigInput(engine="nel-next", execution="local", deployment="vllm", model_type="chat_reasoning",
                                           benchmarks=["skills://ifbench", "skills://gpqa", "skills://no-such-bench"],
                                           config_path=str(tmp_path / "next.yaml"))).config_path
    apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(make_checkpoint(tmp_path / "m", chat_template="plain",
                                                                                              max_position_embeddings=32768))))
    problems = _problems(config)
    ifbench = problems[("skills_not_graded", "benchmarks[0].name")]
    assert ifbench.severity == "error" and "METRICS_TYPE 'if'" in ifbench.message and "exact match" in ifbench.message
    assert ("skills_not_graded", "benchmarks[1].name") not in problems  # gpqa: multichoice, graded by NeMo-Skills' grader
    assert "no benchmark 'no-such-bench'" in problems[("skills_unknown_benchmark", "benchmarks[2].name")].message

    # nel-next 0.3.0 hands a skills:// benchmark none of its params: an eval_type there changes nothing, and is said
    set_config_value(SetConfigValueInput(config_path=config, key="benchmarks[0].params", value={"eval_type": "math"}))
    problems = _problems(config)
    assert ("skills_not_graded", "benchmarks[0].name") in problems and ("skills_params_ignored", "benchmarks[0].params") in problems
