"""validate_run and extract_scores: is a finished NEL run trustworthy, and what did it score.

NEL writes one directory per invocation, one sub-directory per task:

    <output_dir>/<ts>-<invocation>/<task>.<i>/artifacts/{results.yml, eval_factory_metrics.json,
                                                         run_config.yml, metadata.yaml,
                                                         nemo-evaluator-per-sample-outputs/*.jsonl}
                                              logs/{stage.exit, client-*.log, slurm-*.log, server-*.log}

A run is named by that directory, by `host:path` on a cluster (only the small artifacts are
copied; logs are grepped on the host), or by an invocation id (quanteval's ledger, then NEL's
own execution records). Logs are always streamed or grepped, never read whole.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import shlex
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field

from quanteval import engines, failures, ledger, redact
from quanteval.clusters import executor as executors
from quanteval.engines.nel.nelfacts import EVALUATION_CHECKPOINT_MOUNT, REPEAT_KEYS
from quanteval.engines.nel_next import nextresults
from quanteval.envvars import state_dir
from quanteval.failures import Diagnosis
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress

log = logging.getLogger(__name__)

RESULTS_FILE = "results.yml"
METRICS_FILE = "eval_factory_metrics.json"
RUN_CONFIG_FILE = "run_config.yml"
METADATA_FILE = "metadata.yaml"
SAMPLE_OUTPUTS_DIR = "nemo-evaluator-per-sample-outputs"  # nemo_evaluator.api.api_dataclasses.SAMPLE_OUTPUTS_DIR
# The small files worth copying from a cluster; logs stay there and are grepped in place.
# The leading * matches nothing (a task directory given itself) or "<task>.<i>/" (an invocation directory).
REMOTE_ARTIFACT_PATTERNS = [
    f"*artifacts/{RESULTS_FILE}",
    f"*artifacts/{METRICS_FILE}",
    f"*artifacts/{RUN_CONFIG_FILE}",
    f"*artifacts/{METADATA_FILE}",
    f"*artifacts/{SAMPLE_OUTPUTS_DIR}/*.jsonl",
    "*logs/stage.exit",
]
MAX_EVIDENCE_PER_CHECK = 5

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


# ---------------------------------------------------------------------------------------------
# Locating a run
# ---------------------------------------------------------------------------------------------


@dataclass
class RunTree:
    """A run's task directories on this machine (a fetched copy when the run lives on a cluster)."""

    label: str
    root: Path
    task_dirs: list[Path]
    host: str | None = None
    remote_root: str | None = None

    def display(self, path: Path) -> str:
        """The path as the person knows it: on the cluster for remote runs."""
        if self.host and self.remote_root:
            return f"{self.host}:{self.remote_root.rstrip('/')}/{path.relative_to(self.root)}"
        return str(path)

    def remote_path(self, path: Path) -> str:
        assert self.remote_root is not None
        return f"{self.remote_root.rstrip('/')}/{path.relative_to(self.root)}"


def _is_task_dir(path: Path) -> bool:
    return (path / "artifacts").is_dir() or (path / "logs").is_dir()


def _task_dirs(root: Path, shown: str) -> list[Path]:
    """The task directories of a task dir, an invocation dir, or an output_dir holding exactly one invocation."""
    if _is_task_dir(root):
        return [root]
    children = sorted(child for child in root.iterdir() if child.is_dir())
    tasks = [child for child in children if _is_task_dir(child)]
    if tasks:
        return tasks
    invocations = [child for child in children if any(_is_task_dir(grandchild) for grandchild in child.iterdir() if grandchild.is_dir())]
    if len(invocations) == 1:
        return _task_dirs(invocations[0], shown)
    if invocations:
        names = ", ".join(child.name for child in invocations[-5:])
        raise ToolError(f"{shown}: holds {len(invocations)} invocations ({names}); pass one of them, e.g. {shown.rstrip('/')}/{invocations[-1].name}.")
    raise ToolError(
        f"{shown}: no NEL task directories (<task>.<i>/artifacts or logs) inside. "
        "Give the invocation directory <output_dir>/<ts>-<invocation> or one task directory inside it."
    )


def _remote_spec(run: str) -> tuple[str, str] | None:
    host, sep, path = run.partition(":")
    if sep and host and path and "/" not in host and not Path(run).exists():
        return host, path
    return None


def _nel_output_dir(invocation_id: str) -> str | None:
    """Where NEL's own execution records say the invocation wrote its results (local dir or host:path). Asked in a
    child process (quanteval.engines.nel.nelexec): NEL pins its execution database path when it is imported."""
    from quanteval.engines.nel import nelexec

    answer = nelexec.call("results_dirs", 120, invocation_id=invocation_id)
    if not answer.get("ok"):  # e.g. a partial id that matches several invocations
        raise ToolError(f"run '{invocation_id}': {answer.get('error')}. Give the full invocation id.")
    for task_dir in answer["dirs"]:
        if task_dir:  # a task directory, local or host:path; the invocation directory is its parent
            host, path = _remote_spec(task_dir) or ("", task_dir)
            parent = str(Path(path).parent)
            return f"{host}:{parent}" if host else parent
    return None


def _fetch_remote(label: str, host: str, remote_root: str) -> RunTree:
    from quanteval.clusters import ssh

    digest = hashlib.sha256(f"{host}:{remote_root}".encode()).hexdigest()[:16]
    local_root = state_dir() / "results-cache" / host / digest
    shutil.rmtree(local_root, ignore_errors=True)  # our own cache: a fresh copy, no files the cluster has since removed
    local_root.mkdir(parents=True)
    ssh.fetch_tree(host, remote_root, local_root, REMOTE_ARTIFACT_PATTERNS)
    tasks = _task_dirs(local_root, f"{host}:{remote_root}")
    return RunTree(label=label, root=local_root, task_dirs=tasks, host=host, remote_root=remote_root)


def locate_run(run: str) -> RunTree:
    """Resolve a run reference: a local directory, `host:path`, a ledger id or a NEL invocation id."""
    run = run.strip()
    if not run:
        raise ToolError("run: empty. Give a run directory, host:path on a cluster, or an invocation id.")
    local = Path(run).expanduser()
    if local.is_dir():
        return RunTree(label=run, root=local, task_dirs=_task_dirs(local, str(local)))
    if remote := _remote_spec(run):
        return _fetch_remote(run, *remote)
    if local.is_absolute() or run.startswith("."):
        raise ToolError(f"{run}: no such directory. Check the path, or pass host:path for a run on a cluster.")
    output_dir = _output_dir_from_ledger(run) or _nel_output_dir(run)
    if not output_dir:
        raise ToolError(
            f"run '{run}': not a directory, and neither the ledger nor NEL's records know this id. "
            "list_runs shows known runs; or pass the results directory (local or host:path)."
        )
    tree = locate_run(output_dir)
    tree.label = run
    return tree


def _output_dir_from_ledger(run: str) -> str | None:
    try:
        record = ledger.get(run)
    except ToolError:
        return None
    output_dir = record.details.get("output_dir")
    if output_dir:
        return f"{record.host}:{output_dir}" if record.host and executors.slurm(record.executor) else str(output_dir)
    return _nel_output_dir(record.invocation_id) if record.invocation_id else None


# ---------------------------------------------------------------------------------------------
# Reading artifacts
# ---------------------------------------------------------------------------------------------


def load_yaml(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        log.warning("unreadable %s: %s", path, exc)
        return None
    return data if isinstance(data, dict) else None


def _load_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        log.warning("unreadable %s: %s", path, exc)
        return None
    return data if isinstance(data, dict) else None


def run_config(task_dir: Path) -> dict[str, Any]:
    """The nemo-evaluator run config NEL saved for this task (config.type, config.params, target), or {}."""
    return load_yaml(task_dir / "artifacts" / RUN_CONFIG_FILE) or {}


def repeats(params: dict[str, Any]) -> int:
    extra = params.get("extra") or {}
    for key in REPEAT_KEYS:
        if isinstance(extra.get(key), int) and extra[key] > 0:
            return extra[key]
    return 1


def tasks_by_name(tree: RunTree) -> dict[str, tuple[Path, TaskScores]]:
    """A NEL 0.2.6 run's tasks by the name results.yml gives them, with their directory and scores."""
    found: dict[str, tuple[Path, TaskScores]] = {}
    for task_dir in tree.task_dirs:
        scores = task_scores(tree, task_dir)
        name = scores.task or task_dir.name
        # the same task twice in one run (e.g. two prompt variants): tell them apart by directory
        found[name if name not in found else f"{name} ({task_dir.name})"] = (task_dir, scores)
    return found


def per_sample_scores(task_dir: Path) -> dict[str, list[float]]:
    """Scores per sample id (one per repeat) from the per-sample outputs, streamed line by line."""
    scores: dict[str, list[float]] = {}
    for path in sorted((task_dir / "artifacts" / SAMPLE_OUTPUTS_DIR).glob("*.jsonl")):
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and row.get("id") is not None and isinstance(row.get("score"), (int, float)):
                    scores.setdefault(str(row["id"]), []).append(float(row["score"]))
    return scores


# ---------------------------------------------------------------------------------------------
# extract_scores
# ---------------------------------------------------------------------------------------------

Scale = Literal["fraction", "percent", "unknown"]


class ExtractScoresInput(StrictModel):
    run: str = Field(
        description="Results directory, host:path, record_id or NEL invocation id."
    )


class ScoreValue(BaseModel):
    task: str = Field(description="Task name as results.yml lists it under results.tasks / results.groups.")
    metric: str
    score: str
    value: float
    stderr: float | None = Field(None, description="Standard error on the same scale as value; null when NEL did not record one.")
    count: int | None = Field(None, description="Values the score was computed from (stats.count).")
    scale: Scale = Field(description="fraction (0-1) or percent (0-100), as stored; never converted.")
    scale_from: Literal["recipe", "inferred"] = Field(description="recipe: the task recipe says so; inferred: from the value.")
    path: str = Field(description="Where in results.yml the value sits.")


class TaskScores(BaseModel):
    task_dir: str
    task: str | None = Field(None, description="The NEL task (run_config config.type), when known.")
    recipe: str | None = Field(None, description="Recipe whose metric/score named the headline, if any.")
    headline: ScoreValue | None = Field(None, description="The recipe's score, or the only score when there is one.")
    scores: list[ScoreValue] = Field(default_factory=list, description="Every score found (first 50).")
    problem: str | None = Field(None, description="Why no score could be read, when none could.")


class ExtractScoresOutput(BaseModel):
    run: str
    tasks: list[TaskScores]


def _infer_scale(value: float) -> Scale:
    if 0.0 <= value <= 1.0:
        return "fraction"
    if 1.0 < value <= 100.0:
        return "percent"
    return "unknown"


def _recipe_scale(recipe: Any) -> Scale:
    return recipe.scale if recipe.scale in ("fraction", "percent") else "unknown"


def _stderr(stats: dict[str, Any]) -> float | None:
    if isinstance(stats.get("stderr"), (int, float)):
        return float(stats["stderr"])
    # NEL's stddev is the population one: stderr = stddev * sqrt(n/(n-1)) / sqrt(n) = stddev / sqrt(n-1).
    count, stddev = stats.get("count"), stats.get("stddev")
    if isinstance(count, int) and count > 1 and isinstance(stddev, (int, float)):
        return float(stddev) / math.sqrt(count - 1)
    return None


def _walk_scores(name: str, data: dict[str, Any], prefix: str) -> Iterator[tuple[str, str, str, dict[str, Any], str]]:
    for metric, metric_data in (data.get("metrics") or {}).items():
        for score, score_data in ((metric_data or {}).get("scores") or {}).items():
            if isinstance(score_data, dict) and isinstance(score_data.get("value"), (int, float)):
                path = f"{prefix}.metrics.{metric}.scores.{score}"
                yield name, metric, score, score_data, path
    for group, group_data in (data.get("groups") or {}).items():
        yield from _walk_scores(f"{name}/{group}", group_data or {}, f"{prefix}.groups.{group}")


def _recipe_for(task: str | None) -> Any | None:
    """The task recipe (recipes/tasks/*.md) whose nel_task is this task, if one exists."""
    if not task:
        return None
    from quanteval.workflow import tasks

    for recipe in tasks.list_recipes():
        if recipe.nel_task.split(".")[-1] == task:
            return recipe
    return None


def task_scores(tree: RunTree, task_dir: Path) -> TaskScores:
    results_path = task_dir / "artifacts" / RESULTS_FILE
    shown = tree.display(task_dir)
    nel_task = (run_config(task_dir).get("config") or {}).get("type")
    data = load_yaml(results_path)
    if data is None or not isinstance(data.get("results"), dict):
        reason = "missing" if not results_path.exists() else "unreadable or without a results section"
        return TaskScores(task_dir=shown, task=nel_task, problem=f"{tree.display(results_path)}: {reason}")
    recipe = _recipe_for(nel_task)
    found: list[ScoreValue] = []
    for section in ("tasks", "groups"):
        for name, entry in (data["results"].get(section) or {}).items():
            for task, metric, score, score_data, path in _walk_scores(name, entry or {}, f"results.{section}.{name}"):
                value = float(score_data["value"])
                # the recipe vouches for the scale of its own score only; every other score's scale is inferred
                named_by_recipe = recipe is not None and (metric, score) == (recipe.metric, recipe.score)
                found.append(
                    ScoreValue(
                        task=task, metric=metric, score=score, value=value,
                        stderr=_stderr(score_data.get("stats") or {}),
                        count=(score_data.get("stats") or {}).get("count"),
                        scale=_recipe_scale(recipe) if named_by_recipe else _infer_scale(value),
                        scale_from="recipe" if named_by_recipe else "inferred",
                        path=path,
                    )
                )
    headline = None
    if recipe:
        headline = next((s for s in found if s.metric == recipe.metric and s.score == recipe.score), None)
    elif len(found) == 1:
        headline = found[0]
    problem = None
    if not found:
        problem = f"{tree.display(results_path)}: no scores under results.tasks or results.groups"
    elif recipe and headline is None:
        problem = (
            f"{tree.display(results_path)}: recipe {recipe.name} names metric {recipe.metric}, score {recipe.score}, "
            "which this results.yml lacks; fix the recipe's Score Extraction or see `scores` for what is there."
        )
    return TaskScores(
        task_dir=shown, task=nel_task or (found[0].task if found else None), recipe=recipe.name if recipe else None,
        headline=headline, scores=found[:50], problem=problem,
    )


def extract_scores(request: ExtractScoresInput) -> ExtractScoresOutput:
    """Use after validate_run passes: each task's headline score, standard error and scale."""
    if (next_dir := next_run_dir(request.run)) is not None:
        return ExtractScoresOutput(run=request.run, tasks=[next_task_scores(bundle) for bundle in nextresults.bundles(next_dir).values()])
    tree = locate_run(request.run)
    return ExtractScoresOutput(run=tree.label, tasks=[task_scores(tree, task_dir) for task_dir in tree.task_dirs])


# ---------------------------------------------------------------------------------------------
# validate_run
# ---------------------------------------------------------------------------------------------

Verdict = Literal["pass", "fail", "inconclusive"]
Severity = Literal["fail", "unknown", "warning", "info"]


class ValidateRunInput(StrictModel):
    run: str = Field(
        description="Results directory, host:path, record_id or NEL invocation id."
    )
    expected_checkpoint: str | None = Field(
        None, description="Checkpoint the server must have loaded."
    )
    max_error_share: float = Field(
        0.01, ge=0, le=1, description="Largest acceptable share of non-2xx responses."
    )
    max_truncated_share: float = Field(
        0.02, ge=0, le=1, description="Largest acceptable share of length-truncated responses."
    )


class Evidence(BaseModel):
    file: str
    line: int | None = None
    text: str = Field(description="The line or value that shows it (at most 300 characters).")


class Finding(BaseModel):
    severity: Severity = Field(description="fail: the run cannot be trusted; unknown: could not be checked; warning; info.")
    check: str
    message: str
    evidence: list[Evidence] = Field(default_factory=list)


class TaskValidation(BaseModel):
    task_dir: str
    task: str | None = None
    finished: bool | None = Field(None, description="results.yml written and the task exited 0; null when unknown.")
    resumed_after_timeout: bool = False
    expected_samples: int | None = Field(None, description="limit_samples or dataset size, times repeats.")
    expected_samples_from: str | None = Field(
        None, description="Where the size came from: limit_samples, the task's recipe, or NEL's dataset sizes.")
    evaluated_samples: int | None = Field(None, description="stats.count of the scores.")
    responses: int | None = Field(None, description="HTTP responses seen by the response-stats interceptor.")
    error_share: float | None = None
    truncated_share: float | None = Field(None, description="Share of successful responses with finish_reason=length.")
    leaked_reasoning: int | None = Field(None, description="Final answers that still contain <think> or </think>.")
    loaded_checkpoint: str | None = Field(None, description="The model path the server logs say it loaded (inside its container).")
    served_checkpoint: str | None = Field(
        None, description="loaded_checkpoint mapped back through the deployment's mounts (as NEL renders them) to the host path.")
    diagnosis: Diagnosis | None = Field(None, description="For a task that failed: the failure class, its log line and the usual fix.")
    findings: list[Finding] = Field(default_factory=list)


class ValidateRunOutput(BaseModel):
    run: str
    verdict: Verdict = Field(description="pass only when every task passed every check that could be made.")
    reasons: list[str] = Field(description="Why the verdict is not pass (empty when it is).")
    tasks: list[TaskValidation]


def _scan_logs(tree: RunTree, task_dir: Path) -> dict[str, list[Evidence]]:
    """grep where the logs are (here, or on the cluster): they are often GBs of server output, never read whole."""
    from quanteval.clusters import ssh

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


def dataset_size(config: dict[str, Any]) -> tuple[int | None, str | None]:
    """Questions one repeat of this task covers, and who says so: limit_samples, the task's recipe, or NEL's own
    table of dataset sizes (nemo_evaluator_launcher.common.helpers). (None, None) when nobody knows."""
    task_config = config.get("config") or {}
    params = task_config.get("params") or {}
    if params.get("limit_samples") is not None:
        return int(params["limit_samples"]), "limit_samples"
    extra = params.get("extra") or {}
    recipe = _recipe_for(task_config.get("type"))
    if recipe is not None and recipe.samples:
        ratio = extra.get("downsampling_ratio")
        size = int(round(recipe.samples * ratio)) if isinstance(ratio, (int, float)) else recipe.samples
        return size, f"recipe {recipe.name}"
    if not task_config:
        return None, None
    from nemo_evaluator_launcher.common.helpers import get_eval_factory_dataset_size_from_run_config

    # NEL multiplies by extra.n_samples itself; repeats are counted once, by the caller.
    one_repeat = {**params, "extra": {key: value for key, value in extra.items() if key != "n_samples"}}
    try:
        size = get_eval_factory_dataset_size_from_run_config(
            {"framework_name": config.get("framework_name"), "config": {**task_config, "params": one_repeat}})
    except (KeyError, TypeError, ValueError):
        return None, None
    return (None, None) if size is None else (int(size), "NEL's dataset sizes")


def deployment_mounts(task_dir: Path) -> list[tuple[str, str]]:
    """(host path, container path) of the deployment's mounts, rendered the way NEL 0.2.6's local and SLURM executors
    do (deployment.checkpoint_path -> /checkpoint, cache_path -> /cache, then execution.mounts.deployment), from the
    resolved config NEL stores in artifacts/metadata.yaml. Empty when the run did not record it."""
    resolved = (load_yaml(task_dir / "artifacts" / METADATA_FILE) or {}).get("launcher_resolved_config") or {}
    deployment = resolved.get("deployment") or {}
    if not isinstance(deployment, dict) or deployment.get("type") in (None, "none"):
        return []
    mounts = []
    if deployment.get("checkpoint_path"):
        mounts.append((str(deployment["checkpoint_path"]), EVALUATION_CHECKPOINT_MOUNT))
    if deployment.get("cache_path"):
        mounts.append((str(deployment["cache_path"]), "/cache"))
    extra = ((resolved.get("execution") or {}).get("mounts") or {}).get("deployment") or {}
    mounts += [(str(source), str(target).split(":")[0]) for source, target in extra.items()] if isinstance(extra, dict) else []
    return mounts


def host_path(container_path: str, mounts: list[tuple[str, str]]) -> str | None:
    """The host path behind a path inside the server's container; the path itself when no mount covers it (an HF
    handle or a path the server sees as is); None for NEL's checkpoint mount point when nothing says what is there."""
    path = _normal(container_path)
    for source, target in sorted(mounts, key=lambda mount: -len(mount[1])):
        target = _normal(target)
        if path == target or path.startswith(target + "/"):
            return _normal(source) + path[len(target):]
    if path == EVALUATION_CHECKPOINT_MOUNT or path.startswith(EVALUATION_CHECKPOINT_MOUNT + "/"):
        return None
    return container_path


def _normal(path: str) -> str:
    return Path(path).as_posix().rstrip("/") or "/"


def _failure_finding(diagnosis: Diagnosis) -> Finding:
    evidence = [Evidence(file=diagnosis.file or "", line=diagnosis.line_number, text=redact.shown_line(diagnosis.line or ""))] if diagnosis.line else []
    why = f"{diagnosis.line}" if diagnosis.line else "no known failure line; last lines: " + " | ".join(diagnosis.last_lines[-3:])
    return Finding(severity="fail", check="failure", message=f"Why it failed ({diagnosis.failure_class}): {redact.shown_line(why)}. "
                   f"{diagnosis.advice}", evidence=evidence)


def _diagnose(tree: RunTree, task_dir: Path) -> Diagnosis:
    """Why a task failed, from its logs where they are (here or on the cluster)."""
    from quanteval.clusters import ssh

    logs = tree.remote_path(task_dir / "logs") if tree.host else str(task_dir / "logs")
    result = ssh.run_remote(tree.host or ssh.LOCAL, failures.grep_command(logs, 200, tail_lines=40), timeout=120)
    shown = f"{tree.host}:{logs}" if tree.host else logs
    tails, hits = failures.parse_grep(result.stdout, shown)
    # The task's own client log ends the story; NEL's slurm-*.log holds the job script around it.
    last = [line for _, lines in sorted(tails, key=lambda tail: "client" in tail[0]) for line in lines]
    return failures.diagnose(hits, last)


def validate_task(tree: RunTree, task_dir: Path, request: ValidateRunInput) -> TaskValidation:  # noqa: C901
    shown = tree.display(task_dir)
    artifacts = task_dir / "artifacts"
    config = run_config(task_dir)
    scores = task_scores(tree, task_dir)
    report = TaskValidation(task_dir=shown, task=scores.task)
    findings = report.findings
    logs = _scan_logs(tree, task_dir)

    # Finished or not. A SLURM timeout is fine when the paired restart job resumed and finished the task.
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
        findings.append(_failure_finding(report.diagnosis))
    else:
        report.finished = True
        if scores.problem:
            findings.append(Finding(severity="warning", check="score", message=scores.problem))

    # Sample accounting.
    counts = [s.count for s in scores.scores if isinstance(s.count, int)]
    report.evaluated_samples = max(counts) if counts else None
    params = ((config.get("config") or {}).get("params")) or {}
    size, size_source = dataset_size(config)
    report.expected_samples = None if size is None else size * repeats(params)
    report.expected_samples_from = size_source
    if report.finished and report.expected_samples is None:
        findings.append(Finding(severity="unknown", check="samples", message=(
            f"{tree.display(artifacts / RUN_CONFIG_FILE)}: no limit_samples, and neither a recipe (samples:) nor NEL "
            f"knows the size of {scores.task or 'this task'}, so dropped samples cannot be counted.")))
    elif report.finished and report.evaluated_samples is None:
        findings.append(Finding(severity="unknown", check="samples", message=f"{tree.display(artifacts / RESULTS_FILE)}: scores carry no stats.count, so dropped samples cannot be counted."))
    elif report.finished:
        per_prompt = report.expected_samples // repeats(params)
        if report.evaluated_samples not in (report.expected_samples, per_prompt):
            policy = (params.get("extra") or {}).get("failed_samples_policy")
            dropped = report.expected_samples - report.evaluated_samples
            accounting = f"{dropped} dropped or failed" if dropped > 0 else f"{-dropped} more than requested"
            findings.append(Finding(
                severity="fail", check="samples",
                message=f"{report.evaluated_samples} samples scored, {report.expected_samples} expected ({accounting}"
                + (f"; failed_samples_policy={policy}" if policy else "") + "). The score covers a different set than the baseline's.",
                evidence=[Evidence(file=tree.display(artifacts / RESULTS_FILE), text=f"stats.count={report.evaluated_samples}")]))

    # HTTP errors, truncation and reasoning from the interceptors' statistics.
    metrics = _load_json(artifacts / METRICS_FILE)
    metrics_file = tree.display(artifacts / METRICS_FILE)
    stats = (metrics or {}).get("response_stats")
    if not stats:
        # The advice fits a job that ran; one that never got going (unfinished, no metrics file) is explained above.
        if report.finished or metrics is not None:
            findings.append(Finding(severity="unknown", check="responses", message=f"{metrics_file}: no response_stats; HTTP errors and truncation cannot be checked. Keep the response_stats interceptor on."))
    else:
        codes = {str(code): int(n) for code, n in (stats.get("status_codes") or {}).items()}
        report.responses = int(stats.get("count") or sum(codes.values()))
        errors = sum(n for code, n in codes.items() if not code.startswith("2"))
        if report.responses:
            report.error_share = errors / report.responses
            if errors:
                findings.append(Finding(
                    severity="fail" if report.error_share > request.max_error_share else "warning", check="http_errors",
                    message=f"{errors} of {report.responses} responses were HTTP errors ({report.error_share:.1%}; limit {request.max_error_share:.1%}).",
                    evidence=[Evidence(file=metrics_file, text=f"status_codes={json.dumps(codes)}")]))
        reasons = {str(k): int(v) for k, v in (stats.get("finish_reason") or {}).items()}
        if sum(reasons.values()):
            report.truncated_share = reasons.get("length", 0) / sum(reasons.values())
            if reasons.get("length"):
                findings.append(Finding(
                    severity="fail" if report.truncated_share > request.max_truncated_share else "warning", check="truncation",
                    message=f"{reasons['length']} of {sum(reasons.values())} responses hit the token limit ({report.truncated_share:.1%}; limit {request.max_truncated_share:.1%}): raise max_new_tokens.",
                    evidence=[Evidence(file=metrics_file, text=f"finish_reason={json.dumps(reasons)}")]))
    reasoning = (metrics or {}).get("reasoning") or {}
    if reasoning.get("reasoning_unfinished_count"):
        findings.append(Finding(
            severity="warning", check="reasoning",
            message=f"{reasoning['reasoning_unfinished_count']} responses started reasoning and never closed it (answer lost in the thinking).",
            evidence=[Evidence(file=metrics_file, text=f"reasoning_unfinished_count={reasoning['reasoning_unfinished_count']}")]))
    report.leaked_reasoning = _leaked_reasoning(task_dir)
    if report.leaked_reasoning:
        findings.append(Finding(
            severity="fail", check="reasoning",
            message=f"{report.leaked_reasoning} final answers still contain <think> tags: reasoning is not stripped (add the reasoning interceptor or fix the chat template).",
            evidence=[Evidence(file=tree.display(artifacts / SAMPLE_OUTPUTS_DIR), text="<think> in generation")]))

    # Judge and sandbox failures, and what the server really loaded.
    for check in ("judge_failure", "sandbox_failure"):
        if logs[check]:
            findings.append(Finding(severity="fail", check=check,
                                    message=f"{check.replace('_', ' ')} lines in the logs: the scores of the affected samples are not the model's.",
                                    evidence=logs[check]))
    report.loaded_checkpoint = _loaded_checkpoint(logs["loaded_checkpoint"])
    mounts = deployment_mounts(task_dir)
    if report.loaded_checkpoint:
        report.served_checkpoint = host_path(report.loaded_checkpoint, mounts)
    if request.expected_checkpoint and report.loaded_checkpoint:
        expected = _normal(request.expected_checkpoint)
        if report.served_checkpoint is None:
            findings.append(Finding(severity="unknown", check="checkpoint", message=(
                f"The server loaded {report.loaded_checkpoint}, a mount point inside its container, and "
                f"{tree.display(artifacts / METADATA_FILE)} does not say what NEL mounted there.")))
        elif _normal(report.served_checkpoint) != expected:
            shown = report.loaded_checkpoint + (f" (= {report.served_checkpoint} on the host)"
                                                if report.served_checkpoint != report.loaded_checkpoint else "")
            findings.append(Finding(severity="fail", check="checkpoint",
                                    message=f"The server loaded {shown}, not {request.expected_checkpoint}.",
                                    evidence=logs["loaded_checkpoint"][:1]))
    elif request.expected_checkpoint:
        findings.append(Finding(severity="unknown", check="checkpoint",
                                message="No deployment log says which checkpoint was loaded (no server-*.log with the model path)."))
    return report


def validate_run(request: ValidateRunInput, progress: ProgressFn = no_progress) -> ValidateRunOutput:
    """Use before extract_scores or compare_results: checks each task of a finished run (samples, errors, truncation,
    leaked reasoning, judge, served checkpoint).
    """
    if (next_dir := next_run_dir(request.run)) is not None:
        return _validate_next_run(request, next_dir)
    tree = locate_run(request.run)
    tasks = []
    for index, task_dir in enumerate(tree.task_dirs):
        progress(index, len(tree.task_dirs), f"validating {task_dir.name}")
        tasks.append(validate_task(tree, task_dir, request))
    reasons = [
        f"{task.task or task.task_dir}: {finding.message}"
        for task in tasks for finding in task.findings if finding.severity in ("fail", "unknown")
    ]
    severities = {finding.severity for task in tasks for finding in task.findings}
    verdict: Verdict = "fail" if "fail" in severities else "inconclusive" if "unknown" in severities else "pass"
    return ValidateRunOutput(run=tree.label, verdict=verdict, reasons=reasons[:50], tasks=tasks)


# ---------------------------------------------------------------------------------------------
# nel-next runs (quanteval.engines.nel_next.nextresults reads them)
# ---------------------------------------------------------------------------------------------


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
                                 count=bundle.samples * bundle.repeats or None, scale=_infer_scale(float(metric["value"])),
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
    if request.expected_checkpoint:
        task.findings.append(Finding(severity="info", check="served_checkpoint", message=(
            "nel-next records the served model name, not the checkpoint path: check the deployment (deployment_status)."), evidence=[]))
    return task


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
    for name, error in outcome.failed.items():
        tasks.append(TaskValidation(task_dir=str(run_dir), task=name, finished=False, findings=[Finding(
            severity="fail", check="finished", message=f"nel-next failed the benchmark: {redact.shown_line(error)}",
            evidence=[Evidence(file=str(run_dir / "checkpoint.json"), text=redact.shown_line(error))])]))
    if not found and not outcome.failed:
        unfinished = TaskValidation(task_dir=str(run_dir), finished=False, findings=[Finding(
            severity="fail", check="finished", message="no benchmark bundle (eval-*.json) in the run directory: the run did not finish")])
        if (diagnosis := _next_failure(request.run)) is not None:
            unfinished.diagnosis = diagnosis
            unfinished.findings.append(_failure_finding(diagnosis))
        tasks.append(unfinished)
    reasons = [f"{task.task or task.task_dir}: {finding.message}" for task in tasks for finding in task.findings
               if finding.severity in ("fail", "unknown")]
    severities = {finding.severity for task in tasks for finding in task.findings}
    verdict: Verdict = "fail" if "fail" in severities else "inconclusive" if "unknown" in severities else "pass"
    return ValidateRunOutput(run=request.run, verdict=verdict, reasons=reasons[:50], tasks=tasks)
