"""NEL 0.2.6 as an Engine: configs with execution/deployment/evaluation, runs through NEL's Python API."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from ruamel.yaml.comments import CommentedMap

from quanteval import ledger
from quanteval.engines.base import (
    PARALLEL_KEYS,
    ApplyCheckpointInput,
    ApplyCheckpointOutput,
    CanarySpec,
    Composed,
    DryRunOutput,
    Engine,
    EngineName,
    KillRunOutput,
    LaunchOutput,
    Problem,
    Refreshed,
    ResumeRunOutput,
    RunLogsOutput,
    config_check,
)
from quanteval.engines.launchplan import LaunchPlan
from quanteval.engines.nel import apply, config, rules, runs
from quanteval.models import ProgressFn, ToolError


class NelEngine(Engine):
    name: ClassVar[EngineName] = "nel"
    results_by_location: ClassVar[bool] = True
    placement_native: ClassVar[bool] = True  # apply_cluster's placement view is in NEL 0.2.6's keys
    sections: ClassVar[frozenset[str]] = frozenset({"defaults", "execution", "deployment", "evaluation", "target", "export"})

    # run.sh / the sbatch script splice these unquoted into `docker run` / srun lines (executors/*/run.template.sh)
    shell_spliced: ClassVar[tuple[str, ...]] = ("deployment.*", "execution.extra_docker_args", "execution.mounts.*",
                                                "evaluation.env_vars.*", "evaluation.tasks.*.env_vars.*")

    def owns(self, doc: Any) -> bool:
        return isinstance(doc, dict) and bool(self.sections & set(doc))

    def command_presets(self, doc: Any) -> dict[str, str]:
        """NEL's packaged deployment command for the config's deployment type (configs/deployment/*.yaml)."""
        from quanteval.engines.nel import nelfacts

        try:
            preset = nelfacts.packaged_defaults(f"deployment/{config.deployment_type(doc)}")
        except ToolError:  # a deployment type NEL does not package: every command is the user's
            return {}
        return {f"deployment.{key}": str(preset[key]) for key in ("command", "base_command") if preset.get(key)}

    # -- config

    def build_problem(self, deployment: str, model_type: str, benchmarks: list[str]) -> str | None:
        return config.build_problem(deployment, model_type, benchmarks)

    def config_stem(self, execution: str, deployment: str, model_type: str, benchmarks: list[str]) -> str:
        return config.config_stem(execution, deployment, model_type, benchmarks)

    def skeleton(self, execution: str, deployment: str, model_type: str, benchmarks: list[str], export: str,
                 directory: Path) -> tuple[CommentedMap, list[str]]:
        return config.skeleton(execution, deployment, model_type, benchmarks, export)

    def apply_checkpoint(self, request: ApplyCheckpointInput, progress: ProgressFn) -> ApplyCheckpointOutput:
        return apply.apply_checkpoint(request, progress, config_check(self.owns))

    def validate(self, doc: dict[str, Any], config_path: Path, overrides: list[str], check_env: bool) -> list[Problem]:
        return rules.validate_document(doc, config_path, overrides, check_env)

    def task_keys(self, doc: CommentedMap, clear: bool) -> set[str]:
        return config.task_keys(doc, clear)

    def add_task(self, doc: CommentedMap, qualified_name: str, fragment: dict[str, Any], repeats: int | None) -> str:
        return config.add_task(doc, fragment)

    def env_var_needs(self, doc: Any) -> dict[str, list[str]]:
        return config.env_var_needs(doc)

    def config_tasks(self, doc: Any) -> list[tuple[str, Any]]:
        return config.config_tasks(doc)

    def execution_type(self, doc: Any) -> str:
        return config.execution_type(doc)

    def deployment_type(self, doc: Any) -> str:
        return config.deployment_type(doc)

    def launch_paths(self, plan: LaunchPlan) -> list[tuple[str, Path]]:
        return runs.launch_paths(plan.config_path, plan.override_list)

    # -- cluster placement (the placement view is this engine's own keys)

    def placement_defaults(self, view: Any) -> dict[str, Any]:
        """NEL 0.2.6's packaged defaults: the deployment type's parallel sizes (configs/deployment/<type>.yaml) and the
        SLURM walltime (configs/execution/slurm/default.yaml)."""
        from quanteval.engines.nel import nelfacts

        deployment = nelfacts.packaged_defaults(f"deployment/{config.deployment_type(view)}")
        defaults = {f"deployment.{key}": deployment[key] for key in PARALLEL_KEYS if key in deployment}
        walltime = nelfacts.packaged_defaults("execution/slurm/default").get("walltime")
        return defaults if walltime is None else {**defaults, "execution.walltime": walltime}

    def record_paths(self, record: ledger.Record, resuming: bool) -> list[tuple[str, Path]]:
        return runs.record_paths(record, resuming)

    # -- the run lifecycle

    def dry_run(self, plan: LaunchPlan, progress: ProgressFn) -> DryRunOutput:
        return runs.dry_run(plan.config_path, plan.override_list, progress)

    def compose(self, plan: LaunchPlan) -> Composed:
        return runs.compose(plan.config_path, plan.override_list)

    def check_launchable(self, plan: LaunchPlan) -> None:
        runs.check_launchable(plan.config_path)

    def launch(self, record: ledger.Record, plan: LaunchPlan, tasks: list[str], canary: CanarySpec | None, details: dict,
               progress: ProgressFn) -> LaunchOutput:
        return runs.launch(record, plan.config_path, plan.override_list, tasks, canary, details, progress)

    def refresh(self, record: ledger.Record) -> Refreshed:
        return runs.refresh(record)

    def logs(self, record: ledger.Record, lines: int, job: str | None, progress: ProgressFn) -> RunLogsOutput:
        return runs.logs(record, lines, job, progress)

    def kill(self, record: ledger.Record, progress: ProgressFn) -> KillRunOutput:
        return runs.kill(record, progress)

    def resume(self, record: ledger.Record, progress: ProgressFn) -> ResumeRunOutput:
        return runs.resume(record, progress)

    def results_location(self, record: ledger.Record) -> str:
        return runs.results_location(record)

    def results_dir(self, record: ledger.Record) -> Path | None:
        return None  # the result tools read NEL's invocation directory at results_location

    def poll_interval_s(self, record: ledger.Record) -> float:
        return runs.poll_interval_s(record)
