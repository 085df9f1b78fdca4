"""The release gate: `quanteval gate` (tool gate_results) versus what a user runs instead, `nel gate` (nel-next).

    .venv/bin/python benchmarks/bench_gate.py [--benchmarks N] [--problems P]

One real `nel eval run` of tiny_add (P problems, default 1000) against the inference stand-in gives the layout; a
baseline and a candidate run of N benchmarks (default 5) are made from it, the candidate losing 3 points on one
critical benchmark, under an NVFP4-release-shaped policy (critical max_drop 0.015, supporting, advisory). Prints:
  - `nel gate --policy P BASE CAND --no-report` (nel-next's CLI, its Python start included), median of 3,
  - `quanteval gate BASE CAND --policy P` (our CLI, its start included), median of 3,
  - gate_results in-process (what an MCP session pays per call once the server runs), median of 3,
and checks that both CLIs give the same verdict and exit code.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from next_runs import NEL, make_run, real_nel_run, write_policy  # noqa: E402
from timing import median_seconds  # noqa: E402

from quanteval.workflow.gate import GateResultsInput, gate_results  # noqa: E402

QUANTEVAL = Path(sys.executable).parent / "quanteval"
TIERS = ("critical", "critical", "supporting", "supporting", "advisory")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--benchmarks", type=int, default=5)
    parser.add_argument("--problems", type=int, default=1000)
    args = parser.parse_args()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        template = real_nel_run(root / "template", args.problems)
        names = [f"bench{i}" for i in range(args.benchmarks)]
        base_rewards = {name: [float(rng.random() < 0.8) for _ in range(args.problems)] for name in names}
        cand_rewards = {name: list(rewards) for name, rewards in base_rewards.items()}
        lost = [i for i, r in enumerate(cand_rewards[names[0]]) if r > 0][: int(0.03 * args.problems)]
        for i in lost:  # the candidate loses 3 points on the first (critical) benchmark
            cand_rewards[names[0]][i] = 0.0
        base = make_run(template, root / "base", base_rewards)
        cand = make_run(template, root / "cand", cand_rewards)
        lines = ["version: 1", "defaults: {max_drop: 0.015}", "benchmarks:"]
        lines += [f"  {name}: {{tier: {TIERS[i % len(TIERS)]}, metric: pass@1}}" for i, name in enumerate(names)]
        policy = write_policy(root / "policy.yaml", "\n".join(lines) + "\n")

        nel_cmd = [str(NEL), "gate", "--policy", str(policy), str(base), str(cand), "--no-report", "--format", "json"]
        ours_cmd = [str(QUANTEVAL), "gate", str(base), str(cand), "--policy", str(policy), "--json"]
        env = {"NEMO_EVALUATOR_TELEMETRY_LEVEL": "0", "PATH": "/usr/bin:/bin"}
        nel_done = subprocess.run(nel_cmd, capture_output=True, text=True, env=env, check=False)
        ours_done = subprocess.run(ours_cmd, capture_output=True, text=True, check=False)
        nel_verdict, ours_verdict = json.loads(nel_done.stdout)["verdict"], json.loads(ours_done.stdout)["verdict"]
        assert (nel_verdict, nel_done.returncode) == (ours_verdict, ours_done.returncode), (nel_done, ours_done)

        nel_s = median_seconds(lambda: subprocess.run(nel_cmd, capture_output=True, env=env, check=False))
        ours_s = median_seconds(lambda: subprocess.run(ours_cmd, capture_output=True, check=False))
        request = GateResultsInput(baseline=str(base), candidate=str(cand), policy=str(policy))
        inproc_s = median_seconds(lambda: gate_results(request))

    print(f"gate: {args.benchmarks} benchmarks x {args.problems} problems, verdict {ours_verdict} (exit {ours_done.returncode}) "
          f"from both")
    print(f"  nel gate (CLI)            {nel_s:7.2f} s")
    print(f"  quanteval gate (CLI)      {ours_s:7.2f} s   ratio {ours_s / nel_s:5.2f}x nel gate")
    print(f"  gate_results (in-process) {inproc_s:7.2f} s   ratio {inproc_s / nel_s:5.2f}x nel gate")


if __name__ == "__main__":
    main()
