"""`quanteval-mcp --root DIR` for what a config sends a launch to, not only for the arguments a tool is given.

A config inside the root can still name an output directory, a checkpoint, a mount or a benchmark file anywhere;
the tools that launch would write there, mount it into a container or run it. Before dry_run, launch_canary and
launch_full_run (and launch_deployment's plan) run, every such local path, from the file and from the overrides, must
resolve inside the root, or the call is refused naming the key. Paths of a SLURM run are on the cluster: not ours.

Which keys each engine reads (measured in their code):
- NEL 0.2.6's local executor: execution.output_dir (scripts and results are written there), deployment.checkpoint_path
  and deployment.cache_path (mounted into the server container), execution.mounts.{deployment,evaluation} (host paths,
  the mapping's keys), evaluation.tasks[].dataset_dir (mounted), execution.extra_docker_args (-v/--volume/--mount
  would mount anything: refused under a root).
- nel-next's local cluster: output.dir, a managed service's model (vllm, sglang: the server loads it) and
  container_mounts, a benchmark given as a BYOB .py file (imported and run).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from quanteval import configfile, engines, paths
from quanteval.engines.nel import config as nel_config
from quanteval.models import ToolError

LAUNCHING_TOOLS = frozenset({"dry_run", "launch_canary", "launch_full_run"})
_OVERRIDE = re.compile(r"^[+~]*(?P<key>[\w.\[\]-]+)=(?P<value>.*)$")
_DOCKER_MOUNT_FLAGS = ("-v", "--volume", "--mount")


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
    """(key, path) for every local path a launch of this config writes, mounts or runs; none for a SLURM run."""
    found: list[tuple[str, Any]] = []
    if engines.is_nel_next(doc):
        if (doc.get("cluster") or {}).get("type", "local") != "local":
            return []
        found.append(("output.dir", (doc.get("output") or {}).get("dir")))
        for name, service in (doc.get("services") or {}).items():
            if isinstance(service, dict) and service.get("type") in ("vllm", "sglang"):
                if _looks_local(service.get("model")):
                    found.append((f"services.{name}.model", service["model"]))
                found += [(f"services.{name}.container_mounts", str(m).split(":")[0]) for m in service.get("container_mounts") or []]
        for index, benchmark in enumerate(doc.get("benchmarks") or []):
            name = benchmark.get("name") if isinstance(benchmark, dict) else None
            if isinstance(name, str) and name.endswith(".py"):
                found.append((f"benchmarks[{index}].name", name))
        return [(key, value) for key, value in found if isinstance(value, str)]

    if nel_config.execution_type(doc) != "local":
        return []
    execution, deployment = doc.get("execution") or {}, doc.get("deployment") or {}
    found += [("execution.output_dir", execution.get("output_dir")), ("deployment.checkpoint_path", deployment.get("checkpoint_path")),
              ("deployment.cache_path", deployment.get("cache_path"))]
    for role, mounts in (execution.get("mounts") or {}).items():
        if isinstance(mounts, dict):
            found += [(f"execution.mounts.{role}", source) for source in mounts]
    for path, task in nel_config.config_tasks(doc):
        if isinstance(task, dict):
            found.append((f"{path}.dataset_dir", task.get("dataset_dir")))
    docker_args = execution.get("extra_docker_args")
    if isinstance(docker_args, str) and any(word.split("=")[0] in _DOCKER_MOUNT_FLAGS for word in _split(docker_args)):
        raise ToolError("execution.extra_docker_args: mounts a host path (-v/--volume/--mount), which this server's workspace root (--root) "
                        "cannot check. Use execution.mounts (checked) or deployment.checkpoint_path instead.")
    return [(key, value) for key, value in found if isinstance(value, str) and value not in ("???", "")]


def _override_paths(doc: dict[str, Any], overrides: list[str]) -> list[tuple[str, str]]:
    """Overrides that set one of the keys launch_paths checks (`-o execution.output_dir=/elsewhere`)."""
    found = []
    for override in overrides:
        match = _OVERRIDE.match(override)
        if not match:
            continue
        key, value = match["key"], match["value"].strip("'\"")
        if key.endswith(("output_dir", "output.dir", "checkpoint_path", "cache_path", "dataset_dir", ".model", ".name")) or ".mounts." in key:
            if key.endswith((".model", ".name")) and not (_looks_local(value) and (key.endswith(".model") or value.endswith(".py"))):
                continue
            found.append((key, value))
        elif key.endswith("extra_docker_args") and any(word.split("=")[0] in _DOCKER_MOUNT_FLAGS for word in _split(value)):
            raise ToolError(f"override {override!r}: mounts a host path (-v/--volume/--mount), which this server's workspace root (--root) cannot check.")
    return found


def _check_plan(plan: Any, host: Any, policy: paths.Policy) -> None:
    """launch_deployment's plan (sent whole by the client): its checkpoint and every absolute path among the server
    arguments (model, chat template, download dir ...) must be inside the root when it runs here."""
    if not isinstance(plan, dict) or (host not in (None, "local")) or (plan.get("host") not in (None, "local")):
        return
    if isinstance(plan.get("checkpoint"), str) and _looks_local(plan["checkpoint"]):
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


def _looks_local(value: Any) -> bool:
    """A path rather than a Hugging Face handle (org/name) or a registry name."""
    return isinstance(value, str) and value.startswith(("/", "~", "./", "../"))


def _split(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()
