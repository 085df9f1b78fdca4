"""How much an assistant does from an empty directory to a canary-ready config, following the evaluation skill.

    PYTHONPATH=mcp_server .venv/bin/python benchmarks/bench_chain.py

Drives the same `quanteval call` subprocesses as tests/test_e2e_chain.py and prints, per scenario, the tool calls
and the characters of output the assistant reads, with the ratio to the old skill pack's (~25 calls, ~64k
characters for the NVFP4 + SGLang on SLURM scenario).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from chain_scenarios import cli_env, enforced_checks, run_scenario, scenarios  # noqa: E402

BEFORE_CALLS, BEFORE_CHARACTERS = 25, 64_000  # measured by a session following the old skill pack


def main() -> None:
    with tempfile.TemporaryDirectory() as temp:
        root = Path(temp)
        env = cli_env(root / "home")
        configs: dict[str, Path] = {}
        print(f"{'scenario':40} {'calls':>5} {'chars':>7} {'seconds':>8}  checks")
        for scenario in scenarios(root / "checkpoints"):
            started = time.perf_counter()
            transcript, config = run_scenario(scenario, root / scenario.name, env, configs)
            elapsed = time.perf_counter() - started
            checks = enforced_checks(config, scenario.checkpoint)
            verdict = "all pass" if all(ok for ok, _ in checks.values()) else "FAILED: " + ", ".join(k for k, (ok, _) in checks.items() if not ok)
            print(f"{scenario.name:40} {len(transcript.calls):5d} {transcript.characters:7d} {elapsed:8.1f}  {verdict}")
            if scenario.name.startswith("nvfp4"):
                print(f"{'':40} calls x{len(transcript.calls) / BEFORE_CALLS:.2f}, characters x{transcript.characters / BEFORE_CHARACTERS:.2f} "
                      f"of the old skill pack's {BEFORE_CALLS} calls / {BEFORE_CHARACTERS} characters")
                print(f"{'':40} " + ", ".join(f"{tool} {size}" for tool, size in transcript.calls))


if __name__ == "__main__":
    main()
