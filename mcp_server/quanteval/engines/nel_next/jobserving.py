"""nel-next serving a checkpoint inside its own SLURM job (evaluate_quantization on a cluster).

nel-next's managed `vllm` service on `cluster.type: slurm` starts in the batch script, on the job's node, before
`nel eval run`; nel-next waits for its /health (`startup_timeout`) and evaluates against it on localhost. The job then
serves on (nel_cli.py's hold) until quanteval names the full run to evaluate against the same server, once the canary
passed (nelnext.continue_in_job), or says there is none. Its own
command there is a bare `vllm serve` (0.3.0's slurm_gen), so quanteval gives the whole command as the service's
`pre_cmd` (nel-next's knob for a service whose command the user owns): the cluster's vLLM, with plan_deployment's flags.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from quanteval.engines.nel_next import nel_cli
from quanteval.engines.nel_next.nelnext import SKILLS_BENCHMARK_MAP

# How long a canary's job serves on for quanteval's word once its benchmarks are done: quanteval polls every 3 s and
# validates in about one; past this (the evaluation died) the job ends, and a later full run gets a job of its own.
NEXT_RUN_WAIT_S = 300


def serve_in_job(values: dict[str, Any], model_path: str, served_model_name: str, port: int, command: list[str],
                 startup_timeout_s: float, placement: dict[str, Any]) -> dict[str, Any]:
    """endpoint_values' keys for a config built with a managed vllm service on SLURM (build_config execution slurm,
    deployment vllm): the service's own keys instead of an endpoint's url, and the job's placement (login host,
    account, walltime, partition, GRES, the PATH its `nel` comes from)."""
    kept = {key: value for key, value in values.items() if key not in ("services.model.url", "services.model.model")}
    kept.update({"services.model.model": model_path, "services.model.served_model_name": served_model_name,
                 "services.model.port": port, "services.model.startup_timeout": startup_timeout_s,
                 "services.model.pre_cmd": f"exec {shlex.join(command)}",
                 "cluster.hostname": placement["hostname"], "cluster.account": placement.get("account"),
                 "cluster.walltime": placement["walltime"],
                 "cluster.node_pools.default.partition": placement["partition"],
                 # a failed canary is an answer, not something to retry; and auto-resume's restart job, waiting
                 # behind each job for it to fail, would stay in the queue for good once it succeeded
                 # (DependencyNeverSatisfied): a job that fails or hits its walltime is reported instead
                 "cluster.max_retries": 0, "cluster.auto_resume": False})
    if placement.get("gres"):
        kept["cluster.node_pools.default.gres"] = placement["gres"]
    # sbatch takes the values as written: the login PATH with nel-next's bin first, and the NeMo-Skills benchmark map
    # this process runs with (its skills:// benchmarks are unknown on the node without it; the launch check asks the
    # cluster for the map's file)
    exports = [f"PATH={placement['path']}"] if placement.get("path") else []
    exports += [f"{SKILLS_BENCHMARK_MAP}={mapping}"] if (mapping := os.environ.get(SKILLS_BENCHMARK_MAP)) else []
    # the canary's job serves on for its full run (nel_cli's hold): one server start per side, not one per run
    exports += [f"{nel_cli.WAIT_VARIABLE}={NEXT_RUN_WAIT_S}"]
    kept["cluster.sbatch_extra_flags.export"] = ",".join(["ALL", *exports])
    return kept
