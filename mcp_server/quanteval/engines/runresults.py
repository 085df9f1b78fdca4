"""What every engine's results reader answers with (neutral types), and the reader interface.

extract_scores and validate_run (workflow/results.py) pick a reader by the run they are given (engines.results_for)
and return these types whatever engine made the run; compare_results and gate_results read the same TaskScores.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, Field

from quanteval import redact
from quanteval.engines.base import EngineName
from quanteval.failures import Diagnosis
from quanteval.models import ProgressFn, StrictModel

Scale = Literal["fraction", "percent", "unknown"]
Verdict = Literal["pass", "fail", "inconclusive"]
Severity = Literal["fail", "unknown", "warning", "info"]


class ScoreValue(BaseModel):
    task: str = Field(description="Task name as results.yml lists it under results.tasks / results.groups.")
    metric: str
    score: str
    value: float
    stderr: float | None = Field(None, description="Standard error on the same scale as value; null when NEL did not record one.")
    count: int | None = Field(None, description="Values the score was computed from (stats.count).")
    scale: Scale = Field(description="fraction (0-1) or percent (0-100), as stored; never converted.")
    scale_from: Literal["recipe", "inferred"] = Field(description="recipe: the task recipe says so; inferred: from the value.")
    path: str = Field(description="Where in results.yml the value sits.")



class TaskScores(BaseModel):
    task_dir: str
    task: str | None = Field(None, description="The NEL task (run_config config.type), when known.")
    recipe: str | None = Field(None, description="Recipe whose metric/score named the headline, if any.")
    headline: ScoreValue | None = Field(None, description="The recipe's score, or the only score when there is one.")
    scores: list[ScoreValue] = Field(default_factory=list, description="Every score found (first 50).")
    problem: str | None = Field(None, description="Why no score could be read, when none could.")



class ExtractScoresOutput(BaseModel):
    run: str
    tasks: list[TaskScores]



def infer_scale(value: float) -> Scale:
    if 0.0 <= value <= 1.0:
        return "fraction"
    if 1.0 < value <= 100.0:
        return "percent"
    return "unknown"



class ValidateRunInput(StrictModel):
    run: str = Field(
        description="Results directory, host:path, record_id or NEL invocation id."
    )
    expected_checkpoint: str | None = Field(
        None, description="Checkpoint the server must have loaded."
    )
    max_error_share: float = Field(
        0.01, ge=0, le=1, description="Largest acceptable share of non-2xx responses."
    )
    max_truncated_share: float = Field(
        0.02, ge=0, le=1, description="Largest acceptable share of length-truncated responses."
    )



class Evidence(BaseModel):
    file: str
    line: int | None = None
    text: str = Field(description="The line or value that shows it (at most 300 characters).")



class Finding(BaseModel):
    severity: Severity = Field(description="fail: the run cannot be trusted; unknown: could not be checked; warning; info.")
    check: str
    message: str
    evidence: list[Evidence] = Field(default_factory=list)



class TaskValidation(BaseModel):
    task_dir: str
    task: str | None = None
    finished: bool | None = Field(None, description="results.yml written and the task exited 0; null when unknown.")
    resumed_after_timeout: bool = False
    expected_samples: int | None = Field(None, description="limit_samples or dataset size, times repeats.")
    expected_samples_from: str | None = Field(
        None, description="Where the size came from: limit_samples, the task's recipe, or NEL's dataset sizes.")
    evaluated_samples: int | None = Field(None, description="stats.count of the scores.")
    responses: int | None = Field(None, description="HTTP responses seen by the response-stats interceptor.")
    error_share: float | None = None
    truncated_share: float | None = Field(None, description="Share of successful responses with finish_reason=length.")
    leaked_reasoning: int | None = Field(None, description="Final answers that still contain <think> or </think>.")
    loaded_checkpoint: str | None = Field(None, description=(
        "The model path the server says it loaded: its log (NEL, inside its container) or its /v1/models root (nel-next)."))
    served_checkpoint: str | None = Field(None, description=(
        "That checkpoint on the host: mapped back through NEL's mounts, or the directory nel-next's run served."))
    diagnosis: Diagnosis | None = Field(None, description="For a task that failed: the failure class, its log line and the usual fix.")
    findings: list[Finding] = Field(default_factory=list)



class ValidateRunOutput(BaseModel):
    run: str
    verdict: Verdict = Field(description="pass only when every task passed every check that could be made.")
    reasons: list[str] = Field(description="Why the verdict is not pass (empty when it is).")
    tasks: list[TaskValidation]



def failure_finding(diagnosis: Diagnosis) -> Finding:
    evidence = [Evidence(file=diagnosis.file or "", line=diagnosis.line_number, text=redact.shown_line(diagnosis.line or ""))] if diagnosis.line else []
    why = f"{diagnosis.line}" if diagnosis.line else "no known failure line; last lines: " + " | ".join(diagnosis.last_lines[-3:])
    return Finding(severity="fail", check="failure", message=f"Why it failed ({diagnosis.failure_class}): {redact.shown_line(why)}. "
                   f"{diagnosis.advice}", evidence=evidence)




def run_verdict(run: str, tasks: list[TaskValidation]) -> ValidateRunOutput:
    """The run's verdict from its tasks' findings: fail on any fail, inconclusive on any unknown, else pass."""
    reasons = [f"{task.task or task.task_dir}: {finding.message}" for task in tasks for finding in task.findings
               if finding.severity in ("fail", "unknown")]
    severities = {finding.severity for task in tasks for finding in task.findings}
    verdict: Verdict = "fail" if "fail" in severities else "inconclusive" if "unknown" in severities else "pass"
    return ValidateRunOutput(run=run, verdict=verdict, reasons=reasons[:50], tasks=tasks)


class ResultsReader(ABC):
    """How one engine's runs are read: which directories are its runs, their scores and their validation.

    Registered beside the engine (engines/__init__.py), and kept light: quanteval gate and extract_scores read
    results without loading an engine's config and launch code."""

    name: ClassVar[EngineName]
    # Reads runs named by what only it knows (host:path on a cluster, its own invocation ids): the fallback reader.
    reads_by_location: ClassVar[bool] = False

    @abstractmethod
    def is_run_dir(self, path: Path) -> bool:
        """Is this local directory a run (or part of one) in this engine's layout?"""

    @abstractmethod
    def extract_scores(self, run: str) -> ExtractScoresOutput:
        """Each task's scores, its headline score first."""

    @abstractmethod
    def validate_run(self, request: ValidateRunInput, progress: ProgressFn) -> ValidateRunOutput:
        """Every check the engine's artifacts allow, per task, and the run's verdict."""
