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
from pathlib import Path

from tiers import BENCH, REPO

from quanteval.engines.nel_next import nelnext
from quanteval.localproc import free_port

STANDIN = REPO / "tests" / "standins" / "fake_inference_server.py"
NEL = nelnext.nel_binary()  # `nel gate`, `nel compare`: the oracles, as users run them
NEL_RUN = nelnext.nel_command()  # as quanteval starts runs: test runs side by side must not share one adapter proxy


def real_nel_run(out: Path, problems: int) -> Path:
    """`nel eval run` of tiny_add's first `problems` problems against the stand-in (every answer wrong): its folder."""
    port = free_port()
    server = subprocess.Popen([sys.executable, str(STANDIN), "--model", "X", "--served-model-name", "m",
                               "--port", str(port), "--fake-load-s", "0"],
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
        env = {**os.environ, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"}
        done = subprocess.run([*NEL_RUN, "eval", "run", "--bench", str(BENCH), "--model-url",
                               f"http://127.0.0.1:{port}/v1/chat/completions", "--model-id", "m", "--max-tokens", "16",
                               "--max-problems", str(problems), "-o", str(out)],
                              capture_output=True, text=True, env=env, timeout=600, check=False)
        if done.returncode != 0 or len(list((out / "tiny_add").glob("eval-*.json"))) != 1:
            raise RuntimeError(f"nel eval run failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    finally:
        server.terminate()
        server.wait(timeout=10)
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
