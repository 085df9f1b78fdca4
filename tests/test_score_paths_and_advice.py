"""Where scores are read and what advice is given: the aime2025 recipe's results path (NEL numbers task directories by position, so a second task
is `.1`), validate_run's response_stats advice only for a job that ran, and the NeMo-Skills api_key_name rule as an
error against a self-deployed server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from results_factory import make_invocation, make_task
from tiers import REPO

from quanteval.engines import recipes
from quanteval.workflow import tasks, validation
from quanteval.workflow.results import ExtractScoresInput, ValidateRunInput, extract_scores, validate_run
from quanteval.workflow.validation import ValidateConfigInput

ADVICE = "Keep the response_stats interceptor on"


def test_aime2025_recipe_path_is_read_where_nel_writes_a_second_task(tmp_path: Path) -> None:
    recipe = recipes.parse_recipe(recipes.recipes_dir() / "aime2025.md")
    invocation = make_invocation(tmp_path / "results", "a2025001")
    # Config order: ns_gpqa first, ns_aime2025 second -> NEL writes ns_gpqa.0 and ns_aime2025.1.
    make_task(invocation, "ns_gpqa", 0)
    make_task(invocation, "ns_aime2025", 1, metric=recipe.metric, score=recipe.score, value=73.3, stderr=2.1,
              count=480, limit_samples=None, extra={"num_repeats": 16})
    found = {Path(t.task_dir).name: t for t in extract_scores(ExtractScoresInput(run=str(invocation))).tasks}
    assert set(found) == {"ns_gpqa.0", "ns_aime2025.1"}
    aime = found["ns_aime2025.1"]
    assert aime.recipe == "aime2025" and aime.headline is not None and aime.problem is None
    # The recipe's dotted score path is the one extract_scores reads, and its value is the headline.
    assert f"{aime.headline.path}.value" == recipe.score_path
    data = yaml.safe_load((invocation / "ns_aime2025.1" / "artifacts" / "results.yml").read_text())
    node = data
    for part in re.findall(r"[^.\[]+(?:\[[^\]]*\])?", recipe.score_path):  # keeps pass@1[avg-of-16] whole
        node = node[part]
    assert node == aime.headline.value == 73.3
    # The recipe's File line names the task directory by position, not a fixed `.0`.
    text = Path(recipe.path).read_text()
    [file_line] = [line for line in text.splitlines() if line.startswith("- File:")]
    template = re.search(r"`([^`]*results\.yml)`", file_line)[1]
    assert "ns_aime2025.0" not in template and "ns_aime2025.<i>" in template
    relative = template.split("<timestamp>-<invocation>/", 1)[1].replace("<i>", "1")
    assert (invocation / relative).is_file()


def test_every_recipe_file_line_names_the_task_directory_by_position() -> None:
    for recipe in tasks.list_recipes():
        text = Path(recipe.path).read_text()
        assert f"{recipe.nel_task}.<i>/artifacts/results.yml" in text, recipe.name
        assert f"{recipe.nel_task}.0/artifacts" not in text, recipe.name


def test_no_response_stats_advice_for_a_job_that_never_started(tmp_path: Path) -> None:
    invocation = make_invocation(tmp_path / "results", "a2025002")
    make_task(invocation, "ns_gpqa", 0, write_results=False, write_metrics=False, exit_code=None,
              logs={"client-1001.log": "srun: error: Unable to create step for job 1001: Invalid generic resource\n"})
    report = validate_run(ValidateRunInput(run=str(invocation)))
    assert report.verdict == "fail"
    [task] = report.tasks
    assert task.finished is False
    assert not any(ADVICE in finding.message for finding in task.findings)
    assert not any(ADVICE in reason for reason in report.reasons)


def test_response_stats_advice_stays_for_a_job_that_ran_without_the_interceptor(tmp_path: Path) -> None:
    invocation = make_invocation(tmp_path / "results", "a2025003")
    task_dir = make_task(invocation, "ns_gpqa", 0, write_results=False, write_metrics=False, exit_code=1)
    (task_dir / "artifacts" / "eval_factory_metrics.json").write_text(json.dumps({"evaluation": {"runtime_seconds": 9.0}}))
    [task] = validate_run(ValidateRunInput(run=str(invocation))).tasks
    assert task.finished is False
    assert any(ADVICE in finding.message for finding in task.findings)


def _ns_config(tmp_path: Path, deployment: str, api_key_name: str | None) -> Path:
    doc: dict = {
        "defaults": [{"execution": "local"}, {"deployment": deployment}, "_self_"],
        "execution": {"output_dir": "nel-results"},
        "evaluation": {"nemo_evaluator_config": {"config": {"params": {
            "temperature": 0.6, "top_p": 0.95, "max_new_tokens": 2048, "parallelism": 8,
            "extra": {"tokenizer": "Qwen/Qwen3-8B"}}}}, "tasks": [{"name": "ns_aime2025"}]},
        "target": {"api_endpoint": {}},
    }
    if deployment == "none":
        doc["target"]["api_endpoint"] |= {"model_id": "m", "url": "http://127.0.0.1:9/v1/chat/completions"}
    else:
        doc["deployment"] = {"image": "vllm/vllm-openai:v0.11.0", "hf_model_handle": None, "served_model_name": "tiny",
                             "checkpoint_path": str(REPO / "examples" / "checkpoints" / "llama-tiny-bf16"),
                             "tensor_parallel_size": 1, "data_parallel_size": 1, "extra_args": "--max-model-len 4096"}
    if api_key_name:
        doc["target"]["api_endpoint"]["api_key_name"] = api_key_name
    path = tmp_path / f"ns-{deployment}-{api_key_name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_nemo_skills_on_a_self_deployed_server_without_api_key_name_is_an_error(tmp_path: Path) -> None:
    result = validation.validate_config(ValidateConfigInput(config_path=str(_ns_config(tmp_path, "vllm", None)), check_env=False))
    [problem] = [p for p in result.problems if p.rule == "nemo_skills_api_key"]
    assert (problem.severity, problem.key) == ("error", "target.api_endpoint.api_key_name")
    assert "DUMMY_API_KEY" in problem.fix and not result.valid
    named = validation.validate_config(ValidateConfigInput(config_path=str(_ns_config(tmp_path, "vllm", "DUMMY_API_KEY")), check_env=False))
    assert not [p for p in named.problems if p.rule == "nemo_skills_api_key"]
    # An existing endpoint (deployment none) is not self-deployed: the rule does not apply.
    external = validation.validate_config(ValidateConfigInput(config_path=str(_ns_config(tmp_path, "none", None)), check_env=False))
    assert not [p for p in external.problems if p.rule == "nemo_skills_api_key"]
