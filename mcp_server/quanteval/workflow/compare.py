"""compare_results: is the candidate (quantized) run's score drop real, and is it acceptable?

First the comparability checklist from both runs' saved run configs, then per task the delta and
its uncertainty:

- unpaired: delta = c - b, se = sqrt(se_b^2 + se_c^2), 95% CI = delta +/- 1.96 se;
- paired, when both runs kept per-sample outputs for the same samples and those reproduce the
  headline scores: d_i = mean score of sample i in c minus in b, delta = mean(d_i),
  se = sd(d_i) / sqrt(n), 95% CI from a paired bootstrap over samples with a fixed seed.

Scores are compared as fractions (percent values are divided by 100), so the threshold is always
"an absolute drop of 0.01 = one point". The table, a PNG chart and a self-contained HTML report
are written to an output directory.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
import shlex
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from quanteval import redact
from quanteval.engines.base import unpinned_image
from quanteval.engines.nel import config as nel_config
from quanteval.envvars import state_dir
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress
from quanteval.workflow import anomaly
from quanteval.workflow.results import (
    METADATA_FILE,
    REPEAT_KEYS,
    RESULTS_FILE,
    ScoreValue,
    TaskScores,
    load_yaml,
    locate_run,
    next_run_dir,
    next_task_scores,
    per_sample_scores,
    repeats,
    run_config,
    tasks_by_name,
)

Z95 = 1.959964  # two-sided 95% normal quantile
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20240617  # fixed, so the same inputs give the same interval every time
PAIRED_MATCH_TOLERANCE = 0.005  # per-sample means must reproduce the headline to within half a point
PROMPT_KEYS = re.compile(r"prompt|template|system|few_?shot|chat", re.IGNORECASE)
REASONING_KEYS = re.compile(r"reason|think", re.IGNORECASE)
JUDGE_KEYS = re.compile(r"judge", re.IGNORECASE)


class CompareResultsInput(StrictModel):
    baseline: str = Field(
        description="Reference run (e.g. unquantized): results dir, host:path or record_id."
    )
    candidate: str = Field(
        description="Run to judge (e.g. quantized), named like baseline."
    )
    threshold: float | None = Field(
        None, ge=0,
        description="Largest acceptable drop, absolute fraction (0.01 = one point).",
    )
    output_dir: str | None = Field(
        None, description="For the chart and report; default under the state dir."
    )
    baseline_checkpoint: str | None = Field(
        None, description="The baseline's checkpoint (local or cached HF handle) if its run's is unreadable here.",
    )
    candidate_checkpoint: str | None = Field(None, description="The same for the candidate.")
    reference_scores: dict[str, float] = Field(default_factory=dict, description=(
        "Per-task scores the baseline should reach (fractions, e.g. the model card's); far below: suspect serving."))


class ChecklistItem(BaseModel):
    task: str
    item: str = Field(description="One of CHECK_ITEMS: model, serving, task, container, prompts, extra_args, generation, reasoning, repeats, samples, judge.")
    status: Literal["same", "different", "unknown"] = Field(description="unknown: could not be read for one run, so the runs are not known to match.")
    baseline: str = Field(description="The baseline's value (JSON, at most 300 characters).")
    candidate: str


class Flip(BaseModel):
    problem_idx: int
    expected: str | None
    baseline_answer: str | None
    candidate_answer: str | None


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
    ci_low: float | None = Field(description="95% confidence interval of delta, low end.")
    ci_high: float | None
    method: str = Field(description="How the interval was computed (unpaired from stderrs, or paired bootstrap over n samples).")
    verdict: Literal["acceptable", "not acceptable", "inconclusive", "suspect"]
    why: str
    # Per-problem pairing (nel-next runs keep every problem's reward): what `nel compare` reports on the same runs.
    test: str | None = Field(None, description="mcnemar (0/1 rewards, exact one-sided binomial) or sign (averaged repeats).")
    p_value: float | None = Field(None, description="One-sided p of 'candidate is worse'.")
    n_paired: int | None = None
    n_regressions: int | None = Field(None, description="Problems right in the baseline, wrong in the candidate.")
    n_improvements: int | None = None
    nel_verdict: str | None = Field(None, description="PASS / WARN / BLOCK / INCONCLUSIVE by nel compare's rule, with threshold as its --max-drop.")
    regressed: list[Flip] = Field(default_factory=list, description="First flips to wrong, with both answers.")
    improved: list[Flip] = Field(default_factory=list)
    anomaly: str | None = Field(None, description="Set when the drop (or the baseline) looks like a serving or kernel "
                                "problem rather than quantization; the verdict is then 'suspect'.")


class CompareResultsOutput(BaseModel):
    comparability: Literal["comparable", "not comparable", "inconclusive"]
    acceptability: Literal["acceptable", "not acceptable", "inconclusive", "suspect"] = Field(description=(
        "suspect: a drop too large to be quantization (or a baseline below its reference): check the serving first."))
    reasons: list[str] = Field(description="What decided the two verdicts.")
    checklist: list[ChecklistItem]
    comparisons: list[TaskComparison]
    table_markdown: str
    chart_png: str | None = Field(description="Path of the PNG chart (scores with error bars, deltas with CIs).")
    report_html: str | None = Field(description="Path of the self-contained HTML report.")
    report_markdown: str | None = Field(None, description="Path of the markdown report (same content as the HTML).")


# ---------------------------------------------------------------------------------------------
# Comparability checklist
# ---------------------------------------------------------------------------------------------


def _short(value: Any) -> str:
    text = json.dumps(redact.redact_config(value), sort_keys=True, default=str)
    return text if len(text) <= 300 else text[:297] + "..."


CHECK_ITEMS = ("model", "serving", "task", "container", "prompts", "extra_args", "generation", "reasoning", "repeats", "samples", "judge")
# What a model family is made of: two checkpoints that differ here are different models, not two precisions of one.
MODEL_FACTS = ("architecture", "model_type", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size")
# Server flags that move scores (the rest tune speed and memory); --quantization legitimately differs.
SCORE_FLAGS = ("--kv-cache-dtype", "--reasoning-parser", "--chat-template", "--dtype")
# extra keys that are not the run's settings: the tokenizer follows the checkpoint (compared under model).
NOT_SETTINGS = re.compile(r"^(tokenizer|tokenizer_backend|args|top_k)$")


def _adapter_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The adapter's settings in one shape, whether NEL wrote the flat form (params_to_add, process_reasoning_traces,
    custom_system_prompt, ...) or the interceptor list (payload_modifier, reasoning, system_message, ...)."""
    adapter = ((config.get("target") or {}).get("api_endpoint") or {}).get("adapter_config") or {}
    settings = {key: value for key, value in adapter.items() if key != "interceptors"}
    for item in adapter.get("interceptors") or []:
        if isinstance(item, dict) and item.get("enabled", True) is not False:
            settings[f"interceptor:{item.get('name')}"] = item.get("config") or {}
    payload = settings.get("interceptor:payload_modifier") or {}
    added = dict(settings.get("params_to_add") or {}) | dict(payload.get("params_to_add") or {})
    settings["params_to_add"] = added
    return settings


def resolved_config(task_dir: Path) -> dict[str, Any] | None:
    """NEL's fully resolved launcher config for this task (artifacts/metadata.yaml), or None."""
    metadata = load_yaml(task_dir / "artifacts" / METADATA_FILE) or {}
    resolved = metadata.get("launcher_resolved_config") or (metadata.get("metadata") or {}).get("launcher_resolved_config")
    return resolved if isinstance(resolved, dict) and resolved else None


def _serving(resolved: dict[str, Any] | None) -> dict[str, Any] | None:
    deployment = (resolved or {}).get("deployment")
    if not isinstance(deployment, dict) or not deployment.get("type"):
        return None
    try:
        flags = dict(nel_config.parse_extra_args(str(deployment.get("extra_args") or "")))
    except ToolError:
        flags = {}
    # the served context is compared with the model family (model.served_context)
    return {"framework": deployment.get("type"), "image": deployment.get("image")} | {flag: flags[flag] for flag in SCORE_FLAGS if flag in flags}


def model_family(resolved: dict[str, Any] | None, checkpoint: str | None) -> dict[str, Any] | None:
    """Architecture, shapes, vocabulary and served context of the run's checkpoint, or None when it is not readable here."""
    from quanteval.serving import checkpoint as checkpoints
    if checkpoint:
        report = checkpoints.inspect_checkpoint(checkpoints.InspectCheckpointInput(checkpoint=checkpoint))
    else:
        report = nel_config.model_source_report(resolved, Path.cwd()) if resolved else None
    if report is None:
        return None
    context, _ = nel_config.serving_context(resolved or {}, report)
    facts = report.architecture.model_dump()
    return {key: facts[key] for key in MODEL_FACTS} | {"reasoning_template": report.reasoning, "served_context": context}


def _facets(task_dir: Path, scores: TaskScores, checkpoint: str | None = None) -> dict[str, Any] | None:
    """What must match between two runs of one task, read from the saved run configs and results. None: unknown."""
    config = run_config(task_dir)
    if not config:
        return None
    params = (config.get("config") or {}).get("params") or {}
    extra = params.get("extra") or {}
    adapter = _adapter_settings(config)
    added = adapter["params_to_add"]
    overrides = nel_config.ns_generation_overrides(extra.get("args"))
    versioning = ((load_yaml(task_dir / "artifacts" / RESULTS_FILE) or {}).get("metadata") or {}).get("versioning")
    counts = sorted({s.count for s in scores.scores if s.count is not None})
    resolved = resolved_config(task_dir)
    args = extra.get("args")
    generation = {k: params.get(k) for k in ("temperature", "top_p", "max_new_tokens")} | {"top_k": extra.get("top_k", added.get("top_k"))}
    generation |= {k: v for k, v in added.items() if k not in ("chat_template_kwargs", "top_k")}
    generation |= overrides  # NeMo-Skills ++inference.* wins over NEL's params
    classified = [PROMPT_KEYS, REASONING_KEYS, JUDGE_KEYS]
    return {
        "model": model_family(resolved, checkpoint),
        "serving": _serving(resolved),
        "task": {"harness": config.get("framework_name"), "task": (config.get("config") or {}).get("type")},
        "container": versioning,
        "prompts": {
            "params": {k: v for k, v in extra.items() if PROMPT_KEYS.search(k)},
            "system_prompt": {k: adapter.get(k) for k in ("use_system_prompt", "custom_system_prompt") if adapter.get(k) is not None}
            | ({"interceptor": adapter["interceptor:system_message"]} if "interceptor:system_message" in adapter else {}),
        },
        "extra_args": {
            "args": shlex.split(args) if isinstance(args, str) else args,
            "other": {k: v for k, v in extra.items() if not NOT_SETTINGS.match(k) and not any(p.search(k) for p in classified)
                      and k not in REPEAT_KEYS},
        },
        "generation": generation,
        "reasoning": {
            "params": {k: v for k, v in extra.items() if REASONING_KEYS.search(k)},
            "chat_template_kwargs": added.get("chat_template_kwargs"),
            "adapter": {k: v for k, v in adapter.items() if REASONING_KEYS.search(k) and k != "params_to_add"},
        },
        "repeats": repeats(params),
        "samples": {"limit_samples": params.get("limit_samples"), "scored": counts},
        "judge": {k: v for k, v in extra.items() if JUDGE_KEYS.search(k)},
    }


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


def paired_delta(baseline: dict[str, list[float]], candidate: dict[str, list[float]]) -> tuple[float, float, float, float, int] | None:
    """(delta, se, ci_low, ci_high, n) over samples both runs scored; None when fewer than 2 are shared."""
    import numpy as np

    shared = sorted(set(baseline) & set(candidate))
    if len(shared) < 2:
        return None
    differences = np.array([np.mean(candidate[i]) - np.mean(baseline[i]) for i in shared])
    n = len(differences)
    delta = float(differences.mean())
    se = float(differences.std(ddof=1) / math.sqrt(n))
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    means = differences[rng.integers(0, n, size=(BOOTSTRAP_RESAMPLES, n))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return delta, se, float(low), float(high), n


def judge(delta: float, low: float | None, high: float | None, threshold: float | None) -> tuple[str, str]:
    if low is None or high is None:
        return "inconclusive", "no standard error recorded for one of the scores, so no interval"
    if threshold is None:
        return "inconclusive", "no threshold given"
    if low >= -threshold:
        return "acceptable", f"the whole 95% CI [{low:+.4f}, {high:+.4f}] stays above -{threshold:g}"
    if high < -threshold:
        return "not acceptable", f"the whole 95% CI [{low:+.4f}, {high:+.4f}] lies below -{threshold:g}"
    return "inconclusive", f"the 95% CI [{low:+.4f}, {high:+.4f}] straddles -{threshold:g}: more samples or repeats needed"


def compare_task(task: str, base: ScoreValue, cand: ScoreValue, base_dir: Path, cand_dir: Path, threshold: float | None) -> TaskComparison:
    b, b_se = _as_fraction(base)
    c, c_se = _as_fraction(cand)
    delta = c - b
    se = math.sqrt(b_se**2 + c_se**2) if b_se is not None and c_se is not None else None
    low, high = (delta - Z95 * se, delta + Z95 * se) if se is not None else (None, None)
    method = "unpaired: se = sqrt(se_b^2 + se_c^2), CI = delta +/- 1.96 se"
    base_samples, cand_samples = per_sample_scores(base_dir), per_sample_scores(cand_dir)
    if base_samples and cand_samples:
        paired = paired_delta(base_samples, cand_samples)
        b_mean = sum(sum(v) / len(v) for v in base_samples.values()) / len(base_samples)
        c_mean = sum(sum(v) / len(v) for v in cand_samples.values()) / len(cand_samples)
        if paired and abs(b_mean - b) <= PAIRED_MATCH_TOLERANCE and abs(c_mean - c) <= PAIRED_MATCH_TOLERANCE:
            delta, se, low, high, n = paired
            method = f"paired bootstrap over {n} shared samples ({BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED}); se = sd(d)/sqrt(n)"
        else:
            method += " (per-sample outputs present but they do not reproduce both headline scores, so not paired)"
    verdict, why = judge(delta, low, high, threshold)
    return TaskComparison(
        task=task, metric=base.metric, score=base.score, scale=base.scale, baseline=b, candidate=c,
        baseline_stderr=b_se, candidate_stderr=c_se, delta=delta, delta_stderr=se, ci_low=low, ci_high=high,
        method=method, verdict=verdict, why=why,
    )


def _pairs(base: TaskScores, cand: TaskScores) -> list[tuple[ScoreValue, ScoreValue]]:
    """The headline scores, or every score both runs have when there is no headline."""
    if base.headline and cand.headline:
        return [(base.headline, cand.headline)]
    cand_by_path = {s.path: s for s in cand.scores}
    return [(s, cand_by_path[s.path]) for s in base.scores if s.path in cand_by_path][:20]


# ---------------------------------------------------------------------------------------------
# Table, chart, report
# ---------------------------------------------------------------------------------------------


def _points(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}"


def table_markdown(rows: list[TaskComparison]) -> str:
    lines = [
        "| task | metric | baseline | candidate | delta (pts) | 95% CI (pts) | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = f"{_points(r.baseline)} ± {_points(r.baseline_stderr)}"
        cand = f"{_points(r.candidate)} ± {_points(r.candidate_stderr)}"
        ci = "n/a" if r.ci_low is None else f"[{100 * r.ci_low:+.2f}, {100 * r.ci_high:+.2f}]"
        lines.append(f"| {r.task} | {r.metric}.{r.score} | {base} | {cand} | {100 * r.delta:+.2f} | {ci} | {r.verdict} |")
    return "\n".join(lines)


def render_chart(rows: list[TaskComparison], threshold: float | None, path: Path) -> None:
    """Left: both runs' scores with 95% error bars. Right: deltas with 95% CIs, zero and -threshold lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels = [r.task if r.score == r.metric else f"{r.task}\n{r.metric}.{r.score}" for r in rows]
    y = np.arange(len(rows))
    height = max(2.8, 0.7 * len(rows) + 1.6)
    fig, (scores_ax, delta_ax) = plt.subplots(1, 2, figsize=(12, height), gridspec_kw={"width_ratios": [3, 2]}, sharey=True)

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
    scores_ax.set_xlabel("score (points, 0-100) with 95% error bars")
    scores_ax.set_title("Scores", loc="left")
    scores_ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8, frameon=False)
    scores_ax.grid(axis="x", alpha=0.3)

    colours = {"acceptable": "#55a868", "not acceptable": "#c44e52", "inconclusive": "#8c8c8c", "suspect": "#dd8452"}
    for row, pos in zip(rows, y, strict=True):
        lower = None if row.ci_low is None else 100 * (row.delta - row.ci_low)
        upper = None if row.ci_high is None else 100 * (row.ci_high - row.delta)
        xerr = None if lower is None else [[lower], [upper]]
        delta_ax.errorbar([100 * row.delta], [pos], xerr=xerr, fmt="o", color=colours[row.verdict], capsize=5, markersize=7)
        note = ", paired" if row.method.startswith("paired") else ", no stderr: no CI" if row.ci_low is None else ""
        delta_ax.annotate(f"{100 * row.delta:+.2f} ({row.verdict}{note})", (100 * row.delta, pos), textcoords="offset points",
                          xytext=(0, 9), ha="center", fontsize=8, bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85})
    delta_ax.axvline(0, color="black", linewidth=0.8)
    if threshold is not None:
        delta_ax.axvline(-100 * threshold, color="#c44e52", linestyle="--", linewidth=1, label=f"-threshold ({-100 * threshold:.2f})")
        delta_ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    span = [abs(100 * v) for r in rows for v in (r.delta, r.ci_low, r.ci_high) if v is not None]
    limit = max(span + [100 * threshold if threshold else 0.5]) * 1.6
    delta_ax.set_xlim(-limit, limit)
    delta_ax.set_ylim(len(rows) - 0.5, -0.5)
    delta_ax.set_xlabel("candidate - baseline (points) with 95% CI")
    delta_ax.set_title("Delta", loc="left")
    delta_ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render_html(output: CompareResultsOutput, baseline: str, candidate: str, png: Path | None) -> str:
    image = ""
    if png is not None:
        image = f'<img alt="scores and deltas" src="data:image/png;base64,{base64.b64encode(png.read_bytes()).decode()}">'
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
<table><tr><th>task</th><th>metric</th><th>baseline</th><th>candidate</th><th>delta</th><th>95% CI</th><th>verdict</th><th>method</th></tr>{rows}</table>
<h2>Comparability checklist</h2>
<table><tr><th>task</th><th>item</th><th>status</th><th>baseline</th><th>candidate</th></tr>{checks}</table>
</body></html>
"""


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


def compare_results(request: CompareResultsInput, progress: ProgressFn = no_progress) -> CompareResultsOutput:
    """Use once both runs passed validate_run: checks they are comparable, then per-task deltas with 95% CI, verdicts, a
    chart and a report.
    """
    progress(0, 3, "reading both runs")
    base_next, cand_next = next_run_dir(request.baseline), next_run_dir(request.candidate)
    if (base_next is None) != (cand_next is None):
        raise ToolError("baseline and candidate come from different engines (one nel-next run, one NEL 0.2.6 run): "
                        "their scores are not computed the same way. Evaluate both with the same engine.")
    if base_next is not None and cand_next is not None:
        return _compare_next(request, base_next, cand_next, progress)
    base_tree, cand_tree = locate_run(request.baseline), locate_run(request.candidate)
    base_tasks, cand_tasks = tasks_by_name(base_tree), tasks_by_name(cand_tree)
    reasons: list[str] = []
    items: list[ChecklistItem] = []
    rows: list[TaskComparison] = []
    for task in sorted(set(base_tasks) | set(cand_tasks)):
        if task not in base_tasks or task not in cand_tasks:
            missing = "baseline" if task not in base_tasks else "candidate"
            reasons.append(f"{task}: only one run has it (missing in the {missing}); it is not compared.")
            continue
        (base_dir, base_scores), (cand_dir, cand_scores) = base_tasks[task], cand_tasks[task]
        items += checklist(task, _facets(base_dir, base_scores, request.baseline_checkpoint), _facets(cand_dir, cand_scores, request.candidate_checkpoint))
        pairs = _pairs(base_scores, cand_scores)
        if not pairs:
            problem = base_scores.problem or cand_scores.problem or "the runs share no score"
            reasons.append(f"{task}: not compared: {problem}")
        for base, cand in pairs:
            if base.scale != cand.scale:
                reasons.append(f"{task}: {base.metric}.{base.score} is {base.scale} in the baseline and {cand.scale} in the candidate; not compared.")
                continue
            rows.append(compare_task(task, base, cand, base_dir, cand_dir, request.threshold))
    progress(1, 3, "statistics done")
    _flag_anomalies(rows, request, None)

    comparability, why = comparability_verdict(items)
    reasons += why
    acceptability = _acceptability(comparability, rows, reasons)
    reasons += [f"{row.task}: {row.verdict}: {row.why}." for row in rows]

    output_dir = _output_dir(request)
    png = output_dir / "comparison.png" if rows else None
    if png is not None:
        render_chart(rows, request.threshold, png)
    progress(2, 3, "chart written")
    output = CompareResultsOutput(
        comparability=comparability, acceptability=acceptability, reasons=reasons, checklist=items, comparisons=rows,
        table_markdown=table_markdown(rows), chart_png=str(png) if png else None, report_html=None,
    )
    report = output_dir / "report.html"
    report.write_text(render_html(output, base_tree.label, cand_tree.label, png), encoding="utf-8")
    output.report_html = str(report)
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


# ---------------------------------------------------------------------------------------------
# nel-next runs: paired per problem, as nel compare pairs them
# ---------------------------------------------------------------------------------------------

ACCEPTABILITY_OF_NEL_VERDICT = {"PASS": "acceptable", "WARN": "acceptable", "BLOCK": "not acceptable", "INCONCLUSIVE": "inconclusive"}


def _next_facets(bundle: Any, run_dir: Path, checkpoint: str | None) -> dict[str, Any] | None:
    from quanteval.engines.nel_next import nelnext

    facts = nelnext.read_run_facts(run_dir)
    if facts is None:
        return None
    config = facts.get("config") or {}
    benchmark = next((b for b in config.get("benchmarks") or [] if Path(str(b.get("name"))).stem == bundle.name
                      or b.get("name") == bundle.name), {})
    service = (config.get("services") or {}).get((benchmark.get("solver") or {}).get("service") or "", {})
    generation = {**(service.get("generation") or {}), **((benchmark.get("solver") or {}).get("generation") or {})}
    checkpoint = checkpoint or facts.get("checkpoint")
    family = model_family(None, checkpoint) if checkpoint else None
    served = facts.get("served") or {}
    return {
        "model": family, "serving": {"protocol": service.get("protocol"), "served_context": served.get("max_model_len")},
        "task": bundle.name, "container": "in-process (nel-next)",
        "prompts": {"system_prompt": (benchmark.get("solver") or {}).get("system_prompt"),
                    "instruction_template": benchmark.get("instruction_template"), "fewshot": benchmark.get("fewshot")},
        "extra_args": benchmark.get("params") or {}, "generation": {k: v for k, v in generation.items() if v is not None},
        "reasoning": {"reasoning_pattern": service.get("reasoning_pattern")}, "repeats": bundle.repeats,
        "samples": {"problems": bundle.samples, "shuffle_seed": benchmark.get("shuffle_seed")},
        "judge": [m for m in (benchmark.get("scoring") or {}).get("metrics") or [] if "judge" in str(m.get("type", ""))],
    }


def _compare_next(request: CompareResultsInput, base_dir: Path, cand_dir: Path, progress: ProgressFn) -> CompareResultsOutput:
    from quanteval.engines.nel_next import nextresults

    threshold = nextresults.DEFAULT_MAX_DROP if request.threshold is None else request.threshold
    base_bundles, cand_bundles = nextresults.bundles(base_dir), nextresults.bundles(cand_dir)
    reasons: list[str] = []
    items: list[ChecklistItem] = []
    rows: list[TaskComparison] = []
    for name in sorted(set(base_bundles) | set(cand_bundles)):
        if name not in base_bundles or name not in cand_bundles:
            reasons.append(f"{name}: only one run has it (missing in the {'baseline' if name not in base_bundles else 'candidate'}); not compared.")
            continue
        base, cand = base_bundles[name], cand_bundles[name]
        items += checklist(name, _next_facets(base, base_dir, request.baseline_checkpoint),
                           _next_facets(cand, cand_dir, request.candidate_checkpoint))
        paired = nextresults.compare_bundles(base, cand, threshold)
        base_score, cand_score = next_task_scores(base).headline, next_task_scores(cand).headline
        why = "; ".join(paired.reasons)
        verdict = ACCEPTABILITY_OF_NEL_VERDICT[paired.verdict]
        # nel compare counts an unanswered request as a wrong answer; a serving failure is not a quantization loss.
        lost_base, lost_cand = paired.unanswered_baseline, paired.unanswered_candidate
        if lost_base or lost_cand:
            only_cand = len(lost_cand - lost_base)
            why += (f"; {len(lost_cand)} problem(s) in the candidate and {len(lost_base)} in the baseline had requests that got "
                    "no answer (infra_error), counted as wrong: resume_run re-runs them (nel-next retries infra errors on resume)")
            if verdict == "not acceptable" and only_cand:
                verdict = "inconclusive"
                reasons.append(f"{name}: the drop includes {only_cand} problem(s) the candidate's server never answered; "
                               "inconclusive until they are re-run (resume_run), as a serving failure is not a quantization loss.")
        rows.append(TaskComparison(
            task=name, metric=paired.metric, score="value", scale="fraction", baseline=paired.baseline_score,
            candidate=paired.candidate_score, baseline_stderr=base_score.stderr if base_score else None,
            candidate_stderr=cand_score.stderr if cand_score else None, delta=paired.delta, delta_stderr=None,
            ci_low=paired.ci_low, ci_high=paired.ci_high,
            method=f"paired per problem over {paired.n_paired} problems: {paired.test} exact test; 95% CI by paired bootstrap "
                   f"({nextresults.BOOTSTRAP_RESAMPLES} resamples, seed 0)",
            verdict=verdict, why=why, test=paired.test, p_value=paired.p_value,
            n_paired=paired.n_paired, n_regressions=paired.n_regressions, n_improvements=paired.n_improvements,
            nel_verdict=paired.verdict,
            regressed=[_flip(f) for f in paired.regressed], improved=[_flip(f) for f in paired.improved]))
    progress(1, 3, "statistics done")
    _flag_anomalies(rows, request, cand_dir)
    comparability, why_not = comparability_verdict(items)
    reasons += why_not
    acceptability = _acceptability(comparability, rows, reasons)
    reasons += [f"{row.task}: {row.nel_verdict} ({row.verdict}): {row.why}." for row in rows]
    output_dir = _output_dir(request)
    png = output_dir / "comparison.png" if rows else None
    if png is not None:
        render_chart(rows, threshold, png)
    progress(2, 3, "chart written")
    output = CompareResultsOutput(comparability=comparability, acceptability=acceptability, reasons=reasons, checklist=items,
                                  comparisons=rows, table_markdown=next_table_markdown(rows), chart_png=str(png) if png else None,
                                  report_html=None)
    report = output_dir / "report.html"
    report.write_text(render_html(output, str(base_dir), str(cand_dir), png), encoding="utf-8")
    markdown = output_dir / "report.md"
    markdown.write_text(render_markdown(output, str(base_dir), str(cand_dir), png), encoding="utf-8")
    output.report_html, output.report_markdown = str(report), str(markdown)
    return output


def _candidate_weight_bits(request: CompareResultsInput, cand_dir: Path | None) -> int | None:
    """The candidate's weight bits from its checkpoint (given, or recorded with a nel-next run); None when unknown."""
    from quanteval.engines.nel_next import nelnext
    from quanteval.serving.checkpoint import InspectCheckpointInput, inspect_checkpoint

    checkpoint = request.candidate_checkpoint
    if checkpoint is None and cand_dir is not None:
        checkpoint = (nelnext.read_run_facts(cand_dir) or {}).get("checkpoint")
    if not checkpoint:
        return None
    try:
        quant = inspect_checkpoint(InspectCheckpointInput(checkpoint=checkpoint)).quantization
    except ToolError:
        return None
    return quant.weights.bits if quant.weights else None  # undetected (e.g. stored dequantized): the format is unknown


def _flag_anomalies(rows: list[TaskComparison], request: CompareResultsInput, cand_dir: Path | None) -> None:
    """Drops too large to be quantization (anomaly.py) become 'suspect', never a quantization loss."""
    bits = _candidate_weight_bits(request, cand_dir) if rows else None
    for row in rows:
        found = anomaly.anomaly(row.task, row.baseline, row.candidate, bits, request.reference_scores.get(row.task))
        if found:
            row.anomaly, row.verdict, row.why = found, "suspect", found


def _flip(flip: Any) -> Flip:
    return Flip(problem_idx=flip.problem_idx, expected=flip.expected_answer, baseline_answer=flip.baseline_answer,
                candidate_answer=flip.candidate_answer)


def next_table_markdown(rows: list[TaskComparison]) -> str:
    lines = ["| benchmark | baseline | candidate | delta (pts) | 95% CI (pts) | p (one-sided) | flips -/+ | nel verdict |",
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
            f"{output.table_markdown}\n" + "\n".join(flips) + "\n")


def _output_dir(request: CompareResultsInput) -> Path:
    output_dir = Path(request.output_dir).expanduser() if request.output_dir else state_dir() / "comparisons" / time.strftime("%Y%m%d-%H%M%S")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ToolError(f"output_dir {output_dir}: cannot create it ({exc.strerror}). Pass a writable directory.") from None
    return output_dir
