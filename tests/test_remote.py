"""Remote access against the real sshd + SLURM of the `slurm_cluster` fixture: the tools, their failures, faults."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from infra.slurm_cluster import SlurmCluster, free_port

from quanteval import redact
from quanteval.clusters import slurm, ssh, tools
from quanteval.clusters.ssh import run_remote
from quanteval.clusters.tools import (
    CheckRegistryCredentialsInput,
    RemoteGrepInput,
    SlurmQueueInput,
    SshCheckInput,
    check_registry_credentials,
    remote_grep,
    slurm_queue,
    ssh_check,
)
from quanteval.models import ToolError


def host_fingerprint(cluster: SlurmCluster) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(cluster.host_key_path.with_suffix(".pub"))],
                         capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def write_config(cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alias: str, *,
                 known_hosts: str = "", key: Path | None = None, port: int | None = None, extra: str = "") -> Path:
    """An ssh config of this test's own (own known_hosts), made the one the remote tools read."""
    known = tmp_path / "known_hosts"
    known.write_text(known_hosts)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host {alias}\n  HostName 127.0.0.1\n  Port {port or cluster.port}\n  User root\n"
        f"  IdentityFile {key or cluster.key_path}\n  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n"
        f"  ConnectTimeout 3\n{extra}"
        f"Host {cluster.ssh_alias}\n  HostName 127.0.0.1\n  Port {cluster.port}\n  User root\n"
        f"  IdentityFile {cluster.key_path}\n  IdentitiesOnly yes\n  UserKnownHostsFile {cluster.known_hosts}\n"
    )
    monkeypatch.setenv("QUANTEVAL_SSH_CONFIG", str(config))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return known


# --- ssh_check and connection failures ---------------------------------------------------------------


def test_ssh_check_reports_user_host_commands_and_the_verified_key(slurm_cluster):
    result = ssh_check(SshCheckInput(host=slurm_cluster.ssh_alias))
    assert result.user == "root"
    assert result.hostname == "127.0.0.1" and result.port == slurm_cluster.port
    assert result.commands["sbatch"] and result.commands["squeue"] and result.commands["sacct"]
    assert result.commands["enroot"] is False
    assert result.host_key_fingerprint == host_fingerprint(slurm_cluster)
    assert result.host_key_added is False
    # a round trip in milliseconds (a loaded 2-core machine took 2.3 s once): the field, not the machine's speed
    assert 0 < result.latency_ms < 60_000
    assert any("enroot" in note for note in result.notes)


def test_unknown_host_key_is_refused_with_its_fingerprint_until_trusted(slurm_cluster, tmp_path, monkeypatch):
    known = write_config(slurm_cluster, tmp_path, monkeypatch, "new-cluster")
    with pytest.raises(ToolError) as refused:
        ssh_check(SshCheckInput(host="new-cluster"))
    assert "not in known_hosts" in str(refused.value)
    assert host_fingerprint(slurm_cluster) in str(refused.value)
    assert known.read_text() == ""  # nothing written without consent

    trusted = ssh_check(SshCheckInput(host="new-cluster", trust_host_key=True))
    assert trusted.host_key_added is True
    assert any("written to" in note for note in trusted.notes)
    assert f"[127.0.0.1]:{slurm_cluster.port} ssh-ed25519" in known.read_text()

    again = ssh_check(SshCheckInput(host="new-cluster"))
    assert again.host_key_added is False
    # The entry paramiko wrote is one OpenSSH accepts with strict checking.
    done = subprocess.run(
        ["/usr/bin/ssh", "-F", str(tmp_path / "ssh_config"), "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
         "new-cluster", "true"], capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr


def test_changed_host_key_is_refused_then_replaced_only_when_trusted(slurm_cluster, tmp_path, monkeypatch):
    old_fingerprint = host_fingerprint(slurm_cluster)
    known = write_config(slurm_cluster, tmp_path, monkeypatch, "rekeyed", known_hosts=slurm_cluster.host_key_line())
    assert ssh_check(SshCheckInput(host="rekeyed")).host_key_fingerprint == old_fingerprint

    slurm_cluster.rotate_host_key()  # the server is "reinstalled": sshd restarts with a new key
    new_fingerprint = host_fingerprint(slurm_cluster)
    before = known.read_text()
    with pytest.raises(ToolError) as refused:
        ssh_check(SshCheckInput(host="rekeyed"))
    message = str(refused.value)
    assert "HOST KEY CHANGED" in message and old_fingerprint in message and new_fingerprint in message
    assert known.read_text() == before

    replaced = ssh_check(SshCheckInput(host="rekeyed", trust_host_key=True))
    assert replaced.host_key_added and replaced.host_key_fingerprint == new_fingerprint
    lines = [line for line in known.read_text().splitlines() if line.strip()]
    assert len(lines) == 1 and f"[127.0.0.1]:{slurm_cluster.port}" in lines[0]


def test_wrong_key_fails_as_authentication_failure(slurm_cluster, tmp_path, monkeypatch):
    stranger = tmp_path / "stranger_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    write_config(slurm_cluster, tmp_path, monkeypatch, "wrong-key", known_hosts=slurm_cluster.host_key_line(), key=stranger)
    with pytest.raises(ToolError, match="authentication failed for user root"):
        ssh_check(SshCheckInput(host="wrong-key"))


def test_closed_port_fails_fast_as_unreachable(slurm_cluster, tmp_path, monkeypatch):
    write_config(slurm_cluster, tmp_path, monkeypatch, "nobody-home", port=free_port())
    started = time.monotonic()
    with pytest.raises(ToolError, match="host unreachable.*connection refused"):
        ssh_check(SshCheckInput(host="nobody-home"))
    assert time.monotonic() - started < 3


def test_silent_server_times_out_instead_of_hanging(slurm_cluster, tmp_path, monkeypatch):
    # Accepts TCP and never speaks SSH: what a firewall-eaten or wedged host looks like.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    write_config(slurm_cluster, tmp_path, monkeypatch, "silent", port=listener.getsockname()[1])
    started = time.monotonic()
    try:
        with pytest.raises(ToolError, match="silent: host unreachable: no SSH answer"):
            ssh_check(SshCheckInput(host="silent"))
    finally:
        listener.close()
    assert time.monotonic() - started < 10  # ConnectTimeout 3 governs the banner wait too


def test_a_host_stuck_connecting_does_not_block_calls_to_another(slurm_cluster, tmp_path, monkeypatch):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    write_config(slurm_cluster, tmp_path, monkeypatch, "stuck", port=listener.getsockname()[1])
    stuck = threading.Thread(target=lambda: pytest.raises(ToolError, run_remote, "stuck", "true"))
    try:
        stuck.start()
        time.sleep(0.3)
        assert run_remote(slurm_cluster.ssh_alias, "echo fine").stdout == "fine\n"
        assert stuck.is_alive()  # answered while the stuck connect still waits out its 3 s ConnectTimeout
    finally:
        stuck.join(15)
        listener.close()


def test_proxy_jump_goes_through_the_jump_host(slurm_cluster, tmp_path, monkeypatch):
    write_config(slurm_cluster, tmp_path, monkeypatch, "behind-jump", known_hosts=slurm_cluster.host_key_line(),
                 extra=f"  ProxyJump {slurm_cluster.ssh_alias}\n")
    result = ssh_check(SshCheckInput(host="behind-jump"))
    assert result.via_proxy_jump == slurm_cluster.ssh_alias
    assert result.user == "root" and result.commands["sbatch"]


def test_proxy_jump_chain_takes_every_hop(slurm_cluster, tmp_path, monkeypatch):
    # Second hop in `user@host:port` form, as OpenSSH allows; every hop is this same sshd.
    chain = f"{slurm_cluster.ssh_alias},root@{slurm_cluster.ssh_alias}:{slurm_cluster.port}"
    write_config(slurm_cluster, tmp_path, monkeypatch, "two-hops", known_hosts=slurm_cluster.host_key_line(),
                 extra=f"  ProxyJump {chain}\n")
    conn = ssh.open_connection("two-hops")
    try:
        hops = 0
        hop = conn.jump
        while hop is not None:
            hops, hop = hops + 1, hop.jump
        assert hops == 2
        _, stdout, _ = conn.client.exec_command("whoami")
        assert stdout.read().decode().strip() == "root"
    finally:
        conn.close()


def test_bad_host_names_are_refused():
    for bad in ["-oProxyCommand=touch /tmp/x", "two words", ""]:
        with pytest.raises(ToolError, match="not a host name"):
            ssh_check(SshCheckInput(host=bad))


def test_ssh_check_through_the_cli_as_json(slurm_cluster, cli_env):
    done = subprocess.run(
        ["quanteval", "call", "ssh_check", "--json", json.dumps({"host": slurm_cluster.ssh_alias})],
        capture_output=True, text=True, env=cli_env, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["commands"]["sbatch"] is True


# --- slurm_queue ---------------------------------------------------------------------------------------


def sbatch(cluster: SlurmCluster, args: str) -> str:
    done = cluster.run(f"sbatch --parsable -o /dev/null {args}")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def wait_until(predicate, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError("condition not met in time")


def test_slurm_queue_follows_a_job_from_queued_to_cancelled(slurm_cluster):
    job = sbatch(slurm_cluster, "-J qe-sleeper --wrap 'sleep 30'")
    live = slurm_queue(SlurmQueueInput(host=slurm_cluster.ssh_alias, job_ids=[job]))
    assert [j.job_id for j in live.jobs] == [job]
    assert live.jobs[0].state in {"PENDING", "RUNNING"} and live.jobs[0].name == "qe-sleeper"
    assert live.jobs[0].source == "squeue"

    slurm_cluster.run(f"scancel {job}")

    def finished():
        page = slurm_queue(SlurmQueueInput(host=slurm_cluster.ssh_alias, job_ids=[job], include_finished=True))
        return page if page.jobs and page.jobs[0].exit_code else None

    page = wait_until(finished)
    assert page.jobs[0].state == "CANCELLED"
    assert page.finished_source == "sacct -c"
    assert any("sacct -c" in note for note in page.notes)
    # Without include_finished the cancelled job is gone from the live queue.
    assert slurm_queue(SlurmQueueInput(host=slurm_cluster.ssh_alias, job_ids=[job])).jobs == []


def test_slurm_queue_paginates_and_filters(slurm_cluster):
    held = [sbatch(slurm_cluster, "--hold -J qe-held --wrap 'true'") for _ in range(3)]
    try:
        first = slurm_queue(SlurmQueueInput(host=slurm_cluster.ssh_alias, job_ids=held, limit=2))
        assert first.total == 3 and len(first.jobs) == 2 and first.next_offset == 2
        rest = slurm_queue(SlurmQueueInput(host=slurm_cluster.ssh_alias, job_ids=held, limit=2, offset=2))
        assert len(rest.jobs) == 1 and rest.next_offset is None
        assert {j.job_id for j in first.jobs + rest.jobs} == set(held)
        assert all(j.state == "PENDING" for j in first.jobs)
        assert slurm_queue(SlurmQueueInput(host=slurm_cluster.ssh_alias, user="nobody-here", job_ids=held)).jobs == []
    finally:
        slurm_cluster.run(f"scancel {' '.join(held)}")


def test_slurm_queue_refuses_injection_in_ids_and_user(slurm_cluster):
    with pytest.raises(ToolError, match="job_ids"):
        slurm_queue(SlurmQueueInput(host=slurm_cluster.ssh_alias, job_ids=["1; touch /tmp/qe-pwned"]))
    with pytest.raises(ToolError, match="user"):
        slurm_queue(SlurmQueueInput(host=slurm_cluster.ssh_alias, user="root --me"))


def test_slurm_queue_on_a_host_without_slurm_config_says_so(monkeypatch, tmp_path):
    broken = tmp_path / "slurm.conf"
    broken.write_text("")  # installed, not configured (a missing file makes squeue retry for 60 s)
    monkeypatch.setenv("SLURM_CONF", str(broken))
    with pytest.raises(ToolError, match="no usable SLURM configuration"):
        slurm_queue(SlurmQueueInput(host="local"))
    monkeypatch.delenv("SLURM_CONF")  # no slurm.conf anywhere: squeue falls back to DNS and fails
    if not Path("/etc/slurm/slurm.conf").exists():
        with pytest.raises(ToolError, match="no usable SLURM configuration"):
            slurm_queue(SlurmQueueInput(host="local"))


def test_slurmctld_restart_during_polling_gives_clear_errors_then_answers(slurm_cluster):
    job = sbatch(slurm_cluster, "--hold --wrap 'true'")
    outcomes: list[str] = []
    durations: list[float] = []
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            started = time.monotonic()
            try:
                page = slurm_queue(SlurmQueueInput(host=slurm_cluster.ssh_alias, job_ids=[job]))
                outcomes.append("ok" if page.jobs else "missing")
            except ToolError as exc:
                outcomes.append(str(exc))
            durations.append(time.monotonic() - started)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        time.sleep(0.5)
        slurm_cluster.stop("slurmctld")
        wait_until(lambda: any(o not in ("ok", "missing") for o in outcomes), timeout=90)
        slurm_cluster.up()
        mark = len(outcomes)
        wait_until(lambda: "ok" in outcomes[mark:], timeout=90)
    finally:
        stop.set()
        poller.join(120)
        slurm_cluster.run(f"scancel {job}")
    errors = [o for o in outcomes if o not in ("ok", "missing")]
    assert errors and all("SLURM controller not answering" in e and "call again" in e for e in errors)
    assert "missing" not in outcomes  # the restarted controller still knows the job
    assert max(durations) < 90


def test_dropped_ssh_connection_mid_command_is_a_clear_error_and_the_next_call_works(slurm_cluster):
    slurm_queue(SlurmQueueInput(host=slurm_cluster.ssh_alias))  # the pooled connection the next calls reuse
    client_port = ssh._pooled(slurm_cluster.ssh_alias).client.get_transport().sock.getsockname()[1]
    errors: list[Exception] = []

    def long_poll():
        try:
            run_remote(slurm_cluster.ssh_alias, "sleep 20", timeout=60)
        except Exception as exc:  # noqa: BLE001 - the test inspects what came back
            errors.append(exc)

    worker = threading.Thread(target=long_poll)
    worker.start()
    time.sleep(1)
    sessions = slurm_cluster.ssh_session_pids(client_port)
    assert sessions
    for pid in sessions:
        subprocess.run(["kill", "-9", str(pid)], check=False)
    worker.join(30)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ToolError)
    assert "connection dropped" in str(errors[0]) and "call again" in str(errors[0]).lower()
    assert slurm_queue(SlurmQueueInput(host=slurm_cluster.ssh_alias)).host == slurm_cluster.ssh_alias


def test_command_timeout_is_enforced(slurm_cluster):
    started = time.monotonic()
    with pytest.raises(ToolError, match="did not finish within 1 s"):
        run_remote(slurm_cluster.ssh_alias, "sleep 30", timeout=1)
    assert time.monotonic() - started < 5


# --- remote_grep ---------------------------------------------------------------------------------------


def test_remote_grep_finds_the_oom_line_with_file_and_line(slurm_cluster):
    logs = slurm_cluster.jobs_dir / "grep-oom" / "logs"
    logs.mkdir(parents=True)
    (logs / "client-1.log").write_text(
        "loading model\nstep 1 ok\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\nbye\n"
    )
    (logs / "server.log").write_text("all fine\n")
    result = remote_grep(RemoteGrepInput(host=slurm_cluster.ssh_alias, path=str(logs.parent), patterns=["out of memory", "OOM"]))
    assert [(m.file, m.line) for m in result.matches] == [(str(logs / "client-1.log"), 3)]
    assert "CUDA out of memory" in result.matches[0].text
    assert result.truncated is False


def test_remote_grep_caps_matches_and_line_length(slurm_cluster):
    log = slurm_cluster.jobs_dir / "grep-cap.log"
    log.write_text("".join(f"Traceback {i} " + "x" * 5000 + "\n" for i in range(2000)))
    result = remote_grep(RemoteGrepInput(host=slurm_cluster.ssh_alias, path=str(log), patterns=["traceback"], max_lines=10))
    assert len(result.matches) == 10 and result.truncated is True
    assert [m.line for m in result.matches] == list(range(1, 11))
    assert all(len(m.text) <= redact.MAX_LINE_CHARS for m in result.matches)


def test_remote_grep_arguments_cannot_become_options_or_shell(slurm_cluster):
    base = slurm_cluster.jobs_dir / "grep-inject"
    base.mkdir()
    victim = base / "pwned"
    (base / "a.log").write_text("plain line\nflag -v here\n")
    odd = base / "-name; with 'quotes' $(x).log"
    odd.write_text("killed by signal 9\n")
    hostile = ["-v", f"'; touch {victim}; '", f"$(touch {victim})", f"`touch {victim}`"]
    result = remote_grep(RemoteGrepInput(host=slurm_cluster.ssh_alias, path=str(base), patterns=hostile))
    assert [(Path(m.file).name, m.line) for m in result.matches] == [("a.log", 2)]  # '-v' matched as text
    assert not victim.exists()
    odd_hit = remote_grep(RemoteGrepInput(host=slurm_cluster.ssh_alias, path=str(odd), patterns=["killed"]))
    assert odd_hit.matches[0].file == str(odd) and odd_hit.matches[0].line == 1
    with pytest.raises(ToolError, match="No such file"):  # a path '-r' is a (missing) file, not an option
        remote_grep(RemoteGrepInput(host=slurm_cluster.ssh_alias, path="-r", patterns=["x"]))
    assert not victim.exists()


def test_remote_grep_on_a_missing_path_is_a_clear_error(slurm_cluster):
    with pytest.raises(ToolError, match="No such file"):
        remote_grep(RemoteGrepInput(host=slurm_cluster.ssh_alias, path="/nonexistent/logs", patterns=["x"]))


def test_remote_grep_on_this_machine_with_local(tmp_path):
    (tmp_path / "eval.log").write_text("ok\nHTTP 401 Unauthorized\n")
    result = remote_grep(RemoteGrepInput(host="local", path=str(tmp_path), patterns=["unauthorized"]))
    assert [(Path(m.file).name, m.line) for m in result.matches] == [("eval.log", 2)]


# --- check_registry_credentials ------------------------------------------------------------------------

SECRET = "nvapi-PLANTED-s3cr3t-9f8e7d"


def test_registry_credentials_report_names_never_secrets(slurm_cluster, caplog):
    credentials = slurm_cluster.enroot_dir / ".credentials"
    credentials.write_text(
        f"machine nvcr.io login $oauthtoken password {SECRET}\n"
        f"machine authn.nvidia.com login $oauthtoken password {SECRET}\n"
        "machine gitlab.example.com\n  login deploy-user\n  password machine\n"  # a password that looks like a keyword
    )
    credentials.chmod(0o600)
    with caplog.at_level(logging.DEBUG):
        result = check_registry_credentials(CheckRegistryCredentialsInput(host=slurm_cluster.ssh_alias, registry="nvcr.io"))
    assert [e.machine for e in result.entries] == ["nvcr.io", "authn.nvidia.com", "gitlab.example.com"]
    assert all(e.has_login and e.has_password for e in result.entries)
    assert result.registry_ok is True and result.exists
    dumped = result.model_dump_json()
    assert SECRET not in dumped and "deploy-user" not in dumped and "oauthtoken" not in dumped
    assert SECRET not in caplog.text

    missing = check_registry_credentials(CheckRegistryCredentialsInput(host=slurm_cluster.ssh_alias, registry="ghcr.io"))
    assert missing.registry_ok is False and any("ghcr.io" in n for n in missing.notes)


def test_registry_credentials_flag_a_world_readable_or_missing_file(slurm_cluster):
    credentials = slurm_cluster.enroot_dir / ".credentials"
    credentials.write_text(f"machine nvcr.io login $oauthtoken password {SECRET}\n")
    credentials.chmod(0o644)
    loose = check_registry_credentials(CheckRegistryCredentialsInput(host=slurm_cluster.ssh_alias))
    assert any("chmod 600" in n for n in loose.notes)
    credentials.unlink()
    absent = check_registry_credentials(CheckRegistryCredentialsInput(host=slurm_cluster.ssh_alias, registry="nvcr.io"))
    assert absent.exists is False and absent.entries == [] and absent.registry_ok is False


def test_registry_argument_is_validated():
    with pytest.raises(ToolError, match="registry"):
        check_registry_credentials(CheckRegistryCredentialsInput(host="local", registry="nvcr.io; cat ~/.ssh/id_rsa"))


# --- helpers used by other modules ---------------------------------------------------------------------


def test_fetch_tree_brings_back_what_was_asked(slurm_cluster, tmp_path):
    run = slurm_cluster.jobs_dir / "fetch-run"
    (run / "task" / "artifacts").mkdir(parents=True)
    (run / "task" / "artifacts" / "results.yml").write_text("results: {}\n")
    (run / "task" / "logs.txt").write_text("\n".join(f"line {i}" for i in range(100)) + "\n")
    (run / "task" / "artifacts" / "big.bin").write_bytes(b"\0" * 1000)
    written = ssh.fetch_tree(slurm_cluster.ssh_alias, str(run), tmp_path / "copy", ["*.yml", "*.txt"])
    assert sorted(p.relative_to(tmp_path / "copy").as_posix() for p in written) == [
        "task/artifacts/results.yml", "task/logs.txt"]
    assert (tmp_path / "copy" / "task" / "artifacts" / "results.yml").read_text() == "results: {}\n"


def test_keys_from_a_running_ssh_agent_are_used(slurm_cluster, tmp_path, monkeypatch):
    agent_socket = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(agent_socket)], stdout=subprocess.DEVNULL)
    try:
        wait_until(agent_socket.exists, timeout=10)
        env = {"SSH_AUTH_SOCK": str(agent_socket), "PATH": "/usr/bin:/bin"}
        subprocess.run(["ssh-add", "-q", str(slurm_cluster.key_path)], env=env, check=True, timeout=10)
        known = tmp_path / "known_hosts"
        known.write_text(slurm_cluster.host_key_line())
        config = tmp_path / "agent_config"  # no IdentityFile: the only way in is the agent's key
        config.write_text(f"Host via-agent\n  HostName 127.0.0.1\n  Port {slurm_cluster.port}\n  User root\n"
                          f"  UserKnownHostsFile {known}\n")
        monkeypatch.setenv("QUANTEVAL_SSH_CONFIG", str(config))
        monkeypatch.setenv("SSH_AUTH_SOCK", str(agent_socket))
        monkeypatch.setenv("HOME", str(tmp_path))  # no default keys in ~/.ssh to fall back on
        assert ssh_check(SshCheckInput(host="via-agent")).user == "root"
        ssh._drop("via-agent")
        monkeypatch.delenv("SSH_AUTH_SOCK")
        with pytest.raises(ToolError, match="authentication failed"):
            ssh_check(SshCheckInput(host="via-agent"))
    finally:
        agent.terminate()
        agent.wait(10)


# --- cluster_info and apply_cluster: the cluster is asked, never guessed ------------------------


def call_over_mcp(tool: str, arguments: dict) -> dict:
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool(tool, arguments)

    result = anyio.run(go)
    assert not result.is_error, result.content[0].text
    return result.structured_content


def test_cluster_info_reads_partitions_gpus_limits_and_node_states(slurm_cluster):
    info = call_over_mcp("cluster_info", {"host": slurm_cluster.ssh_alias})
    partitions = {p["name"]: p for p in info["partitions"]}
    assert set(partitions) == {"debug", "hopper", "blackwell"} and info["default_partition"] == "debug"
    hopper, blackwell = partitions["hopper"], partitions["blackwell"]
    assert (hopper["gpus_per_node"], hopper["gpu_model"], hopper["gpus"][0]["gres_type"]) == (8, "H100", "h100")
    assert (hopper["max_time"], hopper["max_time_s"], hopper["default_time_s"]) == ("04:00:00", 14400, 3600)
    assert hopper["usable_nodes"] == 1 and hopper["features"] == ["hopper"]
    # gpub1 is configured but runs no slurmd: readable, not usable.
    assert (blackwell["gpu_model"], blackwell["max_time_s"], blackwell["usable_nodes"]) == ("B200", 2 * 86400, 0)
    assert partitions["debug"]["max_time_s"] is None  # UNLIMITED
    # No slurmdbd on this cluster: accounts are not visible, and the result says so instead of failing.
    assert info["accounts"] is None and any("sacctmgr" in note for note in info["notes"])
    assert info["user"] == "root" and info["query_s"] > 0
    # check_environment lists the hosts of the same ssh config the remote tools read (QUANTEVAL_SSH_CONFIG here).
    from quanteval.workflow.environment import ssh_config_hosts

    assert slurm_cluster.ssh_alias in ssh_config_hosts()

    one = tools.cluster_info(tools.ClusterInfoInput(host=slurm_cluster.ssh_alias, partition="blackwell"))
    assert [p.name for p in one.partitions] == ["blackwell"]
    with pytest.raises(ToolError, match="'batch' does not exist.*debug, hopper, blackwell"):
        tools.cluster_info(tools.ClusterInfoInput(host=slurm_cluster.ssh_alias, partition="batch"))


def sbatch_accepts(cluster: SlurmCluster, config: Path) -> subprocess.CompletedProcess[str]:
    """Ask the real slurmctld whether it would take a job with the config's partition / gres / walltime."""
    from quanteval.workflow import nelconfig

    doc = nelconfig.to_plain(nelconfig.load_config(config))["execution"]
    gres = f"--gres={doc['gres']}" if doc.get("gres") else ""
    return cluster.run(f"sbatch --test-only -p {doc.get('partition', 'batch')} {gres} "
                       f"--time={doc.get('walltime') or '01:00:00'} --wrap true")


def test_apply_cluster_fills_partition_gpus_and_walltime_and_sbatch_takes_them(slurm_cluster, tmp_path: Path):
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from factories import make_checkpoint

    from quanteval.workflow import nelconfig, placement

    config = tmp_path / "run.yaml"
    nelconfig.build_config(nelconfig.BuildConfigInput(execution="slurm", deployment="sglang", model_type="chat_reasoning",
                                                      benchmarks=["core_reasoning"], config_path=str(config)))
    nelconfig.set_config_value(nelconfig.SetConfigValueInput(config_path=str(config), key="execution.hostname",
                                                             value=slurm_cluster.ssh_alias))
    nelconfig.set_config_value(nelconfig.SetConfigValueInput(config_path=str(config), key="execution.partition", value="batch"))
    checkpoint = make_checkpoint(tmp_path / "qwen3-nvfp4", quant="NVFP4", model_type="qwen3")
    nelconfig.apply_checkpoint(nelconfig.ApplyCheckpointInput(config_path=str(config), checkpoint=str(checkpoint),
                                                              tensor_parallel_size=2))
    # NEL's own defaults (partition batch, gres gpu:8 is what it would send) are refused by this cluster.
    refused = sbatch_accepts(slurm_cluster, config)
    assert refused.returncode != 0 and "invalid partition" in refused.stderr.lower()

    result = call_over_mcp("apply_cluster", {"config_path": str(config), "walltime": "10:00:00"})
    placed = result["placement"]
    assert (placed["partition"], placed["gpu_model"], placed["gpus_per_node"]) == ("debug", "H100", 2)
    assert placed["values"]["execution.gres"] == "gpu:2"  # TP 2 x DP 1 x PP 1, not gpu:8
    assert any("'batch' does not exist" in w for w in placed["warnings"])
    nvfp4 = next(w for w in placed["warnings"] if "NVFP4 on H100" in w)
    assert "Marlin" in nvfp4 and "not what ships on Blackwell" in nvfp4 and "Partition blackwell" in nvfp4
    doc = nelconfig.to_plain(nelconfig.load_config(config))["execution"]
    assert (doc["partition"], doc["gres"], doc["walltime"]) == ("debug", "gpu:2", "10:00:00")
    accepted = sbatch_accepts(slurm_cluster, config)
    assert accepted.returncode == 0, accepted.stderr

    # The hopper partition's 4-hour limit caps the walltime; NEL's auto-resume carries a longer run on.
    capped = placement.apply_cluster(placement.ApplyClusterInput(config_path=str(config), partition="hopper",
                                                                 walltime="1-00:00:00"))
    assert capped.placement.values["execution.walltime"] == "04:00:00" and sbatch_accepts(slurm_cluster, config).returncode == 0
    again = placement.apply_cluster(placement.ApplyClusterInput(config_path=str(config), partition="hopper",
                                                                walltime="1-00:00:00"))
    assert again.changes == [] and again.diff == ""  # idempotent

    # More GPUs than a node has: said plainly, not left for sbatch to refuse.
    nelconfig.set_config_value(nelconfig.SetConfigValueInput(config_path=str(config), key="deployment.tensor_parallel_size", value=16))
    too_big = placement.apply_cluster(placement.ApplyClusterInput(config_path=str(config)))
    assert any("needs 16 GPUs per node" in w and "has 8" in w for w in too_big.placement.warnings)


def test_apply_cluster_needs_a_slurm_config_and_a_host(tmp_path: Path):
    from quanteval.workflow import nelconfig, placement

    local = tmp_path / "local.yaml"
    nelconfig.build_config(nelconfig.BuildConfigInput(execution="local", deployment="vllm", model_type="base",
                                                      benchmarks=["coding"], config_path=str(local)))
    with pytest.raises(ToolError, match="execution is 'local', not slurm"):
        placement.apply_cluster(placement.ApplyClusterInput(config_path=str(local)))
    slurm = tmp_path / "slurm.yaml"
    nelconfig.build_config(nelconfig.BuildConfigInput(execution="slurm", deployment="vllm", model_type="base",
                                                      benchmarks=["coding"], config_path=str(slurm)))
    with pytest.raises(ToolError, match="execution.hostname is not set"):
        placement.apply_cluster(placement.ApplyClusterInput(config_path=str(slurm)))


@pytest.mark.parametrize(("text", "seconds"), [("30", 1800), ("5:30", 330), ("04:00:00", 14400), ("2-00:00:00", 172800),
                                               ("1-02", 93600), ("UNLIMITED", None), ("INFINITE", None)])
def test_slurm_time_formats(text: str, seconds: int | None):
    assert slurm.slurm_seconds(text) == seconds
    if seconds:
        assert slurm.slurm_seconds(slurm.slurm_time(seconds)) == seconds


def test_gres_as_big_clusters_print_it_is_read():
    """GRES spellings this test cluster cannot produce: long type names with socket bindings, untyped GPUs named
    by a node feature, mixed GPU kinds in one partition, drained and powered-off nodes."""
    lines = ["gpu|120|mix|gpu:nvidia_h100_80gb_hbm3:8(S:0-1)|hopper,ib", "gpu|4|drain|gpu:nvidia_h100_80gb_hbm3:8(S:0-1)|hopper,ib",
             "gpu|16|idle~|gpu:nvidia_h100_80gb_hbm3:8(S:0-1)|hopper,ib",
             "old|10|idle|gpu:4|a100", "mixed|2|idle|gpu:a100:4|(null)", "mixed|2|alloc|gpu:b200:8|(null)",
             "cpu|50|idle|(null)|(null)"]
    groups = [slurm._NodeGroup.parse(line) for line in lines]

    def partition(name: str) -> slurm.PartitionInfo:
        fields = {"PartitionName": name, "MaxTime": "1-00:00:00", "State": "UP"}
        return slurm._partition(fields, [g for g in groups if g.partition == name])

    gpu = partition("gpu")
    assert (gpu.gpu_model, gpu.gpus_per_node, gpu.nodes, gpu.usable_nodes) == ("H100", 8, 140, 120)
    old = partition("old")
    assert (old.gpu_model, old.gpus[0].gres_type, old.gpus_per_node) == ("A100", None, 4)  # from Feature=a100
    mixed = partition("mixed")
    assert mixed.gpu_model is None and {g.gpu_model for g in mixed.gpus} == {"A100", "B200"} and mixed.gpus_per_node == 8
    cpu = partition("cpu")
    assert (cpu.gpus_per_node, cpu.gpu_model, cpu.usable_nodes) == (0, None, 50)
