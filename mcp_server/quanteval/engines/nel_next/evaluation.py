"""nel-next's Evaluation capability (engines/base.py), what evaluate_quantization (workflow/evaluate.py) reaches
through engines.evaluating(): what stops its benchmarks before anything is served, the config values that point a
config at a served model, and what a finished run recorded beside its scores (failed benchmarks, answers)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from quanteval.engines.base import Problem
from quanteval.engines.nel_next import config, nelnext, nextresults, skills
from quanteval.engines.nel_next.config import served_facts
from quanteval.engines.nel_next.jobserving import serve_in_job
from quanteval.engines.nel_next.nelnext import read_run_facts, write_run_facts
from quanteval.engines.nel_next.skills import task_form


def evaluation_problems(benchmarks: list[str]) -> list[Problem]:
    """What stops a run of these benchmarks (as build_config takes them) before anything is served: a BYOB file that
    does not compile, a skills:// benchmark nel-next cannot run; a ToolError where nel-next is not installed here."""
    items = [{"name": name} for name in benchmarks]
    problems = config.benchmark_file_problems(items) + config.skills_benchmark_problems(items)
    nelnext.nel_binary()
    return problems


def benchmark_names(benchmarks: list[str]) -> list[str] | None:
    """The names nel-next's bundles give these benchmarks: a BYOB file's @benchmark(name=...) (or the one after
    `file.py:`), a skills:// benchmark's NAME (its full name too), a built-in's name; None when a file's cannot be
    read without running it."""
    names: list[str] = []
    for name in benchmarks:
        file = nelnext.benchmark_file(name)
        if file is None:
            names += [name.removeprefix("skills://"), name] if name.startswith("skills://") else [name]
        elif file != name:  # path/file.py:bench
            names.append(name.rsplit(":", 1)[1])
        elif (declared := _declared_benchmarks(Path(file).expanduser())) is None:
            return None
        else:
            names += declared
    return list(dict.fromkeys(names))


def _declared_benchmarks(path: Path) -> list[str] | None:
    """The literal names of a BYOB file's @benchmark(name="...") decorators; None when it has none to read."""
    try:
        tree = ast.parse(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    found = [keyword.value.value for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             for decorator in node.decorator_list if isinstance(decorator, ast.Call)
             and getattr(decorator.func, "id", getattr(decorator.func, "attr", None)) == "benchmark"
             for keyword in decorator.keywords if keyword.arg == "name" and isinstance(keyword.value, ast.Constant)
             and isinstance(keyword.value.value, str)]
    return found or None


def benchmark_sizes(benchmarks: list[str]) -> dict[str, int]:
    """Problems per skills:// benchmark, the rows of its data as the NeMo-Skills in nel-next's venv finds them (one
    probe); a BYOB file's size is known only once it runs."""
    names = {name: name.removeprefix("skills://") for name in benchmarks if name.startswith("skills://")}
    if not names:
        return {}
    found = skills.probe(list(names.values())).benchmarks
    return {name: found[short].rows for name, short in names.items() if short in found and found[short].rows}


def endpoint_values(url: str, protocol: str, model: str | None, max_tokens: int, output_dir: str, benchmarks: int,
                    max_problems: int | None, repeats: int = 1, sampling: dict[str, float] | None = None) -> dict[str, Any]:
    """The keys set_config_value writes into a config built for an existing endpoint (build_config's deployment none)
    to evaluate a served model: its URL for the protocol, its name, the generation budget and sampling (the service's
    `generation`, so every benchmark and both sides get the same), where runs write, and per benchmark a problem limit
    (none: all) and its repeats (nel-next's `benchmarks[i].repeats`, which the bundle records)."""
    values: dict[str, Any] = {"services.model.url": nelnext.endpoint_url(url, protocol), "services.model.protocol": protocol,
                              "services.model.model": model, "services.model.generation.max_tokens": max_tokens,
                              "output.dir": output_dir}
    values.update({f"services.model.generation.{key}": value for key, value in (sampling or {}).items()})
    if max_problems:
        values.update({f"benchmarks[{index}].max_problems": max_problems for index in range(benchmarks)})
    if repeats > 1:
        values.update({f"benchmarks[{index}].repeats": repeats for index in range(benchmarks)})
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
