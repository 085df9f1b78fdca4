"""Faults leave nothing behind: a launch is recorded before it starts, secrets files are private from their creation,
and bad directories or a broken ledger give errors a person can act on, over MCP as on the CLI.

The slow ones (real vLLM, real sshd) are in test_faults_real.py, in the vLLM and SLURM lanes (tests/tiers.py).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from mcp import Client
from processes import running_with
from tiers import BENCH, REPO, requires

from quanteval import ledger
from quanteval.clusters import executor as executors
from quanteval.engines.nel_next import nelnext
from quanteval.faces.server import build_server
from quanteval.localproc import free_port

BF16, W8A8 = REPO / "examples" / "checkpoints" / "tiny-add-bf16", REPO / "examples" / "checkpoints" / "tiny-add-w8a8"
PLANTED = "planted-hf-token-5c4b3a2d1e"


def call(name: str, arguments: dict):
    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool(name, arguments)

    return anyio.run(go)


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[None]:
    """`directory` on a read-only bind mount: refused even to root, as a read-only share or snapshot is."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "--bind", str(directory), str(directory)], capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {mounted.stderr.decode()[-200:]}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(directory)], check=True, capture_output=True)
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True, capture_output=True)


def _nel_next_config(tmp_path: Path) -> str:
    from quanteval.workflow.nelconfig import BuildConfigInput, SetConfigValueInput, build_config, set_config_value

    config = build_config(BuildConfigInput(engine="nel-next", execution="local", deployment="none", model_type="chat_reasoning",
                                           benchmarks=[str(BENCH)], config_path=str(tmp_path / "eval.yaml"))).config_path
    for key, value in {"services.model.url": "http://127.0.0.1:9/v1/chat/completions", "services.model.model": "tiny",
                       "services.model.generation.max_tokens": 16, "output.dir": str(tmp_path / "runs")}.items():
        set_config_value(SetConfigValueInput(config_path=config, key=key, value=value))
    return config


def _nel_runs_of(config: str) -> list[str]:
    return running_with("eval", "run", config)


@pytest.fixture
def no_run_left(tmp_path):
    """Whatever a failing test started (each `nel eval run` in a session of its own) is stopped at teardown."""
    yield
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(tmp_path).encode() in cmdline.read_bytes() and b"eval" in cmdline.read_bytes():
                os.killpg(int(cmdline.parent.name), signal.SIGKILL)


# ---------------------------------------------------------------- 16: record first, then launch


@requires("nel-next")
@pytest.mark.parametrize("breakage", ["corrupt", "read-only"])
def test_a_ledger_that_cannot_record_stops_a_nel_next_launch_before_it_starts(tmp_path, no_run_left, breakage):
    config = _nel_next_config(tmp_path)
    ledger.add("dry_run", status="passed", config_path=config)  # an existing ledger, WAL mode, as after any tool call
    ledger_file = Path(os.environ["QUANTEVAL_LEDGER"])
    with contextlib.ExitStack() as stack:
        if breakage == "corrupt":
            for leftover in ledger_file.parent.glob(ledger_file.name + "-*"):
                leftover.unlink()
            ledger_file.write_bytes(b"this is not a SQLite database\n" * 200)
        else:
            stack.enter_context(read_only(ledger_file.parent))
        for tool, arguments in (("launch_canary", {"config_path": config, "limit_samples": 2}),
                                ("launch_canary", {"config_path": config, "limit_samples": 2}),  # a retry
                                ("launch_full_run", {"config_path": config, "force": True, "reason": "ledger test"})):
            result = call(tool, arguments)
            assert result.is_error, result.structured_content
            assert "ledger" in result.content[0].text and str(ledger_file) in result.content[0].text
            assert "internal error" not in result.content[0].text
            assert _nel_runs_of(config) == []  # nothing was started that no record names
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


@requires("nel-next")
def test_a_launch_is_in_the_ledger_before_its_process_and_says_what_started(tmp_path, no_run_left):
    config = _nel_next_config(tmp_path)
    result = call("launch_canary", {"config_path": config, "limit_samples": 2})
    assert not result.is_error, result.content[0].text
    record = ledger.get(result.structured_content["record_id"])
    try:
        history = [event.status for event in ledger.events(record.id)]
        assert history[:2] == ["launching", "running"]  # recorded, then started
        assert record.invocation_id and record.config_hash and record.executor == "local"
        assert record.details["engine"] == "nel-next" and record.details["pid"]
    finally:
        executors.LOCAL.cancel([nelnext.local_job(record.details)], grace_s=5)
    assert _nel_runs_of(config) == []


@pytest.fixture
def nel_env(tmp_path, monkeypatch):
    """NEL's execution database in the test's own directory, and a secret NEL writes to .secrets.env."""
    monkeypatch.setenv("NEMO_EVALUATOR_EXEC_DB_FILE", str(tmp_path / "nel-exec-db" / "exec.v1.jsonl"))
    monkeypatch.setenv("JUDGE_API_KEY", PLANTED)


def test_a_nel_launch_that_fails_is_recorded_failed_in_the_record_written_before_it(tmp_path, nel_env):
    """NEL 0.2.6 takes the same path: the record first, then NEL's launch, its failure in that record."""
    from test_runs import write_config

    config = write_config(tmp_path)
    result = call("launch_canary", {"config_path": str(config)})  # no Docker daemon here: NEL's launch fails
    assert result.is_error and "Docker" in result.content[0].text
    (canary,) = ledger.find(kind="canary")
    assert canary.status == "failed" and canary.details["engine"] == "nel" and canary.config_hash
    assert [event.status for event in ledger.events(canary.id)] == ["launching", "failed"]


# ---------------------------------------------------------------- 15: .secrets.env is private from its creation


@pytest.mark.slow
def test_a_nel_launch_that_fails_after_writing_its_scripts_leaves_no_readable_secret(tmp_path, monkeypatch, nel_env):
    """NEL 0.2.6 writes run.sh and .secrets.env, then refuses an untrusted pre_cmd: the launch fails with the files
    left behind. They were never readable by others: created 0600, not chmod-ed after the fact."""
    from test_runs import write_config

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"  # no Docker daemon can run here: a `docker info` that answers, so NEL goes on to render
    docker.write_text("#!/bin/sh\necho 27.0.0\n")
    docker.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("NEMO_EVALUATOR_TRUST_PRE_CMD", raising=False)
    config = write_config(tmp_path, tasks=("lm-evaluation-harness.ifeval",), extra="      pre_cmd: echo untrusted\n")
    result = call("launch_canary", {"config_path": str(config)})
    assert result.is_error and "NEMO_EVALUATOR_TRUST_PRE_CMD" in result.content[0].text
    secrets = sorted((tmp_path / "out").rglob(".secrets.env"))
    assert secrets, "NEL wrote no .secrets.env: the launch failed earlier than this test means"
    for path in secrets:
        assert PLANTED in path.read_text()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert PLANTED not in result.content[0].text
    (canary,) = ledger.find(kind="canary")
    assert canary.status == "failed"


def test_secrets_files_are_created_private_even_where_one_existed(tmp_path):
    """The creation itself: no window in which the file exists readable (NEL's open() and Path.write_text)."""
    code = """
import os, stat, sys
from pathlib import Path
from quanteval.engines.rendering import secrets_private_from_creation
target = Path(sys.argv[1])
(target / ".secrets.env").write_text("old")
os.chmod(target / ".secrets.env", 0o644)
with secrets_private_from_creation():
    with open(target / ".secrets.env", "w") as handle:
        print(oct(stat.S_IMODE(os.fstat(handle.fileno()).st_mode)))
    (target / "a").mkdir()
    (target / "a" / ".secrets.env").write_text("x")
    (target / "run.sh").write_text("x")
print(oct(stat.S_IMODE((target / "a" / ".secrets.env").stat().st_mode)), oct(stat.S_IMODE((target / "run.sh").stat().st_mode)))
"""
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "mcp_server")})
    opened, created = done.stdout.split("\n", 1)
    assert opened == "0o600"  # private while empty, before a byte of the secret is written
    assert created.split() == ["0o600", "0o644"]  # other files keep their modes


# ---------------------------------------------------------------- 18: clear errors, and before anything is served


@pytest.fixture
def standin_vllm(monkeypatch) -> str:
    """An OpenAI-compatible stand-in for vLLM (these tests are about what happens before or around serving)."""
    launcher = shlex.join([sys.executable, str(REPO / "tests" / "standins" / "fake_inference_server.py"), "--fake-load-s", "0.2"])
    monkeypatch.setenv("QUANTEVAL_VLLM_LAUNCHER", launcher)
    return launcher


def _evaluate_arguments(output_dir: Path, bench: Path = BENCH) -> dict:
    return {"baseline_checkpoint": str(BF16), "candidate_checkpoint": str(W8A8), "benchmarks": [str(bench)],
            "output_dir": str(output_dir)}


@requires("nel-next")
def test_a_read_only_output_directory_is_a_clear_error_naming_it(tmp_path, standin_vllm):
    shared = tmp_path / "shared"
    with read_only(shared):
        result = call("evaluate_quantization", _evaluate_arguments(shared))
        built = call("build_config", {"engine": "nel-next", "execution": "local", "deployment": "none",
                                      "model_type": "chat_reasoning", "benchmarks": [str(BENCH)],
                                      "config_path": str(shared / "eval.yaml")})
    for answer in (result, built):
        text = answer.content[0].text
        assert answer.is_error and str(shared) in text and "Read-only file system" in text, text
        assert "internal error" not in text
    assert ledger.find(kind="deployment") == []  # refused before anything was served


@requires("nel-next")
def test_a_benchmark_file_with_a_syntax_error_is_refused_before_anything_is_served(tmp_path, standin_vllm):
    bench = tmp_path / "typo.py"
    bench.write_text(BENCH.read_text().replace("def ", "def def ", 1))
    result = call("evaluate_quantization", _evaluate_arguments(tmp_path / "out", bench))
    text = result.content[0].text
    assert result.is_error and f"{bench}:" in text and "invalid syntax" in text, text
    assert ledger.find(kind="deployment") == []
    # validate_config says the same of a config naming it
    config = _nel_next_config(tmp_path)
    call("set_config_value", {"config_path": config, "key": "benchmarks[0].name", "value": str(bench)})
    checked = call("validate_config", {"config_path": config}).structured_content
    assert [p["rule"] for p in checked["problems"] if p["severity"] == "error"] == ["benchmark_syntax_error"]


def test_serve_eval_health_with_a_binary_ns_command_says_what_is_wrong(tmp_path):
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as server_log:
        server = subprocess.Popen([str(Path(sys.executable).parent / "quanteval"), "serve-eval", "--port", str(port),
                                   "--output-root", str(tmp_path / "jobs"), "--ns-command", "/bin/false"],
                                  stdout=subprocess.DEVNULL, stderr=server_log, start_new_session=True)
    try:
        answer = None
        for _ in range(150):
            with contextlib.suppress(httpx.HTTPError):
                answer = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10, trust_env=False)
                break
            time.sleep(0.2)
        assert answer is not None, log.read_text()[-2000:]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    assert answer.status_code == 503
    body = answer.json()
    assert body["status"] == "not_ready" and body["backend_ready"] is False
    assert "/bin/false" in body["hint"] and "not a NeMo-Skills" in body["hint"]
    assert "Traceback" not in log.read_text() and "UnicodeDecodeError" not in log.read_text()


def test_a_child_that_ends_between_tool_calls_is_reaped_without_one(tmp_path):
    """A server or job this process started and that ended is collected within a few seconds, with no tool call to
    reap it: no zombie lingers under a long-running MCP server."""
    from quanteval import localproc

    child = subprocess.Popen(["true"], start_new_session=True)
    localproc.adopt(child)

    def state() -> str:
        try:
            return Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return "gone"

    deadline = time.monotonic() + 5  # a few reaper intervals
    while state() != "gone" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state() == "gone", state()
