"""NEL 0.2.6's results reader: scores (runtree.py locates and reads its runs) and validate_run's checks per task:
finished or not, samples, HTTP errors, truncation, reasoning, judge and sandbox failures, and which checkpoint the
server loaded. Logs are grepped where they are (here, or on the cluster), never read whole."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any, ClassVar

from quanteval import failures, redact
from quanteval.clusters import ssh
from quanteval.engines.nel.runtree import (
    METADATA_FILE,
    METRICS_FILE,
    RESULTS_FILE,
    RUN_CONFIG_FILE,
    SAMPLE_OUTPUTS_DIR,
    RunTree,
    dataset_size,
    deployment_mounts,
    host_path,
    is_task_dir,
    load_json,
    locate_run,
    normal,
    per_sample_problems,
    repeats,
    run_config,
    task_scores,
    tasks_by_name,
)
from quanteval.engines.recipes import list_recipes
from quanteval.engines.runresults import (
    Evidence,
    ExtractScoresOutput,
    Finding,
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
    run_verdict,
)
from quanteval.failures import Diagnosis
from quanteval.models import ProgressFn

MAX_EVIDENCE_PER_CHECK = 5
PAIRED_MATCH_TOLERANCE = 0.005  # per-sample means must reproduce the headline to within half a point

# Log lines that matter, one pattern per check, written in the regex dialect Python and POSIX ERE
# (grep -E) share: grep finds the candidate lines (locally or on the cluster), Python sorts them into checks.
# The failures are failures.py's (its table is the one place for them); resumed and loaded_checkpoint are facts.
LOG_PATTERNS: dict[str, re.Pattern[str]] = {
    name: re.compile(pattern, re.IGNORECASE)
    for name, pattern in {
        "slurm_timeout": failures.SLURM_ENDED,
        "resumed": r"RESUMING\.\.\.",
        "judge_failure": failures.FAILURE_PATTERNS["judge"],
        "sandbox_failure": failures.FAILURE_PATTERNS["sandbox"],
        "loaded_checkpoint": r"model_path='|Starting to load model |'model': '",
    }.items()
}
GREP_PATTERN = "|".join(f"({pattern.pattern})" for pattern in LOG_PATTERNS.values())
GREP_MAX_PER_FILE = 100  # candidate lines per log file; evidence keeps MAX_EVIDENCE_PER_CHECK of them
# Which checkpoint: SGLang prints its server_args, vLLM its load line or its non-default args.
CHECKPOINT_PATH = re.compile(r"model_path='([^']+)'|Starting to load model (\S+)|'model': '([^']+)'")



def _scan_logs(tree: RunTree, task_dir: Path) -> dict[str, list[Evidence]]:
    """grep where the logs are (here, or on the cluster): they are often GBs of server output, never read whole."""
    hits: dict[str, list[Evidence]] = {name: [] for name in LOG_PATTERNS}
    host = tree.host or ssh.LOCAL
    logs = tree.remote_path(task_dir / "logs") if tree.host else str(task_dir / "logs")
    command = (f"cd {shlex.quote(logs)} 2>/dev/null && grep -n -i -E -H -m {GREP_MAX_PER_FILE} "
               f"{shlex.quote(GREP_PATTERN)} -- *.log")
    result = ssh.run_remote(host, command, timeout=300)
    for raw in result.stdout.splitlines():
        name, _, rest = raw.partition(":")
        number, _, line = rest.partition(":")
        if number.isdigit():
            shown = f"{tree.host}:{logs}/{name}" if tree.host else str(Path(logs) / name)
            _classify(line, shown, int(number), hits)
    return hits



def _classify(line: str, file: str, number: int, hits: dict[str, list[Evidence]]) -> None:
    for name, pattern in LOG_PATTERNS.items():
        if len(hits[name]) < MAX_EVIDENCE_PER_CHECK and pattern.search(line):
            hits[name].append(Evidence(file=file, line=number, text=redact.shown_line(line)))



def _loaded_checkpoint(evidence: list[Evidence]) -> str | None:
    for item in evidence:
        match = CHECKPOINT_PATH.search(item.text)
        if match:
            return next(value for value in match.groups() if value)
    return None



def _exit_code(task_dir: Path) -> int | None:
    stage_exit = task_dir / "logs" / "stage.exit"
    if not stage_exit.is_file():
        return None
    _, _, code = stage_exit.read_text(encoding="utf-8", errors="replace").strip().rpartition(" ")
    return int(code) if code.lstrip("-").isdigit() else None



def _leaked_reasoning(task_dir: Path) -> int | None:
    files = sorted((task_dir / "artifacts" / SAMPLE_OUTPUTS_DIR).glob("*.jsonl"))
    if not files:
        return None
    leaked = 0
    for path in files:
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                try:
                    generation = json.loads(line).get("generation")
                except (json.JSONDecodeError, AttributeError):
                    continue
                if isinstance(generation, str) and ("<think>" in generation or "</think>" in generation):
                    leaked += 1
    return leaked



def _diagnose(tree: RunTree, task_dir: Path) -> Diagnosis:
    """Why a task failed, from its logs where they are (here or on the cluster)."""
    logs = tree.remote_path(task_dir / "logs") if tree.host else str(task_dir / "logs")
    result = ssh.run_remote(tree.host or ssh.LOCAL, failures.grep_command(logs, 200, tail_lines=40), timeout=120)
    shown = f"{tree.host}:{logs}" if tree.host else logs
    tails, hits = failures.parse_grep(result.stdout, shown)
    # The task's own client log ends the story; NEL's slurm-*.log holds the job script around it.
    last = [line for _, lines in sorted(tails, key=lambda tail: "client" in tail[0]) for line in lines]
    return failures.diagnose(hits, last)



def validate_task(tree: RunTree, task_dir: Path, request: ValidateRunInput) -> TaskValidation:
    scores = task_scores(tree, task_dir)
    report = TaskValidation(task_dir=tree.display(task_dir), task=scores.task)
    logs = _scan_logs(tree, task_dir)
    _check_finished(tree, task_dir, scores, logs, report)
    _check_samples(tree, task_dir, scores, report)
    _check_score(task_dir, scores, report)
    _check_responses(tree, task_dir, request, report)
    _check_reasoning(tree, task_dir, report)
    for check in ("judge_failure", "sandbox_failure"):
        if logs[check]:
            report.findings.append(Finding(severity="fail", check=check,
                                           message=f"{check.replace('_', ' ')} lines in the logs: the scores of the affected samples are not the model's.",
                                           evidence=logs[check]))
    _check_checkpoint(tree, task_dir, request, logs["loaded_checkpoint"], report)
    return report


def _check_finished(tree: RunTree, task_dir: Path, scores: TaskScores, logs: dict[str, list[Evidence]], report: TaskValidation) -> None:
    """Finished or not. A SLURM timeout is fine when the paired restart job resumed and finished the task."""
    findings = report.findings
    exit_code = _exit_code(task_dir)
    has_results = scores.problem is None or bool(scores.scores)
    report.resumed_after_timeout = bool(logs["slurm_timeout"]) and has_results
    if logs["slurm_timeout"] and has_results:
        findings.append(Finding(severity="info", check="finished", message="SLURM stopped the job (time limit/preemption) and the restart job resumed and finished it.",
                                evidence=logs["slurm_timeout"][:2] + logs["resumed"][:2]))
    if exit_code not in (None, 0):
        report.finished = False
        findings.append(Finding(severity="fail", check="finished", message=f"The task failed: it exited with code {exit_code}.",
                                evidence=[Evidence(file=tree.display(task_dir / "logs" / "stage.exit"), line=1, text=str(exit_code))]))
    elif not has_results:
        report.finished = False
        cause = " SLURM stopped it and no resume finished it: resume_run." if logs["slurm_timeout"] else ""
        findings.append(Finding(severity="fail", check="finished", message=f"The task failed or never finished: {scores.problem}.{cause}",
                                evidence=logs["slurm_timeout"][:2]))
    if report.finished is False:
        report.diagnosis = _diagnose(tree, task_dir)
        findings.append(failure_finding(report.diagnosis))
    else:
        report.finished = True
        if scores.problem:
            findings.append(Finding(severity="warning", check="score", message=scores.problem))


def _check_samples(tree: RunTree, task_dir: Path, scores: TaskScores, report: TaskValidation) -> None:
    """Samples scored against samples expected (limit_samples, the recipe or NEL's dataset sizes, times repeats)."""
    artifacts = task_dir / "artifacts"
    config = run_config(task_dir)
    counts = [s.count for s in scores.scores if isinstance(s.count, int)]
    report.evaluated_samples = max(counts) if counts else None
    params = ((config.get("config") or {}).get("params")) or {}
    size, size_source = dataset_size(config)
    report.expected_samples = None if size is None else size * repeats(params)
    report.expected_samples_from = size_source
    if not report.finished:
        return
    if report.expected_samples is None:
        report.findings.append(Finding(severity="unknown", check="samples", message=(
            f"{tree.display(artifacts / RUN_CONFIG_FILE)}: no limit_samples, and neither a recipe (samples:) nor NEL "
            f"knows the size of {scores.task or 'this task'}, so dropped samples cannot be counted.")))
    elif report.evaluated_samples is None:
        report.findings.append(Finding(severity="unknown", check="samples", message=f"{tree.display(artifacts / RESULTS_FILE)}: scores carry no stats.count, so dropped samples cannot be counted."))
    elif report.evaluated_samples not in (report.expected_samples, report.expected_samples // repeats(params)):
        policy = (params.get("extra") or {}).get("failed_samples_policy")
        dropped = report.expected_samples - report.evaluated_samples
        accounting = f"{dropped} dropped or failed" if dropped > 0 else f"{-dropped} more than requested"
        report.findings.append(Finding(
            severity="fail", check="samples",
            message=f"{report.evaluated_samples} samples scored, {report.expected_samples} expected ({accounting}"
            + (f"; failed_samples_policy={policy}" if policy else "") + "). The score covers a different set than the baseline's.",
            evidence=[Evidence(file=tree.display(artifacts / RESULTS_FILE), text=f"stats.count={report.evaluated_samples}")]))


def _check_score(task_dir: Path, scores: TaskScores, report: TaskValidation) -> None:
    """A finished task whose score no working setup gives (runresults.implausible_score: every answer wrong, or a
    multiple-choice score at chance where its recipe knows the choices)."""
    if not report.finished or scores.headline is None:
        return
    recipe = next((r for r in list_recipes() if r.name == scores.recipe), None) if scores.recipe else None
    endpoint = ((run_config(task_dir).get("target") or {}).get("api_endpoint") or {}).get("type")
    setup = f"The run asked through the {endpoint} endpoint." if endpoint else ""
    finding = implausible_score(scores.headline, report.evaluated_samples or scores.headline.count,
                                recipe.choices if recipe else None, setup,
                                [Evidence(file=scores.task_dir, text=f"{scores.headline.path} = {scores.headline.value:g}")])
    if finding:
        report.findings.append(finding)


def _check_responses(tree: RunTree, task_dir: Path, request: ValidateRunInput, report: TaskValidation) -> None:
    """HTTP errors and truncation from the response-stats interceptor's statistics."""
    metrics_path = task_dir / "artifacts" / METRICS_FILE
    metrics = load_json(metrics_path)
    metrics_file = tree.display(metrics_path)
    stats = (metrics or {}).get("response_stats")
    if not stats:
        # The advice fits a job that ran; one that never got going (unfinished, no metrics file) is explained above.
        if report.finished or metrics is not None:
            report.findings.append(Finding(severity="unknown", check="responses", message=f"{metrics_file}: no response_stats; HTTP errors and truncation cannot be checked. Keep the response_stats interceptor on."))
        return
    codes = {str(code): int(n) for code, n in (stats.get("status_codes") or {}).items()}
    report.responses = int(stats.get("count") or sum(codes.values()))
    errors = sum(n for code, n in codes.items() if not code.startswith("2"))
    if report.responses:
        report.error_share = errors / report.responses
        if errors:
            report.findings.append(Finding(
                severity="fail" if report.error_share > request.max_error_share else "warning", check="http_errors",
                message=f"{errors} of {report.responses} responses were HTTP errors ({report.error_share:.1%}; limit {request.max_error_share:.1%}).",
                evidence=[Evidence(file=metrics_file, text=f"status_codes={json.dumps(codes)}")]))
    reasons = {str(k): int(v) for k, v in (stats.get("finish_reason") or {}).items()}
    if sum(reasons.values()):
        report.truncated_share = reasons.get("length", 0) / sum(reasons.values())
        if reasons.get("length"):
            report.findings.append(Finding(
                severity="fail" if report.truncated_share > request.max_truncated_share else "warning", check="truncation",
                message=f"{reasons['length']} of {sum(reasons.values())} responses hit the token limit ({report.truncated_share:.1%}; limit {request.max_truncated_share:.1%}): raise max_new_tokens.",
                evidence=[Evidence(file=metrics_file, text=f"finish_reason={json.dumps(reasons)}")]))


def _check_reasoning(tree: RunTree, task_dir: Path, report: TaskValidation) -> None:
    """Reasoning never closed (the interceptor's count) and <think> tags left in final answers."""
    metrics_path = task_dir / "artifacts" / METRICS_FILE
    reasoning = (load_json(metrics_path) or {}).get("reasoning") or {}
    if reasoning.get("reasoning_unfinished_count"):
        report.findings.append(Finding(
            severity="warning", check="reasoning",
            message=f"{reasoning['reasoning_unfinished_count']} responses started reasoning and never closed it (answer lost in the thinking).",
            evidence=[Evidence(file=tree.display(metrics_path), text=f"reasoning_unfinished_count={reasoning['reasoning_unfinished_count']}")]))
    report.leaked_reasoning = _leaked_reasoning(task_dir)
    if report.leaked_reasoning:
        report.findings.append(Finding(
            severity="fail", check="reasoning",
            message=f"{report.leaked_reasoning} final answers still contain <think> tags: reasoning is not stripped (add the reasoning interceptor or fix the chat template).",
            evidence=[Evidence(file=tree.display(task_dir / "artifacts" / SAMPLE_OUTPUTS_DIR), text="<think> in generation")]))


def _check_checkpoint(tree: RunTree, task_dir: Path, request: ValidateRunInput, evidence: list[Evidence], report: TaskValidation) -> None:
    """What the server really loaded (its log), mapped back through the deployment's mounts to the host."""
    report.loaded_checkpoint = _loaded_checkpoint(evidence)
    if report.loaded_checkpoint:
        report.served_checkpoint = host_path(report.loaded_checkpoint, deployment_mounts(task_dir))
    if not request.expected_checkpoint:
        return
    if not report.loaded_checkpoint:
        report.findings.append(Finding(severity="unknown", check="checkpoint",
                                       message="No deployment log says which checkpoint was loaded (no server-*.log with the model path)."))
    elif report.served_checkpoint is None:
        report.findings.append(Finding(severity="unknown", check="checkpoint", message=(
            f"The server loaded {report.loaded_checkpoint}, a mount point inside its container, and "
            f"{tree.display(task_dir / 'artifacts' / METADATA_FILE)} does not say what NEL mounted there.")))
    elif normal(report.served_checkpoint) != normal(request.expected_checkpoint):
        shown = report.loaded_checkpoint + (f" (= {report.served_checkpoint} on the host)"
                                            if report.served_checkpoint != report.loaded_checkpoint else "")
        report.findings.append(Finding(severity="fail", check="checkpoint",
                                       message=f"The server loaded {shown}, not {request.expected_checkpoint}.",
                                       evidence=evidence[:1]))


def validate_run(request: ValidateRunInput, progress: ProgressFn) -> ValidateRunOutput:
    tree = locate_run(request.run)
    tasks = []
    for index, task_dir in enumerate(tree.task_dirs):
        progress(index, len(tree.task_dirs), f"validating {task_dir.name}")
        tasks.append(validate_task(tree, task_dir, request))
    return run_verdict(tree.label, tasks)


class NelResults(ResultsReader):
    """NEL 0.2.6's invocation directories: a local path, host:path on a cluster, a ledger id or NEL's invocation id."""

    name: ClassVar[str] = "nel"
    title: ClassVar[str] = "NEL 0.2.6"
    reads_by_location: ClassVar[bool] = True

    def is_run_dir(self, path: Path) -> bool:
        return path.is_dir() and (is_task_dir(path) or any(is_task_dir(child) for child in path.iterdir() if child.is_dir()))

    def extract_scores(self, run: str) -> ExtractScoresOutput:
        tree = locate_run(run)
        return ExtractScoresOutput(run=tree.label, tasks=[task_scores(tree, task_dir) for task_dir in tree.task_dirs])

    def validate_run(self, request: ValidateRunInput, progress: ProgressFn) -> ValidateRunOutput:
        return validate_run(request, progress)

    # ---------------------------------------------------------------- two runs side by side

    problems_source: ClassVar[str] = "nemo-evaluator-per-sample-outputs"

    def run_benchmarks(self, run: str, side: str) -> RunBenchmarks:
        """Its tasks by results.yml's names; per-problem rewards are nemo-evaluator's per-sample scores by sample id."""
        tree = locate_run(run)
        benchmarks = {}
        for name, (task_dir, scores) in tasks_by_name(tree).items():
            benchmarks[name] = RunBenchmark(name=name, scores=scores, location=task_dir, problems=per_sample_problems(task_dir))
        return RunBenchmarks(label=tree.label, benchmarks=benchmarks, warnings=[
            "NEL 0.2.6 runs: `nel gate` and `nel compare` read only nel-next bundles, so their rules were applied here to "
            "the tasks' per-sample outputs, paired by sample id (headline scores where a task kept none)."])

    def facets(self, run: RunBenchmarks, benchmark: RunBenchmark, checkpoint: str | None) -> dict[str, Any] | None:
        from quanteval.engines.nel import comparison

        return comparison.facets(benchmark.location, benchmark.scores, checkpoint)

    def compared_scores(self, base: RunBenchmark, cand: RunBenchmark) -> list[tuple[ScoreValue, ScoreValue]]:
        """The headline scores, or every score both runs have when there is no headline (first 20)."""
        if base.scores.headline and cand.scores.headline:
            return [(base.scores.headline, cand.scores.headline)]
        cand_by_path = {s.path: s for s in cand.scores.scores}
        return [(s, cand_by_path[s.path]) for s in base.scores.scores if s.path in cand_by_path][:20]

    def paired_values(self, benchmark: RunBenchmark, score: ScoreValue) -> tuple[dict[Any, float] | None, str]:
        """Each sample's mean score, when their mean reproduces the score (a task's per-sample outputs can hold
        another metric than its headline)."""
        if benchmark.problems is None:
            return None, ""
        means = {sample: sum(values) / len(values) for sample, values in benchmark.problems.rewards.items()}
        headline = score.value * (0.01 if score.scale == "percent" else 1.0)
        if abs(sum(means.values()) / len(means) - headline) > PAIRED_MATCH_TOLERANCE:
            return None, "per-sample outputs present but they do not reproduce both headline scores, so not paired"
        return means, ""

    def gate_metric(self, base: RunBenchmark, cand: RunBenchmark) -> str:
        return "pass@1"

    def gate_scores(self, base: RunBenchmark, cand: RunBenchmark, metric: str, z: float,
                    paired: bool) -> tuple[float, float, list[float] | None] | None:
        """The headline scores; their unpaired CI (each run's CI from NEL's stderr) only when no per-sample outputs
        were paired: as nel gate's bundle fallback has no CI, too few pairs gets none."""
        base_score, cand_score = _fraction(base.scores.headline), _fraction(cand.scores.headline)
        if base_score is None or cand_score is None:
            return None
        (base_value, base_se), (cand_value, cand_se) = base_score, cand_score
        bounds = None
        if not paired and base_se is not None and cand_se is not None:
            bounds = [base_value - z * base_se, base_value + z * base_se, cand_value - z * cand_se, cand_value + z * cand_se]
        return round(base_value, 6), round(cand_value, 6), bounds


def _fraction(score: ScoreValue | None) -> tuple[float, float | None] | None:
    if score is None:
        return None
    scale = 100.0 if score.scale == "percent" else 1.0
    return score.value / scale, (score.stderr / scale if score.stderr is not None else None)
