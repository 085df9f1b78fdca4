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
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from quanteval import ledger
from quanteval.clusters import executor as executors
from quanteval.clusters import ssh
from quanteval.engines.nel.nelfacts import EVALUATION_CHECKPOINT_MOUNT, REPEAT_KEYS
from quanteval.engines.recipes import list_recipes
from quanteval.engines.runresults import (
    Problems,
    Scale,
    ScoreValue,
    TaskScores,
    infer_scale,
)
from quanteval.envvars import state_dir
from quanteval.models import ToolError

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


def is_task_dir(path: Path) -> bool:
    return (path / "artifacts").is_dir() or (path / "logs").is_dir()


def _task_dirs(root: Path, shown: str) -> list[Path]:
    """The task directories of a task dir, an invocation dir, or an output_dir holding exactly one invocation."""
    if is_task_dir(root):
        return [root]
    children = sorted(child for child in root.iterdir() if child.is_dir())
    tasks = [child for child in children if is_task_dir(child)]
    if tasks:
        return tasks
    invocations = [child for child in children if any(is_task_dir(grandchild) for grandchild in child.iterdir() if grandchild.is_dir())]
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
        return executors.for_name(record.executor).results_location(record.host, str(output_dir))
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


def load_json(path: Path) -> dict[str, Any] | None:
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


# What NEL 0.2.6's per-sample records (nemo_evaluator's SampleRecord) cannot say: they carry no request error, so a
# sample whose request failed looks like a wrong answer.
NO_REQUEST_STATUS = ("NEL 0.2.6's per-sample outputs record no request errors, so an infrastructure error cannot be "
                     "told from a wrong answer here (validate_run's error share is the run's check)")


def per_sample_problems(task_dir: Path) -> Problems | None:
    """Scores per sample id (one per repeat) from the per-sample outputs, streamed line by line; a sample scored 0
    whose record has no extracted answer (`answer` null) is unscored, where the harness records answers at all."""
    scores: dict[str, list[float]] = {}
    no_answer: set[str] = set()
    answers_recorded = False
    for path in sorted((task_dir / "artifacts" / SAMPLE_OUTPUTS_DIR).glob("*.jsonl")):
        with path.open(encoding="utf-8", errors="replace") as lines:
            for line in lines:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(row, dict) and row.get("id") is not None and isinstance(row.get("score"), (int, float)):
                    scores.setdefault(str(row["id"]), []).append(float(row["score"]))
                    if row.get("answer") not in (None, ""):
                        answers_recorded = True
                    elif not row["score"]:
                        no_answer.add(str(row["id"]))
    if not scores:
        return None
    return Problems(rewards=scores, unit="sample", unscored=no_answer if answers_recorded else set(),
                    status_unknown=NO_REQUEST_STATUS)


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
    for recipe in list_recipes():
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
                        scale=_recipe_scale(recipe) if named_by_recipe else infer_scale(value),
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
    path = normal(container_path)
    for source, target in sorted(mounts, key=lambda mount: -len(mount[1])):
        target = normal(target)
        if path == target or path.startswith(target + "/"):
            return normal(source) + path[len(target):]
    if path == EVALUATION_CHECKPOINT_MOUNT or path.startswith(EVALUATION_CHECKPOINT_MOUNT + "/"):
        return None
    return container_path



def normal(path: str) -> str:
    return Path(path).as_posix().rstrip("/") or "/"
