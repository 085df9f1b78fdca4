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
