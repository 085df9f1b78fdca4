"""The run lifecycle against a real SLURM cluster on 127.0.0.1, driven through NEL's own SLURM executor.

NEL renders run.sub, opens its ssh ControlMaster, rsyncs the run directory and calls sbatch on the
real queue (fixture `slurm_cluster`: sshd + munge + slurmctld + slurmd). The jobs then fail on the
node — there is no pyxis/enroot to run `srun --container-image` — and that failure has to be
reported as such. Faults are real too: sshd stopped, ssh sessions killed mid-poll, slurmctld
stopped and restarted, a job scancel'ed behind our back, a walltime TIMEOUT with NEL's paired
restart job.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quanteval import ledger, redact
from quanteval.clusters import ssh
from quanteval.engines.base import FINISHED
from quanteval.models import ToolError
from quanteval.workflow import results, runs

PLANTED = "planted-slurm-secret-4c3b2a"
FAULT_SCENARIOS: list[str] = []  # the fault scenarios survived, printed at the end of the module


@pytest.fixture(autouse=True)
def nel_exec_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    exec_db = tmp_path / "nel-exec-db" / "exec.v1.jsonl"
    monkeypatch.setenv("NEMO_EVALUATOR_EXEC_DB_FILE", str(exec_db))
    monkeypatch.setenv("JUDGE_API_KEY", PLANTED)
    return exec_db


@pytest.fixture(scope="module", autouse=True)
def report_fault_scenarios(slurm_cluster) -> Iterator[None]:
    yield
    sys.stderr.write(f"\nSLURM cluster setup {slurm_cluster.setup_seconds:.1f} s; fault scenarios survived "
                     f"({len(FAULT_SCENARIOS)}): {', '.join(FAULT_SCENARIOS)}\n")


def slurm_config(cluster, tmp_path: Path, *, extra_flags: str = "", name: str = "slurm-run.yaml", task_extra: str = "") -> Path:
    path = tmp_path / name
    path.write_text(f"""defaults:
  - execution: slurm/default
  - deployment: none
  - _self_
execution:
  hostname: {cluster.ssh_alias}
  username: {cluster.user}
  account: quanteval-test
  partition: debug
  output_dir: {cluster.jobs_dir / tmp_path.name}
  gres: null
  walltime: "00:05:00"
  sbatch_extra_flags:
    exclusive: false
{extra_flags}target:
  api_endpoint:
    url: http://127.0.0.1:9/v1/chat/completions
    model_id: tiny-model
evaluation:
  env_vars:
    JUDGE_KEY_FOR_TASK: host:JUDGE_API_KEY
  tasks:
    - name: lm-evaluation-harness.ifeval
{task_extra}""")
    return path


def wait_for_status(record_id: str, wanted: tuple[str, ...], timeout: float = 90) -> runs.RunStatusOutput:
    deadline = time.monotonic() + timeout
    while True:
        status = runs.run_status(runs.RunRef(record_id=record_id))
        if status.status in wanted or time.monotonic() > deadline:
            return status
        time.sleep(1)


def sshd_session_pids(listener: int) -> list[int]:
    """sshd's per-connection processes (children of the listener): killing one drops that ssh connection."""
    children = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat_file.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == listener:
            children.append(int(stat_file.parent.name))
    return children


def cut_pooled_connections(cluster) -> None:
    """Kill the sshd sessions behind quanteval's pooled SSH connections (sessions outlive a stopped sshd listener)."""
    for conn in list(ssh._pool.values()):
        transport = conn.client.get_transport()
        if transport is None or not transport.is_active():
            continue
        sock = transport.sock
        while hasattr(sock, "get_transport"):  # through a ProxyJump hop: the hop's own TCP connection carries it
            sock = sock.get_transport().sock
        for pid in cluster.ssh_session_pids(sock.getsockname()[1]):
            os.kill(pid, 9)


def squeue_states(cluster) -> dict[str, str]:
    lines = cluster.run("squeue -h -t all -o '%i|%T'").stdout.split()
    return dict(line.split("|") for line in lines)


def test_canary_on_slurm_fails_without_containers_and_the_gate_holds(slurm_cluster, tmp_path: Path) -> None:
    repeats = "      nemo_evaluator_config:\n        config:\n          params:\n            extra:\n              num_repeats: 4\n"
    config = slurm_config(slurm_cluster, tmp_path, task_extra=repeats)
    canary = runs.launch_canary(runs.LaunchCanaryInput(config_path=str(config), limit_samples=5))
    assert canary.executor == "slurm" and canary.host == slurm_cluster.ssh_alias
    assert canary.notes == ["lm-evaluation-harness.ifeval: the canary runs num_repeats=1 (config: 4); the full run uses 4."]
    (job,) = runs.run_status(runs.RunRef(record_id=canary.record_id)).jobs
    assert job.slurm_job_id in squeue_states(slurm_cluster)  # NEL's sbatch reached the real queue

    finished = wait_for_status(canary.record_id, FINISHED)
    assert finished.status == "failed" and finished.jobs[0].slurm_state == "FAILED"
    history = [event.status for event in finished.history]
    assert history[:2] == ["launching", "submitted"] and history[-1] == "failed"  # recorded, then submitted

    # The rendered run.sub carried the canary's limit; the remote .secrets.env is private.
    remote_dirs = list((slurm_cluster.jobs_dir / tmp_path.name).glob("*/lm-evaluation-harness.ifeval.0"))
    assert len(remote_dirs) == 1
    encoded = re.search(r'echo "([A-Za-z0-9+/=]+)" \| base64 -d > config_ef.yaml', (remote_dirs[0] / "run.sub").read_text())
    rendered = base64.b64decode(encoded.group(1)).decode()
    assert "limit_samples: 5" in rendered and "num_repeats: 1" in rendered  # one repeat in the canary
    secrets_file = remote_dirs[0] / ".secrets.env"
    assert PLANTED in secrets_file.read_text() and secrets_file.stat().st_mode & 0o077 == 0

    # Logs come over ssh: the srun failure is classified with file:line; an OOM line is reported as oom.
    client_log = remote_dirs[0] / "logs" / "client-oom.log"
    client_log.write_text("loading model\nslurmstepd: error: Detected 1 oom_kill event in StepId=7.0\n")
    logs = runs.run_logs(runs.RunLogsInput(record_id=canary.invocation_id, lines=10))
    assert any(tail.file.endswith(f"slurm-{job.slurm_job_id}.log") for tail in logs.tails)
    oom = next(hit for hit in logs.failures if hit.failure_class == "oom")
    assert oom.file == str(client_log) and oom.line == 2
    assert "container" in logs.failure_classes
    # The run failed; the diagnosis is the real srun error, not the script's `+ ...` echoes around it.
    assert logs.diagnosis.failure_class == "container" and "--container-image" in logs.diagnosis.line
    assert logs.diagnosis.file.endswith(f"slurm-{job.slurm_job_id}.log") and "pyxis" in logs.diagnosis.advice
    assert not [hit for hit in logs.failures if hit.text.lstrip().startswith("+")]
    # validate_run on the failed canary (by its record id: NEL's records say host:path) says it failed and why.
    verdict = results.validate_run(results.ValidateRunInput(run=canary.record_id))
    assert verdict.verdict == "fail" and verdict.tasks[0].diagnosis.failure_class == "container"
    assert any("container" in reason and "--container-image" in reason for reason in verdict.reasons)
    assert all(len(line) <= redact.MAX_LINE_CHARS for tail in logs.tails for line in tail.lines)
    assert PLANTED not in logs.model_dump_json()

    # The full run is refused: the only canary of this config failed.
    with pytest.raises(ToolError, match=f"{canary.record_id}: failed"):
        runs.launch_full_run(runs.LaunchFullRunInput(config_path=str(config)))
    # resume_run re-submits NEL's run.sub through NEL: a new SLURM job for the same invocation.
    resumed = runs.resume_run(runs.RunRef(record_id=canary.record_id))
    assert resumed.invocation_id == canary.invocation_id and resumed.status == "submitted"
    (again,) = runs.run_status(runs.RunRef(record_id=canary.record_id)).jobs
    assert again.slurm_job_id != job.slurm_job_id and again.slurm_job_id in squeue_states(slurm_cluster)
    assert wait_for_status(canary.record_id, FINISHED).status == "failed"

    forced = runs.launch_full_run(runs.LaunchFullRunInput(config_path=str(config), force=True,
                                                          reason="container registry down; canary cannot pull"))
    assert forced.config_hash == canary.config_hash  # the canary's limit and one-repeat overrides are not hashed
    forced_dir = next(path for path in (slurm_cluster.jobs_dir / tmp_path.name).glob("*/lm-evaluation-harness.ifeval.0")
                      if path != remote_dirs[0])
    forced_config = re.search(r'echo "([A-Za-z0-9+/=]+)" \| base64 -d > config_ef.yaml', (forced_dir / "run.sub").read_text())
    assert "num_repeats: 4" in base64.b64decode(forced_config.group(1)).decode()  # the full run keeps the config's
    record = ledger.get(forced.record_id)
    assert record.details["reason"] == "container registry down; canary cannot pull" and record.details["forced"]
    assert runs.run_status(runs.RunRef(record_id=forced.record_id)).jobs[0].slurm_job_id in squeue_states(slurm_cluster)


def test_pending_run_survives_ssh_and_controller_faults_and_is_killed(slurm_cluster, tmp_path: Path) -> None:
    # A begin time an hour away keeps the job PENDING for as long as the test needs.
    config = slurm_config(slurm_cluster, tmp_path, extra_flags="    begin: now+1hour\n")
    canary = runs.launch_canary(runs.LaunchCanaryInput(config_path=str(config)))
    assert wait_for_status(canary.record_id, ("pending",)).status == "pending"

    slurm_cluster.stop("sshd")
    cut_pooled_connections(slurm_cluster)
    try:
        down = runs.run_status(runs.RunRef(record_id=canary.record_id))
        assert not down.reachable and down.status == "pending" and "ssh" in down.message
        with pytest.raises(ToolError, match="ssh_check"):
            runs.run_logs(runs.RunLogsInput(record_id=canary.record_id))
        with pytest.raises(ToolError, match="could not stop"):
            runs.kill_run(runs.RunRef(record_id=canary.record_id))
        assert ledger.get(canary.record_id).status == "pending"  # nothing was killed, nothing recorded as killed
    finally:
        slurm_cluster.up()
    assert runs.run_status(runs.RunRef(record_id=canary.record_id)).status == "pending"
    FAULT_SCENARIOS.append("sshd down during a poll")

    stop_killing = threading.Event()

    def kill_ssh_sessions() -> None:
        while not stop_killing.is_set():
            for pid in sshd_session_pids(slurm_cluster.pid("sshd")):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            time.sleep(0.01)

    killer = threading.Thread(target=kill_ssh_sessions)
    killer.start()
    try:
        dropped = runs.run_status(runs.RunRef(record_id=canary.record_id))
    finally:
        stop_killing.set()
        killer.join()
    assert dropped.status == "pending"  # unreachable or answered, never turned into a failure
    assert ledger.get(canary.record_id).status == "pending"
    FAULT_SCENARIOS.append("ssh connection dropped mid-poll")

    slurm_cluster.stop("slurmctld")
    try:
        no_controller = runs.run_status(runs.RunRef(record_id=canary.record_id))
        assert not no_controller.reachable and no_controller.status == "pending"
        assert "controller" in no_controller.message
    finally:
        slurm_cluster.up()
    assert wait_for_status(canary.record_id, ("pending",), timeout=30).status == "pending"
    FAULT_SCENARIOS.append("slurmctld restarted during polling")

    killed = runs.kill_run(runs.RunRef(record_id=canary.record_id))
    assert killed.status == "killed"
    (job,) = runs.run_status(runs.RunRef(record_id=canary.record_id)).jobs
    assert job.status == "killed" and squeue_states(slurm_cluster)[job.slurm_job_id] == "CANCELLED"
    FAULT_SCENARIOS.append("kill of a pending run")


def test_job_cancelled_behind_our_back_is_reported_killed(slurm_cluster, tmp_path: Path) -> None:
    config = slurm_config(slurm_cluster, tmp_path, extra_flags="    begin: now+1hour\n")
    canary = runs.launch_canary(runs.LaunchCanaryInput(config_path=str(config)))
    (job,) = wait_for_status(canary.record_id, ("pending",)).jobs
    assert slurm_cluster.run(f"scancel {job.slurm_job_id}").returncode == 0

    status = wait_for_status(canary.record_id, ("killed",), timeout=30)
    assert status.status == "killed" and "cancelled" in status.jobs[0].note
    assert ledger.get(canary.record_id).status == "killed"
    FAULT_SCENARIOS.append("job scancel'ed behind our back")


def nel_autoresume_handler(task_dir: Path) -> str:
    """NEL's own auto-resume handler text (rendered in a child: importing NEL here would pin its exec-db path)."""
    code = ("import sys; from pathlib import Path; "
            "from nemo_evaluator_launcher.executors.slurm.executor import _generate_autoresume_handler; "
            "print(_generate_autoresume_handler(Path(sys.argv[1]), None))")
    return subprocess.run([sys.executable, "-c", code, str(task_dir)], capture_output=True, text=True,
                          check=True).stdout


def write_exec_db_job(exec_db: Path, invocation: str, data: dict) -> None:
    code = ("import json, sys, time; from nemo_evaluator_launcher.common.execdb import ExecutionDB, JobData; "
            "inv, data = json.loads(sys.argv[1]); "
            "ExecutionDB().write_job(JobData(invocation_id=inv, job_id=inv + '.0', timestamp=time.time(), "
            "executor='slurm', data=data, config={}))")
    subprocess.run([sys.executable, "-c", code, json.dumps([invocation, data])], check=True,
                   env={**os.environ, "NEMO_EVALUATOR_EXEC_DB_FILE": str(exec_db)})


def test_walltime_timeout_with_nels_restart_job_is_a_resume(slurm_cluster, tmp_path: Path, nel_exec_db: Path) -> None:
    """A job built from NEL's own auto-resume handler runs past a one-minute walltime.

    While it runs, NEL's paired restart job waits (afternotok) and must survive every poll; after the
    TIMEOUT the restart job carries the run on, and the status says so instead of failed.
    """
    task_dir = slurm_cluster.jobs_dir / tmp_path.name / "20261121_000000-ab12cd34ef56ab78" / "sleepy.0"
    (task_dir / "logs").mkdir(parents=True)
    script = task_dir / "run.sub"
    # NEL's handler asks `sacct` for the previous job's state; this cluster has no slurmdbd, so the job
    # reads the job-completion record (`sacct -c`) instead — without it NEL's auto-resume cannot work.
    script.write_text("#!/bin/bash\n#SBATCH --time 1\n#SBATCH --no-requeue\n#SBATCH --job-name sleepy\n"
                      f"#SBATCH --output {task_dir}/logs/slurm-%A.log\n"
                      'sacct() { command sacct -c "$@"; }\n'
                      f"{nel_autoresume_handler(task_dir)}\n"
                      f"echo $SLURM_JOB_ID >> {task_dir}/.slurm_job_id.list\nsleep 600\n")
    submitted = slurm_cluster.run(f"sbatch --parsable {script}")
    first = submitted.stdout.strip()
    assert submitted.returncode == 0 and first, submitted.stderr
    write_exec_db_job(nel_exec_db, "ab12cd34ef56ab78", {
        "slurm_job_id": first, "remote_rundir_path": str(task_dir), "hostname": slurm_cluster.ssh_alias,
        "username": slurm_cluster.user, "eval_image": "none"})
    record = ledger.add("full_run", status="submitted", invocation_id="ab12cd34ef56ab78", executor="slurm",
                        host=slurm_cluster.ssh_alias)

    running = wait_for_status(record.id, ("running",), timeout=30)
    assert running.status == "running"
    deadline = time.monotonic() + 20
    while not running.jobs[0].restart_job_id and time.monotonic() < deadline:
        time.sleep(1)
        running = runs.run_status(runs.RunRef(record_id=record.id))
    restart = running.jobs[0].restart_job_id
    assert restart and squeue_states(slurm_cluster)[restart] == "PENDING"

    resumed = wait_for_status(record.id, ("resuming",), timeout=150)
    if resumed.status != "resuming":  # the restart job may already run: the chain moved on
        assert resumed.status == "running" and resumed.jobs[0].current_slurm_job_id
    assert squeue_states(slurm_cluster)[first] == "TIMEOUT"
    assert "failed" not in [event.status for event in ledger.events(record.id)]
    later = wait_for_status(record.id, ("running",), timeout=60)
    # Every job of the chain has the same one-minute walltime, so the chain may have moved on more than once.
    assert later.status == "running" and int(later.jobs[0].current_slurm_job_id) >= int(restart)
    chain = (task_dir / ".slurm_job_id.list").read_text().split()
    assert chain[:2] == [first, restart]
    FAULT_SCENARIOS.append("walltime TIMEOUT followed by NEL's restart job")

    killed = runs.kill_run(runs.RunRef(record_id=record.id))
    assert killed.status == "killed"
    states = squeue_states(slurm_cluster)
    chain_states = {job: state for job, state in states.items() if int(job) > int(first)}
    assert "CANCELLED" in chain_states.values()  # the chain's current job (or its queued restart) was cancelled
    assert not [job for job, state in chain_states.items() if state in ("PENDING", "RUNNING")]


def test_changed_host_key_is_refused_and_status_left_alone(slurm_cluster, tmp_path: Path) -> None:
    config = slurm_config(slurm_cluster, tmp_path, extra_flags="    begin: now+1hour\n")
    canary = runs.launch_canary(runs.LaunchCanaryInput(config_path=str(config)))
    assert wait_for_status(canary.record_id, ("pending",)).status == "pending"

    trusted = slurm_cluster.known_hosts.read_text()
    slurm_cluster.rotate_host_key()
    cut_pooled_connections(slurm_cluster)
    new_key = slurm_cluster.known_hosts.read_text()
    slurm_cluster.known_hosts.write_text(trusted)  # the client still trusts the old key
    try:
        refused = runs.run_status(runs.RunRef(record_id=canary.record_id))
        assert not refused.reachable and refused.status == "pending"
        assert "host key" in refused.message.lower()
        assert ledger.get(canary.record_id).status == "pending"
    finally:
        slurm_cluster.known_hosts.write_text(new_key)
    assert runs.kill_run(runs.RunRef(record_id=canary.record_id)).status == "killed"
    FAULT_SCENARIOS.append("changed host key")
