"""vLLM-for-CPU with its worker in the engine's process (VLLM_ENABLE_V1_MULTIPROCESSING=0, what quanteval sets:
frameworks.VLLM_CPU_ENV: two processes) against vLLM's own three: the start's wall seconds, and whether the answers
are the same numbers.

    .venv/bin/python benchmarks/bench_vllm_in_process.py [--checkpoint DIR] [--problems 200]

Starts the checkpoint (default: the embedded tiny-skills-w2-rtn, 33% on tiny_mcq: a weak model whose answers a
numeric change would move) once each way, one after the other, on quanteval's other CPU settings, and asks each the
tiny_mcq problems one at a time, greedy, in NeMo-Skills' multiple-choice prompt, with logprobs. Prints each start's
seconds until /health, the ratio, and how many answers and per-token logprobs are identical. Asserts nothing.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from vllm_cpu import WEAK_CHECKPOINT, ask, identical, serving, tiny_mcq_problems

PORT = 18431


def serve_and_ask(checkpoint: Path, in_process: bool, problems: list[str], log: Path) -> tuple[float, list]:
    with serving(checkpoint, PORT, log, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1"}) as (_, ready):
        return ready, [ask(PORT, problem, max_tokens=64, timeout_s=120) for problem in problems]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path, default=WEAK_CHECKPOINT)
    parser.add_argument("--problems", type=int, default=200)
    args = parser.parse_args()
    problems = tiny_mcq_problems()[: args.problems]
    logs = Path(tempfile.mkdtemp(prefix="bench-vllm-in-process-"))
    three, three_answers = serve_and_ask(args.checkpoint, False, problems, logs / "three-processes.log")
    one, one_answers = serve_and_ask(args.checkpoint, True, problems, logs / "two-processes.log")
    print(f"start until /health: three processes {three:.1f} s, two {one:.1f} s ({one / three:.2f}x)")
    print(identical(three_answers, one_answers))
    print(f"server logs: {logs}")


if __name__ == "__main__":
    main()
