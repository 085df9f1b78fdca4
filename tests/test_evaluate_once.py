"""evaluate_quantization does each piece of its work once: one write of each side's config, one validation of each
canary (the full run's gate takes the verdict the evaluation already read), one read of each full run's bundles
shared by compare, gate and the report. Counted by wrapping the real functions (the work itself still happens) on
one local evaluation of the embedded pair, served by the inference stand-in (tests/standins, answering the sums);
the answer stays the one the step-by-step tools give on the same runs."""

from __future__ import annotations

import builtins
import os
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from tiers import BENCH, REPO, requires

from quanteval import ledger
from quanteval.engines.nel_next import nextresults
from quanteval.engines.nel_next import results as next_results
from quanteval.workflow.compare import CompareResultsInput, compare_results
from quanteval.workflow.evaluate import EvaluateQuantizationInput, evaluate_quantization
from quanteval.workflow.gate import GateResultsInput, gate_results

STANDIN = REPO / "tests" / "standins" / "fake_inference_server.py"
CHECKPOINTS = REPO / "examples" / "checkpoints"
CONFIG_NAME = "config.yaml"


class Work:
    """What one call did, by where: config files written (by folder), runs validated and runs' bundles read (by run
    folder), results.jsonl files parsed (by run folder)."""

    def __init__(self) -> None:
        self.config_writes: Counter[str] = Counter()
        self.validations: Counter[str] = Counter()
        self.bundle_reads: Counter[str] = Counter()
        self.results_parses: Counter[str] = Counter()


def _counting(monkeypatch, work: Work) -> None:
    real_open, real_replace = builtins.open, os.replace
    validate, read, parse = next_results._validate_next_run, next_results.NelNextResults.run_benchmarks, nextresults.paired_records

    def counted_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, Path)) and Path(file).name == CONFIG_NAME and set(mode) & set("wxa"):
            work.config_writes[str(Path(file).resolve().parent)] += 1
        return real_open(file, mode, *args, **kwargs)

    def counted_replace(source: Any, target: Any, *args: Any, **kwargs: Any) -> None:  # paths.write_file's rename
        if Path(target).name == CONFIG_NAME:
            work.config_writes[str(Path(target).resolve().parent)] += 1
        real_replace(source, target, *args, **kwargs)

    def counted_validate(request: Any, run_dir: Path) -> Any:
        work.validations[str(run_dir.resolve())] += 1
        return validate(request, run_dir)

    def counted_read(self: Any, run: str, side: str) -> Any:
        work.bundle_reads[str(next_results.results_dir(run, side).resolve())] += 1
        return read(self, run, side)

    def counted_parse(bench_dir: Path) -> Any:
        work.results_parses[str(bench_dir.resolve().parent)] += 1
        return parse(bench_dir)

    monkeypatch.setattr(builtins, "open", counted_open)
    monkeypatch.setattr(os, "replace", counted_replace)
    monkeypatch.setattr(next_results, "_validate_next_run", counted_validate)
    monkeypatch.setattr(next_results.NelNextResults, "run_benchmarks", counted_read)
    monkeypatch.setattr(nextresults, "paired_records", counted_parse)


def _run_dir(record_id: str | None) -> str:
    assert record_id
    return str(Path(ledger.get(record_id).details["run_dir"]).resolve())


@requires("nel-next", "slow")  # two servers, two canaries and two full runs of tiny_add: 40-90 s
def test_an_evaluation_writes_each_config_once_validates_each_canary_once_and_reads_each_run_once(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTEVAL_VLLM_LAUNCHER", shlex.join([sys.executable, str(STANDIN), "--fake-load-s", "0.2",
                                                              "--fake-answers", "sum"]))
    work = Work()
    _counting(monkeypatch, work)
    answer = evaluate_quantization(EvaluateQuantizationInput(
        baseline_checkpoint=str(CHECKPOINTS / "tiny-add-bf16"), candidate_checkpoint=str(CHECKPOINTS / "tiny-add-w8a8"),
        benchmarks=[str(BENCH)], output_dir=str(tmp_path / "out"), max_drop=5))
    sides = (answer.baseline, answer.candidate)
    configs = [str(Path(side.config_path or "").resolve().parent) for side in sides]
    canaries = [_run_dir(side.canary_record_id) for side in sides]
    full_runs = [_run_dir(side.full_run_record_id) for side in sides]
    counted = {"config writes per side": [work.config_writes[c] for c in configs],
               "canary validations per side": [work.validations[c] for c in canaries],
               "full-run validations per side": [work.validations[f] for f in full_runs],
               "bundle reads per full run": [work.bundle_reads[f] for f in full_runs],
               "results.jsonl parses per full run": [work.results_parses[f] for f in full_runs]}
    print(f"\nwork done by one evaluate_quantization: {counted}")
    assert answer.verdict == "acceptable" and answer.gate is not None and answer.gate.verdict == "GO", answer.reasons
    assert counted["config writes per side"] == [1, 1]
    assert counted["canary validations per side"] == [1, 1]
    assert counted["full-run validations per side"] == [1, 1]
    assert counted["bundle reads per full run"] == [1, 1]
    # each canary's verdict is carried to its full run's gate, in the full run's record as launch_full_run writes it
    for side in sides:
        gate = ledger.get(side.full_run_record_id or "").details["gate"]
        assert gate.startswith(f"canary {side.canary_record_id} ") and "passed" in gate, gate

    # the same answer as the step-by-step tools give on the same two runs
    runs = {"baseline": answer.baseline.full_run_record_id or "", "candidate": answer.candidate.full_run_record_id or ""}
    alone = gate_results(GateResultsInput(**runs, max_drop=5, output_dir=str(tmp_path / "gate")))
    assert answer.gate.model_dump(exclude={"policy", "report_path"}) == alone.model_dump(exclude={"policy", "report_path"})
    compared = compare_results(CompareResultsInput(**runs, max_drop=5, output_dir=str(tmp_path / "compare"),
                                                   baseline_checkpoint=answer.baseline.checkpoint,
                                                   candidate_checkpoint=answer.candidate.checkpoint))
    assert (answer.comparisons, answer.table_markdown, answer.outputs, answer.weights, answer.comparability) == (
        compared.comparisons, compared.table_markdown, compared.outputs, compared.weights, compared.comparability)
