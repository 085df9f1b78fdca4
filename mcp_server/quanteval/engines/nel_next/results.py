"""Reading nel-next runs for the result tools: scores and validation of the bundles nextresults parses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar

from quanteval import engines, ledger, redact
from quanteval.engines.base import EngineName
from quanteval.engines.nel_next import nelnext, nextresults
from quanteval.engines.runresults import (
    Evidence,
    ExtractScoresOutput,
    Finding,
    ResultsReader,
    ScoreValue,
    TaskScores,
    TaskValidation,
    ValidateRunInput,
    ValidateRunOutput,
    failure_finding,
    infer_scale,
    run_verdict,
)
from quanteval.failures import Diagnosis
from quanteval.models import ProgressFn, ToolError, no_progress


def next_run_dir(run: str) -> Path | None:
    """The directory of a nel-next run named by path or ledger id; None when the run is NEL 0.2.6's."""
    local = Path(run.strip()).expanduser()
    if local.is_dir():
        return local if nextresults.is_run_dir(local) else None
    try:
        record = ledger.get(run.strip())
    except ToolError:
        return None
    return engines.for_record(record).results_dir(record)


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
        task.findings.append(Finding(severity="fail", check="samples", message=f"{evaluated} of {expected} samples evaluated", evidence=[shown]))
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
    try:
        record = ledger.get(run.strip())
        if record.status != "failed":
            return None
        return engines.for_record(record).logs(record, 20, None, no_progress).diagnosis
    except ToolError:  # not a ledger id, or the cluster does not answer: the finding above stands alone
        return None


def _validate_next_run(request: ValidateRunInput, run_dir: Path) -> ValidateRunOutput:
    outcome = nextresults.run_outcome(run_dir)
    found = nextresults.bundles(run_dir)
    tasks = [_validate_next_bundle(bundle, request) for bundle in found.values()]
    facts = nelnext.read_run_facts(run_dir)
    for task in tasks:
        _check_checkpoint(task, facts, str(run_dir / nelnext.RUN_FACTS_NAME), request)
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


class NelNextResults(ResultsReader):
    """nel-next's run directories (checkpoint.json, one bundle per benchmark), named by path or ledger id."""

    name: ClassVar[EngineName] = "nel-next"

    def is_run_dir(self, path: Path) -> bool:
        return nextresults.is_run_dir(path)

    def extract_scores(self, run: str) -> ExtractScoresOutput:
        run_dir = _run_dir(run)
        return ExtractScoresOutput(run=run, tasks=[next_task_scores(bundle) for bundle in nextresults.bundles(run_dir).values()])

    def validate_run(self, request: ValidateRunInput, progress: ProgressFn) -> ValidateRunOutput:
        return _validate_next_run(request, _run_dir(request.run))


def _run_dir(run: str) -> Path:
    run_dir = next_run_dir(run)
    if run_dir is None:
        raise ToolError(f"run '{run}': no nel-next run directory (checkpoint.json, <benchmark>/eval-*.json) there.")
    return run_dir
