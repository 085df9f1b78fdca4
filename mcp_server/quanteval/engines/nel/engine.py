"""NEL 0.2.6 as an Engine (engines/base.py): configs with execution/deployment/evaluation, runs through NEL's Python
API. This module is the engine: it imports its members from the modules that do the work and defines the few that are
the engine's own facts; the members it leaves out take their defaults (base.EngineDefaults)."""

from __future__ import annotations

from typing import Any

from quanteval.engines.base import PARALLEL_KEYS, ApplyCheckpointInput, ApplyCheckpointOutput, EngineName, config_check
from quanteval.engines.nel import apply
from quanteval.engines.nel.config import (
    add_task,
    build_problem,
    config_stem,
    config_tasks,
    deployment_type,
    env_var_needs,
    execution_type,
    skeleton,
    task_keys,
)
from quanteval.engines.nel.rules import validate_document as validate
from quanteval.engines.nel.runs import (
    check_launchable,
    compose,
    dry_run,
    kill,
    launch,
    launch_paths,
    logs,
    poll_interval_s,
    record_paths,
    refresh,
    results_location,
    resume,
)
from quanteval.models import ProgressFn, ToolError

name: EngineName = "nel"
placement_native = True  # apply_cluster's placement view is in NEL 0.2.6's keys
_SECTIONS = frozenset({"defaults", "execution", "deployment", "evaluation", "target", "export"})

# run.sh / the sbatch script splice these unquoted into `docker run` / srun lines (executors/*/run.template.sh)
shell_spliced = ("deployment.*", "execution.extra_docker_args", "execution.mounts.*", "evaluation.env_vars.*",
                 "evaluation.tasks.*.env_vars.*")


def owns(doc: Any) -> bool:
    return isinstance(doc, dict) and bool(_SECTIONS & set(doc))


def command_presets(doc: Any) -> dict[str, str]:
    """NEL's packaged deployment command for the config's deployment type (configs/deployment/*.yaml)."""
    from quanteval.engines.nel import nelfacts

    try:
        preset = nelfacts.packaged_defaults(f"deployment/{deployment_type(doc)}")
    except ToolError:  # a deployment type NEL does not package: every command is the user's
        return {}
    return {f"deployment.{key}": str(preset[key]) for key in ("command", "base_command") if preset.get(key)}


def apply_checkpoint(request: ApplyCheckpointInput, progress: ProgressFn) -> ApplyCheckpointOutput:
    """apply.apply_checkpoint, refusing a file that is no longer a NEL 0.2.6 config (by this engine's owns)."""
    return apply.apply_checkpoint(request, progress, config_check(owns))


def placement_defaults(view: Any) -> dict[str, Any]:
    """NEL 0.2.6's packaged defaults: the deployment type's parallel sizes (configs/deployment/<type>.yaml) and the
    SLURM walltime (configs/execution/slurm/default.yaml)."""
    from quanteval.engines.nel import nelfacts

    deployment = nelfacts.packaged_defaults(f"deployment/{deployment_type(view)}")
    defaults = {f"deployment.{key}": deployment[key] for key in PARALLEL_KEYS if key in deployment}
    walltime = nelfacts.packaged_defaults("execution/slurm/default").get("walltime")
    return defaults if walltime is None else {**defaults, "execution.walltime": walltime}
