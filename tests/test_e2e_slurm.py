"""From an empty directory to a canary in the real SLURM queue, through `quanteval call` only, as the skill says.

The cluster (fixture `slurm_cluster`) has only Hopper GPUs that can run jobs (partitions debug and hopper:
`gpu:h100:8`; the blackwell partition's node never comes up). The NVFP4 Qwen3 checkpoint is served by SGLang:
the cluster is read over SSH, NEL's own defaults (partition batch, gres gpu:8) are replaced by what exists and
what this model needs, sbatch takes the job, and the canary fails on the node for the reason it really fails
here (no pyxis/enroot for `srun --container-image`), which run_logs names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from tiers import REPO, own_lane

NVFP4 = REPO / "examples" / "checkpoints" / "qwen3-tiny-nvfp4"
pytestmark = own_lane("slurm-nel-next")  # beside test_nel_next_slurm, apart from the other SLURM modules' lane


def call(env: dict[str, str], cwd: Path, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([str(Path(sys.executable).parent / "quanteval"), "call", tool, "--json", json.dumps(arguments)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{tool} {arguments}: {done.stderr[-2000:]}"
    return json.loads(done.stdout)


def test_nvfp4_sglang_canary_reaches_a_hopper_only_cluster_and_its_failure_is_named(slurm_cluster, tmp_path: Path) -> None:
    env = dict(os.environ, HF_TOKEN="hf_dummy", USER=slurm_cluster.user)  # the fixture put QUANTEVAL_SSH_CONFIG and ssh on PATH
    work = tmp_path / "empty"
    work.mkdir()
    config = str(work / "eval.yaml")

    call(env, work, "build_config", {"execution": "slurm", "deployment": "sglang", "model_type": "chat_reasoning",
                                     "benchmarks": ["core_reasoning"], "config_path": config})
    call(env, work, "add_tasks", {"config_path": config, "tasks": ["gpqa"], "replace": True})
    report = call(env, work, "inspect_checkpoint", {"checkpoint": str(NVFP4)})
    assert report["quantization"]["quant_algo"] == "NVFP4"
    # the cluster is this machine: the checkpoint's path is the same there
    call(env, work, "apply_checkpoint", {"config_path": config, "checkpoint": str(NVFP4), "cluster_checkpoint_path": str(NVFP4)})
    for key, value in {"execution.hostname": slurm_cluster.ssh_alias, "execution.account": "quanteval-test",
                       "execution.output_dir": str(slurm_cluster.jobs_dir / tmp_path.name)}.items():
        call(env, work, "set_config_value", {"config_path": config, "key": key, "value": value})

    cluster = call(env, work, "cluster_info", {"host": slurm_cluster.ssh_alias})
    gpu_models = {p["name"]: p["gpu_model"] for p in cluster["partitions"]}
    assert gpu_models["hopper"] == "H100" and gpu_models["debug"] == "H100"
    placed = call(env, work, "apply_cluster", {"config_path": config, "partition": "hopper", "walltime": "00:10:00"})["placement"]
    # this model needs one GPU (TP 1), not NEL's blanket gpu:8; the format as it ships is not what Hopper measures
    assert placed["values"]["execution.gres"] == "gpu:1" and placed["partition"] == "hopper"
    assert any("NVFP4 on H100" in w and "Marlin" in w and "Partition blackwell" in w for w in placed["warnings"])

    validation = call(env, work, "validate_config", {"config_path": config})
    assert validation["valid"], validation["problems"]
    assert call(env, work, "dry_run", {"config_path": config})["ok"]

    doc = yaml.safe_load(Path(config).read_text())
    context = int(doc["deployment"]["extra_args"].split("--context-length")[1].split()[0])
    assert doc["evaluation"]["nemo_evaluator_config"]["config"]["params"]["max_new_tokens"] < context  # SGLang would refuse every request otherwise

    canary = call(env, work, "launch_canary", {"config_path": config, "limit_samples": 2})
    assert canary["executor"] == "slurm"
    deadline = time.monotonic() + 120
    while True:
        status = call(env, work, "run_status", {"record_id": canary["record_id"]})
        if status["status"] in ("failed", "succeeded", "killed") or time.monotonic() > deadline:
            break
        time.sleep(2)
    (job,) = status["jobs"]
    assert job["slurm_job_id"], status  # sbatch accepted the partition, gres and walltime apply_cluster wrote
    assert status["status"] == "failed", status
    logs = call(env, work, "run_logs", {"record_id": canary["record_id"]})
    assert logs["diagnosis"]["failure_class"] == "container", logs["diagnosis"]
