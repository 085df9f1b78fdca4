"""Drops too large to be quantization: a suspect serving or kernel problem, never reported as a quantization loss.

One place for the thresholds and where they come from:
- Well-made 8-bit checkpoints (FP8, INT8 W8A8) lose about a point or less on the usual benchmarks (ModelOpt and
  llm-compressor model cards); NVIDIA's NVFP4 release policies for `nel gate` allow a 1.5-point drop
  (`max_drop: 0.015`). A drop of several times that is more likely the serving than the format.
- vLLM issue 36094: GSM8K 0.90 -> 0.35 for an NVFP4 checkpoint, a kernel path problem, not NVFP4's accuracy.
- Below 4 bits (2-3-bit round-to-nearest, as the embedded int2 example), large losses are the format's own.
"""

from __future__ import annotations

# Weight bits of the candidate -> the drop (fraction of the score) beyond which a loss is suspect.
SUSPECT_DROP_BY_BITS: dict[int, float] = {8: 0.05, 4: 0.10}
SUSPECT_DROP_UNKNOWN = 0.20  # the format is not known (e.g. weights stored dequantized): only gross drops are suspect
SUSPECT_DROP_BELOW_4_BITS = 0.30
# A baseline this far below the score the user expects (model card, recipe reference) is itself suspect.
BASELINE_BELOW_REFERENCE = 0.10
WHAT_TO_CHECK = ("the serving framework and its version, the kernel path it chose (plan_deployment notes, the server "
                 "log), the chat template, sampling (temperature, top_p, top_k), max_tokens and truncation")


def suspect_drop(weight_bits: int | None) -> float:
    if weight_bits is None:
        return SUSPECT_DROP_UNKNOWN
    if weight_bits < 4:
        return SUSPECT_DROP_BELOW_4_BITS
    return SUSPECT_DROP_BY_BITS.get(8 if weight_bits >= 8 else 4, SUSPECT_DROP_UNKNOWN)


def anomaly(task: str, baseline: float, candidate: float, weight_bits: int | None, reference: float | None) -> str | None:
    """Why this comparison looks like a serving or kernel problem rather than quantization; None when it does not."""
    if reference is not None and baseline < reference - BASELINE_BELOW_REFERENCE:
        return (f"{task}: the baseline scores {100 * baseline:.1f}, {100 * (reference - baseline):.1f} points below the "
                f"expected {100 * reference:.1f}: suspect the baseline's serving or evaluation setup, not quantization. "
                f"Check {WHAT_TO_CHECK}.")
    limit = suspect_drop(weight_bits)
    drop = baseline - candidate
    if drop > limit:
        bits = f"{weight_bits}-bit weights" if weight_bits else "an unknown format"
        return (f"{task}: a {100 * drop:.1f}-point drop is far beyond what {bits} costs (suspect above "
                f"{100 * limit:.0f}): suspect a serving or kernel problem, not quantization loss. Check {WHAT_TO_CHECK}.")
    return None
