"""Deployments on the real local SLURM cluster (sshd + slurmctld/slurmd on 127.0.0.1).

launch_deployment submits an sbatch job over SSH; the job runs the stand-in server on the node
(this machine), and deployment_status probes it from the login host with curl, as it would on a
real cluster where the compute node is only reachable from the login node.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import sys
import time

import pytest
from processes import still_running, wait_until
from tiers import REPO

from quanteval import ledger
from quanteval.localproc import free_port
from quanteval.models import ToolError
from quanteval.serving.deploy import (
    DeploymentStatusInput,
    LaunchDeploymentInput,
    PlanDeploymentInput,
    StopDeploymentInput,
    deployment_status,
    launch_deployment,
    plan_deployment,
    stop_deployment,
)

STANDIN = REPO / "tests" / "standins" / "fake_inference_server.py"
CHECKPOINT = REPO / "examples" / "checkpoints" / "llama-tiny-fp8"


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def launch(slurm_cluster, monkeypatch, *fake_options: str):
    monkeypatch.setenv("QUANTEVAL_SGLANG_LAUNCHER", shlex.join([sys.executable, str(STANDIN), *fake_options]))
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(CHECKPOINT), port=free_port(), check_args=False))
    return launch_deployment(LaunchDeploymentInput(
        plan=plan, host=slurm_cluster.ssh_alias, gpus_per_node=0, time_limit="00:10:00",
        remote_workdir=str(slurm_cluster.workdir / "deployments"),
    ))


def test_slurm_deployment_serves_then_scancel_stops_it(slurm_cluster, monkeypatch):
    # ~1.5 MB of log: the probe's sections must survive the SSH output cap
    result = launch(slurm_cluster, monkeypatch, "--fake-load-s", "1", "--fake-workers", "1", "--fake-log-lines", "15000")
    assert result.job_id and result.job_id.isdigit()
    record = ledger.get(result.record_id)
    assert record.executor == "slurm" and record.host == slurm_cluster.ssh_alias
    script = (slurm_cluster.workdir / "deployments" / result.record_id / "job.sbatch").read_text()
    assert "--host 0.0.0.0" in script and f"--port {result.port}" in script and "--gpus-per-node" not in script

    try:
        status = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=60))
        assert status.status == "ready", (status.message, status.process, status.log_tail)
        assert status.process == f"SLURM job {result.job_id}: RUNNING"
        assert status.served_models == ["llama-tiny-fp8"] and status.chat_reply and status.chat_latency_s is not None
        assert status.endpoint_url == f"http://localhost:{result.port}/v1/chat/completions"
        assert status.config_values["target.api_endpoint.model_id"] == "llama-tiny-fp8"
        assert port_open(result.port)
        # the log's end, once SLURM's output forwarding caught up with the server (under load it lags the server's own
        # writes: the first probe's tail ended 310 lines before the ready line)
        def tail_at_the_end() -> bool:
            last = deployment_status(DeploymentStatusInput(record_id=result.record_id)).log_tail[-1]
            return last.startswith("INFO:") or "ready to roll" in last
        wait_until(tail_at_the_end, 60, "the log's tail to reach the server's ready line")
    finally:
        stopped = stop_deployment(StopDeploymentInput(record_id=result.record_id, grace_s=20))
    assert stopped.stopped and stopped.how == f"scancel {result.job_id}"
    assert slurm_cluster.run(f"squeue -h -j {result.job_id}").stdout.strip() == ""
    deadline = time.monotonic() + 10
    while port_open(result.port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not port_open(result.port), "the server outlived scancel"
    log = (slurm_cluster.workdir / "deployments" / result.record_id / "server.log").read_text()
    workers = json.loads(re.search(r"worker pids: (\[.*\])", log).group(1))
    assert workers

    deadline = time.monotonic() + 15  # slurmd kills the job's remaining processes right after the batch step ends
    while any(still_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(still_running(pid) for pid in workers), "a server worker outlived scancel"
    assert deployment_status(DeploymentStatusInput(record_id=result.record_id)).status == "stopped"


def test_slurm_deployment_crash_is_reported_with_the_fix(slurm_cluster, monkeypatch):
    result = launch(slurm_cluster, monkeypatch, "--fake-mode", "oom", "--fake-load-s", "0.2")
    try:
        status = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=60))
    finally:
        stop_deployment(StopDeploymentInput(record_id=result.record_id, grace_s=5))
    assert status.status == "failed", (status.message, status.process, status.log_tail)
    assert "--mem-fraction-static" in status.failures[0].fix


def test_sbatch_rejection_is_a_clear_error(slurm_cluster, monkeypatch):
    monkeypatch.setenv("QUANTEVAL_SGLANG_LAUNCHER", shlex.join([sys.executable, str(STANDIN)]))
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(CHECKPOINT), check_args=False))
    # the login rc's banner (stderr, before sbatch's own lines) is left out of the reason
    with pytest.raises(ToolError, match=r"sbatch on quanteval-test-cluster failed: sbatch: error: invalid partition"):
        launch_deployment(LaunchDeploymentInput(
            plan=plan, host=slurm_cluster.ssh_alias, partition="no-such-partition", gpus_per_node=0,
            remote_workdir=str(slurm_cluster.workdir / "deployments"),
        ))
    assert ledger.find(kind="deployment")[0].status == "failed"
