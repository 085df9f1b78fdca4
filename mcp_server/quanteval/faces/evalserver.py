"""The eval server for training loops: NeMo-Skills benchmarks behind slime's eval-delegate API.

This module holds the three tools (start_eval_server, eval_server_status, stop_eval_server) and the
one list of serve-eval options (`ServerSettings` in evalserver/backend.py, from which the CLI's flags are made). The
server itself is split: the HTTP layer (faces/evalhttp), and the package quanteval/evalserver: the job queue (jobs),
what the queue and its backends share (backend), one module per backend (nemo_skills: `ns eval`; nel: NEL's
nemo_skills tasks) and whether a recorded server still runs (liveness, which list_runs asks too).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from quanteval import ledger
from quanteval.envvars import state_dir
from quanteval.evalserver import liveness
from quanteval.evalserver.backend import ServerSettings, tail_lines
from quanteval.faces.evalhttp import is_loopback, required_token, serve
from quanteval.localproc import adopt, port_free, stop_group
from quanteval.models import StrictModel, ToolError

__all__ = ["ServerSettings", "eval_server_status", "option_argv", "serve", "start_eval_server", "stop_eval_server"]


def option_argv(settings: ServerSettings) -> list[str]:
    """`quanteval serve-eval` flags for these settings: every option, so nothing set here is lost on the way."""
    argv: list[str] = []
    for name, field in ServerSettings.model_fields.items():
        value = getattr(settings, name)
        flag = ServerSettings.cli_flag(name)
        if field.annotation is bool:
            if value:
                argv.append(flag)
        elif value is not None:
            argv += [flag, str(value)]
    return argv


class StartEvalServerInput(ServerSettings):
    """serve-eval's options, all of them (see ServerSettings)."""


class EvalServerInfo(BaseModel):
    record_id: str = Field(description="Ledger id; pass it to eval_server_status / stop_eval_server.")
    url: str
    pid: int
    log_path: str
    output_root: str
    backend: str
    auth: str = Field(description="'bearer token from $NAME' when clients must send one, else 'none (loopback)'.")
    status: str = Field(description="running, stopped or exited")
    health: dict[str, Any] | None = Field(None, description="The server's /health answer when it is up (ready or not).")


class EvalServerIdInput(StrictModel):
    record_id: str = Field(description="The record_id start_eval_server returned.")


def _health(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """/health's JSON, also when it answers 503 (not ready, stopping); None when nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            return json.loads(exc.read())
        except (json.JSONDecodeError, OSError):
            return None
    except (urllib.error.URLError, OSError, json.JSONDecodeError):
        return None


def start_eval_server(request: StartEvalServerInput) -> EvalServerInfo:
    """Use when an RL training loop should delegate periodic evaluations: starts the eval server (slime's eval-
    delegate API) in the background with any serve-eval option and waits for /health. Beyond loopback
    (bind_host 0.0.0.0) it needs a bearer token in the env var token_env.
    """
    settings = ServerSettings.model_validate(request.model_dump())
    token = required_token(settings)  # refuse early, with the fix, rather than let the child die
    if not port_free(settings.port, settings.bind_host if is_loopback(settings.bind_host) else "0.0.0.0"):
        raise ToolError(f"port {settings.port} on {settings.bind_host} is in use; pick another port")
    output_root = Path(settings.output_root or state_dir() / "eval-server" / str(settings.port)).expanduser().resolve()
    output_root.mkdir(parents=True, exist_ok=True)
    settings.output_root = output_root
    log_path = output_root / "server.log"
    argv = [sys.executable, "-m", "quanteval.faces.cli", "serve-eval", *option_argv(settings)]
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    adopt(proc)
    host = "127.0.0.1" if settings.bind_host in ("0.0.0.0", "::") else settings.bind_host  # a wildcard: ask loopback
    url = f"http://{host}:{settings.port}"
    deadline = time.monotonic() + 30
    health = None
    while time.monotonic() < deadline and health is None:
        if proc.poll() is not None:
            tail = "\n".join(tail_lines(log_path, 10))
            raise ToolError(f"the eval server exited with code {proc.returncode} at start; {log_path} ends with:\n{tail}")
        time.sleep(0.2)
        health = _health(url, timeout=1)
    if health is None:
        stop_group(proc.pid, grace_s=10, on_wait=proc.poll)
        raise ToolError(f"the eval server did not answer {url}/health within 30 s; see {log_path}")
    auth = f"bearer token from ${settings.token_env}" if token else "none (loopback)"
    record = ledger.add(
        liveness.KIND, status="running", executor=settings.backend,  # host: None, it runs on this machine
        details={"pid": proc.pid, "url": url, "log_path": str(log_path), "output_root": str(output_root), "auth": auth,
                 "bind_host": settings.bind_host},
    )
    return EvalServerInfo(record_id=record.id, url=url, pid=proc.pid, log_path=str(log_path), output_root=str(output_root),
                          backend=settings.backend, auth=auth, status="running", health=health)


def _server_record(record_id: str) -> ledger.Record:
    record = ledger.get(record_id)
    if record.kind != liveness.KIND:
        raise ToolError(f"'{record_id}' is a {record.kind} record, not an eval server")
    return record


def _info(record: ledger.Record, status: str, health: dict[str, Any] | None) -> EvalServerInfo:
    d = record.details
    return EvalServerInfo(record_id=record.id, url=d["url"], pid=d["pid"], log_path=d["log_path"],
                          output_root=d["output_root"], backend=record.executor or "",
                          auth=d.get("auth", "none (loopback)"), status=status, health=health)


def eval_server_status(request: EvalServerIdInput) -> EvalServerInfo:
    """Use to check an eval server from start_eval_server: running or not, and its /health answer (backend
    readiness, ns version, queued/running/finished counts).
    """
    record = _server_record(request.record_id)
    if record.status == "stopped":
        return _info(record, "stopped", None)
    record = liveness.settle(record)
    health = _health(record.details["url"]) if record.status == "running" else None
    return _info(record, record.status, health)


def stop_eval_server(request: EvalServerIdInput) -> EvalServerInfo:
    """Use when the training run no longer needs evaluations: stops an eval server, cancelling its evaluations
    (waiting clients get 503; SIGTERM, then SIGKILL after 40 s).
    """
    record = _server_record(request.record_id)
    stop_group(record.details["pid"], grace_s=40, on_wait=lambda: liveness.running(record.details["pid"]))
    record = ledger.update(record.id, status="stopped", message="stopped by stop_eval_server")
    return _info(record, "stopped", None)
