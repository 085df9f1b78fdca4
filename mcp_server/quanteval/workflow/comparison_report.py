"""What compare_results answers (its output models) and its table, chart and reports (HTML, markdown), from the rows
compare.py computed."""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from quanteval.engines.runresults import Flip
from quanteval.workflow.release import OutputCheck, WeightsBought
from quanteval.workflow.samples import SampleStatus


class ChecklistItem(BaseModel):
    task: str
    item: str = Field(description="One of CHECK_ITEMS: model, serving, task, container, prompts, extra_args, generation, reasoning, repeats, samples, judge.")
    status: Literal["same", "different", "unknown"] = Field(description="unknown: could not be read for one run, so the runs are not known to match.")
    baseline: str = Field(description="The baseline's value (JSON, at most 300 characters).")
    candidate: str


class ReferenceCheck(BaseModel):
    status: Literal["verified", "failed", "unverified"] = Field(description=(
        "The baseline against its published score: within the tolerance, outside it (then suspect), or none given."))
    reference: float | None = Field(None, description="The published score, as a fraction.")
    message: str


class TaskComparison(BaseModel):
    task: str
    metric: str
    score: str
    scale: str = Field(description="The stored scale of both scores; values below are fractions (0-1).")
    baseline: float
    candidate: float
    baseline_stderr: float | None
    candidate_stderr: float | None
    delta: float = Field(description="candidate - baseline, as a fraction.")
    delta_stderr: float | None
    ci_low: float | None = Field(description="Confidence interval of delta (at the request's confidence), low end.")
    ci_high: float | None
    method: str = Field(description="How the interval was computed (paired per problem as nel gate does, or unpaired from stderrs).")
    verdict: Literal["acceptable", "not acceptable", "inconclusive", "suspect"]
    why: str
    reference_check: ReferenceCheck
    # Per-problem pairing (nel-next runs keep every problem's reward): what `nel compare` reports on the same runs.
    test: str | None = Field(None, description="mcnemar (0/1 rewards, exact one-sided binomial) or sign (averaged repeats).")
    p_value: float | None = Field(None, description="One-sided p of 'candidate is worse'.")
    n_paired: int | None = None
    n_regressions: int | None = Field(None, description="Problems right in the baseline, wrong in the candidate.")
    n_improvements: int | None = None
    nel_verdict: str | None = Field(None, description="PASS / WARN / BLOCK / INCONCLUSIVE by nel compare's rule (evidence; "
                                    "max_drop as its --max-drop, else its default 5 points).")
    regressed: list[Flip] = Field(default_factory=list, description="First flips to wrong, with both answers.")
    improved: list[Flip] = Field(default_factory=list)
    anomaly: str | None = Field(None, description="Set when the drop looks like a serving or kernel problem rather "
                                "than quantization; the verdict is then 'suspect'.")
    samples: SampleStatus | None = Field(None, description="Infrastructure errors (left out of the pairing) and unscored "
                                         "answers (counted wrong) per side; null without per-problem results.")
    repeats: int | None = Field(None, description="Samples per problem on each side, averaged per problem before pairing; "
                                "null without per-problem results.")


class CompareResultsOutput(BaseModel):
    comparability: Literal["comparable", "not comparable", "inconclusive"]
    acceptability: Literal["acceptable", "not acceptable", "inconclusive", "suspect"] = Field(description=(
        "suspect: a drop too large to be quantization, or a baseline off its published score: check the serving first."))
    reasons: list[str] = Field(description="What decided the two verdicts.")
    checklist: list[ChecklistItem]
    comparisons: list[TaskComparison]
    table_markdown: str
    chart_png: str | None = Field(description="Path of the PNG chart (scores with error bars, deltas with CIs).")
    report_html: str | None = Field(description="Path of the self-contained HTML report.")
    report_markdown: str | None = Field(None, description="Path of the markdown report (same content as the HTML).")
    outputs: list[OutputCheck] = Field(default_factory=list, description=(
        "Per benchmark and side: completion tokens, truncated and failed responses with their denominators, speed; "
        "the release rules' findings."))
    weights: WeightsBought | None = Field(None, description="Weight bytes on disk per side; SIZE_NOT_REDUCED named.")



Z95 = 1.959964  # two-sided 95% normal quantile: the scores' error bars in the chart


def _points(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}"


def table_markdown(rows: list[TaskComparison]) -> str:
    """One row per compared score; with the engine's paired test (nel compare's) where the rows carry one."""
    if any(r.nel_verdict for r in rows):
        return _tested_table_markdown(rows)
    lines = [
        "| task | metric | baseline | candidate | delta (pts) | CI (pts) | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = f"{_points(r.baseline)} ± {_points(r.baseline_stderr)}"
        cand = f"{_points(r.candidate)} ± {_points(r.candidate_stderr)}"
        ci = "n/a" if r.ci_low is None else f"[{100 * r.ci_low:+.2f}, {100 * r.ci_high:+.2f}]"
        lines.append(f"| {r.task} | {r.metric}.{r.score} | {base} | {cand} | {100 * r.delta:+.2f} | {ci} | {r.verdict} |")
    return "\n".join(lines)


class ChartPanel(BaseModel):
    """One panel of the report's chart, the data it is drawn from: per labelled row, each side's value."""
    title: str
    xlabel: str
    labels: list[str]
    baseline: list[float | None]
    candidate: list[float | None]
    notes: list[str] = Field(default_factory=list, description="Per row: the text written beside it.")
    bands: list[float | None] = Field(default_factory=list, description="Delta panel: per row, the half width (points) "
                                      "of the serving noise band drawn around zero; None where no noise floor was measured.")


def noise_bands(floor: list) -> dict[str, float]:
    """Per benchmark with a measured noise floor: how far serving alone moved the baseline, in points either way (the
    serving interval's farther end, else its delta): the band drawn around zero on the delta panel."""
    bands = {}
    for row in floor:
        ends = [v for v in (row.serving_ci_low, row.serving_ci_high) if v is not None] or [row.serving_delta]
        bands[row.task] = 100 * max(abs(v) for v in ends)
    return bands


def _share(share) -> str:
    return "unverified" if share.count is None or not share.of else f"{100 * share.count / share.of:.1f}%"


def chart_panels(rows: list[TaskComparison], outputs: list[OutputCheck] | None = None, weights: WeightsBought | None = None,
                 noise: dict[str, float] | None = None) -> list[ChartPanel]:
    """The chart's panels and their data: scores, deltas (with the serving noise band where measured), answers' length
    and truncation (where a side recorded token counts), size and speed (where weight bytes or tokens/s exist)."""
    labels = [r.task if r.score == r.metric else f"{r.task}\n{r.metric}.{r.score}" for r in rows]
    panels = [
        ChartPanel(title="Scores", xlabel="score (points, 0-100) with 95% error bars", labels=labels,
                   baseline=[100 * r.baseline for r in rows], candidate=[100 * r.candidate for r in rows]),
        ChartPanel(title="Delta", xlabel="candidate - baseline (points) with its CI", labels=labels,
                   baseline=[None] * len(rows), candidate=[100 * r.delta for r in rows],
                   bands=[(noise or {}).get(r.task) for r in rows]),
    ]
    sided = [c for c in outputs or [] if any(side and side.mean_completion_tokens is not None for side in (c.baseline, c.candidate))]
    if sided:
        panels.append(ChartPanel(
            title="Length and truncation", xlabel="mean completion tokens per answer", labels=[c.task for c in sided],
            baseline=[c.baseline.mean_completion_tokens if c.baseline else None for c in sided],
            candidate=[c.candidate.mean_completion_tokens if c.candidate else None for c in sided],
            notes=[f"truncated {_share(c.baseline.truncated) if c.baseline else 'unverified'} / "
                   f"{_share(c.candidate.truncated) if c.candidate else 'unverified'}" for c in sided]))
    size_labels, base, cand, notes, measured = [], [], [], [], None
    if weights and weights.baseline_bytes and weights.candidate_bytes:
        size_labels.append("weights on disk")
        base.append(1.0)
        cand.append(weights.candidate_bytes / weights.baseline_bytes)
        notes.append(f"{weights.baseline_bytes / 1e9:.3g} GB -> {weights.candidate_bytes / 1e9:.3g} GB")
    for c in outputs or []:
        if c.baseline and c.candidate and c.baseline.tokens_per_second and c.candidate.tokens_per_second:
            size_labels.append(f"{c.task} tokens/s")
            base.append(1.0)
            cand.append(c.candidate.tokens_per_second / c.baseline.tokens_per_second)
            notes.append(f"{c.baseline.tokens_per_second:g} -> {c.candidate.tokens_per_second:g} tokens/s")
            measured = measured or c.candidate.measured_on
    if size_labels:
        panels.append(ChartPanel(title="Size and speed", labels=size_labels, baseline=base, candidate=cand, notes=notes,
                                 xlabel="relative to the baseline (= 1)" + (f"\nspeed {measured}" if measured else "")))
    return panels


def render_chart(rows: list[TaskComparison], threshold: float | None, outputs: list[OutputCheck] | None = None,
                 weights: WeightsBought | None = None, noise: dict[str, float] | None = None) -> bytes:
    """The chart as PNG bytes, drawn from chart_panels. Top left: both runs' scores with 95% error bars. Top right:
    deltas with their CIs, zero and -max_drop lines, the serving noise band around zero where measured. Below, where
    the data exist: answers' length and truncation per side; size and speed relative to the baseline."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    panels = chart_panels(rows, outputs, weights, noise)
    extra = panels[2:]
    labels = panels[0].labels
    y = np.arange(len(rows))
    height = max(2.8, 0.7 * len(rows) + 1.6)
    lower_height = max((max(2.4, 0.6 * len(p.labels) + 1.4) for p in extra), default=0)
    fig = plt.figure(figsize=(12, height + lower_height))
    grid = fig.add_gridspec(2 if extra else 1, 2, width_ratios=[3, 2],
                            height_ratios=[height, lower_height] if extra else [height])
    scores_ax = fig.add_subplot(grid[0, 0])
    delta_ax = fig.add_subplot(grid[0, 1], sharey=scores_ax)

    def err(values: list[float | None]) -> list[float]:
        # NaN draws no error bar at all: a zero-width bar would claim a precision nobody measured
        return [math.nan if v is None else 100 * Z95 * v for v in values]

    bar = 0.38
    scores_ax.barh(y - bar / 2, [100 * r.baseline for r in rows], bar, xerr=err([r.baseline_stderr for r in rows]),
                   label="baseline", color="#4c72b0", capsize=4)
    scores_ax.barh(y + bar / 2, [100 * r.candidate for r in rows], bar, xerr=err([r.candidate_stderr for r in rows]),
                   label="candidate", color="#dd8452", capsize=4)
    for row, pos in zip(rows, y, strict=True):
        for value, stderr, offset in ((row.baseline, row.baseline_stderr, -bar / 2), (row.candidate, row.candidate_stderr, bar / 2)):
            # the label sits past the error bar so the two never overlap
            scores_ax.text(100 * value + (0 if stderr is None else err([stderr])[0]) + 1, pos + offset, f"{100 * value:.1f}", va="center", fontsize=8)
    scores_ax.set_yticks(y, labels)
    scores_ax.invert_yaxis()
    scores_ax.set_xlim(0, max(100.0, max(100 * max(r.baseline, r.candidate) for r in rows)) * 1.12)
    scores_ax.set_xlabel(panels[0].xlabel)
    scores_ax.set_title(panels[0].title, loc="left")
    scores_ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False)
    scores_ax.grid(axis="x", alpha=0.3)

    colours = {"acceptable": "#55a868", "not acceptable": "#c44e52", "inconclusive": "#8c8c8c", "suspect": "#dd8452"}
    banded = False
    for row, pos, band in zip(rows, y, panels[1].bands, strict=True):
        if band is not None:  # how far serving alone moved the baseline: a delta inside it is not told from noise
            delta_ax.fill_betweenx([pos - 0.4, pos + 0.4], -band, band, color="#8c8c8c", alpha=0.25, linewidth=0,
                                   label=None if banded else "serving noise")
            banded = True
        lower = None if row.ci_low is None else 100 * (row.delta - row.ci_low)
        upper = None if row.ci_high is None else 100 * (row.ci_high - row.delta)
        xerr = None if lower is None else [[lower], [upper]]
        delta_ax.errorbar([100 * row.delta], [pos], xerr=xerr, fmt="o", color=colours[row.verdict], capsize=5, markersize=7)
        note = ", paired" if row.method.startswith("paired") else ", no stderr: no CI" if row.ci_low is None else ""
        delta_ax.annotate(f"{100 * row.delta:+.2f} ({row.verdict}{note})", (100 * row.delta, pos), textcoords="offset points",
                          xytext=(0, 9), ha="center", fontsize=8, bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
    delta_ax.axvline(0, color="black", linewidth=0.8)
    if threshold is not None:
        delta_ax.axvline(-100 * threshold, color="#c44e52", linestyle="--", linewidth=1, label=f"-max_drop ({-100 * threshold:.2f})")
    if threshold is not None or banded:
        delta_ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False, ncol=2)
    span = [abs(100 * v) for r in rows for v in (r.delta, r.ci_low, r.ci_high) if v is not None]
    span += [band for band in panels[1].bands if band is not None]
    limit = max(span + [100 * threshold if threshold else 0.5]) * 1.6
    delta_ax.set_xlim(-limit, limit)
    delta_ax.set_ylim(len(rows) - 0.5, -0.5)
    delta_ax.tick_params(labelleft=False)
    delta_ax.set_xlabel(panels[1].xlabel)
    delta_ax.set_title(panels[1].title, loc="left")
    delta_ax.grid(axis="x", alpha=0.3)
    for column, panel in enumerate(extra):
        ax = fig.add_subplot(grid[1, column])
        at = np.arange(len(panel.labels))
        ax.barh(at - bar / 2, [math.nan if v is None else v for v in panel.baseline], bar, label="baseline", color="#4c72b0")
        ax.barh(at + bar / 2, [math.nan if v is None else v for v in panel.candidate], bar, label="candidate", color="#dd8452")
        for pos, value in zip(at, panel.candidate, strict=True):
            if value is not None:
                ax.text(value, pos + bar / 2, f" {value:.3g}", va="center", fontsize=8)
        ax.set_yticks(at, [f"{label}\n{note}" if note else label
                           for label, note in zip(panel.labels, panel.notes or [""] * len(at), strict=True)], fontsize=8)
        ax.set_xlim(0, max([v for v in (*panel.baseline, *panel.candidate) if v is not None] + [1e-9]) * 1.15)
        ax.invert_yaxis()
        ax.set_xlabel(panel.xlabel)
        ax.set_title(panel.title, loc="left")
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=110)
    plt.close(fig)
    return png.getvalue()


def redraw_with_noise(output: CompareResultsOutput, threshold: float | None, floor: list) -> None:
    """compare_results' chart drawn again with the serving noise band (measured after it ran), in its PNG and in the
    HTML report that embeds it."""
    if not output.chart_png or not floor:
        return
    chart = render_chart(output.comparisons, threshold, output.outputs, output.weights, noise_bands(floor))
    old = Path(output.chart_png).read_bytes()
    Path(output.chart_png).write_bytes(chart)
    if output.report_html and Path(output.report_html).is_file():
        page = Path(output.report_html).read_text(encoding="utf-8")
        Path(output.report_html).write_text(page.replace(base64.b64encode(old).decode(), base64.b64encode(chart).decode()),
                                            encoding="utf-8")


NO_REFERENCES = "No published scores given (reference_scores): every baseline is unverified."


def _references(rows: list[TaskComparison]) -> list[tuple[str, str, str, str]] | None:
    """(task, baseline, published, status) per row, in points; None when no row had a published score."""
    if all(r.reference_check.reference is None for r in rows):
        return None
    return [(r.task, _points(r.baseline), _points(r.reference_check.reference), r.reference_check.status) for r in rows]


def _references_markdown(rows: list[TaskComparison]) -> str:
    found = _references(rows)
    if found is None:
        return NO_REFERENCES
    lines = ["| task | baseline | published | check |", "|---|---|---|---|"]
    return "\n".join(lines + [f"| {task} | {base} | {published} | {status} |" for task, base, published, status in found])


OUTPUT_COLUMNS = ("task", "side", "completion tokens (mean / median)", "truncated", "failed", "tokens/s", "measured on")


def _output_rows(output: CompareResultsOutput) -> list[tuple[str, ...]]:
    """Per benchmark and side: the answers' length, truncated and failed responses with their denominators, speed."""
    rows = []
    for check in output.outputs:
        for name, side in (("baseline", check.baseline), ("candidate", check.candidate)):
            if side is None:
                rows.append((check.task, name, "unverified", "unverified", "unverified", "-", "-"))
                continue
            tokens = "unverified" if side.mean_completion_tokens is None else \
                f"{side.mean_completion_tokens:.1f} / {side.median_completion_tokens:g}"
            rows.append((check.task, name, tokens, side.truncated.said.split(": ", 1)[1], side.failed.said.split(": ", 1)[1],
                         "-" if side.tokens_per_second is None else f"{side.tokens_per_second:g}", side.measured_on or "-"))
        if check.length_change is not None:
            rows.append((check.task, "change", f"{100 * check.length_change:+.1f}% per problem", "", "", "", ""))
    return rows


def _outputs_markdown(output: CompareResultsOutput) -> str:
    rows = _output_rows(output)
    size = f"\n{output.weights.message}\n" if output.weights else ""
    if not rows:
        return size
    lines = ["", "## Answers and what the quantization bought", "", "| " + " | ".join(OUTPUT_COLUMNS) + " |",
             "|" + "---|" * len(OUTPUT_COLUMNS), *("| " + " | ".join(row) + " |" for row in rows), size]
    return "\n".join(lines)


def _outputs_html(output: CompareResultsOutput) -> str:
    rows = _output_rows(output)
    size = f"<p>{html.escape(output.weights.message)}</p>" if output.weights else ""
    if not rows:
        return size
    head = "".join(f"<th>{html.escape(column)}</th>" for column in OUTPUT_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<h2>Answers and what the quantization bought</h2>\n<table><tr>{head}</tr>{body}</table>\n{size}"


def render_html(output: CompareResultsOutput, baseline: str, candidate: str, chart: bytes | None) -> str:
    image = ""
    if chart is not None:  # the bytes rendered, not the file re-read: it may have been replaced since
        image = f'<img alt="scores and deltas" src="data:image/png;base64,{base64.b64encode(chart).decode()}">'
    rows = "".join(
        f"<tr><td>{html.escape(r.task)}</td><td>{html.escape(r.metric)}.{html.escape(r.score)}</td>"
        f"<td>{_points(r.baseline)} ± {_points(r.baseline_stderr)}</td><td>{_points(r.candidate)} ± {_points(r.candidate_stderr)}</td>"
        f"<td>{100 * r.delta:+.2f}</td><td>{'n/a' if r.ci_low is None else f'[{100 * r.ci_low:+.2f}, {100 * r.ci_high:+.2f}]'}</td>"
        f"<td>{html.escape(r.verdict)}</td><td>{html.escape(r.method)}</td></tr>"
        for r in output.comparisons
    )
    checks = "".join(
        f"<tr class='{c.status}'><td>{html.escape(c.task)}</td><td>{c.item}</td><td>{c.status}</td>"
        f"<td><code>{html.escape(c.baseline)}</code></td><td><code>{html.escape(c.candidate)}</code></td></tr>"
        for c in output.checklist
    )
    reasons = "".join(f"<li>{html.escape(reason)}</li>" for reason in output.reasons)
    found = _references(output.comparisons)
    references = f"<p>{NO_REFERENCES}</p>" if found is None else (
        "<table><tr><th>task</th><th>baseline</th><th>published</th><th>check</th></tr>"
        + "".join(f"<tr><td>{html.escape(task)}</td><td>{base}</td><td>{published}</td><td>{status}</td></tr>"
                  for task, base, published, status in found) + "</table>")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>quanteval comparison</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}tr.different{{background:#fde2e2}}
tr.unknown{{background:#f3f3f3}}img{{max-width:100%}}code{{font-size:85%}}</style></head><body>
<h1>Baseline vs candidate</h1>
<p>baseline: <code>{html.escape(baseline)}</code><br>candidate: <code>{html.escape(candidate)}</code></p>
<p><b>Comparability:</b> {output.comparability} &nbsp; <b>Acceptability:</b> {output.acceptability}</p>
<ul>{reasons}</ul>
{image}
<h2>Scores (points, ± standard error)</h2>
<table><tr><th>task</th><th>metric</th><th>baseline</th><th>candidate</th><th>delta</th><th>CI</th><th>verdict</th><th>method</th></tr>{rows}</table>
{_outputs_html(output)}
<h2>Baseline against published scores (points)</h2>
{references}
<h2>Comparability checklist</h2>
<table><tr><th>task</th><th>item</th><th>status</th><th>baseline</th><th>candidate</th></tr>{checks}</table>
</body></html>
"""


def _tested_table_markdown(rows: list[TaskComparison]) -> str:
    lines = ["| benchmark | baseline | candidate | delta (pts) | CI (pts) | p (one-sided) | flips -/+ | nel verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = "n/a" if r.ci_low is None else f"[{100 * r.ci_low:+.2f}, {100 * r.ci_high:+.2f}]"
        p = "n/a" if r.p_value is None else f"{r.p_value:.2g}"
        lines.append(f"| {r.task} | {_points(r.baseline)} | {_points(r.candidate)} | {100 * r.delta:+.2f} | {ci} | {p} "
                     f"| {r.n_regressions}/{r.n_improvements} | {r.nel_verdict} |")
    return "\n".join(lines)


def render_markdown(output: CompareResultsOutput, baseline: str, candidate: str, png: Path | None) -> str:
    flips = []
    for r in output.comparisons:
        for label, entries in (("regressed", r.regressed), ("improved", r.improved)):
            if entries:
                flips.append(f"\n**{r.task}: {label}** (first {len(entries)})\n\n| problem | expected | baseline | candidate |\n|---|---|---|---|")
                flips += [f"| {f.problem_idx} | {f.expected} | {f.baseline_answer} | {f.candidate_answer} |" for f in entries]
    chart = f"\n![scores and deltas]({png.name})\n" if png else ""
    reasons = "\n".join(f"- {reason}" for reason in output.reasons)
    return (f"# Baseline vs candidate\n\nbaseline: `{baseline}`  \ncandidate: `{candidate}`\n\n"
            f"**Comparability:** {output.comparability} — **Acceptability:** {output.acceptability}\n\n{reasons}\n{chart}\n"
            f"{output.table_markdown}\n{_outputs_markdown(output)}\n## Baseline against published scores (points)\n\n"
            f"{_references_markdown(output.comparisons)}\n" + "\n".join(flips) + "\n")
