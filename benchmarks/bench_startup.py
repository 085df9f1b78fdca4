"""Start-up costs an MCP client and a CLI user see, against `nel --help` measured in the same run.

    .venv/bin/python benchmarks/bench_startup.py [--repeats N]

- Spawns `quanteval-mcp`, speaks newline-delimited JSON-RPC on its stdin/stdout (initialize,
  notifications/initialized, tools/list) and times until the tools/list answer arrives.
  Target: at most 0.6x `nel --help`.
- The size of that tools/list answer, and of what a model reads from it (names, descriptions,
  input schemas, in characters of compact JSON as sent), for the default toolsets, --toolsets all,
  --no-output-schemas, --read-only and one toolset. Target: the default under 24,000 characters
  (~6k tokens at ~4 a token; tests/test_surface.py holds it to that budget).
- A cold `quanteval call validate_config` on the packaged example config (NEL facts already
  cached, as after the first use). Target: 0.5 s.
Wall times inflate on a loaded machine; CPU times (user+sys of the child) do not, so both are printed.
Prints numbers; asserts nothing.
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
BIN = Path(sys.executable).parent  # the virtualenv running this script
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


def spawn_to_tools_list(*options: str, first_call: bool = False) -> tuple[float, float, list[dict]]:
    """Wall seconds to the tools/list answer (or, with first_call, to a check_environment answer after it),
    CPU seconds the server process used in all, the tools."""
    env = dict(os.environ, NEMO_EVALUATOR_TELEMETRY_LEVEL="0")
    cpu_before = _children_cpu()
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(BIN / "quanteval-mcp"), *options], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True, env=env,
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
        if first_call:
            _send(proc, {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                         "params": {"name": "check_environment", "arguments": {"probe_gpus": False}}})  # fmt: skip
            _answer(proc, 3)
        elapsed = time.perf_counter() - started
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(timeout=10)
    return elapsed, _children_cpu() - cpu_before, tools


def listing_sizes(tools: list[dict]) -> tuple[int, int]:
    """Characters of the tools/list result as sent (compact JSON), and of what a model reads from it
    (tests/test_surface.py's model_visible_characters)."""
    whole = len(json.dumps({"tools": tools}, ensure_ascii=False, separators=(",", ":")))
    seen = [{key: tool[key] for key in ("name", "description", "inputSchema") if key in tool} for tool in tools]
    return whole, len(json.dumps(seen, ensure_ascii=False, separators=(",", ":")))


def timed(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one run of argv."""
    cpu_before = _children_cpu()
    started = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=False, env=dict(os.environ, NEMO_EVALUATOR_TELEMETRY_LEVEL="0"))
    return time.perf_counter() - started, _children_cpu() - cpu_before


def medians(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


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
    validate = [str(BIN / "quanteval"), "call", "validate_config", "--json",
                json.dumps({"config_path": str(REPO / "recipes" / "examples" / "example_eval.yaml")})]
    spawn_to_tools_list()  # warm the OS file cache and the tools/list cache, as any second start would be
    timed(validate)  # the same for NEL's cached facts
    mcp, nel, check = [], [], []
    for _ in range(args.repeats):  # interleaved, so load changes hit all three alike
        elapsed, cpu, tools = spawn_to_tools_list()
        mcp.append((elapsed, cpu))
        nel.append(timed([str(BIN / "nel"), "--help"]))
        check.append(timed(validate))
    first = [spawn_to_tools_list(first_call=True)[:2] for _ in range(3)]
    mcp_wall, mcp_cpu = medians(mcp)
    first_wall, first_cpu = medians(first)
    nel_wall, nel_cpu = medians(nel)
    check_wall, check_cpu = medians(check)
    sdk_cpu = statistics.median(import_cpu("mcp.server.mcpserver") for _ in range(3))
    python_pass = statistics.median(wall([sys.executable, "-c", "pass"]) for _ in range(args.repeats))
    imported = subprocess.run(
        [sys.executable, "-c", f"import sys, quanteval.faces.mcpapp; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times inflate under load; CPU time does not)")
    print(f"nel --help:                          wall {nel_wall * 1000:5.0f} ms  CPU {nel_cpu * 1000:5.0f} ms")
    print(f"quanteval-mcp spawn -> tools/list:   wall {mcp_wall * 1000:5.0f} ms  CPU {mcp_cpu * 1000:5.0f} ms  "
          f"= {mcp_wall / nel_wall:.2f}x nel --help wall, {mcp_cpu / nel_cpu:.2f}x CPU (target <= 0.6x)")  # fmt: skip
    print(f"  (the MCP SDK import, {sdk_cpu * 1000:.0f} ms CPU, runs in the background: answers come from the recording "
          "of an earlier start; the first tools/call waits for it)")
    print(f"  ... and on to a first tools/call:  wall {first_wall * 1000:5.0f} ms  CPU {first_cpu * 1000:5.0f} ms  "
          f"= {first_wall / nel_wall:.2f}x nel --help wall")  # fmt: skip
    print(f"quanteval call validate_config:      wall {check_wall * 1000:5.0f} ms  CPU {check_cpu * 1000:5.0f} ms  "
          f"= {check_wall / nel_wall:.2f}x nel --help (target <= 500 ms)")  # fmt: skip
    print(f"python -c pass:                      wall {python_pass * 1000:5.0f} ms")
    print(f"heavy modules imported by the server (quanteval.faces.mcpapp): {imported or 'none'}")
    for label, options in (("default", ()), ("--toolsets all", ("--toolsets", "all")),
                           ("--no-output-schemas", ("--no-output-schemas",)), ("--read-only", ("--read-only",)),
                           ("--toolsets config", ("--toolsets", "config"))):  # fmt: skip
        tools = spawn_to_tools_list(*options)[2]
        whole, seen = listing_sizes(tools)
        print(f"tools/list {label:<20} {len(tools):2d} tools: {whole:6d} characters sent; "
              f"model reads {seen:6d} (~{seen // 4} tokens)")


if __name__ == "__main__":
    main()
