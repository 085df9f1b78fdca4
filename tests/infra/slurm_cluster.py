"""The `slurm_cluster` fixture: a real OpenSSH server and a real single-node SLURM cluster on 127.0.0.1.

Started once per test session by `slurm-cluster-up` (munged, slurmctld, `slurmd -N localhost`,
sshd), all state in a fresh temp directory, stopped by PID by `slurm-cluster-down`.

Clients find the cluster under the Host alias `quanteval-test-cluster`:
- paramiko (quanteval.clusters.ssh) reads the ssh config named by QUANTEVAL_SSH_CONFIG, which the fixture
  sets for the session;
- OpenSSH reads ~/.ssh/config of the passwd home, ignoring $HOME, and NEL's SLURM executor runs
  plain `ssh user@host` and `rsync`, and nel-next `ssh` and `scp`, so the fixture puts `ssh` and `scp` wrappers
  that add `-F <config>` first on PATH (rsync runs `ssh` from PATH too).
The known_hosts file holds the server's real host key and the config says StrictHostKeyChecking yes,
so every client checks the key for real.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from quanteval.localproc import free_port

INFRA = Path(__file__).resolve().parent
SSH_ALIAS = "quanteval-test-cluster"


@dataclass
class SlurmCluster:
    workdir: Path
    port: int
    slurmctld_port: int
    slurmd_port: int
    ssh_alias: str = SSH_ALIAS
    user: str = "root"
    setup_seconds: float = 0.0
    bin_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.bin_dir = self.workdir / "bin"

    @classmethod
    def fresh(cls) -> SlurmCluster:
        """A cluster (not started) in a new working directory, on free ports. Not under pytest's basetemp: its parents
        are mode 700, and munged wants a socket directory every user can reach; a short path keeps the socket's short."""
        workdir = Path(tempfile.mkdtemp(prefix="quanteval-slurm-"))
        return cls(workdir=workdir, port=free_port(), slurmctld_port=free_port(), slurmd_port=free_port())

    @property
    def key_path(self) -> Path:
        return self.workdir / "ssh" / "client_key"

    @property
    def host_key_path(self) -> Path:
        return self.workdir / "ssh" / "ssh_host_ed25519_key"

    @property
    def ssh_config(self) -> Path:
        return self.workdir / "ssh" / "config"

    @property
    def known_hosts(self) -> Path:
        return self.workdir / "ssh" / "known_hosts"

    @property
    def slurm_conf(self) -> Path:
        return self.workdir / "etc" / "slurm.conf"

    @property
    def jobs_dir(self) -> Path:
        """A directory for job scripts and outputs, the same path locally and "on the cluster"."""
        return self.workdir / "jobs"

    @property
    def enroot_dir(self) -> Path:
        """ENROOT_CONFIG_PATH of SSH sessions on the cluster: put a `.credentials` file here."""
        return self.workdir / "enroot"

    @property
    def known_hosts_name(self) -> str:
        """How this server is named in known_hosts (a non-22 port puts it in brackets)."""
        return f"[127.0.0.1]:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def run(self, cmd: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run a shell command on this machine against this cluster (SLURM_CONF set)."""
        return subprocess.run(
            cmd, shell=True, env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )

    def up(self) -> None:
        """Start whatever is not running (idempotent); after a `stop`, this is the restart."""
        done = subprocess.run(
            [str(INFRA / "slurm-cluster-up"), str(self.workdir), str(self.port),
             str(self.slurmctld_port), str(self.slurmd_port)],
            capture_output=True, text=True, timeout=120, check=False,
        )
        if done.returncode != 0 or "READY" not in done.stdout:
            raise RuntimeError(f"slurm-cluster-up failed:\n{done.stdout}\n{done.stderr}")

    def stop(self, *daemons: str) -> None:
        """Stop some daemons (sshd, slurmd, slurmctld, munged) by PID, or everything when none named."""
        subprocess.run(
            [str(INFRA / "slurm-cluster-down"), str(self.workdir), *daemons],
            capture_output=True, text=True, timeout=120, check=False,
        )

    def pid(self, daemon: str) -> int:
        return int((self.workdir / "run" / f"{daemon}.pid").read_text().strip())

    def ssh_session_pids(self, client_port: int) -> list[int]:
        """PIDs of the sshd processes serving the connection whose client end is 127.0.0.1:`client_port`.

        Kill them to drop that one connection. Found through the socket, not the process tree: after
        an sshd restart the sessions of the old listener are orphans.
        """
        inodes = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if local_port == self.port and remote_port == client_port:
                    inodes.add(f"socket:[{fields[9]}]")
        pids = []
        for fd_dir in Path("/proc").glob("[0-9]*/fd"):
            try:
                if (fd_dir.parent / "comm").read_text().strip() != "sshd":
                    continue
                if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                    pids.append(int(fd_dir.parent.name))
            except OSError:
                continue
        return pids

    def host_key_line(self) -> str:
        key_type, key_b64 = (self.host_key_path.with_suffix(".pub")).read_text().split()[:2]
        return f"{self.known_hosts_name} {key_type} {key_b64}\n"

    def rotate_host_key(self) -> None:
        """Give sshd a new host key (a "changed host key" as a client sees it) and restart it.

        The fixture's own known_hosts is updated to the new key, so later tests connect as before;
        copy `known_hosts` first to keep the old key.
        """
        self.stop("sshd")
        for path in (self.host_key_path, self.host_key_path.with_suffix(".pub")):
            path.unlink()
        self.up()
        self.known_hosts.write_text(self.host_key_line())

    def write_files(self) -> None:
        """The ssh config with the Host alias, known_hosts with the real key, and the ssh wrapper."""
        self.ssh_config.write_text(
            f"Host {self.ssh_alias}\n"
            "  HostName 127.0.0.1\n"
            f"  Port {self.port}\n"
            f"  User {self.user}\n"
            f"  IdentityFile {self.key_path}\n"
            "  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
            "  StrictHostKeyChecking yes\n"
            "  BatchMode yes\n"
            "  ConnectTimeout 10\n"
            "  LogLevel ERROR\n"
        )
        self.known_hosts.write_text(self.host_key_line())
        self.bin_dir.mkdir(exist_ok=True)
        # scp runs /usr/bin/ssh (compiled in), not the one on PATH: it gets its own wrapper (nel-next copies with scp)
        for program in ("ssh", "scp"):
            wrapper = self.bin_dir / program
            real = shutil.which(program, path=os.defpath + os.pathsep + "/usr/bin") or f"/usr/bin/{program}"
            wrapper.write_text(f'#!/bin/sh\nexec {real} -F {self.ssh_config} "$@"\n')
            wrapper.chmod(0o755)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    cluster = SlurmCluster.fresh()
    started = time.monotonic()
    try:
        cluster.up()
        cluster.write_files()
        cluster.setup_seconds = time.monotonic() - started
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("QUANTEVAL_SSH_CONFIG", str(cluster.ssh_config))
            patch.setenv("PATH", f"{cluster.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
            yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.workdir, ignore_errors=True)
