"""The eval server's `nel` backend: each benchmark as NEL's `nemo_skills.ns_*` task against the router.

The benchmark name maps to the NEL task through the task catalogue (engines/catalogue.py); the config is a
`deployment: none` NEL config; scores are read by NEL 0.2.6's results reader (from the engine registry), as
extract_scores reads them.
"""

from __future__ import annotations

import difflib
import shutil
import time
from pathlib import Path
from typing import Any

import yaml

from quanteval import engines, paths
from quanteval.engines.catalogue import catalogue
from quanteval.evalserver.backend import (
    BenchmarkSpec,
    EvalRequest,
    RunCommands,
    ServerSettings,
    ShardCommand,
    generation_value,
)
from quanteval.models import ToolError

SHARD_ENV = ("NEL_SHARD_IDX", "NEL_TOTAL_SHARDS")
RESULTS_FILE = "results.yml"  # what NEL writes into each task's artifacts/ once it has scored it


def readiness(settings: ServerSettings) -> dict[str, Any]:
    found = shutil.which(settings.nel_command)
    status: dict[str, Any] = {"command": settings.nel_command, "backend_ready": bool(found)}
    if not found:
        status["hint"] = f"`{settings.nel_command}` not found: pip install nemo-evaluator-launcher==0.2.6 or pass --nel-command"
    return status


def refuse(settings: ServerSettings, request: EvalRequest) -> str | None:
    return None  # NeMo-Skills inside NEL's container takes top_k through `++inference.top_k`


def task_map() -> dict[str, str]:
    """NeMo-Skills benchmark name -> NEL task name, from the catalogue (first task wins, as in NEL's list)."""
    mapping: dict[str, str] = {}
    for entry in catalogue():
        if entry.harness == "nemo_skills" and entry.harness_task:
            mapping.setdefault(entry.harness_task, entry.name)
    return mapping


def nel_task_for(benchmark: str) -> str:
    """Map a NeMo-Skills benchmark name (aime25) to NEL's task (ns_aime2025)."""
    mapping = task_map()
    if benchmark in mapping:
        return mapping[benchmark]
    if benchmark in mapping.values():  # already a NEL task name
        return benchmark
    close = difflib.get_close_matches(benchmark, list(mapping) + list(mapping.values()), n=3)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ToolError(f"benchmark '{benchmark}' has no NEL nemo_skills task.{hint}")


def shard_env(index: int, total: int) -> dict[str, str]:
    return dict(zip(SHARD_ENV, (str(index), str(total)), strict=True)) if total > 1 else {}


def nel_config(settings: ServerSettings, request: EvalRequest, bench: BenchmarkSpec, out: Path) -> dict[str, Any]:
    """A `deployment: none` NEL config that evaluates the router's model on one nemo_skills task."""
    params: dict[str, Any] = {"parallelism": settings.max_concurrent_requests}
    extra: dict[str, Any] = {}
    repeats = generation_value(bench, request.defaults, "n_samples_per_eval_prompt")
    if repeats and repeats > 1:
        extra["num_repeats"] = repeats
    for key, nel_key in (("temperature", "temperature"), ("top_p", "top_p"), ("max_response_len", "max_new_tokens")):
        value = generation_value(bench, request.defaults, key)
        if value is not None:
            params[nel_key] = value
    if bench.max_problems:
        params["limit_samples"] = bench.max_problems
    top_k = generation_value(bench, request.defaults, "top_k")
    if top_k is not None:
        extra["args"] = f"++inference.top_k={top_k}"
    if extra:
        params["extra"] = extra
    return {
        "defaults": [{"execution": settings.nel_execution}, {"deployment": "none"}, "_self_"],
        "execution": {"output_dir": str(out)},
        "target": {
            "api_endpoint": {
                "url": f"{request.router_url}/v1/chat/completions",
                "model_id": settings.model_name,
                "api_key_name": "DUMMY_API_KEY",
            }
        },
        "evaluation": {"tasks": [{"name": nel_task_for(bench.name), "nemo_evaluator_config": {"config": {"params": params}}}]},
    }


def commands(settings: ServerSettings, request: EvalRequest, bench: BenchmarkSpec, bench_dir: Path,
             expname: str) -> list[ShardCommand]:
    shards = bench.shards or 1
    result = []
    for index in range(shards):
        out = bench_dir if shards == 1 else bench_dir / f"shard-{index}"
        out.mkdir(parents=True, exist_ok=True)
        config = nel_config(settings, request, bench, out)
        if shards > 1:  # the shard convention reaches the eval container through the task's env_vars
            config["evaluation"]["tasks"][0]["env_vars"] = shard_env(index, shards)
        config_path = paths.write_file(out / "nel_config.yaml", yaml.safe_dump(config, sort_keys=False))
        argv = [settings.nel_command, "run", "--config", str(config_path)]
        env = {"DUMMY_API_KEY": "EMPTY", "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0", **shard_env(index, shards)}
        result.append(ShardCommand(argv, env, out, out / "eval.log"))
    return result


def _scores(output_dir: Path, wait_s: float) -> dict[str, Any]:
    """Scores of one NEL output dir as {metric: {score: value}}, read by NEL 0.2.6's results reader (extract_scores')."""
    deadline = time.monotonic() + wait_s
    while not any(output_dir.glob(f"**/artifacts/{RESULTS_FILE}")) and time.monotonic() < deadline:
        time.sleep(2)  # NEL's executors return at submission; results.yml comes later
    try:
        reader = next(reader for reader in engines.readers() if reader.name == "nel")  # this backend runs `nel run`
        found = reader.extract_scores(str(output_dir)).tasks
    except ToolError:
        found = []
    scores = [score for task in found for score in task.scores]
    if not scores:
        problems = "; ".join(task.problem for task in found if task.problem)
        raise ToolError(f"no results.yml scores under {output_dir} within {wait_s:.0f} s of NEL returning"
                        + (f" ({problems})" if problems else ""))
    metrics: dict[str, Any] = {}
    for score in scores:
        metrics.setdefault(score.metric, {})[score.score] = score.value
        if score.count is not None:
            metrics[score.metric]["num_entries"] = score.count
    return metrics


def metrics(settings: ServerSettings, bench: BenchmarkSpec, bench_dir: Path,
            commands: list[ShardCommand], run: RunCommands) -> dict[str, Any]:
    parts = [_scores(c.output_dir, settings.results_wait_s) for c in commands]
    return merge_shard_metrics(parts)


def merge_shard_metrics(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine NEL shards' scores (NEL has no merge of its own): `num_entries` adds up, every other number is a
    num_entries-weighted mean — right for the mean-type scores NEL reports, not for e.g. a majority vote."""
    if len(shards) == 1:
        return shards[0]

    def merge(parts: list[Any], weights: list[float]) -> Any:
        if all(isinstance(p, dict) for p in parts):
            local = [p["num_entries"] if isinstance(p.get("num_entries"), (int, float)) else w
                     for p, w in zip(parts, weights, strict=True)]
            merged = {}
            for key in [k for k in parts[0] if all(k in p for p in parts)]:
                values = [p[key] for p in parts]
                if key == "num_entries" and all(isinstance(v, (int, float)) for v in values):
                    merged[key] = sum(values)
                else:
                    merged[key] = merge(values, local)
            return merged
        if all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in parts):
            total = sum(weights)
            return sum(p * w for p, w in zip(parts, weights, strict=True)) / total if total else sum(parts) / len(parts)
        return parts[0]

    return merge(shards, [1.0] * len(shards))
