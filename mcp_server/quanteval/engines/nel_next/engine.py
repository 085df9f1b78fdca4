"""nel-next as an Engine: configs with services/benchmarks/cluster/output, runs through `nel eval run`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from ruamel.yaml.comments import CommentedMap

from quanteval import ledger
from quanteval.engines.base import (
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
from quanteval.engines.nel_next import config, runs, skills
from quanteval.models import ProgressFn


class NelNextEngine(Engine):
    name: ClassVar[EngineName] = "nel-next"
    sections: ClassVar[frozenset[str]] = frozenset({"services", "sandboxes", "benchmarks", "cluster", "output"})
    foreign_sections: ClassVar[frozenset[str]] = frozenset({"defaults", "execution", "deployment", "evaluation", "target",
                                                            "export"})

    # a server's argv and environment go into the scripts nel-next writes (sbatch on SLURM)
    shell_spliced: ClassVar[tuple[str, ...]] = ("services.*.extra_args.*", "services.*.extra_env.*",
                                                "services.*.container_mounts.*", "services.*.image", "services.*.model",
                                                "services.*.served_model_name")

    def owns(self, doc: Any) -> bool:
        """A nel-next config has benchmarks:, or services: whose every entry names its `type` (a docker-compose file's
        services: never does), and none of NEL 0.2.6's sections."""
        if not isinstance(doc, dict) or set(doc) & self.foreign_sections:
            return False
        services = doc.get("services")
        typed = isinstance(services, dict) and bool(services) and all(isinstance(s, dict) and "type" in s
                                                                      for s in services.values())
        return "benchmarks" in doc or typed

    # -- config

    def build_problem(self, deployment: str, model_type: str, benchmarks: list[str]) -> str | None:
        return config.build_problem(deployment)

    def config_stem(self, execution: str, deployment: str, model_type: str, benchmarks: list[str]) -> str:
        return config.config_stem(execution, deployment, model_type, benchmarks)

    def skeleton(self, execution: str, deployment: str, model_type: str, benchmarks: list[str], export: str,
                 directory: Path) -> tuple[CommentedMap, list[str]]:
        return config.skeleton(execution, deployment, model_type, benchmarks, directory)

    def apply_checkpoint(self, request: ApplyCheckpointInput, progress: ProgressFn) -> ApplyCheckpointOutput:
        return config.apply_checkpoint(request, progress, config_check(self.owns))

    def validate(self, doc: dict[str, Any], config_path: Path, overrides: list[str], check_env: bool) -> list[Problem]:
        return config.validate_document(doc, config_path, overrides)

    def task_keys(self, doc: CommentedMap, clear: bool) -> set[str]:
        return skills.task_keys(doc, clear)

    def add_task(self, doc: CommentedMap, qualified_name: str, fragment: dict[str, Any], repeats: int | None) -> str:
        return skills.add_task(doc, qualified_name, repeats)

    def task_form(self, qualified_name: str, repeats: int = 1) -> tuple[dict[str, Any] | None, str]:
        return skills.task_form(qualified_name, repeats)

    def execution_type(self, doc: Any) -> str:
        return config.execution_type(doc)

    def deployment_type(self, doc: Any) -> str:
        return config.deployment_type(doc)

    def launch_paths(self, plan: LaunchPlan) -> list[tuple[str, Path]]:
        return runs.launch_paths(plan)

    def record_paths(self, record: ledger.Record, resuming: bool) -> list[tuple[str, Path]]:
        return runs.record_paths(record, resuming)

    # -- cluster placement

    writes_placement_host: ClassVar[bool] = True

    def placement_view(self, doc: Any) -> Any:
        return config.placement_view(doc)

    def placement_key(self, key: str) -> str:
        return config.PLACEMENT_KEYS.get(key, key)

    def placement_edits(self, values: dict[str, Any]) -> dict[str, Any]:
        return config.placement_edits(values)

    def placement_defaults(self, view: Any) -> dict[str, Any]:
        return {"execution.walltime": config.WALLTIME_DEFAULT}

    # -- the run lifecycle

    def read_launch(self, config_path: str, overrides: list[str]) -> dict[str, Any]:
        return runs.read_launch(config_path, overrides)

    def dry_run(self, plan: LaunchPlan, progress: ProgressFn) -> DryRunOutput:
        return runs.dry_run(plan)

    def compose(self, plan: LaunchPlan) -> Composed:
        return runs.compose(plan)

    def check_launchable(self, plan: LaunchPlan) -> None:
        runs.check_launchable(plan)

    def launch(self, record: ledger.Record, plan: LaunchPlan, tasks: list[str], canary: CanarySpec | None, details: dict,
               progress: ProgressFn) -> LaunchOutput:
        return runs.launch(record, plan, tasks, canary, details, progress)

    def refresh(self, record: ledger.Record) -> Refreshed:
        return runs.refresh(record)

    def logs(self, record: ledger.Record, lines: int, job: str | None, progress: ProgressFn) -> RunLogsOutput:
        return runs.logs(record, lines)

    def kill(self, record: ledger.Record, progress: ProgressFn) -> KillRunOutput:
        return runs.kill(record)

    def resume(self, record: ledger.Record, progress: ProgressFn) -> ResumeRunOutput:
        return runs.resume(record)

    def results_location(self, record: ledger.Record) -> str:
        return record.id  # the result tools read a local run, or fetch a SLURM run's results from the cluster

    def results_dir(self, record: ledger.Record) -> Path | None:
        return runs.results_dir(record)

    def poll_interval_s(self, record: ledger.Record) -> float:
        return runs.poll_interval_s(record)
