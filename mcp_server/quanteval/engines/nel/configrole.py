"""NEL 0.2.6's ConfigRole (engines/base.py): configs with execution/deployment/evaluation. It imports its members from
the modules that do the work and defines the few that are the engine's own facts."""

from __future__ import annotations

from typing import Any

from quanteval.engines.base import ApplyCheckpointInput, ApplyCheckpointOutput, config_check
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
from quanteval.models import ProgressFn, ToolError

_SECTIONS = frozenset({"defaults", "execution", "deployment", "evaluation", "target", "export"})

SECRETS_ENV = ".secrets.env"
_ENV_NAMES = ("env_vars.*", "execution.env_vars.*", "deployment.env_vars.*", "evaluation.env_vars.*",
              "evaluation.tasks.*.env_vars.*", "export.env_vars.*", "target.api_endpoint.api_key_name")
# Every value NEL 0.2.6's local run.sh (executors/local/run.template.sh, run on this machine) writes into the shell,
# unquoted or in double quotes (where `$(...)` runs too), by the template's name for it, with the config keys it comes
# from; () where NEL makes the value itself or quotes it safely (base64, a commented block, a quoted heredoc).
# tests/test_shell_splices.py reads the template and fails on a name this table lacks.
RUN_SH_SPLICES: dict[str, tuple[str, ...]] = {
    "invocation_id": (), "task.job_id": (), "task.eval_factory_command_debug_comment": (), "auto_export_config_str": (),
    "task.output_dir": ("execution.output_dir", "evaluation.tasks.*.name"),
    "task.name": ("evaluation.tasks.*.name",),
    "task.deployment.container_name": ("evaluation.tasks.*.name",),
    "task.client_container_name": ("evaluation.tasks.*.name",),
    "task.deployment.image": ("deployment.*",),
    "task.deployment.command": ("deployment.*",),  # NEL's preset interpolates deployment.* into it
    "task.deployment.port": ("deployment.*",),
    "task.deployment.health_url": ("deployment.*",),
    "task.deployment.extra_docker_args": ("execution.extra_docker_args",),
    "extra_docker_args": ("execution.extra_docker_args",),
    "mount": ("deployment.*", "execution.mounts.*"),  # checkpoint_path, cache_path and the deployment mounts
    "var_name": _ENV_NAMES,
    "task.deployment_reexport_cmd": _ENV_NAMES,
    "task.eval_reexport_cmd": _ENV_NAMES,
    "task.export_reexport_cmd": _ENV_NAMES,
    "endpoint_readiness_timeout": ("execution.endpoint_readiness_timeout",),
    "task.dataset_mount_host": ("evaluation.tasks.*.dataset_dir",),
    "task.dataset_mount_container": ("evaluation.tasks.*.dataset_mount_path",),
    "task.dataset_env_var_value": ("evaluation.tasks.*.dataset_mount_path",),
    "task.eval_image": ("evaluation.tasks.*.container",),
    # base64 but for the auxiliary deployments' names and env prefixes, which become sed expressions in `bash -c '...'`
    "task.eval_factory_command": ("auxiliary_deployments.*",),
    "dest": ("execution.auto_export.destinations.*",),
    # not the template's: the .secrets.env run.sh sources, `export NAME="value"` for each literal env value
    SECRETS_ENV: _ENV_NAMES,
}
# the keys whose values (and names) reach a shell: shell syntax there is refused (engines/commands.py)
shell_spliced = tuple(sorted({key for keys in RUN_SH_SPLICES.values() for key in keys}))
host_server_args: tuple[str, ...] = ()  # NEL 0.2.6 starts every server in a container


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

