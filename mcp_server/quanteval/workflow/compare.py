"""compare_results: is the candidate (quantized) run's score drop real, and is it acceptable?

First the comparability checklist from both runs' saved run configs, then per task the delta and
its uncertainty:

- unpaired: delta = c - b, se = sqrt(se_b^2 + se_c^2), CI = delta +/- z se;
- paired, when both runs kept per-problem results (nel-next's results.jsonl; NEL 0.2.6's per-sample outputs when
  they reproduce the headline scores): paired.paired_interval, the same interval gate_results computes.

The verdict is paired.decide's (nel gate's rule) against the user's max_drop, given in points; scores are compared
as fractions (percent values are divided by 100). The table, a PNG chart and a self-contained HTML report are
written to an output directory.
"""

from __future__ import annotations

import json
import math
import re
import shlex
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from quanteval import redact
from quanteval.engines.base import unpinned_image
from quanteval.engines.nel import config as nel_config
from quanteval.engines.nel.nelfacts import REPEAT_KEYS
from quanteval.engines.nel.runtree import (
    METADATA_FILE,
    RESULTS_FILE,
    load_yaml,
    locate_run,
    per_sample_scores,
    repeats,
    run_config,
    tasks_by_name,
)
from quanteval.engines.nel_next.results import next_run_dir, next_task_scores
from quanteval.engines.runresults import ScoreValue, TaskScores
from quanteval.envvars import state_dir
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress
from quanteval.workflow import anomaly, paired
from quanteval.workflow.comparison_report import (
    ChecklistItem,
    CompareResultsOutput,
    Flip,
    TaskComparison,
    next_table_markdown,
    render_chart,
    render_html,
    render_markdown,
    table_markdown,
)
from quanteval.workflow.paired import DEFAULT_CONFIDENCE, Confidence, MaxDropPoints

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
    max_drop: MaxDropPoints = None
    confidence: Confidence = DEFAULT_CONFIDENCE
    output_dir: str | None = Field(
        None, description="For the chart and report; default under the state dir."
    )
    baseline_checkpoint: str | None = Field(
        None, description="The baseline's checkpoint (a directory or cached HF handle) if its run's is unreadable.",
    )
    candidate_checkpoint: str | None = Field(None, description="The same for the candidate.")
    reference_scores: dict[str, float] = Field(default_factory=dict, description=(
        "Per-task scores the baseline should reach (fractions, e.g. the model card's); far below: suspect serving."))


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


def margin(request: CompareResultsInput) -> float | None:
    """The user's max_drop (points) as the fraction the statistics work on."""
    return None if request.max_drop is None else request.max_drop / 100


def _verdict_and_advice(interval: paired.PairedInterval | None, low: float | None, high: float | None,
                        request: CompareResultsInput) -> tuple[str, str]:
    verdict, why = paired.decide(low, high, margin(request), request.confidence)
    if verdict == "inconclusive" and interval is not None:
        why += ". " + paired.advice(interval, margin(request))
    return verdict, why


def compare_task(task: str, base: ScoreValue, cand: ScoreValue, base_dir: Path, cand_dir: Path,
                 request: CompareResultsInput) -> TaskComparison:
    b, b_se = _as_fraction(base)
    c, c_se = _as_fraction(cand)
    delta = c - b
    z = paired.normal_quantile(paired.two_sided(request.confidence))
    se = math.sqrt(b_se**2 + c_se**2) if b_se is not None and c_se is not None else None
    low, high = (delta - z * se, delta + z * se) if se is not None else (None, None)
    method = f"unpaired: se = sqrt(se_b^2 + se_c^2), CI = delta +/- {z:.2f} se"
    base_samples, cand_samples = per_sample_scores(base_dir), per_sample_scores(cand_dir)
    interval = None
    if base_samples and cand_samples:
        base_means, cand_means = paired.problem_values(base_samples, "mean_reward"), paired.problem_values(cand_samples, "mean_reward")
        interval = paired.paired_interval(base_means or {}, cand_means or {}, None, request.confidence)
        b_mean, c_mean = sum(base_means.values()) / len(base_means), sum(cand_means.values()) / len(cand_means)
        if interval and interval.n >= 2 and abs(b_mean - b) <= PAIRED_MATCH_TOLERANCE and abs(c_mean - c) <= PAIRED_MATCH_TOLERANCE:
            delta, low, high = interval.delta, interval.low, interval.high
            se = interval.spread * math.sqrt(interval.n / (interval.n - 1)) / math.sqrt(interval.n)
            method = f"paired over {interval.n} shared samples: Student t on the per-sample deltas (as nel gate)"
        else:
            interval = None
            method += " (per-sample outputs present but they do not reproduce both headline scores, so not paired)"
    verdict, why = _verdict_and_advice(interval, low, high, request)
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
    """Use once both runs passed validate_run: comparability, per-task delta with its paired CI (gate_results'
    interval), a verdict against max_drop, the problems an inconclusive one needs, a chart and a report."""
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
            rows.append(compare_task(task, base, cand, base_dir, cand_dir, request))
    progress(1, 3, "statistics done")
    _flag_anomalies(rows, request, None)

    comparability, why = comparability_verdict(items)
    reasons += why
    acceptability = _acceptability(comparability, rows, reasons)
    reasons += [f"{row.task}: {row.verdict}: {row.why}." for row in rows]

    output_dir = _output_dir(request)
    png = output_dir / "comparison.png" if rows else None
    if png is not None:
        render_chart(rows, margin(request), png)
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


def _next_interval(base: Any, cand: Any, confidence: float) -> paired.PairedInterval | None:
    """The paired interval gate_results computes for this benchmark (pass@1 per problem, clustered by category)."""
    from quanteval.engines.nel_next import nextresults

    base_records, cand_records = nextresults.paired_records(base.directory), nextresults.paired_records(cand.directory)
    base_values = paired.problem_values(nextresults.per_problem_rewards(base_records), nextresults.PRIMARY_METRIC)
    cand_values = paired.problem_values(nextresults.per_problem_rewards(cand_records), nextresults.PRIMARY_METRIC)
    return paired.paired_interval(base_values or {}, cand_values or {},
                                  lambda shared: paired.category_clusters(base_records, shared), confidence)


def _next_row(name: str, base: Any, cand: Any, request: CompareResultsInput, nel_max_drop: float,
              reasons: list[str]) -> TaskComparison:
    """One benchmark of two nel-next runs: the shared interval and rule decide; nel compare's test is evidence."""
    from quanteval.engines.nel_next import nextresults

    evidence = nextresults.compare_bundles(base, cand, nel_max_drop)
    interval = _next_interval(base, cand, request.confidence)
    base_score, cand_score = next_task_scores(base).headline, next_task_scores(cand).headline
    low, high = (interval.low, interval.high) if interval else (None, None)
    verdict, why = _verdict_and_advice(interval, low, high, request)
    why += f"; nel compare: {evidence.verdict} ({evidence.test} p={evidence.p_value:.3g})" if evidence.p_value is not None else ""
    # nel compare counts an unanswered request as a wrong answer; a serving failure is not a quantization loss.
    lost_base, lost_cand = evidence.unanswered_baseline, evidence.unanswered_candidate
    if lost_base or lost_cand:
        only_cand = len(lost_cand - lost_base)
        why += (f"; {len(lost_cand)} problem(s) in the candidate and {len(lost_base)} in the baseline had requests that got "
                "no answer (infra_error), counted as wrong: resume_run re-runs them (nel-next retries infra errors on resume)")
        if verdict == "not acceptable" and only_cand:
            verdict = "inconclusive"
            reasons.append(f"{name}: the drop includes {only_cand} problem(s) the candidate's server never answered; "
                           "inconclusive until they are re-run (resume_run), as a serving failure is not a quantization loss.")
    level = f"{100 * request.confidence:g}%"
    return TaskComparison(
        task=name, metric=evidence.metric, score="value", scale="fraction",
        baseline=interval.baseline if interval else evidence.baseline_score,
        candidate=interval.candidate if interval else evidence.candidate_score,
        baseline_stderr=base_score.stderr if base_score else None, candidate_stderr=cand_score.stderr if cand_score else None,
        delta=interval.delta if interval else evidence.delta, delta_stderr=None, ci_low=low, ci_high=high,
        method=f"paired per problem over {evidence.n_paired} problems: {level} CI by Student t on the per-problem deltas "
               f"(as nel gate); {evidence.test} exact test as nel compare",
        verdict=verdict, why=why, test=evidence.test, p_value=evidence.p_value,
        n_paired=evidence.n_paired, n_regressions=evidence.n_regressions, n_improvements=evidence.n_improvements,
        nel_verdict=evidence.verdict,
        regressed=[_flip(f) for f in evidence.regressed], improved=[_flip(f) for f in evidence.improved])


def _compare_next(request: CompareResultsInput, base_dir: Path, cand_dir: Path, progress: ProgressFn) -> CompareResultsOutput:
    from quanteval.engines.nel_next import nextresults

    nel_max_drop = nextresults.DEFAULT_MAX_DROP if request.max_drop is None else margin(request)
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
        rows.append(_next_row(name, base, cand, request, nel_max_drop, reasons))
    progress(1, 3, "statistics done")
    _flag_anomalies(rows, request, cand_dir)
    comparability, why_not = comparability_verdict(items)
    reasons += why_not
    acceptability = _acceptability(comparability, rows, reasons)
    reasons += [f"{row.task}: {row.nel_verdict} ({row.verdict}): {row.why}." for row in rows]
    output_dir = _output_dir(request)
    png = output_dir / "comparison.png" if rows else None
    if png is not None:
        render_chart(rows, margin(request), png)
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


def _output_dir(request: CompareResultsInput) -> Path:
    output_dir = Path(request.output_dir).expanduser() if request.output_dir else state_dir() / "comparisons" / time.strftime("%Y%m%d-%H%M%S")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ToolError(f"output_dir {output_dir}: cannot create it ({exc.strerror}). Pass a writable directory.") from None
    return output_dir
