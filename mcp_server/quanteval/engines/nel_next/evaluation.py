"""nel-next's side of evaluate_quantization (workflow/evaluate.py, which reaches it through the Engine members
engine.py takes from here): what stops its benchmarks before anything is served, the config values that point a
config at a served model, and what a finished run recorded beside its scores (failed benchmarks, answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quanteval.engines.base import Problem
from quanteval.engines.nel_next import config, nelnext, nextresults


def evaluation_problems(benchmarks: list[str]) -> list[Problem]:
    """What stops a run of these benchmarks (as build_config takes them) before anything is served: a BYOB file that
    does not compile, a skills:// benchmark nel-next cannot run; a ToolError where nel-next is not installed here."""
    items = [{"name": name} for name in benchmarks]
    problems = config.benchmark_file_problems(items) + config.skills_benchmark_problems(items)
    nelnext.nel_binary()
    return problems


def endpoint_values(url: str, protocol: str, model: str | None, max_tokens: int, output_dir: str, benchmarks: int,
                    max_problems: int | None) -> dict[str, Any]:
    """The keys set_config_value writes into a config built for an existing endpoint (build_config's deployment none)
    to evaluate a served model: its URL for the protocol, its name, the generation budget, where runs write, and a
    problem limit for each of the config's benchmarks (none: all)."""
    values: dict[str, Any] = {"services.model.url": nelnext.endpoint_url(url, protocol), "services.model.protocol": protocol,
                              "services.model.model": model, "services.model.generation.max_tokens": max_tokens,
                              "output.dir": output_dir}
    if max_problems:
        values.update({f"benchmarks[{index}].max_problems": max_problems for index in range(benchmarks)})
    return values


def failed_benchmarks(run_dir: Path) -> dict[str, str]:
    """The benchmarks nel-next itself recorded as failed in a run, with its error for each."""
    return nextresults.run_outcome(run_dir).failed


def responses(run_dir: Path, limit: int) -> list[dict[str, Any]]:
    """The run's first answers per benchmark (problem_idx, expected, response: its first 300 characters), at most
    `limit` in all."""
    shown: list[dict[str, Any]] = []
    for bundle in nextresults.bundles(run_dir).values():
        for (problem, _repeat), record in sorted(nextresults.paired_records(bundle.directory).items())[:limit]:
            text, expected = record.get("model_response"), record.get("expected_answer")
            shown.append({"problem_idx": problem, "expected": None if expected is None else str(expected),
                          "response": text[:300] if isinstance(text, str) else None})
    return shown[:limit]
