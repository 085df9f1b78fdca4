"""validate_config: every problem in a config, offline, in milliseconds, each with its key and fix.

One engine-neutral body: the engine that owns the config (engines.for_config) holds its rules: NEL 0.2.6's in
engines/nel/checks.py and rules.py, nel-next's (its own schema as the oracle) in engines/nel_next/config.py.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, Field

from quanteval import configfile, engines
from quanteval.engines import commands, launchplan
from quanteval.engines.base import Problem
from quanteval.models import StrictModel


class ValidateConfigInput(StrictModel):
    config_path: str = Field(description="The config file (.yaml).")
    overrides: list[str] = Field(
        default_factory=list,
        description="Overrides you will pass to `nel run -o`, checked too.",
    )
    check_env: bool = Field(
        True, description="Report needed env vars unset here (false if the run starts elsewhere)."
    )


class ValidateConfigOutput(BaseModel):
    config_path: str
    valid: bool = Field(description="True when there is no error (warnings allowed).")
    errors: int
    warnings: int
    problems: list[Problem] = Field(description="Every problem found, in file order; at most 200.")
    elapsed_ms: float


MAX_PROBLEMS = 200

def validate_config(request: ValidateConfigInput) -> ValidateConfigOutput:
    """Use after every edit and before dry_run: checks a config offline in milliseconds; each finding with its key and
    fix.
    """
    started = time.perf_counter()
    path = Path(request.config_path).expanduser()
    doc = configfile.load_plain(path)
    engine = engines.for_config(doc)
    # the shell check reads the config as the engine composes it, where that can differ from the file: composed (for
    # NEL 0.2.6, in a child process: ~0.7 s) while the engine's rules run here
    compose = launchplan.as_written if launchplan.self_contained(path, doc, request.overrides) else launchplan.plan
    with ThreadPoolExecutor(1, thread_name_prefix="quanteval-compose") as pool:
        composed = pool.submit(compose, path, request.overrides)
        problems = engine.config.validate(doc, path, request.overrides, request.check_env)
        problems += commands.problems(composed.result(), problems)
    errors = sum(problem.severity == "error" for problem in problems)
    return ValidateConfigOutput(
        config_path=request.config_path,
        valid=errors == 0,
        errors=errors,
        warnings=len(problems) - errors,
        problems=problems[:MAX_PROBLEMS],
        elapsed_ms=round((time.perf_counter() - started) * 1000, 1),
    )
