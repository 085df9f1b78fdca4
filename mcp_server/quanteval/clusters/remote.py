"""Remote access over SSH (paramiko) and the tools built on it: ssh_check, slurm_queue, remote_grep,
check_registry_credentials.

Hosts are named as in ~/.ssh/config (or the file in QUANTEVAL_SSH_CONFIG) and resolved once, by OpenSSH
itself (`ssh -G alias`: Host and Match blocks, Include, tokens), falling back to paramiko's SSHConfig only
when no `ssh` binary is installed. Every tool that connects, apply_cluster (execution.username) and
validate_config use that one resolution: HostName, User, Port, IdentityFile, IdentitiesOnly, ProxyJump,
ConnectTimeout, UserKnownHostsFile, GlobalKnownHostsFile, StrictHostKeyChecking; keys also come from the
ssh agent (SSH_AUTH_SOCK). `user@alias` overrides the user.

Host keys follow StrictHostKeyChecking as OpenSSH does. yes/ask (the default): an unknown or changed key
is refused with its SHA256 fingerprint unless the caller passes trust_host_key=True (then the key is
written to known_hosts and the result says so). accept-new: an unknown key is accepted and stored, a
changed one refused. no: an unknown key is accepted and stored, a changed one accepted (not stored) with a
note. UserKnownHostsFile /dev/null: nothing is stored, ever.

The host name `local` means this machine without SSH (commands run in a local bash); every other
name, `localhost` included, goes through SSH.

Other modules use the helpers: `connect`, `run_remote`, `tail_remote`, `fetch_tree`. Connections are
kept open per host and reused (polling the queue costs one round trip, not a handshake); a dead one
is replaced on the next call.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import logging
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from quanteval import failures
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger(__name__)

LOCAL = "local"
CONNECT_TIMEOUT = 10.0
OUTPUT_LIMIT = 256 * 1024  # bytes kept per stream (the tail) by run_remote
MAX_PROXY_HOPS = 4


@dataclass(frozen=True)
class RemoteResult:
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool = False  # True when a stream was longer than OUTPUT_LIMIT and only its tail is kept


# --- ssh config -------------------------------------------------------------------------------------


def ssh_config_path() -> Path:
    explicit = os.environ.get("QUANTEVAL_SSH_CONFIG")
    return Path(explicit).expanduser() if explicit else Path.home() / ".ssh" / "config"


DEV_NULL = Path("/dev/null")
_DEFAULT_CONNECT_KEYS = ("hostname", "user", "port")


@dataclass(frozen=True)
class HostSettings:
    name: str  # what the caller asked for
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    known_hosts_files: tuple[Path, ...]
    proxy_jump: str | None  # as in the config: one hop or a comma-separated chain
    connect_timeout: float
    strict_host_key_checking: Literal["yes", "ask", "accept-new", "no"] = "ask"
    global_known_hosts_files: tuple[Path, ...] = (Path("/etc/ssh/ssh_known_hosts"),)
    look_for_keys: bool = True  # paramiko's default keys; False when the resolution already listed them
    resolved_by: str = "paramiko"  # "ssh -G" (OpenSSH's own resolution) or "paramiko" (no ssh binary)

    @property
    def known_hosts_name(self) -> str:
        """The name paramiko and OpenSSH look this host up under in known_hosts."""
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    @property
    def persists_host_keys(self) -> bool:
        """False when UserKnownHostsFile is /dev/null: accepted keys are not stored (as with OpenSSH)."""
        return self.known_hosts_files[0] != DEV_NULL


def _split_host(host: str) -> tuple[str, str, str | None]:
    host = host.strip()
    if not host or any(ch.isspace() for ch in host) or host.startswith("-"):
        raise ToolError(f"host '{host}': not a host name. Use an ssh config alias or user@hostname.")
    user_override, _, alias = host.rpartition("@")
    port_override = None
    if alias.count(":") == 1 and alias.split(":")[1].isdigit():
        alias, port_override = alias.split(":")
    if not alias or alias.startswith("-"):
        raise ToolError(f"host '{host}': not a host name. Use an ssh config alias or user@hostname.")
    return user_override, alias, port_override


def _ssh_config_args() -> list[str]:
    """-F for `ssh -G`: the file quanteval reads (QUANTEVAL_SSH_CONFIG, or ~/.ssh/config under $HOME when that is
    not the passwd home OpenSSH would read); none otherwise, so OpenSSH reads its own files (system config too)."""
    config = ssh_config_path()
    if os.environ.get("QUANTEVAL_SSH_CONFIG"):
        return ["-F", str(config)]
    import pwd

    passwd_config = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "config"
    if config.is_file() and config.resolve() != passwd_config.resolve():
        return ["-F", str(config)]
    return []


def _strict(value: str) -> Literal["yes", "ask", "accept-new", "no"]:
    value = value.strip().lower()
    if value in ("yes", "true"):
        return "yes"
    if value in ("no", "false", "off"):
        return "no"
    return "accept-new" if value == "accept-new" else "ask"


def _expand(path: str, hostname: str, user: str, port: int) -> str:
    """OpenSSH's %-tokens that IdentityFile takes most often, then ~."""
    import pwd

    local = pwd.getpwuid(os.getuid())
    tokens = {"%%": "%", "%d": str(Path.home()), "%h": hostname, "%r": user, "%p": str(port), "%u": local.pw_name}
    path = re.sub(r"%[%dhrpu]", lambda m: tokens[m.group(0)], path)
    return str(Path(path).expanduser())


def _resolve_with_openssh(ssh: str, alias: str, user_override: str, port_override: str | None) -> dict[str, list[str]] | None:
    """`ssh -G` for this alias: OpenSSH's own resolution (Host, Match, Include). None when ssh cannot say."""
    config_args = _ssh_config_args()
    if config_args and not Path(config_args[1]).is_file():
        config_args = ["-F", str(DEV_NULL)]
    argv = [ssh, *config_args, "-G", *(["-l", user_override] if user_override else []),
            *(["-p", port_override] if port_override else []), "--", alias]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=15, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("ssh -G %s failed (%s); falling back to paramiko", alias, exc)
        return None
    if done.returncode != 0:
        where = config_args[1] if config_args else "~/.ssh/config"
        raise ToolError(f"{where}: OpenSSH cannot resolve host {alias} ({done.stderr.strip()[-300:]}). Fix the ssh config.")
    entry: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.strip().partition(" ")
        if key:
            entry.setdefault(key.lower(), []).append(value.strip())
    return entry


def resolve_host(host: str) -> HostSettings:
    """What the ssh config says about `host` (`alias`, `user@alias`, or `[user@]alias:port` as in ProxyJump), as
    OpenSSH resolves it (`ssh -G`); paramiko's SSHConfig only when no ssh binary is installed."""
    user_override, alias, port_override = _split_host(host)
    ssh = shutil.which("ssh")
    entry = _resolve_with_openssh(ssh, alias, user_override, port_override) if ssh else None
    if entry is None:
        return _resolve_with_paramiko(host, alias, user_override, port_override)
    first = lambda key, default="": (entry.get(key) or [default])[0]  # noqa: E731
    try:
        port = int(first("port", "22"))
        timeout_text = first("connecttimeout", "none")
        timeout = CONNECT_TIMEOUT if timeout_text == "none" else float(timeout_text)
    except ValueError as exc:
        raise ToolError(f"ssh config: Host {alias}: {exc}. Fix Port/ConnectTimeout.") from None
    hostname = first("hostname", alias)
    user = first("user") or local_user()
    identities = [_expand(p, hostname, user, port) for p in entry.get("identityfile", [])]
    known = [Path(p).expanduser() for value in entry.get("userknownhostsfile", []) for p in value.split()]
    global_known = [Path(p).expanduser() for value in entry.get("globalknownhostsfile", []) for p in value.split()]
    proxy = first("proxyjump", "none")
    return HostSettings(
        name=host,
        hostname=hostname,
        port=port,
        user=user,
        # ssh -G lists the default keys too when the config names none; OpenSSH skips those that do not exist.
        identity_files=tuple(p for p in identities if Path(p).is_file()),
        identities_only=first("identitiesonly", "no").lower() in ("yes", "true"),
        known_hosts_files=tuple(known) or (Path.home() / ".ssh" / "known_hosts",),
        proxy_jump=None if proxy.lower() == "none" else proxy,
        connect_timeout=timeout,
        strict_host_key_checking=_strict(first("stricthostkeychecking", "ask")),
        global_known_hosts_files=tuple(global_known),
        look_for_keys=False,
        resolved_by="ssh -G",
    )


def _resolve_with_paramiko(host: str, alias: str, user_override: str, port_override: str | None) -> HostSettings:
    import paramiko

    config_file = ssh_config_path()
    config = paramiko.SSHConfig()
    if config_file.is_file():
        try:
            config = paramiko.SSHConfig.from_path(str(config_file))
        except Exception as exc:  # paramiko raises several types for bad syntax
            raise ToolError(f"{config_file}: cannot parse ssh config ({exc}). Fix the file.") from None
    entry = config.lookup(alias)
    known = entry.get("userknownhostsfile")
    known_files = tuple(Path(p).expanduser() for p in known.split()) if known else (Path.home() / ".ssh" / "known_hosts",)
    try:
        port = int(port_override or entry.get("port", 22))
        timeout = float(entry.get("connecttimeout", CONNECT_TIMEOUT))
    except ValueError as exc:
        raise ToolError(f"{config_file}: Host {alias}: {exc}. Fix Port/ConnectTimeout.") from None
    identities = tuple(str(Path(p).expanduser()) for p in entry.get("identityfile", []))
    return HostSettings(
        name=host,
        hostname=entry.get("hostname", alias),
        port=port,
        user=user_override or entry.get("user") or local_user(),
        identity_files=identities,
        identities_only=entry.get("identitiesonly", "no").lower() == "yes",
        known_hosts_files=known_files,
        proxy_jump=None if entry.get("proxyjump", "none").lower() == "none" else entry["proxyjump"],
        connect_timeout=timeout,
        strict_host_key_checking=_strict(entry.get("stricthostkeychecking", "ask")),
        look_for_keys=not identities,
    )


def ssh_user(host: str) -> str:
    """The user `ssh host` logs in as (the ssh config's User for it, as OpenSSH resolves it)."""
    return resolve_host(host).user


def local_user() -> str:
    """OpenSSH's default user: the login name of this uid (not $USER)."""
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


# --- host keys --------------------------------------------------------------------------------------


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style fingerprint: SHA256:<base64 without padding>."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


@dataclass
class _HostKeyCheck:
    """Decides about a key known_hosts lacks, as StrictHostKeyChecking says (trust_host_key overrides yes/ask);
    remembers what it saw and did for the result."""

    settings: HostSettings
    trust: bool
    changed_key: paramiko.PKey | None = None  # StrictHostKeyChecking no: a changed key, accepted without storing
    added: bool = False
    note: str | None = None
    seen_key: paramiko.PKey | None = None

    def policy(self) -> paramiko.MissingHostKeyPolicy:
        import paramiko

        check = self
        settings = self.settings
        mode = settings.strict_host_key_checking

        class Policy(paramiko.MissingHostKeyPolicy):
            def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
                check.seen_key = key
                if check.changed_key is not None:
                    if key.asbytes() != check.changed_key.asbytes():  # the key changed again between two handshakes
                        raise ToolError(f"{settings.name}: the server offered two different host keys in a row; refused.")
                    check.note = (f"Host key {key.get_name()} {fingerprint(key)} differs from known_hosts "
                                  f"({_files(settings)}); connected anyway because the ssh config says "
                                  "StrictHostKeyChecking no (OpenSSH does the same). Nothing was stored.")
                    return
                if not check.trust and mode not in ("no", "accept-new"):
                    raise ToolError(
                        f"{settings.name}: host key not in known_hosts ({_files(settings)}): "
                        f"{key.get_name()} {fingerprint(key)}. Compare it with the fingerprint your admin "
                        "publishes, then call again with trust_host_key=true to add it."
                    )
                why = "trust_host_key" if check.trust and mode not in ("no", "accept-new") else f"StrictHostKeyChecking {mode}"
                if settings.persists_host_keys:
                    _save_host_key(settings, hostname, key)
                    check.added = True
                    check.note = f"Host key {fingerprint(key)} was written to {settings.known_hosts_files[0]} ({why})."
                else:
                    check.note = (f"Host key {key.get_name()} {fingerprint(key)} accepted ({why}) and not stored: "
                                  "UserKnownHostsFile is /dev/null.")

        return Policy()


def _files(settings: HostSettings) -> str:
    return ", ".join(str(p) for p in settings.known_hosts_files)


def _save_host_key(settings: HostSettings, hostname: str, key: paramiko.PKey) -> None:
    """Write `key` for `hostname` into the first known_hosts file, replacing an old key of that name."""
    import paramiko

    path = settings.known_hosts_files[0]
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    keys = paramiko.HostKeys()
    if path.is_file():
        keys.load(str(path))
    keys[hostname] = {key.get_name(): key}  # replaces this host's key of that type, keeps every other entry
    keys.save(str(path))
    log.info("added host key %s %s for %s to %s", key.get_name(), fingerprint(key), hostname, path)


def _load_known_hosts(client: paramiko.SSHClient, settings: HostSettings) -> None:
    for system in settings.global_known_hosts_files:
        if system.is_file():
            try:
                client.load_system_host_keys(str(system))
            except Exception as exc:
                raise ToolError(f"{system}: cannot read known_hosts ({exc}). Fix or remove the bad line.") from None
    for path in settings.known_hosts_files:
        if path.is_file():
            try:
                client.load_host_keys(str(path))
            except Exception as exc:
                raise ToolError(f"{path}: cannot read known_hosts ({exc}). Fix or remove the bad line.") from None


# --- connections ------------------------------------------------------------------------------------


@dataclass
class Connection:
    client: paramiko.SSHClient
    settings: HostSettings
    host_key_fingerprint: str
    host_key_added: bool
    jump: Connection | None = None
    host_key_note: str | None = None  # what was done about the host key (stored, accepted unstored, changed)

    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        self.client.close()
        if self.jump is not None:
            self.jump.close()


def open_connection(host: str, trust_host_key: bool = False, _jumps: list[str] | None = None, _hops: int = 0,  # noqa: C901
                    _changed_key: paramiko.PKey | None = None) -> Connection:
    """A new, authenticated SSH connection to `host` with its key checked. The caller closes it.

    ProxyJump a,b works like OpenSSH: b is reached through a, the target through b; `_jumps` carries
    the rest of such a chain (it overrides the hop's own ProxyJump). `_changed_key`: the changed key that
    StrictHostKeyChecking no accepts on the second try (known_hosts is then not loaded for this connection).
    """
    import paramiko

    settings = resolve_host(host)
    if _hops > MAX_PROXY_HOPS:
        raise ToolError(f"{host}: ProxyJump chain longer than {MAX_PROXY_HOPS} hops (a loop?). Fix ~/.ssh/config.")
    jump: Connection | None = None
    sock = None
    jumps = _jumps if _jumps is not None else (settings.proxy_jump.split(",") if settings.proxy_jump else [])
    if jumps:
        jump = open_connection(jumps[-1], trust_host_key, jumps[:-1] or None, _hops + 1)
        try:
            sock = jump.client.get_transport().open_channel(  # type: ignore[union-attr]
                "direct-tcpip", (settings.hostname, settings.port), ("127.0.0.1", 0), timeout=settings.connect_timeout
            )
        except (paramiko.SSHException, OSError) as exc:
            jump.close()
            raise ToolError(
                f"{host}: jump host {jumps[-1]} could not reach {settings.hostname}:{settings.port} ({exc}). "
                "Check HostName/Port and that the jump host allows TCP forwarding."
            ) from None

    client = paramiko.SSHClient()
    if _changed_key is None:
        _load_known_hosts(client, settings)
    check = _HostKeyCheck(settings, trust_host_key, _changed_key)
    client.set_missing_host_key_policy(check.policy())
    where = f"{settings.hostname}:{settings.port}" + (f" via {','.join(jumps)}" if jump else "")
    try:
        client.connect(
            settings.hostname,
            port=settings.port,
            username=settings.user,
            key_filename=list(settings.identity_files) or None,
            allow_agent=not settings.identities_only or not settings.identity_files,
            look_for_keys=settings.look_for_keys and not settings.identity_files,
            timeout=settings.connect_timeout,
            banner_timeout=settings.connect_timeout,
            auth_timeout=settings.connect_timeout,
            channel_timeout=settings.connect_timeout,
            sock=sock,
        )
    except paramiko.BadHostKeyException as exc:
        client.close()
        if not trust_host_key and settings.strict_host_key_checking == "no" and _changed_key is None:
            if jump:
                jump.close()
            return open_connection(host, False, _jumps, _hops, _changed_key=exc.key)
        if not trust_host_key:
            if jump:
                jump.close()
            raise ToolError(
                f"{host}: HOST KEY CHANGED for {settings.known_hosts_name}: known_hosts ({_files(settings)}) has "
                f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)}, the server now offers "
                f"{exc.key.get_name()} {fingerprint(exc.key)}. This can be an attack; refused. If the server was "
                "really reinstalled, confirm the new fingerprint with its admin, then call again with "
                "trust_host_key=true to replace the old key."
            ) from None
        if jump:
            jump.close()
        if not settings.persists_host_keys:  # /dev/null holds no old key to replace: accept this one, store nothing
            return open_connection(host, False, _jumps, _hops, _changed_key=exc.key)
        _save_host_key(settings, settings.known_hosts_name, exc.key)
        replaced = open_connection(host, False, _jumps, _hops)
        replaced.host_key_added = True
        replaced.host_key_note = f"Host key {fingerprint(exc.key)} was written to {settings.known_hosts_files[0]} (trust_host_key)."
        return replaced
    except ToolError:
        client.close()
        if jump:
            jump.close()
        raise
    except (paramiko.AuthenticationException, paramiko.SSHException) as exc:
        client.close()
        if not isinstance(exc, paramiko.AuthenticationException) and "authentication" not in str(exc).lower():
            if jump:
                jump.close()
            if "banner" in str(exc).lower() or "no existing session" in str(exc).lower():
                # TCP connected, but the SSH handshake never happened: wrong port, wedged or overloaded sshd.
                raise ToolError(
                    f"{host}: host unreachable: no SSH answer from {where} within {settings.connect_timeout:g} s. "
                    "Check that Port is sshd's port and the host is not overloaded."
                ) from None
            raise ToolError(f"{host}: host unreachable: {where}: {exc}. Check HostName, Port and that sshd runs.") from None
        if jump:
            jump.close()
        tried = ", ".join(settings.identity_files) or "default keys in ~/.ssh"
        raise ToolError(
            f"{host}: authentication failed for user {settings.user} at {where} ({exc}). Tried: {tried}"
            f"{'' if settings.identities_only else ' and the ssh agent'}. Add the right IdentityFile/User for this "
            "Host in ~/.ssh/config or load the key into ssh-agent."
        ) from None
    except socket.gaierror:
        client.close()
        raise ToolError(f"{host}: unknown host name {settings.hostname}. Check the Host/HostName in ~/.ssh/config.") from None
    except TimeoutError:
        client.close()
        if jump:
            jump.close()
        raise ToolError(
            f"{host}: host unreachable: no answer from {where} within {settings.connect_timeout:g} s. "
            "Check VPN/network, HostName and Port."
        ) from None
    except (OSError, EOFError) as exc:
        client.close()
        if jump:
            jump.close()
        refused = isinstance(exc, (ConnectionRefusedError, paramiko.ssh_exception.NoValidConnectionsError))
        reason = "connection refused (nothing listens there)" if refused else str(exc) or type(exc).__name__
        raise ToolError(f"{host}: host unreachable: {where}: {reason}. Check HostName, Port and that sshd runs.") from None
    server_key = client.get_transport().get_remote_server_key()  # type: ignore[union-attr]
    return Connection(client, settings, fingerprint(server_key), check.added, jump, check.note)


_pool: dict[tuple[str, str], Connection] = {}
_pool_lock = threading.Lock()
_host_locks: dict[tuple[str, str], threading.Lock] = {}  # a slow connect to one host never blocks another


def _pooled(host: str) -> Connection:
    key = (str(ssh_config_path()), host)
    with _pool_lock:
        host_lock = _host_locks.setdefault(key, threading.Lock())
    with host_lock:
        conn = _pool.get(key)
        if conn is not None and conn.alive():
            return conn
        if conn is not None:
            conn.close()
        conn = open_connection(host)
        with _pool_lock:
            _pool[key] = conn
        return conn


def _drop(host: str) -> None:
    with _pool_lock:
        conn = _pool.pop((str(ssh_config_path()), host), None)
    if conn is not None:
        conn.close()


@contextmanager
def connect(host: str, trust_host_key: bool = False) -> Iterator[paramiko.SSHClient]:
    """A fresh SSH connection to `host` (an ssh config alias), closed when the block ends."""
    conn = open_connection(host, trust_host_key)
    try:
        yield conn.client
    finally:
        conn.close()


# --- commands ---------------------------------------------------------------------------------------


class _Tail:
    """Keeps the last OUTPUT_LIMIT bytes of a stream."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > OUTPUT_LIMIT:
            del self.data[: len(self.data) - OUTPUT_LIMIT]
            self.truncated = True

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


def run_remote(host: str, command: str, timeout: float = 60) -> RemoteResult:
    """Run a shell command on `host` (or `local`); the last OUTPUT_LIMIT bytes of each stream come back.

    Raises ToolError when the host cannot be reached, the command outlives `timeout` seconds, or the
    connection drops before the command ends. A non-zero exit code is a result, not an error.
    """
    if host == LOCAL:
        return _run_local(command, timeout)
    conn = _pooled(host)
    transport = conn.client.get_transport()
    try:
        channel = transport.open_session(timeout=conn.settings.connect_timeout)  # type: ignore[union-attr]
        channel.exec_command(command)
    except Exception as exc:  # the pooled transport died between alive() and here
        _drop(host)
        raise ToolError(f"{host}: connection lost before the command started ({exc or type(exc).__name__}). Call again.") from None
    out, err = _Tail(), _Tail()
    deadline = time.monotonic() + timeout
    try:
        # A dead transport also marks its channels finished (exit status -1): checked after the loop.
        while not (channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready()):
            busy = False
            while channel.recv_ready():
                out.add(channel.recv(65536))
                busy = True
            while channel.recv_stderr_ready():
                err.add(channel.recv_stderr(65536))
                busy = True
            if time.monotonic() > deadline:
                raise ToolError(f"{host}: command did not finish within {timeout:g} s and was abandoned. Retry, or raise the timeout.")
            if not busy:
                time.sleep(0.02)
        exit_code = channel.recv_exit_status()
    finally:
        channel.close()
    if exit_code == -1 and not transport.is_active():  # type: ignore[union-attr]
        _drop(host)
        raise ToolError(
            f"{host}: the SSH connection dropped while running the command. Call again (a new connection is opened); "
            "check the command's effect first if it changes something."
        )
    return RemoteResult(exit_code, out.text(), err.text(), out.truncated or err.truncated)


def _run_local(command: str, timeout: float) -> RemoteResult:
    try:
        done = subprocess.run(["bash", "-c", command], capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise ToolError(f"local: command did not finish within {timeout:g} s. Retry, or raise the timeout.") from None
    out, err = _Tail(), _Tail()
    out.add(done.stdout)
    err.add(done.stderr)
    return RemoteResult(done.returncode, out.text(), err.text(), out.truncated or err.truncated)


def tail_remote(host: str, path: str, lines: int = 200) -> str:
    """The last `lines` lines of a file on `host` (bounded by OUTPUT_LIMIT bytes)."""
    result = run_remote(host, f"tail -n {int(lines)} -- {shlex.quote(path)}", timeout=60)
    if result.exit_code != 0:
        raise ToolError(f"{host}:{path}: cannot read ({result.stderr.strip()[-300:]}). Check the path.")
    return result.stdout


def fetch_tree(host: str, remote_dir: str, local_dir: Path, patterns: list[str], max_files: int = 2000) -> list[Path]:
    """Copy the files under `remote_dir` whose relative path matches one of the glob `patterns`.

    Every directory is mirrored, empty or not: a failed run's task directory (logs/ holding only big logs) is
    still a task directory here. Returns the local paths written. SFTP over the pooled connection; `local` copies.
    """
    local_dir = Path(local_dir)
    matches = lambda rel: any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel.rsplit("/", 1)[-1], p) for p in patterns)  # noqa: E731
    written: list[Path] = []
    if host == LOCAL:
        root = Path(remote_dir)
        if not root.is_dir():
            raise ToolError(f"local:{remote_dir}: not a directory. Check the path.")
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root).as_posix()
            if path.is_dir():
                (local_dir / rel).mkdir(parents=True, exist_ok=True)
            elif path.is_file() and matches(rel) and len(written) < max_files:
                target = local_dir / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
                written.append(target)
        return written
    sftp = _pooled(host).client.open_sftp()
    try:
        stack = [""]
        while stack and len(written) < max_files:
            rel_dir = stack.pop()
            remote = f"{remote_dir.rstrip('/')}/{rel_dir}" if rel_dir else remote_dir
            try:
                entries = sftp.listdir_attr(remote)
            except OSError as exc:
                raise ToolError(f"{host}:{remote}: cannot list ({exc}). Check the path.") from None
            for entry in sorted(entries, key=lambda e: e.filename):
                rel = f"{rel_dir}/{entry.filename}" if rel_dir else entry.filename
                if stat.S_ISDIR(entry.st_mode or 0):
                    (local_dir / rel).mkdir(parents=True, exist_ok=True)
                    stack.append(rel)
                elif stat.S_ISREG(entry.st_mode or 0) and matches(rel) and len(written) < max_files:
                    target = local_dir / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    sftp.get(f"{remote_dir.rstrip('/')}/{rel}", str(target))
                    written.append(target)
    finally:
        sftp.close()
    return written


# --- ssh_check --------------------------------------------------------------------------------------

PROBED_COMMANDS = ["sbatch", "squeue", "sacct", "srun", "enroot", "docker", "rsync"]


class SshCheckInput(StrictModel):
    host: str = Field(description="ssh config alias (or user@alias); 'local': this machine.")
    trust_host_key: bool = Field(
        False,
        description="Trust an unknown or changed host key; only after the person confirmed its fingerprint.",
    )


class SshCheckResult(BaseModel):
    host: str
    hostname: str = Field(description="Address connected to (after ssh config).")
    port: int
    user: str = Field(description="User logged in as, reported by the host (whoami).")
    remote_hostname: str = Field(description="The host's own name (hostname).")
    via_proxy_jump: str | None
    host_key_fingerprint: str | None = Field(description="SHA256 fingerprint of the server's host key (null for local).")
    host_key_added: bool = Field(description="True when this call wrote the host key into known_hosts (trust_host_key).")
    known_hosts_file: str | None
    commands: dict[str, bool] = Field(description="Whether each of sbatch, squeue, sacct, srun, enroot, docker, rsync is on the host's PATH.")
    latency_ms: float = Field(description="Round trip of one trivial command on the open connection.")
    notes: list[str]


def ssh_check(request: SshCheckInput, progress: ProgressFn = no_progress) -> SshCheckResult:
    """Use first for a cluster host, and when a remote tool cannot connect: identity, SLURM and container commands,
    latency, or what is wrong.
    """
    progress(0, 3, f"connecting to {request.host}")
    probe = "whoami; hostname; " + "".join(
        f"command -v {c} >/dev/null 2>&1 && echo have:{c}; " for c in PROBED_COMMANDS
    )
    settings: HostSettings | None = None
    fingerprint_text: str | None = None
    added = False
    key_note: str | None = None
    if request.host == LOCAL:
        result = _run_local(probe, 30)
    else:
        conn = open_connection(request.host, request.trust_host_key)
        settings = conn.settings
        fingerprint_text, added, key_note = conn.host_key_fingerprint, conn.host_key_added, conn.host_key_note
        key = (str(ssh_config_path()), request.host)
        with _pool_lock:
            old = _pool.pop(key, None)
            _pool[key] = conn
        if old is not None:
            old.close()
        progress(1, 3, "probing commands")
        result = run_remote(request.host, probe, timeout=30)
    if result.exit_code != 0 and not result.stdout:
        raise ToolError(f"{request.host}: the probe command failed ({result.stderr.strip()[-300:]}). Check the login shell.")
    lines = result.stdout.splitlines()
    progress(2, 3, "measuring latency")
    started = time.monotonic()
    run_remote(request.host, "true", timeout=30)
    latency = (time.monotonic() - started) * 1000
    commands = {c: f"have:{c}" in lines for c in PROBED_COMMANDS}
    notes: list[str] = []
    if key_note:
        notes.append(key_note)
    if not commands["sbatch"]:
        notes.append("No sbatch on PATH: not a SLURM login node (NEL's slurm executor cannot submit here).")
    if not commands["enroot"]:
        notes.append("No enroot: fine on a login node; compute nodes need pyxis/enroot for NEL's containers.")
    progress(3, 3, "done")
    return SshCheckResult(
        host=request.host,
        hostname=settings.hostname if settings else LOCAL,
        port=settings.port if settings else 0,
        user=lines[0] if lines else "",
        remote_hostname=lines[1] if len(lines) > 1 else "",
        via_proxy_jump=settings.proxy_jump if settings else None,
        host_key_fingerprint=fingerprint_text,
        host_key_added=added,
        known_hosts_file=str(settings.known_hosts_files[0]) if settings else None,
        commands=commands,
        latency_ms=round(latency, 1),
        notes=notes,
    )


# --- SLURM ------------------------------------------------------------------------------------------
# The one place quanteval calls squeue, sacct, scontrol, sacctmgr, sbatch and scancel and reads what they
# print: runs, deploy and the tools below all come here, over the same pooled SSH connection. (NEL's own
# SLURM executor still runs `ssh`/`sbatch` itself.)

_JOB_ID = re.compile(r"^\d+(_\d+)?$")
_USER = re.compile(r"^[A-Za-z0-9._][A-Za-z0-9._-]*$")
# '|'-separated; the pending reason / node list (%R) is free text, so it comes last.
_SQUEUE_FORMAT = "%i|%j|%u|%T|%P|%M|%l|%D|%E|%R"
_SACCT_FIELDS = "JobID,JobName,User,State,Partition,Elapsed,Timelimit,NNodes,ExitCode"
# Job states in which a job still holds or waits for resources.
ACTIVE_JOB_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                               "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT"})


class SlurmJob(BaseModel):
    job_id: str
    name: str
    user: str
    state: str = Field(description="SLURM state: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, ...")
    partition: str
    elapsed: str
    time_limit: str
    nodes: str
    reason: str | None = Field(None, description="Pending reason or node list (squeue %R).")
    dependency: str | None = Field(None, description="Remaining dependency, e.g. afternotok:1234(unfulfilled) (squeue %E).")
    exit_code: str | None = Field(None, description="exit:signal, for finished jobs from sacct.")
    source: Literal["squeue", "sacct", "sacct -c"]


def slurm_error(host: str, command: str, stderr: str) -> ToolError:
    """A failed SLURM command as an error a person can act on (not a login node, no config, controller down)."""
    text = stderr.strip()[-400:]
    if "command not found" in text:
        return ToolError(f"{host}: {command} not found. Use a SLURM login node (check with ssh_check).")
    if "configuration source" in text or "Unable to process configuration file" in text:
        return ToolError(
            f"{host}: {command} finds no usable SLURM configuration (slurm.conf missing or broken). Use the "
            f"cluster's login node, or point SLURM_CONF there at the cluster's slurm.conf. ({text[-200:]})"
        )
    if re.search(r"Unable to contact slurm controller|Socket timed out|Connection refused|Zero Bytes", text, re.I):
        return ToolError(
            f"{host}: SLURM controller not answering ({text}). Transient if slurmctld is restarting: call again in a minute."
        )
    return ToolError(f"{host}: {command} failed: {text}")


def _check_ids(job_ids: list[str] | tuple[str, ...]) -> None:
    bad = [j for j in job_ids if not _JOB_ID.match(j)]
    if bad:
        raise ToolError(f"job_ids: {bad} are not SLURM job ids. Use numbers like '1234' or array ids like '1234_5'.")


def _check_user(user: str | None) -> None:
    if user is not None and not _USER.match(user):
        raise ToolError(f"user: '{user}' is not a user name. Use a plain login name.")


def squeue(host: str, *, user: str | None = None, job_ids: list[str] | tuple[str, ...] = (),
           all_states: bool = False) -> list[SlurmJob]:
    """Jobs SLURM's queue knows (with all_states, also those finished within MinJobAge)."""
    _check_ids(job_ids)
    _check_user(user)
    filters = (f" -u {user}" if user else "") + (f" -j {','.join(job_ids)}" if job_ids else "")
    result = run_remote(host, f"squeue -h{' -t all' if all_states else ''} -o '{_SQUEUE_FORMAT}'{filters}", timeout=90)
    if result.exit_code != 0:
        # squeue -j with only unknown (long finished) ids fails with "Invalid job id"; sacct may still know them.
        if job_ids and "Invalid job id" in result.stderr:
            return []
        raise slurm_error(host, "squeue", result.stderr)
    jobs = []
    for line in result.stdout.splitlines():
        parts = line.split("|", 9)
        if len(parts) != 10:
            continue
        job_id, name, user_name, state, partition, elapsed, limit, nodes, dependency, reason = parts
        jobs.append(SlurmJob(job_id=job_id, name=name, user=user_name, state=state, partition=partition,
                             elapsed=elapsed, time_limit=limit, nodes=nodes, reason=reason or None,
                             dependency=dependency if dependency not in ("", "(null)") else None, source="squeue"))
    return jobs


def sacct(host: str, *, user: str | None = None, job_ids: list[str] | tuple[str, ...] = ()
          ) -> tuple[Literal["sacct", "sacct -c"] | None, list[SlurmJob], str | None]:
    """Finished jobs from accounting, or from the job completion log (`sacct -c`) when accounting is off.

    Returns (source, jobs, note); source is None and note says why when neither answered.
    """
    _check_ids(job_ids)
    _check_user(user)
    filters = (f" -u {user}" if user else " -a") + (f" -j {','.join(job_ids)}" if job_ids else "")
    result = run_remote(host, f"sacct -n -P -X -o {_SACCT_FIELDS}{filters}", timeout=90)
    source: Literal["sacct", "sacct -c"] = "sacct"
    if result.exit_code != 0 and "accounting storage is disabled" in result.stderr.lower():
        source = "sacct -c"
        result = run_remote(host, f"sacct -c -n -P -o {_SACCT_FIELDS}", timeout=90)
    if result.exit_code != 0:
        return None, [], f"finished jobs unavailable: {source} failed ({result.stderr.strip()[-200:]})"
    jobs = []
    for line in result.stdout.splitlines():
        parts = line.split("|")
        if len(parts) != 9 or "." in parts[0]:  # job steps (1234.batch) are not jobs
            continue
        job_id, name, user_name, state, partition, elapsed, limit, nodes, exit_code = parts
        user_name = user_name.split("(")[0]  # sacct -c prints root(0)
        if source == "sacct -c" and ((user and user_name != user) or (job_ids and job_id not in job_ids)):
            continue  # sacct -c ignores -u/-j
        jobs.append(SlurmJob(job_id=job_id, name=name, user=user_name, state=(state.split() or ["UNKNOWN"])[0],
                             partition=partition, elapsed=elapsed, time_limit=limit, nodes=nodes, exit_code=exit_code,
                             source=source))
    note = "accounting storage is off on this cluster; finished jobs come from the job completion log (sacct -c)" if source == "sacct -c" else None
    return source, jobs, note


def job_states(host: str, job_ids: list[str], *, user: str | None = None) -> dict[str, SlurmJob]:
    """What SLURM knows about these jobs: the queue first, accounting for those it has forgotten."""
    jobs = {job.job_id: job for job in squeue(host, user=user, job_ids=job_ids, all_states=True)}
    forgotten = [job_id for job_id in job_ids if job_id not in jobs]
    if forgotten:
        _, finished, _ = sacct(host, job_ids=forgotten)
        jobs.update({job.job_id: job for job in finished if job.job_id in forgotten})
    return jobs


def scancel(host: str, job_ids: list[str]) -> None:
    """Cancel jobs; cancelling one that already ended is not an error."""
    _check_ids(job_ids)
    if not job_ids:
        return
    result = run_remote(host, f"scancel {' '.join(job_ids)}", timeout=60)
    if result.exit_code != 0 and "Invalid job id" not in result.stderr and "already completing or completed" not in result.stderr:
        raise slurm_error(host, "scancel", result.stderr)


def sbatch(host: str, directory: str, script: str, file_name: str = "job.sbatch") -> tuple[str, str]:
    """Write `script` into `directory` (created; relative to the login home) and submit it from there.

    Returns (job id, absolute directory). A rejected submission raises ToolError with sbatch's reason.
    """
    marker = "QUANTEVAL_EOF"
    if marker in script or not re.fullmatch(r"[\w.-]+", file_name):
        raise ToolError(f"sbatch: the job script cannot contain {marker} and {file_name!r} must be a plain file name.")
    quoted = shlex.quote(directory)
    command = (f"mkdir -p {quoted} && cd {quoted} && cat > {file_name} <<'{marker}'\n{script}{marker}\n"
               f"sbatch --parsable {file_name} && pwd")
    result = run_remote(host, command, timeout=90)
    if result.exit_code != 0:
        raise ToolError(f"sbatch on {host} failed: {result.stderr.strip()[-500:]}")
    job_line, absolute_dir = (result.stdout.strip().splitlines() + ["", ""])[:2]
    return job_line.split(";")[0].strip(), absolute_dir


# --- slurm_queue ------------------------------------------------------------------------------------


class SlurmQueueInput(StrictModel):
    host: str = Field(description="SLURM login host (ssh alias), or 'local'.")
    user: str | None = Field(None, description="Only this user's jobs.")
    job_ids: list[str] = Field(default_factory=list, description="Only these job ids, e.g. ['1234', '1235_7'].")
    include_finished: bool = Field(
        False, description="Also finished jobs (sacct)."
    )
    limit: int = Field(50, ge=1, le=500, description="Jobs per page.")
    offset: int = Field(0, ge=0, description="Jobs to skip (next_offset of the last page).")


class SlurmQueueResult(BaseModel):
    host: str
    jobs: list[SlurmJob]
    total: int = Field(description="Jobs matching the filters, over all pages.")
    offset: int
    next_offset: int | None = Field(description="Offset of the next page; null when this is the last page.")
    finished_source: Literal["sacct", "sacct -c"] | None = Field(description="Where finished jobs came from, when asked for.")
    notes: list[str]


def slurm_queue(request: SlurmQueueInput, progress: ProgressFn = no_progress) -> SlurmQueueResult:
    """Use to see a host's SLURM queue: jobs by user and ids, with state, pending reason and exit code. Paginated."""
    _check_ids(request.job_ids)
    _check_user(request.user)
    progress(0, 2, f"squeue on {request.host}")
    jobs = {job.job_id: job for job in squeue(request.host, user=request.user, job_ids=request.job_ids,
                                              all_states=request.include_finished)}
    notes: list[str] = []
    finished_source: Literal["sacct", "sacct -c"] | None = None
    if request.include_finished:
        progress(1, 2, f"sacct on {request.host}")
        finished_source, finished, note = sacct(request.host, user=request.user, job_ids=request.job_ids)
        if note:
            notes.append(note)
        for job in finished:
            if job.job_id in jobs:  # squeue still remembers it; sacct adds the exit code
                jobs[job.job_id].exit_code = job.exit_code
            else:
                jobs[job.job_id] = job
    ordered = sorted(jobs.values(), key=lambda j: _job_sort_key(j.job_id), reverse=True)
    page = ordered[request.offset : request.offset + request.limit]
    end = request.offset + len(page)
    progress(2, 2, "done")
    return SlurmQueueResult(
        host=request.host, jobs=page, total=len(ordered), offset=request.offset, next_offset=end if end < len(ordered) else None,
        finished_source=finished_source, notes=notes,
    )


def _job_sort_key(job_id: str) -> tuple[int, int]:
    base, _, task = job_id.partition("_")
    return (int(base) if base.isdigit() else 0, int(task) if task.isdigit() else -1)


# --- cluster_info -----------------------------------------------------------------------------------

# GPU type names as clusters spell them in GRES (h100, nvidia_h100_80gb_hbm3, gb200, ...) -> the GPU
# names quanteval sizes and checks formats for (frameworks.GPUS). First match wins.
GPU_NAME_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"b200|b100|gb200|b300|blackwell", re.I), "B200"),
    (re.compile(r"h200", re.I), "H200"),
    (re.compile(r"h100|h800|gh200|hopper", re.I), "H100"),
    (re.compile(r"l40s", re.I), "L40S"),
    (re.compile(r"a100|a800|ampere", re.I), "A100"),
]
_GRES_GPU = re.compile(r"(?:^|,)gpu:(?:([^:,()]+):)?(\d+)")
_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z_:]*)=")
# sinfo's compact node states a job can start on now; a suffix (* not responding, ~ powered off, ...) says otherwise.
_USABLE_NODE_STATES = {"idle", "mix", "alloc", "comp"}
# Nodes come from sinfo, grouped (partition, node count, state, GRES, features): one line per kind of node, so a
# cluster of thousands of nodes answers in a few lines (scontrol show node would be megabytes).
_CLUSTER_SCRIPT = (
    "echo @@user; whoami; echo @@partitions; scontrol -o show partition 2>&1; echo \"@@rc $?\"; "
    "echo @@nodes; sinfo -h -o '%R|%D|%t|%G|%f' 2>&1; echo \"@@rc $?\"; "
    # sacctmgr needs slurmdbd; without it the answer is an error, which is fine: accounts stay unknown.
    "echo @@accounts; timeout 15 sacctmgr -n -P show assoc where user=\"$(whoami)\" format=Account,Partition 2>&1; "
    "echo \"@@rc $?\""
)


def gpu_model(name: str | None) -> str | None:
    """quanteval's GPU name (H100, B200, ...) for a GRES type or node feature, or None when unknown."""
    return next((model for pattern, model in GPU_NAME_PATTERNS if name and pattern.search(name)), None)


def slurm_seconds(text: str | None) -> int | None:
    """SLURM's time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds; None for UNLIMITED/NONE."""
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE", "N/A"):
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not match:
        raise ValueError(f"not a SLURM time: {text!r}")
    days, first, second, third = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        hours, minutes, seconds = int(first), int(second or 0), int(third or 0)
    elif third is not None:  # HH:MM:SS
        hours, minutes, seconds = int(first), int(second), int(third)
    else:  # MM[:SS]
        hours, minutes, seconds = 0, int(first), int(second or 0)
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def slurm_time(seconds: int) -> str:
    """Seconds as SLURM's [D-]HH:MM:SS."""
    days, rest = divmod(int(seconds), 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _fields(line: str) -> dict[str, str]:
    """`scontrol -o` key=value pairs; a value runs to the next key (values such as OS= hold spaces)."""
    keys = list(_KEY.finditer(line))
    return {match.group(1): line[match.end(): keys[i + 1].start() if i + 1 < len(keys) else len(line)].strip()
            for i, match in enumerate(keys)}


class GpuGroup(BaseModel):
    gres_type: str | None = Field(description="GPU type as SLURM names it in GRES (e.g. h100); null when untyped (gres gpu:8).")
    gpu_model: str | None = Field(description="quanteval's name for it (H100, H200, B200, A100, L40S); null when not recognised.")
    gpus_per_node: int
    nodes: int


class PartitionInfo(BaseModel):
    name: str
    default: bool = Field(description="The partition jobs land in when none is named.")
    state: str = Field(description="UP, DOWN, DRAIN or INACTIVE.")
    max_time: str = Field(description="Walltime limit as SLURM prints it (UNLIMITED when none).")
    max_time_s: int | None = Field(description="Walltime limit in seconds; null when unlimited.")
    default_time_s: int | None = Field(description="Walltime a job gets when it asks for none; null when the limit applies.")
    nodes: int
    usable_nodes: int = Field(description="Nodes that are up and not drained (idle, mixed or allocated).")
    gpus_per_node: int = Field(description="GPUs of the partition's largest node (0: no GPU GRES).")
    gpus: list[GpuGroup] = Field(description="GPU kinds in the partition, by node count.")
    gpu_model: str | None = Field(description="The one GPU model of every node, null when none, mixed or unrecognised.")
    features: list[str] = Field(description="Node features (usable with --constraint).")
    allowed_accounts: list[str] | None = Field(description="Accounts allowed to submit here; null when all are.")


class ClusterInfoInput(StrictModel):
    host: str = Field(description="SLURM login host (ssh alias), or 'local'.")
    partition: str | None = Field(None, pattern=r"^[\w.-]+$", description="Only this partition (default: all).")


class ClusterInfo(BaseModel):
    host: str
    user: str = Field(description="Login user on the cluster.")
    partitions: list[PartitionInfo]
    default_partition: str | None
    accounts: list[str] | None = Field(description="SLURM accounts this user may charge (sacctmgr); null when not visible.")
    query_s: float = Field(description="Seconds the cluster took to answer (one SSH round trip).")
    notes: list[str]


def describe_cluster(host: str) -> ClusterInfo:
    """Partitions with their GPUs, time limits and node states, and the user's accounts, in one SSH round trip."""
    started = time.monotonic()
    result = run_remote(host, _CLUSTER_SCRIPT, timeout=90)
    elapsed = time.monotonic() - started
    partition_lines, partition_rc = _section_lines(result.stdout, "partitions")
    node_lines, node_rc = _section_lines(result.stdout, "nodes")
    for lines, code in ((partition_lines, partition_rc), (node_lines, node_rc)):
        if code != 0:
            raise slurm_error(host, "scontrol", "\n".join(lines) or result.stderr)
    groups = [_NodeGroup.parse(line) for line in node_lines if line.count("|") == 4]
    partitions = []
    for line in partition_lines:
        if not line.startswith("PartitionName="):
            continue
        fields = _fields(line)
        partitions.append(_partition(fields, [g for g in groups if g and g.partition == fields["PartitionName"]]))
    user_lines, _ = _section_lines(result.stdout, "user")
    account_lines, account_rc = _section_lines(result.stdout, "accounts")
    notes: list[str] = []
    accounts: list[str] | None = None
    if account_rc == 0:
        accounts = sorted({line.split("|")[0] for line in account_lines if line.split("|")[0]})
    else:
        reason = (" ".join(account_lines) or "no answer")[:200]
        notes.append(f"Accounts not visible (sacctmgr: {reason}); ask the cluster admins which account to charge.")
    default = next((p.name for p in partitions if p.default), None)
    return ClusterInfo(host=host, user=user_lines[0] if user_lines else "", partitions=partitions,
                       default_partition=default, accounts=accounts, query_s=round(elapsed, 3), notes=notes)


def _section_lines(stdout: str, name: str) -> tuple[list[str], int | None]:
    """The lines printed under @@name and the exit code that followed them (None when none was printed)."""
    marker = f"@@{name}\n"
    if marker not in stdout:
        return [], None
    text = stdout.split(marker, 1)[1]
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("@@rc "):
            return lines, int(line[5:]) if line[5:].isdigit() else None
        if line.startswith("@@"):
            return lines, None
        if line:
            lines.append(line)
    return lines, None


@dataclass(frozen=True)
class _NodeGroup:
    """One sinfo line: `count` nodes of a partition with the same state, GRES and features."""

    partition: str
    count: int
    state: str
    gres: str
    features: tuple[str, ...]

    @classmethod
    def parse(cls, line: str) -> _NodeGroup | None:
        partition, count, state, gres, features = line.split("|")
        if not count.isdigit():
            return None
        return cls(partition, int(count), state, gres,
                   tuple(f for f in features.split(",") if f and f != "(null)"))

    @property
    def usable(self) -> bool:
        return self.state in _USABLE_NODE_STATES  # a suffixed state (down*, idle~, drain) is not in the set


def _partition(fields: dict[str, str], members: list[_NodeGroup]) -> PartitionInfo:
    counts: dict[tuple[str | None, int], int] = {}
    models: dict[str | None, str | None] = {}
    for group in members:
        for gres_type, count in _GRES_GPU.findall(group.gres):
            key = (gres_type or None, int(count))
            counts[key] = counts.get(key, 0) + group.count
            # Untyped GRES (gpu:8): the model may be named by a node feature instead (Feature=h100).
            feature_models = {gpu_model(f) for f in group.features} - {None}
            models[gres_type or None] = gpu_model(gres_type) or (feature_models.pop() if len(feature_models) == 1 else None)
    gpus = sorted((GpuGroup(gres_type=gres_type, gpu_model=models.get(gres_type), gpus_per_node=per_node, nodes=n)
                   for (gres_type, per_node), n in counts.items()), key=lambda g: -g.nodes)
    total = sum(group.count for group in members)
    distinct_models = {g.gpu_model for g in gpus}
    allowed = fields.get("AllowAccounts", "ALL")
    max_time = fields.get("MaxTime", "UNLIMITED")
    return PartitionInfo(
        name=fields["PartitionName"], default=fields.get("Default") == "YES", state=fields.get("State", "UNKNOWN"),
        max_time=max_time, max_time_s=_seconds_or_none(max_time), default_time_s=_seconds_or_none(fields.get("DefaultTime")),
        nodes=total, usable_nodes=sum(group.count for group in members if group.usable),
        gpus_per_node=max((g.gpus_per_node for g in gpus), default=0), gpus=gpus,
        gpu_model=next(iter(distinct_models)) if len(distinct_models) == 1 and sum(g.nodes for g in gpus) == total else None,
        features=sorted({f for group in members for f in group.features}),
        allowed_accounts=None if allowed == "ALL" else allowed.split(","),
    )


def _seconds_or_none(text: str | None) -> int | None:
    try:
        return slurm_seconds(text)
    except ValueError:
        return None


def cluster_info(request: ClusterInfoInput, progress: ProgressFn = no_progress) -> ClusterInfo:
    """Use before filling a SLURM config, or when sbatch refuses a job: partitions (state, time limit, nodes, GPUs per node
    and type) and your accounts.
    """
    progress(0, 1, f"scontrol on {request.host}")
    info = describe_cluster(request.host)
    if request.partition:
        chosen = [p for p in info.partitions if p.name == request.partition]
        if not chosen:
            names = ", ".join(p.name for p in info.partitions) or "none"
            raise ToolError(f"partition: '{request.partition}' does not exist on {request.host}. Partitions: {names}.")
        info.partitions = chosen
    progress(1, 1, "done")
    return info


# --- remote_grep ------------------------------------------------------------------------------------



class RemoteGrepInput(StrictModel):
    host: str = Field(description="ssh alias, or 'local'.")
    path: str = Field(description="File or directory (recursive) on that host.")
    patterns: list[str] = Field(
        min_length=1,
        description="grep -E patterns; a line matching any is reported.",
    )
    ignore_case: bool = Field(True, description="Match regardless of case.")
    max_lines: int = Field(50, ge=1, le=1000, description="Most matching lines to return; the rest are counted.")


class GrepMatch(BaseModel):
    file: str
    line: int
    text: str = Field(description=f"The matching line, cut to {failures.MAX_LINE_CHARS} characters.")


class RemoteGrepResult(BaseModel):
    host: str
    path: str
    matches: list[GrepMatch]
    truncated: bool = Field(description="More lines matched than max_lines.")
    notes: list[str]


def remote_grep(request: RemoteGrepInput, progress: ProgressFn = no_progress) -> RemoteGrepResult:
    """Use to find errors in a host's files without copying them: grep -E over a file or folder; matches with file:line.
    """
    if any("\n" in p or "\0" in p for p in request.patterns):
        raise ToolError("patterns: a pattern contains a newline or NUL. Pass one line per pattern.")
    if "\0" in request.path:
        raise ToolError("path: contains a NUL byte. Pass a plain path.")
    progress(0, 1, f"grep on {request.host}")
    args = ["grep", "-rnHIZ", "-E"] + (["-i"] if request.ignore_case else [])
    for pattern in request.patterns:
        args += ["-e", pattern]  # -e: a pattern starting with '-' stays a pattern
    args += ["--", request.path]  # --: a path starting with '-' stays a path
    grep = " ".join(shlex.quote(a) for a in args)
    # Matches are cut at max_lines+1 by head; grep's own exit status is reported as the last stderr line.
    script = f'{grep} | head -n {request.max_lines + 1}; echo "::grep-exit:${{PIPESTATUS[0]}}" >&2'
    result = run_remote(request.host, f"bash -c {shlex.quote(script)}", timeout=120)
    stderr, _, status = result.stderr.rstrip().rpartition("::grep-exit:")
    stderr = stderr.strip()[-300:]
    # grep exits 1 for "no match" and 141 (SIGPIPE) when head stopped reading: more matches than asked for.
    if (not status.isdigit() or int(status) not in (0, 1, 141)) and not result.stdout:
        raise ToolError(f"{request.host}:{request.path}: grep failed ({stderr or result.stderr.strip()[-300:]}). Check the path and patterns.")
    matches = []
    for raw in result.stdout.splitlines():
        file, sep, rest = raw.partition("\0")
        number, _, text = rest.partition(":")
        if not sep or not number.isdigit():
            continue
        matches.append(GrepMatch(file=file, line=int(number), text=text[:failures.MAX_LINE_CHARS]))
    truncated = len(matches) > request.max_lines
    notes = [f"grep reported: {stderr}"] if stderr else []
    progress(1, 1, "done")
    return RemoteGrepResult(host=request.host, path=request.path, matches=matches[: request.max_lines], truncated=truncated, notes=notes)


# --- check_registry_credentials ---------------------------------------------------------------------

# Runs on the host: reads the netrc-style enroot credentials file and prints only machine names and
# whether a login/password is present. Secrets never leave the host, so they cannot leak here.
_CREDENTIALS_SCRIPT = r"""
f="${ENROOT_CONFIG_PATH:-$HOME/.config/enroot}/.credentials"
echo "file:$f"
[ -e "$f" ] || { echo "missing"; exit 0; }
[ -r "$f" ] || { echo "unreadable"; exit 0; }
echo "mode:$(stat -c %a "$f")"
awk '
  { for (i = 1; i <= NF; i++) {
      if (skip) { skip = 0; continue }
      if ($i == "machine") { if (m != "") print "entry:" m ":" l ":" p; m = $(i+1); l = 0; p = 0; i++ }
      else if ($i == "default") { if (m != "") print "entry:" m ":" l ":" p; m = "(default)"; l = 0; p = 0 }
      else if ($i == "login") { l = 1; skip = 1 }
      else if ($i == "password") { p = 1; skip = 1 }
  } }
  END { if (m != "") print "entry:" m ":" l ":" p }' "$f"
"""


class CheckRegistryCredentialsInput(StrictModel):
    host: str = Field(description="ssh alias, or 'local'.")
    registry: str | None = Field(
        None, description="Registry that must have an entry, e.g. 'nvcr.io'."
    )


class RegistryEntry(BaseModel):
    machine: str = Field(description="Registry host named in the file.")
    has_login: bool
    has_password: bool


class RegistryCredentialsResult(BaseModel):
    host: str
    credentials_file: str = Field(description="Path of the enroot credentials file on the host.")
    exists: bool
    entries: list[RegistryEntry] = Field(description="Registries with an entry. Never contains logins, passwords or tokens.")
    registry: str | None
    registry_ok: bool | None = Field(description="Whether `registry` has an entry with a password; null if no registry was asked for.")
    notes: list[str]


def check_registry_credentials(request: CheckRegistryCredentialsInput) -> RegistryCredentialsResult:
    """Use before a SLURM run pulls from nvcr.io or another private registry: the registries in the host's enroot
    credentials (names only).
    """
    if request.registry is not None and not re.fullmatch(r"[A-Za-z0-9.-]+(:\d+)?", request.registry):
        raise ToolError(f"registry: '{request.registry}' is not a registry host name. Use e.g. 'nvcr.io'.")
    result = run_remote(request.host, f"bash -c {shlex.quote(_CREDENTIALS_SCRIPT)}", timeout=30)
    lines = result.stdout.splitlines()
    path = next((line[5:] for line in lines if line.startswith("file:")), "~/.config/enroot/.credentials")
    notes: list[str] = []
    entries: list[RegistryEntry] = []
    exists = "missing" not in lines
    for line in lines:
        if line.startswith("entry:"):
            machine, login, password = line[6:].rsplit(":", 2)
            entries.append(RegistryEntry(machine=machine, has_login=login == "1", has_password=password == "1"))
        elif line.startswith("mode:") and line[5:].strip()[-2:] != "00":
            notes.append(f"{path} is readable by other users (mode {line[5:].strip()}); run chmod 600 on it.")
    if "unreadable" in lines:
        notes.append(f"{path} exists but cannot be read by this user.")
    if not exists:
        notes.append(
            f"{path} does not exist: enroot pulls from private registries will fail. Add lines like "
            "'machine nvcr.io login $oauthtoken password <NGC_API_KEY>' (mode 600)."
        )
    registry_ok = None
    if request.registry:
        wanted = request.registry.lower()
        registry_ok = any(e.machine.lower() == wanted and e.has_password for e in entries)
        if not registry_ok:
            notes.append(
                f"No entry with a password for {request.registry}: add 'machine {request.registry} login <user> "
                f"password <token>' to {path}."
            )
    return RegistryCredentialsResult(
        host=request.host, credentials_file=path, exists=exists, entries=entries, registry=request.registry,
        registry_ok=registry_ok, notes=notes,
    )
