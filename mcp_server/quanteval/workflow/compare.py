"""compare_results: is the candidate (quantized) run's score drop real, and is it acceptable?

Both runs are read by their engine's ResultsReader (engines.results_for_pair; runs of two engines are refused), so
one body compares every engine's runs. First the comparability checklist from the facets the reader reads from
both runs' saved configs, then per benchmark the delta and its uncertainty:

- unpaired: delta = c - b, se = sqrt(se_b^2 + se_c^2), CI = delta +/- z se;
- paired, when both runs kept per-problem results (nel-next's results.jsonl; NEL 0.2.6's per-sample outputs when
  they reproduce the headline scores): paired.paired_interval, the same interval gate_results computes.

The verdict is paired.decide's (nel gate's rule) against the user's max_drop, given in points (as are reference_scores,
whatever scale a run stores); scores are compared as fractions (percent values are divided by 100). The engine's own
paired test (nel compare's McNemar and verdict, for nel-next) is evidence beside it. The table, a PNG chart and HTML
and markdown reports are written to an output directory.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

from quanteval import paths, redact
from quanteval.engines.base import unpinned_image
from quanteval.engines.runresults import CHECK_ITEMS, PairedTest, ResultsReader, RunBenchmark, ScoreValue
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress
from quanteval.workflow import anomaly, paired, release
from quanteval.workflow import samples as samples_rule
from quanteval.workflow.comparison_report import (
    ChecklistItem,
    CompareResultsOutput,
    ReferenceCheck,
    TaskComparison,
    render_chart,
    render_html,
    render_markdown,
    table_markdown,
)
from quanteval.workflow.paired import DEFAULT_CONFIDENCE, Confidence, MaxDropPoints, ReferenceScores
from quanteval.workflow.results import RunPair, read_pair

if TYPE_CHECKING:  # inspect_checkpoint is imported only when two runs are compared
    from quanteval.serving.checkpoint import CheckpointReport
    from quanteval.serving.quantformat import QuantizationInfo


# The baseline checked against the world (anomaly.reference_check); evaluate_quantization takes the same two fields.
ReferenceTolerance = Annotated[float, Field(gt=0, description="Points the baseline may be off reference_scores.")]


class CompareResultsInput(StrictModel):
    baseline: str = Field(
        description="Reference run (e.g. unquantized): results dir, host:path or record_id."
    )
    candidate: str = Field(
        description="Run to judge (e.g. quantized), named like baseline."
    )
    max_drop: MaxDropPoints = None
    confidence: Confidence = DEFAULT_CONFIDENCE
    output_dir: str | None = Field(
        None, description="For the chart and report; default under the state dir."
    )
    baseline_checkpoint: str | None = Field(
        None, description="The baseline's checkpoint, if its run's is unreadable.",
    )
    candidate_checkpoint: str | None = Field(None, description="The same for the candidate.")
    reference_scores: ReferenceScores
    reference_tolerance: ReferenceTolerance = anomaly.REFERENCE_TOLERANCE_POINTS
    max_length_change: release.MaxLengthChange = None


# ---------------------------------------------------------------------------------------------
# Comparability checklist
# ---------------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    text = json.dumps(redact.redact_config(value), sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:297] + "..."


SAME = "(same as baseline)"


def checklist(task: str, baseline: dict[str, Any] | None, candidate: dict[str, Any] | None) -> list[ChecklistItem]:
    """One item per CHECK_ITEMS entry: same, different, or unknown (not readable for one of the runs — never 'same')."""
    items = []
    for item in CHECK_ITEMS:
        if baseline is None or candidate is None:
            items.append(ChecklistItem(task=task, item=item, status="unknown",
                                       baseline="no run_config.yml" if baseline is None else _short(baseline[item]),
                                       candidate="no run_config.yml" if candidate is None else _short(candidate[item])))
            continue
        b, c = baseline[item], candidate[item]
        if item == "container" and isinstance(b, dict) and isinstance(c, dict):
            # a harness fact recorded for one run only (NeMo-Skills, recorded where a run starts here and not on a
            # cluster) says nothing of the other: compared where both have it
            b, c = {k: v for k, v in b.items() if k in c}, {k: v for k, v in c.items() if k in b}
        status = "unknown" if b is None or c is None else "same" if b == c else "different"
        if item == "serving" and status == "same" and _unpinned_serving(b):
            items.append(ChecklistItem(task=task, item=item, status="unknown", baseline=_short(b),
                                       candidate=f"{SAME}; but image {b['image']} is unpinned (latest): not provably the same serving"))
            continue
        # a matching value is shown once, to keep the result short
        items.append(ChecklistItem(task=task, item=item, status=status, baseline="not readable here" if b is None else _short(b),
                                   candidate=SAME if status == "same" else "not readable here" if c is None else _short(c)))
    return items


def _unpinned_serving(serving: Any) -> bool:
    """Both runs name the same serving image, but `latest` (or no tag): the image may have moved between the runs."""
    return isinstance(serving, dict) and unpinned_image(serving.get("image"))


def _what_differs(b: str, c: str) -> str:
    """The keys whose values differ, when both sides are JSON objects: names the difference instead of dumping both."""
    try:
        left, right = json.loads(b), json.loads(c)
    except ValueError:
        return ""
    if not isinstance(left, dict) or not isinstance(right, dict):
        return ""
    keys = sorted(k for k in set(left) | set(right) if left.get(k) != right.get(k))
    return f" [{', '.join(keys)}]" if keys else ""


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------


def _as_fraction(score: ScoreValue) -> tuple[float, float | None]:
    factor = 0.01 if score.scale == "percent" else 1.0
    return score.value * factor, None if score.stderr is None else score.stderr * factor


def reference_check(task: str, scale: str, baseline: float, request: CompareResultsInput) -> ReferenceCheck:
    """The baseline (a fraction) against the user's published score for the task, given in points whatever scale the
    run stores (the input refused one that reads as a fraction before anything ran)."""
    given = request.reference_scores.get(task)
    if given is None:
        status, message = anomaly.reference_check(task, baseline, None, request.reference_tolerance)
        return ReferenceCheck(status=status, message=message)
    if scale == "unknown":
        return ReferenceCheck(status="unverified", message=f"{task}: its scale is neither 0-1 nor 0-100, so the "
                              "published score is not checked.")
    reference = given / 100
    status, message = anomaly.reference_check(task, baseline, reference, request.reference_tolerance)
    return ReferenceCheck(status=status, reference=reference, message=message)


def margin(request: CompareResultsInput) -> float | None:
    """The user's max_drop (points) as the fraction the statistics work on."""
    return None if request.max_drop is None else request.max_drop / 100


def _verdict_and_advice(interval: paired.PairedInterval | None, low: float | None, high: float | None,
                        request: CompareResultsInput) -> tuple[str, str]:
    verdict, why = paired.decide(low, high, margin(request), request.confidence)
    if verdict == "inconclusive" and interval is not None:
        why += ". " + paired.advice(interval, margin(request))
    return verdict, why


def compare_task(reader: ResultsReader, base: RunBenchmark, cand: RunBenchmark, base_score: ScoreValue,
                 cand_score: ScoreValue, request: CompareResultsInput, reasons: list[str]) -> TaskComparison:
    """One score of one benchmark: the paired interval over the problems both runs kept (gate_results' interval),
    else the unpaired one from the scores' stderrs; the verdict by the rule; the engine's own paired test as evidence."""
    b, b_se = _as_fraction(base_score)
    c, c_se = _as_fraction(cand_score)
    delta = c - b
    z = paired.normal_quantile(paired.two_sided(request.confidence))
    se = math.sqrt(b_se**2 + c_se**2) if b_se is not None and c_se is not None else None
    low, high = (delta - z * se, delta + z * se) if se is not None else (None, None)
    method = f"unpaired: se = sqrt(se_b^2 + se_c^2), CI = delta +/- {z:.2f} se"
    test = reader.paired_test(base, cand, margin(request))
    (base_values, base_why), (cand_values, cand_why) = reader.paired_values(base, base_score), reader.paired_values(cand, cand_score)
    interval, samples, repeats, within, size = None, None, None, None, ""
    if base_values and cand_values and base.problems is not None:
        sample_account = samples_rule.account(base.name, base.problems, cand.problems, base_values, cand_values,
                                              request.confidence)
        samples = sample_account.status
        reasons.extend(sample_account.notes)
        interval = paired.paired_interval(sample_account.kept(base_values), sample_account.kept(cand_values),
                                          base.problems.categories, request.confidence)
        if interval is not None and interval.n >= 2:
            b, c, delta, low, high = interval.baseline, interval.candidate, interval.delta, interval.low, interval.high
            se = interval.spread * math.sqrt(interval.n / (interval.n - 1)) / math.sqrt(interval.n)
            unit = base.problems.unit
            repeats, within = _repeats(base.problems.rewards, cand.problems.rewards if cand.problems else {},
                                       sample_account.kept(base_values))
            per = f", {repeats} repeats each averaged per {unit}" if repeats and repeats > 1 else ""
            size = f"{interval.n} {unit}s" + (f" x {repeats} repeats" if repeats and repeats > 1 else "")
            method = (f"paired over {interval.n} shared {unit}s{per}: {100 * request.confidence:g}% CI by Student t on "
                      f"the per-{unit} deltas (as nel gate)") + (f"; {test.test} exact test as nel compare" if test else "")
        else:
            interval = None
    if interval is None and (why_not := base_why or cand_why):
        method += f" ({why_not})"
    verdict, why = _verdict_and_advice(interval, low, high, request)
    if interval is not None and se is not None:
        # A sentence of its own: the advice before it is quoted whole by gate_results.
        why += (" " if why.endswith(".") else "; ") + f"delta {100 * delta:+.2f} ± {100 * se:.2f} points (SE) over {size}"
        if verdict == "inconclusive" and repeats is not None:
            why += paired.repeats_advice(interval, repeats, within, margin(request))
    if samples is not None and samples.counted_as_wrong is not None:
        why += "; " + samples_rule.counted_as_wrong_note(*samples.counted_as_wrong)
    if test is not None and test.p_value is not None:
        why += f"; nel compare: {test.verdict} ({test.test} p={test.p_value:.3g})"
    if samples is not None and sample_account.refusal:
        reasons.append(sample_account.refusal)
        verdict = "inconclusive"
    return TaskComparison(
        task=base.name, metric=base_score.metric, score=base_score.score, scale=base_score.scale, baseline=b, candidate=c,
        baseline_stderr=b_se, candidate_stderr=c_se, delta=delta, delta_stderr=se, ci_low=low, ci_high=high,
        method=method, verdict=verdict, why=why, reference_check=reference_check(base.name, base_score.scale, b, request),
        samples=samples, repeats=repeats, **_test_fields(test))


def _repeats(base: dict[Any, list[float]], cand: dict[Any, list[float]], kept: dict[Any, float]) -> tuple[int | None, float | None]:
    """The repeats per problem of the paired problems (the fewer of the two sides' most common count) and the per-problem
    delta's variance that comes from sampling (paired.sampling_variance; None with one repeat)."""
    problems = [p for p in kept if p in base and p in cand]
    if not problems:
        return None, None
    counts = [min(len(base[p]), len(cand[p])) for p in problems]
    repeats = max(set(counts), key=counts.count)
    return repeats, paired.sampling_variance(base, cand, problems)


def _test_fields(test: PairedTest | None) -> dict[str, Any]:
    """The engine's paired test as the row's fields (none without one)."""
    if test is None:
        return {}
    return {"test": test.test, "p_value": test.p_value, "n_paired": test.n_paired, "n_regressions": test.n_regressions,
            "n_improvements": test.n_improvements, "nel_verdict": test.verdict, "regressed": test.regressed,
            "improved": test.improved}


# ---------------------------------------------------------------------------------------------
# The tool
# ---------------------------------------------------------------------------------------------


def comparability_verdict(items: list[ChecklistItem]) -> tuple[str, list[str]]:
    """not comparable on any difference (naming the keys), inconclusive on anything unknown, else comparable."""
    different = [i for i in items if i.status == "different"]
    unknown = [i for i in items if i.status == "unknown"]
    if different:
        return "not comparable", [
            f"{i.task}: {i.item} differs{_what_differs(i.baseline, i.candidate)} (baseline {i.baseline}, candidate {i.candidate})."
            for i in different[:20]
        ]
    if not unknown and items:
        return "comparable", []
    reasons = [f"{i.task}: {i.item} could not be checked ({i.baseline} / {i.candidate})." for i in unknown[:20]]
    if any(i.item == "model" for i in unknown):
        reasons.append("The model family needs both checkpoints readable here: pass baseline_checkpoint / candidate_checkpoint "
                       "(local copies or cached HF handles).")
    if not items:
        reasons.append("No task is present in both runs.")
    return "inconclusive", reasons


def compare_results(request: CompareResultsInput, progress: ProgressFn = no_progress, runs: RunPair | None = None) -> CompareResultsOutput:
    """Use once both runs passed validate_run: comparability, per-task delta with its paired CI, a verdict against
    max_drop, a chart and a report."""
    progress(0, 3, "reading both runs")
    reader, base_run, cand_run = runs or read_pair(request.baseline, request.candidate)
    reasons: list[str] = list(dict.fromkeys(base_run.warnings + cand_run.warnings))
    items: list[ChecklistItem] = []
    rows: list[TaskComparison] = []
    output_checks: list[release.OutputCheck] = []
    for name in sorted(set(base_run.benchmarks) | set(cand_run.benchmarks)):
        if name not in base_run.benchmarks or name not in cand_run.benchmarks:
            missing = "baseline" if name not in base_run.benchmarks else "candidate"
            reasons.append(f"{name}: only one run has it (missing in the {missing}); it is not compared.")
            continue
        base, cand = base_run.benchmarks[name], cand_run.benchmarks[name]
        items += checklist(name, reader.facets(base_run, base, request.baseline_checkpoint),
                           reader.facets(cand_run, cand, request.candidate_checkpoint))
        output_checks.append(release.check(name, reader.outputs(base_run, base), reader.outputs(cand_run, cand),
                                           request.max_length_change))
        pairs = reader.compared_scores(base, cand)
        if not pairs:
            reasons.append(f"{name}: not compared: {base.scores.problem or cand.scores.problem or 'the runs share no score'}")
        for base_score, cand_score in pairs:
            if base_score.scale != cand_score.scale:
                reasons.append(f"{name}: {base_score.metric}.{base_score.score} is {base_score.scale} in the baseline and "
                               f"{cand_score.scale} in the candidate; not compared.")
                continue
            rows.append(compare_task(reader, base, cand, base_score, cand_score, request, reasons))
    progress(1, 3, "statistics done")
    if unmatched := sorted(set(request.reference_scores) - {row.task for row in rows}):
        reasons.append(f"reference_scores: {', '.join(unmatched)} name no compared benchmark (compared: "
                       f"{', '.join(sorted({row.task for row in rows})) or 'none'}).")
    # each checkpoint read once: the user's, else the one its engine recorded with the run
    cand_report = _report(request.candidate_checkpoint or reader.served_checkpoint(cand_run)) if rows else None
    base_report = _report(request.baseline_checkpoint or reader.served_checkpoint(base_run)) if rows else None
    cand_quant, unquantized = _quantization_of(cand_report)
    _flag_anomalies(rows, cand_quant, unquantized)
    if rows and (kv_cache := _kv_difference(_quantization_of(base_report)[0], cand_quant)):
        reasons.append(kv_cache)
    _copies_counted_once(rows, output_checks)
    weights = _weights_bought(base_report, cand_report)
    comparability, why_not = comparability_verdict(items)
    reasons += why_not
    acceptability, blocked = release.verdict_after(_acceptability(comparability, rows, reasons), output_checks, weights)
    reasons += blocked + [finding for check in output_checks for finding in check.findings]
    reasons += [weights.message] if weights else []  # SIZE_NOT_REDUCED named whatever the accuracy says
    reasons += [f"{row.task}: {f'{row.nel_verdict} ({row.verdict})' if row.nel_verdict else row.verdict}: {row.why.rstrip('.')}." for row in rows]
    output_dir = _output_dir(request)
    chart = render_chart(rows, margin(request), output_checks, weights) if rows else None
    png = paths.write_file(output_dir / "comparison.png", chart) if chart is not None else None
    progress(2, 3, "chart written")
    output = CompareResultsOutput(comparability=comparability, acceptability=acceptability, reasons=list(dict.fromkeys(reasons)), checklist=items,
                                  comparisons=rows, table_markdown=table_markdown(rows), chart_png=str(png) if png else None,
                                  report_html=None, outputs=output_checks, weights=weights)
    report, markdown = output_dir / "report.html", output_dir / "report.md"
    report = paths.write_file(report, render_html(output, base_run.label, cand_run.label, chart))
    markdown = paths.write_file(markdown, render_markdown(output, base_run.label, cand_run.label, png))
    output.report_html, output.report_markdown = str(report), str(markdown)
    return output


def _acceptability(comparability: str, rows: list[TaskComparison], reasons: list[str]) -> str:
    """One verdict from the per-task ones (both engines): suspect, then not acceptable, then inconclusive, win."""
    verdicts = {row.verdict for row in rows}
    if comparability != "comparable":
        reasons.append("Acceptability is inconclusive because the runs are not known to be comparable.")
        return "inconclusive"
    for verdict in ("suspect", "not acceptable", "inconclusive"):
        if verdict in verdicts:
            return verdict
    return "acceptable" if rows else "inconclusive"


def _report(checkpoint: str | None) -> CheckpointReport | None:
    """inspect_checkpoint's report of a checkpoint readable here, else None."""
    from quanteval.serving.checkpoint import InspectCheckpointInput, inspect_checkpoint

    if not checkpoint:
        return None
    try:
        return inspect_checkpoint(InspectCheckpointInput(checkpoint=checkpoint))
    except ToolError:
        return None


def _quantization_of(report: CheckpointReport | None) -> tuple[QuantizationInfo | None, bool]:
    """The checkpoint's quantization facts, and whether it carries no quantization at all (a candidate that is not
    quantized); (None, False) when there is none to read here."""
    from quanteval.serving.checkpoint import carries_no_quantization

    if report is None:
        return None, False
    return report.quantization, carries_no_quantization(report)


def _weights_bought(baseline: CheckpointReport | None, candidate: CheckpointReport | None) -> release.WeightsBought | None:
    """Weight bytes on disk per side (inspect_checkpoint's), SIZE_NOT_REDUCED named; None unless both are readable."""
    from quanteval.serving.checkpoint import carries_no_quantization

    if baseline is None or candidate is None:
        return None
    if Path(baseline.checkpoint).resolve() == Path(candidate.checkpoint).resolve():
        return None  # one checkpoint against itself (a repeatability or serving check): no size question to answer
    dequantized = not candidate.quantization.detected and candidate.weights.row_values is not None \
        and candidate.weights.row_values[0] > 1 and not carries_no_quantization(candidate)
    return release.weights_bought(baseline.weights.size_bytes, candidate.weights.size_bytes, dequantized)


def _copies_counted_once(rows: list[TaskComparison], checks: list[release.OutputCheck]) -> None:
    """Repeats that are copies are one sample per problem, not independent evidence."""
    copied = {check.task: check.copies for check in checks if check.copies}
    for row in rows:
        if row.task in copied and row.repeats and row.repeats > 1:
            row.why += (f"; the {' and '.join(copied[row.task])}'s {row.repeats} repeats are copies: counted as 1 "
                        "sample per problem")
            row.repeats = 1


def _kv_cache(quant: QuantizationInfo | None) -> str | None:
    """A KV-cache precision as people name it (16-bit, FP8, NVFP4); None when the checkpoint is not readable here."""
    if quant is None:
        return None
    return str(quant.kv_cache_quant_algo).upper() if quant.kv_cache is not None else "16-bit"


def _kv_difference(baseline: QuantizationInfo | None, candidate: QuantizationInfo | None) -> str | None:
    """A KV cache quantized in one checkpoint and not (or otherwise) in the other, named: the server follows each
    checkpoint's KV cache (plan_deployment and apply_checkpoint pass --kv-cache-dtype), so part of the delta is the KV
    cache's, not the weights'. The runs stay comparable: the KV cache is part of what was quantized. None when both
    agree or one is not readable here."""
    base, cand = _kv_cache(baseline), _kv_cache(candidate)
    if base is None or cand is None or base == cand:
        return None
    return (f"KV cache: the baseline's is {base}, the candidate's {cand}: part of the delta is the KV cache (it shows "
            "most on long contexts), not the weights alone.")


def _flag_anomalies(rows: list[TaskComparison], quant: QuantizationInfo | None, unquantized: bool) -> None:
    """Drops too large to be quantization for the candidate's weight bits (or from a candidate with none), and
    baselines off their published score (anomaly.py), become 'suspect', never a quantization loss or an acceptable one."""
    bits = quant.weights.bits if quant and quant.weights else None  # None: not readable, or undetected (dequantized)
    for row in rows:
        row.anomaly = anomaly.anomaly(row.task, row.baseline, row.candidate, bits, unquantized)
        failed = row.reference_check.message if row.reference_check.status == "failed" else None
        if found := [message for message in (failed, row.anomaly) if message]:
            row.verdict, row.why = "suspect", " ".join(found)


def _output_dir(request: CompareResultsInput) -> Path:
    output_dir = Path(request.output_dir).expanduser() if request.output_dir else paths.call_state_dir() / "comparisons" / time.strftime("%Y%m%d-%H%M%S")
    return paths.make_dir(output_dir, "output_dir")
