"""Deployments on this machine: the server runs in its own process group, its log and exit code under the state
directory (deployments/<record id>/). The ledger records them as executor "local"."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from quanteval import ledger, paths
from quanteval.localproc import (
    adopt,
    exit_code_wrapper,
    free_port,
    group_members,
    group_rss_bytes,
    interrupts_held,
    port_free,
    reap,
    stop_group,
)
from quanteval.models import ToolError
from quanteval.serving.deployment import (
    DeploymentPlan,
    LaunchDeploymentInput,
    LaunchDeploymentResult,
    Observation,
    Probe,
    chat_body,
    read_chat,
    read_models,
    with_option,
)

NAME = "local"
LOG_SCAN_BYTES = 512 * 1024

def launch(plan: DeploymentPlan, request: LaunchDeploymentInput) -> LaunchDeploymentResult:
    notes: list[str] = []
    port = request.port or plan.port
    if not port_free(port):
        if request.port:
            raise ToolError(f"port: {port} is already in use on 127.0.0.1. Stop what uses it, or leave port unset to get a free one.")
        port = free_port()
        notes.append(f"Port {plan.port} was busy; using free port {port}.")
    server_args = with_option(with_option(plan.server_args, "--host", "127.0.0.1"), "--port", str(port))
    argv = [*plan.launcher, *server_args]
    record = ledger.add("deployment", status="starting", executor=NAME, config_path=plan.checkpoint,
                        details={"framework": plan.framework, "served_model_name": plan.served_model_name,
                                 "serving": plan.serving.model_dump()})
    child: subprocess.Popen[bytes] | None = None
    try:
        run_dir = paths.call_state_dir() / "deployments" / record.id
        run_dir.mkdir(parents=True, exist_ok=True)
        log_path, rc_path = run_dir / "server.log", run_dir / "exit_code"
        wrapper = exit_code_wrapper("quanteval-deploy", rc_path, argv)
        # A launcher that cannot start shows up as exit code 127 with the shell's message in the log.
        with open(log_path, "ab") as log_file:
            child = subprocess.Popen(
                wrapper, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=run_dir, env={**os.environ, **plan.env}, start_new_session=True,
            )
        adopt(child)
        endpoint = f"http://127.0.0.1:{port}/v1/chat/completions"
        ledger.update(record.id, status="loading", details={
            "pid": child.pid, "pgid": child.pid, "port": port, "log_path": str(log_path),
            "exit_code_path": str(rc_path), "endpoint_url": endpoint, "argv": argv, "started_at": time.time(),
            "startup_timeout_s": request.startup_timeout_s,
        })
    except BaseException as exc:  # interrupted or failed between the record and its process: neither is left behind
        interrupted = not isinstance(exc, Exception)
        with interrupts_held(), contextlib.suppress(ToolError):
            if child is not None:
                stop_group(child.pid, 5, on_wait=child.poll)
            ledger.update(record.id, status="cancelled" if interrupted else "failed",
                          message=f"launch {'interrupted' if interrupted else f'failed: {exc}'}"[:300])
        raise
    return LaunchDeploymentResult(
        record_id=record.id, host=None, status="loading", port=port, endpoint_url=endpoint,
        served_model_name=plan.served_model_name, command=shlex.join(argv), log_path=str(log_path), pid=child.pid, notes=notes,
    )


def observe(record: ledger.Record, chat: bool) -> Observation:
    details = record.details
    running, code = _process(details)
    process = "running" if running else f"exited with code {code}" if code is not None else "exited"
    probe = _probe(f"http://127.0.0.1:{details['port']}", details["served_model_name"], chat) if running else Probe()
    return Observation(process=process, running=running, probe=probe, log_text=_read_log_tail(Path(details["log_path"])),
                       endpoint=details["endpoint_url"], exit_code=code)


def stop(record: ledger.Record, grace_s: float) -> tuple[bool, str, list[int]]:
    details = record.details
    return stop_group(details["pgid"], grace_s, on_wait=lambda: _process(details))  # reaps our own child


def memory_bytes(record: ledger.Record) -> int | None:
    return group_rss_bytes(record.details["pgid"])


def gone(record: ledger.Record) -> bool:
    return "pgid" in record.details and not _process(record.details)[0]


def _probe(base: str, name: str, chat: bool) -> Probe:
    import httpx

    probe = Probe()
    with httpx.Client(trust_env=False) as client:  # loopback: never through a proxy from the environment
        try:
            probe.health = client.get(f"{base}/health", timeout=3).status_code
        except httpx.HTTPError:
            return probe
        if probe.health != 200:
            return probe
        try:
            read_models(probe, client.get(f"{base}/v1/models", timeout=5).json())
            if chat:
                started = time.monotonic()
                reply = client.post(f"{base}/v1/chat/completions", json=chat_body(name), timeout=60)
                probe.chat_latency_s = round(time.monotonic() - started, 3)
                read_chat(probe, reply.status_code, reply.text)
        except (httpx.HTTPError, ValueError) as exc:
            probe.chat_error = str(exc)[:300]
    return probe


def _read_log_tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - LOG_SCAN_BYTES))
            return handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


def _process(details: dict[str, Any]) -> tuple[bool, int | None]:
    """(running, exit code when known)."""
    reap()  # an ended child of ours is no zombie in its group
    running = bool(group_members(details["pgid"]))
    rc_path = Path(details["exit_code_path"])
    code = int(rc_path.read_text().strip() or -1) if rc_path.is_file() else None
    return running, code
