"""`python -c CODE ARGS` in another Python with a heavy import already done: the frameworks' parser checks, NEL's
config ops and nel-next's schema check.

plan_deployment asks vLLM's or SGLang's own code about the arguments it plans (and nelexec asks NEL to compose or
dry-run a config): importing the framework costs 5-10 s of CPU, the check milliseconds. One warm process (zygote.py)
per Python, preload and environment imports the framework once and forks a fresh child per check, so a session's
second plan costs milliseconds and two checkpoints of one evaluation share one import. Where no warm process can run
(no fork, a preload that fails, or one that leaves a Python thread running, which zygote.py refuses to fork beside)
the check runs cold. The warm try may take WARM_SHARE of the check's time: past it (a preload or a forked check that
hangs) the warm process is stopped and the check runs cold once in the rest. What the warm processes print (the
preload's warnings, a refusal) goes to LOG_NAME in quanteval's state dir.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from quanteval import envvars, localproc

ZYGOTE = Path(__file__).with_name("zygote.py")
# vLLM, SGLang, NEL, nel-next (a session uses two or three): each holds its import in memory (vLLM ~230 MB); the least
# recently used goes first
MAX_WARM = 3
# Read by the framework at import time or by a check; other variables (quanteval's own, pytest's) do not make a new
# warm process, but every check still runs with the caller's whole environment.
_IGNORED_PREFIXES = ("QUANTEVAL_", "PYTEST_")
# The warm try's part of a check's time; the rest is the cold retry's, so a hang costs no more than the check's time.
WARM_SHARE = 0.5
LOG_NAME = "warm-python.log"
MAX_LOG_BYTES = 1 << 20  # past this the log starts afresh, the previous one kept as LOG_NAME.1


class ColdStart(Exception):
    """No warm process for this Python and preload: run the check in a process of its own."""


class Refused(ColdStart):
    """The warm process will not fork (a Python thread runs beside it): this preload's checks all run cold."""


@dataclass
class _Warm:
    process: subprocess.Popen[bytes]
    lock: threading.Lock = field(default_factory=threading.Lock)
    used: float = field(default_factory=time.monotonic)

    def ask(self, message: dict, timeout_s: float) -> dict:
        assert self.process.stdin is not None and self.process.stdout is not None
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except (OSError, ValueError) as exc:  # it ended, or another thread closed it (least recently used)
            raise ColdStart(f"the warm process is gone ({exc})") from None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            if not selector.select(timeout_s):
                raise subprocess.TimeoutExpired(str(ZYGOTE), timeout_s)
        line = self.process.stdout.readline()
        if not line:
            raise ColdStart(f"the warm process ended (exit {self.process.wait(5)})")
        answer = json.loads(line)
        if "refused" in answer:
            raise Refused(answer["refused"])
        return answer

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            try:
                self.process.stdin.close()  # its EOF: it ends by itself
                self.process.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                localproc.stop_group(self.process.pid, grace_s=2, on_wait=self.process.poll)
        localproc.reap()


_WARM: dict[tuple, _Warm] = {}
_WARM_LOCK = threading.Lock()
_STARTING: set[subprocess.Popen[bytes]] = set()  # importing their preload (under _WARM_LOCK)
_CLOSED = threading.Event()  # this process is exiting: a check still asked for starts nothing more
_REFUSED: set[tuple] = set()  # the keys whose warm process refused to fork: cold from then on
_ASKED: set[tuple] = set()  # the keys asked at least once in this process (cold_first)


def _log() -> int:
    """The log, opened for appending (the caller closes it); it starts afresh past MAX_LOG_BYTES. /dev/null where the
    state dir cannot take it: a check never fails for its log."""
    try:
        path = envvars.state_dir() / LOG_NAME
        if path.exists() and path.stat().st_size > MAX_LOG_BYTES:
            path.replace(path.with_name(LOG_NAME + ".1"))
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return os.open(os.devnull, os.O_WRONLY)


def _note(line: str, fd: int | None = None) -> None:
    """A line of warm_python's own in the log (through `fd` where the caller holds it open)."""
    log = _log() if fd is None else fd
    with contextlib.suppress(OSError):
        os.write(log, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}\n".encode())
    if fd is None:
        os.close(log)


def _key(python: str, preload: str, env: dict[str, str]) -> tuple:
    return python, preload, tuple(sorted((k, v) for k, v in env.items() if not k.startswith(_IGNORED_PREFIXES)))


def _start(python: str, preload: str, env: dict[str, str], timeout_s: float) -> _Warm:
    log = _log()
    _note(f"starting a warm {python} for: {' '.join(preload.split())[:200]}", log)
    try:  # its own session: a timeout kills it and the check it forked together
        process = subprocess.Popen([python, str(ZYGOTE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=log, env=env, start_new_session=True)
    finally:
        os.close(log)
    localproc.adopt(process)
    warm = _Warm(process)
    _STARTING.add(process)
    try:
        ready = warm.ask({"preload": preload}, timeout_s)
    except subprocess.TimeoutExpired:  # run() retries cold: the check's own imports may not hang as the preload did
        localproc.stop_group(process.pid, grace_s=1, on_wait=process.poll)  # not yet in _WARM, whose lock is held
        localproc.reap()
        raise
    except (ColdStart, ValueError) as exc:  # a refusal among them (its answer says "refused")
        warm.close()
        raise exc if isinstance(exc, Refused) else ColdStart(str(exc)) from None
    finally:
        _STARTING.discard(process)
    if not ready.get("ready"):
        warm.close()
        raise ColdStart(ready.get("error", "the preload failed"))
    return warm


def _warm_for(python: str, preload: str, env: dict[str, str], timeout_s: float) -> _Warm:
    key = _key(python, preload, env)
    with _WARM_LOCK:
        if _CLOSED.is_set():
            raise _exiting(python)
        warm = _WARM.get(key)
        if warm is not None and warm.process.poll() is None:
            return warm
        _WARM.pop(key, None)
        while len(_WARM) >= MAX_WARM:
            oldest = min(_WARM, key=lambda k: _WARM[k].used)
            _WARM.pop(oldest).close()
        warm = _WARM[key] = _start(python, preload, env, timeout_s)
        return warm


def run(python: str, preload: str, code: str, argv: list[str], env: dict[str, str],
        timeout_s: float, cold_first: bool = False) -> subprocess.CompletedProcess[str]:
    """What `python -c code *argv` under `env`, in this working directory and with no stdin, gives (returncode, stdout,
    stderr), `preload` imported beforehand; raises subprocess.TimeoutExpired past timeout_s, as subprocess.run does.
    For what starts nothing that outlives it: a timeout stops the warm process's whole process group. `cold_first`:
    for a check whose imports take well under a second, where a warm process (its start, and its end with this
    process) costs a one-shot CLI call more than it saves: the first ask in this process runs cold."""
    key = _key(python, preload, env)
    first = key not in _ASKED
    _ASKED.add(key)
    if not hasattr(os, "fork") or key in _REFUSED or (cold_first and first):
        return _cold(python, code, argv, env, timeout_s)
    deadline = time.monotonic() + timeout_s  # starting the warm process counts against the check's time
    warm_s = timeout_s * WARM_SHARE
    warm_deadline = time.monotonic() + warm_s
    try:
        warm = _warm_for(python, preload, env, warm_s)
        with warm.lock:
            warm.used = time.monotonic()
            try:
                answer = warm.ask({"code": code, "argv": argv, "env": env, "cwd": os.getcwd()},
                                  max(warm_deadline - warm.used, 0.0))
            except (Refused, subprocess.TimeoutExpired):
                _forget(warm)
                raise
    except (ColdStart, subprocess.TimeoutExpired) as exc:
        if _CLOSED.is_set():
            raise _exiting(python) from None
        if isinstance(exc, Refused):
            _REFUSED.add(key)
        elif isinstance(exc, subprocess.TimeoutExpired):
            _note(f"no answer from the warm {python} within {warm_s:.0f} s: stopped; the check runs cold")
        return _cold(python, code, argv, env, max(deadline - time.monotonic(), 1.0))
    return subprocess.CompletedProcess([python, "-c", code, *argv], answer["returncode"], answer["stdout"], answer["stderr"])


def _exiting(python: str) -> subprocess.TimeoutExpired:
    """What a check asked for while this process exits gets: no answer in time (nobody waits for it)."""
    return subprocess.TimeoutExpired(python, 0)


def _forget(warm: _Warm) -> None:
    with _WARM_LOCK:
        for key, value in list(_WARM.items()):
            if value is warm:
                del _WARM[key]
    localproc.stop_group(warm.process.pid, grace_s=1, on_wait=warm.process.poll)
    localproc.reap()


def _cold(python: str, code: str, argv: list[str], env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-c", code, *argv], capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL, check=False, env=env)


@atexit.register
def _at_exit() -> None:
    """The warm processes end with this one (they also end at their stdin's EOF if it is killed); a check another
    thread still runs starts nothing more."""
    _CLOSED.set()
    close_all()


def close_all() -> None:
    """Every warm process stopped, without waiting for one still starting in another thread, whose start holds the
    lock (vLLM's import, minutes on a loaded machine: an interrupted evaluation waited for it): that one is stopped as
    it is."""
    locked = _WARM_LOCK.acquire(timeout=1)
    try:
        for process in list(_STARTING):
            localproc.stop_group(process.pid, grace_s=1, on_wait=process.poll)
        for warm in list(_WARM.values()):
            warm.close()
        _WARM.clear()
    finally:
        if locked:
            _WARM_LOCK.release()
