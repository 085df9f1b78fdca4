"""Deployments on a SLURM cluster: the server is a one-node batch job submitted over SSH (clusters.slurm), its job
script, log and endpoint_host file in a directory of its own on the login host. The ledger records them as executor
"slurm", whose SlurmExecutor watches and stops the job as it does a run's; the login node reaches the server on its
compute node (curl over SSH), this machine may not."""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import time

from quanteval import ledger
from quanteval.clusters import slurm
from quanteval.clusters.executor import ACTIVE, SLURM, ClusterJob, Unreachable
from quanteval.clusters.ssh import run_remote, ssh_user
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

NAME = SLURM.name
# Over SSH the probe's output is capped (ssh.OUTPUT_LIMIT keeps the tail): the log part stays well
# below it so the probe sections before it are never cut off.
REMOTE_LOG_SCAN_BYTES = 128 * 1024


def launch(plan: DeploymentPlan, request: LaunchDeploymentInput) -> LaunchDeploymentResult:
    _check_scriptable(plan)
    port = request.port or plan.port
    record = ledger.add("deployment", status="submitting", executor=NAME, host=request.host, config_path=plan.checkpoint,
                        details={"framework": plan.framework, "served_model_name": plan.served_model_name,
                                 "serving": plan.serving.model_dump()})
    script = _job_script(plan, request, record.id, port)
    try:
        job_id, absolute_dir = slurm.sbatch(request.host or "", f"{request.remote_workdir.rstrip('/')}/{record.id}", script)
    except ToolError as exc:
        ledger.update(record.id, status="failed", message=str(exc)[-500:])
        raise ToolError(f"{exc}. Check partition/account/gpus_per_node against cluster_info.") from None
    ledger.update(record.id, status="loading", details={
        "job_id": job_id, "remote_dir": absolute_dir, "port": port, "log_path": f"{absolute_dir}/server.log",
        "argv": [*plan.launcher, *plan.server_args], "started_at": time.time(), "startup_timeout_s": request.startup_timeout_s,
    })
    return LaunchDeploymentResult(
        record_id=record.id, host=request.host, status="loading", port=port, served_model_name=plan.served_model_name,
        command=f"sbatch {absolute_dir}/job.sbatch", log_path=f"{absolute_dir}/server.log", job_id=job_id,
        notes=[f"SLURM job {job_id} on {request.host}; the endpoint is known once the job runs.",
               f"The node loads {plan.checkpoint}: it must be at that path on the cluster (shared filesystem)."],
    )


def _check_scriptable(plan: DeploymentPlan) -> None:
    """A plan comes from the client: nothing in it may add lines to the job script."""
    unsafe = [item for item in [*plan.launcher, *plan.server_args, *plan.env.values()] if "\n" in item or "\r" in item]
    unsafe += [key for key in plan.env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key)]
    if unsafe:
        raise ToolError(f"plan: {unsafe[0]!r} cannot go into a job script (line break or bad variable name). Remove it from the plan.")


def _job_script(plan: DeploymentPlan, request: LaunchDeploymentInput, deployment_id: str, port: int) -> str:
    server_args = with_option(with_option(plan.server_args, "--host", "0.0.0.0"), "--port", str(port))
    gpus = plan.tensor_parallel_size if request.gpus_per_node is None else request.gpus_per_node
    return slurm.one_node_script(
        f"quanteval-{deployment_id}", request.time_limit, [
            # The login node reaches the server through the node's name; written before the server starts.
            'echo "${SLURMD_NODENAME:-$(hostname)}" > endpoint_host',
            f"exec {shlex.join([*plan.launcher, *server_args])}",
        ], output="server.log", gpus_per_node=gpus, partition=request.partition, account=request.account, env=plan.env)


_REMOTE_PROBE = """
cd {dir} 2>/dev/null || exit 3
echo @@host; cat endpoint_host 2>/dev/null
h=$(cat endpoint_host 2>/dev/null)
echo @@health
if [ -n "$h" ]; then code=$(curl -s --noproxy '*' -o /dev/null -w '%{{http_code}}' -m 3 http://$h:{port}/health); echo "$code"; fi
echo @@models
if [ "$code" = 200 ]; then curl -s --noproxy '*' -m 5 http://$h:{port}/v1/models; fi
echo; echo @@chat
if [ "$code" = 200 ] && [ {chat} = 1 ]; then
  curl -s --noproxy '*' -m 60 -w '\\n%{{http_code}} %{{time_total}}' -H 'Content-Type: application/json' -d {body} http://$h:{port}/v1/chat/completions
fi
echo; echo @@log; tail -c {scan} server.log 2>/dev/null
"""


def _job(record: ledger.Record) -> ClusterJob:
    """The server's job as SlurmExecutor finds it again, from its record: a lone job, no chain."""
    host = record.host or ""
    return ClusterJob(job_id=record.id, hostname=host, username=ssh_user(host), remote_dir=record.details["remote_dir"],
                      slurm_job_id=record.details["job_id"])


def observe(record: ledger.Record, chat: bool) -> Observation:
    """The job's state, then one round trip on the login node: the node's name, /health, /v1/models, a test chat
    completion and the log's tail."""
    details, job = record.details, _job(record)
    script = _REMOTE_PROBE.format(dir=shlex.quote(details["remote_dir"]), port=details["port"], chat=int(chat),
                                  body=shlex.quote(json.dumps(chat_body(details["served_model_name"]))),
                                  scan=REMOTE_LOG_SCAN_BYTES)
    try:
        [status] = SLURM.states([job])
    except Unreachable as exc:
        raise ToolError(str(exc)) from None
    result = run_remote(job.login, script, timeout=120)  # the login node's own curl, over the executor's connection
    if result.exit_code == 3:
        raise ToolError(f"{record.host}:{details['remote_dir']}: deployment directory is gone.")
    sections = _sections(result.stdout)
    node = sections.get("host") or None
    known = status.status != "unknown"
    return Observation(
        process=f"SLURM job {details['job_id']}: {status.slurm_state if known else 'no longer in the queue'}",
        running=status.status in ACTIVE, probe=_read_probe(sections), log_text=sections.get("log", ""),
        endpoint=f"http://{node}:{details['port']}/v1/chat/completions" if node else None,
    )


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^@@(\w+)\n?", text, flags=re.M)
    return {parts[i]: parts[i + 1].strip() for i in range(1, len(parts) - 1, 2)}


def _read_probe(out: dict[str, str]) -> Probe:
    probe = Probe()
    if out.get("health", "").isdigit():
        probe.health = int(out["health"]) or None
    if out.get("models"):
        with contextlib.suppress(ValueError, AttributeError):
            read_models(probe, json.loads(out["models"]))
    if out.get("chat"):
        body, _, tail = out["chat"].rpartition("\n")
        status_code, _, seconds = tail.partition(" ")
        probe.chat_latency_s = round(float(seconds), 3) if seconds else None
        read_chat(probe, int(status_code) if status_code.isdigit() else 0, body)
    return probe


def stop(record: ledger.Record, grace_s: float) -> tuple[bool, str, list[int]]:
    try:
        return SLURM.stop(_job(record), grace_s)
    except Unreachable as exc:
        raise ToolError(str(exc)) from None


def memory_bytes(record: ledger.Record) -> int | None:
    return None  # the server holds a cluster node's memory, not this machine's


def gone(record: ledger.Record) -> bool:
    return False  # only the cluster knows (squeue over ssh): deployment_status asks it
