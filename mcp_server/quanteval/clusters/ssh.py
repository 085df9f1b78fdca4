"""The SSH layer: host settings, connections and commands on a cluster's login node (paramiko).

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

`~` is the passwd home, as for OpenSSH, whatever $HOME says: the ssh config and known_hosts come from one home, the
one every ssh that NEL and nel-next run reads (ssh_home).

The host name `local` means this machine without SSH (commands run in a local bash); every other
name, `localhost` included, goes through SSH.

Other modules use `open_connection`, `run_remote`, `fetch_tree` (the SLURM client in clusters.slurm and
the tools in clusters.tools among them). Connections are kept open per host and reused (polling the queue
costs one round trip, not a handshake); a dead one is replaced on the next call.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from quanteval.models import ToolError

if TYPE_CHECKING:
    import paramiko

log = logging.getLogger(__name__)

LOCAL = "local"  # the host name that means this machine: run_remote runs its command here, without ssh
CONNECT_TIMEOUT = 10.0
OUTPUT_LIMIT = 256 * 1024  # bytes kept per stream (the tail) by run_remote
MAX_PROXY_HOPS = 4


def names_this_machine(host: str | None) -> bool:
    """A host given to a tool (a deployment's, a host:path's) that means this machine: none, or LOCAL."""
    return host in (None, LOCAL)


LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "::1", "[::1]", "0.0.0.0"})


def reaches_this_machine(host: str | None) -> bool:
    """A host whose files are this machine's files: none or LOCAL, a loopback name or address (`localhost`,
    `127.0.0.1`, `user@localhost:2222`), this machine's own name, or an ssh alias whose HostName is one of those.
    Under --root a path there is checked as a local one."""
    if names_this_machine(host):
        return True
    assert host is not None

    def here(name: str) -> bool:
        name = name.lower().strip("[]")
        return name in LOOPBACK_NAMES or name.startswith("127.") or name == socket.gethostname().lower()

    try:
        _, alias, _ = _split_host(host)
        return here(alias) or here(resolve_host(host).hostname)
    except (ToolError, OSError, subprocess.SubprocessError):
        return False  # not a host at all: nothing is read there


@dataclass(frozen=True)
class RemoteResult:
    exit_code: int
    stdout: str
    stderr: str
    truncated: bool = False  # True when a stream was longer than OUTPUT_LIMIT and only its tail is kept


# --- ssh config -------------------------------------------------------------------------------------


def ssh_home() -> Path:
    """The home OpenSSH reads ~/.ssh/config and known_hosts from and expands `~` with: the passwd entry's, never $HOME
    (`HOME=/x ssh -G host` still prints /<passwd home>/.ssh/known_hosts and ignores /x/.ssh/config). NEL's and
    nel-next's ssh, scp and rsync run that binary, so quanteval reads the same files they do: the config and the
    known_hosts of one home."""
    import pwd

    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def user_path(path: str) -> Path:
    """A path from the ssh config with `~` expanded as OpenSSH does (the passwd home)."""
    if path == "~" or path.startswith("~/"):
        return ssh_home() / path[2:]
    return Path(path).expanduser()  # ~otheruser: from the passwd database too


def ssh_config_path() -> Path:
    explicit = os.environ.get("QUANTEVAL_SSH_CONFIG")
    return user_path(explicit) if explicit else ssh_home() / ".ssh" / "config"


def ssh_config_hosts(config_path: Path | None = None) -> list[str]:
    """Host aliases of the ssh config the remote tools read (~/.ssh/config, or QUANTEVAL_SSH_CONFIG)."""
    path = config_path or ssh_config_path()
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    hosts: list[str] = []
    for line in lines:
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0].lower() == "host":
            hosts += [h for h in parts[1].split() if not any(c in h for c in "*?!")]
    return hosts


def host_problem(host: str) -> str | None:
    """Why `host` (`alias`, `user@alias`, `alias:port`) is not a host the remote tools know, or None: a Host alias of
    the ssh config is known; anything else is unverified (ssh would try it as a hostname; ssh_check tests it)."""
    if names_this_machine(host):
        return None
    _, alias, _ = _split_host(host)
    if alias in ssh_config_hosts():
        return None
    return (f"host '{host}' is no Host alias in {ssh_config_path()}: unverified (quanteval has not reached it). Add it "
            "there (HostName, User) and run ssh_check, or give an alias that is there.")


def default_known_hosts() -> Path:
    return ssh_home() / ".ssh" / "known_hosts"


DEV_NULL = Path("/dev/null")


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
    """-F for `ssh -G` with QUANTEVAL_SSH_CONFIG; none otherwise, so OpenSSH reads its own files (the passwd home's
    ~/.ssh/config and the system config), as every ssh NEL runs does."""
    return ["-F", str(ssh_config_path())] if os.environ.get("QUANTEVAL_SSH_CONFIG") else []


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
    tokens = {"%%": "%", "%d": str(ssh_home()), "%h": hostname, "%r": user, "%p": str(port), "%u": local.pw_name}
    path = re.sub(r"%[%dhrpu]", lambda m: tokens[m.group(0)], path)
    return str(user_path(path))


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
    known = [user_path(p) for value in entry.get("userknownhostsfile", []) for p in value.split()]
    global_known = [user_path(p) for value in entry.get("globalknownhostsfile", []) for p in value.split()]
    proxy = first("proxyjump", "none")
    return HostSettings(
        name=host,
        hostname=hostname,
        port=port,
        user=user,
        # ssh -G lists the default keys too when the config names none; OpenSSH skips those that do not exist.
        identity_files=tuple(p for p in identities if Path(p).is_file()),
        identities_only=first("identitiesonly", "no").lower() in ("yes", "true"),
        known_hosts_files=tuple(known) or (default_known_hosts(),),
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
    known_files = tuple(user_path(p) for p in known.split()) if known else (default_known_hosts(),)
    try:
        port = int(port_override or entry.get("port", 22))
        timeout = float(entry.get("connecttimeout", CONNECT_TIMEOUT))
    except ValueError as exc:
        raise ToolError(f"{config_file}: Host {alias}: {exc}. Fix Port/ConnectTimeout.") from None
    identities = tuple(str(user_path(p)) for p in entry.get("identityfile", []))
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


def open_connection(host: str, trust_host_key: bool = False, _jumps: list[str] | None = None, _hops: int = 0,
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
    jumps = _jumps if _jumps is not None else (settings.proxy_jump.split(",") if settings.proxy_jump else [])
    jump, sock = _open_jump(host, settings, jumps, trust_host_key, _hops) if jumps else (None, None)
    client = paramiko.SSHClient()
    if _changed_key is None:
        _load_known_hosts(client, settings)
    check = _HostKeyCheck(settings, trust_host_key, _changed_key)
    client.set_missing_host_key_policy(check.policy())
    where = f"{settings.hostname}:{settings.port}" + (f" via {','.join(jumps)}" if jump else "")
    try:
        _authenticate(client, settings, sock)
    except paramiko.BadHostKeyException as exc:
        _close(client, jump)
        return _on_changed_host_key(host, settings, exc, trust_host_key, _jumps, _hops, _changed_key)
    except ToolError:  # the host-key policy's refusal, already worded for a person
        _close(client, jump)
        raise
    except (paramiko.SSHException, OSError, EOFError) as exc:
        _close(client, jump)
        raise _connect_error(host, settings, where, exc) from None
    server_key = client.get_transport().get_remote_server_key()  # type: ignore[union-attr]
    return Connection(client, settings, fingerprint(server_key), check.added, jump, check.note)


def _open_jump(host: str, settings: HostSettings, jumps: list[str], trust_host_key: bool, hops: int
               ) -> tuple[Connection, paramiko.Channel]:
    """The last hop of the ProxyJump chain (reached through the ones before it) and a tunnel from it to `settings`."""
    import paramiko

    jump = open_connection(jumps[-1], trust_host_key, jumps[:-1] or None, hops + 1)
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
    return jump, sock


def _authenticate(client: paramiko.SSHClient, settings: HostSettings, sock: paramiko.Channel | None) -> None:
    """The handshake and login as the ssh config says: its keys, then the agent unless IdentitiesOnly forbids it."""
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


def _close(client: paramiko.SSHClient, jump: Connection | None) -> None:
    client.close()
    if jump is not None:
        jump.close()


def _on_changed_host_key(host: str, settings: HostSettings, exc: paramiko.BadHostKeyException, trust_host_key: bool,
                         jumps: list[str] | None, hops: int, changed_key: paramiko.PKey | None) -> Connection:
    """known_hosts holds another key for this host: connect again accepting it, replace the stored one, or refuse.

    StrictHostKeyChecking no accepts it without storing; trust_host_key replaces the stored key (with
    UserKnownHostsFile /dev/null there is none to replace: it is accepted, nothing stored); otherwise refused."""
    if not trust_host_key and settings.strict_host_key_checking == "no" and changed_key is None:
        return open_connection(host, False, jumps, hops, _changed_key=exc.key)
    if not trust_host_key:
        raise ToolError(
            f"{host}: HOST KEY CHANGED for {settings.known_hosts_name}: known_hosts ({_files(settings)}) has "
            f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)}, the server now offers "
            f"{exc.key.get_name()} {fingerprint(exc.key)}. This can be an attack; refused. If the server was "
            "really reinstalled, confirm the new fingerprint with its admin, then call again with "
            "trust_host_key=true to replace the old key."
        ) from None
    if not settings.persists_host_keys:  # /dev/null holds no old key to replace: accept this one, store nothing
        return open_connection(host, False, jumps, hops, _changed_key=exc.key)
    _save_host_key(settings, settings.known_hosts_name, exc.key)
    replaced = open_connection(host, False, jumps, hops)
    replaced.host_key_added = True
    replaced.host_key_note = f"Host key {fingerprint(exc.key)} was written to {settings.known_hosts_files[0]} (trust_host_key)."
    return replaced


def _connect_error(host: str, settings: HostSettings, where: str, exc: BaseException) -> ToolError:
    """Why a connection failed, worded for a person: authentication, no SSH answer, unknown name, unreachable."""
    import paramiko

    if isinstance(exc, paramiko.AuthenticationException) or (
            isinstance(exc, paramiko.SSHException) and "authentication" in str(exc).lower()):
        tried = ", ".join(settings.identity_files) or "default keys in ~/.ssh"
        return ToolError(
            f"{host}: authentication failed for user {settings.user} at {where} ({exc}). Tried: {tried}"
            f"{'' if settings.identities_only else ' and the ssh agent'}. Add the right IdentityFile/User for this "
            "Host in ~/.ssh/config or load the key into ssh-agent."
        )
    if isinstance(exc, paramiko.SSHException):
        if "banner" in str(exc).lower() or "no existing session" in str(exc).lower():
            # TCP connected, but the SSH handshake never happened: wrong port, wedged or overloaded sshd.
            return ToolError(
                f"{host}: host unreachable: no SSH answer from {where} within {settings.connect_timeout:g} s. "
                "Check that Port is sshd's port and the host is not overloaded."
            )
        return ToolError(f"{host}: host unreachable: {where}: {exc}. Check HostName, Port and that sshd runs.")
    if isinstance(exc, socket.gaierror):
        return ToolError(f"{host}: unknown host name {settings.hostname}. Check the Host/HostName in ~/.ssh/config.")
    if isinstance(exc, TimeoutError):
        return ToolError(
            f"{host}: host unreachable: no answer from {where} within {settings.connect_timeout:g} s. "
            "Check VPN/network, HostName and Port."
        )
    refused = isinstance(exc, (ConnectionRefusedError, paramiko.ssh_exception.NoValidConnectionsError))
    reason = "connection refused (nothing listens there)" if refused else str(exc) or type(exc).__name__
    return ToolError(f"{host}: host unreachable: {where}: {reason}. Check HostName, Port and that sshd runs.")


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


def keep_open(host: str, conn: Connection) -> None:
    """Make `conn` the pooled connection for `host` (ssh_check's, opened with its host-key choice), closing the one
    it replaces."""
    key = (str(ssh_config_path()), host)
    with _pool_lock:
        old = _pool.pop(key, None)
        _pool[key] = conn
    if old is not None:
        old.close()


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
