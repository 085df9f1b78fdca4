"""Deployments on this machine: the server is a local job (clusters/executor.LocalExecutor: its own process group,
its log and exit code under the state directory, deployments/<record id>/). The ledger records them as executor
"local"."""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from pathlib import Path
from typing import Any

from quanteval import ledger, paths
from quanteval.clusters.executor import LOCAL, LocalJob
from quanteval.localproc import free_port, group_rss_bytes, interrupts_held, port_free
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

NAME = LOCAL.name
LOG_SCAN_BYTES = 512 * 1024
JOB = "deploy"  # the server's local job (`quanteval-deploy` in ps)
LOG_NAME, EXIT_NAME = "server.log", "exit_code"

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
    job: LocalJob | None = None
    try:
        run_dir = paths.make_dir(paths.call_state_dir() / "deployments" / record.id)
        # A launcher that cannot start shows up as exit code 127 with the shell's message in the log.
        job = LOCAL.start(JOB, argv, run_dir, {**os.environ, **plan.env}, log_name=LOG_NAME, exit_name=EXIT_NAME)
        endpoint = f"http://127.0.0.1:{port}/v1/chat/completions"
        ledger.update(record.id, status="loading", details={
            "pid": job.pgid, "pgid": job.pgid, "port": port, "log_path": job.log_path,
            "exit_code_path": job.exit_file, "endpoint_url": endpoint, "argv": argv, "started_at": time.time(),
            "startup_timeout_s": request.startup_timeout_s, "owner_pid": job.owner_pid,
        })
    except BaseException as exc:  # interrupted or failed between the record and its process: neither is left behind
        interrupted = not isinstance(exc, Exception)
        with interrupts_held(), contextlib.suppress(ToolError):
            if job is not None:
                LOCAL.cancel([job], grace_s=5)
            ledger.update(record.id, status="cancelled" if interrupted else "failed",
                          message=f"launch {'interrupted' if interrupted else f'failed: {exc}'}"[:300])
        raise
    return LaunchDeploymentResult(
        record_id=record.id, host=None, status="loading", port=port, endpoint_url=endpoint,
        served_model_name=plan.served_model_name, command=shlex.join(argv), log_path=job.log_path, pid=job.pgid, notes=notes,
    )


def observe(record: ledger.Record, chat: bool) -> Observation:
    details = record.details
    running, code = _process(details)
    process = "running" if running else f"exited with code {code}" if code is not None else "exited"
    probe = _probe(f"http://127.0.0.1:{details['port']}", details["served_model_name"], chat) if running else Probe()
    return Observation(process=process, running=running, probe=probe, log_text=_read_log_tail(Path(details["log_path"])),
                       endpoint=details["endpoint_url"], exit_code=code, owner_ended=LOCAL.owner_ended(_job(details)))


def stop(record: ledger.Record, grace_s: float) -> tuple[bool, str, list[int]]:
    return LOCAL.stop(_job(record.details), grace_s)


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


def _job(details: dict[str, Any]) -> LocalJob:
    """The server as LocalExecutor finds it again, from its record."""
    return LocalJob(job_id=JOB, pgid=details["pgid"], directory=str(Path(details["log_path"]).parent),
                    exit_file=details["exit_code_path"], log_path=details["log_path"], owner_pid=details.get("owner_pid", 0))


def _process(details: dict[str, Any]) -> tuple[bool, int | None]:
    """(running: anything of its group alive, vLLM's engine processes included; the exit code when written)."""
    job = _job(details)
    return LOCAL.running(job), LOCAL.written_code(job)
