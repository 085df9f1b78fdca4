"""A warm Python that starts long-running commands: both ends, standard library only.

`ns eval` spends ~7 of the ~10 CPU-s of its driver importing NeMo-Skills' pipeline (nemo_run, litellm, torch) before
it starts the generation it drives, and the eval server runs one per benchmark of every evaluation, for as long as a
training run lasts. The server end (this file, run by path in the command's own Python) imports the script's modules
once (the preload), then forks one child per command, which runs the script as `python SCRIPT ARGS` would: in a
session of its own (the eval server stops a command's whole process group), its output appended to the command's
log, in its directory and environment. Unlike zygote.py (checks, one at a time, their output captured), commands run
side by side and for as long as they take; the owner learns each one's pid at once and its exit status when it ends.

Protocol, one JSON object per line: first {"preload": CODE} on stdin, answered {"ready": true} or {"ready": false,
"error": TEXT}; then each {"script": PATH, "argv": [...], "env": {...}, "cwd": DIR, "log": PATH} is answered
{"started": PID}, and each command's end, whenever it comes, {"exited": PID, "returncode": N} (negative: the signal
that killed it). At EOF on stdin (the owner closed it, or died) the commands still running are stopped, process group
and all (SIGTERM, SIGKILL STOP_GRACE_S later), and the server ends: nothing it started outlives its owner.

A command's own steps are Python processes too: `ns eval` runs its generation and its summary as `python -m
nemo_skills...` children (~8 and ~4 CPU-s of imports each, for seconds of work). The server also listens on a Unix
socket (ATTACH_VARIABLE in the commands' environment), and the commands' PATH starts with a folder whose `python` and
`python3` run this file as `--attach`: a `python -m MODULE ...` whose module the owner named (`attach`) and the preload
imported is sent there with the caller's stdin, stdout and stderr, its directory and environment, and runs in a fork of
the server (in a session of its own) as `python -m` would, with the arguments the owner named for it first (a
module whose main dispatches on a command name among all the preload registered); the caller waits for it, passes it
SIGTERM, SIGINT, SIGHUP and SIGQUIT, and exits with its status. A caller that is killed outright leaves no child: the
child ends when the caller's end of the socket closes. Anything else, or no server to ask, runs the real Python.

The owner's end is ForkServer: `start()` returns a Started, which has the parts of a Popen the eval server uses (pid,
poll, wait, returncode).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, NoReturn

REAP_POLL_S = 0.2  # how often the server looks for ended commands while no request comes
STOP_GRACE_S = 5.0
READY_TIMEOUT_S = 600.0  # the preload's imports: ~7 s on a quiet machine, ~12 CPU-s and minutes on a loaded one
ANSWER_TIMEOUT_S = 120.0  # a fork's answer (a fork takes milliseconds; the margin is a loaded machine's)
SERVER = Path(__file__)
ATTACH_VARIABLE = "QUANTEVAL_FORKSERVER_SOCKET"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
MESSAGE_BYTES = 1 << 20  # one request: its environment is the largest part


# ---------------------------------------------------------------- the server (the command's Python)


def _exit_as_python_would(prepare: Callable[[], Callable[[], object]]) -> NoReturn:
    """In a forked child: prepare() sets the child up and returns what runs as __main__; exit with the status `python`
    gives it (127 when the setup failed, 1 for an exception, SystemExit's code), the streams flushed."""
    code = 127
    try:
        main = prepare()
        code = 1
        main()
        code = 0
    except SystemExit as stop:
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException as failure:  # noqa: BLE001 - the child's own failure is its exit status
        _print_as_python_would(failure)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def _print_as_python_would(failure: BaseException) -> None:
    """The traceback from the script's or module's own frames, without this file's and runpy's: a log's last lines (what
    the eval server's answer carries) keep the cause, as they would cold."""
    import runpy

    ours = {__file__, runpy.__file__, "<frozen runpy>"}
    frames = failure.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename in ours:
        frames = frames.tb_next
    traceback.print_exception(type(failure), failure, frames or failure.__traceback__)


def _run_command(request: dict, answers_fd: int) -> NoReturn:
    """In the forked child: the script as `python SCRIPT *argv` would run it."""
    def prepare() -> Callable[[], object]:
        os.close(answers_fd)  # held open here, the owner would not see the server's end while a command runs
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [request["script"], *request["argv"]]
        import runpy

        return lambda: runpy.run_path(request["script"], run_name="__main__")

    _exit_as_python_would(prepare)


def _run_attached(request: dict, fds: list[int], caller: socket.socket, answers_fd: int) -> NoReturn:
    """In the forked child: `python -m MODULE *argv` on the caller's stdin, stdout and stderr."""
    def die_with_caller() -> None:  # the caller's end closes only when it ends: killed, it cannot say so
        with contextlib.suppress(OSError):
            caller.recv(1)
        os.killpg(0, signal.SIGKILL)

    def prepare() -> Callable[[], object]:
        os.close(answers_fd)  # held open here, the owner would not see the server's end while the module runs
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        threading.Thread(target=die_with_caller, daemon=True).start()
        sys.argv = [request["module"], *request["argv"]]
        sys.path.insert(0, request["cwd"])  # as `python -m` puts its working directory first
        sys.modules.pop(request["module"], None)  # the preload's copy: the module runs afresh as __main__
        import runpy

        return lambda: runpy.run_module(request["module"], run_name="__main__", alter_sys=True)

    _exit_as_python_would(prepare)


def _attach(listener: socket.socket, warm: dict[str, list[str]], attached: dict[int, socket.socket], answers_fd: int) -> None:
    """One caller's `python -m MODULE`: forked when the preload imported MODULE, else refused (it runs cold)."""
    caller, _ = listener.accept()
    fds: list[int] = []
    try:
        message, fds, _, _ = socket.recv_fds(caller, MESSAGE_BYTES, 3)
        request = json.loads(message)
        if request.get("module") not in warm or len(fds) != 3:
            caller.send(json.dumps({"refused": f"{request.get('module')} is not what this server imported"}).encode())
            caller.close()
            return
        request["argv"] = [*warm[request["module"]], *request["argv"]]
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in attached.values():
                other.close()
            _run_attached(request, fds, caller, answers_fd)
        attached[pid] = caller
        print(f"forkserver: python -m {request['module']} forked as {pid}", file=sys.stderr, flush=True)
        caller.send(json.dumps({"pid": pid}).encode())
    except (OSError, ValueError) as exc:
        print(f"forkserver: an attach request failed: {exc}", file=sys.stderr, flush=True)
        caller.close()
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _reap(running: set[int], reply: Any, attached: dict[int, socket.socket]) -> None:
    while running or attached:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        if (caller := attached.pop(pid, None)) is not None:
            with contextlib.suppress(OSError):
                caller.send(json.dumps({"returncode": code}).encode())
            caller.close()
            continue
        running.discard(pid)
        reply({"exited": pid, "returncode": code})


def _stop_all(running: set[int], attached: dict[int, socket.socket]) -> None:
    """The owner is gone: stop every command still running, its process group with it, and every attached module."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
        for pid in (*running, *attached):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
        deadline = time.monotonic() + grace
        while (running or attached) and time.monotonic() < deadline:
            _reap(running, lambda message: None, attached)
            time.sleep(0.05)
        if not (running or attached):
            return


def serve() -> None:
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # quanteval's own modules must not shadow the command's imports
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # whatever the preload prints cannot reach the answers

    def reply(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    requests = sys.stdin.fileno()
    pending = b""

    def lines() -> list[bytes] | None:
        """The complete lines read so far (None at EOF)."""
        nonlocal pending
        chunk = os.read(requests, 1 << 16)
        if not chunk:
            return None
        pending += chunk
        *complete, pending = pending.split(b"\n")
        return complete

    first: list[bytes] = []
    while not first:
        got = lines()
        if got is None:
            return
        first = got
    hello = json.loads(first[0])
    before = set(sys.modules)
    try:
        exec(compile(hello["preload"], "<preload>", "exec"), {"__name__": "__preload__"})
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(hello["socket"])
        listener.listen(16)
    except BaseException:  # noqa: BLE001 - said to the owner, who starts its commands cold
        reply({"ready": False, "error": traceback.format_exc()[-2000:]})
        return
    reply({"ready": True})
    # the modules a command's `python -m` may run here (with their leading arguments): those named that the preload imported
    imported = set(sys.modules) - before
    warm = {module: leading for module, leading in hello["attach"].items() if module in imported}
    _loop(requests, lines, reply, answers.fileno(), listener, warm, first[1:])


def _loop(requests: int, lines: Any, reply: Any, answers_fd: int, listener: socket.socket, warm: dict[str, list[str]],
          backlog: list[bytes]) -> None:
    """Fork each command asked on stdin and each attached module asked on the socket, until stdin's EOF."""
    running: set[int] = set()
    attached: dict[int, socket.socket] = {}
    while True:
        for line in backlog:
            if line.strip():
                pid = os.fork()
                if pid == 0:
                    for held in (listener, *attached.values()):
                        held.close()
                    _run_command(json.loads(line), answers_fd)
                running.add(pid)
                reply({"started": pid})
        backlog = []
        readable = select.select([requests, listener], [], [], REAP_POLL_S)[0]
        if listener in readable:
            _attach(listener, warm, attached, answers_fd)
        if requests in readable:
            got = lines()
            if got is None:
                listener.close()
                _stop_all(running, attached)
                return
            backlog = got
        _reap(running, reply, attached)


# ---------------------------------------------------------------- a command's `python` (run with -S: stdlib only)


def attach(python: str, args: list[str]) -> None:
    """`python ARGS` for a command of the server: `-m MODULE` through the server's socket when it takes it, else (or
    without a server) the real Python, exec'd; never returns."""
    path = os.environ.get(ATTACH_VARIABLE)
    if path and len(args) >= 2 and args[0] == "-m":
        answer: dict = {}
        server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            server.connect(path)
            request = {"module": args[1], "argv": args[2:], "cwd": os.getcwd(), "env": dict(os.environ)}
            socket.send_fds(server, [json.dumps(request).encode()], [0, 1, 2])
            answer = json.loads(server.recv(MESSAGE_BYTES) or b"{}")
        except (OSError, ValueError):
            pass
        if "pid" in answer:
            pid = answer["pid"]

            def forward(sig: int, _frame: object) -> None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, sig)

            for sig in FORWARDED_SIGNALS:
                signal.signal(sig, forward)
            ended = server.recv(MESSAGE_BYTES)  # the server's word when the module ends (nothing: the server died)
            code = json.loads(ended)["returncode"] if ended else 1
            if code < 0:  # ended by a signal: end by it too, as the caller's parent expects
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
            os._exit(code & 0xFF)
        server.close()
    os.execv(python, [python, *args])


# ---------------------------------------------------------------- the owner (quanteval's Python)


class Started:
    """A command the fork server started: what the eval server uses of a Popen."""

    def __init__(self, pid: int, argv: list[str]) -> None:
        self.pid = pid
        self.args = argv
        self.returncode: int | None = None
        self._ended = threading.Event()

    def ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode


class ColdStart(Exception):
    """No fork server for this Python and preload: start commands as processes of their own."""


def script_python(script: str) -> str | None:
    """The Python a console script runs in (`#!/path/to/python` as pip and uv write it), or None for anything else
    (a binary, a shell script, a file that is not there)."""
    try:
        with open(script, "rb") as handle:
            first = handle.readline(512)
    except OSError:
        return None
    words = first[2:].split() if first.startswith(b"#!") else []
    interpreter = words[0].decode(errors="replace") if words else ""
    return interpreter if os.path.basename(interpreter).startswith("python") and os.access(interpreter, os.X_OK) else None


class ForkServer:
    """The owner's end: one server process (its Python, preload and environment), its commands started through it."""

    def __init__(self, python: str, preload: str, env: dict[str, str], log: IO[bytes] | int = subprocess.DEVNULL,
                 ready_timeout_s: float = READY_TIMEOUT_S, attach: Mapping[str, tuple[str, ...]] | None = None) -> None:
        # the socket and the `python` its commands find first on their PATH (attach above)
        self._folder = Path(tempfile.mkdtemp(prefix="quanteval-forkserver-"))
        self._socket = str(self._folder / "socket")
        shim = f"#!/bin/sh\nexec {shlex.quote(python)} -S {shlex.quote(str(SERVER))} --attach {shlex.quote(python)} \"$@\"\n"
        for name in ("python", "python3"):
            (self._folder / name).write_text(shim)
            (self._folder / name).chmod(0o755)
        try:
            self._process = subprocess.Popen([python, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=log, env=env, start_new_session=True)
        except OSError as exc:
            shutil.rmtree(self._folder, ignore_errors=True)
            raise ColdStart(f"{python} did not start: {exc.strerror}") from None
        self._lock = threading.Lock()
        self._starting = threading.Lock()  # one start in flight: its answer is the next one read
        self._answers: queue.Queue[dict | None] = queue.Queue()
        self._started: dict[int, Started] = {}
        self._exited: dict[int, int] = {}  # an end read before its start was answered
        assert self._process.stdin is not None and self._process.stdout is not None
        self._stdin, self._stdout = self._process.stdin, self._process.stdout
        self._reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        try:
            self._send({"preload": preload, "socket": self._socket, "attach": {module: list(leading) for module, leading in (attach or {}).items()}})
            self._reader.start()
            ready = self._answer(ready_timeout_s)
        except (OSError, ColdStart) as exc:
            self.close()
            raise ColdStart(f"the fork server did not start: {exc}") from None
        if not ready.get("ready"):
            self.close()
            raise ColdStart(str(ready.get("error", "its preload failed")).strip().splitlines()[-1])

    def _send(self, message: dict) -> None:
        self._stdin.write((json.dumps(message) + "\n").encode())
        self._stdin.flush()

    def _answer(self, timeout_s: float) -> dict:
        try:
            answer = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise ColdStart(f"no answer within {timeout_s:.0f} s") from None
        if answer is None:
            raise ColdStart("it ended")
        return answer

    def _read(self) -> None:
        for line in self._stdout:
            message = json.loads(line)
            if "exited" not in message:
                self._answers.put(message)
                continue
            with self._lock:
                started = self._started.pop(message["exited"], None)
                if started is None:
                    self._exited[message["exited"]] = message["returncode"]
            if started is not None:
                started.ended(message["returncode"])
        self._answers.put(None)
        with self._lock:  # the server is gone (killed): its commands' ends cannot be known from here
            orphans, self._started = list(self._started.values()), {}
        for started in orphans:
            threading.Thread(target=_ended_orphan, args=(started,), daemon=True).start()

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def start(self, script: str, argv: list[str], env: dict[str, str], cwd: str, log: str) -> Started:
        """Start `script argv` in a child of the server; ColdStart if the server cannot (the caller starts it cold)."""
        with self._starting:
            if not self.alive:
                raise ColdStart("the fork server ended")
            try:
                env = {**env, ATTACH_VARIABLE: self._socket,
                       "PATH": os.pathsep.join(filter(None, (str(self._folder), env.get("PATH"))))}
                self._send({"script": script, "argv": argv, "env": env, "cwd": cwd, "log": log})
            except OSError as exc:
                raise ColdStart(f"the fork server is gone: {exc}") from None
            try:
                answer = self._answer(ANSWER_TIMEOUT_S)
            except ColdStart:
                self.close()  # a start answered late would run beside the cold one the caller starts instead
                raise
        started = Started(answer["started"], [script, *argv])
        with self._lock:
            if (code := self._exited.pop(started.pid, None)) is not None:
                started.ended(code)
            else:
                self._started[started.pid] = started
        return started

    def close(self) -> None:
        """End the server; the commands still running are stopped with it (its EOF)."""
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self._process.wait(timeout=3 * STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        shutil.rmtree(self._folder, ignore_errors=True)


def _ended_orphan(started: Started) -> None:
    """A command whose server died: ended (status unknown, 1) once no process of its group is left."""
    while True:
        try:
            os.killpg(started.pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        time.sleep(0.5)
    started.ended(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--attach"]:
        attach(sys.argv[2], sys.argv[3:])
    serve()
