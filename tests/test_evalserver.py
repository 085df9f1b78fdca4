"""The eval server for training loops, driven over real HTTP with stand-ins for `ns` and `nel` that
query a real local OpenAI-compatible router (the trainer's model stand-in)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from quanteval import evalserver, ledger
from quanteval.evalserver import ServerSettings
from quanteval.models import ToolError

STANDINS = Path(__file__).parent / "standins"


# ---------------------------------------------------------------------------------------------
# A router stand-in: answers "What is A+B?" correctly except for 1+1 (answers 3) -> 11/12 correct.
# ---------------------------------------------------------------------------------------------


class Router:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        router = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                router.requests.append({"path": self.path, **body})
                a, b = map(int, re.findall(r"\d+", body["messages"][-1]["content"]))
                answer = "3" if (a, b) == (1, 1) else str(a + b)
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer},
                                                "finish_reason": "stop"}]}).encode()
                self.send_response(200 if self.path == "/v1/chat/completions" else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


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


class RunningServer:
    def __init__(self, settings: ServerSettings) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        ready = threading.Event()
        self.thread = threading.Thread(target=evalserver.serve, args=(settings, "127.0.0.1", self.port, ready),
                                       daemon=True)
        self.thread.start()
        assert ready.wait(10)
        self.url = f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body: object = None, raw: bytes | None = None) -> tuple[int, dict]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())


@pytest.fixture
def make_server(tmp_path: Path, commands: dict[str, str]):
    def make(**overrides) -> RunningServer:
        options = {"output_root": tmp_path / "out", "ns_command": commands["ns"], "nel_command": commands["nel"],
                   "results_wait_s": 5, **overrides}
        return RunningServer(ServerSettings(**options))

    return make


def payload(router_url: str, *benchmarks: dict, rollout_id: int = 7, defaults: dict | None = None) -> dict:
    return {"rollout_id": rollout_id, "router_url": router_url, "defaults": defaults or {},
            "benchmarks": list(benchmarks)}


# ---------------------------------------------------------------------------------------------
# Payload validation
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
    assert server.request("GET", "/health")[1]["jobs"] == {"queued": 0, "running": 0, "succeeded": 0, "failed": 0}


def test_non_json_and_non_object_bodies_get_400(make_server):
    server = make_server()
    assert server.request("POST", "/evaluate", raw=b"{nope")[0] == 400
    status, answer = server.request("POST", "/jobs", [1, 2])
    assert status == 400 and "JSON object" in answer["error"]
    assert server.request("GET", "/nowhere")[0] == 404
    assert server.request("GET", "/jobs/unknown")[0] == 404


# ---------------------------------------------------------------------------------------------
# The nemo-skills backend
# ---------------------------------------------------------------------------------------------


def test_evaluate_runs_ns_eval_against_the_router_and_answers_slimes_shape(make_server, router):
    server = make_server(max_concurrent_requests=64)
    body = payload(router.url, {"name": "aime25", "n_samples_per_eval_prompt": 2, "top_p": 0.95},
                   defaults={"temperature": 0.6, "top_p": 1.0, "max_response_len": 2048})
    status, answer = server.request("POST", "/evaluate", body)
    assert status == 200, answer
    assert {"job_id", "command", "output_dir", "log_path", "raw_metrics", "runs", "metrics"} <= set(answer)
    # 12 prompts x 2 samples, 1+1 answered wrong both times: 22/24 correct.
    assert answer["metrics"] == {
        "aime25/pass@1[avg-of-2]/num_entries": 12.0,
        "aime25/pass@1[avg-of-2]/symbolic_correct": pytest.approx(100 * 22 / 24),
        "aime25/pass@1[avg-of-2]/no_answer": 0.0,
    }
    assert answer["raw_metrics"]["aime25"]["pass@1[avg-of-2]"]["num_entries"] == 12
    argv = json.loads((Path(answer["output_dir"]) / "aime25" / "argv.json").read_text())["argv"]
    assert argv[argv.index("--server_address") + 1] == f"{router.url}/v1"
    assert argv[argv.index("--benchmarks") + 1] == "aime25:2"
    assert argv[argv.index("--server_type") + 1] == "openai"
    # the benchmark's own top_p wins over defaults; the rest come from defaults
    assert {"++inference.temperature=0.6", "++inference.top_p=0.95", "++inference.tokens_to_generate=2048",
            "++max_concurrent_requests=64"} <= set(argv)
    assert not any(a.startswith("++inference.top_k") for a in argv)
    assert len(router.requests) == 24 and all(r["temperature"] == 0.6 for r in router.requests)
    assert "ns_command" not in answer["command"] and "eval --output_dir" in answer["command"]
    assert Path(answer["log_path"]).read_text().startswith("ns eval aime25 x2")
    # the job is in the ledger with its metrics
    record = ledger.get(answer["job_id"])
    assert record.kind == "eval_job" and record.status == "succeeded"
    assert record.details["metrics"]["aime25/pass@1[avg-of-2]/symbolic_correct"] == pytest.approx(91.6666, rel=1e-4)


def test_a_failing_benchmark_reports_its_log_tail_and_spares_the_others(make_server, router):
    server = make_server()
    status, answer = server.request("POST", "/evaluate", payload(router.url, {"name": "failbench"}, {"name": "gsm8k"}))
    assert status == 200
    failed, ok = answer["runs"]
    assert failed["status"] == "failed" and "exited with code 1" in failed["error"]
    assert "RuntimeError: judge server unreachable" in failed["log_tail"]
    assert ok["status"] == "succeeded"
    assert answer["metrics"]["gsm8k/pass@1/symbolic_correct"] == pytest.approx(100 * 11 / 12)
    assert answer["errors"] and answer["errors"][0].startswith("failbench:")
    assert server.request("GET", "/health")[1]["status"] == "ok"


def test_nothing_evaluated_is_a_502_and_missing_metrics_are_named(make_server, router):
    server = make_server()
    status, answer = server.request("POST", "/evaluate", payload(router.url, {"name": "failbench"},
                                                                 {"name": "nometricsbench"}))
    assert status == 502
    assert "failbench" in answer["error"] and "metrics.json was not written" in answer["error"]


def test_jobs_run_concurrently_up_to_the_limit_and_queue_beyond_it(make_server, router):
    server = make_server(max_concurrent_jobs=2)
    started = time.monotonic()
    ids = [server.request("POST", "/jobs", payload(router.url, {"name": "slowbench"}, rollout_id=i))[1]["job_id"]
           for i in range(3)]
    seen_states = set()
    while True:
        states = [server.request("GET", f"/jobs/{job_id}")[1]["state"] for job_id in ids]
        seen_states.add(tuple(sorted(states)))
        if all(s in ("succeeded", "failed") for s in states):
            break
        assert time.monotonic() - started < 60
        time.sleep(0.1)
    elapsed = time.monotonic() - started
    assert ("queued", "running", "running") in seen_states  # two ran while the third waited
    assert all(server.request("GET", f"/jobs/{job_id}")[1]["state"] == "succeeded" for job_id in ids)
    # each job sleeps 3 s: two in parallel then one -> about 6 s, not 9 (serial) and not 3 (unbounded)
    assert 5.5 < elapsed < 8.9
    final = server.request("GET", f"/jobs/{ids[2]}")[1]
    assert final["metrics"]["slowbench/pass@1/symbolic_correct"] == pytest.approx(100 * 11 / 12)


def test_sharded_benchmark_runs_one_worker_per_chunk_and_merges_by_sample_count(make_server, router):
    server = make_server()
    status, answer = server.request("POST", "/evaluate", payload(router.url, {"name": "math500", "shards": 3}))
    assert status == 200, answer
    run = answer["runs"][0]
    assert run["shards"] == 3 and run["command"].count("eval --output_dir") == 3
    for index in range(3):
        record = json.loads((Path(run["output_dir"]) / f"shard-{index}" / "argv.json").read_text())
        assert {"++num_chunks=3", f"++chunk_id={index}"} <= set(record["argv"])
        assert record["env"] == {"NEL_SHARD_IDX": str(index), "NEL_TOTAL_SHARDS": "3"}
    # chunks of 4 prompts each; the wrong 1+1 falls in chunk 0 (3/4 = 75%), the others 100%:
    # weighted by num_entries (4, 4, 4) -> 11/12; num_entries adds up to 12.
    assert answer["metrics"]["math500/pass@1/symbolic_correct"] == pytest.approx(100 * 11 / 12)
    assert answer["metrics"]["math500/pass@1/num_entries"] == 12
    assert len(router.requests) == 12


def test_missing_ns_is_reported_in_health_with_how_to_install(make_server, router, tmp_path):
    server = make_server(ns_command=str(tmp_path / "no-such-ns"))
    health = server.request("GET", "/health")[1]
    assert health["status"] == "ok" and health["backend_ready"] is False
    assert "not on PyPI" in health["hint"]
    status, answer = server.request("POST", "/evaluate", payload(router.url, {"name": "aime25"}))
    assert status == 502 and "exited with code 127" in answer["error"]
    assert "cannot start" in answer["runs"][0]["log_tail"][0]


# ---------------------------------------------------------------------------------------------
# The nel backend
# ---------------------------------------------------------------------------------------------


def test_nel_backend_maps_benchmarks_to_ns_tasks_and_reads_results_yml(make_server, router):
    server = make_server(backend="nel", max_concurrent_requests=32)
    body = payload(router.url, {"name": "aime25", "n_samples_per_eval_prompt": 4, "top_k": 20},
                   defaults={"temperature": 1.0, "max_response_len": 1024})
    status, answer = server.request("POST", "/evaluate", body)
    assert status == 200, answer
    config = yaml.safe_load((Path(answer["runs"][0]["output_dir"]) / "nel_config.yaml").read_text())
    task = config["evaluation"]["tasks"][0]
    assert task["name"] == "ns_aime2025"
    assert task["nemo_evaluator_config"]["config"]["params"] == {
        "parallelism": 32, "temperature": 1.0, "max_new_tokens": 1024,
        "extra": {"num_repeats": 4, "args": "++inference.top_k=20"}}
    assert config["target"]["api_endpoint"]["url"] == f"{router.url}/v1/chat/completions"
    # 12 prompts x 4 repeats, 1+1 wrong every time: 44/48
    assert answer["metrics"]["aime25/symbolic_correct/symbolic_correct"] == pytest.approx(44 / 48)
    assert answer["metrics"]["aime25/symbolic_correct/num_entries"] == 48


def test_nel_backend_config_passes_nels_own_dry_run(tmp_path, router):
    settings = ServerSettings(output_root=tmp_path, backend="nel")
    request = evalserver.EvalRequest(rollout_id=1, router_url=router.url,
                                     benchmarks=[{"name": "gpqa", "n_samples_per_eval_prompt": 2}])
    config = evalserver.nel_config(settings, request, request.benchmarks[0], tmp_path / "out")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "DUMMY_API_KEY": "EMPTY", "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"}
    nel = Path(sys.executable).parent / "nel"
    out = subprocess.run([str(nel), "run", "--config", str(path), "--dry-run"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "ns_gpqa" in out.stdout + out.stderr


def test_unknown_benchmark_for_nel_fails_that_run_with_did_you_mean(make_server, router):
    server = make_server(backend="nel")
    status, answer = server.request("POST", "/evaluate", payload(router.url, {"name": "aime2O25"}, {"name": "gpqa"}))
    assert status == 200
    assert answer["runs"][0]["status"] == "failed"
    assert "no NEL nemo_skills task" in answer["runs"][0]["error"] and "Did you mean" in answer["runs"][0]["error"]
    assert answer["runs"][1]["status"] == "succeeded"


def test_task_map_comes_from_nels_packaged_list():
    mapping = evalserver.nemo_skills_task_map()
    assert mapping["aime25"] == "ns_aime2025" and mapping["gpqa"] == "ns_gpqa"
    assert evalserver.nel_task_for("ns_hle") == "ns_hle"


def test_merge_and_flatten_by_hand():
    merged = evalserver.merge_shard_metrics([
        {"pass@1": {"num_entries": 30, "acc": 50.0}},
        {"pass@1": {"num_entries": 10, "acc": 90.0}},
    ])
    # (30*50 + 10*90) / 40 = 60
    assert merged == {"pass@1": {"num_entries": 40, "acc": 60.0}}
    assert evalserver.flatten_metrics({"b": {"m": {"x": 1, "flag": True, "name": "s"}}}) == {"b/m/x": 1.0}


# ---------------------------------------------------------------------------------------------
# The tools: start, status, stop a real server process
# ---------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_start_status_stop_eval_server_leave_nothing_behind(tmp_path, commands, router):
    port = _free_port()
    info = evalserver.start_eval_server(evalserver.StartEvalServerInput(
        port=port, output_root=str(tmp_path / "srv"), ns_command=commands["ns"]))
    try:
        assert info.status == "running" and info.health["backend_ready"] is True
        req = urllib.request.Request(f"{info.url}/evaluate", method="POST",
                                     data=json.dumps(payload(router.url, {"name": "gsm8k"})).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as response:
            assert json.loads(response.read())["metrics"]["gsm8k/pass@1/symbolic_correct"] == pytest.approx(100 * 11 / 12)
        status = evalserver.eval_server_status(evalserver.EvalServerIdInput(record_id=info.record_id))
        assert status.status == "running" and status.health["jobs"]["succeeded"] == 1
        with pytest.raises(ToolError, match="in use"):
            evalserver.start_eval_server(evalserver.StartEvalServerInput(port=port, output_root=str(tmp_path / "x")))
    finally:
        stopped = evalserver.stop_eval_server(evalserver.EvalServerIdInput(record_id=info.record_id))
    assert stopped.status == "stopped"
    with pytest.raises(ProcessLookupError):
        os.kill(info.pid, 0)
    assert evalserver.eval_server_status(evalserver.EvalServerIdInput(record_id=info.record_id)).status == "stopped"
    # the port is free again: a new server can start on it
    again = evalserver.start_eval_server(evalserver.StartEvalServerInput(
        port=port, output_root=str(tmp_path / "srv2"), ns_command=commands["ns"]))
    evalserver.stop_eval_server(evalserver.EvalServerIdInput(record_id=again.record_id))


def test_status_of_a_record_that_is_not_an_eval_server_is_refused():
    record = ledger.add("canary", status="running")
    with pytest.raises(ToolError, match="not an eval server"):
        evalserver.eval_server_status(evalserver.EvalServerIdInput(record_id=record.id))
