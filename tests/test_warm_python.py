"""The warm process the parser checks run in (quanteval/warm_python.py, zygote.py): the same answer as `python -c`, a
fresh state per check, the caller's environment, a timeout that leaves nothing running, no process outliving its
owner, and a cold run where no warm one can start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from processes import running_with

from quanteval import envvars, warm_python
from quanteval.serving.deploy import check_server_args

PY = sys.executable
# the warm processes of this worker only (another xdist worker's checks start their own): told apart by this value,
# which makes no new warm process (quanteval's own variables do not)
MARK = f"/nonexistent/warm-python-test-{os.getpid()}"
ENV = {**os.environ, "QUANTEVAL_STATE_DIR": MARK}


def _warm_running() -> list[str]:
    return running_with(str(warm_python.ZYGOTE), state_dir=MARK)


@pytest.fixture(autouse=True)
def no_warm_left():
    yield
    warm_python.close_all()
    assert _warm_running() == []


def _both(code: str, argv: list[str], preload: str = "import json\n") -> tuple:
    cold = subprocess.run([PY, "-c", code, *argv], capture_output=True, text=True, env=ENV, check=False)
    warm = warm_python.run(PY, preload, code, argv, ENV, timeout_s=60)
    return (cold.returncode, cold.stdout, cold.stderr.splitlines()[-1:]), (warm.returncode, warm.stdout, warm.stderr.splitlines()[-1:])


@pytest.mark.parametrize("code", [
    "import json, sys; print(json.dumps(sys.argv[1:]))",
    "import argparse; argparse.ArgumentParser(prog='p').parse_args(['--nope'])",  # argparse's exit 2 and message
    "import sys; sys.exit('refused: a reason')",
    "raise ValueError('a check that crashes')",
    "import os; os._exit(7)",
])
def test_a_check_answers_as_python_dash_c_does(code):
    cold, warm = _both(code, ["a", "b c"])
    assert warm == cold


def test_each_check_starts_from_the_preloaded_state_not_the_last_checks():
    code = "import json, sys; seen = getattr(json, 'touched', False); json.touched = True; print(seen)"
    first = warm_python.run(PY, "import json\n", code, [], ENV, timeout_s=60)
    second = warm_python.run(PY, "import json\n", code, [], ENV, timeout_s=60)
    assert first.stdout == second.stdout == "False\n"
    assert len(_warm_running()) == 1  # one warm process answered both


def test_a_cheap_check_asked_once_starts_no_warm_process_and_its_second_ask_does():
    """cold_first: a one-shot CLI call of a check whose imports are cheap pays no warm process (its start, and its end
    with the caller); the same check asked again in this process is forked from one."""
    preload = f"import json  # {os.getpid()}\n"  # a key no other test of this worker asked
    once = warm_python.run(PY, preload, "print('once')", [], ENV, timeout_s=60, cold_first=True)
    assert once.stdout == "once\n" and _warm_running() == []
    again = warm_python.run(PY, preload, "print('again')", [], ENV, timeout_s=60, cold_first=True)
    assert again.stdout == "again\n" and len(_warm_running()) == 1


def test_a_check_runs_in_the_callers_working_directory_with_no_stdin(tmp_path, monkeypatch):
    """A relative path in a check (`--model ./ckpt`) means what it means to the caller; nothing waits on stdin."""
    code = "import os, sys; print(os.getcwd(), repr(sys.stdin.read()))"
    monkeypatch.chdir(tmp_path)
    assert warm_python.run(PY, "import os\n", code, [], ENV, timeout_s=60).stdout == f"{tmp_path} ''\n"
    monkeypatch.chdir(tmp_path.parent)
    assert warm_python.run(PY, "import os\n", code, [], ENV, timeout_s=60).stdout == f"{tmp_path.parent} ''\n"


def test_a_check_gets_the_callers_environment_of_the_moment():
    code = "import os; print(os.environ.get('QUANTEVAL_PROBE'), os.environ.get('HF_HUB_OFFLINE'))"
    one = warm_python.run(PY, "import os\n", code, [], {**ENV, "QUANTEVAL_PROBE": "1", "HF_HUB_OFFLINE": "1"}, timeout_s=60)
    two = warm_python.run(PY, "import os\n", code, [], {**ENV, "QUANTEVAL_PROBE": "2", "HF_HUB_OFFLINE": "1"}, timeout_s=60)
    assert (one.stdout, two.stdout) == ("1 1\n", "2 1\n")


def test_a_framework_variable_gets_a_warm_process_of_its_own_and_at_most_max_warm_live():
    code = "import os; print(os.environ['VLLM_PROBE'])"
    for value in "abc":
        assert warm_python.run(PY, "import os\n", code, [], {**ENV, "VLLM_PROBE": value}, timeout_s=60).stdout == f"{value}\n"
    assert len(_warm_running()) == warm_python.MAX_WARM


def test_what_the_preload_prints_does_not_reach_the_answers():
    preload = "print('a framework that logs to stdout at import'); import json\n"
    answer = warm_python.run(PY, preload, "print('the answer')", [], ENV, timeout_s=60)
    assert answer.returncode == 0 and answer.stdout == "the answer\n"


def test_a_preload_that_fails_falls_back_to_a_cold_run():
    answer = warm_python.run(PY, "import no_such_framework_here\n", "print('cold')", [], ENV, timeout_s=60)
    assert answer.stdout == "cold\n"
    assert _warm_running() == []


def test_a_check_past_its_timeout_raises_and_leaves_no_process():
    with pytest.raises(subprocess.TimeoutExpired):
        warm_python.run(PY, "import time\n", "import time; time.sleep(60)", [], ENV, timeout_s=1)
    assert _warm_running() == []
    assert warm_python.run(PY, "import time\n", "print('again')", [], ENV, timeout_s=60).stdout == "again\n"


def test_the_warm_process_ends_when_its_owner_is_killed():
    owner = subprocess.Popen([PY, "-c", textwrap.dedent(f"""
        import os, sys, time
        from quanteval import envvars, warm_python
        warm_python.run({PY!r}, "import json\\n", "print(1)", [], {{**os.environ, "QUANTEVAL_STATE_DIR": {MARK!r}}}, timeout_s=60)
        print("warm", flush=True)
        time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None and owner.stdout.readline() == "warm\n"
    assert _warm_running()
    owner.send_signal(signal.SIGKILL)
    owner.wait(10)
    deadline = time.monotonic() + 10
    while _warm_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _warm_running() == []


def test_the_warm_process_and_its_hung_check_end_when_their_owner_is_killed(tmp_path):
    """The owner SIGKILLed while its check hangs (opening a FIFO nobody writes, as a FIFO given as a config does): the
    warm process notices its owner's EOF while it waits for the check, and neither is left behind."""
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    owner = subprocess.Popen([PY, "-c", textwrap.dedent(f"""
        import os, sys, time
        from quanteval import envvars, warm_python
        env = {{**os.environ, "QUANTEVAL_STATE_DIR": {MARK!r}}}
        warm_python.run({PY!r}, "import json\\n", "print(1)", [], env, timeout_s=60)
        print("warm", flush=True)
        warm_python.run({PY!r}, "import json\\n", "open({str(fifo)!r}).read()", [], env, timeout_s=600)
        """)], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None and owner.stdout.readline() == "warm\n"
    deadline = time.monotonic() + 10
    while len(_warm_running()) < 2 and time.monotonic() < deadline:  # the warm process and the check it forked
        time.sleep(0.1)
    assert len(_warm_running()) == 2, _warm_running()
    owner.send_signal(signal.SIGKILL)
    owner.wait(10)
    deadline = time.monotonic() + 10
    while _warm_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _warm_running() == []


@pytest.mark.slow
def test_sglangs_parser_answers_alike_warm_and_cold():
    """The real check: SGLang's parser (importable in this venv) accepts and refuses the same arguments twice."""
    pytest.importorskip("sglang.srt.server_args")
    good, bad = ["--model-path", "/m", "--port", "1"], ["--model-path", "/m", "--tp-size", "two"]
    first, again = check_server_args("sglang", good), check_server_args("sglang", good)
    refused, refused_again = check_server_args("sglang", bad), check_server_args("sglang", bad)
    assert first.ok and again.ok and first.message == again.message
    assert refused.ok is False and refused.message == refused_again.message and "invalid int value: 'two'" in refused.message


def test_a_preload_that_hangs_is_stopped_and_the_check_answers_cold_in_time():
    """A preload (or a forked check) that hangs costs the warm try's share of the time, not the whole of it: the warm
    process is stopped and the check runs cold once in the rest, so it still answers within its timeout."""
    started = time.monotonic()
    answer = warm_python.run(PY, "import time; time.sleep(60)\n", "print('cold')", [], ENV, timeout_s=8)
    assert answer.returncode == 0 and answer.stdout == "cold\n"
    assert time.monotonic() - started < 8
    assert _warm_running() == []
    assert "the check runs cold" in _log()


def test_a_check_that_hangs_everywhere_times_out_once_warm_once_cold():
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        warm_python.run(PY, "import json\n", "import time; time.sleep(60)", [], ENV, timeout_s=4)
    assert time.monotonic() - started < 8
    assert _warm_running() == []


def _log() -> str:
    return (envvars.state_dir() / warm_python.LOG_NAME).read_text()


THREAD = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), name='watcher', daemon=True).start()\n"


def test_a_preload_that_leaves_a_python_thread_is_never_forked_beside_and_says_so():
    """A fork beside a running Python thread could hang the child on a lock that thread holds: the warm process
    refuses, the check runs cold, and later checks with the same preload go cold without trying again."""
    for _ in range(2):
        answer = warm_python.run(PY, THREAD, "print('cold')", [], ENV, timeout_s=60)
        assert answer.returncode == 0 and answer.stdout == "cold\n"
        assert _warm_running() == []
    log = _log()
    assert log.count("refusing to fork: 1 Python thread(s) besides the main one (watcher)") == 1


def test_a_thread_started_after_the_preload_stops_the_forks():
    late = "import threading, time\nthreading.Timer(0.2, time.sleep, args=(60,)).start()\n"
    assert warm_python.run(PY, late, "print('warm')", [], ENV, timeout_s=60).stdout == "warm\n"
    time.sleep(0.5)
    assert warm_python.run(PY, late, "print('cold')", [], ENV, timeout_s=60).stdout == "cold\n"
    assert "refusing to fork" in _log() and _warm_running() == []


def test_what_the_warm_process_prints_is_kept_in_a_bounded_log(monkeypatch):
    warm_python.run(PY, "import sys; print('a warning at import', file=sys.stderr)\n", "print(1)", [], ENV, timeout_s=60)
    assert "a warning at import" in _log()
    warm_python.close_all()
    monkeypatch.setattr(warm_python, "MAX_LOG_BYTES", 10)
    warm_python.run(PY, "import sys; print('the next start', file=sys.stderr)\n", "print(1)", [], ENV, timeout_s=60)
    assert "a warning at import" not in _log() and "the next start" in _log()
    assert "a warning at import" in (envvars.state_dir() / (warm_python.LOG_NAME + ".1")).read_text()


def test_a_state_dir_that_cannot_take_the_log_costs_no_check(tmp_path, monkeypatch):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("QUANTEVAL_STATE_DIR", str(blocked / "state"))  # under a file: never a directory
    assert warm_python.run(PY, "import json\n", "print('answered')", [], ENV, timeout_s=60).stdout == "answered\n"
