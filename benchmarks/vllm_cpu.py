"""What the vLLM-for-CPU benchmarks share (run them from the repo root with .venv/bin/python): one server of a
checkpoint on quanteval's CPU environment, the embedded tiny_mcq problems, and an answer with its token logprobs, so
two ways of serving can be compared number for number."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "mcp_server"))

from quanteval.serving.frameworks import VLLM_CPU_ENV  # noqa: E402

WEAK_CHECKPOINT = REPO / "examples" / "checkpoints" / "tiny-skills-w2-rtn"  # 33% on tiny_mcq: a numeric change shows
PROMPT = ("Answer the following multiple choice question. The last line of your response should be in the following "
          "format: 'Answer: \\boxed{A/B/C/D}' (e.g. 'Answer: \\boxed{A}').\n\n{problem}")


def tiny_mcq_problems() -> list[str]:
    lines = (REPO / "examples" / "benchmarks" / "skills" / "tiny_mcq" / "test.jsonl").read_text().splitlines()
    return [json.loads(line)["problem"] for line in lines]


@contextlib.contextmanager
def serving(checkpoint: Path, port: int, log: Path, env_changes: dict[str, str | None],
            extra_args: tuple[str, ...] = ()) -> Iterator[tuple[subprocess.Popen, float]]:
    """The checkpoint served on 127.0.0.1:port with quanteval's CPU environment changed by env_changes (None: unset),
    its output in log: (the server, seconds until /health answered). Its process group is stopped on leaving."""
    env = {**os.environ, **VLLM_CPU_ENV}
    for key, value in env_changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    command = [str(REPO / ".venv-vllm" / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server", "--model",
               str(checkpoint), "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port),
               "--max-model-len", "256", *extra_args]
    started = time.monotonic()
    with log.open("w") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    sys.exit(f"the server exited: {log}")
                time.sleep(0.2)
        yield server, time.monotonic() - started
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)


def ask(port: int, problem: str, max_tokens: int, timeout_s: float = 600) -> tuple[str, list[float]]:
    """The greedy answer to one problem in the multiple-choice prompt, and each of its tokens' logprob."""
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": PROMPT.replace("{problem}", problem)}],
                       "max_tokens": max_tokens, "temperature": 0, "logprobs": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body, {"Content-Type": "application/json"})
    choice = json.loads(urllib.request.urlopen(request, timeout=timeout_s).read())["choices"][0]
    return choice["message"]["content"], [token["logprob"] for token in choice["logprobs"]["content"]]


def identical(first: list[tuple[str, list[float]]], second: list[tuple[str, list[float]]]) -> str:
    """How many answers, and how many answers' every token logprob, two servings share."""
    texts = sum(a[0] == b[0] for a, b in zip(first, second, strict=True))
    logprobs = sum(a[1] == b[1] for a, b in zip(first, second, strict=True))
    return f"answers identical: {texts} of {len(first)}; every token's logprob identical: {logprobs} of {len(first)}"
