"""NEL 0.2.6's task catalogue (cached): which tasks NEL can run, by name and harness.

Knowledge both engines share, so it lives beside them: NEL 0.2.6's rules check a config's tasks against it, nel-next
maps its NeMo-Skills tasks to skills://NAME benchmarks, and the task tools list it.

The catalogue is NEL's own packaged task list (`resources/all_tasks_irs.yaml`, the file
`nel ls tasks` reads). Parsing that 1.3 MB file takes a few hundred milliseconds, so the
parsed entries are cached as JSON in the state directory, keyed by NEL version and the
file's size and mtime; a warm call reads only the small JSON file.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import importlib.util
import json
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from quanteval import envvars, kept
from quanteval.models import ToolError

log = logging.getLogger(__name__)

NEL_DISTRIBUTION = "nemo-evaluator-launcher"
CATALOGUE_CACHE_SCHEMA = 3


class TaskEntry(BaseModel):
    name: str = Field(description="Task name as NEL lists it, e.g. ns_gpqa.")
    harness: str = Field(description="Harness (evaluation framework) the task belongs to, e.g. nemo_skills.")
    qualified_name: str = Field(description="`harness.name`: unambiguous in a config's evaluation.tasks[].name.")
    container: str = Field(description="Container image NEL runs the task in.")
    description: str = Field(description="NEL's description of the task.")
    endpoint_types: list[str] = Field(description="Endpoint types the task supports (chat, completions, ...).")
    harness_task: str | None = Field(None, description="The harness's own name for the task (config.params.task), e.g. gpqa for ns_gpqa.")
    reads_tokenizer: bool = Field(False, description="The task's command reads config.params.extra.tokenizer (lm-evaluation-harness, ruler, ...).")


def nel_tasks_file() -> Path:
    """The task list packaged with the installed NEL, found without importing NEL (that takes seconds)."""
    spec = importlib.util.find_spec("nemo_evaluator_launcher")
    if spec is None or not spec.submodule_search_locations:
        raise ToolError(
            f"nemo_evaluator_launcher is not installed in this Python ({sys.executable}). Install it with "
            f"`{sys.executable} -m pip install nemo-evaluator-launcher==0.2.6` (`{envvars.setup_command('setup')}` does)."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "resources" / "all_tasks_irs.yaml"


@functools.cache  # a reinstall also changes the task file's mtime, which the cache key catches
def nel_version() -> str:
    try:
        return importlib.metadata.version(NEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def load_yaml(text: str | bytes) -> Any:
    """PyYAML's C loader where available: about ten times faster than the pure-Python one."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _parse_tasks_file(source: Path) -> list[TaskEntry]:
    document = load_yaml(source.read_bytes())
    containers = {harness["name"]: harness.get("container", "") for harness in document.get("harnesses") or []}
    entries: list[TaskEntry] = []
    seen: set[str] = set()
    for task in document.get("tasks") or []:
        qualified = f"{task['harness']}.{task['name']}"
        if qualified in seen:  # NEL keeps the first occurrence too
            continue
        seen.add(qualified)
        config = (task.get("defaults") or {}).get("config") or {}
        entries.append(
            TaskEntry(
                name=task["name"],
                harness=task["harness"],
                qualified_name=qualified,
                container=containers.get(task["harness"], ""),
                description=" ".join(str(task.get("description") or "").split()),
                endpoint_types=list(config.get("supported_endpoint_types") or ["chat"]),
                harness_task=(config.get("params") or {}).get("task"),
                reads_tokenizer="config.params.extra.tokenizer" in str((task.get("defaults") or {}).get("command") or ""),
            )
        )
    return entries


_memo: dict[tuple[str, str, int, int], list[TaskEntry]] = {}


def catalogue(source: Path | None = None) -> list[TaskEntry]:
    """Every task NEL knows, in NEL's order. Cached per NEL version and task-file size/mtime."""
    source = source or nel_tasks_file()
    try:
        stat = source.stat()
    except OSError as exc:
        raise ToolError(f"{source}: cannot read NEL's task list ({exc.strerror}). Reinstall nemo-evaluator-launcher.") from None
    version = nel_version()
    key = (str(source), version, stat.st_size, stat.st_mtime_ns)
    if key in _memo:
        return _memo[key]

    entries = _read_cache(f"nel-{version}", key)
    if entries is None:
        entries = _parse_tasks_file(source)
        _write_cache(f"nel-{version}", key, entries)
    _memo.clear()
    _memo[key] = entries
    return entries


KEPT_AS = "tasks-catalogue"


def _read_cache(name: str, key: tuple[str, str, int, int]) -> list[TaskEntry] | None:
    try:
        cached = json.loads(kept.read(KEPT_AS, name) or "{}")
    except ValueError:
        return None
    if cached.get("schema") != CATALOGUE_CACHE_SCHEMA or tuple(cached.get("key") or ()) != key:
        return None
    return [TaskEntry.model_construct(**task) for task in cached["tasks"]]


def _write_cache(name: str, key: tuple[str, str, int, int], entries: list[TaskEntry]) -> None:
    payload = {"schema": CATALOGUE_CACHE_SCHEMA, "key": list(key), "tasks": [entry.model_dump() for entry in entries]}
    if failed := kept.keep(KEPT_AS, name, json.dumps(payload)):  # a read-only state dir only costs speed
        log.warning("could not write the task catalogue cache %s: %s", envvars.cache_dir() / KEPT_AS, failed)


def lookup(name: str, source: Path | None = None) -> list[TaskEntry]:
    """Entries matching `name` or `harness.name`: none = unknown, one = found, several = ambiguous."""
    name = name.strip()
    if "." in name:
        return [entry for entry in catalogue(source) if entry.qualified_name == name]
    return [entry for entry in catalogue(source) if entry.name == name]


def suggest(name: str, n: int = 3, source: Path | None = None) -> list[str]:
    """Closest task names (bare where unique, qualified where the bare name is ambiguous)."""
    entries = catalogue(source)
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.name] = counts.get(entry.name, 0) + 1
    candidates = list(dict.fromkeys(entry.name for entry in entries)) + [entry.qualified_name for entry in entries]
    suggestions: list[str] = []
    for match in difflib.get_close_matches(name.strip(), candidates, n=n * 3, cutoff=0.6):
        if counts.get(match, 0) > 1:  # an ambiguous bare name is no use in a config: offer the qualified ones
            suggestions.extend(entry.qualified_name for entry in entries if entry.name == match)
        else:
            suggestions.append(match)
    return list(dict.fromkeys(suggestions))[:n]
