"""Where a test run's CPU goes: runs a command (default `bash scripts/test`) while sampling /proc, then prints CPU
seconds by kind of process, by test module and per vLLM server start.

    python3 benchmarks/bench_suite_cpu.py [--save FILE] [-- COMMAND ...]
    python3 benchmarks/bench_suite_cpu.py --load FILE          # the breakdown of a saved sample again

Every 0.5 s it reads each process's command line, parent, CPU ticks and (at its first sightings) the PYTEST_CURRENT_TEST
it was started under, so a server, a nel-next run or an `ns eval` is charged to the test that started it; processes
inside SLURM jobs (started by slurmd) are charged to "slurm jobs"; a process already running when the command started
counts only what it spends after. A process that lives less than 0.5 s is not sampled: its parent's count of its
ended children's CPU (cutime) charges it to that parent, and the machine's line (/proc/stat) says how busy the cores
were in all, minute by minute, so idle minutes show too. The suite's time is CPU on a 2-core
machine: this says which processes to make cheaper or fewer. Standard library only (any python3). Prints numbers;
asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable

TICKS = os.sysconf("SC_CLK_TCK")
KEYS = (b"PYTEST_CURRENT_TEST", b"PYTEST_XDIST_WORKER")


def _read(pid: str, name: str) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as file:
        return file.read()


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy since boot (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as file:
        fields = [int(value) for value in file.readline().split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / TICKS


def sample(argv: list[str]) -> tuple[list[dict], float, int, list[float]]:
    """Run argv, sampling /proc until it ends: (processes seen, seconds, its exit code, the machine's busy CPU seconds
    in each minute, counting processes too short-lived to be sampled and the kernel's own)."""
    seen: dict[str, dict] = {}
    started = time.monotonic()
    busy_since_boot = _machine_busy()
    minutes: list[float] = []
    first_pass = True  # the processes already running: the machine's own, from before the command
    child = subprocess.Popen(argv)
    try:
        while child.poll() is None:
            minute = int((time.monotonic() - started) // 60)
            if minute >= len(minutes):
                minutes.append(0.0)
            now = _machine_busy()
            minutes[-1] += now - busy_since_boot
            busy_since_boot = now
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    stat = _read(pid, "stat").decode()
                    fields = stat[stat.rindex(")") + 2:].split()
                    key = f"{pid}:{fields[19]}"  # pid and start time: a reused pid is another process
                    record = seen.get(key)
                    if record is None or record["looks"] < 4:  # a fork execs soon after: read its command again
                        cmd = _read(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace")[:400]
                        env = dict(item.split(b"=", 1) for item in _read(pid, "environ").split(b"\0") if b"=" in item)
                        record = record or seen.setdefault(key, {"pid": int(pid), "ppid": int(fields[1]), "looks": 0,
                                                                 "first": time.monotonic() - started,
                                                                 # before the run: only what it spends from now counts
                                                                 "before": (int(fields[11]) + int(fields[12])) / TICKS
                                                                 if first_pass else 0.0,
                                                                 "reaped_before": (int(fields[13]) + int(fields[14])) / TICKS})
                        record.update(cmd=cmd, env={k.decode(): env[k].decode(errors="replace") for k in KEYS if k in env})
                    record["looks"] += 1
                    record["cpu"] = (int(fields[11]) + int(fields[12])) / TICKS - record.get("before", 0.0)
                    # its children's CPU, counted once each ended and was reaped (cutime + cstime): a child that lived
                    # under 0.5 s is seen only here
                    record["reaped"] = (int(fields[13]) + int(fields[14])) / TICKS - record["reaped_before"]
                    record["last"] = time.monotonic() - started
                except (OSError, ValueError, IndexError):
                    continue  # gone meanwhile, or not ours to read
            first_pass = False
            time.sleep(0.5)
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
    return list(seen.values()), time.monotonic() - started, child.wait(), minutes


def kind(cmd: str) -> str:
    if ".venv-vllm" in cmd or "VLLM::" in cmd:
        return "vLLM"
    if ".venv-nemo-skills" in cmd:  # by venv: quanteval's scripts that run NeMo-Skills or nel-next in-process count there
        return "NeMo-Skills"
    if ".venv-nel-next" in cmd:
        return "nel-next"
    if "quanteval" in cmd:
        return "quanteval"
    if "exec(eval(sys.stdin.readline()))" in cmd or "-m pytest" in cmd:
        return "pytest workers"
    if re.search(r"slurm|munged|sshd|squeue|sbatch|scontrol|sacct", cmd):
        return "SLURM and sshd"
    return "other: " + (cmd.split()[0].rsplit("/", 1)[-1] if cmd.split() else "kernel threads, zombies")


def report(processes: list[dict], seconds: float, minutes: list[float] | None = None) -> None:
    by_pid = defaultdict(list)
    for record in processes:
        by_pid[record["pid"]].append(record)

    def parent(record: dict) -> dict | None:
        candidates = [other for other in by_pid.get(record["ppid"], []) if other["first"] <= record["first"] + 1]
        return candidates[-1] if candidates else None

    def test_of(record: dict | None) -> str:
        for _ in range(40):
            if record is None:
                return "not started by a test (the workers themselves, the machine)"
            if "slurmstepd" in record["cmd"]:
                return "slurm jobs"
            if test := record["env"].get("PYTEST_CURRENT_TEST"):
                return test.split("::")[0].rsplit("/", 1)[-1]
            record = parent(record)
        return "?"

    total = sum(record["cpu"] for record in processes)
    print(f"{total:,.0f} CPU-s in {seconds:,.0f} s ({total / seconds:.2f} cores busy on average)")
    if minutes:  # /proc/stat: also what ended between two samples, and the kernel's threads
        print(f"the machine: {sum(minutes):,.0f} CPU-s busy ({sum(minutes) / seconds:.2f} cores on average); cores busy by "
              f"minute: {' '.join(f'{cpu / min(60.0, seconds - 60 * i):.1f}' for i, cpu in enumerate(minutes))}")
    kinds, modules = Counter(), Counter()
    for record in processes:
        kinds[kind(record["cmd"])] += record["cpu"]
        modules[test_of(record)] += record["cpu"]
    print("\nby kind of process:")
    for name, cpu in kinds.most_common(12):
        print(f"  {cpu:8,.0f} CPU-s  {100 * cpu / total:4.1f}%  {name}")
    print("\nby the test that started it:")
    for name, cpu in modules.most_common(20):
        print(f"  {cpu:8,.0f} CPU-s  {name}")
    _report_unseen(processes, parent)
    servers = [record for record in processes if "vllm.entrypoints" in record["cmd"] and "python" in record["cmd"].split()[0]]
    print(f"\nvLLM servers: {len(servers)} starts")
    for server in sorted(servers, key=lambda record: record["first"]):
        core = sum(child["cpu"] for child in processes if child["ppid"] == server["pid"]
                   and server["first"] - 1 <= child["first"] <= server["last"] + 1)
        model = re.search(r"--model (\S+)", server["cmd"])
        print(f"  at {server['first']:6.0f} s: {server['cpu']:5.1f} + {core:5.1f} CPU-s (API server + engine core) "
              f"{'eager' if '--enforce-eager' in server['cmd'] else 'compiled'} "
              f"{model.group(1).rsplit('/', 1)[-1] if model else '?'}  {test_of(server)}")


def _report_unseen(processes: list[dict], parent: Callable[[dict], dict | None]) -> None:
    """What each process's ended children spent (cutime) beyond the children the samples saw."""
    unseen: Counter[str] = Counter()
    children: defaultdict[int, list[dict]] = defaultdict(list)
    for record in processes:
        if (up := parent(record)) is not None:
            children[id(up)].append(record)

    def sampled_below(record: dict, depth: int = 0) -> float:
        """The CPU the samples saw in this process and everything under it."""
        return record["cpu"] + (sum(sampled_below(child, depth + 1) for child in children[id(record)]) if depth < 40 else 0.0)

    seen_children: defaultdict[int, float] = defaultdict(float)
    for record in processes:
        if (up := parent(record)) is not None and record["last"] <= up["last"]:
            # a child's count at its last sample lacks what its own children spent after it (a server stopped as its
            # job ends): their samples count it, so it is no unseen CPU of the parent's
            seen_children[id(up)] += max(record["cpu"] + record.get("reaped", 0.0), sampled_below(record))
    for record in processes:
        if (extra := record.get("reaped", 0.0) - seen_children[id(record)]) > 0:
            unseen[f"{kind(record['cmd'])}: {' '.join(record['cmd'].split()[:3])[-70:]}"] += extra
    if unseen:
        print(f"\nchildren too short-lived to be sampled, by their parent: {sum(unseen.values()):,.0f} CPU-s")
        for name, cpu in unseen.most_common(12):
            print(f"  {cpu:8,.0f} CPU-s  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", help="keep the sample in this JSON file")
    parser.add_argument("--load", help="print the breakdown of a saved sample")
    parser.add_argument("command", nargs="*", default=["bash", "scripts/test"])
    args = parser.parse_args()
    if args.load:
        with open(args.load) as file:
            saved = json.load(file)
        report(saved["processes"], saved["seconds"], saved.get("minutes"))
        return 0
    processes, seconds, code, minutes = sample(args.command)
    if args.save:
        with open(args.save, "w") as file:
            json.dump({"processes": processes, "seconds": seconds, "command": args.command, "minutes": minutes}, file)
    report(processes, seconds, minutes)
    return code


if __name__ == "__main__":
    sys.exit(main())
