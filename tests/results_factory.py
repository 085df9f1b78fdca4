"""Builders for results trees laid out as NEL 0.2.6 writes them.

    <output_dir>/<ts>-<invocation>/<task>.<i>/artifacts/{results.yml, eval_factory_metrics.json,
                                                         run_config.yml, metadata.yaml,
                                                         nemo-evaluator-per-sample-outputs/samples.jsonl}
                                              logs/{stage.exit, client-<jobid>.log, slurm-<jobid>.log, server-*.log}

The file contents follow nemo_evaluator's writers: results.yml from core/evaluate.py (git_hash, command,
config, target, results{tasks, groups}, metadata.versioning), eval_factory_metrics.json from the
response-stats and reasoning interceptors, run_config.yml from core/input.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "checkpoints"
# NEL's resolved deployment section (metadata.yaml launcher_resolved_config) of a run served from a bundled checkpoint.
DEPLOYMENT = {"type": "vllm", "image": "vllm/vllm-openai:v0.11.0", "checkpoint_path": str(EXAMPLES / "llama-tiny-bf16"),
              "hf_model_handle": None, "served_model_name": "llama-tiny", "tensor_parallel_size": 1, "extra_args": "--max-model-len 4096"}
VERSIONING = {"nemo_evaluator": "0.2.8", "git-hash": "abc1234", "container": "nvcr.io/nvidia/eval-factory/nemo_skills:26.01"}


def make_invocation(output_dir: Path, invocation: str = "a1b2c3d4", timestamp: str = "20261121_101500") -> Path:
    path = output_dir / f"{timestamp}-{invocation}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def make_task(
    invocation_dir: Path,
    task: str = "ns_gpqa",
    index: int = 0,
    *,
    harness: str = "nemo_skills",
    metric: str = "symbolic_correct",
    score: str = "accuracy",
    value: float | None = 0.5,
    stderr: float | None = 0.05,
    count: int | None = 100,
    extra_scores: dict[str, dict[str, float]] | None = None,
    groups: dict[str, Any] | None = None,
    limit_samples: int | None = 100,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_new_tokens: int = 8192,
    extra: dict[str, Any] | None = None,
    interceptors: list[dict[str, Any]] | None = None,
    status_codes: dict[str, int] | None = None,
    finish_reason: dict[str, int] | None = None,
    reasoning: dict[str, Any] | None = None,
    versioning: dict[str, Any] | None = None,
    deployment: dict[str, Any] | None = DEPLOYMENT,
    exit_code: int | None = 0,
    write_results: bool = True,
    write_metrics: bool = True,
    write_run_config: bool = True,
    samples: list[dict[str, Any]] | None = None,
    logs: dict[str, str] | None = None,
) -> Path:
    """One task directory. Defaults: a clean finished run of 100 samples, all HTTP 200, all finish_reason stop,
    served by vLLM from the bundled llama-tiny-bf16 checkpoint (deployment=None: no resolved launcher config)."""
    task_dir = invocation_dir / f"{task}.{index}"
    artifacts, log_dir = task_dir / "artifacts", task_dir / "logs"
    artifacts.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    params: dict[str, Any] = {"temperature": temperature, "top_p": top_p, "max_new_tokens": max_new_tokens,
                              "parallelism": 16, "max_retries": 5, "request_timeout": 3600, "extra": extra or {}}
    if limit_samples is not None:
        params["limit_samples"] = limit_samples
    config = {"type": task, "output_dir": "/results", "params": params, "supported_endpoint_types": ["chat"]}
    target = {"api_endpoint": {"model_id": "model", "url": "http://127.0.0.1:8000/v1/chat/completions", "type": "chat",
                               "adapter_config": {"interceptors": interceptors or [{"name": "response_stats"}]}}}
    if write_run_config:
        (artifacts / "run_config.yml").write_text(yaml.safe_dump({"framework_name": harness, "config": config, "target": target}))
        resolved = {"deployment": deployment, "execution": {"type": "local", "output_dir": str(invocation_dir.parent)}} if deployment else {}
        (artifacts / "metadata.yaml").write_text(yaml.safe_dump({"versioning": versioning or VERSIONING, "launcher_resolved_config": resolved}))
    if write_results:
        scores = {}
        if value is not None:
            stats: dict[str, Any] = {}
            if count is not None:
                stats["count"] = count
            if stderr is not None:
                stats["stderr"] = stderr
            scores[score] = {"value": value, "stats": stats}
        metrics = {metric: {"scores": scores}}
        for other_metric, other_scores in (extra_scores or {}).items():
            metrics[other_metric] = {"scores": {name: {"value": v, "stats": {}} for name, v in other_scores.items()}}
        results: dict[str, Any] = {"tasks": {task: {"metrics": metrics}}}
        if groups:
            results["groups"] = groups
        document = {"git_hash": "abc1234", "command": f"ns eval --benchmarks {task}", "config": config, "target": target,
                    "results": results, "metadata": {"versioning": versioning or VERSIONING}}
        (artifacts / "results.yml").write_text(yaml.safe_dump(document))
    if write_metrics:
        responses = sum((status_codes or {"200": count or 0}).values())
        document = {
            "response_stats": {
                "description": "Response statistics saved during processing",
                "count": responses,
                "successful_count": (status_codes or {"200": responses}).get("200", 0),
                "status_codes": status_codes or {"200": responses},
                "finish_reason": finish_reason or {"stop": responses},
                "inference_time": 123.4,
            },
            "evaluation": {"runtime_seconds": 200.0, "total_runs": 1},
        }
        if reasoning:
            document["reasoning"] = {"description": "Reasoning statistics saved during processing", **reasoning}
        (artifacts / "eval_factory_metrics.json").write_text(json.dumps(document, indent=2))
    if samples is not None:
        outputs = artifacts / "nemo-evaluator-per-sample-outputs"
        outputs.mkdir(exist_ok=True)
        rows = [{"generation": "The answer is B.", "num_generated_tokens": 10, "num_prompt_tokens": 50, "sub_query_id": 0,
                 "score_name": "symbolic_correct", **sample} for sample in samples]
        (outputs / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    if exit_code is not None:
        (log_dir / "stage.exit").write_text(f"1763720100 {exit_code}\n")
    (log_dir / "client-1001.log").write_text("Running evaluation\nEvaluation finished\n")
    for name, text in (logs or {}).items():
        (log_dir / name).write_text(text)
    return task_dir


def binary_samples(correct: list[int], *, repeat: int = 1) -> list[dict[str, Any]]:
    """Per-sample rows with ids s0, s1, ... and the given 0/1 scores (each repeated `repeat` times)."""
    return [{"id": f"s{i}", "sub_query_id": r, "score": score} for i, score in enumerate(correct) for r in range(repeat)]
