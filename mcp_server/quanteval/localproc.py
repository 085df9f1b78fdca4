"""Local ports, process groups, output directories and programs: the one place that decides whether a port is free,
stops a server, finds out whether a directory can be written before anything is started that would write there, and
names the programs PATH lacks.

Deployments and the eval server both start servers in their own session (process group) and
must stop all of it, including workers the server forked, without leaving anything behind.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from quanteval.models import ToolError

# The Debian package that provides each program an engine runs on this machine.
DEBIAN_PACKAGES = {"ssh": "openssh-client", "scp": "openssh-client", "rsync": "rsync", "docker": "docker.io", "bash": "bash"}


def missing_programs(who: str, programs: Iterable[str]) -> str | None:
    """One sentence naming the programs `who` runs on this machine that PATH lacks, with their Debian packages; None
    when all are there."""
    programs = tuple(programs)
    missing = [program for program in programs if shutil.which(program) is None]
    if not missing:
        return None
    packages = " ".join(sorted({DEBIAN_PACKAGES[program] for program in missing}))
    return (f"{who} runs {', '.join(programs)} on this machine, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not on PATH: apt-get install {packages}.")


def is_loopback(host: str) -> bool:
    """An address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind host:port now.

    Binds with SO_REUSEADDR, as servers do, so a port left in TIME_WAIT by a stopped server counts as free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


# Where a server quanteval starts listens: outside the kernel's ephemeral range (net.ipv4.ip_local_port_range), whose
# ports any outgoing connection on the machine may take at any moment, between the port's choice and the server's bind
# seconds later ("Address already in use": a cluster canary's vLLM failed so in the suite, under load).
SERVER_PORTS = range(20000, 65536)
LINUX_EPHEMERAL_PORTS = (32768, 60999)  # ip_local_port_range's default
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")  # read here, and on a cluster by preflight


def ephemeral_ports(said: str | None = None) -> tuple[int, int]:
    """The kernel's ephemeral port range: from `said` (ip_local_port_range as another host printed it), else this
    machine's; Linux's default where neither says (not Linux, no /proc)."""
    if said is None:
        try:
            said = EPHEMERAL_RANGE_FILE.read_text()
        except OSError:
            said = ""
    numbers = said.split()
    if len(numbers) == 2 and all(number.isdigit() for number in numbers) and int(numbers[0]) <= int(numbers[1]):
        return int(numbers[0]), int(numbers[1])
    return LINUX_EPHEMERAL_PORTS


def free_port(host: str = "127.0.0.1") -> int:
    """A port for a server to start on: free now and outside the ephemeral range (SERVER_PORTS); the kernel's own
    pick where none such is free."""
    low, high = ephemeral_ports()
    draw = random.SystemRandom()
    for _ in range(64):
        port = draw.choice(SERVER_PORTS)
        if not low <= port <= high and port_free(port, host):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# Every detached child this process started (servers, nel-next runs, evaluation jobs, eval servers), in one place:
# polled so that one that ended is reaped, and no zombie leader keeps its process group looking alive.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
_CHILDREN_LOCK = threading.Lock()


REAP_INTERVAL_S = 1.0
_REAPER: list[threading.Thread] = []  # started with the first child adopted


def adopt(child: subprocess.Popen[bytes]) -> None:
    """Remember a child this process started, so that reap() collects it when it ends (a thread reaps every
    REAP_INTERVAL_S: a child that ends between tool calls is no zombie for long)."""
    with _CHILDREN_LOCK:
        _CHILDREN[child.pid] = child
        if not _REAPER:
            _REAPER.append(threading.Thread(target=_reap_forever, name="quanteval-reaper", daemon=True))
            _REAPER[0].start()


def _reap_forever() -> None:
    while True:
        time.sleep(REAP_INTERVAL_S)
        reap()


def reap() -> None:
    """Collect every child of ours that has ended (each is forgotten once reaped)."""
    with _CHILDREN_LOCK:
        for pid, child in list(_CHILDREN.items()):
            if child.poll() is not None:
                del _CHILDREN[pid]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    members = []
    # listed, then each read in its own try: pathlib's glob stats each match, and a process ending between the listing
    # and that stat raised ProcessLookupError out of the glob itself (a stop_deployment racing its server's exit)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path("/proc", pid, "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(pid))
    return members


def stop_group(pgid: int, grace_s: float, on_wait: Callable[[], object] = lambda: None) -> tuple[bool, str, list[int]]:
    """SIGTERM the whole group, SIGKILL what is left after grace_s; (stopped, what was done, pids still alive).

    `on_wait` runs while waiting, e.g. to reap a child this process started so it does not linger as a zombie.
    """
    if not group_members(pgid):
        return True, "already stopped", []
    how = "SIGTERM"
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return True, "already stopped", []
    deadline = time.monotonic() + grace_s
    while group_members(pgid) and time.monotonic() < deadline:
        on_wait()
        time.sleep(0.1)
    if group_members(pgid):
        how = "SIGTERM, then SIGKILL after the grace period"
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while group_members(pgid) and time.monotonic() < deadline:
            on_wait()
            time.sleep(0.05)
    on_wait()
    remaining = group_members(pgid)
    return not remaining, how, remaining


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Cleanup after an interrupt runs to its end: a second Ctrl-C or SIGTERM (people press Ctrl-C twice) while a
    server is being stopped would otherwise leave it running. Only the main thread takes signals; elsewhere a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def require_writable_dir(directory: Path, key: str, fix: str) -> None:
    """Create `directory` and write a file in it, or a ToolError naming `key`, the directory, why, and `fix` (a
    read-only mount or a directory of another user says so here, not as a PermissionError minutes later)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".quanteval-write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ToolError(f"{key}: cannot write {directory} ({exc.strerror or exc}). {fix}") from None


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of a process group's live members (a vLLM server is three processes: API, engine, worker)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in group_members(pgid):
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def available_memory_bytes() -> int:
    """What the kernel says can still be allocated without swapping (MemAvailable)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


# ---------------------------------------------------------------- processes that die with their owner

_OWNER = threading.local()  # tied_to_this_process: what this thread starts inside the block dies with this process

# The wrapper a detached child (a server, a nel-next run) runs under: it records the exit code (any later process, the
# CLI or a restarted MCP server, can report it) and, given an owner pid, watches it: when the owner is gone (even
# SIGKILLed, when no cleanup of its own runs), the wrapper stops its whole process group, the child's own with it.
_WRAPPER = ('rc_file="$1"; owner="$2"; shift 2; "$@" & child=$!; '
            'if [ "$owner" != 0 ]; then ( trap "" TERM; '
            'while kill -0 "$owner" 2>/dev/null && kill -0 "$child" 2>/dev/null; do sleep 1; done; '
            'if kill -0 "$child" 2>/dev/null; then kill -TERM 0; sleep 10; kill -KILL 0; fi ) & fi; '
            'wait "$child"; code=$?; echo "$code" > "$rc_file"; exit "$code"')


@contextlib.contextmanager
def tied_to_this_process() -> Iterator[None]:
    """Detached children this thread starts inside the block (exit_code_wrapper) stop when this process ends, however
    it ends: an evaluation's servers and runs are its own (a deployment or run launched on its own outlives its call)."""
    previous = getattr(_OWNER, "pid", 0)
    _OWNER.pid = os.getpid()
    try:
        yield
    finally:
        _OWNER.pid = previous


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts until reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_pid() -> int:
    """The process what this thread starts now stops with (inside tied_to_this_process), else 0."""
    return getattr(_OWNER, "pid", 0)


def exit_code_wrapper(name: str, exit_code_path: Path, argv: list[str]) -> list[str]:
    """argv run under the wrapper above (`name` shows in ps), tied to this process when inside tied_to_this_process."""
    return ["/bin/sh", "-c", _WRAPPER, name, str(exit_code_path), str(owner_pid()), *argv]
