"""validate_run and extract_scores on results trees laid out as NEL writes them (tests/results_factory.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from results_factory import binary_samples, make_invocation, make_task

from quanteval import ledger
from quanteval.models import ToolError
from quanteval.workflow.results import ExtractScoresInput, ValidateRunInput, extract_scores, validate_run

GPQA_RECIPE = """---
name: gpqa
nel_task: ns_gpqa
harness: nemo_skills
run_time: short
metric: symbolic_correct
score: accuracy
scale: fraction
env_vars: [HF_TOKEN]
judge: false
repeats: 1
---
## Task Details
GPQA diamond.
## Params
None.
## YAML
```yaml
- name: ns_gpqa
```
## Score Extraction
results.tasks.ns_gpqa.metrics.symbolic_correct.scores.accuracy
"""


@pytest.fixture(autouse=True)
def recipes(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Our own recipe directory, so these tests do not depend on the shipped recipes' contents."""
    directory = tmp_path_factory.mktemp("recipes")
    (directory / "gpqa.md").write_text(GPQA_RECIPE)
    monkeypatch.setenv("QUANTEVAL_RECIPES_DIR", str(directory))
    return directory


def validate(run: Path | str, **kwargs) -> object:
    return validate_run(ValidateRunInput(run=str(run), **kwargs))


def checks(report, severity: str) -> set[str]:
    return {finding.check for task in report.tasks for finding in task.findings if finding.severity == severity}


def test_complete_run_passes(tmp_path: Path) -> None:
    run = make_invocation(tmp_path)
    make_task(run, "ns_gpqa")
    make_task(run, "ns_aime2025", limit_samples=30, count=30)
    report = validate(run)
    assert report.verdict == "pass", report.reasons
    assert report.reasons == []
    gpqa = next(task for task in report.tasks if task.task == "ns_gpqa")
    assert gpqa.finished is True
    assert (gpqa.expected_samples, gpqa.evaluated_samples, gpqa.responses) == (100, 100, 100)
    assert gpqa.error_share == 0.0 and gpqa.truncated_share == 0.0


def test_a_single_task_directory_is_a_run_too(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path))
    report = validate(task_dir)
    assert report.verdict == "pass"
    assert [task.task_dir for task in report.tasks] == [str(task_dir)]


def test_partial_run_without_results_fails(tmp_path: Path) -> None:
    run = make_invocation(tmp_path)
    make_task(run, "ns_gpqa")
    make_task(run, "ns_aime2025", write_results=False, write_metrics=False, exit_code=None)
    report = validate(run)
    assert report.verdict == "fail"
    aime = next(task for task in report.tasks if task.task == "ns_aime2025")
    assert aime.finished is False
    assert any("results.yml: missing" in reason for reason in report.reasons)


def test_nonzero_exit_fails_with_the_stage_file_as_evidence(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path), exit_code=3)
    report = validate(task_dir)
    assert report.verdict == "fail"
    finding = next(f for f in report.tasks[0].findings if f.check == "finished")
    assert finding.evidence[0].file == str(task_dir / "logs" / "stage.exit")
    assert "exited with code 3" in finding.message


def test_failed_samples_and_http_errors_fail(tmp_path: Path) -> None:
    # 100 requested, 90 scored; 10 of 100 responses were HTTP 500: 10/100 = 10% > 1% allowed.
    task_dir = make_task(make_invocation(tmp_path), count=90, status_codes={"200": 90, "500": 10},
                         extra={"failed_samples_policy": "skip"})
    report = validate(task_dir)
    task = report.tasks[0]
    assert report.verdict == "fail"
    assert task.error_share == pytest.approx(0.10)
    assert (task.expected_samples, task.evaluated_samples) == (100, 90)
    assert checks(report, "fail") == {"samples", "http_errors"}
    samples = next(f for f in task.findings if f.check == "samples")
    assert "10 dropped or failed; failed_samples_policy=skip" in samples.message


def test_a_few_retried_http_errors_under_the_limit_only_warn(tmp_path: Path) -> None:
    # 1 error in 200 responses = 0.5% <= 1%: a warning, the samples were all scored after retries.
    task_dir = make_task(make_invocation(tmp_path), status_codes={"200": 199, "429": 1})
    report = validate(task_dir)
    assert report.verdict == "pass"
    assert report.tasks[0].error_share == pytest.approx(0.005)
    assert checks(report, "warning") == {"http_errors"}


SLURM_TIMEOUT = "srun: starting\nslurmstepd: error: *** JOB 4242 ON node01 CANCELLED AT 2026-11-21T12:00:00 DUE TO TIME LIMIT ***\n"
SLURM_RESUME = "previous SLURM_JOB_ID 4242 finished with 'TIMEOUT' state. RESUMING...\nEvaluation finished\n"


def test_timeout_then_resume_is_not_a_failure(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path), exit_code=None,
                         logs={"slurm-4242.log": SLURM_TIMEOUT, "slurm-4243.log": SLURM_RESUME})
    report = validate(task_dir)
    assert report.verdict == "pass", report.reasons
    assert report.tasks[0].resumed_after_timeout is True
    info = next(f for f in report.tasks[0].findings if f.check == "finished")
    assert info.severity == "info"
    assert (info.evidence[0].file, info.evidence[0].line) == (str(task_dir / "logs" / "slurm-4242.log"), 2)


def test_timeout_without_resume_fails_and_points_to_resume_run(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path), exit_code=None, write_results=False,
                         logs={"slurm-4242.log": SLURM_TIMEOUT})
    report = validate(task_dir)
    assert report.verdict == "fail"
    assert report.tasks[0].finished is False
    assert "resume_run" in report.reasons[0]


def test_truncation_over_the_limit_fails(tmp_path: Path) -> None:
    # 3 of 100 cut by the token limit = 3% > 2%.
    task_dir = make_task(make_invocation(tmp_path), finish_reason={"stop": 97, "length": 3})
    report = validate(task_dir)
    assert report.verdict == "fail"
    assert report.tasks[0].truncated_share == pytest.approx(0.03)
    assert "raise max_new_tokens" in report.reasons[0]


def test_truncation_under_the_limit_warns(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path), finish_reason={"stop": 99, "length": 1})
    report = validate(task_dir)
    assert report.verdict == "pass"
    assert checks(report, "warning") == {"truncation"}


def test_missing_metrics_file_is_inconclusive(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path), write_metrics=False)
    report = validate(task_dir)
    assert report.verdict == "inconclusive"
    assert checks(report, "unknown") == {"responses"}
    assert "eval_factory_metrics.json: no response_stats" in report.reasons[0]


def test_missing_run_config_makes_sample_accounting_unknown(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path), write_run_config=False)
    report = validate(task_dir)
    assert report.verdict == "inconclusive"
    assert checks(report, "unknown") == {"samples"}


def test_leaked_reasoning_fails(tmp_path: Path) -> None:
    samples = binary_samples([1, 0, 1])
    samples[1]["generation"] = "<think>hmm, maybe C</think> The answer is C."
    task_dir = make_task(make_invocation(tmp_path), count=3, limit_samples=3, samples=samples,
                         reasoning={"total_responses": 3, "reasoning_unfinished_count": 0})
    report = validate(task_dir)
    assert report.verdict == "fail"
    assert report.tasks[0].leaked_reasoning == 1


def test_judge_and_sandbox_failures_are_found_with_their_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_API_KEY", "sk-judge-0123456789")
    log = ("step 1\nstep 2\nERROR judge request failed: 401 Unauthorized (key sk-judge-0123456789)\nstep 4\n"
           "Sandbox execution timed out after 30s\n")
    task_dir = make_task(make_invocation(tmp_path), logs={"client-1001.log": log})
    report = validate(task_dir)
    assert "sk-judge-0123456789" not in report.model_dump_json()  # the value never leaves; its name may
    assert "(key <JUDGE_API_KEY>)" in report.model_dump_json()
    assert report.verdict == "fail"
    by_check = {f.check: f for f in report.tasks[0].findings}
    assert (by_check["judge_failure"].evidence[0].line, by_check["sandbox_failure"].evidence[0].line) == (3, 5)
    assert by_check["judge_failure"].evidence[0].file == str(task_dir / "logs" / "client-1001.log")


def test_validate_run_evidence_masks_secrets_by_shape(tmp_path: Path) -> None:
    """A judge's failure line can carry the request's headers: the evidence quotes the line, not the key."""
    bearer = "nvapi-PLANTEDjudgeKey0123456789"
    log = f"ERROR judge request failed: 401 for POST /v1/chat (Authorization: Bearer {bearer})\n"
    task_dir = make_task(make_invocation(tmp_path), logs={"client-1002.log": log})
    report = validate(task_dir)
    assert bearer not in report.model_dump_json()
    judge = next(f for f in report.tasks[0].findings if f.check == "judge_failure")
    assert judge.evidence[0].text.endswith("(Authorization: Bearer ***)") and judge.evidence[0].line == 1


SGLANG_LOG = "[2026-11-21 10:00:01] server_args=ServerArgs(model_path='/models/llama-fp8', quantization='modelopt_fp8', tp_size=1)\n"


def test_the_checkpoint_the_server_loaded_is_reported_and_checked(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path), logs={"server-0-5001-0.log": SGLANG_LOG})
    assert validate(task_dir).tasks[0].loaded_checkpoint == "/models/llama-fp8"
    assert validate(task_dir, expected_checkpoint="/models/llama-fp8/").verdict == "pass"
    wrong = validate(task_dir, expected_checkpoint="/models/llama-bf16")
    assert wrong.verdict == "fail"
    assert "loaded /models/llama-fp8, not /models/llama-bf16" in wrong.reasons[0]


def test_repeats_multiply_the_expected_samples(tmp_path: Path) -> None:
    # limit 50 prompts x n_samples 4 = 200 expected; 200 scored.
    task_dir = make_task(make_invocation(tmp_path), limit_samples=50, count=200, extra={"n_samples": 4})
    task = validate(task_dir).tasks[0]
    assert (task.expected_samples, task.evaluated_samples) == (200, 200)
    assert validate(task_dir).verdict == "pass"


def test_dataset_size_comes_from_nel_when_there_is_no_limit(tmp_path: Path) -> None:
    # NEL knows simple_evals/gpqa_diamond has 198 questions; 190 scored means 8 were dropped.
    task_dir = make_task(make_invocation(tmp_path), "gpqa_diamond", harness="simple_evals", limit_samples=None, count=190)
    report = validate(task_dir)
    assert report.tasks[0].expected_samples == 198
    assert report.verdict == "fail"
    assert "8 dropped" in report.reasons[0]


def test_an_invocation_id_is_found_through_the_ledger(tmp_path: Path) -> None:
    run = make_invocation(tmp_path, invocation="feedbeef")
    make_task(run)
    ledger.add("full_run", status="finished", invocation_id="feedbeef", executor="local", details={"output_dir": str(run)})
    report = validate("feedbeef")
    assert report.run == "feedbeef"
    assert report.verdict == "pass"


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ("/nonexistent/run/dir", "no such directory"),
        ("no-such-invocation", "neither the ledger nor NEL's records know this id"),
        ("", "run: empty"),
    ],
)
def test_bad_run_references_are_clear_errors(run: str, message: str) -> None:
    with pytest.raises(ToolError, match=message):
        validate(run)


def test_a_directory_without_task_dirs_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    with pytest.raises(ToolError, match="no NEL task directories"):
        validate(tmp_path)


def test_extract_scores_uses_the_recipe(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path), value=0.62, stderr=0.048, count=198,
                         extra_scores={"num_tokens": {"avg": 812.0}})
    [task] = extract_scores(ExtractScoresInput(run=str(task_dir))).tasks
    assert task.recipe == "gpqa"
    assert task.headline is not None
    assert (task.headline.value, task.headline.stderr, task.headline.count) == (0.62, 0.048, 198)
    assert (task.headline.scale, task.headline.scale_from) == ("fraction", "recipe")
    assert task.headline.path == "results.tasks.ns_gpqa.metrics.symbolic_correct.scores.accuracy"
    assert len(task.scores) == 2
    tokens = next(score for score in task.scores if score.metric == "num_tokens")
    assert (tokens.scale, tokens.scale_from) == ("unknown", "inferred")  # 812 is neither a fraction nor a percent


def test_extract_scores_without_recipe_lists_every_metric_and_infers_scale(tmp_path: Path) -> None:
    groups = {"stem": {"metrics": {"acc": {"scores": {"acc": {"value": 71.5, "stats": {"count": 5, "stddev": 0.4}}}}}}}
    task_dir = make_task(make_invocation(tmp_path), "mmlu_pro", metric="acc", score="acc", value=0.455, stderr=None,
                         groups=groups, extra_scores={"acc_norm": {"acc_norm": 0.47}})
    [task] = extract_scores(ExtractScoresInput(run=str(task_dir))).tasks
    assert task.recipe is None and task.headline is None  # three scores and no recipe to choose one
    by_path = {score.path: score for score in task.scores}
    group = by_path["results.groups.stem.metrics.acc.scores.acc"]
    assert (group.scale, group.scale_from) == ("percent", "inferred")
    # population stddev 0.4 over 5 values: stderr = 0.4 / sqrt(5 - 1) = 0.2
    assert group.stderr == pytest.approx(0.2)
    assert by_path["results.tasks.mmlu_pro.metrics.acc.scores.acc"].scale == "fraction"


def test_extract_scores_reports_a_missing_results_file(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path), write_results=False)
    [task] = extract_scores(ExtractScoresInput(run=str(task_dir))).tasks
    assert task.headline is None
    assert task.problem == f"{task_dir / 'artifacts' / 'results.yml'}: missing"


def test_cli_validate_run_prints_the_verdict_as_json(tmp_path: Path, cli_env: dict[str, str]) -> None:
    task_dir = make_task(make_invocation(tmp_path), finish_reason={"stop": 90, "length": 10})
    done = subprocess.run(["quanteval", "call", "validate_run", "--json", json.dumps({"run": str(task_dir)})],
                          capture_output=True, text=True, env=cli_env, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "fail"
    assert math.isclose(result["tasks"][0]["truncated_share"], 0.10)


def test_a_run_on_the_cluster_validates_like_a_local_one(slurm_cluster, tmp_path: Path) -> None:
    """host:path over real SSH: small artifacts are copied, logs are grepped on the host and cited there."""
    remote_output = slurm_cluster.workdir / "results"
    run = make_invocation(remote_output, invocation="0badcafe")
    make_task(run, "ns_gpqa", exit_code=None, logs={"slurm-4242.log": SLURM_TIMEOUT, "slurm-4243.log": SLURM_RESUME,
                                                    "server-0-4243-0.log": SGLANG_LOG})
    make_task(run, "ns_aime2025", limit_samples=30, count=30, finish_reason={"stop": 27, "length": 3})
    report = validate(f"{slurm_cluster.ssh_alias}:{run}", expected_checkpoint="/models/llama-fp8")
    gpqa, aime = sorted(report.tasks, key=lambda task: task.task != "ns_gpqa")
    assert gpqa.resumed_after_timeout and gpqa.loaded_checkpoint == "/models/llama-fp8"
    timeout = next(f for f in gpqa.findings if f.check == "finished").evidence[0]
    assert (timeout.file, timeout.line) == (f"{slurm_cluster.ssh_alias}:{run}/ns_gpqa.0/logs/slurm-4242.log", 2)
    assert aime.truncated_share == pytest.approx(0.10)  # 3 of 30
    assert report.verdict == "fail"
    assert report.tasks[0].task_dir.startswith(f"{slurm_cluster.ssh_alias}:{run}/")
    scores = extract_scores(ExtractScoresInput(run=f"{slurm_cluster.ssh_alias}:{run}/ns_gpqa.0")).tasks[0]
    assert scores.headline is not None and scores.headline.value == 0.5


def test_an_invocation_id_is_found_through_nels_own_records(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """A run launched with `nel` directly: NEL's execution DB (its own file, written by NEL's own code) says where."""
    run = make_invocation(tmp_path / "out", invocation="0123456789abcdef")
    task_dir = make_task(run)
    env = {**cli_env, "NEMO_EVALUATOR_EXEC_DB_FILE": str(tmp_path / "exec-db" / "exec.v1.jsonl")}
    record = (
        "from nemo_evaluator_launcher.common.execdb import ExecutionDB, JobData;"
        f"ExecutionDB().write_job(JobData(invocation_id='0123456789abcdef', job_id='0123456789abcdef.0', timestamp=0.0,"
        f" executor='local', data={{'output_dir': {str(task_dir)!r}}}))"
    )
    subprocess.run([sys.executable, "-c", record], env=env, check=True, timeout=60)
    done = subprocess.run(["quanteval", "call", "validate_run", "--json", json.dumps({"run": "0123456789abcdef"})],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["verdict"] == "pass"
    assert [task["task_dir"] for task in result["tasks"]] == [str(task_dir)]


def test_a_recipe_naming_a_missing_score_warns_and_lists_what_is_there(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path), metric="pass@1", score="symbolic_correct")  # recipe wants symbolic_correct.accuracy
    report = validate(task_dir)
    assert report.verdict == "pass"
    warning = next(f for f in report.tasks[0].findings if f.check == "score")
    assert "recipe gpqa names metric symbolic_correct, score accuracy" in warning.message
    [task] = extract_scores(ExtractScoresInput(run=str(task_dir))).tasks
    assert task.headline is None and [s.path for s in task.scores] == ["results.tasks.ns_gpqa.metrics.pass@1.scores.symbolic_correct"]
    assert task.scores[0].scale_from == "inferred"  # the recipe vouches only for the score it names


def test_an_output_dir_with_one_invocation_is_enough_and_with_several_asks_which(tmp_path: Path) -> None:
    make_task(make_invocation(tmp_path, invocation="aaaa0001", timestamp="20261120_090000"))
    assert validate(tmp_path).verdict == "pass"
    make_task(make_invocation(tmp_path, invocation="bbbb0002", timestamp="20261121_090000"))
    with pytest.raises(ToolError, match=r"holds 2 invocations .*pass one of them, e.g. .*/20261121_090000-bbbb0002"):
        validate(tmp_path)


# --- full runs pass, NEL's mounts, failed runs say why ------------------------------------------


@pytest.fixture
def shipped_recipes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipes the package ships (recipes/tasks/*.md): they state the dataset sizes."""
    monkeypatch.delenv("QUANTEVAL_RECIPES_DIR", raising=False)


def test_a_full_gpqa_run_with_198_questions_passes(tmp_path: Path, shipped_recipes: None) -> None:
    # GPQA diamond: 198 questions, 5 repeats per the recipe; NeMo-Skills counts questions (pass@1 averaged over 5).
    task_dir = make_task(make_invocation(tmp_path), "ns_gpqa", limit_samples=None, count=198, extra={"num_repeats": 5})
    report = validate(task_dir)
    assert report.verdict == "pass", report.reasons
    task = report.tasks[0]
    assert (task.expected_samples, task.expected_samples_from) == (990, "recipe gpqa")
    short = validate(make_task(make_invocation(tmp_path / "short"), "ns_gpqa", limit_samples=None, count=190,
                               extra={"num_repeats": 5}))
    assert short.verdict == "fail" and "190 samples scored, 990 expected" in short.reasons[0]


def test_a_full_aime_run_counts_30_problems_times_repeats(tmp_path: Path, shipped_recipes: None) -> None:
    for count in (30, 480):  # per question (pass@1[avg-of-16]) or per generation (30 x 16)
        task_dir = make_task(make_invocation(tmp_path / str(count)), "ns_aime2025", limit_samples=None, count=count,
                             extra={"num_repeats": 16})
        report = validate(task_dir)
        assert report.verdict == "pass", report.reasons
        assert report.tasks[0].expected_samples == 480
    canary = make_task(make_invocation(tmp_path / "canary"), "ns_aime2025", limit_samples=10, count=10,
                       extra={"num_repeats": 1})
    assert validate(canary).tasks[0].expected_samples_from == "limit_samples"


def test_nel_counts_n_samples_once(tmp_path: Path) -> None:
    # NEL's own size table already multiplies by n_samples: 198 x 3 expected, not 198 x 3 x 3.
    task_dir = make_task(make_invocation(tmp_path), "gpqa_diamond", harness="simple_evals", limit_samples=None,
                         count=594, extra={"n_samples": 3})
    report = validate(task_dir)
    assert report.tasks[0].expected_samples == 594 and report.verdict == "pass", report.reasons


def resolved_metadata(task_dir: Path, deployment: dict, execution: dict | None = None) -> None:
    """metadata.yaml as NEL writes it: the resolved launcher config under launcher_resolved_config."""
    import yaml

    path = task_dir / "artifacts" / "metadata.yaml"
    data = yaml.safe_load(path.read_text())
    data["launcher_resolved_config"] = {"deployment": deployment, "execution": execution or {"type": "slurm"}}
    path.write_text(yaml.safe_dump(data))


SERVED_FROM_MOUNT = "[2026-11-21 10:00:01] server_args=ServerArgs(model_path='/checkpoint', tp_size=1)\n"


def test_the_served_checkpoint_is_mapped_through_nels_mount(tmp_path: Path) -> None:
    """NEL serves every checkpoint from /checkpoint: the host path behind the mount is what is compared."""
    task_dir = make_task(make_invocation(tmp_path), logs={"server-0-5001-0.log": SERVED_FROM_MOUNT})
    resolved_metadata(task_dir, {"type": "sglang", "checkpoint_path": "/lustre/models/qwen3-nvfp4"})
    right = validate(task_dir, expected_checkpoint="/lustre/models/qwen3-nvfp4/")
    assert right.verdict == "pass", right.reasons
    assert (right.tasks[0].loaded_checkpoint, right.tasks[0].served_checkpoint) == ("/checkpoint", "/lustre/models/qwen3-nvfp4")
    wrong = validate(task_dir, expected_checkpoint="/lustre/models/qwen3-bf16")
    assert wrong.verdict == "fail"
    assert "loaded /checkpoint (= /lustre/models/qwen3-nvfp4 on the host), not /lustre/models/qwen3-bf16" in wrong.reasons[0]


def test_an_extra_deployment_mount_maps_too_and_an_unknown_mount_is_inconclusive(tmp_path: Path) -> None:
    log = "INFO Starting to load model /models/llama-fp8 ...\n"
    task_dir = make_task(make_invocation(tmp_path), logs={"server-0-5001-0.log": log})
    resolved_metadata(task_dir, {"type": "vllm", "checkpoint_path": None},
                      {"type": "slurm", "mounts": {"deployment": {"/lustre/ckpts": "/models"}}})
    assert validate(task_dir, expected_checkpoint="/lustre/ckpts/llama-fp8").verdict == "pass"

    unknown = make_task(make_invocation(tmp_path / "old"), logs={"server-0-5001-0.log": SERVED_FROM_MOUNT}, deployment=None)
    report = validate(unknown, expected_checkpoint="/lustre/models/qwen3-nvfp4")
    assert report.verdict == "inconclusive" and "checkpoint" in checks(report, "unknown")


SLURM_CONTAINER_FAILURE = """+ TIMEOUT=3600
+ export 'NEMO_EVALUATOR_TIMEOUT=3600'
+ srun --mpi=pmix --container-image=nvcr.io/nvidia/eval-factory/nemo_skills:26.01 --container-mounts=/a:/b bash -c ...
srun: unrecognized option '--container-image=nvcr.io/nvidia/eval-factory/nemo_skills:26.01'
Try "srun --help" for more information
"""


def test_a_failed_run_says_it_failed_and_why(tmp_path: Path) -> None:
    """A canary that never produced artifacts: only NEL's slurm log; `+ TIMEOUT=3600` is the script, not the cause."""
    task_dir = make_invocation(tmp_path) / "ns_gpqa.0"
    (task_dir / "logs").mkdir(parents=True)
    (task_dir / "artifacts").mkdir()
    (task_dir / "logs" / "slurm-77.log").write_text(SLURM_CONTAINER_FAILURE)
    report = validate(task_dir.parent)
    assert report.verdict == "fail"
    diagnosis = report.tasks[0].diagnosis
    assert diagnosis.failure_class == "container" and "--container-image" in diagnosis.line
    assert (diagnosis.file, diagnosis.line_number) == (str(task_dir / "logs" / "slurm-77.log"), 4)
    assert any("failed" in reason and "container" in reason for reason in report.reasons)
    assert "pyxis" in diagnosis.advice


def test_a_failure_without_a_known_line_is_unclassified_with_its_last_lines(tmp_path: Path) -> None:
    task_dir = make_task(make_invocation(tmp_path), write_results=False, write_metrics=False, exit_code=2,
                         logs={"client-1001.log": "+ TIMEOUT=3600\nstarting\nthe widget went sideways\n"})
    report = validate(task_dir)
    diagnosis = report.tasks[0].diagnosis
    assert diagnosis.failure_class == "unclassified" and diagnosis.line is None
    assert diagnosis.last_lines[-1] == "the widget went sideways" and "+ TIMEOUT=3600" not in diagnosis.last_lines
    assert report.verdict == "fail" and any("the widget went sideways" in reason for reason in report.reasons)
