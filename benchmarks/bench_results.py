"""validate_run on a run whose server log is large: time and memory versus what a user would run by hand.

    .venv/bin/python benchmarks/bench_results.py [--log-mb N]

Builds in a temp dir one NEL task directory (tests/results_factory.py) plus a server log of N MB
(default 512) of SGLang-like lines, with the model-path line near the top and a judge failure near
the end. Prints:
  - validate_run wall time (in-process, median of 3) and the peak Python memory growth (tracemalloc),
  - `grep -n -i -E <same pattern>` over the same logs, the tool a person reaches for by hand
    (output piped: GNU grep stops at the first match when stdout is /dev/null),
  - `wc -l` over the log, the floor for reading it once,
so the ratio says what validating costs beyond reading the log. Target: peak memory growth under
50 MB whatever the log size (logs are streamed line by line, never loaded whole).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from results_factory import make_invocation, make_task  # noqa: E402

from quanteval.engines.nel.results import GREP_PATTERN  # noqa: E402
from quanteval.workflow.results import ValidateRunInput, validate_run  # noqa: E402

LINE = "[2026-11-21 10:00:01 TP0] Decode batch. #running-req: 64, #token: 183211, token usage: 0.41, gen throughput (token/s): 5123.77\n"


def write_log(path: Path, megabytes: int) -> None:
    block = LINE * 8192
    with path.open("w") as log:
        log.write("server_args=ServerArgs(model_path='/models/llama-fp8', quantization='modelopt_fp8')\n")
        for _ in range(megabytes * 1024 * 1024 // len(block)):
            log.write(block)
        log.write("ERROR judge request failed: 401 Unauthorized\n")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-mb", type=int, default=512)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        task_dir = make_task(make_invocation(Path(tmp)))
        log = task_dir / "logs" / "server-0-1001-0.log"
        write_log(log, args.log_mb)
        size_mb = log.stat().st_size / 2**20
        request = ValidateRunInput(run=str(task_dir))

        tracemalloc.start()
        report = validate_run(request)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert report.tasks[0].loaded_checkpoint == "/models/llama-fp8" and report.verdict == "fail"

        ours = statistics.median(timed(lambda: validate_run(request)) for _ in range(3))
        grep = statistics.median(
            timed(lambda: subprocess.run(["grep", "-n", "-i", "-E", GREP_PATTERN, *map(str, (task_dir / "logs").glob("*.log"))],
                                         stdout=subprocess.PIPE, check=False))
            for _ in range(3)
        )
        wc = statistics.median(timed(lambda: subprocess.run(["wc", "-l", str(log)], stdout=subprocess.DEVNULL, check=True)) for _ in range(3))
        print(f"server log: {size_mb:.0f} MB")
        print(f"validate_run:            {ours:7.2f} s   peak Python memory growth {peak / 2**20:.1f} MB")
        print(f"grep -n -i -E pattern:   {grep:7.2f} s   (validate_run / grep = {ours / grep:.1f}x)")
        print(f"wc -l:                   {wc:7.2f} s   (validate_run / wc = {ours / wc:.1f}x)")
        print(f"memory target (< 50 MB): {'met' if peak < 50 * 2**20 else 'MISSED'}")


if __name__ == "__main__":
    main()
