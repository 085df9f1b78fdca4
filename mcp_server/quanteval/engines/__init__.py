"""Evaluation engines behind one seam (engines/base.py): the registry, and which engine a config or a run belongs to.

- engines/nel: NeMo Evaluator Launcher 0.2.6 (`nel run`, containers; Hydra configs with execution/deployment/evaluation),
  driven in-process through its Python API in child processes.
- engines/nel_next: NeMo Evaluator >= 0.3 (`nel eval run`, benchmarks in-process; configs with services/benchmarks/
  cluster/output), driven through its CLI from its own Python 3.12 venv.

A new engine is one package under engines/ whose engine.py declares its `base.Engine` (its roles: config, run,
placement, and the optional evaluation capability), and one line in ENGINES below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, Literal

from ruamel.yaml.comments import CommentedMap

from quanteval import configfile, ledger
from quanteval.engines.base import Engine, config_check
from quanteval.engines.runresults import ResultsReader
from quanteval.models import ToolError

# One line per engine, asked in this order (the last is the default): its name (what build_config takes and each run's
# record keeps), its Engine and its ResultsReader. Both load on first use: an engine brings its config rules and run
# code (~120 ms, more with ruamel), which a tool that reads a results folder (quanteval gate, extract_scores) never
# needs; its reader is light.
ENGINES = (
    ("nel-next", "quanteval.engines.nel_next.engine:ENGINE", "quanteval.engines.nel_next.results:NelNextResults"),
    ("nel", "quanteval.engines.nel.engine:ENGINE", "quanteval.engines.nel.results:NelResults"),
)
EngineName = Literal[tuple(sorted(name for name, _, _ in ENGINES))]  # type: ignore[valid-type]  # the tools' schema: the known names


def _load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


@cache
def registered() -> tuple[Engine, ...]:
    """Every engine, in ENGINES' order: the first that owns a config's shape is its engine; the last is the default."""
    loaded = tuple(_load(engine) for _, engine, _ in ENGINES)
    if misnamed := [f"{engine.name} (its line: {name})" for (name, _, _), engine in zip(ENGINES, loaded, strict=True) if engine.name != name]:
        raise ToolError(f"engines not named as their ENGINES line: {', '.join(misnamed)}")
    return loaded


@cache
def readers() -> tuple[ResultsReader, ...]:
    """Every engine's results reader, in ENGINES' order."""
    return tuple(_load(reader)() for _, _, reader in ENGINES)


def _recognized(run: str) -> ResultsReader | None:
    """The reader of a run named by a local path (by its layout) or a ledger id (the engine that made it); None for
    anything else (host:path, an invocation id, a path no engine's layout matches)."""
    run = run.strip()
    local = Path(run).expanduser()
    if run and local.exists():
        return next((reader for reader in readers() if reader.is_run_dir(local)), None)
    try:
        record = ledger.get(run)
    except ToolError:
        return None
    name = record.details.get("engine") or readers()[-1].name  # records made before engines were recorded: NEL's
    return next((reader for reader in readers() if reader.name == name), None)


def _by_location() -> ResultsReader:
    return next(reader for reader in readers() if reader.reads_by_location)


def results_for(run: str) -> ResultsReader:
    """The reader of a run: by its layout or its record, else the reader that reads runs by location."""
    return _recognized(run) or _by_location()


def results_for_pair(baseline: str, candidate: str) -> ResultsReader:
    """The one reader of two runs compared against each other. A side no engine recognizes is read by the other's
    reader (which then says what it lacks); runs of two engines are refused, as their scores are not computed the
    same way."""
    base, cand = _recognized(baseline), _recognized(candidate)
    if base is not None and cand is not None and base is not cand:
        raise ToolError(f"baseline and candidate come from different engines (the baseline is a {base.title} run, the "
                        f"candidate a {cand.title} run): their scores are not computed the same way. Evaluate both "
                        "with the same engine.")
    return base or cand or _by_location()


def by_name(name: str | None) -> Engine:
    """The engine a stored name stands for; a record made before engines were recorded (no name) is the default's, NEL
    0.2.6's. An unknown name is refused with the known ones: a typo must not run as another engine."""
    if not name:
        return registered()[-1]
    if (engine := next((engine for engine in registered() if engine.name == name), None)) is None:
        raise ToolError(f"unknown engine {name!r}: the known ones are {', '.join(engine.name for engine in registered())}.")
    return engine


def for_config(doc: Any) -> Engine:
    """The engine a parsed config is written for: the first that owns its sections."""
    return next((engine for engine in registered() if engine.config.owns(doc)), registered()[-1])


def for_record(record: ledger.Record) -> Engine:
    """The engine that made a run: the record keeps its name."""
    return by_name(record.details.get("engine"))


def evaluating() -> Engine:
    """The engine that evaluates a served model in one call (evaluate_quantization, get_task_recipe's nel_next form):
    the first with the Evaluation capability; an engine without it is never picked."""
    if (engine := next((engine for engine in registered() if engine.evaluation is not None), None)) is None:
        raise ToolError(f"no engine here evaluates a served model in one call (none of {', '.join(e.name for e in registered())} "
                        "has the evaluation capability): use the step-by-step tools (build_config, launch_canary, ...).")
    return engine


def placement_form() -> Engine:
    """The engine whose config keys a placement view uses (PlacementRole.view: NEL 0.2.6's execution and deployment
    keys): apply_cluster reads a view's deployment type and what its unset keys stand for from it."""
    return next(engine for engine in registered() if engine.placement.native)


def known_config(doc: Any) -> bool:
    """Is this parsed YAML a config of any engine (and not some other YAML file)?"""
    return any(engine.config.owns(doc) for engine in registered())


# Refuses YAML that is not a config of any engine (a docker-compose file, a policy): config tools never touch those.
check_config = config_check(known_config)


def load_config(path: str | Path) -> CommentedMap:
    """An evaluation config of any engine, round-trip (comments and order kept)."""
    return configfile.load_config(path, check_config)


def edit_config(path: str | Path, mutate: Callable[[CommentedMap], None]) -> str:
    """configfile.edit_config for an evaluation config of any engine: atomic, returns the diff."""
    return configfile.edit_config(path, mutate, check_config)


__all__ = ["Engine", "registered", "EngineName", "by_name", "check_config", "edit_config", "evaluating", "for_config",
           "for_record", "known_config", "load_config", "placement_form"]
