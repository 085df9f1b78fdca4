"""Stand-in for NeMo-Skills' `ns`, kept only for what the real one (tests/test_evalserver_real_ns.py) cannot
do in a test's time: jobs that take a chosen while (queueing, idempotency, shutdown, scale) and process
trees that must be stopped. Everything else is checked against the real `ns`; where the two disagreed,
this file was corrected to match what the real `ns eval` (NeMo-Skills 8b18f39, and 467b057 alike; executor none) does:

- `ns eval` exits 0 even when generation failed: `fail*` benchmarks print a traceback, write no
  metrics.json and exit 0 (it used to exit 1, which the real one never does for that);
- output layout: `eval-results/<bench>/output.jsonl` (greedy, `name`) or `output-rs<seed>.jsonl` per sample
  (`name:N`), each with `.done`; metrics.json is `{bench: {"pass@1": ..., "pass@N": ..., "pass@1[avg-of-N]": ...,
  "majority@N": ...}}` with num_entries, avg_tokens, gen_seconds, symbolic_correct, no_answer (it used to
  write only one of those keys);
- sharding is `--num_chunks N --chunk_ids i` (pipeline options; `++num_chunks` alone breaks the real
  evaluation step) and merging needs `ns summarize_results`: both only ever run with the real `ns`;
- requests carry temperature, top_p, max_tokens and, for server types sglang/vllm, top_k (when > 0).

Its dataset is arithmetic ("What is A+B?"), so the metrics depend on what the server really answered.
`slow*` benchmarks sleep ($FAKE_NS_SLEEP_S, default 3 s) and, with $FAKE_NS_CHILDREN=N, start N child
processes first (as the real `ns` does), so stopping must take the whole process group. The argv is saved to
<output_dir>/argv.json for the tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

QUESTIONS = [(a, b) for a in range(1, 5) for b in range(1, 4)]  # 12 prompts


def parse(argv: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    options: dict[str, str] = {}
    overrides: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("++"):
            key, _, value = arg[2:].partition("=")
            overrides[key] = value
            i += 1
        elif arg.startswith("--"):
            options[arg[2:]] = argv[i + 1]
            i += 2
        else:
            raise SystemExit(f"unexpected argument {arg!r}")
    return options, overrides


def ask(options: dict[str, str], overrides: dict[str, str], a: int, b: int) -> bool:
    body = {
        "model": options["model"],
        "messages": [{"role": "user", "content": f"What is {a}+{b}?"}],
        "temperature": float(overrides.get("inference.temperature", 0.0)),
        "top_p": float(overrides.get("inference.top_p", 0.95)),
        "max_tokens": int(overrides["inference.tokens_to_generate"]) if "inference.tokens_to_generate" in overrides else None,
    }
    top_k = int(overrides.get("inference.top_k", -1))
    if top_k > 0:
        if options["server_type"] == "openai":
            raise ValueError("`top_k` is not supported by OpenAI API, please set it to -1.")
        body["top_k"] = top_k
    request = urllib.request.Request(options["server_address"].rstrip("/") + "/chat/completions",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = json.loads(response.read())["choices"][0]["message"]["content"]
    found = re.findall(r"\\boxed\{(\d+)\}", text)
    return bool(found) and found[-1] == str(a + b)


def metrics_of(files: list[Path]) -> dict[str, dict[str, float]]:
    """NeMo-Skills' math metrics keys for greedy (one file) or N sampled files."""
    runs = [[json.loads(line) for line in f.read_text().splitlines() if line] for f in files]
    n, entries = len(runs), len(runs[0])
    per_problem = [[run[i]["symbolic_correct"] for run in runs] for i in range(entries)]

    def block(value: float) -> dict[str, float]:
        return {"num_entries": entries, "avg_tokens": 10, "gen_seconds": 0, "symbolic_correct": value, "no_answer": 0.0}

    avg = 100.0 * sum(sum(p) for p in per_problem) / (entries * n)
    if n == 1 and files[0].name.startswith("output.jsonl"):
        return {"pass@1": block(avg)}
    return {
        "pass@1": block(avg),
        f"pass@{n}": block(100.0 * sum(any(p) for p in per_problem) / entries),
        f"pass@1[avg-of-{n}]": block(avg),
        f"majority@{n}": block(100.0 * sum(sum(p) * 2 > n for p in per_problem) / entries),
    }


def evaluate(argv: list[str]) -> int:
    options, overrides = parse(argv)
    out = Path(options["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "argv.json").write_text(json.dumps({"argv": argv}))
    bench, _, repeats_text = options["benchmarks"].partition(":")
    seeds = list(range(int(repeats_text))) if repeats_text else [None]
    print(f"ns eval {options['benchmarks']} against {options['server_address']}", flush=True)
    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
                for _ in range(int(os.environ.get("FAKE_NS_CHILDREN", "0")))]
    if bench.startswith("slow"):
        time.sleep(float(os.environ.get("FAKE_NS_SLEEP_S", "3")))
    if bench.startswith("fail"):
        print("Traceback (most recent call last):\n  File generate.py\nRuntimeError: judge server unreachable", flush=True)
        return 0  # as the real `ns eval`: the failed job does not fail the command
    questions = QUESTIONS[: int(overrides["max_samples"])] if int(overrides.get("max_samples", -1)) > 0 else QUESTIONS
    results = out / "eval-results" / bench
    results.mkdir(parents=True, exist_ok=True)
    files = []
    for seed in seeds:
        name = "output.jsonl" if seed is None else f"output-rs{seed}.jsonl"
        path = results / name
        path.write_text("".join(json.dumps({"problem": f"What is {a}+{b}?", "expected_answer": str(a + b),
                                            "symbolic_correct": ask(options, overrides, a, b)}) + "\n"
                                for a, b in questions))
        (results / f"{name}.done").touch()
        files.append(path)
    for child in children:
        child.kill()
    (results / "metrics.json").write_text(json.dumps({bench: metrics_of(files)}, indent=2))
    return 0


if __name__ == "__main__":
    command, rest = sys.argv[1], sys.argv[2:]
    sys.exit(evaluate(rest) if command == "eval" else 2)
