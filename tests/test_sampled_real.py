"""A weak model sampled, for real: vLLM (CPU build) serves the embedded tiny-skills pair (BF16 right on ~40% of
tiny_mcq, its int2 RTN copy on ~33%), nel-next samples every problem at temperature 1 on both sides, once and 8 times,
through evaluate_quantization. The interval narrows with the repeats (the SE is in the answer), so a margin that 8
repeats decide is inconclusive at 1 repeat, with the advice in both dimensions (problems, repeats); the pre-flight
note says so before serving. The W2 candidate, stored dequantized, is named SIZE_NOT_REDUCED. Heavy: 4 vLLM starts, in
a lane of their own (its servers are its own state dir's; no test here checks for another's). On vLLM's default path:
served eager (~5 CPU-s a start less), the pair's delta came out smaller (8 repeats: -3.8 ± 1.6 on a quiet machine,
-1.4 ± 2.0 in a full run, where the 1-repeat run drew +5.5 ± 4.2) and no margin 8 repeats decide lay inside the
1-repeat interval."""

from __future__ import annotations

import math

import pytest
from tiers import CHECKPOINTS, REPO, own_lane, requires

from quanteval.workflow.evaluate import EvaluateQuantizationInput, evaluate_quantization

BASE, LOSSY = CHECKPOINTS / "tiny-skills-bf16", CHECKPOINTS / "tiny-skills-w2-rtn"
SHIPPED = REPO / "examples" / "benchmarks" / "skills"
PROBLEMS = 200  # all of tiny_mcq
pytestmark = [*requires("vllm", "skills-in-nel-next"), own_lane("vllm-sampled")]


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    root = tmp_path_factory.mktemp("sampled-real")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QUANTEVAL_STATE_DIR", str(root / "state"))
        mp.delenv("QUANTEVAL_LEDGER", raising=False)
        mp.setenv("NEMO_SKILLS_EXTRA_BENCHMARK_MAP", str(SHIPPED / "benchmark_map.json"))
        mp.setenv("NEMO_EVALUATOR_TELEMETRY_LEVEL", "0")

        def evaluate(repeats: int, max_drop: float | None = None):
            said: list[str] = []
            answer = evaluate_quantization(EvaluateQuantizationInput(
                baseline_checkpoint=str(BASE), candidate_checkpoint=str(LOSSY), benchmarks=["skills://tiny_mcq"],
                output_dir=str(root / f"x{repeats}"), canary_problems=20, max_problems=PROBLEMS, max_tokens=32, repeats=repeats,
                temperature=1.0, max_drop=max_drop, startup_timeout_s=900),
                lambda done, total=None, message=None: said.append(message or ""))
            return answer, said

        yield evaluate


@pytest.mark.timeout(2400)  # two evaluations of the pair (8 repeats, then 1), 4 vLLM starts: ~12 min on a loaded machine
def test_more_repeats_narrow_the_interval_until_a_margin_is_decided_that_one_repeat_cannot(sampled):
    eight, _ = sampled(8)
    one, _ = sampled(1)
    (row8,), (row1,) = eight.comparisons, one.comparisons
    assert row8.repeats == 8 and row1.repeats == 1 and row8.delta_stderr < 0.8 * row1.delta_stderr, (row8.why, row1.why)
    print(f"\n1 repeat: {100 * row1.delta:+.2f} ± {100 * row1.delta_stderr:.2f}; 8 repeats: "
          f"{100 * row8.delta:+.2f} ± {100 * row8.delta_stderr:.2f}")
    # a margin 8 repeats decide and 1 repeat cannot: just beyond one end of the 8-repeat interval (past its high end,
    # "not acceptable"; past its low end, "acceptable") and inside the 1-repeat one. Which end depends on the draws:
    # sampled answers follow the batch's numerics on CPU, so where the 1-repeat estimate falls is not fixed by the seeds.
    low, high = 100 * row8.ci_low, 100 * row8.ci_high
    beyond = [*([math.floor(-high * 2) / 2] if high < -0.5 else []), math.ceil(-low * 2) / 2 + 0.5]
    inside = [margin for margin in beyond if 100 * row1.ci_low < -margin < 100 * row1.ci_high]
    assert inside, f"no margin outside the 8-repeat interval [{low:.2f}, {high:.2f}] lies inside the 1-repeat one"
    margin = inside[0]
    decided, _ = sampled(8, margin)  # the finished runs are reused: no serving
    undecided, before = sampled(1, margin)
    (row8,), (row1,) = decided.comparisons, undecided.comparisons
    assert decided.baseline.reused and undecided.candidate.reused
    print(f"margin {margin}: 8 repeats {row8.verdict}, 1 repeat {row1.verdict}")
    assert row8.verdict in ("acceptable", "not acceptable") and row1.verdict == "inconclusive", (row8.why, row1.why)
    assert f"(SE) over {PROBLEMS} problems x 8 repeats" in row8.why and f"(SE) over {PROBLEMS} problems" in row1.why
    # both dimensions: problems (how many would decide, or that none can when the drop sits on the margin) and repeats
    assert ("paired problems would decide" in row1.why or "number of problems decides" in row1.why), row1.why
    assert "8 or more repeats" in row1.why
    assert any(f"{PROBLEMS} problems x 1 repeat" in note for note in before)  # said before serving
    # the W2 candidate saves nothing on disk: named, whatever the accuracy says
    assert decided.weights is not None and decided.weights.size_not_reduced and decided.verdict != "acceptable"
    assert any("SIZE_NOT_REDUCED" in reason and "stored dequantized" in reason for reason in decided.reasons)
    (check,) = decided.outputs
    assert check.candidate.samples == PROBLEMS * 8 and check.copies == []  # sampled: the repeats differ
    assert check.candidate.measured_on == "measured on vllm CPU; GPU kernels differ" and check.candidate.tokens_per_second
