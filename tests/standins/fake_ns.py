"""Stand-in for NeMo-Skills' `ns eval`: a real process that queries the OpenAI-compatible server it is
pointed at and writes `eval-results/<bench>/metrics.json` in NeMo-Skills' layout.

Its dataset is arithmetic ("What is A+B?"), so the metrics depend on what the server really answered.
Benchmarks named `fail*` print a traceback-like error and exit 1; `slow*` sleep first; `nometrics*`
exit 0 without writing metrics. The argv (and shard env vars) it got are saved to <output_dir>/argv.json for the tests.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

QUESTIONS = [(a, b) for a in range(1, 5) for b in range(1, 4)]  # 12 prompts


def main(argv: list[str]) -> int:
    assert argv[0] == "eval", f"expected `ns eval`, got {argv[:1]}"
    options: dict[str, str] = {}
    overrides: dict[str, str] = {}
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("++"):
            key, _, value = arg[2:].partition("=")
            overrides[key] = value
            i += 1
        else:
            options[arg.lstrip("-")] = argv[i + 1]
            i += 2
    out = Path(options["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    shard_env = {k: os.environ[k] for k in ("NEL_SHARD_IDX", "NEL_TOTAL_SHARDS") if k in os.environ}
    (out / "argv.json").write_text(json.dumps({"argv": argv, "env": shard_env}))
    bench, _, repeats = options["benchmarks"].partition(":")
    repeats = int(repeats or 1)
    print(f"ns eval {bench} x{repeats} against {options['server_address']}", flush=True)
    if bench.startswith("slow"):
        time.sleep(float(overrides.get("sleep", 3)))
    if bench.startswith("fail"):
        print("Traceback (most recent call last):\n  File generate.py\nRuntimeError: judge server unreachable", flush=True)
        return 1
    if bench.startswith("nometrics"):
        return 0
    chunks, chunk = int(overrides.get("num_chunks", 1)), int(overrides.get("chunk_id", 0))
    questions = QUESTIONS[chunk::chunks]
    correct = 0
    for a, b in questions:
        for _ in range(repeats):
            body = {
                "model": options["model"],
                "messages": [{"role": "user", "content": f"What is {a}+{b}?"}],
                "temperature": float(overrides.get("inference.temperature", 0)),
            }
            request = urllib.request.Request(
                options["server_address"].rstrip("/") + "/chat/completions",
                data=json.dumps(body).encode(), headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                answer = json.loads(response.read())["choices"][0]["message"]["content"]
            correct += answer.strip() == str(a + b)
    total = len(questions) * repeats
    key = f"pass@1[avg-of-{repeats}]" if repeats > 1 else "pass@1"
    metrics = {bench: {key: {"num_entries": len(questions), "symbolic_correct": 100.0 * correct / total,
                             "no_answer": 0.0}}}
    results = out / "eval-results" / bench
    results.mkdir(parents=True, exist_ok=True)
    (results / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
