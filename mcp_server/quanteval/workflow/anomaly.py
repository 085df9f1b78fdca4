"""What makes a comparison suspect, never reported as a quantization loss: a drop too large to be quantization (a
serving or kernel problem), or a baseline off its published score.

One place for the thresholds and where they come from:
- Well-made 8-bit checkpoints (FP8, INT8 W8A8) lose about a point or less on the usual benchmarks (ModelOpt and
  llm-compressor model cards); NVIDIA's NVFP4 release policies for `nel gate` allow a 1.5-point drop
  (`max_drop: 0.015`). A drop of several times that is more likely the serving than the format.
- vLLM issue 36094: GSM8K 0.90 -> 0.35 for an NVFP4 checkpoint, a kernel path problem, not NVFP4's accuracy.
- Below 4 bits (2-3-bit round-to-nearest, as the embedded int2 example), large losses are the format's own.
- The baseline against its published score (model card, the benchmark's paper or leaderboard): ModelOpt's
  compare-results skill (NVIDIA/Model-Optimizer#1945) calls a baseline within ~5 points verified and one further off,
  above or below, a failed check that blocks a success verdict: a different protocol or a broken serving, not the model.
"""

from __future__ import annotations

from typing import Literal

# Weight bits of the candidate -> the drop (fraction of the score) beyond which a loss is suspect.
SUSPECT_DROP_BY_BITS: dict[int, float] = {8: 0.05, 4: 0.10}
SUSPECT_DROP_UNKNOWN = 0.20  # the format is not known (e.g. weights stored dequantized): only gross drops are suspect
SUSPECT_DROP_BELOW_4_BITS = 0.30
# Points a baseline may differ from its published score and still be verified (the user may set another).
REFERENCE_TOLERANCE_POINTS = 5.0
WHAT_TO_CHECK = ("the serving framework and its version, the kernel path it chose (plan_deployment notes, the server "
                 "log), the chat template, sampling (temperature, top_p, top_k), max_tokens and truncation")


def suspect_drop(weight_bits: int | None) -> float:
    if weight_bits is None:
        return SUSPECT_DROP_UNKNOWN
    if weight_bits < 4:
        return SUSPECT_DROP_BELOW_4_BITS
    return SUSPECT_DROP_BY_BITS.get(8 if weight_bits >= 8 else 4, SUSPECT_DROP_UNKNOWN)


def anomaly(task: str, baseline: float, candidate: float, weight_bits: int | None, unquantized: bool = False) -> str | None:
    """Why this drop looks like a serving or kernel problem rather than quantization; None when it does not.
    `unquantized`: the candidate carries no quantization at all, so no drop of it is quantization's."""
    limit = suspect_drop(weight_bits)
    drop = baseline - candidate
    if drop > limit and unquantized:
        return (f"{task}: a {100 * drop:.1f}-point drop from a candidate that carries no quantization (no quantization "
                "config, 16/32-bit weights): not quantization loss. The checkpoint differs from the baseline otherwise "
                f"(damaged or other weights: compare their files) or is served differently. Check {WHAT_TO_CHECK}.")
    if drop > limit:
        bits = f"{weight_bits}-bit weights" if weight_bits else "an unknown format"
        return (f"{task}: a {100 * drop:.1f}-point drop is far beyond what {bits} costs (suspect above "
                f"{100 * limit:.0f}): suspect a serving or kernel problem, not quantization loss. Check {WHAT_TO_CHECK}.")
    return None


def reference_check(task: str, baseline: float, reference: float | None,
                    tolerance_points: float) -> tuple[Literal["verified", "failed", "unverified"], str]:
    """The baseline (a fraction) against its published score (a fraction; None: none given) and what it means."""
    if reference is None:
        return "unverified", f"{task}: no published score given (reference_scores), so the baseline is unchecked."
    off = round(100 * (baseline - reference), 6)  # rounded: 0.80 vs 0.85 is 5 points, not 5.000000000000004
    if abs(off) <= tolerance_points:
        return "verified", (f"{task}: the baseline's {100 * baseline:.1f} is within {tolerance_points:g} points of the "
                            f"published {100 * reference:.1f}.")
    return "failed", (f"{task}: your baseline scores {100 * baseline:.1f} where the published score is "
                      f"{100 * reference:.1f} ({abs(off):.1f} points {'above' if off > 0 else 'below'}, more than "
                      f"{tolerance_points:g}); the comparison is suspect. Check that the protocol matches the published "
                      f"one (prompt, few-shot, chat template, max tokens), then {WHAT_TO_CHECK}.")
