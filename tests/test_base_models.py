"""A checkpoint without a chat template (a base model, many exports) on a NEL 0.2.6 config: tasks that go to the
chat endpoint are errors naming each task; base-model tasks (completions) pass. The task's endpoint comes from NEL's
own task catalogue, as NEL picks it (the task's endpoint_type, else the first type it supports)."""

from __future__ import annotations

from pathlib import Path

from factories import make_checkpoint

from quanteval.workflow.nelconfig import ApplyCheckpointInput, BuildConfigInput, SetConfigValueInput, apply_checkpoint, build_config, set_config_value
from quanteval.workflow.validation import ValidateConfigInput, validate_config


def _config(tmp_path: Path, model_type: str, bundle: str) -> str:
    config = build_config(BuildConfigInput(execution="local", deployment="vllm", model_type=model_type, benchmarks=[bundle],
                                           config_path=str(tmp_path / f"{model_type}.yaml"))).config_path
    apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(make_checkpoint(tmp_path / "base", chat_template=None))))
    return config


def _template_errors(config: str) -> dict[str, str]:
    problems = validate_config(ValidateConfigInput(config_path=config)).problems
    return {p.key: p.fix for p in problems if p.rule == "no_chat_template" and p.severity == "error"}


def test_chat_tasks_on_a_base_checkpoint_are_errors_naming_each_task(tmp_path):
    errors = _template_errors(_config(tmp_path, "chat_reasoning", "core_reasoning"))
    assert "evaluation.tasks[ns_gpqa]" in errors and "evaluation.tasks[ns_mmlu_pro]" in errors
    assert all("supports only the chat endpoint" in fix for fix in errors.values())


def test_base_model_tasks_on_a_base_checkpoint_pass_and_a_forced_chat_endpoint_is_caught(tmp_path):
    config = _config(tmp_path, "base", "general_knowledge")
    assert _template_errors(config) == {}
    set_config_value(SetConfigValueInput(config_path=config, key="evaluation.tasks[0].endpoint_type", value="chat"))
    errors = _template_errors(config)
    assert len(errors) == 1 and "endpoint_type: completions" in next(iter(errors.values()))
