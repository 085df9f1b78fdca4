"""Polling a SLURM queue and grepping logs over SSH: quanteval's pooled paramiko connection versus the `ssh` a user runs.

    .venv/bin/python benchmarks/bench_remote.py [--repeats 20]

Starts the test suite's real cluster (sshd + munge + slurmctld + slurmd on 127.0.0.1, tests/infra) and prints:
  - cluster start time (packages already installed) and teardown time,
  - slurm_queue (parsed, pooled connection) vs `ssh <alias> squeue ...` (OpenSSH, one connection per poll,
    what an agent with a shell would run), median per call,
  - remote_grep (bounded, file:line) vs `ssh <alias> grep -rn ...`,
  - the first slurm_queue call (connection set-up included),
  - cluster_info (partitions, GRES GPUs, limits, accounts: one round trip, parsed) vs
    `ssh <alias> scontrol show partition; scontrol show node` (raw text).
Target: a poll through the pooled connection at least 2x faster than a fresh `ssh` per poll.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_seconds  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from infra.slurm_cluster import SlurmCluster  # noqa: E402

from quanteval.clusters.tools import (  # noqa: E402
    ClusterInfoInput,
    RemoteGrepInput,
    SlurmQueueInput,
    cluster_info,
    remote_grep,
    slurm_queue,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()

    cluster = SlurmCluster.fresh()
    started = time.perf_counter()
    cluster.up()
    cluster.write_files()
    print(f"cluster start (warm packages): {time.perf_counter() - started:.2f} s")
    os.environ["QUANTEVAL_SSH_CONFIG"] = str(cluster.ssh_config)
    try:
        for _ in range(5):
            cluster.run("sbatch --hold -o /dev/null -J bench --wrap true")
        logs = cluster.jobs_dir / "logs"
        logs.mkdir()
        for i in range(20):
            (logs / f"rank{i}.log").write_text("".join(f"step {n} ok\n" for n in range(5000)) + "CUDA out of memory\n")
        alias = cluster.ssh_alias
        ssh = [str(cluster.bin_dir / "ssh"), alias]

        started = time.perf_counter()
        slurm_queue(SlurmQueueInput(host=alias))
        print(f"slurm_queue first call (connect + auth + squeue): {time.perf_counter() - started:.3f} s")

        pooled = median_seconds(lambda: slurm_queue(SlurmQueueInput(host=alias)), args.repeats)
        fresh = median_seconds(
            lambda: subprocess.run(ssh + ["squeue -h -o '%i|%j|%u|%T|%P|%M|%l|%D|%R'"], capture_output=True, check=True),
            args.repeats,
        )
        print(f"queue poll: slurm_queue {pooled * 1000:.1f} ms vs `ssh {alias} squeue` {fresh * 1000:.1f} ms "
              f"-> {fresh / pooled:.1f}x faster")

        grep_tool = median_seconds(
            lambda: remote_grep(RemoteGrepInput(host=alias, path=str(logs), patterns=["out of memory"])), args.repeats
        )
        grep_ssh = median_seconds(
            lambda: subprocess.run(ssh + [f"grep -rni 'out of memory' {logs}"], capture_output=True, check=True),
            args.repeats,
        )
        print(f"log grep (20 files x 5k lines): remote_grep {grep_tool * 1000:.1f} ms vs `ssh grep` "
              f"{grep_ssh * 1000:.1f} ms -> {grep_ssh / grep_tool:.1f}x faster")

        info = median_seconds(lambda: cluster_info(ClusterInfoInput(host=alias)), args.repeats)
        raw = median_seconds(
            lambda: subprocess.run(ssh + ["scontrol -o show partition; scontrol -o show node"], capture_output=True,
                                   check=True),
            args.repeats,
        )
        print(f"cluster read (partitions, GPUs, limits): cluster_info {info * 1000:.1f} ms vs `ssh scontrol show ...` "
              f"{raw * 1000:.1f} ms -> {raw / info:.1f}x faster")
    finally:
        started = time.perf_counter()
        cluster.stop()
        print(f"cluster teardown: {time.perf_counter() - started:.2f} s")
        shutil.rmtree(cluster.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
