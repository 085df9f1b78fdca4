"""Run one NEL API call in a child process and hand its answer back as JSON.

NEL prints freely (dry-run scripts, colours, ssh chatter) and can block on ssh, so every
call runs in `python -m quanteval.engines.nel.nelexec`: the child points its fd 1 at stderr before
importing NEL and writes one JSON object to the real stdout at the end; the parent reads
that object with a timeout. Nothing NEL prints can reach the MCP stdout.

Child protocol: request `{"op": ..., "args": {...}}` on stdin (or as the one argument); answer `{"ok": true, ...}`
or `{"ok": false, "error": "<NEL's message, no traceback>"}` on stdout.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from quanteval import redact, warm_python
from quanteval.clusters import executor as executors
from quanteval.engines.nel.nelfacts import EXECUTOR_PROGRAMS
from quanteval.models import ToolError

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
MAX_ERROR_CHARS = 2000


# ---------------------------------------------------------------- parent side


# What a child imports before its op; a warm process (quanteval/warm_python.py) imports it once for the ops that start
# nothing lasting: composing, hashing, resolving and dry-running a config. Launches, kills, resumes and the
# execution-database reads run in a fresh child each (a launch's run scripts must not share a warm process's fate).
_PRELOAD = """
import nemo_evaluator_launcher.api.functional, nemo_evaluator_launcher.api.types
import nemo_evaluator_launcher.common.override_sugar, omegaconf
import quanteval.engines.nel.nelexec, quanteval.engines.rendering, quanteval.stdio_guard
"""
_WARM_CHILD = "from quanteval.engines.nel.nelexec import main; main()"


def _warm(op: str, args: dict[str, Any]) -> bool:
    return op in ("hash", "resolved") or (op == "run" and bool(args.get("dry_run")))


def call(op: str, timeout: float, **args: Any) -> dict[str, Any]:
    """Run `op` in a child process; return its JSON answer (ok or not). ToolError when the child dies or hangs."""
    request = json.dumps({"op": op, "args": args})
    if _warm(op, args):
        try:
            done = warm_python.run(sys.executable, _PRELOAD, _WARM_CHILD, [request], {**os.environ, "PYTHONUNBUFFERED": "1"},
                                   timeout_s=timeout)
        except subprocess.TimeoutExpired:
            raise _timed_out(op, timeout) from None
        return _answer(op, done.returncode, done.stdout, done.stderr)
    # NEL's stderr goes to a file, not a pipe: the run scripts NEL starts in the background inherit it, and
    # a pipe would keep this call waiting until the whole evaluation ends.
    with tempfile.TemporaryFile(mode="w+") as stderr:
        try:
            completed = subprocess.run(
                [sys.executable, "-m", "quanteval.engines.nel.nelexec"],
                input=request,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                timeout=timeout,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        except subprocess.TimeoutExpired:
            raise _timed_out(op, timeout) from None
        stderr.seek(0)
        return _answer(op, completed.returncode, completed.stdout, stderr.read())


def _timed_out(op: str, timeout: float) -> ToolError:
    return ToolError(f"NEL did not answer within {timeout:.0f} s ({op}). A host may be unreachable; "
                     "check it with ssh_check and retry.")


def _answer(op: str, returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    try:
        return json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        last = [line for line in stderr.strip().splitlines() if line.strip()][-3:]
        raise ToolError(f"NEL's {op} ended without an answer (exit {returncode}): {' | '.join(last)}") from None


# ---------------------------------------------------------------- child side


def parse_packaged_task_list_once() -> None:
    """NEL parses its packaged task list (resources/all_tasks_irs.yaml: 421 tasks, ~0.9 CPU-s of pure-Python YAML)
    each time it looks tasks up: a dry run or launch parses it twice locally, 2 + N times on SLURM for N tasks. The
    file is part of the installed package, so this process parses it once, at its first lookup, and each lookup gets
    a deep copy of its own, as a fresh parse would give it. (Not in the warm process's preload: a one-shot
    validate_config, which looks no task up, would pay the parse; op_run asks for it.)"""
    from nemo_evaluator_launcher.common.container_metadata import intermediate_repr

    parse = getattr(intermediate_repr, "_load_irs_from_package", None)
    if parse is None or getattr(parse, "parsed", None) is not None:  # another NEL, or already kept
        return
    parsed: dict[tuple[str, str, str], Any] = {}

    def parsed_once(package_name: str, resource_name: str, source: str) -> Any:
        key = (package_name, resource_name, source)
        if key not in parsed:
            parsed[key] = parse(package_name, resource_name, source)
        return copy.deepcopy(parsed[key])

    parsed_once.parsed = parsed  # type: ignore[attr-defined]
    intermediate_repr._load_irs_from_package = parsed_once


def error_message(exc: BaseException) -> str:
    """NEL's error as a person reads it: the message only, no traceback, no Hydra hint, bounded."""
    text = ANSI_ESCAPE.sub("", str(exc)).strip() or type(exc).__name__
    lines = [line for line in text.splitlines() if "HYDRA_FULL_ERROR" not in line]
    message = "\n".join(lines).strip()
    return message[:MAX_ERROR_CHARS]


def _compose(config_path: str, overrides: list[str]) -> Any:
    from nemo_evaluator_launcher.api.types import RunConfig
    from nemo_evaluator_launcher.common.override_sugar import apply_task_name_overrides, partition_overrides

    hydra_overrides, task_overrides = partition_overrides(overrides)
    cfg = RunConfig.from_hydra(config=config_path, hydra_overrides=hydra_overrides)
    if task_overrides:
        cfg = apply_task_name_overrides(cfg, task_overrides)
    return cfg


def content_hash(cfg: Any) -> str:
    """sha256 of the composed config, unresolved (env values never enter it) and without NEL's own path key."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=False)
    data.pop("user_config_path", None)
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _summary(cfg: Any) -> dict[str, Any]:
    execution = cfg.execution
    executor = str(execution.get("type", "local"))
    return {
        "executor": executor,
        "host": executors.for_name(executor).login_host(execution),
        "output_dir": str(execution.get("output_dir")),
        "tasks": [str(task.name) for task in (cfg.evaluation.tasks or [])],
    }


UNRESOLVED = "\0unresolved: "  # marks a value NEL could not resolve (the reason follows)


def _resolved(node: Any) -> Any:
    """A composed config as plain data, each value resolved as NEL resolves it when it reads that value
    (`${oc.env:VAR,default}`, `${other.key}`, NEL's resolvers); a value that cannot be resolved becomes
    UNRESOLVED + the reason, so one bad value elsewhere does not hide the others; ??? stays ???."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if not isinstance(node, (DictConfig, ListConfig)):
        return node
    keys = list(node.keys()) if isinstance(node, DictConfig) else list(range(len(node)))
    out = {}
    for key in keys:
        if OmegaConf.is_missing(node, key):
            out[key] = "???"
            continue
        try:
            out[key] = _resolved(node[key])
        except Exception as exc:  # noqa: BLE001 - any resolution failure is reported with the value's key
            out[key] = UNRESOLVED + error_message(exc)
    return out if isinstance(node, DictConfig) else list(out.values())


_NEL_SEARCHPATH = "hydra.searchpath=[pkg://nemo_evaluator_launcher.configs,pkg://nemo_evaluator_launcher_internal.configs]"


def _group_files(config_path: str, overrides: list[str]) -> list[str]:
    """Where Hydra looks first for each config group the config composes (`defaults:` or an override such as
    `deployment=mine` reads <config dir>/deployment/mine.yaml over NEL's packaged one), whether there is a file or not:
    one written there later changes what a launch composes."""
    import pathlib

    from hydra import compose
    from nemo_evaluator_launcher.common.override_sugar import partition_overrides

    path = pathlib.Path(config_path).expanduser().resolve()
    hydra_overrides, _ = partition_overrides(overrides)
    # Hydra as _compose (RunConfig.from_hydra) left it, with the search path RunConfig.from_hydra adds
    composed = compose(config_name=path.stem, overrides=[*hydra_overrides, _NEL_SEARCHPATH], return_hydra_config=True)
    return [str(path.parent / str(group) / f"{choice}{suffix}") for group, choice in composed.hydra.runtime.choices.items()
            if choice is not None and not str(group).startswith("hydra") for suffix in (".yaml", ".yml")]


def op_resolved(config_path: str, overrides: list[str]) -> dict[str, Any]:
    """The config as a launch with these overrides reads it: NEL's composition, overrides and interpolation (`config`),
    the same before interpolation (`raw`: what NEL's packaged command presets compare with), and the config-group
    files it was or would be composed from (`depends_on`)."""
    from omegaconf import OmegaConf

    cfg = _compose(config_path, overrides)
    return {"config": _resolved(cfg), "raw": OmegaConf.to_container(cfg, resolve=False),
            "depends_on": _group_files(config_path, overrides)}


def op_hash(config_path: str, overrides: list[str]) -> dict[str, Any]:
    cfg = _compose(config_path, overrides)
    return {"config_hash": content_hash(cfg), **_summary(cfg)}


MAX_WARNINGS = 50


class _NelWarnings(logging.Handler):
    """NEL's warnings (it logs through structlog's stdlib factory, so they reach the root logger), each with the task
    NEL's per-task parameter check was on when it warned (None for the others)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.found: list[dict[str, str | None]] = []
        self.task: str | None = None
        self.checking: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.msg.get("event") if isinstance(record.msg, dict) else record.getMessage()
        # NEL appends every parameter the template reads; what is unused is the finding.
        text = redact.shown_line(ANSI_ESCAPE.sub("", str(message)).split(" Valid params from command:")[0])
        item = {"task": self.checking, "message": text}
        if item not in self.found and len(self.found) < MAX_WARNINGS:
            self.found.append(item)


@contextlib.contextmanager
def _nel_warnings() -> Any:
    """Collect NEL's warnings during a run, tagging those of its per-task parameter check with the task's name: NEL
    merges each task's config (get_eval_factory_config) right before checking it (validate_params_in_command)."""
    import nemo_evaluator_launcher.api.functional as functional

    handler = _NelWarnings()
    merge, check = functional.get_eval_factory_config, functional.validate_params_in_command

    def merge_tagged(cfg: Any, task: Any, *args: Any, **kwargs: Any) -> Any:
        handler.task = str(task.get("name")) if hasattr(task, "get") else None
        return merge(cfg, task, *args, **kwargs)

    def check_tagged(*args: Any, **kwargs: Any) -> Any:
        handler.checking = handler.task
        try:
            return check(*args, **kwargs)
        finally:
            handler.checking = None

    functional.get_eval_factory_config, functional.validate_params_in_command = merge_tagged, check_tagged
    logging.getLogger().addHandler(handler)
    try:
        yield handler.found
    finally:
        logging.getLogger().removeHandler(handler)
        functional.get_eval_factory_config, functional.validate_params_in_command = merge, check


def docker_problem() -> str | None:
    """Why no Docker daemon answers here (`docker info`), for the executor that runs every task in Docker; None when
    one does."""
    if shutil.which("docker") is None:
        return "the `docker` command is not installed"
    try:
        probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                               timeout=15)
    except subprocess.TimeoutExpired:
        return "the Docker daemon did not answer within 15 s"
    return "no Docker daemon answers (`docker info` failed)" if probe.returncode != 0 else None


def op_run(config_path: str, overrides: list[str], extra_overrides: list[str], tasks: list[str],
           dry_run: bool) -> dict[str, Any]:
    from nemo_evaluator_launcher.api.functional import run_eval

    parse_packaged_task_list_once()  # the one op that looks tasks up (the others need not import NEL's task lists)
    cfg_hash = content_hash(_compose(config_path, overrides))
    cfg = _compose(config_path, overrides + extra_overrides)
    summary = _summary(cfg)
    if not dry_run and "docker" in EXECUTOR_PROGRAMS.get(summary["executor"], ()) and (problem := docker_problem()):
        return {"ok": False, "error": (
            f"execution.type {summary['executor']} runs every task in Docker, but {problem}. Start a Docker daemon on "
            "this machine, or set execution to slurm (execution.hostname = your cluster's login node)."),
                "config_hash": cfg_hash, **summary}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), _nel_warnings() as warnings:
        invocation_id = run_eval(cfg, dry_run=dry_run, tasks=tasks or None)
    return {"invocation_id": invocation_id, "config_hash": cfg_hash, "printed": ANSI_ESCAPE.sub("", printed.getvalue()),
            "warnings": warnings, **summary}


def _jobs(invocation_id: str) -> dict[str, Any]:
    from nemo_evaluator_launcher.common.execdb import ExecutionDB

    return ExecutionDB().get_jobs(invocation_id)


def op_jobs(invocation_id: str) -> dict[str, Any]:
    """The jobs NEL recorded for an invocation: executor and where each one runs/logs."""
    jobs = _jobs(invocation_id)
    return {"jobs": [{"job_id": job_id, "executor": job.executor, "data": job.data} for job_id, job in jobs.items()]}


def op_results_dirs(invocation_id: str) -> dict[str, Any]:
    """Where each job of an invocation writes its results, as NEL says: a local dir, or host:path on a cluster."""
    from nemo_evaluator_launcher.exporters.utils import get_results_dir_from_job_data

    return {"dirs": [get_results_dir_from_job_data(job.data) for job in _jobs(invocation_id).values()]}


def _progress(value: Any) -> int | None:
    """NEL reports progress as an int (SLURM), {"progress": int} (local) or "unknown"."""
    if isinstance(value, dict):
        value = value.get("progress")
    return value if isinstance(value, int) else None


def op_status(invocation_id: str) -> dict[str, Any]:
    from nemo_evaluator_launcher.api.functional import get_status

    rows = get_status([invocation_id])
    return {"jobs": [{"job_id": row.get("job_id"), "status": row.get("status"), "progress": _progress(row.get("progress")),
                      "error": (row.get("data") or {}).get("error") if row.get("status") == "error" else None}
                     for row in rows]}


def op_kill(invocation_id: str) -> dict[str, Any]:
    from nemo_evaluator_launcher.api.functional import kill_job_or_invocation

    rows = kill_job_or_invocation(invocation_id)
    return {"jobs": [{"job_id": row.get("job_id"), "status": row.get("status"),
                      "error": (row.get("data") or {}).get("error")} for row in rows]}


def op_resume(invocation_id: str) -> dict[str, Any]:
    from nemo_evaluator_launcher.api.functional import resume_eval

    return {"invocation_id": resume_eval(invocation_id)}


OPS = {"hash": op_hash, "resolved": op_resolved,
       "run": op_run, "jobs": op_jobs, "results_dirs": op_results_dirs, "status": op_status, "kill": op_kill, "resume": op_resume}


def main() -> None:
    from quanteval.engines.rendering import secrets_private_from_creation
    from quanteval.stdio_guard import stdout_to_stderr

    with stdout_to_stderr() as real_stdout, secrets_private_from_creation():
        request = json.loads(sys.argv[1] if len(sys.argv) > 1 else sys.stdin.read())  # argv: in a warm process
        try:
            answer = {"ok": True, **OPS[request["op"]](**request["args"])}
        except Exception as exc:  # noqa: BLE001 - every NEL failure becomes a message for the person
            answer = {"ok": False, "error": error_message(exc)}
        os.write(real_stdout, (json.dumps(answer, default=str) + "\n").encode())


if __name__ == "__main__":
    main()
