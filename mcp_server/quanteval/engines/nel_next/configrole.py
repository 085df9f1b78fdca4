"""nel-next's ConfigRole (engines/base.py): configs with services/benchmarks/cluster/output. It imports its members
from the modules that do the work and defines the few that are the engine's own facts."""

from __future__ import annotations

from typing import Any

from quanteval.engines.base import ApplyCheckpointInput, ApplyCheckpointOutput, config_check
from quanteval.engines.base import referenced_env_vars as env_var_needs
from quanteval.engines.nel_next import config
from quanteval.engines.nel_next.config import build_problem, config_stem, deployment_type, execution_type, skeleton
from quanteval.engines.nel_next.config import validate_document as validate
from quanteval.engines.nel_next.skills import add_task, task_keys
from quanteval.models import ProgressFn

_FOREIGN_SECTIONS = frozenset({"defaults", "execution", "deployment", "evaluation", "target", "export"})

# Every place nel-next 0.3 runs a shell on this machine (shell=True, create_subprocess_shell, os.system), by its
# function in nemo_evaluator, with the config keys whose values it writes into that shell; () where it splices no
# config value. tests/test_shell_splices.py finds these sites in nel-next's installed source and fails on one this
# table lacks. A command key (setup_commands, *_cmd) runs by design: engines/commands.py names and confines those.
SHELL_SITES: dict[str, tuple[str, ...]] = {
    "orchestration/orchestrator.py:_start_model_service": (),  # services.*.setup_commands: commands
    "orchestration/orchestrator.py:_NatServiceHandle.start": ("services.*.nat_config_file", "services.*.port"),
    "sandbox/ecs_fargate.py:ImageBuilder.ecr_docker_login": ("sandboxes.*.ecr_repository", "sandboxes.*.region",
                                                            "benchmarks.*.sandbox.ecr_repository", "benchmarks.*.sandbox.region"),
    "sandbox/local.py:LocalSandbox.exec": (),  # the benchmark's and solver's commands, from their code
    "sandbox/ecs_fargate.py:_H._exec": (),  # the in-container exec server's source text: runs in the sandbox, not here
}
# the keys whose values (and names) reach a shell: these sites, and a server's argv, environment, mounts and image in
# the sbatch script nel-next writes on SLURM (and its `nat serve` line there)
# a managed vLLM/SGLang service on the local cluster is a process of this machine (nel-next's model_server)
host_server_args = ("services.*.extra_args.*",)
shell_spliced = tuple(sorted({key for keys in SHELL_SITES.values() for key in keys} | {
    "services.*.extra_args.*", "services.*.extra_env.*", "services.*.container_mounts.*", "services.*.image",
    "services.*.model", "services.*.served_model_name"}))


def owns(doc: Any) -> bool:
    """A nel-next config has benchmarks:, or services: whose every entry names its `type` (a docker-compose file's
    services: never does), and none of NEL 0.2.6's sections."""
    if not isinstance(doc, dict) or set(doc) & _FOREIGN_SECTIONS:
        return False
    services = doc.get("services")
    typed = isinstance(services, dict) and bool(services) and all(isinstance(s, dict) and "type" in s
                                                                  for s in services.values())
    return "benchmarks" in doc or typed


def apply_checkpoint(request: ApplyCheckpointInput, progress: ProgressFn) -> ApplyCheckpointOutput:
    """config.apply_checkpoint, refusing a file that is no longer a nel-next config (by this engine's owns)."""
    return config.apply_checkpoint(request, progress, config_check(owns))


def command_presets(doc: Any) -> dict[str, str]:
    return {}  # nel-next packages no command of its own: every command in its config is the user's


def config_tasks(doc: Any) -> list[tuple[str, Any]]:
    return []  # its benchmarks are no NEL 0.2.6 task list
