"""The whole question, timed: `quanteval evaluate` against doing the same by hand, on the embedded model.

    .venv/bin/python benchmarks/bench_evaluate.py [--candidate tiny-add-w8a8] [--noise-floor]

By hand is what a user would type without quanteval: start vLLM on the baseline, wait for /health, `nel eval run`,
stop it; the same for the candidate; `nel compare`. quanteval does more (inspects, plans, validates, dry-runs, runs
a canary before each full run, validates each run) and prints its per-stage split. --noise-floor has quanteval
also serve the baseline on vLLM's other numeric path (evaluate --noise-floor): its cost is printed apart. Both start from an empty state
directory, so nothing is reused. Peak memory is the machine's used memory above what it was at the start,
sampled every 0.2 s (vLLM's API server, engine core and worker are separate processes).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from quanteval.serving.frameworks import VLLM_CPU_ENV  # the environment quanteval gives vLLM on CPU (KV cache, compile cache)

REPO = Path(__file__).resolve().parent.parent
CHECKPOINTS = REPO / "examples" / "checkpoints"
BENCH = REPO / "examples" / "benchmarks" / "tiny_add.py"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
NEL = REPO / ".venv-nel-next" / "bin" / "nel"


def used_memory_bytes() -> int:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    kib = int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])
    return kib * 1024


class PeakMemory:
    def __init__(self) -> None:
        self.start = used_memory_bytes()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, used_memory_bytes())

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def gib(self) -> float:
        return (self.peak - self.start) / 2**30


def by_hand(baseline: Path, candidate: Path, work: Path, env: dict[str, str]) -> dict[str, float]:
    seconds: dict[str, float] = {}
    run_dirs = []
    for role, checkpoint in (("baseline", baseline), ("candidate", candidate)):
        port = 18000 + len(run_dirs)
        started = time.monotonic()
        server = subprocess.Popen(
            [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint),
             "--served-model-name", checkpoint.name, "--max-model-len", "256", "--host", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**VLLM_CPU_ENV, **env, "HF_HUB_OFFLINE": "1"})
        try:
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                        if answer.status == 200:
                            break
                except OSError:
                    time.sleep(0.5)
            seconds[f"{role} serve"] = time.monotonic() - started
            mark = time.monotonic()
            out = work / role
            subprocess.run([str(NEL), "eval", "run", "--bench", str(BENCH), "--model-url",
                            f"http://127.0.0.1:{port}/v1/chat/completions", "--model-id", checkpoint.name,
                            "--max-tokens", "128", "--temperature", "0", "-o", str(out)],
                           check=True, capture_output=True, env=env)
            seconds[f"{role} eval"] = time.monotonic() - mark
            run_dirs.append(out)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait()
    mark = time.monotonic()
    subprocess.run([str(NEL), "compare", str(run_dirs[0]), str(run_dirs[1]), "--no-report", "--no-strict", "--compact"],
                   check=True, capture_output=True, env=env)
    seconds["compare"] = time.monotonic() - mark
    return seconds


def with_quanteval(baseline: Path, candidate: Path, work: Path, env: dict[str, str], noise_floor: bool) -> dict:
    done = subprocess.run([str(REPO / ".venv" / "bin" / "quanteval"), "evaluate", str(baseline), str(candidate),
                           "--benchmarks", str(BENCH), "--output-dir", str(work / "out"), "--json",
                           *(["--noise-floor"] if noise_floor else [])],
                          capture_output=True, text=True, env={**env, "QUANTEVAL_STATE_DIR": str(work / "state")})
    if done.returncode not in (0, 3, 4):
        sys.exit(f"quanteval evaluate failed ({done.returncode}): {done.stderr[-1500:]}")
    return json.loads(done.stdout)


def responses(run_dir: Path) -> dict[int, str]:
    """Each problem's response in a nel-next run (verified_log.jsonl), by problem index."""
    found: dict[int, str] = {}
    for log in run_dir.rglob("verified_log.jsonl"):
        for line in log.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                found[int(entry["problem_idx"])] = entry.get("response") or ""
    return found


def same_responses(hand_dir: Path, ours_dir: Path) -> str:
    """Both serve vLLM with its defaults (the compiled path; quanteval adds --enforce-eager only when asked): at
    temperature 0 the answers must be the same, problem by problem."""
    hand, ours = responses(hand_dir), responses(ours_dir)
    same = sum(1 for index, text in hand.items() if ours.get(index) == text)
    return f"{same}/{len(hand)} responses identical" + ("" if len(hand) == len(ours) else f" ({len(ours)} ours)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidate", default="tiny-add-w8a8")
    parser.add_argument("--noise-floor", action="store_true", help="quanteval evaluate --noise-floor (by hand has none)")
    args = parser.parse_args()
    baseline, candidate = CHECKPOINTS / "tiny-add-bf16", CHECKPOINTS / args.candidate
    env = {**os.environ, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"}
    env.pop("QUANTEVAL_VLLM_LAUNCHER", None)
    with tempfile.TemporaryDirectory() as temp:
        work = Path(temp)
        with PeakMemory() as hand_memory:
            started = time.monotonic()
            hand = by_hand(baseline, candidate, work / "hand", env)
            hand_total = time.monotonic() - started
        with PeakMemory() as ours_memory:
            started = time.monotonic()
            result = with_quanteval(baseline, candidate, work / "quanteval", env, args.noise_floor)
            ours_total = time.monotonic() - started
        agreement = {role: same_responses(work / "hand" / role, Path(result[role]["run_dir"]))
                     for role in ("baseline", "candidate")}
    print(f"tiny-add-bf16 vs {args.candidate}, 1000 problems, verdict: {result['verdict']}")
    print(f"by hand (vLLM, nel eval run x2, nel compare): {hand_total:6.1f} s  peak +{hand_memory.gib:.2f} GiB")
    print("    " + ", ".join(f"{k} {v:.1f}" for k, v in hand.items()))
    print(f"quanteval evaluate:                           {ours_total:6.1f} s  peak +{ours_memory.gib:.2f} GiB")
    print("    " + ", ".join(f"{k} {v:.1f}" for k, v in result["seconds"].items()))
    print("by hand vs quanteval, per problem: " + ", ".join(f"{role} {text}" for role, text in agreement.items()))
    floor = result["seconds"].get("noise_floor", 0.0)
    print(f"ratio quanteval / by hand: {ours_total / hand_total:.2f}x (goal <= 1.1x; quanteval adds a canary per checkpoint)"
          + (f"; {(ours_total - floor) / hand_total:.2f}x without the noise floor's {floor:.1f} s" if floor else ""))


if __name__ == "__main__":
    main()
