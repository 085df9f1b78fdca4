"""The warm Python the eval server forks each `ns eval` from (quanteval/forkserver.py): a command runs as `python
SCRIPT ARGS` would (its arguments, directory, environment, log and exit status) in a session of its own, with what the
preload imported; commands run side by side; stopping one stops its process group; nothing outlives the owner, however
the owner ends; a preload that fails, or a script that is no Python's, means a cold start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from processes import still_running, wait_until

from quanteval import forkserver
from quanteval.evalserver.jobs import kill_group

PY = sys.executable
# a module only the preload makes: the command sees it imported, and by another process (the server)
PRELOAD = "import os, sys, types\nsys.modules['preloaded'] = types.SimpleNamespace(by=os.getpid())\n"


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!{PY}\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def server():
    started = forkserver.ForkServer(PY, PRELOAD, dict(os.environ))
    yield started
    started.close()


def test_a_command_runs_as_python_would_in_a_session_of_its_own_with_what_the_preload_imported(server, tmp_path):
    script = _script(tmp_path / "show.py", """
        import json, os, sys
        import preloaded
        print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "var": os.environ.get("FORK_TEST_VAR"),
                          "session": os.getsid(0) == os.getpid(), "preloaded_by_other": preloaded.by != os.getpid(),
                          "name": __name__}))
        print("to stderr", file=sys.stderr)
        sys.exit(3)
    """)
    (tmp_path / "work").mkdir()
    log = tmp_path / "run.log"
    log.write_text("before\n")
    started = server.start(script, ["--flag", "a b"], {"FORK_TEST_VAR": "x", "PATH": os.environ["PATH"]},
                           str(tmp_path / "work"), str(log))
    assert started.wait(30) == 3 and started.poll() == 3
    before, shown, err = log.read_text().splitlines()
    assert before == "before" and err == "to stderr"  # appended, stdout and stderr both
    assert json.loads(shown) == {"argv": [script, "--flag", "a b"], "cwd": str(tmp_path / "work"), "var": "x",
                                 "session": True, "preloaded_by_other": True, "name": "__main__"}


def test_commands_run_side_by_side_and_each_end_is_reported(server, tmp_path):
    script = _script(tmp_path / "sleep.py", """
        import sys, time
        time.sleep(float(sys.argv[1]))
        sys.exit(int(sys.argv[2]))
    """)
    slow = server.start(script, ["2", "4"], dict(os.environ), str(tmp_path), str(tmp_path / "slow.log"))
    fast = server.start(script, ["0.5", "0"], dict(os.environ), str(tmp_path), str(tmp_path / "fast.log"))
    assert fast.wait(30) == 0 and slow.poll() is None  # started after the slow one, ended while it ran
    with pytest.raises(subprocess.TimeoutExpired):
        slow.wait(0.1)
    assert slow.wait(30) == 4


def test_stopping_a_command_stops_what_it_started(server, tmp_path):
    script = _script(tmp_path / "parent.py", """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        print(child.pid, flush=True)
        time.sleep(120)
    """)
    log = tmp_path / "parent.log"
    started = server.start(script, [], dict(os.environ), str(tmp_path), str(log))
    wait_until(lambda: log.exists() and log.read_text().strip(), 30, "the command's child")
    child = int(log.read_text().split()[0])
    kill_group(started, grace_s=5)
    assert started.wait(10) == -signal.SIGTERM
    wait_until(lambda: not still_running(child), 10, "the command's child gone with its group")


def test_nothing_outlives_an_owner_that_is_killed(tmp_path):
    script = _script(tmp_path / "sleeper.py", "import time\ntime.sleep(120)\n")
    owner = subprocess.Popen([PY, "-c", textwrap.dedent(f"""
        import os, time
        from quanteval import forkserver
        server = forkserver.ForkServer({PY!r}, "import json\\n", dict(os.environ))
        started = server.start({script!r}, [], dict(os.environ), {str(tmp_path)!r}, {str(tmp_path / 'sleeper.log')!r})
        print(started.pid, flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    command = int(owner.stdout.readline())
    assert still_running(command)
    owner.kill()  # no cleanup of its own: the server sees its requests' pipe close
    owner.wait()
    wait_until(lambda: not still_running(command), 20, "the command gone with its owner")


def test_a_preload_that_fails_or_a_script_that_is_no_pythons_means_a_cold_start(tmp_path):
    with pytest.raises(forkserver.ColdStart, match="ModuleNotFoundError: No module named 'no_such_module'"):
        forkserver.ForkServer(PY, "import no_such_module\n", dict(os.environ))
    shell = tmp_path / "tool"
    shell.write_text("#!/bin/sh\necho hi\n")
    assert forkserver.script_python(str(shell)) is None
    assert forkserver.script_python(str(tmp_path / "missing")) is None
    assert forkserver.script_python(_script(tmp_path / "py", "pass\n")) == PY


# --- a command's own `python -m` (ns eval's generation and summary steps) ------------------------------------------

WARM_MODULE = """
import json, os, sys, time
if __name__ == "__main__":
    if sys.argv[1:2] == ["raise"]:
        raise ValueError("the module's own failure")
    if sys.argv[1:2] == ["sleep"]:
        with open(sys.argv[2], "w") as pid_file:
            pid_file.write(str(os.getpid()))
        time.sleep(120)
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "var": os.environ.get("FORK_TEST_VAR"), "name": __name__,
                      "stdin": sys.stdin.readline(), "warm": "preloaded" in sys.modules, "pid": os.getpid()}))
    print("to stderr", file=sys.stderr)
    sys.exit(int(os.environ.get("FORK_TEST_EXIT", "5")))
"""


@pytest.fixture
def attaching(tmp_path):
    """A server that preloaded `warmmod`, `commandmod` and `unnamed` (and PRELOAD's marker) and may attach `warmmod`,
    `commandmod` (its command name first) and `coldmod` (which it did not import): four copies of one module."""
    modules = tmp_path / "modules"
    modules.mkdir()
    for name in ("warmmod", "commandmod", "coldmod", "unnamed"):
        (modules / f"{name}.py").write_text(WARM_MODULE)
    env = {**os.environ, "PYTHONPATH": str(modules)}
    started = forkserver.ForkServer(PY, PRELOAD + "import warmmod, commandmod, unnamed\n", env,
                                    attach={"warmmod": (), "commandmod": ("its-command",), "coldmod": ()})
    yield started, env
    started.close()


def _command(server: forkserver.ForkServer, env: dict, tmp_path: Path, body: str) -> list[str]:
    """A command of the server running `body` (with `run(args)`: `python ARGS` as its steps run it, by name on PATH);
    the lines it printed."""
    script = _script(tmp_path / "command.py", textwrap.dedent("""
        import json, subprocess, sys
        def run(args, **more):
            done = subprocess.run(["python", *args], capture_output=True, text=True, **more)
            print(json.dumps({"code": done.returncode, "out": done.stdout, "err": done.stderr}), flush=True)
    """) + textwrap.dedent(body))
    log = tmp_path / "command.log"
    started = server.start(script, [], env, str(tmp_path), str(log))
    assert started.wait(60) == 0, log.read_text()
    return log.read_text().splitlines()


def test_a_commands_python_dash_m_of_a_preloaded_module_runs_forked_with_its_streams_directory_and_status(attaching, tmp_path):
    server, env = attaching
    (tmp_path / "work").mkdir()
    lines = _command(server, {**env, "FORK_TEST_VAR": "x"}, tmp_path, f"""
        run(["-m", "warmmod", "a", "b c"], input="hello\\n", cwd={str(tmp_path / 'work')!r})
        run(["-m", "commandmod", "a"], input="\\n")
        run(["-m", "warmmod", "raise"])
        run(["-m", "coldmod", "a"], input="cold\\n")
        run(["-m", "unnamed", "a"], input="cold\\n")
        run(["-c", "import sys; print('preloaded' in sys.modules)"])
    """)
    warm, command, failed, cold, unnamed, plain = map(json.loads, lines)
    assert warm["code"] == 5 and warm["err"] == "to stderr\n"  # its exit status, its stderr: the caller's
    shown = json.loads(warm["out"])
    assert {key: shown[key] for key in ("argv", "cwd", "var", "name", "stdin", "warm")} == {
        "argv": ["a", "b c"], "cwd": str(tmp_path / "work"), "var": "x", "name": "__main__", "stdin": "hello\n", "warm": True}
    # the arguments the owner named for a module go first (a typer app's command name, as ns eval's summary step needs)
    assert command["code"] == 5 and json.loads(command["out"])["argv"] == ["its-command", "a"] and json.loads(command["out"])["warm"]
    # a failure's traceback starts at the module's own frame: the fork server's and runpy's would push the cause out of
    # a log's last lines
    assert failed["code"] == 1 and failed["err"].endswith("ValueError: the module's own failure\n"), failed
    assert "warmmod.py" in failed["err"] and "forkserver" not in failed["err"] and "runpy" not in failed["err"], failed
    # a module the preload did not import, one the owner did not name, and anything but `-m`: the real Python, cold
    for ran in (cold, unnamed):
        assert ran["code"] == 5 and json.loads(ran["out"])["warm"] is False and json.loads(ran["out"])["stdin"] == "cold\n"
    assert plain == {"code": 0, "out": "False\n", "err": ""}


def test_a_signal_to_the_caller_reaches_the_forked_module_and_a_killed_caller_leaves_none(attaching, tmp_path):
    server, env = attaching
    lines = _command(server, env, tmp_path, f"""
        import os, signal, time
        for sig, name in ((signal.SIGTERM, "term"), (signal.SIGKILL, "kill")):
            pid_file = {str(tmp_path)!r} + "/" + name
            caller = subprocess.Popen(["python", "-m", "warmmod", "sleep", pid_file])
            while not os.path.exists(pid_file) or not open(pid_file).read():
                time.sleep(0.05)
            module = int(open(pid_file).read())
            caller.send_signal(sig)
            print(json.dumps({{"caller": caller.wait(30), "module": module}}), flush=True)
    """)
    term, kill = map(json.loads, lines)
    assert term["caller"] == -signal.SIGTERM  # passed on; the module ended by it, and the caller by the same signal
    assert kill["caller"] == -signal.SIGKILL
    for ended in (term, kill):
        wait_until(lambda module=ended["module"]: not still_running(module), 10, "the forked module gone with its caller")
