"""Reading nel-next runs for the result tools: scores and validation of the bundles nextresults parses, and two runs
side by side as `nel gate` and `nel compare` read them (bundles found and matched as nel gate finds them)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from quanteval import ledger, redact
from quanteval.engines.nel_next import nelnext, nextresults
from quanteval.engines.recipes import recipe_for_benchmark
from quanteval.engines.runresults import (
    GATED_METRICS,
    Evidence,
    ExtractScoresOutput,
    Finding,
    Outputs,
    PairedTest,
    Problems,
    ResultsReader,
    RunBenchmark,
    RunBenchmarks,
    ScoreValue,
    TaskScores,
    TaskValidation,
    ValidateRunInput,
    ValidateRunOutput,
    failure_finding,
    implausible_score,
    infer_scale,
    model_family,
    problem_values,
    run_verdict,
)
from quanteval.failures import Diagnosis
from quanteval.models import ProgressFn, ToolError, no_progress


def _own_record(run: str) -> ledger.Record | None:
    """The ledger record of a nel-next run named by its id; None for anything else (a path, NEL 0.2.6's run)."""
    try:
        record = ledger.get(run.strip())
    except ToolError:
        return None
    return record if record.details.get("engine") == NelNextResults.name else None


def next_run_dir(run: str) -> Path | None:
    """The directory of a nel-next run named by path or ledger id; None when the run is NEL 0.2.6's."""
    local = Path(run.strip()).expanduser()
    if local.is_dir():
        return local if nextresults.is_run_dir(local) else None
    if (record := _own_record(run)) is None:
        return None
    from quanteval.engines.nel_next import runs  # the run code only for a ledger id: a reader of paths stays light

    return runs.results_dir(record)


def next_task_scores(bundle: nextresults.Bundle) -> TaskScores:
    scores = []
    for name, metric in bundle.metrics().items():
        low, high = metric.get("bootstrap_ci_lower"), metric.get("bootstrap_ci_upper")
        stderr = (high - low) / 3.92 if isinstance(low, (int, float)) and isinstance(high, (int, float)) else None
        scores.append(ScoreValue(task=bundle.name, metric=name, score="value", value=float(metric["value"]), stderr=stderr,
                                 count=bundle.samples * bundle.repeats or None, scale=infer_scale(float(metric["value"])),
                                 scale_from="inferred", path=f"benchmark.scores.{name}.value"))
    headline = next((score for score in scores if score.metric == nextresults.PRIMARY_METRIC), scores[0] if scores else None)
    return TaskScores(task_dir=str(bundle.directory), task=bundle.name, headline=headline, scores=scores[:50],
                      problem=None if scores else f"{bundle.path.name} has no scores")


def _validate_next_bundle(bundle: nextresults.Bundle, request: ValidateRunInput) -> TaskValidation:
    runtime = bundle.scores.get("runtime") or {}
    shuffle = (bundle.data.get("config") or {}).get("shuffle") or {}
    max_problems = (bundle.data.get("config") or {}).get("max_problems")
    expected_problems = shuffle.get("ds_effective_size") or max_problems
    expected = expected_problems * bundle.repeats if expected_problems else None
    evaluated = int(bundle.data.get("n_results") or bundle.samples * bundle.repeats)
    reasons = runtime.get("finish_reason_counts") or {}
    answered = sum(int(v) for v in reasons.values()) or None
    failed_requests = bundle.request_failures()
    errors = max(int(runtime.get("model_errors") or 0), sum(failed_requests.values()))
    error_share = errors / max(1, evaluated)
    truncated_share = int(reasons.get("length", 0)) / answered if answered else None
    task = TaskValidation(task_dir=str(bundle.directory), task=bundle.name, finished=True, expected_samples=expected,
                          expected_samples_from="nel-next dataset size" if expected else None, evaluated_samples=evaluated,
                          responses=answered, error_share=error_share, truncated_share=truncated_share)
    shown = Evidence(file=str(bundle.path), text=json.dumps({"samples": bundle.samples, "repeats": bundle.repeats,
                     "n_results": evaluated, "model_errors": runtime.get("model_errors"), "failed_requests": failed_requests,
                     "finish_reason_counts": reasons})[:300])
    if bundle.metric() is None:
        task.findings.append(Finding(severity="fail", check="scores", message=f"no {nextresults.PRIMARY_METRIC} score in the bundle", evidence=[shown]))
    if expected is not None and evaluated < expected:
        shard = (bundle.data.get("config") or {}).get("shard") or {}
        why = (f": the bundle is shard {shard.get('idx')} of {shard.get('total')} (problems {shard.get('range')}), run with "
               "NEL_SHARD_IDX/NEL_TOTAL_SHARDS (or SLURM_ARRAY_TASK_ID) set; merge every shard's run with `nel eval merge "
               "DIR` and validate the merged run" if int(shard.get("total") or 1) > 1 else "")
        task.findings.append(Finding(severity="fail", check="samples", message=f"{evaluated} of {expected} samples evaluated{why}",
                                     evidence=[shown]))
    if error_share > request.max_error_share:
        kinds = ", ".join(f"{name} {count}" for name, count in failed_requests.items()) or "model errors"
        task.findings.append(Finding(severity="fail", check="http_errors", message=(
            f"{errors} requests got no answer ({error_share:.1%}; {kinds}), over {request.max_error_share:.1%}: "
            "their problems scored 0. Check the endpoint (deployment_status) and run_logs"), evidence=[shown]))
    if truncated_share is not None and truncated_share > request.max_truncated_share:
        task.findings.append(Finding(severity="fail", check="truncation", message=(
            f"{truncated_share:.1%} of answers were cut at max_tokens (finish_reason=length), over {request.max_truncated_share:.1%}: "
            "raise services.<model>.generation.max_tokens within the served context"), evidence=[shown]))
    return task


def _against_the_baseline(task: TaskValidation, anomalous: dict | None) -> None:
    """A candidate's canary that failed where its baseline's passed with the same budget (evaluate_quantization wrote
    that in the run's facts): its failures are the quantization's or the serving's, not settings to change."""
    if not anomalous:
        return
    for finding in task.findings:
        if finding.check in ("truncation", "scores", "samples"):
            finding.message = finding.message.split(": raise ")[0] + (
                f": the baseline's canary ({anomalous.get('baseline_run')}) passed with the same settings (max_tokens "
                f"{anomalous.get('max_tokens')}, same benchmarks and server flags), so this is a broken quantization or a "
                "serving bug, not a setting to raise (evaluate_quantization's verdict: ANOMALOUS)")


def _check_score(task: TaskValidation, bundle: nextresults.Bundle, facts: dict | None) -> None:
    """A score no working setup gives (runresults.implausible_score), with the protocol the run asked through and its
    first answers as evidence. The answers the score counts: those whose request got one."""
    scored = (task.evaluated_samples or 0) - sum(bundle.request_failures().values())
    recipe = recipe_for_benchmark(bundle.name if bundle.name.startswith("skills://") else f"skills://{bundle.name}")
    services = ((facts or {}).get("config") or {}).get("services") or {}
    protocols = sorted({str(s.get("protocol") or "chat_completions") for s in services.values() if isinstance(s, dict)})
    setup = f"The run asked through {' and '.join(protocols)}." if protocols else ""
    answers = [Evidence(file=str(bundle.directory / "results.jsonl"), text=redact.shown_line(
        f"problem {problem}: expected {record.get('expected_answer')!r}, extracted {record.get('extracted_answer')!r}, "
        f"answered {str(record.get('model_response'))[:150]!r}"))
        for (problem, _), record in sorted(nextresults.paired_records(bundle.directory).items())[:2]]
    if finding := implausible_score(next_task_scores(bundle).headline, scored, recipe.choices if recipe else None, setup, answers):
        task.findings.append(finding)


def _check_checkpoint(task: TaskValidation, facts: dict | None, facts_file: str, request: ValidateRunInput) -> None:
    """Which checkpoint was served: nel-next records only the served model name, so quanteval records at launch what
    the server reported (a managed server's model path, or an endpoint's /v1/models root) in the run's facts."""
    facts = facts or {}
    task.loaded_checkpoint = (facts.get("served") or {}).get("root") or None
    task.served_checkpoint = facts.get("checkpoint") or None
    served = task.served_checkpoint or task.loaded_checkpoint
    evidence = [Evidence(file=facts_file, text=json.dumps({"checkpoint": task.served_checkpoint, "root": task.loaded_checkpoint}))]
    if served is None:
        task.findings.append(Finding(
            severity="unknown" if request.expected_checkpoint else "warning", check="checkpoint", message=(
                "which checkpoint was served is not known (the run's server reported no model path when it started): "
                "the checkpoint went unchecked. Check the deployment (deployment_status)."), evidence=[]))
    elif request.expected_checkpoint and not _same_path(served, request.expected_checkpoint):
        task.findings.append(Finding(severity="fail", check="checkpoint",
                                     message=f"The server served {served}, not {request.expected_checkpoint}.", evidence=evidence))


def _same_path(served: str, expected: str) -> bool:
    """Do two checkpoint paths name one directory (symlinks resolved; compared as written where neither is one here)?"""
    left, right = Path(served).expanduser(), Path(expected).expanduser()
    if left.is_dir() or right.is_dir():
        return left.resolve() == right.resolve()
    return served.rstrip("/") == expected.rstrip("/")


def _next_failure(run: str) -> Diagnosis | None:
    """Why a nel-next run of the ledger failed before writing any result (e.g. a SLURM job whose container could not
    start): run_logs' diagnosis of its log, as NEL 0.2.6 runs get theirs."""
    record = _own_record(run)
    if record is None or record.status != "failed":
        return None
    from quanteval.engines.nel_next import runs

    try:
        return runs.logs(record, 20, None, no_progress).diagnosis
    except ToolError:  # the cluster does not answer: the finding above stands alone
        return None


def _validate_next_run(request: ValidateRunInput, run_dir: Path) -> ValidateRunOutput:
    outcome = nextresults.run_outcome(run_dir)
    found = nextresults.bundles(run_dir)
    tasks = [_validate_next_bundle(bundle, request) for bundle in found.values()]
    facts = nelnext.read_run_facts(run_dir)
    for task, bundle in zip(tasks, found.values(), strict=True):
        _check_score(task, bundle, facts)
        _check_checkpoint(task, facts, str(run_dir / nelnext.RUN_FACTS_NAME), request)
        _against_the_baseline(task, (facts or {}).get("anomalous"))
    for name, error in outcome.failed.items():
        tasks.append(TaskValidation(task_dir=str(run_dir), task=name, finished=False, findings=[Finding(
            severity="fail", check="finished", message=f"nel-next failed the benchmark: {redact.shown_line(error)}",
            evidence=[Evidence(file=str(run_dir / "checkpoint.json"), text=redact.shown_line(error))])]))
    if not found and not outcome.failed:
        unfinished = TaskValidation(task_dir=str(run_dir), finished=False, findings=[Finding(
            severity="fail", check="finished", message="no benchmark bundle (eval-*.json) in the run directory: the run did not finish")])
        if (diagnosis := _next_failure(request.run)) is not None:
            unfinished.diagnosis = diagnosis
            unfinished.findings.append(failure_finding(diagnosis))
        tasks.append(unfinished)
    return run_verdict(request.run, tasks)


def _run_dir(run: str) -> Path:
    run_dir = next_run_dir(run)
    if run_dir is None:
        raise ToolError(f"run '{run}': no nel-next run directory (checkpoint.json, <benchmark>/eval-*.json) there.")
    return run_dir


# ---------------------------------------------------------------- bundles, as nel gate finds and matches them


def _read_bundle(path: Path) -> nextresults.Bundle | None:
    """An eval-*.json bundle, or None when it is unreadable or names no benchmark (nel gate skips it)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    benchmark = data.get("benchmark") if isinstance(data, dict) else None
    name = benchmark.get("name") if isinstance(benchmark, dict) else None
    return nextresults.Bundle(name=str(name), directory=path.parent, path=path, data=data) if name else None


def is_results_path(path: Path) -> bool:
    """What nel gate and nel compare read: a run directory, one eval-*.json bundle, or a folder of bundles (in it or
    one per sub-folder)."""
    if path.is_file():
        return path.name.startswith("eval-") and path.suffix == ".json"
    return path.is_dir() and (nextresults.is_run_dir(path) or any(path.glob("eval-*.json")) or any(path.glob("*/eval-*.json")))


def results_dir(value: str, side: str) -> Path:
    """A run directory, or the folder of one eval-*.json bundle (as nel gate accepts either), or a nel-next run's
    record id (a SLURM run's results copied from the cluster, shards merged)."""
    path = Path(value).expanduser()
    if path.is_file() and path.name.startswith("eval-") and path.suffix == ".json":
        return path.parent
    if not path.is_dir():
        if (recorded := next_run_dir(value)) is not None:
            return recorded
        raise ToolError(f"{side} {value}: not a directory. Give the folder `nel eval run -o DIR` wrote (one sub-folder "
                        "per benchmark), one eval-*.json bundle, or a nel-next run's record id; or, for NEL 0.2.6, "
                        "the run's directory, host:path, record id or invocation id.")
    return path


def discover(directory: Path, side: str) -> tuple[dict[str, nextresults.Bundle], list[str]]:
    """eval-*.json bundles by benchmark name: in the folder itself, or exactly one per sub-folder (nel gate's rule);
    a run submitted to SLURM keeps each benchmark one level deeper, in its sub-run."""
    found: dict[str, nextresults.Bundle] = {}
    warnings: list[str] = []

    def register(path: Path) -> None:
        bundle = _read_bundle(path)
        if bundle is None:
            warnings.append(f"{side}: {path} is not a readable eval bundle (no benchmark.name); skipped")
            return
        if bundle.name in found:
            raise ToolError(f"{side} {directory}: benchmark {bundle.name!r} appears twice ({found[bundle.name].path} and "
                            f"{path}); keep one.")
        found[bundle.name] = bundle

    if nextresults.submitted_layout(directory):
        return nextresults.bundles(directory), warnings
    for path in sorted(directory.glob("eval-*.json")):
        register(path)
    for sub in sorted(p for p in directory.iterdir() if p.is_dir()):
        candidates = sorted(sub.glob("eval-*.json"))
        if len(candidates) == 1:
            register(candidates[0])
        elif len(candidates) > 1:
            warnings.append(f"{side}: {sub} holds {len(candidates)} eval bundles; skipped (nel gate skips it too)")
    if not found:
        raise ToolError(f"{side} {directory}: no benchmark results (no eval-*.json bundle in it or in its sub-folders). "
                        "Give the folder `nel eval run -o DIR` wrote, after the run finished.")
    return found, warnings


def _problems(bench_dir: Path) -> Problems | None:
    """results.jsonl as nel compare pairs it: rewards by problem_idx (one per repeat), each problem's category (its
    first record's), and what happened to each problem besides its reward (no answer, no extractable answer)."""
    records = nextresults.paired_records(bench_dir)
    if not records:
        return None
    first: dict[Any, dict[str, Any]] = {}
    for (problem, _repeat), record in records.items():
        first.setdefault(problem, record)
    categories = {problem: str(category) for problem, record in first.items()
                  if (category := (record.get("metadata") or {}).get("category")
                      or (record.get("scoring_details") or {}).get("category")) is not None}
    return Problems(rewards=nextresults.per_problem_rewards(records), categories=categories,
                    infra_errors=nextresults.infra_errors(records), unscored=nextresults.unscored(records),
                    status_unknown=nextresults.status_unknown(records))


def _float(value: Any) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def _server(serving: dict[str, Any] | None) -> dict[str, Any] | str:
    if not serving:
        return "not started by quanteval"
    return {key: serving.get(key) for key in ("framework", "version", "launcher", "numerics", "flags")}


def _settings(bundle: nextresults.Bundle, facts: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The benchmark's entry in the run's recorded config, its solver's service, and the generation settings it ran
    with (the service's, overridden by the solver's)."""
    config = facts.get("config") or {}
    entry = next((b for b in config.get("benchmarks") or [] if Path(str(b.get("name"))).stem == bundle.name
                  or b.get("name") == bundle.name), {})
    solver = entry.get("solver") or {}
    service = (config.get("services") or {}).get(solver.get("service") or "", {})
    return entry, service, {**(service.get("generation") or {}), **(solver.get("generation") or {})}


def _facets(bundle: nextresults.Bundle, run_dir: Path, checkpoint: str | None) -> dict[str, Any] | None:
    facts = nelnext.read_run_facts(run_dir)
    if facts is None:
        return None
    entry, service, generation = _settings(bundle, facts)
    solver = entry.get("solver") or {}
    served = facts.get("served") or {}
    return {
        "model": model_family(checkpoint or facts.get("checkpoint")),
        # how the server computed (framework, release, numeric path, flags), where quanteval started it: a run served
        # on another path differs on a share of answers for that alone
        "serving": {"protocol": service.get("protocol"), "served_context": served.get("max_model_len"),
                    "server": _server(facts.get("serving"))},
        # what graded it: nel-next's release (its bundle's) and, for skills:// benchmarks, NeMo-Skills' (run facts)
        "task": bundle.name, "container": {"runner": "in-process (nel-next)", "nemo-evaluator": bundle.data.get("sdk_version"),
                                           **(facts.get("harness") or {})},
        "prompts": {"system_prompt": solver.get("system_prompt"), "instruction_template": entry.get("instruction_template"),
                    "fewshot": entry.get("fewshot")},
        "extra_args": entry.get("params") or {}, "generation": {k: v for k, v in generation.items() if v is not None},
        "reasoning": {"reasoning_pattern": service.get("reasoning_pattern")}, "repeats": bundle.repeats,
        "samples": {"problems": bundle.samples, "shuffle_seed": entry.get("shuffle_seed")},
        "judge": [m for m in (entry.get("scoring") or {}).get("metrics") or [] if "judge" in str(m.get("type", ""))],
    }


class NelNextResults(ResultsReader):
    """nel-next's run directories (checkpoint.json, one bundle per benchmark), named by path or ledger id."""

    name: ClassVar[str] = "nel-next"
    title: ClassVar[str] = "nel-next"

    def is_run_dir(self, path: Path) -> bool:
        return is_results_path(path)

    def extract_scores(self, run: str) -> ExtractScoresOutput:
        run_dir = _run_dir(run)
        return ExtractScoresOutput(run=run, tasks=[next_task_scores(bundle) for bundle in nextresults.bundles(run_dir).values()])

    def validate_run(self, request: ValidateRunInput, progress: ProgressFn) -> ValidateRunOutput:
        return _validate_next_run(request, _run_dir(request.run))

    # ---------------------------------------------------------------- two runs side by side

    problems_source: ClassVar[str] = "results.jsonl"

    def run_benchmarks(self, run: str, side: str) -> RunBenchmarks:
        directory = results_dir(run, side)
        found, warnings = discover(directory, side)
        benchmarks = {name: RunBenchmark(name=name, scores=next_task_scores(bundle), problems=_problems(bundle.directory),
                                         location=bundle) for name, bundle in found.items()}
        return RunBenchmarks(label=str(directory), benchmarks=benchmarks, warnings=warnings, root=directory)

    def served_checkpoint(self, run: RunBenchmarks) -> str | None:
        return (nelnext.read_run_facts(run.root) or {}).get("checkpoint") if run.root else None

    def facets(self, run: RunBenchmarks, benchmark: RunBenchmark, checkpoint: str | None) -> dict[str, Any] | None:
        return _facets(benchmark.location, run.root, checkpoint) if run.root else None

    def outputs(self, run: RunBenchmarks, benchmark: RunBenchmark) -> Outputs | None:
        """From the bundle's folder: inference_log.jsonl (finish_reason, completion and reasoning tokens, the
        response), results.jsonl (the samples asked and those whose request got no answer: scoring_details'
        infra_error/system), runtime_stats.json (tokens/s, latency percentiles) and the serving quanteval recorded
        with the run. None without results.jsonl."""
        bundle: nextresults.Bundle = benchmark.location
        results = nextresults.paired_records(bundle.directory)
        if not results:
            return None
        logged = nextresults.inference_records(bundle.directory)
        stats = nextresults.runtime_stats(bundle.directory)
        known = results.keys() & logged.keys()
        counts = lambda key: {k: int(logged[k][key]) for k in known if isinstance(logged[k].get(key), int)}  # noqa: E731
        failed = None if nextresults.status_unknown(results) else sum(
            1 for record in results.values() if nextresults.error_category(record) in nextresults.INFRA_CATEGORIES)
        latency = stats.get("latency_percentiles_ms") or {}
        facts = (nelnext.read_run_facts(run.root) or {}) if run.root else {}
        generation = _settings(bundle, facts)[2]
        return Outputs(
            samples=len(results), completion_tokens=counts("completion_tokens"), reasoning_tokens=counts("reasoning_tokens"),
            finish_reasons={k: str(logged[k]["finish_reason"]) for k in known if logged[k].get("finish_reason")},
            texts={k: str(v.get("model_response")) for k, v in results.items() if isinstance(v.get("model_response"), str)},
            failed=failed, tokens_per_second=_float(stats.get("tokens_per_second")) or None,
            latency_ms={k: float(v) for k, v in latency.items() if k in ("p50", "p90") and _float(v)},
            served=facts.get("serving") or {}, temperature=_float(generation.get("temperature")),
            max_tokens=generation.get("max_tokens"))

    def compared_scores(self, base: RunBenchmark, cand: RunBenchmark) -> list[tuple[ScoreValue, ScoreValue]]:
        """The headline (pass@1) of each benchmark, as nel compare reports it; none when the two differ in metric."""
        base_score, cand_score = base.scores.headline, cand.scores.headline
        if base_score is None or cand_score is None or base_score.metric != cand_score.metric:
            return []
        return [(base_score, cand_score)]

    def paired_values(self, benchmark: RunBenchmark, score: ScoreValue) -> tuple[dict[Any, float] | None, str]:
        if benchmark.problems is None:
            return None, ""
        return problem_values(benchmark.problems.rewards, nextresults.PRIMARY_METRIC), ""

    def gate_metric(self, base: RunBenchmark, cand: RunBenchmark) -> str:
        """nel gate's choice when the policy names none: mean_reward, pass@1, a scorer: metric, by what both bundles score."""
        base_scores, cand_scores = base.location.scores, cand.location.scores
        shared = [m for m in sorted(set(base_scores) | set(cand_scores))
                  if isinstance(base_scores.get(m), dict) and isinstance(cand_scores.get(m), dict)
                  and _float(base_scores[m].get("value")) is not None and _float(cand_scores[m].get("value")) is not None]
        for preferred in GATED_METRICS:
            if preferred in shared:
                return preferred
        return next((m for m in shared if m.startswith("scorer:")), "mean_reward")

    def gate_scores(self, base: RunBenchmark, cand: RunBenchmark, metric: str, z: float,
                    paired: bool) -> tuple[float, float, list[float] | None] | None:
        """The bundles' own scores, with their CI where the bundle gives ci_lower/ci_upper (nel gate's fallback)."""
        base_metric, cand_metric = base.location.scores.get(metric), cand.location.scores.get(metric)
        if not isinstance(base_metric, dict) or not isinstance(cand_metric, dict) or not base_metric or not cand_metric:
            return None
        base_value, cand_value = _float(base_metric.get("value")), _float(cand_metric.get("value"))
        if base_value is None or cand_value is None:
            return None
        bounds = [_float(base_metric.get("ci_lower")), _float(base_metric.get("ci_upper")),
                  _float(cand_metric.get("ci_lower")), _float(cand_metric.get("ci_upper"))]
        return base_value, cand_value, None if None in bounds else bounds  # type: ignore[return-value]

    def paired_test(self, base: RunBenchmark, cand: RunBenchmark, max_drop: float | None) -> PairedTest | None:
        """nel compare's McNemar / sign test and verdict; None without per-problem results on both sides."""
        try:
            return nextresults.compare_bundles(base.location, cand.location,
                                               nextresults.DEFAULT_MAX_DROP if max_drop is None else max_drop)
        except ToolError:
            return None
