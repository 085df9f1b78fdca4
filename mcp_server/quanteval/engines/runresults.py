"""What every engine's results reader answers with (neutral types), and the reader interface.

extract_scores and validate_run (workflow/results.py) pick a reader by the run they are given (engines.results_for)
and return these types whatever engine made the run. compare_results and gate_results read both runs through the
same reader as RunBenchmarks: each benchmark's scores, its per-problem rewards and what must match between two runs
(facets, keyed by CHECK_ITEMS); the statistics and the verdicts are theirs, one body for every engine.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field

from quanteval import redact
from quanteval.failures import Diagnosis
from quanteval.models import ProgressFn, StrictModel

Scale = Literal["fraction", "percent", "unknown"]
Verdict = Literal["pass", "fail", "suspect", "inconclusive"]
Severity = Literal["fail", "suspect", "unknown", "warning", "info"]


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
        description="Results directory, host:path, record_id (or a NEL 0.2.6 invocation id)."
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
    severity: Severity = Field(description="fail: the run cannot be trusted; suspect: it ran, but its score says the setup "
                               "(protocol, template, stop words, answer format) is likely wrong; unknown: could not be "
                               "checked; warning; info.")
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
    verdict: Verdict = Field(description="pass only when every task passed every check that could be made; suspect: "
                             "every scored answer wrong, or a multiple-choice score at chance (check the setup first).")
    reasons: list[str] = Field(description="Why the verdict is not pass (empty when it is).")
    tasks: list[TaskValidation]



def failure_finding(diagnosis: Diagnosis) -> Finding:
    evidence = [Evidence(file=diagnosis.file or "", line=diagnosis.line_number, text=redact.shown_line(diagnosis.line or ""))] if diagnosis.line else []
    why = f"{diagnosis.line}" if diagnosis.line else "no known failure line; last lines: " + " | ".join(diagnosis.last_lines[-3:])
    return Finding(severity="fail", check="failure", message=f"Why it failed ({diagnosis.failure_class}): {redact.shown_line(why)}. "
                   f"{diagnosis.advice}", evidence=evidence)




# A score no working setup gives: every scored answer wrong, or a multiple-choice score no better than picking at random.
# A real model that weak exists (a canary of 10 problems of a weak model can score 0), so the verdict is "suspect", not
# "fail": what it says is to look at the setup before trusting or extending the run, and the canary gate asks the person
# to confirm (launch_full_run's allow_suspect_canary). Chance: at or below 1/choices, where the recipe knows the choices,
# over enough answers to tell: a canary of 10 problems of a model at 28% on four choices lands at or below 25% in about
# half its draws, so a score at chance says "guessing" only where a model CHANCE_MARGIN above chance would rarely show it.
CHANCE_MARGIN = 0.10  # what "no better than guessing" allows: a 95% interval at chance no wider than 10 points each side
LIKELY_CAUSES = (
    "the protocol (a chat model asked through completions, or a base model through chat_completions, rarely answers "
    "in the form the scorer reads)",
    "the chat template (missing, or not the model's own)",
    "stop words or max_tokens ending the answer before it is given",
    "the answer format (the scorer extracts a letter, a \\boxed{} value or the first integer the prompt never asked for)",
)


def implausible_score(score: ScoreValue | None, scored: int | None, choices: int | None, setup: str = "",
                      evidence: list[Evidence] | None = None) -> Finding | None:
    """A suspect finding when the headline score says nothing was answered right (or no better than chance with
    `choices` options), with the likely causes; None for a plausible score or one that cannot be read as accuracy.
    scored: the answers the score counts; setup: what the run asked with (e.g. its protocol), as evidence."""
    if score is None or score.scale == "unknown" or not scored:
        return None
    fraction = score.value / 100 if score.scale == "percent" else score.value
    causes = "; ".join(f"({n}) {cause}" for n, cause in enumerate(LIKELY_CAUSES, 1))
    check = f"{setup} Likely causes: {causes}. Read a few responses before trusting the score or running more."
    if fraction <= 0:
        said = f"every one of the {scored} scored answers is wrong (score 0): a setup problem, more often than the model."
    elif choices and choices > 1 and fraction <= 1 / choices and scored >= answers_to_tell_chance(choices):
        said = (f"the score {100 * fraction:.1f} sits at or below chance ({100 / choices:.1f} for {choices} choices) over "
                f"{scored} scored answers: the model may be guessing or answering in a form the scorer cannot read.")
    else:
        return None
    return Finding(severity="suspect", check="implausible_score", message=f"{said} {check.strip()}", evidence=evidence or [])


def answers_to_tell_chance(choices: int) -> int:
    """The fewest scored answers at which a score at chance is evidence of guessing: where the 95% interval of a
    guesser's score is no wider than CHANCE_MARGIN each side (72 answers for four choices, 96 for two)."""
    chance = 1 / choices
    return math.ceil(1.96 ** 2 * chance * (1 - chance) / CHANCE_MARGIN ** 2)


def run_verdict(run: str, tasks: list[TaskValidation]) -> ValidateRunOutput:
    """The run's verdict from its tasks' findings: fail on any fail, suspect on any suspect (never pass), inconclusive
    on any unknown, else pass."""
    reasons = [f"{task.task or task.task_dir}: {finding.message}" for task in tasks for finding in task.findings
               if finding.severity in ("fail", "suspect", "unknown")]
    severities = {finding.severity for task in tasks for finding in task.findings}
    verdict: Verdict = next((v for v in ("fail", "suspect") if v in severities),
                            "inconclusive" if "unknown" in severities else "pass")  # type: ignore[assignment]
    return ValidateRunOutput(run=run, verdict=verdict, reasons=reasons[:50], tasks=tasks)


# ---------------------------------------------------------------- two runs side by side (compare_results, gate_results)

# What must match between two runs of one benchmark for their scores to be comparable: the keys of every reader's facets.
CHECK_ITEMS = ("model", "serving", "task", "container", "prompts", "extra_args", "generation", "reasoning", "repeats", "samples", "judge")
# What a model family is made of: two checkpoints that differ here are different models, not two precisions of one.
MODEL_FACTS = ("architecture", "model_type", "num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "vocab_size")


GATED_METRICS = ("mean_reward", "pass@1")  # the per-problem metrics a gate pairs (nel gate's _SUPPORTED_GATED_METRICS)


def problem_values(rewards: dict[Any, list[float]], metric: str) -> dict[Any, float] | None:
    """Per-problem values of a gated metric from each problem's rewards (one per repeat): pass@1 (share of repeats
    with reward > 0) or mean_reward; None for a metric that cannot be paired."""
    if metric == "mean_reward":
        return {p: sum(r) / len(r) for p, r in rewards.items()}
    if metric == "pass@1":
        return {p: sum(1 for v in r if v > 0) / len(r) for p, r in rewards.items()}
    return None


@dataclass
class Problems:
    """One benchmark's per-problem rewards in one run, keyed so that a problem has the same key in both runs."""

    rewards: dict[Any, list[float]]  # one reward per repeat
    unit: str = "problem"  # what a key stands for, in messages (NEL 0.2.6 pairs samples by id)
    categories: dict[Any, str] = field(default_factory=dict)  # each problem's category where it has one
    # What happened to each problem besides its reward (workflow/samples.py decides what the verdict makes of it):
    infra_errors: set[Any] = field(default_factory=set)  # a request got no answer (timeout, HTTP error, crash): not the model's
    unscored: set[Any] = field(default_factory=set)  # an answer came back, but the grader extracted nothing from it
    # None: the records tell infrastructure errors from answers; else why they cannot (the check was not possible)
    status_unknown: str | None = None


@dataclass
class RunBenchmark:
    """One benchmark (a NEL task) of one run, as both runs' comparisons read it."""

    name: str
    scores: TaskScores
    problems: Problems | None  # None or no rewards: the run kept no per-problem results
    location: Any  # the engine's own handle on it: NEL's task directory, nel-next's bundle (read once)


@dataclass
class RunBenchmarks:
    label: str  # the run as the person named it, for reports
    benchmarks: dict[str, RunBenchmark]
    warnings: list[str] = field(default_factory=list)
    root: Path | None = None  # the run's directory here, where the engine reads it from one


@dataclass
class Outputs:
    """One benchmark's responses in one run, by (problem, repeat), as the engine's per-sample records say them: what
    the release rules read beside the scores (length, truncation, failed requests, repeats that are copies, speed).
    A fact the engine did not record is absent (or None), never 0."""

    samples: int  # responses asked for: problems x repeats, the denominator of every share
    completion_tokens: dict[tuple[Any, int], int] = field(default_factory=dict)  # where the engine recorded a count
    reasoning_tokens: dict[tuple[Any, int], int] = field(default_factory=dict)
    finish_reasons: dict[tuple[Any, int], str] = field(default_factory=dict)  # where recorded ("length": cut at max_tokens)
    texts: dict[tuple[Any, int], str] = field(default_factory=dict)
    failed: int | None = None  # requests that got no answer (HTTP error, timeout, crash); None: not recorded
    tokens_per_second: float | None = None  # the run's own measurement, all tokens over its wall time
    latency_ms: dict[str, float] = field(default_factory=dict)  # per request: p50, p90
    served: dict[str, Any] = field(default_factory=dict)  # what measured the speed: framework, version, device
    temperature: float | None = None  # the sampling it ran with, where recorded
    max_tokens: int | None = None  # its generation budget, where recorded


class Flip(BaseModel):
    problem_idx: int
    expected: str | None
    baseline_answer: str | None
    candidate_answer: str | None


@dataclass
class PairedTest:
    """An engine's own paired test of two runs of one benchmark (nel compare's): evidence beside the verdict."""

    test: str  # mcnemar (0/1 rewards) or sign (averaged repeats)
    p_value: float | None
    n_paired: int
    n_regressions: int  # problems right in the baseline, wrong in the candidate
    n_improvements: int
    verdict: str  # the engine's PASS / WARN / BLOCK / INCONCLUSIVE
    regressed: list[Flip]  # the first flips each way, with both answers
    improved: list[Flip]


def model_family(checkpoint: str | None, served_context: Any = None) -> dict[str, Any] | None:
    """Architecture, shapes, vocabulary and served context of a checkpoint, or None when it is not readable here.
    served_context: the context the run served with, when the engine knows it (else the checkpoint's own)."""
    from quanteval.serving import checkpoint as checkpoints

    if not checkpoint:
        return None
    report = checkpoints.inspect_checkpoint(checkpoints.InspectCheckpointInput(checkpoint=checkpoint))
    return family_facts(report, served_context)


def family_facts(report: Any, served_context: Any = None) -> dict[str, Any]:
    facts = report.architecture.model_dump()
    context = served_context if served_context is not None else report.context_length
    return {key: facts[key] for key in MODEL_FACTS} | {"reasoning_template": report.reasoning, "served_context": context}


class ResultsReader(ABC):
    """How one engine's runs are read: which directories are its runs, their scores and their validation.

    Registered beside the engine (engines/__init__.py), and kept light: quanteval gate and extract_scores read
    results without loading an engine's config and launch code."""

    name: ClassVar[str]  # its engine's name in ENGINES
    title: ClassVar[str]  # as people call the engine, in messages
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

    # Two runs side by side: what compare_results and gate_results ask of the engine that made both.

    # Where the per-problem results live, as a missing-results reason names them (nel gate's words for nel-next).
    problems_source: ClassVar[str]

    @abstractmethod
    def run_benchmarks(self, run: str, side: str) -> RunBenchmarks:
        """The run's benchmarks by name, with scores and per-problem rewards; side (baseline/candidate) for messages."""

    @abstractmethod
    def facets(self, run: RunBenchmarks, benchmark: RunBenchmark, checkpoint: str | None) -> dict[str, Any] | None:
        """What must match between two runs of this benchmark, by CHECK_ITEMS (a None value: not readable); None
        when the run kept no configuration. checkpoint: the user's, when the run's own is not readable here."""

    @abstractmethod
    def compared_scores(self, base: RunBenchmark, cand: RunBenchmark) -> list[tuple[ScoreValue, ScoreValue]]:
        """The scores compare_results puts side by side, one row each."""

    @abstractmethod
    def paired_values(self, benchmark: RunBenchmark, score: ScoreValue) -> tuple[dict[Any, float] | None, str]:
        """Per-problem values whose mean is this score, to pair; else None and why they cannot stand for it."""

    @abstractmethod
    def gate_metric(self, base: RunBenchmark, cand: RunBenchmark) -> str:
        """The metric gated when the policy names none."""

    @abstractmethod
    def gate_scores(self, base: RunBenchmark, cand: RunBenchmark, metric: str, z: float,
                    paired: bool) -> tuple[float, float, list[float] | None] | None:
        """No paired decision: both runs' own scores of metric (fractions) and, where known, each one's interval
        [base_low, base_high, cand_low, cand_high] (z: the normal quantile of the gate's confidence, for a score known
        by its stderr); paired says per-problem results existed but could not decide. None: no such score."""

    def paired_test(self, base: RunBenchmark, cand: RunBenchmark, max_drop: float | None) -> PairedTest | None:
        """The engine's own paired test, as evidence beside the verdict (max_drop None: the engine's default)."""
        return None

    def served_checkpoint(self, run: RunBenchmarks) -> str | None:
        """The checkpoint the run served, where the engine recorded it."""
        return None

    def outputs(self, run: RunBenchmarks, benchmark: RunBenchmark) -> Outputs | None:
        """The benchmark's per-sample responses (tokens, finish reasons, failures, speed); None where the engine keeps
        none: every rule that needs them is then "unverified"."""
        return None
