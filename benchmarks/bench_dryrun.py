"""dry_run against `nel run --dry-run`, and list_runs against `nel ls runs`, on the same inputs.

dry_run runs NEL's own dry-run in a child of a warm NEL process (the first call starts it): what it adds is the
isolation, the script collection, the secrets chmod and the ledger record; what it saves is NEL's import and all but
one parse of NEL's packaged task list (NEL parses it at each task lookup: twice locally and 2 + N times on SLURM for
N tasks, ~0.9 s each). Two configs: local with two tasks, SLURM with three. list_runs reads the SQLite ledger only.

    .venv/bin/python benchmarks/bench_dryrun.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPEATS = 3


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-dryrun-"))
    os.environ.update({"QUANTEVAL_STATE_DIR": str(work / "state"), "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0",
                       "NEMO_EVALUATOR_EXEC_DB_FILE": str(work / "exec.v1.jsonl"), "JUDGE_API_KEY": "bench-secret"})
    config = work / "run.yaml"
    config.write_text(f"""defaults:
  - execution: local
  - deployment: none
  - _self_
execution:
  output_dir: {work / 'out'}
target:
  api_endpoint:
    url: http://127.0.0.1:9/v1/chat/completions
    model_id: tiny-model
    api_key_name: JUDGE_API_KEY
evaluation:
  tasks:
    - name: lm-evaluation-harness.ifeval
    - name: lm-evaluation-harness.gsm8k
""")
    slurm = work / "slurm.yaml"
    slurm.write_text("""defaults:
  - execution: slurm/default
  - deployment: vllm
  - _self_
execution:
  hostname: login.cluster.example
  username: tester
  account: llm_eval
  output_dir: /lustre/fs1/tester/nel-results
deployment:
  image: vllm/vllm-openai:v0.33.0
  checkpoint_path: /lustre/fs1/tester/checkpoints/model
  hf_model_handle: null
  served_model_name: model
target:
  api_endpoint:
    api_key_name: JUDGE_API_KEY
evaluation:
  nemo_evaluator_config:
    config:
      params:
        extra:
          tokenizer: /checkpoint
  tasks:
    - name: ns_gpqa
    - name: ns_aime2025
    - name: lm-evaluation-harness.ifeval
""")
    from quanteval import ledger
    from quanteval.workflow import runs

    nel = str(Path(sys.executable).parent / "nel")
    for name, path in (("local, 2 tasks", config), ("SLURM, 3 tasks", slurm)):
        nel_times = [timed(lambda path=path: subprocess.run([nel, "run", "--config", str(path), "--dry-run"], check=True,
                                                       capture_output=True)) for _ in range(REPEATS)]
        started = time.perf_counter()
        checked = runs.dry_run(runs.DryRunInput(config_path=str(path)))  # the first call also starts the warm process
        first = time.perf_counter() - started
        assert checked.ok and checked.scripts, checked.error
        ours = [timed(lambda path=path: runs.dry_run(runs.DryRunInput(config_path=str(path)))) for _ in range(REPEATS)]
        nel_median, our_median = statistics.median(nel_times), statistics.median(ours)
        print(f"{name}:")
        print(f"  nel run --dry-run     median {nel_median:6.2f} s  ({', '.join(f'{t:.2f}' for t in nel_times)})")
        print(f"  quanteval dry_run     median {our_median:6.2f} s  ({', '.join(f'{t:.2f}' for t in ours)})")
        print(f"  ratio dry_run / nel   {our_median / nel_median:6.2f}x  (the first call, a warm process starting: "
              f"{first:.2f} s, {first / nel_median:.2f}x)")

    for index in range(500):
        ledger.add("canary", status="succeeded" if index % 3 else "failed", config_hash=f"h{index % 7}")
    ls_runs = [timed(lambda: subprocess.run([nel, "ls", "runs"], check=True, capture_output=True))
               for _ in range(REPEATS)]
    listing = [timed(lambda: runs.list_runs(runs.ListRunsInput(kind="canary", status="failed", limit=20)))
               for _ in range(REPEATS)]
    print(f"nel ls runs             median {statistics.median(ls_runs) * 1000:8.1f} ms")
    print(f"list_runs (500 records) median {statistics.median(listing) * 1000:8.1f} ms")
    print(f"list_runs is            {statistics.median(ls_runs) / statistics.median(listing):8.1f}x faster than nel ls runs")


if __name__ == "__main__":
    main()
