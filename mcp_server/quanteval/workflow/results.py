"""validate_run and extract_scores: is a finished run trustworthy, and what did it score.

The run's engine reads it (engines.results_for picks its ResultsReader: NEL 0.2.6's invocation directories in
engines/nel/results.py over runtree.py, nel-next's bundles in engines/nel_next/results.py); the answers are the
neutral types of engines/runresults.py.
"""

from __future__ import annotations

from pydantic import Field

from quanteval import engines
from quanteval.engines.runresults import ExtractScoresOutput, ResultsReader, RunBenchmarks, ValidateRunInput, ValidateRunOutput
from quanteval.models import ProgressFn, StrictModel, no_progress


class ExtractScoresInput(StrictModel):
    run: str = Field(
        description="Results directory, host:path, record_id (or a NEL 0.2.6 invocation id)."
    )


def extract_scores(request: ExtractScoresInput) -> ExtractScoresOutput:
    """Use after validate_run passes: each task's headline score, standard error and scale."""
    return engines.results_for(request.run).extract_scores(request.run)


def validate_run(request: ValidateRunInput, progress: ProgressFn = no_progress) -> ValidateRunOutput:
    """Use before extract_scores or compare_results: checks each task of a finished run (samples, errors, truncation,
    leaked reasoning, judge, served checkpoint).
    """
    return engines.results_for(request.run).validate_run(request, progress)


# Two runs read once by their engine's reader (reader, baseline, candidate): compare_results and gate_results share it.
RunPair = tuple[ResultsReader, RunBenchmarks, RunBenchmarks]


def read_pair(baseline: str, candidate: str) -> RunPair:
    reader = engines.results_for_pair(baseline, candidate)
    return reader, reader.run_benchmarks(baseline, "baseline"), reader.run_benchmarks(candidate, "candidate")
