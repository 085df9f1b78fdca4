"""What an inconclusive verdict advises, checked against simulated paired outcomes, and the user's rule as they say it.

The issue's case: 200 paired problems, 4 flipped to wrong and 3 to right (7 discordant pairs, delta -0.5 points),
margin 2 points at 95%. The interval is [-3.11, +2.11] points (nel gate's Student t); the advice used to be
"7 discordant pairs can detect a ~105.8% regression ... ~19600 discordant pairs would be needed. More problems or
repeats." Now it names a number of problems, and simulating that many problems at the observed discordance decides
the margin in about the stated share of runs.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from pydantic import ValidationError

from quanteval.models import ToolError
from quanteval.workflow import paired
from quanteval.workflow.compare import CompareResultsInput
from quanteval.workflow.evaluate import EvaluateQuantizationInput
from quanteval.workflow.gate import load_policy

N, REGRESSED, IMPROVED = 200, 4, 3  # the issue's runs


def issue_values() -> tuple[dict[int, float], dict[int, float]]:
    base = {i: 1.0 if i < 150 else 0.0 for i in range(N)}
    cand = dict(base)
    for i in range(REGRESSED):
        cand[i] = 0.0
    for i in range(150, 150 + IMPROVED):
        cand[i] = 1.0
    return base, cand


def decided_share(problems: int, p_regress: float, p_improve: float, max_drop: float, runs: int = 2000) -> float:
    """Simulated paired Bernoulli outcomes: each problem regresses, improves or stays; the share of runs whose
    interval (the one every verdict uses) decides the margin either way."""
    rng = np.random.default_rng(7)
    draws = rng.random((runs, problems))
    deltas = np.where(draws < p_regress, -1.0, np.where(draws < p_regress + p_improve, 1.0, 0.0))
    decided = 0
    for row in deltas:
        low, high = paired.paired_delta_ci(row.tolist())
        verdict, _ = paired.decide(low, high, max_drop, paired.DEFAULT_CONFIDENCE)
        decided += verdict != "inconclusive"
    return decided / runs


def test_the_issues_seven_discordant_pairs_give_a_number_of_problems_not_a_105_percent_effect():
    base, cand = issue_values()
    interval = paired.paired_interval(base, cand)
    assert (interval.n, interval.discordant) == (200, 7)
    assert (round(100 * interval.low, 2), round(100 * interval.high, 2)) == (-3.11, 2.11)  # the issue's gate interval
    verdict, why = paired.decide(interval.low, interval.high, 0.02, 0.95)
    assert verdict == "inconclusive" and "straddles -2" in why
    advice = paired.advice(interval, 0.02)
    # (z_0.975 + z_0.80)^2 * (d - delta^2) / (delta + m)^2 = 2.80158^2 * (0.035 - 0.000025) / 0.015^2 = 1220.06, rounded up
    assert advice.startswith("~1221 paired problems would decide the 2-point margin at 95% confidence in 80% of runs")
    assert "7 of 200 paired problems changed (3.5%)" in advice
    assert "repeat" not in advice and "discordant pairs" not in advice
    assert all(float(share) <= 100 for share in re.findall(r"(\d+(?:\.\d+)?)%", advice))  # never an effect over 100%


@pytest.mark.parametrize(("p_regress", "p_improve", "max_drop"), [(0.02, 0.015, 0.02), (0.06, 0.02, 0.02), (0.1, 0.1, 0.05)])
def test_the_advised_number_of_problems_decides_the_margin_in_about_the_stated_share_of_runs(p_regress, p_improve, max_drop):
    delta = p_improve - p_regress
    spread = (p_regress + p_improve - delta**2) ** 0.5
    advised = paired.problems_to_decide(spread, delta, max_drop, 0.95, power=0.8)
    assert advised is not None
    assert decided_share(advised, p_regress, p_improve, max_drop) == pytest.approx(0.80, abs=0.04)
    # and it is not generous: half as many problems decide clearly less often
    assert decided_share(advised // 2, p_regress, p_improve, max_drop) < 0.65


def test_a_drop_on_the_margin_itself_is_said_to_be_undecidable_not_given_a_huge_count():
    interval = paired.PairedInterval(n=100, baseline=0.9, candidate=0.88, delta=-0.02, low=-0.05, high=0.01, spread=0.2,
                                     discordant=4, confidence=0.95)
    said = paired.advice(interval, 0.02)
    assert "sits at the 2-point margin" in said and "no feasible number of problems decides it" in said
    # the one count it gives is the one for no true drop: (2.80158 * 0.2 / 0.02)^2 = 784.9, rounded up
    assert said.count("~") == 1 and said.endswith("; ~785 would if there is no true drop.")


def _needed(spread: float, delta: float, margin: float) -> int:
    """N = ((z_0.975 + z_0.80) * spread / |delta + margin|)^2, rounded up, computed here from scratch."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.80)
    return int(np.ceil((z * spread / abs(delta + margin)) ** 2))


def test_inconclusive_advice_gives_the_problems_needed_if_the_delta_is_the_observed_one_and_if_there_is_no_drop():
    """To plan a benchmark's size: a hand-made interval (delta -0.9 points, margin 1.5 points, spread 0.25)."""
    interval = paired.PairedInterval(n=300, baseline=0.8, candidate=0.791, delta=-0.009, low=-0.037, high=0.019,
                                     spread=0.25, discordant=19, confidence=0.95)
    said = paired.advice(interval, 0.015)
    # observed: (2.80158 * 0.25 / 0.006)^2 = 13626.4 -> 13627; no true drop: (2.80158 * 0.25 / 0.015)^2 = 2180.2 -> 2181
    assert (_needed(0.25, -0.009, 0.015), _needed(0.25, 0.0, 0.015)) == (13627, 2181)
    assert said.startswith("~13627 paired problems would decide the 1.5-point margin at 95% confidence in 80% of runs "
                           "if the true delta is the observed -0.90 points; ~2181 if there is no true drop "
                           "(19 of 300 paired problems changed (6.3%)).")
    # the issue's runs: the count at the observed delta stays, the one at no drop is smaller (the gap is the margin)
    base, cand = issue_values()
    issue = paired.advice(paired.paired_interval(base, cand), 0.02)
    spread = (0.035 - 0.005**2) ** 0.5
    assert f"~{_needed(spread, -0.005, 0.02)} paired problems" in issue and f"; ~{_needed(spread, 0.0, 0.02)} if there is no true drop" in issue
    assert (_needed(spread, -0.005, 0.02), _needed(spread, 0.0, 0.02)) == (1221, 687)


@pytest.mark.parametrize("model", [CompareResultsInput, EvaluateQuantizationInput])
@pytest.mark.parametrize("value", [0.02, 0.05, 0.1])
def test_a_margin_that_reads_as_a_fraction_is_refused_with_its_points(model, value):
    fields = {"baseline": "a", "candidate": "b"} if model is CompareResultsInput else {
        "baseline_checkpoint": "a", "candidate_checkpoint": "b", "benchmarks": ["x.py"]}
    with pytest.raises(ValidationError) as caught:
        model(**fields, max_drop=value)
    said = str(caught.value)
    assert f"max_drop: max_drop is in points 0-100 (2 means two points); {value:g} reads as a fraction — use {100 * value:g}." in said, said


def test_points_are_taken_as_points_and_the_default_decides_nothing():
    assert CompareResultsInput(baseline="a", candidate="b", max_drop=2).max_drop == 2
    assert CompareResultsInput(baseline="a", candidate="b", max_drop=0.5).max_drop == 0.5  # half a point is a margin
    defaults = EvaluateQuantizationInput(baseline_checkpoint="a", candidate_checkpoint="b", benchmarks=["x.py"])
    assert (defaults.max_drop, defaults.confidence) == (None, 0.95)  # one default: no margin chosen for the user
    assert CompareResultsInput.model_fields["max_drop"].default is None
    for bad in ({"max_drop": 150}, {"confidence": 95}, {"confidence": 0.3}):
        with pytest.raises(ValidationError):
            CompareResultsInput(baseline="a", candidate="b", **bad)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_margin_that_is_no_number_is_a_clear_error(value):
    """NaN passed every range check (comparisons with NaN are false) and reached the statistics."""
    with pytest.raises(ValidationError) as caught:
        CompareResultsInput(baseline="a", candidate="b", max_drop=value)
    assert f"max_drop: {value} is not a number; max_drop is in points 0-100 (2 means two points)." in str(caught.value)


def test_a_gate_policy_with_max_drop_in_points_is_refused(tmp_path):
    """nel gate's max_drop is a fraction of the 0-1 score: `max_drop: 2` would allow 200 points."""
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nbenchmarks:\n  gsm8k: {tier: critical, metric: pass@1, max_drop: 2}\n")
    with pytest.raises(ToolError, match=r"benchmarks.gsm8k.max_drop: a `nel gate` policy file takes a fraction of the 0-1 score; 2 reads as points — use 0.02"):
        load_policy(policy)


def test_over_mcp_a_fraction_where_points_are_meant_is_refused_before_anything_runs(tmp_path):
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    async def go():
        async with Client(build_server()) as client:
            evaluate = await client.call_tool("evaluate_quantization", {
                "baseline_checkpoint": str(tmp_path / "a"), "candidate_checkpoint": str(tmp_path / "b"),
                "benchmarks": ["x.py"], "max_drop": 0.02, "output_dir": str(tmp_path / "out")})
            compare = await client.call_tool("compare_results", {"baseline": "a", "candidate": "b", "max_drop": 0.02})
            return evaluate, compare

    for result in anyio.run(go):
        assert result.is_error and "0.02 reads as a fraction — use 2." in result.content[0].text
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_it_as_bad_usage(tmp_path, capsys):
    from quanteval.faces import cli

    code = cli.main(["evaluate", str(tmp_path / "a"), str(tmp_path / "b"), "--benchmarks", "x.py", "--max-drop", "0.05"])
    assert code == cli.EXIT_USAGE and "max_drop is in points 0-100 (2 means two points); 0.05 reads as a fraction — use 5." in capsys.readouterr().err


def test_a_margin_and_a_policy_together_are_refused_before_anything_is_served(tmp_path):
    from pathlib import Path

    from quanteval.workflow.evaluate import evaluate_quantization

    repo = Path(__file__).resolve().parents[1]
    request = EvaluateQuantizationInput(
        baseline_checkpoint=str(repo / "examples/checkpoints/tiny-add-bf16"), candidate_checkpoint=str(repo / "examples/checkpoints/tiny-add-w8a8"),
        benchmarks=[str(repo / "examples/benchmarks/tiny_add.py")], max_drop=2,
        policy=str(repo / "examples/policies/tiny_add_release.yaml"), output_dir=str(tmp_path / "out"))
    with pytest.raises(ToolError, match="max_drop and policy both given"):
        evaluate_quantization(request)
    assert not (tmp_path / "out").exists()
