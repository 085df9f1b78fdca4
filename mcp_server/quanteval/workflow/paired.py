"""The paired statistics every verdict uses, in one place: compare_results, gate_results and evaluate_quantization
call these functions, so one comparison has one confidence interval, one rule and one piece of advice.

- The interval: the mean of the per-problem deltas (candidate - baseline) with a two-sided CI at the chosen
  confidence, Student t on the deltas, or a clustered SE when every problem carries a category (nel gate's
  _paired_delta_ci, which uses 95%).
- The rule (nel gate's on damage = the drop): the whole CI above -max_drop is acceptable, the whole CI below it is
  not acceptable, a CI across it is inconclusive.
- The advice, when inconclusive: how many paired problems would decide the margin, at the observed per-problem
  spread (for 0/1 rewards: discordance d and mean delta δ give variance d - δ²), if the true delta is the observed
  one, and if there is no true drop (δ = 0, the same σ), so a user can size a benchmark either way. The CI decides
  when |δ + m| exceeds z_c·σ/√N; that happens in a share `power` of runs when N = ((z_c + z_power)·σ / |δ + m|)².
  tests/test_paired.py checks it against simulated paired outcomes.

The user's margin is given in accuracy points (2 = two points); the statistics work on fractions (0.02).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from dataclasses import dataclass
from statistics import NormalDist
from typing import Annotated, Any

from pydantic import AfterValidator, Field

DEFAULT_CONFIDENCE = 0.95  # nel gate's, and the one its policy cannot change
DEFAULT_POWER = 0.80  # the advised number of problems decides the margin in this share of runs
MIN_PAIRED_ITEMS = 10  # nel gate's _MIN_PAIRED_ITEMS: fewer paired problems decide nothing
# Every score a person types is in accuracy points, 0-100 (max_drop 2 = two points; a reference score 90 = 90%),
# whatever scale a run stores: one unit, checked before anything is served. A value that reads as a fraction is
# refused with the value in points, never guessed: below this a margin in points looks like a fraction (0.02 for two)...
SMALLEST_POINTS = 0.2
# ... and a published score at or below 1 point is a fraction (0.9 for 90); 0 is 0 on either scale.
SMALLEST_REFERENCE_POINTS = 1.0
MOST_PROBLEMS_ADVISED = 10_000_000


def points_refusal(label: str, unit: str, value: float, fraction_below: float, inclusive: bool = False) -> str | None:
    """Why `value` (typed as `label`; `unit` says what it must be, e.g. "max_drop is in points 0-100") is no score in
    points; None when it is one. Above 0 and below `fraction_below` (or equal, `inclusive`) it reads as a fraction and
    is refused with its value in points."""
    if not math.isfinite(value):
        return f"{label}: {value} is not a number; {unit}."
    if not 0 <= value <= 100:
        return f"{label}: {value:g} is not an accuracy; {unit}."
    if 0 < value < fraction_below or (inclusive and value == fraction_below):
        return f"{label}: {unit}; {value:g} reads as a fraction — use {100 * value:g}."
    return None


def _points(value: float | None) -> float | None:
    """max_drop in accuracy points; a value that reads as a fraction is refused, never guessed."""
    if value is not None and (refusal := points_refusal("max_drop", "max_drop is in points 0-100 (2 means two points)",
                                                        value, SMALLEST_POINTS)):
        raise ValueError(refusal)
    return value


def reference_points(scores: dict[str, float]) -> dict[str, float]:
    """Published scores in points, by benchmark; one that reads as a fraction is refused with its points."""
    for task, value in scores.items():
        if refusal := points_refusal(f"reference_scores.{task}", "reference scores are points 0-100", value,
                                     SMALLEST_REFERENCE_POINTS, inclusive=True):
            raise ValueError(refusal)
    return scores


def _confidence(value: float) -> float:
    if not 0.5 <= value < 1:
        raise ValueError(f"confidence {value:g} must be a probability in [0.5, 1), e.g. 0.95; "
                         f"{value / 100:g} if you meant {value:g}%." if value > 1 else
                         f"confidence {value:g} must be a probability in [0.5, 1), e.g. 0.95.")
    return value


# The user's rule, as compare_results and evaluate_quantization take it. No margin given: no verdict on
# acceptability (inconclusive, naming the measured drop), never a margin chosen for the user.
MaxDropPoints = Annotated[float | None, AfterValidator(_points), Field(description=(
    "Largest acceptable drop in points (2, not 0.02); omitted: no verdict."))]
# The baseline checked against the world (anomaly.reference_check): compare_results and evaluate_quantization take it.
ReferenceScores = Annotated[dict[str, float], AfterValidator(reference_points), Field(default_factory=dict, description=(
    "Published score per benchmark, points (90, not 0.9)."))]
Confidence = Annotated[float, AfterValidator(_confidence), Field(description=(
    "Of the paired interval (nel gate: 0.95)."))]


# ---------------------------------------------------------------- quantiles


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1 - x) / b


@functools.cache
def t_quantile(p: float, df: int) -> float:
    """Student t's p quantile for p > 0.5 (scipy.stats.t.ppf(p, df)), by bisection on its upper tail."""
    low, high = 0.0, 1e4
    for _ in range(200):
        mid = (low + high) / 2
        upper_tail = 0.5 * _betainc(df / 2, 0.5, df / (df + mid * mid))
        low, high = (mid, high) if upper_tail > 1 - p else (low, mid)
    return (low + high) / 2


def normal_quantile(p: float) -> float:
    return NormalDist().inv_cdf(p)


def two_sided(confidence: float) -> float:
    """The upper quantile level of a two-sided interval (0.975 for 95%)."""
    return 1 - (1 - confidence) / 2


# ---------------------------------------------------------------- the interval


def paired_delta_ci(deltas: list[float], clusters: list[str] | None = None,
                    confidence: float = DEFAULT_CONFIDENCE) -> tuple[float | None, float | None]:
    """CI of the mean paired delta: clustered SE when problems carry categories, else Student t (nel gate's)."""
    import numpy as np

    n = len(deltas)
    if n < 2:
        return None, None
    values = np.asarray(deltas, dtype=np.float64)
    mean = float(values.mean())
    if clusters and len(set(clusters)) > 1:
        sums: dict[str, float] = defaultdict(float)
        for residual, cluster in zip(values - mean, clusters, strict=True):
            sums[cluster] += float(residual)
        groups = len(sums)
        se = math.sqrt((groups / (groups - 1)) * sum(s * s for s in sums.values()) / n**2)
        z = normal_quantile(two_sided(confidence))
        return round(mean - z * se, 6), round(mean + z * se, 6)
    se = float(values.std(ddof=1) / math.sqrt(n))
    z = t_quantile(two_sided(confidence), n - 1)
    return round(mean - z * se, 6), round(mean + z * se, 6)


@dataclass
class PairedInterval:
    n: int
    baseline: float  # mean per-problem value, fraction
    candidate: float
    delta: float
    low: float | None
    high: float | None
    spread: float  # population sd of the per-problem deltas
    discordant: int  # problems whose value differs between the runs
    confidence: float


def paired_interval(base_values: dict[Any, float], cand_values: dict[Any, float],
                    categories: dict[Any, str] | None = None,
                    confidence: float = DEFAULT_CONFIDENCE) -> PairedInterval | None:
    """The one interval of a comparison, over the problems both runs scored; None when they share none. categories
    (the baseline's): clustered by them when every shared problem has one."""
    shared = sorted(set(base_values) & set(cand_values))
    if not shared:
        return None
    deltas = [cand_values[p] - base_values[p] for p in shared]
    n = len(shared)
    mean = sum(deltas) / n
    clusters = [categories[p] for p in shared] if categories and all(p in categories for p in shared) else None
    low, high = paired_delta_ci(deltas, clusters, confidence)
    return PairedInterval(
        n=n, baseline=sum(base_values[p] for p in shared) / n, candidate=sum(cand_values[p] for p in shared) / n,
        delta=mean, low=low, high=high, spread=math.sqrt(sum((d - mean) ** 2 for d in deltas) / n),
        discordant=sum(1 for d in deltas if d != 0), confidence=confidence)


# ---------------------------------------------------------------- the rule and the advice


def decide(low: float | None, high: float | None, max_drop: float | None, confidence: float) -> tuple[str, str]:
    """acceptable / not acceptable / inconclusive by the CI against -max_drop (fractions), nel gate's rule."""
    level = f"{100 * confidence:g}%"
    if low is None or high is None:
        return "inconclusive", "no interval (no standard error recorded, or fewer than 2 paired problems)"
    span = f"[{100 * low:+.2f}, {100 * high:+.2f}] points"
    if max_drop is None:
        return "inconclusive", f"the {level} CI is {span}; no max_drop given, so no verdict on acceptability"
    if low >= -max_drop:
        return "acceptable", f"the whole {level} CI {span} stays above -{100 * max_drop:g}"
    if high < -max_drop:
        return "not acceptable", f"the whole {level} CI {span} lies below -{100 * max_drop:g}"
    return "inconclusive", f"the {level} CI {span} straddles -{100 * max_drop:g}"


def problems_to_decide(spread: float, delta: float, max_drop: float, confidence: float,
                       power: float = DEFAULT_POWER) -> int | None:
    """Paired problems for the CI to decide the margin in a share `power` of runs, if the true delta is `delta`
    and the per-problem spread is `spread`; None when no number can (the delta sits on the margin)."""
    gap = abs(delta + max_drop)
    if spread == 0:
        return MIN_PAIRED_ITEMS
    if gap == 0:
        return None
    needed = ((normal_quantile(two_sided(confidence)) + normal_quantile(power)) * spread / gap) ** 2
    return None if needed > MOST_PROBLEMS_ADVISED else max(MIN_PAIRED_ITEMS, math.ceil(needed))


def advice(interval: PairedInterval, max_drop: float | None) -> str:
    """What would decide an inconclusive comparison: the number of problems, at the discordance observed, if the true
    delta is the observed one and if there is no true drop."""
    changed = f"{interval.discordant} of {interval.n} paired problems changed ({100 * interval.discordant / interval.n:.1f}%)"
    delta = f"{100 * interval.delta:+.2f} points"
    if max_drop is None:
        return f"Give max_drop (points) to judge: {changed}, delta {delta}."
    needed = problems_to_decide(interval.spread, interval.delta, max_drop, interval.confidence)
    no_drop = problems_to_decide(interval.spread, 0.0, max_drop, interval.confidence)
    level = f"{100 * interval.confidence:g}%"
    if needed is None:
        return (f"{changed}, delta {delta}: the measured drop sits at the {100 * max_drop:g}-point margin, so no feasible "
                f"number of problems decides it at {level} (the drop is about the margin itself)"
                + ("." if no_drop is None else f"; ~{no_drop} would if there is no true drop."))
    return (f"~{needed} paired problems would decide the {100 * max_drop:g}-point margin at {level} confidence in "
            f"{100 * DEFAULT_POWER:g}% of runs if the true delta is the observed {delta}"
            + ("" if no_drop is None else f"; ~{no_drop} if there is no true drop")
            + f" ({changed}). Run more problems (max_problems, or a larger benchmark).")


def sampling_variance(base_rewards: dict[Any, list[float]], cand_rewards: dict[Any, list[float]],
                      problems: list[Any]) -> float | None:
    """The part of the per-problem delta's variance that comes from sampling (it shrinks as 1/repeats): the mean over
    problems of var_b/R_b + var_c/R_c, each side's sample variance over its repeats. None where a side has one repeat
    of some problem (its sampling variation is not measured)."""
    parts = []
    for problem in problems:
        term = 0.0
        for rewards in (base_rewards[problem], cand_rewards[problem]):
            if len(rewards) < 2:
                return None
            mean = sum(rewards) / len(rewards)
            term += sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1) / len(rewards)
        parts.append(term)
    return sum(parts) / len(parts) if parts else None


def repeats_to_decide(interval: PairedInterval, repeats: int, within: float, max_drop: float) -> int | None:
    """Repeats per side that would decide the margin over the same problems, in a share DEFAULT_POWER of runs, if the
    true delta is the observed one: the spread's sampling part (`within`, at `repeats`) shrinks as 1/repeats, the rest
    (how problems truly differ) does not. None when no number of repeats can (then only more problems help)."""
    gap = abs(interval.delta + max_drop)
    z = normal_quantile(two_sided(interval.confidence)) + normal_quantile(DEFAULT_POWER)
    target = (gap * math.sqrt(interval.n) / z) ** 2  # the largest per-problem variance that decides
    between = max(interval.spread**2 - within, 0.0)
    if gap == 0 or between >= target:
        return None
    return max(repeats, math.ceil(within * repeats / (target - between))) if within > 0 else None


def repeats_advice(interval: PairedInterval, repeats: int, within: float | None, max_drop: float | None) -> str:
    """The second dimension of an inconclusive comparison's advice: more repeats (for a benchmark with no more
    problems, such as AIME's 30), sized from the sampling variation the repeats showed."""
    if max_drop is None:
        return ""
    if within is None:
        if repeats > 1:
            return ""
        return (" Repeats: with 1 sample per problem the sampling variation is not measured; at temperature > 0, 8 or "
                "more repeats measure it (and average it down), at temperature 0 repeats add nothing.")
    if within == 0:
        return (f" Repeats: the {repeats} repeats of every problem scored alike (greedy decoding, or repeats that are "
                "copies), so more repeats add nothing here: only more problems decide.")
    needed = repeats_to_decide(interval, repeats, within, max_drop)
    if needed is None:
        return (f" Repeats: no number of repeats decides it: most of the spread is how problems differ, not sampling "
                f"(measured over {repeats} repeats); only more problems do.")
    return (f" Repeats: ~{needed} repeats per side (now {repeats}) would decide it over the same {interval.n} problems "
            f"in {100 * DEFAULT_POWER:g}% of runs, if the true delta is the observed one.")
