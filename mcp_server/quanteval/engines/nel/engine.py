"""NEL 0.2.6 as an Engine: configs with execution/deployment/evaluation, runs through NEL's Python API."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from quanteval import ledger
from quanteval.engines.base import (
    CanarySpec,
    Composed,
    DryRunOutput,
    Engine,
    EngineName,
    KillRunOutput,
    LaunchOutput,
    Refreshed,
    ResumeRunOutput,
    RunKind,
    RunLogsOutput,
)
from quanteval.engines.nel import runs
from quanteval.models import ProgressFn


class NelEngine(Engine):
    name: ClassVar[EngineName] = "nel"
    results_by_location: ClassVar[bool] = True
    sections: ClassVar[frozenset[str]] = frozenset({"defaults", "execution", "deployment", "evaluation", "target", "export"})

    def owns(self, doc: Any) -> bool:
        return isinstance(doc, dict) and bool(self.sections & set(doc))

    # -- config

    # -- the run lifecycle

    def dry_run(self, config_path: str, overrides: list[str], progress: ProgressFn) -> DryRunOutput:
        return runs.dry_run(config_path, overrides, progress)

    def compose(self, config_path: str, overrides: list[str]) -> Composed:
        return runs.compose(config_path, overrides)

    def check_launchable(self, config_path: str, overrides: list[str]) -> None:
        runs.check_launchable(config_path)

    def launch(self, kind: RunKind, config_path: str, overrides: list[str], tasks: list[str], canary: CanarySpec | None,
               details: dict, progress: ProgressFn) -> LaunchOutput:
        return runs.launch(kind, config_path, overrides, tasks, canary, details, progress)

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
