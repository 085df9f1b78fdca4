"""Spawn-to-`tools/list` time of the stdio MCP server, as an MCP client (an IDE, an assistant) sees it.

    .venv/bin/python benchmarks/bench_startup.py [--repeats N]

Spawns `quanteval-mcp`, speaks newline-delimited JSON-RPC on its stdin/stdout (initialize,
notifications/initialized, tools/list) and times until the tools/list answer arrives. For scale it
also times a bare `python -c pass` and `nel --help` (the NEL CLI a user would otherwise start), and
lists which heavy modules (NEL, torch, sglang, matplotlib, paramiko) importing the server pulls in.
Target: under 1 s. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / ".venv" / "bin"
HEAVY = ("nemo_evaluator_launcher", "torch", "sglang", "matplotlib", "paramiko")


def _send(proc: subprocess.Popen, message: dict) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(message) + "\n")
    proc.stdin.flush()


def _answer(proc: subprocess.Popen, request_id: int) -> dict:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("server closed stdout before answering")
        message = json.loads(line)
        if message.get("id") == request_id:
            return message


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def spawn_to_tools_list() -> tuple[float, float, int]:
    """Wall seconds to the tools/list answer, CPU seconds the server process used in all, tool count."""
    env = dict(os.environ, NEMO_EVALUATOR_TELEMETRY_LEVEL="0")
    cpu_before = _children_cpu()
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(BIN / "quanteval-mcp")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    try:
        _send(proc, {
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}},
        })  # fmt: skip
        _answer(proc, 1)
        _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _send(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        tools = _answer(proc, 2)["result"]["tools"]
        elapsed = time.perf_counter() - started
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=10)
    return elapsed, _children_cpu() - cpu_before, len(tools)


def wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=False)
    return time.perf_counter() - started


def import_cpu(module: str) -> float:
    """CPU seconds a fresh interpreter spends to import `module` (and exit)."""
    before = _children_cpu()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
    return _children_cpu() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    spawn_to_tools_list()  # warm the OS file cache, as any second start would be
    runs = [spawn_to_tools_list() for _ in range(args.repeats)]
    times = [seconds for seconds, _, _ in runs]
    cpu = [seconds for _, seconds, _ in runs]
    sdk_cpu = statistics.median(import_cpu("mcp.server.mcpserver") for _ in range(args.repeats))
    registry_cpu = statistics.median(import_cpu("quanteval.registry") for _ in range(args.repeats))
    python_pass = statistics.median(wall([sys.executable, "-c", "pass"]) for _ in range(args.repeats))
    nel_help = statistics.median(wall([str(BIN / "nel"), "--help"]) for _ in range(3))
    imported = subprocess.run(
        [sys.executable, "-c", f"import sys, quanteval.server; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times inflate under load; CPU time does not)")
    print(f"quanteval-mcp spawn -> tools/list ({runs[0][2]} tools): median {statistics.median(times) * 1000:.0f} ms, "
          f"min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms over {args.repeats} runs (target < 1000 ms)")  # fmt: skip
    print(f"  CPU time of the server process (start, both requests, exit): median {statistics.median(cpu) * 1000:.0f} ms")
    print(f"  of which importing the MCP SDK (mcp.server.mcpserver): {sdk_cpu * 1000:.0f} ms CPU; "
          f"quanteval.registry (all tool modules and models): {registry_cpu * 1000:.0f} ms CPU")  # fmt: skip
    print(f"python -c pass:  {python_pass * 1000:.0f} ms")
    print(f"nel --help:      {nel_help * 1000:.0f} ms  (quanteval-mcp to tools/list is {nel_help / statistics.median(times):.1f}x faster)")
    print(f"heavy modules imported by quanteval.server: {imported or 'none'}")


if __name__ == "__main__":
    main()
