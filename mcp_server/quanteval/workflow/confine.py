"""`quanteval-mcp --root DIR` for what a config sends a launch to, not only for the arguments a tool is given.

A config inside the root can still name an output directory, a checkpoint, a mount or a benchmark file anywhere;
the tools that launch would write there, mount it into a container or run it. Before dry_run, launch_canary and
launch_full_run (and launch_deployment's plan) run, every such local path, from the file and from the overrides, must
resolve inside the root, or the call is refused naming the key. Paths of a SLURM run are on the cluster: not ours.

Which keys a launch reads is each engine's knowledge (`Engine.launch_paths`: engines/nel/config.py,
engines/nel_next/config.py), measured in their code; overrides of those keys are checked here too.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from quanteval import configfile, engines, paths
from quanteval.clusters import executor as executors
from quanteval.engines.nel import config as nel_config
from quanteval.models import ToolError

LAUNCHING_TOOLS = frozenset({"dry_run", "launch_canary", "launch_full_run"})
_OVERRIDE = re.compile(r"^[+~]*(?P<key>[\w.\[\]-]+)=(?P<value>.*)$")


def check_launch(tool: str, arguments: dict[str, Any], policy: paths.Policy) -> None:
    """Refuse a launch whose config (or overrides, or deployment plan) sends it outside the policy's root."""
    if policy.root is None:
        return
    if tool == "launch_deployment":
        _check_plan(arguments.get("plan"), arguments.get("host"), policy)
        return
    config_path = arguments.get("config_path")
    if tool not in LAUNCHING_TOOLS or not isinstance(config_path, str):
        return

    config = paths.local_path(config_path, "config_path", policy)
    doc = configfile.to_plain(engines.load_config(config))
    overrides = [o for o in arguments.get("overrides") or [] if isinstance(o, str)]
    for key, value in [*launch_paths(doc), *_override_paths(doc, overrides)]:
        _check(key, value, config.parent, policy)


def launch_paths(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, path) for every local path a launch of this config writes, mounts or runs; none for a run elsewhere."""
    engine = engines.for_config(doc)
    if not executors.for_name(engine.execution_type(doc)).on_this_machine:
        return []
    return engine.launch_paths(doc)


def _override_paths(doc: dict[str, Any], overrides: list[str]) -> list[tuple[str, str]]:
    """Overrides that set one of the keys launch_paths checks (`-o execution.output_dir=/elsewhere`)."""
    found = []
    for override in overrides:
        match = _OVERRIDE.match(override)
        if not match:
            continue
        key, value = match["key"], match["value"].strip("'\"")
        if key.endswith(("output_dir", "output.dir", "checkpoint_path", "cache_path", "dataset_dir", ".model", ".name")) or ".mounts." in key:
            if key.endswith((".model", ".name")) and not (paths.looks_local(value) and (key.endswith(".model") or value.endswith(".py"))):
                continue
            found.append((key, value))
        elif key.endswith("extra_docker_args") and nel_config.mounts_host_path(value):
            raise ToolError(f"override {override!r}: mounts a host path (-v/--volume/--mount), which this server's workspace root (--root) cannot check.")
    return found


def _check_plan(plan: Any, host: Any, policy: paths.Policy) -> None:
    """launch_deployment's plan (sent whole by the client): its checkpoint and every absolute path among the server
    arguments (model, chat template, download dir ...) must be inside the root when it runs here."""
    if not isinstance(plan, dict) or not executors.is_this_machine(host) or not executors.is_this_machine(plan.get("host")):
        return
    if isinstance(plan.get("checkpoint"), str) and paths.looks_local(plan["checkpoint"]):
        paths.local_path(plan["checkpoint"], "plan.checkpoint", policy)
    for index, arg in enumerate(plan.get("server_args") or []):
        value = str(arg).split("=", 1)[-1]
        if value.startswith(("/", "~")):
            paths.local_path(value, f"plan.server_args[{index}]", policy)


def _check(key: str, value: str, base: Path, policy: paths.Policy) -> None:
    path = Path(value).expanduser()
    if not path.is_absolute():
        path = base / path  # where quanteval resolves a config's relative paths: next to the config
    paths.local_path(str(path), key, paths.Policy(root=policy.root))


