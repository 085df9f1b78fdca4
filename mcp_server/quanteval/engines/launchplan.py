"""A launch's config, read once: what confinement, the launch check, compose and launch all work from.

A launch used to read its config at each step: the YAML parsed by the tool and again by the engine, nel-next's schema
check (a ~1 s child in its own venv) asked at check, compose and launch, its launch check asked three times. Now the
tool asks `plan(config_path, overrides)` once and passes the plan down; `quanteval-mcp --root`'s confinement, which
runs before the tool in the same process, gets the same plan back for the same file and overrides (keyed by the file's
size and mtime, so an edit in between is read afresh).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quanteval import configfile
from quanteval.models import ToolError

if TYPE_CHECKING:
    from quanteval.engines.base import Engine


@dataclass(frozen=True)
class LaunchPlan:
    config_path: str  # absolute
    overrides: tuple[str, ...]
    doc: dict[str, Any]  # the file as parsed (plain); never mutated
    engine: Engine
    # the engine's own reading of the config with the overrides (nel-next: its schema check's answer: the composed
    # config, its benchmarks, cluster type and output dir; NEL 0.2.6: nothing, NEL composes in its own child)
    reading: dict[str, Any] = field(default_factory=dict)

    @property
    def override_list(self) -> list[str]:
        return list(self.overrides)


_PLANS: dict[tuple[str, int, int, tuple[str, ...]], LaunchPlan] = {}
_LOCK = threading.Lock()
_KEPT = 16


def plan(config_path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LaunchPlan:
    """The config at `config_path` with `overrides`, read once: parsed, its engine picked, the engine's reading done."""
    from quanteval import engines

    path = Path(config_path).expanduser().resolve()
    try:
        stat = path.stat()
    except OSError:
        raise ToolError(f"{config_path}: no such config file. Create one with build_config, or pass the right path.") from None
    key = (str(path), stat.st_size, stat.st_mtime_ns, tuple(overrides))
    with _LOCK:
        if (kept := _PLANS.get(key)) is not None:
            return kept
    doc = configfile.to_plain(engines.load_config(path))
    engine = engines.for_config(doc)
    made = LaunchPlan(config_path=str(path), overrides=tuple(overrides), doc=doc, engine=engine,
                      reading=engine.read_launch(str(path), list(overrides)))
    with _LOCK:
        if len(_PLANS) >= _KEPT:
            _PLANS.clear()
        _PLANS[key] = made
    return made

