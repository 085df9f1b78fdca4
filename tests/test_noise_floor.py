"""The serving-noise floor's rule on nel-next runs (real `nel eval run` folders, rewards set per problem): the candidate's
flips against the baseline are put next to the baseline's flips against itself on another numeric path, and a
"not acceptable" that rests only on benchmarks within that noise is no verdict against the quantization.
The whole chain with the real vLLM (both numeric paths served) is in tests/test_evaluate_real.py."""

from __future__ import annotations

from next_runs import make_run
from tiers import requires

from quanteval.workflow.compare import CompareResultsInput, compare_results
from quanteval.workflow.noise import noise_floor, verdict_within_noise

pytestmark = requires("nel-next")
N = 40


def rewards(wrong: set[int]) -> list[float]:
    return [0.0 if index in wrong else 1.0 for index in range(N)]


def rows(real_run, tmp_path, candidate_wrong: set[int], other_path_wrong: set[int]):
    base = make_run(real_run, tmp_path / "base", {"bench": rewards(set())})
    cand = make_run(real_run, tmp_path / "cand", {"bench": rewards(candidate_wrong)})
    again = make_run(real_run, tmp_path / "again", {"bench": rewards(other_path_wrong)})
    quantization = compare_results(CompareResultsInput(baseline=str(base), candidate=str(cand), max_drop=5))
    serving = compare_results(CompareResultsInput(baseline=str(base), candidate=str(again)))
    return quantization, noise_floor(quantization.comparisons, serving.comparisons, "with --enforce-eager")


def test_a_drop_no_larger_than_the_serving_noise_is_named_and_is_no_verdict_against_the_candidate(real_run, tmp_path):
    quantization, (row,) = rows(real_run, tmp_path, candidate_wrong=set(range(8)), other_path_wrong=set(range(30, 40)))
    assert quantization.comparisons[0].verdict == "not acceptable"  # 8 of 40 lost: the CI lies below -5 points
    assert (row.quantization_flips, row.serving_flips, row.within_noise) == (8, 10, True)
    assert row.serving_delta == -0.25 and row.serving_ci_low is not None and row.serving_ci_low < -0.25 < row.serving_ci_high
    assert "differs from the baseline on 8 problems" in row.message and "on 10 when served with --enforce-eager" in row.message
    assert "cannot see a quantization effect of this size" in row.message
    verdict, why = verdict_within_noise("not acceptable", [row], {"bench"})
    assert verdict == "inconclusive" and "within serving noise" in why


def test_more_flips_but_a_net_delta_inside_the_serving_interval_is_not_said_to_exceed_the_noise(real_run, tmp_path):
    # the held-out case: a small net delta inside a wide serving interval was printed as "exceeds the serving noise"
    # because the candidate flipped more problems than serving did
    base_wrong = set(range(20, 30))
    base = make_run(real_run, tmp_path / "base", {"bench": rewards(base_wrong)})
    cand = make_run(real_run, tmp_path / "cand", {"bench": rewards(base_wrong - set(range(20, 24)) | set(range(5)))})
    again = make_run(real_run, tmp_path / "again", {"bench": rewards(base_wrong - {24} | {5, 6, 7})})
    quantization = compare_results(CompareResultsInput(baseline=str(base), candidate=str(cand), max_drop=5))
    serving = compare_results(CompareResultsInput(baseline=str(base), candidate=str(again)))
    (row,) = noise_floor(quantization.comparisons, serving.comparisons, "with --enforce-eager")
    assert (row.quantization_flips, row.serving_flips, row.within_noise) == (9, 4, False)
    assert row.delta_within_serving_interval is True
    assert "exceeds the serving noise" not in row.message
    assert "delta -2.50 points" in row.message and "inside the serving interval" in row.message


def test_a_drop_beyond_the_serving_noise_keeps_its_verdict(real_run, tmp_path):
    _, (row,) = rows(real_run, tmp_path, candidate_wrong=set(range(8)), other_path_wrong={39})
    assert (row.quantization_flips, row.serving_flips, row.within_noise) == (8, 1, False)
    assert "exceeds the serving noise" in row.message and row.delta_within_serving_interval is False
    assert verdict_within_noise("not acceptable", [row], {"bench"}) == ("not acceptable", None)
    assert verdict_within_noise("acceptable", [row], set()) == ("acceptable", None)
