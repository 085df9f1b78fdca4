"""The eval server for training loops over real HTTP, with the `ns` stand-in (tests/standins/fake_ns.py) where
a job must take a chosen time (queueing, idempotency, shutdown) and the `nel` stand-in; both query a real local
OpenAI-compatible router. What the real NeMo-Skills does is tested in test_evalserver_real_ns.py."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import pytest
import yaml
from mcp import Client
from processes import still_running

from quanteval import ledger
from quanteval.evalserver import backend, jobs, liveness, nel
from quanteval.faces import evalhttp, evalserver
from quanteval.faces.evalserver import ServerSettings
from quanteval.localproc import free_port, group_members
from quanteval.models import ToolError

STANDINS = Path(__file__).parent / "standins"
sys.path.insert(0, str(STANDINS))
from openai_router import Router  # noqa: E402


@pytest.fixture
def router():
    r = Router()
    yield r
    r.close()


def _executable(directory: Path, name: str, script: Path) -> str:
    path = directory / name
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def commands(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    return {"ns": _executable(bin_dir, "ns", STANDINS / "fake_ns.py"),
            "nel": _executable(bin_dir, "nel", STANDINS / "fake_nel.py")}


def http_request(url: str, method: str, path: str, body: object = None, raw: bytes | None = None,
                 headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class RunningServer:
    """The HTTP server in a thread of this process (the tools test below runs it as its own process)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        ready, self.stop = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=evalhttp.serve, args=(settings, ready, self.stop), daemon=True)
        self.thread.start()
        assert ready.wait(10)
        self.url = f"http://127.0.0.1:{settings.port}"

    def request(self, method: str, path: str, body: object = None, **kwargs) -> tuple[int, dict]:
        return http_request(self.url, method, path, body, **kwargs)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


@pytest.fixture
def make_server(tmp_path: Path, commands: dict[str, str]):
    servers = []

    def make(**overrides) -> RunningServer:
        options = {"output_root": tmp_path / "out", "ns_command": commands["ns"], "nel_command": commands["nel"],
                   "results_wait_s": 5, "port": free_port(), **overrides}
        servers.append(RunningServer(ServerSettings(**options)))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def payload(router_url: str, *benchmarks: dict, rollout_id: int = 7, defaults: dict | None = None) -> dict:
    return {"rollout_id": rollout_id, "router_url": router_url, "defaults": defaults or {},
            "benchmarks": list(benchmarks)}


def wait_for(predicate, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------
# Payload validation: 400, before any work
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"router_url": "http://x", "benchmarks": [{"name": "aime25"}]}, "rollout_id"),
        ({"rollout_id": 1, "router_url": "http://x", "benchmarks": [{"name": ""}]}, "must not be empty"),
        ({"rollout_id": 1, "router_url": "http://x", "benchmarks": [{"name": "aime25:4"}]}, "must not contain ':'"),
        ({"rollout_id": 1, "router_url": "http://x", "benchmarks": [{"name": "../etc"}]}, "plain name"),
        ({"rollout_id": 1, "router_url": "localhost:3000", "benchmarks": [{"name": "a"}]}, "http(s) URL"),
        ({"rollout_id": 1, "router_url": "http://x", "benchmarks": []}, "benchmarks"),
        ({"rollout_id": 1, "router_url": "http://x", "benchmarks": [{"name": "a", "top_p": 2}]}, "top_p"),
        ({"rollout_id": "seven", "router_url": "http://x", "benchmarks": [{"name": "a"}]}, "rollout_id"),
    ],
)
def test_bad_payloads_get_400_with_the_reason(make_server, body, reason):
    server = make_server()
    status, answer = server.request("POST", "/evaluate", body)
    assert status == 400
    assert reason in answer["error"]
    assert sum(server.request("GET", "/health")[1]["jobs"].values()) == 0


def test_non_json_and_non_object_bodies_get_400(make_server):
    server = make_server()
    assert server.request("POST", "/evaluate", raw=b"{nope")[0] == 400
    status, answer = server.request("POST", "/jobs", [1, 2])
    assert status == 400 and "JSON object" in answer["error"]
    assert server.request("GET", "/nowhere")[0] == 404
    assert server.request("GET", "/jobs/unknown")[0] == 404


def test_top_k_with_the_openai_server_type_is_a_400_up_front(make_server, router):
    server = make_server(server_type="openai")
    status, answer = server.request("POST", "/evaluate", payload(router.url, {"name": "gsm8k", "top_k": 20}))
    assert status == 400 and "top_k=20" in answer["error"] and "--server-type sglang" in answer["error"]
    assert router.requests == [] and sum(server.request("GET", "/health")[1]["jobs"].values()) == 0
    # top_k -1 (disabled) is fine with it
    assert server.request("POST", "/evaluate", payload(router.url, {"name": "gsm8k", "top_k": -1}))[0] == 200


# ---------------------------------------------------------------------------------------------
# Evaluations through the stand-in: shape, failures, queueing
# ---------------------------------------------------------------------------------------------


def test_evaluate_answers_slimes_shape_and_sends_name_n_like_the_reference(make_server, router):
    server = make_server(max_concurrent_requests=64)
    body = payload(router.url, {"name": "aime25", "n_samples_per_eval_prompt": 1}, {"name": "gsm8k"},
                   defaults={"temperature": 0.6, "max_response_len": 2048})
    status, answer = server.request("POST", "/evaluate", body)
    assert status == 200, answer
    assert {"job_id", "command", "output_dir", "log_path", "raw_metrics", "runs", "metrics"} <= set(answer)
    argvs = [json.loads((Path(run["output_dir"]) / "argv.json").read_text())["argv"] for run in answer["runs"]]
    # slime's reference sends `name:N` whenever N is set, `name:1` included (a seeded sample, not greedy)
    assert argvs[0][argvs[0].index("--benchmarks") + 1] == "aime25:1"
    assert argvs[1][argvs[1].index("--benchmarks") + 1] == "gsm8k"
    assert argvs[0][argvs[0].index("--server_type") + 1] == "sglang"
    assert {"++inference.temperature=0.6", "++inference.tokens_to_generate=2048", "++max_concurrent_requests=64"} <= set(argvs[0])
    assert answer["metrics"]["gsm8k/pass@1/symbolic_correct"] == pytest.approx(100 * 11 / 12)
    # the ledger is written off the request's path, in order, within moments
    wait_for(lambda: ledger.get(answer["job_id"]).status == "succeeded", 10, "the ledger")
    assert ledger.get(answer["job_id"]).kind == "eval_job"


def test_a_failing_benchmark_is_not_a_200_but_the_good_metrics_are_in_the_body(make_server, router):
    server = make_server()
    status, answer = server.request("POST", "/evaluate", payload(router.url, {"name": "failbench"}, {"name": "gsm8k"}))
    assert status == 502
    failed, ok = answer["runs"]
    # the stand-in exits 0 like the real `ns eval`: the missing metrics.json is what tells
    assert failed["status"] == "failed" and "wrote no" in failed["error"] and "metrics.json" in failed["error"]
    assert "RuntimeError: judge server unreachable" in failed["log_tail"]
    assert ok["status"] == "succeeded"
    assert answer["metrics"]["gsm8k/pass@1/symbolic_correct"] == pytest.approx(100 * 11 / 12)
    assert answer["error"].startswith("failbench:")
    wait_for(lambda: ledger.get(answer["job_id"]).status == "failed", 10, "the ledger")


def test_allow_partial_restores_200_for_partial_failure_only(make_server, router):
    server = make_server(allow_partial=True)
    status, answer = server.request("POST", "/evaluate", payload(router.url, {"name": "failbench"}, {"name": "gsm8k"}))
    assert status == 200 and answer["errors"] and "gsm8k" in answer["raw_metrics"]
    status, answer = server.request("POST", "/evaluate", payload(router.url, {"name": "failbench"}, rollout_id=8))
    assert status == 502


def test_jobs_run_concurrently_up_to_the_limit_and_queue_beyond_it(make_server, router):
    server = make_server(max_concurrent_jobs=2)
    started = time.monotonic()
    ids = [server.request("POST", "/jobs", payload(router.url, {"name": "slowbench"}, rollout_id=i))[1]["job_id"]
           for i in range(3)]
    seen = set()
    while True:
        statuses = [server.request("GET", f"/jobs/{job_id}")[1]["status"] for job_id in ids]
        seen.add(tuple(sorted(statuses)))
        if all(s in ("succeeded", "failed") for s in statuses):
            break
        assert time.monotonic() - started < 60
        time.sleep(0.1)
    elapsed = time.monotonic() - started
    assert ("queued", "running", "running") in seen  # two ran while the third waited
    assert all(server.request("GET", f"/jobs/{job_id}")[1]["status"] == "succeeded" for job_id in ids)
    # each job sleeps 3 s: two in parallel then one -> about 6 s, not 9 (serial) and not 3 (unbounded)
    assert 5.5 < elapsed < 8.9


def test_missing_ns_makes_health_not_ready_with_how_to_install(make_server, router, tmp_path):
    server = make_server(ns_command=str(tmp_path / "no-such-ns"))
    status, health = server.request("GET", "/health")
    assert status == 503 and health["status"] == "not_ready" and health["backend_ready"] is False
    assert "not on PyPI" in health["hint"]
    status, answer = server.request("POST", "/evaluate", payload(router.url, {"name": "aime25"}))
    assert status == 502 and "exited with code 127" in answer["error"]
    assert "cannot start" in answer["runs"][0]["log_tail"][0]


def test_an_ns_without_nemo_skills_behind_it_is_not_ready(make_server):
    # an `ns` whose interpreter has no nemo_skills is not a NeMo-Skills `ns`: not ready, and says why
    server = make_server()
    status, health = server.request("GET", "/health")
    assert status == 503 and health["ns_version"] is None and "can report" in health["hint"]


# ---------------------------------------------------------------------------------------------
# Idempotency and orphaned jobs: a retried request starts no second job, a dead server's jobs are not left running
# ---------------------------------------------------------------------------------------------


def test_a_retry_with_the_same_payload_attaches_to_the_running_job(make_server, router):
    server = make_server()
    body = payload(router.url, {"name": "slowbench"}, rollout_id=3)
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(server.request("POST", "/evaluate", body)))
               for _ in range(3)]
    for thread in threads:
        thread.start()
        time.sleep(0.3)
    for thread in threads:
        thread.join(60)
    assert [status for status, _ in answers] == [200, 200, 200]
    assert len({answer["job_id"] for _, answer in answers}) == 1
    assert len(router.requests) == 12  # one evaluation, not three
    assert server.request("GET", "/health")[1]["jobs"]["succeeded"] == 1
    # a later retry (after a read timeout) gets the finished result, no new run
    status, again = server.request("POST", "/evaluate", body)
    assert status == 200 and again["job_id"] == answers[0][1]["job_id"] and len(router.requests) == 12
    # another payload for the same rollout is another evaluation
    other = payload(router.url, {"name": "gsm8k"}, rollout_id=3)
    assert server.request("POST", "/evaluate", other)[1]["job_id"] != again["job_id"]


def test_an_idempotency_key_attaches_its_own_payload_and_refuses_another_with_409(make_server, router):
    """A retry under the same Idempotency-Key attaches; the key sent with another payload would answer it with the
    first payload's results: 409 naming the key, and no job."""
    server = make_server()
    first = server.request("POST", "/jobs", payload(router.url, {"name": "slowbench"}, rollout_id=1),
                           headers={"Idempotency-Key": "step-100"})[1]
    retry = server.request("POST", "/jobs", payload(router.url, {"name": "slowbench"}, rollout_id=1),
                           headers={"Idempotency-Key": "step-100"})[1]
    status, other = server.request("POST", "/jobs", payload(router.url, {"name": "slowbench"}, rollout_id=2),
                                   headers={"Idempotency-Key": "step-100"})
    assert first["attached"] is False and retry["attached"] is True and first["job_id"] == retry["job_id"]
    assert status == 409 and "'step-100'" in other["error"] and "another payload" in other["error"], other
    assert sum(server.request("GET", "/health")[1]["jobs"].values()) == 1


@pytest.mark.parametrize(("sampling", "reason"), [
    ({"temperature": float("nan")}, "NaN is not a JSON number"),
    ({"temperature": 1e308}, "temperature"),
    ({"top_p": float("inf")}, "Infinity is not a JSON number"),
    ({"top_k": 10**40}, "top_k"),
])
@pytest.mark.parametrize("where", ["benchmark", "defaults"])
def test_sampling_values_that_are_not_finite_or_sane_get_400(make_server, sampling, reason, where):
    """NaN and 1e308 were passed to `ns` as they were, in a benchmark or in the defaults it falls back to."""
    import json as jsonlib

    server = make_server()
    body = {"rollout_id": 1, "router_url": "http://x", "benchmarks": [{"name": "a", **(sampling if where == "benchmark" else {})}],
            "defaults": sampling if where == "defaults" else {}}
    status, answer = server.request("POST", "/evaluate", raw=jsonlib.dumps(body).encode())  # json.dumps writes NaN as is
    assert status == 400 and reason in answer["error"], answer
    assert sum(server.request("GET", "/health")[1]["jobs"].values()) == 0


def test_a_body_nested_past_the_parsers_depth_gets_a_clear_400(make_server):
    server = make_server()
    for depth in (40, 5000):
        nested = b'{"rollout_id": 1, "defaults": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"
        status, answer = server.request("POST", "/evaluate", raw=nested)
        assert status == 400 and "nested deeper" in answer["error"], (depth, answer)
    assert server.request("GET", "/health")[0] in (200, 503)  # still serving


def test_a_failed_job_is_not_reused_by_a_retry(make_server, router):
    server = make_server()
    body = payload(router.url, {"name": "failbench"})
    first = server.request("POST", "/evaluate", body)[1]
    second = server.request("POST", "/evaluate", body)[1]
    assert first["job_id"] != second["job_id"]


def _abandon(url: str, body: dict) -> None:
    """Send /evaluate and hang up without reading the answer, as a client whose read timed out."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("POST", "/evaluate", json.dumps(body), {"Content-Type": "application/json"})
    time.sleep(0.5)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def test_an_abandoned_evaluate_job_is_cancelled_after_the_grace_period(make_server, router, caplog):
    server = make_server(orphan_grace_s=1.0)
    _abandon(server.url, payload(router.url, {"name": "slowbench"}, {"name": "gsm8k"}, rollout_id=9))
    wait_for(lambda: server.request("GET", "/health")[1]["jobs"]["cancelled"] == 1, 20, "the orphan to be cancelled")
    wait_for(lambda: ledger.find(kind="eval_job")[0].status == "cancelled", 10, "the ledger")
    [record] = ledger.find(kind="eval_job")
    assert "no client waited" in (ledger.events(record.id)[-1].message or "")
    assert len(router.requests) == 0  # gsm8k, after slowbench, never started
    assert "went away" in caplog.text and "Traceback" not in caplog.text


def test_a_jobs_job_runs_to_the_end_with_nobody_waiting(make_server, router):
    server = make_server(orphan_grace_s=0.5)
    job = server.request("POST", "/jobs", payload(router.url, {"name": "slowbench"}))[1]
    wait_for(lambda: server.request("GET", f"/jobs/{job['job_id']}")[1]["status"] == "succeeded", 30, "the job")


def test_a_retry_within_the_grace_period_rescues_the_orphan(make_server, router):
    server = make_server(orphan_grace_s=2.0)
    body = payload(router.url, {"name": "slowbench"}, rollout_id=11)
    _abandon(server.url, body)
    status, answer = server.request("POST", "/evaluate", body)
    assert status == 200 and answer["status"] == "succeeded"
    assert server.request("GET", "/health")[1]["jobs"] == {"queued": 0, "running": 0, "succeeded": 1, "failed": 0,
                                                           "cancelled": 0}


def test_finished_jobs_beyond_the_limit_leave_memory_but_stay_in_the_ledger(make_server, router, monkeypatch):
    monkeypatch.setattr(jobs, "FINISHED_JOBS_KEPT", 2)  # 100 in the server: memory stays flat for days
    server = make_server()
    ids = [server.request("POST", "/evaluate", payload(router.url, {"name": "gsm8k"}, rollout_id=i))[1]["job_id"]
           for i in range(4)]
    assert server.request("GET", f"/jobs/{ids[0]}")[0] == 404
    assert server.request("GET", f"/jobs/{ids[-1]}")[0] == 200
    assert server.request("GET", "/health")[1]["jobs"]["succeeded"] == 4  # counted since start, not in memory
    wait_for(lambda: ledger.get(ids[0]).status == "succeeded", 10, "the ledger")


# ---------------------------------------------------------------------------------------------
# Reachability and auth (item 1)
# ---------------------------------------------------------------------------------------------


def test_binding_beyond_loopback_without_a_token_is_refused(tmp_path, commands, monkeypatch):
    monkeypatch.delenv("QUANTEVAL_EVAL_TOKEN", raising=False)
    done = subprocess.run([sys.executable, "-m", "quanteval.faces.cli", "serve-eval", "--host", "0.0.0.0", "--port",
                           str(free_port()), "--output-root", str(tmp_path / "o"), "--ns-command", commands["ns"]],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "QUANTEVAL_EVAL_TOKEN" in done.stderr and "refusing to bind 0.0.0.0" in done.stderr
    with pytest.raises(ToolError, match="requires a shared token"):
        evalserver.start_eval_server(evalserver.StartEvalServerInput(bind_host="0.0.0.0", port=free_port(),
                                                                     output_root=tmp_path / "x"))


def test_with_a_token_every_route_but_health_needs_it(make_server, router, monkeypatch):
    monkeypatch.setenv("EVAL_TOKEN_FOR_TEST", "s3cret-token-0123456789")
    server = make_server(bind_host="0.0.0.0", token_env="EVAL_TOKEN_FOR_TEST")
    body = payload(router.url, {"name": "gsm8k"})
    status, answer = server.request("POST", "/evaluate", body)
    assert status == 401 and "EVAL_TOKEN_FOR_TEST" in answer["error"] and "s3cret-token-0123456789" not in answer["error"]
    assert server.request("POST", "/evaluate", body, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert server.request("GET", "/jobs/x")[0] == 401
    assert server.request("GET", "/health")[0] == 503  # open for probes; the stand-in `ns` has no version
    status, answer = server.request("POST", "/evaluate", body, headers={"Authorization": "Bearer s3cret-token-0123456789"})
    assert status == 200 and router.requests


# ---------------------------------------------------------------------------------------------
# Shutdown on a real SIGTERM (item 3)
# ---------------------------------------------------------------------------------------------


def test_sigterm_stops_every_job_and_child_and_answers_in_flight_with_503(tmp_path, commands, router):
    port = free_port()
    out = tmp_path / "srv"
    env = {**os.environ, "FAKE_NS_SLEEP_S": "60", "FAKE_NS_CHILDREN": "2"}
    with (tmp_path / "server.log").open("wb") as server_log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen([sys.executable, "-m", "quanteval.faces.cli", "serve-eval", "--port", str(port),
                                 "--output-root", str(out), "--ns-command", commands["ns"], "--max-concurrent-jobs", "1"],
                                stdout=subprocess.DEVNULL, stderr=server_log, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _up(url), 30, "the server")
        answers: list = []
        running = payload(router.url, {"name": "slowbench"}, {"name": "gsm8k"}, rollout_id=1)
        queued = payload(router.url, {"name": "gsm8k"}, rollout_id=2)
        threads = [threading.Thread(target=lambda b=b: answers.append(http_request(url, "POST", "/evaluate", b)))
                   for b in (running, queued)]
        threads[0].start()
        wait_for(lambda: list(out.glob("*/slowbench/argv.json")), 20, "the first job to start")
        threads[1].start()
        # ns and the children it started, in their own process group; and the second job queued behind the first
        # (under load its request could still be on its way when SIGTERM came: then no job of it to cancel)
        wait_for(lambda: len(_ns_pids(proc.pid)) >= 3, 20, "ns and its children")
        wait_for(lambda: len(ledger.find(kind="eval_job")) == 2, 20, "the second job to be queued")
        ns_pids = _ns_pids(proc.pid)
        proc.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(30)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sorted(status for status, _ in answers) == [503, 503]
    assert all("SIGTERM" in answer["error"] for _, answer in answers)
    assert not any(still_running(pid) for pid in ns_pids)
    assert len(router.requests) == 0  # gsm8k of either job never started
    assert sorted(r.status for r in ledger.find(kind="eval_job")) == ["cancelled", "cancelled"]
    assert "Traceback" not in (tmp_path / "server.log").read_text()


def _up(url: str) -> bool:
    try:
        http_request(url, "GET", "/health", timeout=2)
        return True
    except OSError:
        return False


def _ns_pids(server_pid: int) -> list[int]:
    """Processes the server started for `ns` (their own process group, whose leader's parent is the server)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pgid = int(fields[2])
        if pgid != server_pid and _parent(pgid) == server_pid:
            pids.append(int(stat.parent.name))
    return pids


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None




# ---------------------------------------------------------------------------------------------
# The nel backend
# ---------------------------------------------------------------------------------------------


def test_nel_backend_maps_benchmarks_to_ns_tasks_and_reads_results_yml(make_server, router):
    server = make_server(backend="nel", max_concurrent_requests=32)
    body = payload(router.url, {"name": "aime25", "n_samples_per_eval_prompt": 4, "top_k": 20, "max_problems": 5},
                   defaults={"temperature": 1.0, "max_response_len": 1024})
    status, answer = server.request("POST", "/evaluate", body)
    assert status == 200, answer
    config = yaml.safe_load((Path(answer["runs"][0]["output_dir"]) / "nel_config.yaml").read_text())
    task = config["evaluation"]["tasks"][0]
    assert task["name"] == "ns_aime2025"
    assert task["nemo_evaluator_config"]["config"]["params"] == {
        "parallelism": 32, "temperature": 1.0, "max_new_tokens": 1024, "limit_samples": 5,
        "extra": {"num_repeats": 4, "args": "++inference.top_k=20"}}
    assert config["target"]["api_endpoint"]["url"] == f"{router.url}/v1/chat/completions"
    # 12 prompts x 4 repeats, 1+1 wrong every time: 44/48
    assert answer["metrics"]["aime25/symbolic_correct/symbolic_correct"] == pytest.approx(44 / 48)
    assert answer["metrics"]["aime25/symbolic_correct/num_entries"] == 48


@pytest.mark.slow
def test_nel_backend_config_passes_nels_own_dry_run(tmp_path, router):
    settings = ServerSettings(output_root=tmp_path, backend="nel")
    request = backend.EvalRequest(rollout_id=1, router_url=router.url,
                                  benchmarks=[{"name": "gpqa", "n_samples_per_eval_prompt": 2}])
    config = nel.nel_config(settings, request, request.benchmarks[0], tmp_path / "out")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "DUMMY_API_KEY": "EMPTY", "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"}
    nel_cli = Path(sys.executable).parent / "nel"
    out = subprocess.run([str(nel_cli), "run", "--config", str(path), "--dry-run"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "ns_gpqa" in out.stdout + out.stderr


def test_unknown_benchmark_for_nel_fails_that_run_with_did_you_mean(make_server, router):
    server = make_server(backend="nel", allow_partial=True)
    status, answer = server.request("POST", "/evaluate", payload(router.url, {"name": "aime2O25"}, {"name": "gpqa"}))
    assert status == 200
    assert answer["runs"][0]["status"] == "failed"
    assert "no NEL nemo_skills task" in answer["runs"][0]["error"] and "Did you mean" in answer["runs"][0]["error"]
    assert answer["runs"][1]["status"] == "succeeded"


def test_task_map_comes_from_the_task_catalogue():
    mapping = nel.task_map()
    assert mapping["aime25"] == "ns_aime2025" and mapping["gpqa"] == "ns_gpqa"
    assert nel.nel_task_for("ns_hle") == "ns_hle"


def test_nel_shard_merge_by_hand():
    merged = nel.merge_shard_metrics([
        {"pass@1": {"num_entries": 30, "acc": 50.0}},
        {"pass@1": {"num_entries": 10, "acc": 90.0}},
    ])
    # (30*50 + 10*90) / 40 = 60
    assert merged == {"pass@1": {"num_entries": 40, "acc": 60.0}}
    assert jobs.flatten_metrics({"b": {"m": {"x": 1, "flag": True, "name": "s"}}}) == {"b/m/x": 1.0}


# ---------------------------------------------------------------------------------------------
# The tools: every serve-eval option, a real server process, over MCP too
# ---------------------------------------------------------------------------------------------


def test_every_serve_eval_option_is_reachable_from_start_eval_server():
    from quanteval.faces.cli import build_parser

    parser = build_parser()
    serve_eval = next(a for a in parser._subparsers._group_actions[0].choices.values() if a.prog.endswith("serve-eval"))
    flags = {a.dest for a in serve_eval._actions if a.dest != "help"}
    assert flags == set(evalserver.StartEvalServerInput.model_fields)
    # and what start_eval_server is given survives the trip through the command line
    settings = ServerSettings(output_root=Path("/x"), bind_host="0.0.0.0", allow_partial=True, server_type="vllm",
                              orphan_grace_s=5, data_dir="/d", cluster="c", config_dir="/c", token_env="T")
    args = serve_eval.parse_args(evalserver.option_argv(settings))
    assert ServerSettings.model_validate({k: getattr(args, k) for k in ServerSettings.model_fields}) == settings


def test_start_status_stop_eval_server_over_mcp_leave_nothing_behind(tmp_path, commands, router):
    from quanteval.faces.server import build_server

    port = free_port()

    async def go():
        async with Client(build_server()) as client:
            started = await client.call_tool("start_eval_server", {
                "port": port, "output_root": str(tmp_path / "srv"), "ns_command": commands["ns"], "orphan_grace_s": 5})
            info = started.structured_content
            assert info["status"] == "running" and info["auth"] == "none (loopback)"
            assert info["health"]["status"] == "not_ready"  # the stand-in has no NeMo-Skills version to report
            status, answer = http_request(info["url"], "POST", "/evaluate", payload(router.url, {"name": "gsm8k"}))
            assert status == 200 and answer["metrics"]["gsm8k/pass@1/symbolic_correct"] == pytest.approx(100 * 11 / 12)
            status_now = (await client.call_tool("eval_server_status", {"record_id": info["record_id"]})).structured_content
            assert status_now["status"] == "running" and status_now["health"]["jobs"]["succeeded"] == 1
            refused = await client.call_tool("start_eval_server", {"port": port, "output_root": str(tmp_path / "x")})
            assert refused.is_error and "in use" in refused.content[0].text
            stopped = (await client.call_tool("stop_eval_server", {"record_id": info["record_id"]})).structured_content
            assert stopped["status"] == "stopped"
            return info

    info = anyio.run(go)
    assert not group_members(info["pid"])
    assert evalserver.eval_server_status(evalserver.EvalServerIdInput(record_id=info["record_id"])).status == "stopped"
    again = evalserver.start_eval_server(evalserver.StartEvalServerInput(
        port=port, output_root=tmp_path / "srv2", ns_command=commands["ns"]))
    evalserver.stop_eval_server(evalserver.EvalServerIdInput(record_id=again.record_id))


def test_status_of_a_record_that_is_not_an_eval_server_is_refused():
    record = ledger.add("canary", status="running")
    with pytest.raises(ToolError, match="not an eval server"):
        evalserver.eval_server_status(evalserver.EvalServerIdInput(record_id=record.id))


def test_one_liveness_check_for_eval_server_status_and_list_runs(tmp_path):
    """A server whose process group is gone (its owner died and took it, kill -9) is `exited` in eval_server_status
    and in list_runs alike: both ask evalserver/liveness.py; a live one stays running, a stopped one stopped."""
    from quanteval.workflow.runs import ListRunsInput, list_runs

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    details = {"pid": proc.pid, "url": f"http://127.0.0.1:{free_port()}", "log_path": str(tmp_path / "server.log"),
               "output_root": str(tmp_path)}
    asked, listed, stopped = (ledger.add("eval_server", status=status, details=details) for status in ("running", "running", "stopped"))

    def listed_status() -> dict[str, str]:
        return {row.record_id: row.status for row in list_runs(ListRunsInput(kind="eval_server")).runs}

    try:
        assert liveness.running(proc.pid)
        assert evalserver.eval_server_status(evalserver.EvalServerIdInput(record_id=asked.id)).status == "running"
        assert listed_status() == {asked.id: "running", listed.id: "running", stopped.id: "stopped"}
    finally:
        proc.kill()
        proc.wait()
    assert not liveness.running(proc.pid)
    assert evalserver.eval_server_status(evalserver.EvalServerIdInput(record_id=asked.id)).status == "exited"
    assert ledger.get(asked.id).status == "exited"
    assert listed_status() == {asked.id: "exited", listed.id: "exited", stopped.id: "stopped"}
    assert ledger.events(listed.id)[-1].message == "its process is gone (list_runs)"
    assert evalserver.eval_server_status(evalserver.EvalServerIdInput(record_id=stopped.id)).status == "stopped"
