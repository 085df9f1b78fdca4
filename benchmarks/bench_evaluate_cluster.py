"""The one call on a SLURM cluster against the same call on this machine: `quanteval evaluate BASE CAND` and
`quanteval evaluate BASE CAND --host CLUSTER`, one after the other on a quiet machine.

    .venv/bin/python benchmarks/bench_evaluate_cluster.py [--max-problems 200]

Starts the test suite's real cluster (sshd + munge + slurmctld + slurmd on 127.0.0.1, tests/infra), then evaluates the
embedded tiny-skills pair on skills://tiny_mcq here and there (each side's canary and full run a SLURM job whose vLLM,
the CPU build in .venv-vllm, serves inside the job). Prints both wall times, the ratio (target <= 1.3), and each
call's per-stage seconds: where the difference goes (the queue wait per job, each job's own vLLM start, the poll).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from infra.slurm_cluster import SlurmCluster  # noqa: E402

CHECKPOINTS = REPO / "examples" / "checkpoints"
SHIPPED = REPO / "examples" / "benchmarks" / "skills"


def evaluate(arguments: list[str], env: dict[str, str]) -> tuple[dict, float]:
    started = time.monotonic()
    done = subprocess.run([str(REPO / ".venv" / "bin" / "quanteval"), "evaluate", str(CHECKPOINTS / "tiny-skills-bf16"),
                           str(CHECKPOINTS / "tiny-skills-w2-rtn"), "--benchmarks", "skills://tiny_mcq",
                           "--max-drop", "1.5", "--json", *arguments], capture_output=True, text=True, env=env, check=False)
    if done.returncode not in (0, 3, 4):
        sys.exit(f"quanteval evaluate failed ({done.returncode}): {done.stderr[-3000:]}")
    return json.loads(done.stdout), time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-problems", type=int, default=200)
    args = parser.parse_args()
    cluster = SlurmCluster.fresh()
    state = Path(tempfile.mkdtemp(prefix="quanteval-bench-"))
    env = {**os.environ, "QUANTEVAL_STATE_DIR": str(state), "QUANTEVAL_SSH_CONFIG": str(cluster.ssh_config),
           "NEMO_SKILLS_EXTRA_BENCHMARK_MAP": str(SHIPPED / "benchmark_map.json"), "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0",
           "PATH": f"{cluster.bin_dir}{os.pathsep}{REPO / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    common = ["--max-problems", str(args.max_problems)]
    try:
        cluster.up()
        cluster.write_files()
        local, local_s = evaluate([*common, "--output-dir", str(state / "local")], env)
        there, cluster_s = evaluate([
            *common, "--output-dir", str(state / "cluster"), "--host", cluster.ssh_alias, "--partition", "debug",
            "--account", "quanteval-test", "--walltime", "00:30:00", "--gpus-per-node", "1",
            "--cluster-output-dir", str(cluster.jobs_dir / "bench"), "--nel-next-venv", str(REPO / ".venv-nel-next"),
            "--vllm-venv", str(REPO / ".venv-vllm"), "--startup-timeout-s", "600"], env)
        print(f"verdicts: here {local['verdict']}, on the cluster {there['verdict']}")
        print(f"here: {local_s:.0f} s; stages {local['seconds']}")
        print(f"cluster: {cluster_s:.0f} s; stages {there['seconds']}")
        for role in ("baseline", "candidate"):  # per side: each stage's seconds, the queue waits apart
            print(f"{role}: here {local[role]['seconds']}; on the cluster {there[role]['seconds']}")
        print(f"cluster / here: {cluster_s / local_s:.2f}x (target <= 1.3)")
    finally:
        cluster.stop()
        shutil.rmtree(cluster.workdir, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    main()
