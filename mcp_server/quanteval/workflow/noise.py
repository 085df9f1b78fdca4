"""The serving-noise floor: how much the baseline differs from itself when served on the framework's other numeric path
(eager vs default), next to how much the candidate differs from the baseline.

Why: the same weights answer differently on another numeric path (serving.deployment's docstring: 38 of 200 answers
of a weak model moved between vLLM CPU's eager and compiled paths, where BF16 -> W8A8 moved 9). A benchmark whose
answers move that much under a legitimate change of serving cannot attribute a change of the same size to
quantization.

The rule, per benchmark (said in the report): the quantization effect is *within serving noise* when the candidate
differs from the baseline on no more problems than the baseline differs from itself (discordant pairs, the flips
`nel compare` counts). Then a drop is not evidence against the candidate: a "not acceptable" verdict that rests on
such benchmarks becomes "inconclusive" (a user who reads only the verdict would otherwise blame the quantization),
while "acceptable" stands (the interval already bounds the loss under this serving). The A/A delta and interval are
shown too, so the size of the noise is visible in points, not only in flips.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from quanteval.workflow.comparison_report import TaskComparison


class NoiseFloor(BaseModel):
    task: str
    quantization_flips: int | None = Field(description="Problems whose correctness differs between baseline and candidate.")
    serving_flips: int | None = Field(description="Problems whose correctness differs between the baseline's two serving paths.")
    serving_delta: float = Field(description="Baseline on the other path minus the baseline, as a fraction.")
    serving_ci_low: float | None
    serving_ci_high: float | None
    within_noise: bool | None = Field(description="True: quantization_flips <= serving_flips (this benchmark cannot "
                                      "see a quantization effect of this size); None: flips not counted.")
    delta_within_serving_interval: bool | None = Field(None, description="True: the quantization's net delta lies inside "
                                                       "the serving interval (in points, not told from serving noise); "
                                                       "None: no serving interval.")
    message: str


def _flips(row: TaskComparison) -> int | None:
    if row.n_regressions is None or row.n_improvements is None:
        return None
    return row.n_regressions + row.n_improvements


def noise_floor(quantization: list[TaskComparison], serving: list[TaskComparison], other_path: str) -> list[NoiseFloor]:
    """One row per benchmark compared both ways; `other_path` names the second path (e.g. '--enforce-eager')."""
    by_task = {row.task: row for row in serving}
    rows = []
    for quant in quantization:
        same = by_task.get(quant.task)
        if same is None:
            continue
        q, s = _flips(quant), _flips(same)
        within = None if q is None or s is None else q <= s
        inside = None if same.ci_low is None or same.ci_high is None else same.ci_low <= quant.delta <= same.ci_high
        if within is None:
            message = f"{quant.task}: flips not counted (no per-problem results), so no noise floor."
        else:
            interval = ("" if same.ci_low is None or same.ci_high is None else
                        f", delta {100 * same.delta:+.2f} points, CI [{100 * same.ci_low:+.2f}, {100 * same.ci_high:+.2f}]")
            message = (f"{quant.task}: the candidate differs from the baseline on {q} problems (delta "
                       f"{100 * quant.delta:+.2f} points); the baseline differs from itself on {s} when served "
                       f"{other_path}{interval}: " + _said(within, inside))
        rows.append(NoiseFloor(task=quant.task, quantization_flips=q, serving_flips=s, serving_delta=same.delta,
                               serving_ci_low=same.ci_low, serving_ci_high=same.ci_high, within_noise=within,
                               delta_within_serving_interval=inside, message=message))
    return rows


def _said(within_flips: bool, delta_inside: bool | None) -> str:
    """Both measures of the noise in one sentence: a candidate that flips more problems than serving does but whose net
    delta lies inside the serving interval is not shown to differ by more than serving noise in points."""
    if within_flips:
        return "this benchmark cannot see a quantization effect of this size."
    if delta_inside:
        return ("it flips more problems than serving does, but its net delta lies inside the serving interval: in points, "
                "the quantization effect is not told apart from serving noise.")
    return ("the quantization effect exceeds the serving noise (more flips"
            + (", and a net delta outside the serving interval)." if delta_inside is False else "; no serving interval)."))


def verdict_within_noise(verdict: str, rows: list[NoiseFloor], failing: set[str]) -> tuple[str, str | None]:
    """The verdict a user may read alone: a "not acceptable" resting only on benchmarks within serving noise is
    inconclusive. `failing`: the benchmarks that made it not acceptable. Returns the verdict and why it changed."""
    noisy = {row.task for row in rows if row.within_noise}
    if verdict == "not acceptable" and failing and failing <= noisy:
        return "inconclusive", (f"Inconclusive, not 'not acceptable': the drop on {', '.join(sorted(failing))} is within "
                                "serving noise (the baseline served on another numeric path flips as many problems), so it "
                                "is not evidence of a quantization loss. Use a larger or less fragile benchmark.")
    return verdict, None
