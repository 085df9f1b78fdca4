"""A server that dies in its SLURM job, on the suite's real cluster: the answer names the side, its job, node and the
last lines of the server's own log on the cluster (nel-next's logs/server-model-JOBID.log), masked; run_logs shows
that log's tail beside the job's.

The baseline lacks one tensor (its final norm's): plan_deployment reads its header as any checkpoint's, vLLM (CPU
build, in the job) refuses the weights it cannot initialize, nel-next's job script sees its server gone and ends the
job. Both sides serve eager (--enforce-eager): numerics are not the subject, and the candidate's start is ~15 s
shorter.
"""

from __future__ import annotations

import shutil

import pytest
from processes import wait_until
from tiers import CHECKPOINTS, REPO, VLLM_PYTHON, own_lane, requires

from quanteval import ledger
from quanteval.clusters import slurm
from quanteval.engines.nel_next import nelnext
from quanteval.models import ToolError
from quanteval.workflow import runs
from quanteval.workflow.evaluate import EvaluateQuantizationInput, evaluate_quantization
from quanteval.workflow.evaluate_cluster import ClusterSettings

pytestmark = [*requires("nel-next", "slurm", "vllm"), own_lane("vllm-cluster-faults")]  # test_evaluate_slurm's faults lane


def _unloadable(tmp_path):
    """tiny-add-bf16 without its final norm's weight (a shard lost in a copy): its header reads as any checkpoint's."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "tiny-add-missing-tensor"
    shutil.copytree(CHECKPOINTS / "tiny-add-bf16", broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.norm.weight"]
    save_file(tensors, str(broken / "model.safetensors"), metadata={"format": "pt"})
    return broken


@pytest.mark.timeout(900)
def test_a_server_that_dies_in_its_job_is_named_with_its_job_node_and_the_last_lines_of_its_log(slurm_cluster, tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_never_shown")  # in the job's environment (export ALL)
    request = EvaluateQuantizationInput(
        baseline_checkpoint=str(_unloadable(tmp_path)), candidate_checkpoint=str(CHECKPOINTS / "tiny-add-w8a8"),
        benchmarks=[str(REPO / "examples" / "benchmarks" / "tiny_add.py")], max_problems=10, canary_problems=5,
        host=slurm_cluster.ssh_alias, output_dir=str(tmp_path / "evaluate"), max_drop=2, startup_timeout_s=600, eager=True,
        cluster=ClusterSettings(partition="debug", account="quanteval-test", walltime="00:30:00", gpus_per_node=1,
                                output_dir=str(slurm_cluster.jobs_dir / tmp_path.name),
                                nel_next_venv=str(nelnext.venv()), vllm_venv=str(VLLM_PYTHON.parent.parent)))
    with pytest.raises(ToolError) as failed:
        evaluate_quantization(request)
    said = str(failed.value)
    (canary,) = [record for record in ledger.find(kind="canary") if record.details.get("checkpoint") == request.baseline_checkpoint]
    (job,) = canary.details["slurm_jobs"]
    assert said.startswith(f"baseline canary (SLURM job {job['job_id']} on {slurm_cluster.ssh_alias}, node localhost, "
                           f"logs {job['remote_dir']}/logs)"), said
    print(said)
    assert "model.norm.weight" in said, said  # vLLM's own words on the weights, from its log on the cluster
    assert "hf_secret_value_never_shown" not in said

    logs = runs.run_logs(runs.RunLogsInput(record_id=canary.id, lines=30))
    (server,) = [tail for tail in logs.tails if tail.job_id.startswith("model server")]
    assert server.file.endswith(f"/logs/server-model-{job['job_id']}.log") and server.lines, logs.tails
    assert logs.diagnosis is not None and logs.diagnosis.failure_class, logs
    # the candidate's canary, submitted beside it, was cancelled: nothing of the evaluation is left queued (its vLLM
    # may keep the job COMPLETING a moment)
    wait_until(lambda: not [queued for queued in slurm.squeue(slurm_cluster.ssh_alias)
                            if queued.state in slurm.ACTIVE_JOB_STATES and queued.name.startswith("nel")], 30,
               "the candidate's cancelled canary gone from squeue")
