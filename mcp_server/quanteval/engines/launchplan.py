"""A launch's config, read once: what confinement, the launch check, compose and launch all work from.

The tool asks `plan(config_path, overrides)` once and passes the plan down, so the YAML is parsed and nel-next's
schema check (a ~1 s child in its own venv) runs once per launch; `quanteval-mcp --root`'s confinement, which runs
before the tool in the same process, gets the same plan back for the same file and overrides (keyed by the file's
size and mtime, so an edit in between is read afresh).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from quanteval import configfile, engines
from quanteval.engines.base import LaunchPlan
from quanteval.models import ToolError

_PLANS: dict[tuple[str, int, int, tuple[str, ...]], LaunchPlan] = {}
_SCANNED = 2000  # folder entries self_contained looks at before it gives up and says no
_LOCK = threading.Lock()
_KEPT = 16


def plan(config_path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LaunchPlan:
    """The config at `config_path` with `overrides`, read once: parsed, its engine picked, the engine's reading done."""
    path = Path(config_path).expanduser().resolve()
    try:
        stat = path.stat()
    except OSError:
        raise ToolError(f"{config_path}: no such config file. Create one with build_config, or pass the right path.") from None
    key = (str(path), stat.st_size, stat.st_mtime_ns, tuple(overrides))
    with _LOCK:
        kept = _PLANS.get(key)
    if kept is not None and kept.reading.stats() == kept.read_stats:
        return kept
    doc = configfile.to_plain(engines.load_config(path))
    engine = engines.for_config(doc)
    reading = engine.run.read_launch(str(path), list(overrides))
    made = LaunchPlan(config_path=str(path), overrides=tuple(overrides), doc=doc, engine=engine, reading=reading,
                      read_stats=reading.stats())
    with _LOCK:
        if len(_PLANS) >= _KEPT:
            _PLANS.clear()
        _PLANS[key] = made
    return made


def self_contained(config_path: Path, doc: dict[str, Any], overrides: list[str]) -> bool:
    """Whether the file alone is what its engine runs, so a check needs no composing (validate_config stays a matter
    of milliseconds): no overrides, no interpolation, no file named to compose in (nel-next's `defaults: [base.yaml]`,
    `_base_`, a playbook), and no YAML in a folder beside it that a config group the file chooses is read from (NEL
    0.2.6 reads <folder>/<group>/<name>.yaml before its packaged ones for each `- group: name` of the defaults list,
    and Hydra's own groups from <folder>/hydra/; nel-next reads a subfolder only where a defaults entry names a file).
    Other folders there (run outputs such as nel-results/) are never read. The engines' packaged defaults are theirs."""
    text = config_path.read_text(errors="replace")
    if overrides or any(mark in text for mark in ("${", "_base_", "playbook")):
        return False
    defaults = doc.get("defaults") or []
    if not isinstance(defaults, list) or any(not isinstance(entry, dict) and entry != "_self_" for entry in defaults):
        return False
    groups = {"hydra", *(_group_folder(str(key)) for entry in defaults for key in entry)}
    top = config_path.resolve().parent
    seen = 0
    for folder, dirs, files in os.walk(top):
        dirs[:] = [name for name in dirs if not name.startswith(".") and (Path(folder) != top or name in groups)]
        seen += len(dirs) + len(files)
        if seen > _SCANNED or (Path(folder) != top and any(name.endswith((".yaml", ".yml")) for name in files)):
            return False
    return True


def _group_folder(key: str) -> str:
    """The folder beside the config a defaults key's group is read from: `deployment` for `deployment`,
    `override hydra/launcher`, `optional /deployment@target`."""
    for keyword in ("override ", "optional "):
        key = key.removeprefix(keyword)
    return key.split("@")[0].strip().lstrip("/").split("/")[0]


def as_written(config_path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> LaunchPlan:
    """A plan without the engine's reading: the file and the overrides only (for a self_contained config)."""
    path = Path(config_path).expanduser().resolve()
    doc = configfile.to_plain(engines.load_config(path))
    return LaunchPlan(config_path=str(path), overrides=tuple(overrides), doc=doc, engine=engines.for_config(doc))
