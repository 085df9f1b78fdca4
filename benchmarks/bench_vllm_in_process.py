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
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "mcp_server"))

from quanteval.serving.frameworks import VLLM_CPU_ENV  # noqa: E402

PROMPT = ("Answer the following multiple choice question. The last line of your response should be in the following "
          "format: 'Answer: \\boxed{A/B/C/D}' (e.g. 'Answer: \\boxed{A}').\n\n{problem}")
PORT = 18431


def serve_and_ask(checkpoint: Path, in_process: bool, problems: list[str], log: Path) -> tuple[float, list]:
    env = {**os.environ, **VLLM_CPU_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1"}
    command = [str(REPO / ".venv-vllm" / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model",
               str(checkpoint), "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(PORT), "--max-model-len", "256"]
    started = time.monotonic()
    with log.open("w") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    sys.exit(f"the server exited: {log}")
                time.sleep(0.2)
        ready = time.monotonic() - started
        answers = []
        for problem in problems:
            body = json.dumps({"model": "m", "messages": [{"role": "user", "content": PROMPT.replace("{problem}", problem)}],
                               "max_tokens": 64, "temperature": 0, "logprobs": True}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{PORT}/v1/chat/completions", body,
                                             {"Content-Type": "application/json"})
            choice = json.loads(urllib.request.urlopen(request, timeout=120).read())["choices"][0]
            answers.append((choice["message"]["content"], [token["logprob"] for token in choice["logprobs"]["content"]]))
        return ready, answers
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", type=Path, default=REPO / "examples" / "checkpoints" / "tiny-skills-w2-rtn")
    parser.add_argument("--problems", type=int, default=200)
    args = parser.parse_args()
    lines = (REPO / "examples" / "benchmarks" / "skills" / "tiny_mcq" / "test.jsonl").read_text().splitlines()
    problems = [json.loads(line)["problem"] for line in lines[: args.problems]]
    logs = Path(tempfile.mkdtemp(prefix="bench-vllm-in-process-"))
    three, three_answers = serve_and_ask(args.checkpoint, False, problems, logs / "three-processes.log")
    one, one_answers = serve_and_ask(args.checkpoint, True, problems, logs / "two-processes.log")
    texts = sum(a[0] == b[0] for a, b in zip(three_answers, one_answers, strict=True))
    logprobs = sum(a[1] == b[1] for a, b in zip(three_answers, one_answers, strict=True))
    print(f"start until /health: three processes {three:.1f} s, two {one:.1f} s ({one / three:.2f}x)")
    print(f"answers identical: {texts} of {len(problems)}; every token's logprob identical: {logprobs} of {len(problems)}")
    print(f"server logs: {logs}")


if __name__ == "__main__":
    main()
