"""The ssh config as OpenSSH reads it, not as paramiko does, against the real sshd of the `slurm_cluster` fixture.

A User that is not $USER, found through Include + Match (which paramiko's SSHConfig does not read), and
`StrictHostKeyChecking no` with `UserKnownHostsFile /dev/null`: ssh_check and cluster_info get through as that user
and store no host key; apply_cluster writes that user into execution.username; validate_config refuses a config whose
username (NEL's ${oc.env:USER}) would override it. StrictHostKeyChecking accept-new and no against a known_hosts
holding a different key behave as OpenSSH does.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from infra.slurm_cluster import SlurmCluster

from quanteval.clusters import ssh
from quanteval.clusters.tools import ClusterInfoInput, SshCheckInput, cluster_info, ssh_check
from quanteval.models import ToolError
from quanteval.workflow import nelconfig, placement, validation

CLUSTER_USER = "qe-sshuser"  # the login the ssh config names; $USER says "alice" (NEL's ${oc.env:USER})
ALIAS = "qe-semantics"


@pytest.fixture(scope="module")
def cluster_user() -> Iterator[str]:
    """A second real login on this machine (the test sshd takes the fixture's key for any user), removed afterwards."""
    try:
        pwd.getpwnam(CLUSTER_USER)
        created = False
    except KeyError:
        if os.geteuid() != 0 or not shutil.which("useradd"):
            pytest.skip("creating a second login needs root and useradd")
        home = Path(tempfile.mkdtemp(prefix="qe-sshuser-home-"))
        subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/bash", "-p", "*", CLUSTER_USER], check=True)
        shutil.chown(home, CLUSTER_USER)
        created = True
    try:
        yield CLUSTER_USER
    finally:
        if created:
            subprocess.run(["userdel", CLUSTER_USER], check=False)
            shutil.rmtree(home, ignore_errors=True)


def passwd_known_hosts() -> Path:
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "known_hosts"


@pytest.fixture
def ssh_config(slurm_cluster: SlurmCluster, cluster_user: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Writes this test's ssh config (User from an Included Match block) and makes it the one every client reads."""

    def write(strict: str = "no", known_hosts: str = "/dev/null") -> Path:
        users = tmp_path / "users.conf"
        users.write_text(f"Match originalhost {ALIAS}\n  User {cluster_user}\n")
        config = tmp_path / "ssh_config"
        config.write_text(
            f"Include {users}\n"
            f"Host {ALIAS}\n  HostName 127.0.0.1\n  Port {slurm_cluster.port}\n"
            f"  IdentityFile {slurm_cluster.key_path}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {known_hosts}\n  StrictHostKeyChecking {strict}\n  ConnectTimeout 5\n  LogLevel ERROR\n"
        )
        monkeypatch.setenv("QUANTEVAL_SSH_CONFIG", str(config))
        ssh._drop(ALIAS)
        return config

    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    yield write
    ssh._drop(ALIAS)


def other_host_key(tmp_path: Path, cluster: SlurmCluster) -> str:
    """A known_hosts line naming this server with a key it does not have (a "changed" key)."""
    key = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    key_type, key_b64 = key.with_suffix(".pub").read_text().split()[:2]
    return f"{cluster.known_hosts_name} {key_type} {key_b64}\n"


def test_the_host_is_resolved_by_openssh_include_and_match_included(ssh_config, cluster_user, slurm_cluster):
    config = ssh_config()
    settings = ssh.resolve_host(ALIAS)
    assert settings.resolved_by == "ssh -G"
    assert (settings.user, settings.hostname, settings.port) == (cluster_user, "127.0.0.1", slurm_cluster.port)
    assert settings.strict_host_key_checking == "no" and settings.known_hosts_files == (Path("/dev/null"),)
    assert not settings.persists_host_keys
    assert ssh.resolve_host(f"root@{ALIAS}").user == "root"  # user@alias overrides, as with ssh
    # The real ssh client logs in as that user too; as $USER (what NEL's template passes) it cannot.
    whoami = subprocess.run(["/usr/bin/ssh", "-F", str(config), "-o", "BatchMode=yes", ALIAS, "whoami"],
                            capture_output=True, text=True, timeout=30)
    assert whoami.returncode == 0 and whoami.stdout.strip() == cluster_user, whoami.stderr
    as_user = subprocess.run(["/usr/bin/ssh", "-F", str(config), "-o", "BatchMode=yes", f"alice@{ALIAS}", "true"],
                             capture_output=True, text=True, timeout=30)
    assert as_user.returncode != 0


def test_ssh_check_and_cluster_info_get_through_and_store_no_host_key(ssh_config, cluster_user, slurm_cluster, tmp_path):
    ssh_config()
    system_known = passwd_known_hosts()
    before = system_known.read_bytes() if system_known.exists() else None
    fixture_known = slurm_cluster.known_hosts.read_text()

    checked = ssh_check(SshCheckInput(host=ALIAS))
    assert checked.user == cluster_user and checked.commands["sbatch"]
    assert checked.host_key_added is False and checked.known_hosts_file == "/dev/null"
    assert any("not stored" in note and "/dev/null" in note for note in checked.notes), checked.notes

    ssh._drop(ALIAS)  # cluster_info opens its own connection
    info = cluster_info(ClusterInfoInput(host=ALIAS))
    assert info.user == cluster_user and {p.name for p in info.partitions} == {"debug", "hopper", "blackwell"}

    # Nothing was written anywhere a known_hosts could be.
    assert not (tmp_path / "home" / ".ssh").exists()
    assert (system_known.read_bytes() if system_known.exists() else None) == before
    assert slurm_cluster.known_hosts.read_text() == fixture_known
    assert Path("/dev/null").is_char_device()


def test_strict_checking_yes_with_dev_null_still_refuses_an_unknown_key(ssh_config):
    ssh_config(strict="yes")
    with pytest.raises(ToolError, match="host key not in known_hosts"):
        ssh_check(SshCheckInput(host=ALIAS))
    trusted = ssh_check(SshCheckInput(host=ALIAS, trust_host_key=True))
    assert trusted.host_key_added is False and any("not stored" in note for note in trusted.notes)


def test_accept_new_stores_an_unknown_key_and_refuses_a_changed_one(ssh_config, slurm_cluster, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    ssh_config(strict="accept-new", known_hosts=str(known))
    first = ssh_check(SshCheckInput(host=ALIAS))
    assert first.host_key_added is True and slurm_cluster.host_key_line().split()[2] in known.read_text()
    ssh._drop(ALIAS)
    assert ssh_check(SshCheckInput(host=ALIAS)).host_key_added is False  # known now

    known.write_text(other_host_key(tmp_path, slurm_cluster))
    ssh._drop(ALIAS)
    with pytest.raises(ToolError, match="HOST KEY CHANGED"):
        ssh_check(SshCheckInput(host=ALIAS))


def test_strict_checking_no_connects_past_a_changed_key_without_storing_it(ssh_config, slurm_cluster, tmp_path, cluster_user):
    known = tmp_path / "known_hosts"
    stale = other_host_key(tmp_path, slurm_cluster)
    known.write_text(stale)
    ssh_config(strict="no", known_hosts=str(known))
    checked = ssh_check(SshCheckInput(host=ALIAS))
    assert checked.user == cluster_user and checked.host_key_added is False
    assert any("differs from known_hosts" in note and "StrictHostKeyChecking no" in note for note in checked.notes)
    assert known.read_text() == stale


def slurm_config(path: Path, hostname: str) -> Path:
    nelconfig.build_config(nelconfig.BuildConfigInput(execution="slurm", deployment="vllm", model_type="base",
                                                      benchmarks=["coding"], config_path=str(path)))
    nelconfig.set_config_value(nelconfig.SetConfigValueInput(config_path=str(path), key="execution.hostname", value=hostname))
    return path


def mismatches(config: Path) -> list:
    result = validation.validate_config(validation.ValidateConfigInput(config_path=str(config), check_env=False))
    return [p for p in result.problems if p.rule == "ssh_user_mismatch"]


def test_apply_cluster_writes_the_ssh_config_user_and_validate_config_flags_another(ssh_config, cluster_user, tmp_path):
    ssh_config()
    config = slurm_config(tmp_path / "run.yaml", ALIAS)
    assert nelconfig.to_plain(nelconfig.load_config(config))["execution"].get("username", "${oc.env:USER}") == "${oc.env:USER}"

    # NEL's template ${oc.env:USER} is alice here: NEL would log in as alice@qe-semantics and fail.
    [problem] = mismatches(config)
    assert problem.severity == "error" and problem.key == "execution.username"
    assert "alice" in problem.message and cluster_user in problem.message and "$USER" in problem.message
    assert f"execution.username: {cluster_user}" in problem.fix

    applied = placement.apply_cluster(placement.ApplyClusterInput(config_path=str(config)))
    assert applied.placement.values["execution.username"] == cluster_user
    assert any(change.startswith("execution.username:") for change in applied.changes)
    assert nelconfig.to_plain(nelconfig.load_config(config))["execution"]["username"] == cluster_user
    assert mismatches(config) == []

    # A literal other user is flagged too; the user OpenSSH would use by default raises nothing (nothing says which).
    nelconfig.set_config_value(nelconfig.SetConfigValueInput(config_path=str(config), key="execution.username", value="bob"))
    [literal] = mismatches(config)
    assert "'bob' (set in the config)" in literal.message
    other = slurm_config(tmp_path / "other.yaml", "login.nowhere.example")  # no Host block: OpenSSH's default user
    assert mismatches(other) == []
