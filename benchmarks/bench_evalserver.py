"""What the eval server adds to each evaluation, and whether its memory stays flat over many of them.

    .venv/bin/python benchmarks/bench_evalserver.py [--sequential 200] [--concurrent 20]
    .venv/bin/python benchmarks/bench_evalserver.py --sequential 0 --real-ns .venv-nemo-skills/bin/ns --real-runs 3

A training run evaluates every N steps for days. This measures the server, not the model: a real
`quanteval serve-eval` process, the `ns` stand-in (tests/standins/fake_ns.py, a real process that
queries the router) and the stand-in OpenAI-compatible router. Prints:
  - the stand-in `ns eval` run directly (the floor any server pays);
  - POST /evaluate through the server, sequentially: added latency per evaluation (server - direct);
  - N concurrent POST /evaluate (max_concurrent_jobs = N): wall time and per-evaluation latency;
  - the server's resident memory (VmRSS) after the warm-up, and after every batch: growth must stay flat.
With --real-ns PATH (the `ns` of .venv-nemo-skills) it also compares a few evaluations with the real
NeMo-Skills through the server against the same `ns eval` command run directly (ratio): the server forks each
`ns eval` from a Python that imported NeMo-Skills' pipeline once (quanteval/forkserver.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STANDINS = REPO / "tests" / "standins"
sys.path.insert(0, str(STANDINS))
from openai_router import Router  # noqa: E402

os.environ["QUANTEVAL_STATE_DIR"] = tempfile.mkdtemp(prefix="bench-evalserver-")
os.environ.pop("QUANTEVAL_LEDGER", None)

from quanteval.localproc import free_port  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def post(url: str, body: dict, timeout: float = 3600) -> dict:
    req = urllib.request.Request(f"{url}/evaluate", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return json.loads(response.read())


def start_server(ns: str, out: Path, jobs: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "quanteval.faces.cli", "serve-eval", "--port", str(port),
                             "--output-root", str(out), "--ns-command", ns, "--max-concurrent-jobs", str(jobs)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{url}/health", timeout=1)
            break
        except urllib.error.HTTPError:
            break  # 503 not_ready still means it is up
        except OSError:
            time.sleep(0.1)
    return proc, url


def direct(ns: str, router_url: str, out: Path, bench: str, extra: list[str] | None = None) -> float:
    """The same `ns eval` command the server builds, run by hand."""
    from quanteval.evalserver import nemo_skills
    from quanteval.evalserver.backend import EvalRequest, ServerSettings

    settings = ServerSettings(output_root=out, ns_command=ns)
    request = EvalRequest(rollout_id=0, router_url=router_url, benchmarks=[{"name": bench}])
    [command] = nemo_skills.commands(settings, request, request.benchmarks[0], out / bench, "direct")
    command.output_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    subprocess.run(command.argv, env={**os.environ, **command.env}, cwd=command.cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def stand_in(sequential: int, concurrent: int) -> None:
    router = Router()
    tmp = Path(tempfile.mkdtemp(prefix="bench-evalserver-out-"))
    ns = tmp / "ns"
    ns.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDINS / "fake_ns.py"}" "$@"\n')
    ns.chmod(0o755)
    floor = statistics.median(direct(str(ns), router.url, tmp / f"direct-{i}", "gsm8k") for i in range(10))
    proc, url = start_server(str(ns), tmp / "served", concurrent)
    try:
        for i in range(5):  # warm-up: imports, first ledger writes
            post(url, {"rollout_id": -i - 1, "router_url": router.url, "benchmarks": [{"name": "gsm8k"}]})
        base_rss = rss_mib(proc.pid)
        times = []
        marks = []
        for i in range(sequential):
            started = time.perf_counter()
            answer = post(url, {"rollout_id": i, "router_url": router.url, "benchmarks": [{"name": "gsm8k"}]})
            times.append(time.perf_counter() - started)
            assert answer["status"] == "succeeded", answer
            if (i + 1) % 50 == 0:
                marks.append((i + 1, rss_mib(proc.pid)))
        served = statistics.median(times)
        print(f"stand-in `ns eval` run directly       : {floor * 1000:8.1f} ms (median of 10)")
        print(f"POST /evaluate, {sequential} sequential      : {served * 1000:8.1f} ms median, "
              f"added {1000 * (served - floor):+.1f} ms per evaluation (ratio {served / floor:.2f}x)")
        print(f"server RSS after warm-up              : {base_rss:8.1f} MiB")
        for count, rss in marks:
            print(f"server RSS after {count:4d} evaluations     : {rss:8.1f} MiB ({rss - base_rss:+.1f} MiB)")

        def one(i: int) -> float:
            started = time.perf_counter()
            post(url, {"rollout_id": 10_000 + i, "router_url": router.url, "benchmarks": [{"name": "gsm8k"}]})
            return time.perf_counter() - started

        started = time.perf_counter()
        with ThreadPoolExecutor(concurrent) as pool:
            latencies = list(pool.map(one, range(concurrent)))
        wall = time.perf_counter() - started
        print(f"{concurrent} concurrent POST /evaluate        : {wall:8.2f} s wall, {1000 * statistics.median(latencies):.1f} ms "
              f"median latency, added {1000 * (statistics.median(latencies) - floor):+.1f} ms vs direct")
        print(f"server RSS after all                  : {rss_mib(proc.pid):8.1f} MiB "
              f"({rss_mib(proc.pid) - base_rss:+.1f} MiB since warm-up)")
    finally:
        proc.terminate()
        proc.wait(30)
        router.close()


def real_ns(ns: str, runs: int) -> None:
    """Ratio of the server's time to the direct `ns eval` on the same data (the data already written)."""
    router = Router()
    tmp = Path(tempfile.mkdtemp(prefix="bench-evalserver-real-"))
    proc, url = start_server(ns, tmp / "served", 1)
    try:
        direct_times, served_times = [], []
        for i in range(runs):
            direct_times.append(direct(ns, router.url, tmp / f"direct-{i}", "gsm8k"))
            started = time.perf_counter()
            answer = post(url, {"rollout_id": i, "router_url": router.url, "benchmarks": [{"name": "gsm8k"}]})
            served_times.append(time.perf_counter() - started)
            assert answer["status"] == "succeeded", answer["errors"]
        d, s = statistics.median(direct_times), statistics.median(served_times)
        print(f"real `ns eval` gsm8k, direct          : {d:8.2f} s (median of {runs}: "
              f"{', '.join(f'{t:.2f}' for t in direct_times)})")
        print(f"real `ns eval` through the server     : {s:8.2f} s, added {s - d:+.2f} s, ratio {s / d:.3f}x "
              f"({', '.join(f'{t:.2f}' for t in served_times)}; the first also imports the pipeline the server's "
              "fork server keeps)")
        print(f"server RSS after {runs} real evaluations : {rss_mib(proc.pid):8.1f} MiB")
    finally:
        proc.terminate()
        proc.wait(30)
        router.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequential", type=int, default=200)
    parser.add_argument("--concurrent", type=int, default=20)
    parser.add_argument("--real-ns", help="path of a real NeMo-Skills `ns` (e.g. .venv-nemo-skills/bin/ns)")
    parser.add_argument("--real-runs", type=int, default=3)
    args = parser.parse_args()
    if args.sequential > 0:
        stand_in(args.sequential, args.concurrent)
    if args.real_ns:
        real_ns(str(Path(args.real_ns).resolve()), args.real_runs)  # its runs start in other directories


if __name__ == "__main__":
    main()
