"""What a nel-next run produced: its outcome, its bundles, per-problem rewards, and paired comparisons.

A nel-next run directory (`nel eval run ... -o DIR`, local executor, 0.3.0) holds:
  DIR/checkpoint.json                   completed_benchmarks / failed_benchmarks (name -> {"error"})
  DIR/<benchmark>/eval-<ts>-<name>.json the bundle: benchmark.{name, samples, repeats, scores{pass@1{value,
                                        bootstrap_ci_lower, bootstrap_ci_upper}, runtime{finish_reason_counts,
                                        model_errors}, failures{failure_rate}}}, config{model, max_problems, ...}
  DIR/<benchmark>/results.jsonl         one line per problem x repeat: problem_idx, repeat, reward, expected_answer,
                                        extracted_answer, model_response
The paired statistics follow `nel compare` (nemo_evaluator.engine.comparison, 0.3.0) so the two agree on the same
runs: repeats averaged per problem, McNemar's exact one-sided binomial test on the discordant pairs when every
reward is 0/1, and its verdict rule (BLOCK: significant, effect above the threshold and more regressions than
improvements; WARN: significant; INCONCLUSIVE: too few discordant pairs for the threshold; else PASS).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from quanteval.engines.runresults import Flip, PairedTest
from quanteval.models import ToolError

ALPHA = 0.05
POWER_80_FACTOR = 2.8  # z_alpha + z_beta, one-sided alpha 0.05 at 80% power: nel compare's power analysis
DEFAULT_MAX_DROP = 0.05  # nel compare's --max-drop default
PRIMARY_METRIC = "pass@1"
MAX_FLIPS_SHOWN = 20
# nel-next's failure categories (observability/collector.py) for a request that got no answer. An unreachable or
# failing endpoint is `infra_error`, counted there and NOT in runtime.model_errors (measured: 2 of 2 requests to a
# closed port: model_errors 0, failures.infra_error 2). The other categories (empty_response, refusal, format_error)
# are answers, and a worse model gives more of them: they are the score's business, not the run's validity.
REQUEST_FAILURES = ("infra_error", "timeout", "rate_limit", "server_error", "model_error")


@dataclass
class Bundle:
    name: str
    directory: Path
    path: Path
    data: dict[str, Any]

    @property
    def benchmark(self) -> dict[str, Any]:
        return self.data.get("benchmark") or {}

    @property
    def scores(self) -> dict[str, Any]:
        return self.benchmark.get("scores") or {}

    @property
    def samples(self) -> int:
        return int(self.benchmark.get("samples") or 0)

    @property
    def repeats(self) -> int:
        return int(self.benchmark.get("repeats") or 1)

    def request_failures(self) -> dict[str, int]:
        """Requests that got no answer, by nel-next's failure category."""
        categories = (self.scores.get("failures") or {}).get("categories") or {}
        return {name: int((categories.get(name) or {}).get("count") or 0) for name in REQUEST_FAILURES
                if (categories.get(name) or {}).get("count")}

    def metric(self, name: str = PRIMARY_METRIC) -> dict[str, Any] | None:
        value = self.scores.get(name)
        return value if isinstance(value, dict) and "value" in value else None

    def metrics(self) -> dict[str, dict[str, Any]]:
        return {name: value for name, value in self.scores.items() if isinstance(value, dict) and "value" in value}


def submitted_layout(path: Path) -> bool:
    """A run directory as nel-next's SLURM submission lays it out (its nel_eval.sbatch at the top, or shard_<i>/):
    one sub-run per benchmark. Only there are sub-directories read as parts of one run; a folder that merely holds
    several local runs is not one run."""
    return (path / "nel_eval.sbatch").is_file() or any(path.glob("shard_*/"))


def is_run_dir(path: Path) -> bool:
    """A nel-next run directory: its checkpoint or run record at the top, or in its sub-runs when submitted."""
    places = (path, *path.glob("*"), *path.glob("shard_*/*")) if submitted_layout(path) else (path,)
    return any((place / name).is_file() for place in places for name in ("checkpoint.json", "nel_run.json"))


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ToolError(f"{path}: unreadable ({exc}).") from None
    if not isinstance(data, dict):
        raise ToolError(f"{path}: not a JSON object.")
    return data


def bundles(run_dir: Path) -> dict[str, Bundle]:
    """The benchmark bundles of a run directory (or of one benchmark directory), by benchmark name."""
    found: dict[str, Bundle] = {}
    candidates = sorted(run_dir.glob("eval-*.json")) + sorted(run_dir.glob("*/eval-*.json"))
    if (run_dir / "nel_eval.sbatch").is_file():  # a submitted run's sub-runs; a sharded one's are read merged, at the top
        candidates += sorted(run_dir.glob("*/*/eval-*.json"))
    for path in candidates:
        data = _load_json(path)
        name = str((data.get("benchmark") or {}).get("name") or path.parent.name)
        found[name] = Bundle(name=name, directory=path.parent, path=path, data=data)  # the newest wins (sorted by ts)
    return found


@dataclass
class Outcome:
    completed: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def _checkpoint_outcome(path: Path) -> Outcome:
    data = _load_json(path)
    failed = {str(name): str((info or {}).get("error") or "failed") for name, info in (data.get("failed_benchmarks") or {}).items()}
    return Outcome(completed=list(data.get("completed_benchmarks") or {}), failed=failed)


def run_outcome(run_dir: Path) -> Outcome:
    """What nel-next itself recorded as completed and failed: DIR/checkpoint.json, else its sub-runs'
    (DIR/<benchmark key>/checkpoint.json, as on SLURM). A sharded run (DIR/shard_<i>/) completed a benchmark only where
    every shard did; a shard that wrote no checkpoint did not finish."""
    if (run_dir / "checkpoint.json").is_file():
        return _checkpoint_outcome(run_dir / "checkpoint.json")
    shards = sorted(run_dir.glob("shard_*/"), key=lambda shard: shard.name)
    if not shards:
        outcome = Outcome()
        if not submitted_layout(run_dir):
            return outcome
        for path in sorted(run_dir.glob("*/checkpoint.json")):
            sub = _checkpoint_outcome(path)
            outcome.completed += sub.completed
            outcome.failed.update(sub.failed)
        return outcome
    outcomes = {shard.name: run_outcome(shard) for shard in shards}
    finished = {name: o for name, o in outcomes.items() if o.completed or o.failed}
    failed: dict[str, str] = {}
    for shard, outcome in finished.items():
        failed.update({name: f"{shard}: {error}" for name, error in outcome.failed.items()})
    completed_everywhere = set.intersection(*(set(o.completed) for o in finished.values())) if finished else set()
    for name in sorted({name for o in finished.values() for name in o.completed} - completed_everywhere - set(failed)):
        failed[name] = "not completed by every shard"
    unfinished = [name for name in outcomes if name not in finished]
    if unfinished:
        failed["(shards)"] = f"{', '.join(unfinished)} wrote no checkpoint.json: their SLURM jobs did not finish"
    return Outcome(completed=sorted(completed_everywhere - set(failed)), failed=failed)


# ---------------------------------------------------------------- per-problem rewards


def paired_records(bench_dir: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """results.jsonl by (problem_idx, repeat), as nel compare pairs them."""
    return _by_problem(bench_dir / "results.jsonl")


def _by_problem(path: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """A nel-next JSON-lines file by (problem_idx, repeat), the last line of a pair winning as nel-next reads it; a meta
    line and a torn last line are skipped. orjson: rows carry whole trajectories, parsed several times faster."""
    records: dict[tuple[int, int], dict[str, Any]] = {}
    for line in path.read_bytes().splitlines() if path.is_file() else []:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("_type") != "meta" and record.get("problem_idx") is not None:
            records[(int(record["problem_idx"]), int(record.get("repeat", 0)))] = record
    return records


# nel-next's scoring_details.error_category for a problem whose answer never came: the endpoint failed after its
# retries (infra_error) or the benchmark itself crashed (system). `graceful` is the solver ending without an answer
# (an empty reply, a turn budget spent): the model's doing, so unscored, not infrastructure.
INFRA_CATEGORIES = ("infra_error", "system")


def infra_errors(records: dict[tuple[int, int], dict[str, Any]]) -> set[int]:
    """Problems with a request that got no answer: nel-next scored it 0 as an error, not as a wrong answer."""
    return {problem for (problem, _), record in records.items() if error_category(record) in INFRA_CATEGORIES}


def unscored(records: dict[tuple[int, int], dict[str, Any]]) -> set[int]:
    """Problems answered (no infrastructure error) and scored 0 because the grader extracted no answer:
    extracted_answer empty, or the solver ended without one (graceful)."""
    return {problem for (problem, _), record in records.items() if not record.get("reward")
            and error_category(record) not in INFRA_CATEGORIES
            and (error_category(record) == "graceful" or record.get("extracted_answer") in (None, ""))}


def status_unknown(records: dict[tuple[int, int], dict[str, Any]]) -> str | None:
    """Why these records cannot tell an infrastructure error from a wrong answer, if they cannot (no scoring_details)."""
    if any(isinstance(record.get("scoring_details"), dict) for record in records.values()):
        return None
    return "results.jsonl records no scoring_details, so an infrastructure error cannot be told from a wrong answer"


def error_category(record: dict[str, Any]) -> str | None:
    details = record.get("scoring_details")
    return details.get("error_category") if isinstance(details, dict) else None


def per_problem_rewards(records: dict[tuple[int, int], dict[str, Any]]) -> dict[int, list[float]]:
    by_problem: dict[int, list[float]] = defaultdict(list)
    for (problem, _repeat), record in sorted(records.items()):
        by_problem[problem].append(float(record.get("reward") or 0.0))
    return dict(by_problem)


def _answer(record: dict[str, Any]) -> str | None:
    value = record.get("model_response") or record.get("extracted_answer") or record.get("response")
    if not isinstance(value, str):
        return None
    return value if len(value) <= 80 else value[:77] + "..."


# ---------------------------------------------------------------- statistics


def binomial_greater_p(successes: int, trials: int) -> float:
    """Exact one-sided P(X >= successes) for X ~ Binomial(trials, 1/2) (scipy's binomtest 'greater')."""
    if trials == 0:
        return 1.0
    tail = sum(math.comb(trials, k) for k in range(successes, trials + 1))
    return min(1.0, tail / 2**trials)


def _verdict(n_paired: int, regressions: int, improvements: int, p_value: float, max_drop: float) -> str:
    """nel compare's decision rule (engine.comparison._compute_verdict), on the same numbers."""
    discordant = regressions + improvements
    if n_paired == 0:
        return "INCONCLUSIVE"  # the runs share no (problem, repeat)
    if discordant == 0:
        return "PASS"  # both runs got exactly the same problems right
    effect = (regressions - improvements) / n_paired
    significant = p_value < ALPHA
    if significant and abs(effect) > max_drop and regressions > improvements:
        return "BLOCK"  # a regression beyond the allowed drop
    if significant:
        return "WARN"  # significant, but within the allowed drop
    # underpowered by nel compare's rule (its message quotes a count of discordant pairs, which is no number of
    # problems: workflow.paired.advice says how many problems would decide)
    return "INCONCLUSIVE" if POWER_80_FACTOR / math.sqrt(discordant) > 2 * max_drop else "PASS"


def compare_bundles(baseline: Bundle, candidate: Bundle, max_drop: float = DEFAULT_MAX_DROP) -> PairedTest:
    """Pair two runs of one benchmark problem by problem: McNemar / sign test, flips and verdict, as nel compare."""
    base_records, cand_records = paired_records(baseline.directory), paired_records(candidate.directory)
    if not base_records or not cand_records:
        side = "baseline" if not base_records else "candidate"
        raise ToolError(f"{side} run of {baseline.name} has no per-problem results (results.jsonl); a paired "
                        "comparison needs them. Re-run it with nel-next >= 0.3.")
    base, cand = per_problem_rewards(base_records), per_problem_rewards(cand_records)
    shared = sorted(set(base) & set(cand))
    base_mean = {p: sum(base[p]) / len(base[p]) for p in shared}
    cand_mean = {p: sum(cand[p]) / len(cand[p]) for p in shared}
    binary = all(v in (0.0, 1.0) for p in shared for v in (base_mean[p], cand_mean[p]))
    # Flips as nel compare counts them: a problem is right when its (mean) reward is above 0.
    regressed_ids = [p for p in shared if base_mean[p] > 0 and cand_mean[p] <= 0]
    improved_ids = [p for p in shared if cand_mean[p] > 0 and base_mean[p] <= 0]
    if binary:
        test, worse, better = "mcnemar", len(regressed_ids), len(improved_ids)
    else:  # averaged repeats: the sign test on paired deltas (nel compare's `--test sign`)
        test = "sign"
        worse = sum(1 for p in shared if base_mean[p] > cand_mean[p])
        better = sum(1 for p in shared if cand_mean[p] > base_mean[p])
    p_value = binomial_greater_p(worse, worse + better)

    def flips(ids: list[int]) -> list[Flip]:
        first = {problem: record for (problem, repeat), record in sorted(base_records.items(), reverse=True)}
        first_cand = {problem: record for (problem, repeat), record in sorted(cand_records.items(), reverse=True)}
        return [Flip(problem_idx=p, expected=first[p].get("expected_answer"), baseline_answer=_answer(first[p]),
                     candidate_answer=_answer(first_cand[p])) for p in ids[:MAX_FLIPS_SHOWN]]

    return PairedTest(test=test, p_value=p_value, n_paired=len(shared), n_regressions=len(regressed_ids),
                      n_improvements=len(improved_ids), verdict=_verdict(len(shared), worse, better, p_value, max_drop),
                      regressed=flips(regressed_ids), improved=flips(improved_ids))


# ---------------------------------------------------------------- per-sample outputs (the release rules)

INFERENCE_LOG = "inference_log.jsonl"  # nel-next's step log: one line per answered (problem_idx, repeat), after a meta line
RUNTIME_STATS = "runtime_stats.json"


def inference_records(bench_dir: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """inference_log.jsonl by (problem_idx, repeat): finish_reason, completion_tokens, reasoning_tokens, response."""
    return _by_problem(bench_dir / INFERENCE_LOG)


def runtime_stats(bench_dir: Path) -> dict[str, Any]:
    """runtime_stats.json (tokens_per_second, latency_percentiles_ms, finish_reason_counts, ...); {} when absent."""
    path = bench_dir / RUNTIME_STATS
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
