"""No sample silently scored as wrong: what each verdict makes of the problems whose records say more than a reward.

Per problem and side the engine's reader says (engines/runresults.Problems): scored, unscored (an answer came back and
the grader extracted nothing from it) or an infrastructure error (timeout, HTTP error, empty reply, a crash in the
benchmark). compare_results and gate_results both apply one rule:

- a pair with an infrastructure error on either side is dropped from the paired interval, and the answer says how many:
  a request that never got an answer says nothing about the checkpoint;
- nel gate and nel compare count those problems as wrong answers; where that moves the number, the answer shows theirs
  beside ours (the same interval over every pair);
- unscored answers stay failures of the model (a quantized model that rambles past the answer format lost accuracy),
  named separately per side;
- above MAX_INFRA_SHARE of the pairs, no verdict: the run measured its serving more than its model;
- records that cannot tell an error from an answer (NEL 0.2.6's, or a run without scoring details) make the check
  impossible, and the answer says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from quanteval.engines.runresults import Problems
from quanteval.workflow import paired

MAX_INFRA_SHARE = 0.05  # of the paired problems; above it a verdict would weigh the serving, not the model


class SampleStatus(BaseModel):
    """What happened to the problems of one benchmark in both runs, besides their rewards."""

    checked: bool = Field(description="false: the records cannot tell an infrastructure error from a wrong answer.")
    baseline_infra_errors: int = Field(0, description="Problems whose request got no answer (timeout, HTTP error, crash).")
    candidate_infra_errors: int = 0
    baseline_unscored: int = Field(0, description="Problems answered with nothing the grader could extract: counted wrong.")
    candidate_unscored: int = 0
    excluded_pairs: int = Field(0, description="Pairs dropped from the paired interval: an infrastructure error on either side.")
    counted_as_wrong: list[float | None] | None = Field(None, description=(
        "nel gate's number where it differs: [delta, ci_low, ci_high] (fractions) over every pair, errors counted wrong."))


@dataclass
class SampleAccount:
    status: SampleStatus
    excluded: set[Any]  # the problems dropped from the pairing
    notes: list[str]  # what the answer says about them, in order
    refusal: str | None  # why no verdict can be given, when infrastructure errors exceed the share

    def kept(self, values: dict[Any, float]) -> dict[Any, float]:
        return {problem: value for problem, value in values.items() if problem not in self.excluded}


def account(name: str, base: Problems | None, cand: Problems | None, base_values: dict[Any, float],
            cand_values: dict[Any, float], confidence: float) -> SampleAccount:
    """The rule above for one benchmark of two runs, given each problem's paired value; with pairs dropped, nel gate's
    interval over every pair (status.counted_as_wrong) at the same confidence."""
    base, cand = base or Problems(rewards={}), cand or Problems(rewards={})
    paired_problems = len(set(base_values) & set(cand_values))
    unknown = base.status_unknown or cand.status_unknown
    status = SampleStatus(checked=unknown is None, baseline_infra_errors=len(base.infra_errors),
                          candidate_infra_errors=len(cand.infra_errors), baseline_unscored=len(base.unscored),
                          candidate_unscored=len(cand.unscored))
    notes: list[str] = []
    if unknown:
        notes.append(f"{name}: infrastructure errors not checked: {unknown}.")
    shared = set(base.rewards) & set(cand.rewards)
    excluded = (base.infra_errors | cand.infra_errors) & shared
    status.excluded_pairs = len(excluded)
    refusal = None
    if excluded:
        if every_pair := paired.paired_interval(base_values, cand_values, base.categories, confidence):
            status.counted_as_wrong = [every_pair.delta, every_pair.low, every_pair.high]
        notes.append(f"{name}: {len(excluded)} of {paired_problems} pair(s) dropped from the paired interval: the request "
                     f"got no answer (infrastructure error) in the candidate on {status.candidate_infra_errors}, the "
                     f"baseline on {status.baseline_infra_errors}; resume_run re-runs them.")
        share = len(excluded) / max(paired_problems, 1)
        if share > MAX_INFRA_SHARE:
            refusal = (f"{name}: infrastructure errors on {len(excluded)} of {paired_problems} pairs ({100 * share:.0f}%, "
                       f"over {100 * MAX_INFRA_SHARE:g}%): no verdict until they are re-run (resume_run), as the run "
                       "measured its serving more than the checkpoint.")
    if status.baseline_unscored or status.candidate_unscored:
        notes.append(f"{name}: the candidate produced no parseable answer on {status.candidate_unscored} problem(s), "
                     f"the baseline on {status.baseline_unscored}; counted as wrong (the model's answers).")
    return SampleAccount(status=status, excluded=excluded, notes=notes, refusal=refusal)


def counted_as_wrong_note(delta: float, low: float | None, high: float | None) -> str:
    """nel gate's number beside ours, and why they differ."""
    span = "" if low is None or high is None else f", CI [{100 * low:+.2f}, {100 * high:+.2f}]"
    return (f"nel gate/nel compare count the dropped pairs as wrong answers: delta {100 * delta:+.2f} points{span} "
            "(a request that got no answer says nothing about the checkpoint, so this verdict leaves them out)")
