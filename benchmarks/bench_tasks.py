"""list_tasks against `nel ls tasks` on the same query, plus the cold-cache cost.

Run by hand: .venv/bin/python benchmarks/bench_tasks.py [query]

What a user would otherwise run is `nel ls tasks | grep <query>`; here that is
`nel ls tasks --json` filtered in Python, so both sides answer the same question.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
REPEATS = 5


def timed(fn, repeats: int = REPEATS) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), result


def main() -> None:
    query = sys.argv[1] if len(sys.argv) > 1 else "gpqa"
    state = tempfile.mkdtemp(prefix="bench-tasks-")
    env = dict(os.environ, QUANTEVAL_STATE_DIR=state, NEMO_EVALUATOR_TELEMETRY_LEVEL="0")
    os.environ.update(env)

    from quanteval.engines import catalogue
    from quanteval.workflow import tasks

    def nel_ls() -> set[str]:
        out = subprocess.run([str(BIN / "nel"), "ls", "tasks", "--json"], env=env, capture_output=True, text=True, check=True).stdout
        rows = json.loads(out)["tasks"]
        return {
            f"{row['harness']}.{row['task']}"
            for row in rows
            if query in f"{row['harness']}.{row['task']} {row.get('description') or ''}".lower()
        }

    def cold() -> int:
        for cache in Path(state).glob("tasks-catalogue-*.json"):
            cache.unlink()
        catalogue._memo.clear()
        return tasks.list_tasks(tasks.ListTasksInput(query=query, limit=200)).total

    def warm_new_process() -> int:  # the JSON cache exists; the in-process memo does not
        catalogue._memo.clear()
        return tasks.list_tasks(tasks.ListTasksInput(query=query, limit=200)).total

    def warm_server() -> int:  # a running MCP server: the parsed catalogue is already in memory
        return tasks.list_tasks(tasks.ListTasksInput(query=query, limit=200)).total

    def cli_call() -> int:
        out = subprocess.run(
            [str(BIN / "quanteval"), "call", "list_tasks", "--json", json.dumps({"query": query, "limit": 200})],
            env=env, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        return json.loads(out)["total"]

    nel_time, nel_names = timed(nel_ls, 3)
    cold_time, _ = timed(cold)
    warm_time, total = timed(warm_new_process)
    server_time, _ = timed(warm_server)
    cli_time, _ = timed(cli_call, 3)

    print(f"query {query!r} (in name or description): nel ls tasks matches {len(nel_names)}, list_tasks matches {total}")
    print(f"{'nel ls tasks --json + filter (subprocess)':<48} {nel_time * 1000:8.1f} ms")
    print(f"{'list_tasks, cold cache (parse NEL task file)':<48} {cold_time * 1000:8.1f} ms   {nel_time / cold_time:6.1f}x faster")
    print(f"{'list_tasks, warm (JSON cache, fresh process)':<48} {warm_time * 1000:8.1f} ms   {nel_time / warm_time:6.1f}x faster")
    print(f"{'list_tasks, warm (in-memory, MCP server)':<48} {server_time * 1000:8.1f} ms   {nel_time / server_time:6.1f}x faster")
    print(f"{'quanteval call list_tasks (subprocess, warm)':<48} {cli_time * 1000:8.1f} ms   {nel_time / cli_time:6.1f}x faster")


if __name__ == "__main__":
    main()
