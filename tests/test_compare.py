"""compare_results: checklist, deltas and intervals checked by hand, verdicts, the chart and the HTML report."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from results_factory import binary_samples, make_invocation, make_task

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
