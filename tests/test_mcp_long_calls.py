"""evaluate_quantization takes minutes; MCP clients give up on a request after 60 s. Driven through real clients nobody
here wrote, at their default timeouts: the MCP Inspector CLI (2.x, one stdio server per call) and the TypeScript SDK's
client (tests/mcp_clients, installed by `scripts/setup --dev`, run on the Node 22 installed there), with the real
nel-next on the embedded model. The real vLLM (CPU) serves it where the IDE quits mid-call (its whole process tree
must go, at each phase of the call); elsewhere a stand-in answers the sums, loading for 35 s where the length of the call is the point, or with
child processes of its own where leaving is.

- start_evaluation + wait_for_run reach the verdict from both clients at their defaults;
- the one-call form reaches it from a client that asks for progress with resetTimeoutOnProgress;
- a client that goes away mid-call (its request timed out and cancelled, stdio closed, HTTP session deleted) or a
  kill_run leaves no process running, vLLM included, and the ledger says cancelled / stopped.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import pytest
from mcp import Client
from processes import own_state_dir, running_with, wait_until
from tiers import BENCH, CHECKPOINTS, INSPECTOR, MCP_CLIENTS, NODE, REPO, VENV_BIN, own_lane, requires, user_env

from quanteval import ledger
from quanteval.localproc import free_port
from quanteval.workflow import runs

BASELINE, CANDIDATE = CHECKPOINTS / "tiny-add-bf16", CHECKPOINTS / "tiny-add-w8a8"
CLIENT_TIMEOUT_S = 60  # both clients' default request timeout (DEFAULT_REQUEST_TIMEOUT_MSEC in the TypeScript SDK)
STANDIN = [sys.executable, str(REPO / "tests" / "standins" / "fake_inference_server.py"), "--fake-answers", "sum"]
SERVER_DELAY_S = 35  # two servers this slow to load and the runs between: every evaluation outlasts CLIENT_TIMEOUT_S

pytestmark = requires("nel-next", "npm", "slow")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The test's own state dir (conftest sets it) for every process, and quanteval's console scripts first on PATH."""
    return user_env()


@pytest.fixture
def slow_env(env: dict[str, str]) -> dict[str, str]:
    """env, with a stand-in for vLLM (tests/standins, answering each sum as tiny-add does) that loads for SERVER_DELAY_S:
    every evaluation outlasts the clients' 60 s, and no CPU is spent on serving, which is not what these tests check
    (the tests below without it stop the real vLLM)."""
    return env | {"QUANTEVAL_VLLM_LAUNCHER": shlex.join([*STANDIN, "--fake-load-s", str(SERVER_DELAY_S)])}


@pytest.fixture
def standin_env(env: dict[str, str]) -> dict[str, str]:
    """env, with a stand-in for vLLM that has two child processes (as vLLM's engine core and worker) and answers in
    0.5 s, so a 1000-problem full run lasts long enough (~16 s at nel-next's 32 requests at a time) to be left mid-way
    after the call's next progress report (every 5 s); the real vLLM's case is the stdio one."""
    return env | {"QUANTEVAL_VLLM_LAUNCHER": shlex.join([*STANDIN, "--fake-load-s", "2", "--fake-workers", "2",
                                                          "--fake-answer-s", "0.5"])}


def arguments(tmp_path: Path, **more: object) -> dict[str, object]:
    """The one-call answer under the user's rule (at most 2 points lost): W8A8 loses none, so it is acceptable."""
    return {"baseline_checkpoint": str(BASELINE), "candidate_checkpoint": str(CANDIDATE), "benchmarks": [str(BENCH)],
            "output_dir": str(tmp_path / "out"), "max_drop": 2, **more}


def left_running(tmp_path: Path) -> list[str]:
    """A server (vLLM or its stand-in) on either checkpoint started for this test, and anything whose command line
    names this test's folder (nel runs, the job)."""
    mine = own_state_dir()
    return [*running_with("--model", str(BASELINE), state_dir=mine), *running_with("--model", str(CANDIDATE), state_dir=mine),
            *running_with("time.sleep(3600)", state_dir=mine), *running_with(str(tmp_path))]  # sleep: a stand-in's child


def assert_nothing_left(tmp_path: Path) -> None:
    """Every server stopped and no run or job left active, in /proc and where a user looks (list_runs), within a grace
    period."""
    wait_until(lambda: not left_running(tmp_path), 90, lambda: f"no process left; still: {left_running(tmp_path)}")

    def listed(kinds: tuple[str, ...]) -> list[tuple[str, str, str]]:
        return [(run.record_id, run.kind, run.status) for run in runs.list_runs(runs.ListRunsInput(limit=100)).runs
                if run.kind in kinds]

    # stopped, or cancelled: a server stopped before it was ready (evaluate records which), by the call's own cleanup
    # or, where the client SIGKILLed the server first (the TypeScript SDK's close allows 4 s), with its owner
    final = ("stopped", "cancelled")
    # 90 s as for the processes: under a full run's load (4 workers, load average 20) a cancelled call's cleanup took >30 s
    wait_until(lambda: all(status in final for _, _, status in listed(("deployment",))), 90,
               lambda: f"deployment records final; now: {listed(('deployment',))}")
    assert listed(("deployment",))
    active = [run for run in listed(("canary", "full_run", "evaluation")) if run[2] in ("running", "submitted", "pending")]
    assert not active


def a_full_run_is_going() -> bool:
    """A run that lasts (1000 problems, ~15 s): the cancel reaches it at the call's next progress report (every 5 s),
    where a 10-problem canary may finish first."""
    return bool(ledger.find(kind="full_run", status="running"))


def node_client(env: dict[str, str], mode: str, tool_arguments: dict, timeout_s: float = 900) -> dict:
    done = subprocess.run([str(NODE), str(MCP_CLIENTS / "ts_client.mjs"), mode, json.dumps(tool_arguments)], cwd=MCP_CLIENTS,
                          env={**env, "MCP_SERVER_ARGV": json.dumps([str(VENV_BIN / "quanteval-mcp")])},
                          capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert int(answer.pop("node").lstrip("v").split(".")[0]) >= 22, "not the project's Node 22"
    return answer


def inspector(env: dict[str, str], tool: str, **tool_arguments: object) -> dict:
    """One `mcp-inspector --cli` call: it starts its own quanteval-mcp over stdio, calls the tool, prints the result
    (exit 5 when the result is a tool error), and exits. It gives the server only the basics of its own environment
    (HOME, PATH, ...) and what -e names, as an IDE's server config does: the test's environment goes by -e."""
    forwarded = [arg for name, value in env.items() if name.isidentifier() and value  # it refuses an empty value
                 for arg in ("-e", f"{name}={value}")]
    argv = [str(NODE), str(INSPECTOR), "--cli", *forwarded, str(VENV_BIN / "quanteval-mcp"), "--method", "tools/call",
            "--tool-name", tool, "--tool-args-json", json.dumps(tool_arguments)]
    done = subprocess.run(argv, cwd=MCP_CLIENTS, env=env, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S + 30)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return json.loads(done.stdout)


# ---------------------------------------------------------------- the verdict at the clients' default timeouts


def test_the_inspector_cli_gets_the_verdict_from_start_evaluation_and_wait_for_run(slow_env, tmp_path):
    env = slow_env
    started = inspector(env, "start_evaluation", **arguments(tmp_path))
    assert not started.get("isError"), started
    record_id = started["structuredContent"]["record_id"]
    began, waits = time.monotonic(), 0
    while True:
        waited = inspector(env, "wait_for_run", record_id=record_id, timeout_s=45)["structuredContent"]
        waits += 1
        if waited["status"] != "running":
            break
        assert waited["progress"], waited  # what it is doing now, for the person watching
    assert waited["status"] == "succeeded", waited
    assert waited["result"]["verdict"] == "acceptable"
    assert waited["result"]["seconds"]["total"] > CLIENT_TIMEOUT_S or waits > 1, "finished too fast to prove anything"
    assert time.monotonic() - began > CLIENT_TIMEOUT_S, "the evaluation took under 60 s: the test proves nothing"
    assert_nothing_left(tmp_path)


def test_the_typescript_client_gets_the_one_call_verdict_when_progress_resets_its_timeout(slow_env, tmp_path):
    env = slow_env
    answer = node_client(env, "one-call", arguments(tmp_path))
    assert "error" not in answer, answer
    result = answer["result"]["structuredContent"]
    assert result["verdict"] == "acceptable"
    assert result["seconds"]["total"] > CLIENT_TIMEOUT_S, "the evaluation took under 60 s: the test proves nothing"
    assert answer["progress"] >= result["seconds"]["total"] / 10  # a notification at least every few seconds
    assert_nothing_left(tmp_path)
    # the start + wait form at the SDK's plain defaults (the full runs above are reused from the ledger)
    waited = node_client(env, "start-and-wait", arguments(tmp_path))
    assert "error" not in waited, waited
    assert waited["result"]["structuredContent"]["result"]["verdict"] == "acceptable"


# ---------------------------------------------------------------- a client that goes away leaves nothing running


def test_a_typescript_client_that_times_out_leaves_no_process_and_the_run_cancelled(slow_env, tmp_path):
    """Its default callTool asks for no progress, so it times out at 60 s and sends notifications/cancelled."""
    env = slow_env
    answer = node_client(env, "plain-call", arguments(tmp_path))
    assert answer.get("code") == -32001, answer  # "Request timed out": the client gave up, as the issue measured
    assert_nothing_left(tmp_path)
    assert ledger.find(kind="deployment")  # it got as far as serving


# Where an IDE may quit during one evaluate_quantization call, in the order they come, each named by the progress
# message that opens it and the state that proves it was reached: (phases, message, state reached). The candidate's
# server loads beside the baseline's canary and full run (~40 s against ~10 s), so one quit at the baseline's full
# run finds both: two phases for one pair of vLLM starts.
PHASES = [
    ("baseline server loading", "baseline: starting", lambda: bool(running_with("--model", str(BASELINE), state_dir=own_state_dir()))),
    ("baseline full run, the candidate's server loading beside it", "baseline: canary passed",
     lambda: bool(ledger.find(kind="full_run", status="running"))
     and bool(running_with("--model", str(CANDIDATE), state_dir=own_state_dir()))),
    ("candidate full run", "candidate: canary passed",
     lambda: any(r.details.get("checkpoint") == str(CANDIDATE) for r in ledger.find(kind="full_run", status="running"))),
    ("compare", "comparing", lambda: True),
]


@requires("vllm")
@own_lane("vllm-disconnect")  # its leftover checks name only its own state dir's servers: it may run beside the others
def test_closing_stdio_at_each_phase_of_an_evaluation_leaves_no_vllm_and_no_open_record(env, tmp_path):
    """The IDE quits (stdin closes) at each phase in turn, with the real vLLM (its engine core and worker processes):
    every server of the call stops, and no deployment or run is left loading, ready or running. One ledger for all
    phases: the candidate-full-run quit comes after the baseline's full run finished, so the compare phase reuses it
    (as a user's next call would). Served eager: the subject is what is left, not numerics (and each start is cheaper)."""
    for phase, message, reached in PHASES:
        server = subprocess.Popen([str(VENV_BIN / "quanteval-mcp")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, env=env, text=True)
        assert server.stdin is not None and server.stdout is not None
        call = {"name": "evaluate_quantization", "_meta": {"progressToken": "p"},
                "arguments": arguments(tmp_path, eager=True, canary_problems=5)}  # full runs of 1000: ~15 s to quit in
        for line in ({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                          "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
                     {"jsonrpc": "2.0", "method": "notifications/initialized"},
                     {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call}):
            server.stdin.write(json.dumps(line) + "\n")
        server.stdin.flush()
        seen: list = []
        answer: dict = {}
        watchdog = threading.Timer(600, server.kill)  # a server that stops reporting ends the loop below
        watchdog.start()
        for line in server.stdout:  # progress notifications, then the answer (id 2) if the call ends first
            answer = json.loads(line)
            seen.append(answer.get("params", {}).get("message") or answer.get("id"))
            if message in str(seen[-1]) or answer.get("id") == 2:
                break
        assert any(message in str(text) for text in seen), f"{phase}: never reached; progress: {seen}; answer: {answer}"
        wait_until(reached, 120, phase)
        server.stdin.close()  # the IDE quit
        assert server.wait(timeout=120) == 0, phase
        watchdog.cancel()
        assert_nothing_left(tmp_path)
    full_runs = {(r.details.get("checkpoint"), r.status) for r in ledger.find(kind="full_run")}
    assert (str(BASELINE), "succeeded") in full_runs and (str(CANDIDATE), "cancelled") in full_runs, full_runs


def test_dropping_the_http_session_mid_call_stops_the_servers_and_cancels_the_run(standin_env, tmp_path):
    env = standin_env
    port = free_port()
    # --root /: over HTTP the root defaults to the working directory, and the checkpoints and output lie apart
    server = subprocess.Popen([str(VENV_BIN / "quanteval-mcp"), "--http", "--port", str(port), "--root", "/"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answers() -> bool:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/mcp", timeout=1)
            except urllib.error.HTTPError:
                return True
            except OSError:
                return False
            return True

        wait_until(answers, 30, "the HTTP server")

        async def call_then_leave() -> None:
            answered: list[object] = []

            async def call(client: Client) -> None:
                answered.append(await client.call_tool("evaluate_quantization", arguments(tmp_path)))

            async with Client(f"http://127.0.0.1:{port}/mcp") as client, anyio.create_task_group() as group:
                group.start_soon(call, client)
                with anyio.fail_after(300):
                    while not a_full_run_is_going():
                        assert not answered, answered  # it ended before any run: an error to show
                        await anyio.sleep(0.5)
                group.cancel_scope.cancel()  # leaving the client deletes its session

        anyio.run(call_then_leave)
        assert_nothing_left(tmp_path)
        run_records = ledger.find(kinds=["canary", "full_run"])
        assert any(record.status == "cancelled" for record in run_records), [
            (r.id, r.status, [e.status for e in ledger.events(r.id)]) for r in run_records]
        assert server.poll() is None  # the server itself goes on serving other clients
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_kill_run_stops_a_started_evaluation_with_its_servers(standin_env, tmp_path):
    env = standin_env
    started = inspector(env, "start_evaluation", **arguments(tmp_path))["structuredContent"]
    wait_until(lambda: bool(ledger.find(kind="deployment")), 120, "its first server")
    listed = inspector(env, "list_runs")["structuredContent"]["runs"]
    assert {"evaluation", "deployment"} <= {row["kind"] for row in listed}  # what is running, visible to the user
    killed = runs.kill_run(runs.RunRef(record_id=started["record_id"]))  # up to a minute: it stops its servers first
    assert killed.status == "cancelled"
    assert_nothing_left(tmp_path)
