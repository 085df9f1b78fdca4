"""How both sides of an evaluation are sampled (repeats, temperature, top_p), and what that can decide, said before
anything is served.

Repeats average per problem (workflow/paired.py pairs the per-problem means, as `nel gate` does); they add evidence
only when the answers vary between samples, i.e. at temperature > 0. At temperature 0 the repeats of a problem are
expected to be identical: said, never refused (a serving path that is not deterministic still differs a little).

Before serving (power_before): with N problems and R repeats per side, a paired interval of per-problem means is
±t·σ/√N wide. Sampled answers make σ² = 2·v/R for v = the mean over problems of q(1−q) (q: a problem's chance of a
right answer, assumed the same on both sides, i.e. no true drop); v is at most 1/4 (a model near 50% on every
problem), so the statement uses that worst case and says so. The repeats that could decide the margin m in a share
`power` of runs: R = (z_c + z_power)²·2·v / (N·m²).
"""

from __future__ import annotations

import math
from typing import Annotated

from pydantic import AfterValidator, Field

from quanteval.engines.recipes import Recipe
from quanteval.workflow.paired import DEFAULT_POWER, MIN_PAIRED_ITEMS, normal_quantile, two_sided

MAX_REPEATS = 1000
WORST_VARIANCE = 0.25  # q(1-q) at q = 1/2: the most a 0/1 answer can vary


def _repeats(value: int | None) -> int | None:
    if value is not None and not 1 <= value <= MAX_REPEATS:
        raise ValueError(f"repeats {value}: give 1 to {MAX_REPEATS} samples per problem (1: one pass; 8 or more with "
                         "temperature > 0 to measure a sampled model).")
    return value


def _temperature(value: float | None) -> float | None:
    if value is not None and not 0 <= value <= 2:
        raise ValueError(f"temperature {value:g}: give 0 (greedy) to 2; a published protocol's is typically 0.6-1.0.")
    return value


def _top_p(value: float | None) -> float | None:
    if value is not None and not 0 < value <= 1:
        raise ValueError(f"top_p {value:g}: give a probability in (0, 1] (1: no nucleus cut; 0.95 is common).")
    return value


Repeats = Annotated[int | None, AfterValidator(_repeats), Field(description="Per problem and side; default: the recipe's, else 1.")]
Temperature = Annotated[float | None, AfterValidator(_temperature), Field(description="Both sides; default: the recipe's, else 0.")]
TopP = Annotated[float | None, AfterValidator(_top_p), Field(description="Both sides.")]


def protocol(recipes: dict[str, Recipe | None], repeats: int | None, temperature: float | None,
             top_p: float | None) -> tuple[int, float | None, float | None, list[str]]:
    """The sampling both sides run: the user's values where given, else the benchmark recipes' protocol (their YAML
    fragments' params.temperature/top_p, their repeats), else greedy at 1 repeat (a user's own benchmark). A recipe's
    repeats apply only to sampled answers (at temperature 0 they would be copies). Returns repeats, temperature, top_p
    and the notes saying where each came from."""
    known = {name: recipe for name, recipe in recipes.items() if recipe is not None}
    taken, notes = [], []
    if temperature is None:
        stated = {recipe.temperature for recipe in known.values() if recipe.temperature is not None}
        if len(stated) == 1:
            temperature = stated.pop()
            taken.append(f"temperature {temperature:g}")
            if top_p is None and len(tops := {r.top_p for r in known.values() if r.temperature == temperature and r.top_p}) == 1:
                top_p = tops.pop()
                taken.append(f"top_p {top_p:g}")
        elif stated:
            notes.append(f"The recipes of {', '.join(known)} state different temperatures ({', '.join(f'{t:g}' for t in sorted(stated))}): "
                         "both sides run greedy; give temperature.")
    most = max((recipe.repeats for recipe in known.values()), default=1)
    if repeats is None:
        repeats = most if sampled(temperature) else 1
        if repeats > 1:
            taken.insert(0, f"repeats {repeats}")
        elif most > 1:
            notes.append(f"The {', '.join(r.name for r in known.values() if r.repeats == most)} recipe's {most} repeats are "
                         "for sampled answers: greedy runs 1 (give temperature > 0, e.g. the model card's, to run them).")
    if taken:
        names = sorted({r.name for r in known.values() if r.repeats == repeats or r.temperature == temperature})
        notes.insert(0, f"{' and '.join([', '.join(taken[:-1]), taken[-1]] if len(taken) > 1 else taken)} from the "
                     f"{', '.join(names)} recipe, the same for both sides (give repeats/temperature/top_p to override).")
    elif not known and not any(v is not None for v in (temperature, top_p)):
        notes.append(f"Greedy (temperature 0), {repeats} repeat{'s' if repeats > 1 else ''}: quanteval knows no recipe "
                     f"for {', '.join(recipes)}.")
    return repeats, temperature, top_p, notes


def sampling_values(temperature: float | None, top_p: float | None) -> dict[str, float]:
    """The sampling a user asked for, as generation keys (only those given)."""
    return {key: value for key, value in (("temperature", temperature), ("top_p", top_p)) if value is not None}


def sampled(temperature: float | None) -> bool:
    """Whether answers vary between samples: a temperature above 0 (None is the config's greedy 0)."""
    return bool(temperature)


def repeats_note(repeats: int, temperature: float | None) -> str | None:
    """Repeats at temperature 0: identical repeats are expected and add no evidence."""
    if repeats > 1 and not sampled(temperature):
        return (f"repeats {repeats} at temperature {temperature or 0:g} (greedy): every repeat of a problem is expected to "
                "be the same answer, so the repeats add no evidence and only cost time; give temperature > 0 to sample, "
                "or repeats 1.")
    return None


def repeats_for_margin(problems: int, max_drop_points: float, confidence: float) -> int:
    """Repeats per side that decide a margin (points) over `problems` problems in a share DEFAULT_POWER of runs, if
    there is no true drop and each problem's answers vary by WORST_VARIANCE (q(1-q)) between samples."""
    z = normal_quantile(two_sided(confidence)) + normal_quantile(DEFAULT_POWER)
    return max(1, math.ceil(z * z * 2 * WORST_VARIANCE / (problems * (max_drop_points / 100) ** 2)))


def half_width_points(problems: int, repeats: int, confidence: float) -> float:
    """The paired interval's half width in points over these problems and repeats, answers varying by WORST_VARIANCE."""
    return 100 * normal_quantile(two_sided(confidence)) * math.sqrt(2 * WORST_VARIANCE / repeats / problems)


def power_before(benchmark: str, problems: int | None, repeats: int, temperature: float | None,
                 max_drop_points: float | None, confidence: float) -> str | None:
    """Whether the margin can be decided at all with this benchmark's size and the repeats asked, said before serving;
    None when there is nothing to say (no margin, or a size not known before the run)."""
    if max_drop_points is None or problems is None:
        return None
    level = f"{100 * confidence:g}%"
    if problems < MIN_PAIRED_ITEMS:
        return (f"{benchmark}: {problems} problems cannot decide any margin (a paired interval needs at least "
                f"{MIN_PAIRED_ITEMS}); give more problems (max_problems, or a larger benchmark).")
    if not sampled(temperature):
        return (f"{benchmark}: {problems} problems answered greedily: the {level} interval's width depends on how many "
                "answers the quantization flips, known after the run (the answer says how many problems would decide); "
                "repeats add nothing at temperature 0.")
    width = half_width_points(problems, repeats, confidence)
    needed = repeats_for_margin(problems, max_drop_points, confidence)
    if needed <= repeats:
        return (f"{benchmark}: {problems} problems x {repeats} repeats can decide the {max_drop_points:g}-point margin at "
                f"{level} even for a model near 50% (interval about ±{width:.1f} points at worst).")
    return (f"{benchmark}: {problems} problems x {repeats} repeat{'s' if repeats > 1 else ''} likely cannot decide the "
            f"{max_drop_points:g}-point margin at {level}: sampled answers of a model near 50% give an interval of about "
            f"±{width:.1f} points. ~{needed} repeats per side would (fewer for a model near 0% or 100%, whose answers vary "
            "less), or more problems.")


def notes_before(benchmarks: dict[str, int | None], repeats: int, temperature: float | None,
                 max_drop_points: float | None, confidence: float) -> list[str]:
    """What the sampling asked can and cannot show, said before serving: repeats that add nothing at temperature 0,
    and per benchmark whether its size (its problems, where known before the run) and the repeats can decide the margin."""
    notes = [note] if (note := repeats_note(repeats, temperature)) else []
    for benchmark, problems in benchmarks.items():
        if said := power_before(benchmark, problems, repeats, temperature, max_drop_points, confidence):
            notes.append(said)
    return notes
