"""vLLM-for-CPU's OpenMP threads waiting asleep (OMP_WAIT_POLICY=PASSIVE, what quanteval sets: frameworks.VLLM_CPU_ENV)
against libgomp's default (they spin before they sleep): the CPU seconds and wall seconds of serving the same requests,
and whether the answers are the same numbers.

    .venv/bin/python benchmarks/bench_vllm_omp_wait.py [--checkpoint DIR] [--problems 800] [--concurrency 8] [--eager] [--busy]

Starts the checkpoint (default: the embedded tiny-skills-w2-rtn, 33% on tiny_mcq: a weak model whose answers a numeric
change would move) once each way, on quanteval's other CPU settings, then asks it the tiny_mcq problems (repeated up to
--problems) `--concurrency` at a time, greedy, with logprobs, and reads the CPU the server's processes spent answering
(/proc). --busy runs two Python busy loops meanwhile, as a machine where other work shares the cores (a test suite, two
servers of an evaluation). Prints each way's serving CPU and wall seconds, the ratios, and how many answers and
per-token logprobs are identical. Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vllm_cpu import VLLM_CPU_ENV, WEAK_CHECKPOINT, ask, identical, serving, tiny_mcq_problems

PORT = 18433
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """user+sys of a server and its children (the engine core), as /proc has them now."""
    pids = [pid, *map(int, subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split())]
    total = 0
    for each in pids:
        stat = Path(f"/proc/{each}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def serve_and_ask(checkpoint: Path, env_changes: dict[str, str | None], problems: list[str], concurrency: int,
                  eager: bool, log: Path) -> tuple[float, float, list]:
    """(serving CPU seconds, serving wall seconds, answers) of one server started with env_changes (None: unset)."""
    with serving(checkpoint, PORT, log, env_changes, ("--enforce-eager",) if eager else ()) as (server, _):
        cpu, started = _cpu_seconds(server.pid), time.monotonic()
        with ThreadPoolExecutor(concurrency) as pool:
            answers = list(pool.map(lambda problem: ask(PORT, problem, max_tokens=32), problems))
        return _cpu_seconds(server.pid) - cpu, time.monotonic() - started, answers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path, default=WEAK_CHECKPOINT)
    parser.add_argument("--problems", type=int, default=800)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--eager", action="store_true", help="serve with --enforce-eager (default: vLLM's compiled path)")
    parser.add_argument("--busy", action="store_true", help="two busy loops share the cores meanwhile")
    args = parser.parse_args()
    rows = tiny_mcq_problems()
    problems = [rows[i % len(rows)] for i in range(args.problems)]
    logs = Path(tempfile.mkdtemp(prefix="bench-vllm-omp-wait-"))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 if args.busy else 0)]
    try:
        spin_cpu, spin_wall, spin = serve_and_ask(args.checkpoint, {"OMP_WAIT_POLICY": None}, problems,
                                                  args.concurrency, args.eager, logs / "spinning.log")
        ours_cpu, ours_wall, ours = serve_and_ask(args.checkpoint, {}, problems, args.concurrency, args.eager,
                                                  logs / "passive.log")
    finally:
        for hog in hogs:
            hog.kill()
    print(f"{len(problems)} requests, {args.concurrency} at a time, {'eager' if args.eager else 'compiled'}"
          f"{', two busy loops beside' if args.busy else ''}:")
    print(f"  libgomp's default (spin, then sleep): {spin_cpu:.1f} CPU-s, {spin_wall:.1f} s")
    print(f"  OMP_WAIT_POLICY={VLLM_CPU_ENV.get('OMP_WAIT_POLICY')} (quanteval's): {ours_cpu:.1f} CPU-s, {ours_wall:.1f} s "
          f"({ours_cpu / spin_cpu:.2f}x CPU, {ours_wall / spin_wall:.2f}x wall)")
    print(identical(spin, ours))
    print(f"server logs: {logs}")


if __name__ == "__main__":
    main()
