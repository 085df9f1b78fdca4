"""Faults against the real servers (each test in its tier and lane, tests/tiers.py):

- Ctrl-C / SIGTERM to a real `quanteval evaluate` while the server is still starting (SIGTERM: the real vLLM CPU
  build; Ctrl-C: a stand-in with child processes): no server process is left, and the record says cancelled.
- Two real `quanteval evaluate` calls on one output directory: the second is refused, naming the first.
- SSH reads its config and known_hosts from the one home OpenSSH reads (the passwd home), against the real sshd.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from processes import own_state_dir, running_with
from tiers import BENCH, CHECKPOINTS, REPO, VENV_BIN, requires, user_env

from quanteval import ledger
from quanteval.localproc import group_members
from quanteval.serving.deploy import DeploymentStatusInput, deployment_status
from quanteval.workflow.evaluate import LOCK_NAME

BF16, W8A8 = CHECKPOINTS / "tiny-add-bf16", CHECKPOINTS / "tiny-add-w8a8"


STANDIN = REPO / "tests" / "standins" / "fake_inference_server.py"
# A stand-in that loads for two minutes with two child processes (as vLLM's engine core and worker): the signal path
# is the same; the real vLLM's own process tree is the sigterm case's.
LOADING_STANDIN = shlex.join([sys.executable, str(STANDIN), "--fake-load-s", "120", "--fake-workers", "2"])


@pytest.mark.parametrize(("signum", "launcher"), [
    pytest.param(signal.SIGINT, LOADING_STANDIN, id="ctrl-c", marks=requires("nel-next", "slow")),
    pytest.param(signal.SIGTERM, None, id="sigterm", marks=requires("vllm", "nel-next")),
])
def test_an_interrupt_while_vllm_starts_leaves_no_server_and_a_cancelled_record(tmp_path, signum, launcher):
    """With the stand-in, vLLM's own check of the plans is made slow (its Python waits SLOW_CHECK_S before starting), as
    on a loaded machine (a full test run saw minutes): the interrupted call ends without waiting for it."""
    env = user_env(PYTHONFAULTHANDLER="1", **({"QUANTEVAL_VLLM_LAUNCHER": launcher,
                                               "QUANTEVAL_VLLM_VENV": str(slow_vllm_venv(tmp_path))} if launcher else {}))
    argv = [str(VENV_BIN / "quanteval"), "evaluate", str(BF16), str(W8A8), "--benchmarks", str(BENCH),
            "--output-dir", str(tmp_path / "out")]
    # as from a terminal, where Ctrl-C reaches the foreground command: a suite started in the background (`cmd &`)
    # passes SIGINT on ignored, and Python then installs no KeyboardInterrupt handler (a full run timed out on it)
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not ledger.find(kind="deployment") and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)  # plan_deployment runs vLLM's own parser first (~10 s), then the server starts
        time.sleep(8)  # well inside its ~50 s start: the engine is loading, /health does not answer yet
        (deployment,) = ledger.find(kind="deployment")
        assert deployment.status == "loading" and group_members(deployment.details["pgid"])
        assert serving_bf16()
        ignored = _ignored_signals(child.pid)
        child.send_signal(signum)
        signalled = time.monotonic()
        try:
            _, stderr = child.communicate(timeout=240)  # it stops the server first: slower on a loaded machine
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: its threads' stacks on stderr
            raise AssertionError(f"no exit 240 s after the signal; ignored: {ignored}; {child.communicate(timeout=30)[1][-6000:]}") from None
        if launcher:
            assert time.monotonic() - signalled < SLOW_CHECK_S / 2, "the interrupted call waited for vLLM's plan check"
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        for record in ledger.find(kind="deployment"):  # what a failing run left behind, stopped for the next test
            if record.details.get("pgid") and group_members(record.details["pgid"]):
                os.killpg(record.details["pgid"], signal.SIGKILL)
    assert child.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    assert serving_bf16() == []
    (deployment,) = ledger.find(kind="deployment")
    assert deployment.status == "cancelled", [e.status for e in ledger.events(deployment.id)]
    assert group_members(deployment.details["pgid"]) == []
    later = deployment_status(DeploymentStatusInput(record_id=deployment.id))  # a later poll keeps what happened
    assert later.status == "stopped" and "Cancelled" in later.message
    assert ledger.get(deployment.id).status == "cancelled"
    assert ledger.find(kind="canary") == []  # nothing was launched against a server that never came up


SLOW_CHECK_S = 120


def _ignored_signals(pid: int) -> list[str]:
    """The signals a process ignores (SigIgn in /proc: what it inherited as SIG_IGN stays so, and Python then installs
    no KeyboardInterrupt handler)."""
    mask = next(int(line.split()[1], 16) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("SigIgn:"))
    return [sig.name for sig in signal.Signals if mask >> (sig.value - 1) & 1]


def slow_vllm_venv(tmp_path: Path) -> Path:
    """The vLLM venv, but its Python starts SLOW_CHECK_S late."""
    real = Path(os.environ.get("QUANTEVAL_VLLM_VENV") or REPO / ".venv-vllm")
    venv = tmp_path / "slow-vllm-venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "lib").symlink_to(real / "lib")  # its version is read from the installed metadata
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\nsleep {SLOW_CHECK_S}\nexec {shlex.quote(str(real / 'bin' / 'python'))} \"$@\"\n")
    python.chmod(0o755)
    return venv


def serving_bf16() -> list[str]:
    """The server (vLLM or the stand-in) this test's evaluate started for the baseline."""
    return running_with("--model", str(BF16), state_dir=own_state_dir())


@requires("nel-next", "slow")
def test_two_evaluate_calls_on_one_output_dir_the_second_is_refused_and_the_first_unharmed(tmp_path):
    """Two real `quanteval evaluate` processes at once (a stand-in answers for vLLM: serving is not the subject)."""
    env = user_env(QUANTEVAL_VLLM_LAUNCHER=shlex.join([sys.executable, str(STANDIN), "--fake-load-s", "0.2", "--fake-answers", "sum"]))
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_NAME).write_text("pid 999999, since yesterday")  # left by a call that was killed: not in the way
    argv = [str(VENV_BIN / "quanteval"), "evaluate", str(BF16), str(W8A8), "--benchmarks", str(BENCH), "--output-dir", str(out),
            "--canary-problems", "5", "--max-problems", "20", "--max-drop", "5", "--json"]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not ledger.find(kind="deployment") and time.monotonic() < deadline:
            time.sleep(0.2)
        second = subprocess.run([*argv[:-1], "--max-problems", "30"], capture_output=True, text=True, env=env, timeout=120)
        assert second.returncode == 1, second.stderr[-2000:]
        assert f"{out} is in use by another evaluate_quantization (pid {first.pid}" in second.stderr
        stdout, stderr = first.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            first.kill()
    assert first.returncode == 0, stderr[-2000:]
    result = json.loads(stdout)
    assert not result["baseline"]["reused"] and not result["candidate"]["reused"]
    assert len(ledger.find(kind="deployment")) == 2 and len(ledger.find(kind="full_run")) == 2  # one call's, not two
    config = Path(result["candidate"]["config_path"]).read_text()
    assert "max_problems: 20" in config and "max_problems: 30" not in config
    again = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)  # the lock went with the first call
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["baseline"]["reused"]
    assert running_with(str(STANDIN), state_dir=own_state_dir()) == []


def test_ssh_reads_its_config_and_known_hosts_from_the_home_openssh_reads(slurm_cluster, tmp_path):
    """$HOME set elsewhere: OpenSSH reads ~/.ssh/config and known_hosts of the passwd home (ssh -G shows it), and so
    does quanteval, for both files: a host of that config, its key trusted there, is accepted; a host only in
    $HOME/.ssh/config is as unknown to quanteval as to ssh. The passwd home is a fresh directory, given to root
    inside a mount namespace of this test alone (its own /etc/passwd), so the machine's /root is never touched."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a passwd home of the test's own")
    passwd_home, elsewhere = tmp_path / "passwd-home", tmp_path / "elsewhere"
    for home, alias in ((passwd_home, "qe-passwd-home"), (elsewhere, "qe-dollar-home")):
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "config").write_text(
            f"Host {alias}\n  HostName 127.0.0.1\n  Port {slurm_cluster.port}\n  User {slurm_cluster.user}\n"
            f"  IdentityFile {slurm_cluster.key_path}\n  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n"
            "  ConnectTimeout 10\n  LogLevel ERROR\n")
        (home / ".ssh" / "known_hosts").write_text(slurm_cluster.known_hosts.read_text())
    fake_passwd = tmp_path / "passwd"
    fake_passwd.write_text("".join(
        ":".join([*fields[:5], str(passwd_home), *fields[6:]]) + "\n" if fields[2] == "0" else line + "\n"
        for line in Path("/etc/passwd").read_text().splitlines() if (fields := line.split(":"))))
    env = {key: value for key, value in os.environ.items() if key not in ("QUANTEVAL_SSH_CONFIG", "SSH_AUTH_SOCK")}
    env.update(HOME=str(elsewhere), PATH=f"{VENV_BIN}{os.pathsep}/usr/bin{os.pathsep}/bin")  # the real ssh, no wrapper

    def with_passwd_home(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               'mount --bind "$0" /etc/passwd && exec "$@"', str(fake_passwd), *argv],
                              capture_output=True, text=True, env=env, timeout=120)

    resolved = with_passwd_home("/usr/bin/ssh", "-G", "qe-passwd-home")
    assert f"userknownhostsfile {passwd_home}/.ssh/known_hosts" in resolved.stdout, resolved.stderr
    assert "port 22\n" in with_passwd_home("/usr/bin/ssh", "-G", "qe-dollar-home").stdout  # $HOME's config: unread
    assert with_passwd_home("/usr/bin/ssh", "-o", "BatchMode=yes", "qe-passwd-home", "true").returncode == 0

    checked = with_passwd_home(str(VENV_BIN / "quanteval"), "call", "ssh_check", "--json", '{"host": "qe-passwd-home"}')
    assert checked.returncode == 0, checked.stderr
    result = json.loads(checked.stdout)
    assert result["known_hosts_file"] == f"{passwd_home}/.ssh/known_hosts" and result["host_key_added"] is False
    refused = with_passwd_home(str(VENV_BIN / "quanteval"), "call", "ssh_check", "--json", '{"host": "qe-dollar-home"}')
    assert refused.returncode == 1 and "qe-dollar-home" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
