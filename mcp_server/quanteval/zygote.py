"""A warm Python that forks a fresh child per script: run by path in another venv's Python (standard library only).

Importing vLLM or SGLang takes seconds of CPU; their argument parsers take milliseconds. This process imports the
framework once (the `preload` line), then forks one child per request, so every check starts from the same freshly
imported state and sees none of the state a previous check left, and a check that crashes or hangs takes only its
child. warm_python.py is the other end.

Protocol, one JSON object per line: the first line on stdin is {"preload": CODE}, answered {"ready": true} or
{"ready": false, "error": TEXT}; then each {"code": CODE, "argv": [...], "env": {...}, "cwd": DIR} is answered
{"returncode": N, "stdout": TEXT, "stderr": TEXT}, as `python -c CODE *argv` run in DIR with that environment and no
stdin would have ended. Answers go to the stdout this process started with; what the preload or a check prints goes
to stderr (warm_python's log) or the check's own capture.
It never forks while a Python thread besides its own runs: the child would inherit the locks that thread holds (the
import lock, logging's, a stream's buffer) held forever and could hang. The preload that leaves one is answered
{"ready": false, "refused": WHY}, a check asked after one started {"refused": WHY}, and the process ends: the owner
runs its checks cold. Native threads (a library's idle pool) are noted on stderr, not refused (vLLM's import leaves
two); a check that hangs in the child anyway is the owner's timeout, after which it retries cold.
The process ends at EOF on stdin (its owner closed it, or died) or after IDLE_S without a request; at EOF while a
check runs (one that hangs: a FIFO it opens), it kills the check and what the check started first, and a check dies
with this process (the parent-death signal), so neither outlives an owner that was SIGKILLed.
"""

from __future__ import annotations

import io
import json
import os
import select
import signal
import sys
import tempfile
import threading
import time
import traceback

IDLE_S = 600
OWNER_POLL_S = 0.2  # how often a running check's wait looks at stdin for its owner's EOF
PR_SET_PDEATHSIG = 1  # prctl(2)


def _die_with_parent() -> None:
    """In the forked child: SIGKILL when this process (its parent) ends, however it ends (Linux; elsewhere the
    owner's EOF alone stops it)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent ended before the signal was armed
        os._exit(1)


def _run_child(request: dict, out_fd: int, err_fd: int) -> None:
    """In the forked child: the check as `python -c` would run it; never returns."""
    _die_with_parent()
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the requests' pipe is this process's, not the check's
    try:
        os.chdir(request["cwd"])
    except OSError as exc:
        print(f"cannot enter the caller's working directory: {exc}", file=sys.stderr)
        os._exit(1)
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["-c", *request["argv"]]
    code = 0
    try:
        exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
    except SystemExit as stop:  # argparse's error exit (2), sys.exit("message")
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - a check's own failure is its answer
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _fork_hazard() -> str | None:
    """Why a fork now could hang the child, or None: the Python threads besides this one."""
    others = [thread.name for thread in threading.enumerate() if thread is not threading.main_thread()]
    if not others:
        return None
    return (f"{len(others)} Python thread(s) besides the main one ({', '.join(others[:5])}): a forked check could hang "
            "on a lock one of them holds")


def _os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no /proc (macOS): Python's own count
        return threading.active_count()


def _refuse(why: str) -> dict:
    print(f"zygote {os.getpid()}: refusing to fork: {why}; the checks run cold", file=sys.stderr, flush=True)
    return {"refused": why}


def _answer(request: dict, stdin: io.BufferedReader) -> dict:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            _run_child(request, out.fileno(), err.fileno())
        status = _wait(pid, stdin)
        out.seek(0)
        err.seek(0)
        return {"returncode": os.waitstatus_to_exitcode(status), "stdout": out.read().decode(errors="replace"),
                "stderr": err.read().decode(errors="replace")}


def _wait(pid: int, stdin: io.BufferedReader) -> int:
    """The check's exit status; if its owner goes away meanwhile (EOF on stdin), the check and whatever it started
    are killed and this process ends: nobody is left to answer."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if select.select([stdin], [], [], OWNER_POLL_S)[0]:
            if not stdin.peek(1):  # EOF: the owner closed its end or died
                _kill_check(pid)
                os._exit(0)
            time.sleep(OWNER_POLL_S)  # a request before the answer (not the protocol): read after this one


def _kill_check(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    if os.getpgrp() == os.getpid():  # a group of its own (warm_python starts it in a new session): what the check
        os.killpg(os.getpgrp(), signal.SIGKILL)  # started too, and this process with them
    os.waitpid(pid, 0)


def main() -> None:
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # quanteval's own modules (paths, models, ...) must not shadow the framework's imports
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # whatever the preload prints cannot reach the answers
    stdin = sys.stdin.buffer

    def reply(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    first = stdin.readline()
    if not first:
        return
    try:
        exec(compile(json.loads(first)["preload"], "<preload>", "exec"), {"__name__": "__preload__"})
    except BaseException:  # noqa: BLE001 - said to the owner, who falls back to a cold process
        reply({"ready": False, "error": traceback.format_exc()[-2000:]})
        return
    if why := _fork_hazard():
        reply({"ready": False, **_refuse(why)})
        return
    if (native := _os_threads() - threading.active_count()) > 0:
        print(f"zygote {os.getpid()}: {native} native thread(s) besides Python's (a library's pool) after the preload; "
              "forking anyway", file=sys.stderr, flush=True)
    reply({"ready": True})
    while select.select([stdin], [], [], IDLE_S)[0]:
        line = stdin.readline()
        if not line:
            return
        if why := _fork_hazard():  # one the preload started late (a timer, a watcher)
            reply(_refuse(why))
            return
        reply(_answer(json.loads(line), stdin))


if __name__ == "__main__":
    main()
