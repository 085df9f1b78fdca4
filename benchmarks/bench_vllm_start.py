"""The second start of a vLLM-for-CPU server of the same checkpoint, against its first (the compile paid once).

    .venv/bin/python benchmarks/bench_vllm_start.py [--checkpoint DIR] [--as-vllm-ships]

Starts the checkpoint twice the way quanteval does (plan_deployment, launch_deployment, deployment_status until
ready; the environment of frameworks.VLLM_CPU_ENV), on vLLM's default (compiled) numeric path, with compile caches
of its own (VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR in a new temporary directory): the first start compiles from
nothing, the second finds what the first left. Prints each start's wall seconds and CPU seconds (user+sys of the
server's process group, which a loaded machine does not inflate), the second as a ratio of the first (target ≤ 0.5),
and whether the second compiled again ("Compiling model again due to a load failure" in its log).
--as-vllm-ships: VLLM_USE_AOT_COMPILE=1, vLLM's own default on torch ≥ 2.10 (what quanteval started before: its AOT
artifact never loads on torch 2.13, so every start compiles).
Then two more warm starts with Python's own garbage-collector threshold (QUANTEVAL_GC_THRESHOLD=700), each after one
as setup leaves the venv (scripts/startup-gc: 10,000), printed as a ratio. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import fmean

REPO = Path(__file__).resolve().parent.parent
WORK = Path(tempfile.mkdtemp(prefix="bench-vllm-start-"))
os.environ["QUANTEVAL_STATE_DIR"] = str(WORK / "state")
os.environ.pop("QUANTEVAL_LEDGER", None)
os.environ["VLLM_CACHE_ROOT"] = str(WORK / "vllm-cache")  # a first start compiles from nothing
os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(WORK / "inductor-cache")

from quanteval.localproc import group_members  # noqa: E402 - the state dir must be set first
from quanteval.serving.deploy import (  # noqa: E402
    DeploymentStatusInput,
    LaunchDeploymentInput,
    PlanDeploymentInput,
    StopDeploymentInput,
    deployment_status,
    launch_deployment,
    plan_deployment,
    stop_deployment,
)

RECOMPILED = "Compiling model again due to a load failure"
TICKS = os.sysconf("SC_CLK_TCK")


def group_cpu_s(pgid: int) -> float:
    """User+sys seconds of the group's live processes and of the children they reaped."""
    total = 0
    for pid in group_members(pgid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
    return total / TICKS


def start(checkpoint: Path) -> tuple[float, float, bool]:
    """(wall seconds from launch to ready, CPU seconds of the server by then, whether it compiled again)."""
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework="vllm", check_args=False))
    started = time.perf_counter()
    launched = launch_deployment(LaunchDeploymentInput(plan=plan, startup_timeout_s=900))
    try:
        status = deployment_status(DeploymentStatusInput(record_id=launched.record_id, wait_s=900))
        wall = time.perf_counter() - started
        assert status.status == "ready", f"{status.status}: {status.message}\n{status.log_tail}"
        cpu = group_cpu_s(launched.pid or 0)
        recompiled = RECOMPILED in Path(launched.log_path).read_text(errors="replace")
    finally:
        stop_deployment(StopDeploymentInput(record_id=launched.record_id))
    return wall, cpu, recompiled


def start_with_pythons_gc(checkpoint: Path) -> tuple[float, float]:
    """(wall, CPU) of a start whose Pythons keep Python's own GC threshold (its spawned engine core inherits it)."""
    os.environ["QUANTEVAL_GC_THRESHOLD"] = "700"
    try:
        return start(checkpoint)[:2]
    finally:
        del os.environ["QUANTEVAL_GC_THRESHOLD"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=REPO / "examples" / "checkpoints" / "tiny-add-bf16")
    parser.add_argument("--as-vllm-ships", action="store_true", help="VLLM_USE_AOT_COMPILE=1 (vLLM's own default)")
    args = parser.parse_args()
    if args.as_vllm_ships:
        os.environ["VLLM_USE_AOT_COMPILE"] = "1"  # the environment's own value wins over quanteval's default
    label = "as vLLM ships (AOT compile)" if args.as_vllm_ships else "as quanteval starts it"
    print(f"{args.checkpoint.name}, {label}; caches in {WORK}", flush=True)
    first_wall, first_cpu, _ = start(args.checkpoint)
    print(f"first start  : {first_wall:6.1f} s wall, {first_cpu:6.1f} s CPU", flush=True)
    second_wall, second_cpu, recompiled = start(args.checkpoint)
    print(f"second start : {second_wall:6.1f} s wall, {second_cpu:6.1f} s CPU"
          f"{'  (compiled again: its AOT artifact failed to load)' if recompiled else ''}")
    print(f"second / first: {second_wall / first_wall:.2f}x wall, {second_cpu / first_cpu:.2f}x CPU  (target <= 0.5)")
    # interleaved (setup's, Python's, setup's, Python's): a machine that slows down meanwhile weighs on both
    ours = [(second_wall, second_cpu)]
    pythons = [start_with_pythons_gc(args.checkpoint)]
    ours.append(start(args.checkpoint)[:2])
    pythons.append(start_with_pythons_gc(args.checkpoint))
    for name, starts in (("GC threshold 10,000 (setup's)", ours), ("GC threshold 700 (Python's)", pythons)):
        print(f"{name:30s}: " + ", ".join(f"{wall:.1f} s wall {cpu:.1f} s CPU" for wall, cpu in starts))
    wall = fmean(wall for wall, _ in ours) / fmean(wall for wall, _ in pythons)
    cpu = fmean(cpu for _, cpu in ours) / fmean(cpu for _, cpu in pythons)
    print(f"setup's / Python's threshold: {wall:.2f}x wall, {cpu:.2f}x CPU")


if __name__ == "__main__":
    sys.exit(main())
