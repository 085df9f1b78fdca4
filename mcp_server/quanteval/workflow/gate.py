"""Release gates: a multi-benchmark GO / NO-GO / INCONCLUSIVE verdict on two runs, by `nel gate`'s rules.

The policy is NeMo Evaluator's own `nel gate --policy` YAML (nemo_evaluator.config.gate_policy, 0.3.0), read as it is:

    version: 1
    defaults: {tier: supporting, max_drop: 0.015, max_relative_drop: null, relative_guard_below: null,
               metric: null, direction: higher_is_better}
    benchmarks:
      gsm8k: {tier: critical, metric: pass@1, max_drop: 0.02, max_relative_drop: 0.05, relative_guard_below: 0.5}

The semantics follow nemo_evaluator.engine.gate (0.3.0) so that `quanteval gate` and `nel gate` agree on the same runs:

- Bundles are found as nel gate finds them (eval-*.json in the folder, or exactly one in each sub-folder) and
  matched by the bundle's `benchmark.name`, not the folder's name.
- Required benchmarks are those listed under `benchmarks:` whose tier is not advisory; each must name a metric
  nel gate can pair (pass@1 or mean_reward). One absent from either run is MISSING.
- Per benchmark, per-problem values from results.jsonl (pass@1: share of repeats with reward > 0; mean_reward: mean
  reward), paired by problem; fewer than 10 paired problems is INSUFFICIENT_EVIDENCE. Damage is the drop in the
  policy's direction. The relative guardrail (max_relative_drop, applied only while the baseline score is below
  relative_guard_below when that is set) breaches on the point estimate; the absolute max_drop on the 95% CI of the
  paired deltas (Student t, or clustered SE when every problem has a category): CI above max_drop is BREACH,
  CI within is PASS, CI straddling is INSUFFICIENT_EVIDENCE. Without results.jsonl the bundles' scores decide,
  on the point estimate for advisory benchmarks only.
- Aggregate: a critical/supporting BREACH or MISSING is NO-GO; else a critical/supporting INSUFFICIENT_EVIDENCE
  is INCONCLUSIVE; else GO. Advisory benchmarks never change the verdict.

`nel compare`'s paired test (nextresults.compare_bundles: McNemar/sign test and its verdict) is attached per benchmark as
supporting evidence; as in nel gate, it does not drive the decision.

NEL 0.2.6 runs, which `nel gate` cannot read, get the same rules (gate_nel_task): benchmarks are their task names,
per-problem values come from nemo-evaluator's per-sample outputs paired by sample id (no categories: Student t).
Without per-sample outputs the headline scores decide, their CI the unpaired sum of each run's 95% CI from NEL's stderr.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from quanteval import engines, ledger
from quanteval.engines.nel.runtree import locate_run, per_sample_scores, tasks_by_name
from quanteval.engines.nel_next import nextresults
from quanteval.engines.nel_next.results import next_run_dir
from quanteval.engines.runresults import ScoreValue, TaskScores
from quanteval.models import StrictModel, ToolError
from quanteval.workflow import paired
from quanteval.workflow.paired import MIN_PAIRED_ITEMS, problem_values

GATED_METRICS = ("mean_reward", "pass@1")  # nel gate's _SUPPORTED_GATED_METRICS
REPORT_VERSION = 1
REPORT_NAME = "gate-report.json"

Tier = Literal["critical", "supporting", "advisory"]
Direction = Literal["higher_is_better", "lower_is_better"]
Status = Literal["PASS", "BREACH", "INSUFFICIENT_EVIDENCE", "MISSING"]
Verdict = Literal["GO", "NO-GO", "INCONCLUSIVE"]


# ---------------------------------------------------------------- the policy (nel gate's schema, read as it is)


def _non_negative(name: str, value: float | None) -> float | None:
    if value is not None and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


class _Thresholds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("max_drop", "max_relative_drop", check_fields=False)
    @classmethod
    def _drops(cls, value: float | None, info: Any) -> float | None:
        return _non_negative(info.field_name, value)

    @field_validator("relative_guard_below", check_fields=False)
    @classmethod
    def _guard(cls, value: float | None) -> float | None:
        if value is not None and not 0 <= value <= 1:
            raise ValueError(f"relative_guard_below must be in [0, 1], got {value}")
        return value


class PolicyDefaults(_Thresholds):
    tier: Tier = "supporting"
    max_drop: float = 0.015
    max_relative_drop: float | None = None
    relative_guard_below: float | None = None
    metric: str | None = None
    direction: Direction = "higher_is_better"


class PolicyEntry(_Thresholds):
    tier: Tier | None = None
    max_drop: float | None = None
    max_relative_drop: float | None = None
    relative_guard_below: float | None = None
    metric: str | None = None
    direction: Direction | None = None


class ResolvedPolicy(BaseModel):
    tier: Tier
    max_drop: float
    max_relative_drop: float | None
    relative_guard_below: float | None
    metric: str | None
    direction: Direction
    confidence: float = paired.DEFAULT_CONFIDENCE  # not in nel gate's YAML: nel gate always judges at 95%


class GatePolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = 1
    defaults: PolicyDefaults = Field(default_factory=PolicyDefaults)
    benchmarks: dict[str, PolicyEntry] = Field(default_factory=dict)

    @field_validator("version")
    @classmethod
    def _version(cls, value: int) -> int:
        if value != 1:
            raise ValueError(f"Unsupported gate policy version: {value}")
        return value

    def resolve(self, benchmark: str, confidence: float = paired.DEFAULT_CONFIDENCE) -> ResolvedPolicy:
        fields = self.defaults.model_dump() | {"confidence": confidence}
        entry = self.benchmarks.get(benchmark)
        if entry is not None:
            fields.update({key: value for key, value in entry.model_dump().items() if value is not None})
        return ResolvedPolicy(**fields)

    def required_benchmarks(self) -> set[str]:
        """Listed benchmarks that are not advisory: they must be in both runs."""
        return {name for name in self.benchmarks if self.resolve(name).tier != "advisory"}

    def drops_in_points(self) -> list[str]:
        """max_drop values above 1: nel gate reads them as fractions of the 0-1 score, so 2 would allow 200 points."""
        entries = {"defaults": self.defaults, **{f"benchmarks.{name}": entry for name, entry in self.benchmarks.items()}}
        return [f"{where}.max_drop: {entry.max_drop:g} → did you mean {entry.max_drop:g} points (max_drop: "
                f"{entry.max_drop / 100:g})? nel gate's max_drop is a fraction of the 0-1 score"
                for where, entry in entries.items() if entry.max_drop is not None and entry.max_drop > 1]

    def problems(self) -> list[str]:
        """What keeps the required benchmarks from being gated deterministically (nel gate's validate_for_gate)."""
        found = []
        for name in sorted(self.required_benchmarks()):
            metric = self.resolve(name).metric
            if not metric:
                found.append(f"{name}: required benchmark must resolve to an explicit metric")
            elif metric not in GATED_METRICS:
                found.append(f"{name}: unsupported metric {metric!r}; supported metrics: {', '.join(sorted(GATED_METRICS))}")
        return found


def load_policy(path: Path) -> GatePolicy:
    """The policy file as nel gate reads it, or a ToolError naming the file and each problem."""
    import yaml

    if not path.is_file():
        raise ToolError(f"policy {path}: no such file. Give the path of a `nel gate --policy` YAML file.")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ToolError(f"policy {path}: not readable YAML ({str(exc).splitlines()[0]}).") from None
    if not isinstance(raw, dict):
        raise ToolError(f"policy {path}: a gate policy must be a YAML mapping (version, defaults, benchmarks), "
                        f"got {type(raw).__name__}.")
    try:
        policy = GatePolicy.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}" for err in exc.errors())
        raise ToolError(f"policy {path}: not a valid nel gate policy: {problems}. Keys are version (1), defaults and "
                        "benchmarks.<name>.{tier, max_drop, max_relative_drop, relative_guard_below, metric, direction}.") from None
    problems = policy.problems() + policy.drops_in_points()
    if problems:
        raise ToolError(f"policy {path}: invalid gate policy: {'; '.join(problems)}. Give each required (critical or "
                        f"supporting) benchmark `metric: pass@1` or `metric: mean_reward`, and max_drop as a fraction "
                        f"(0.02 = two points).")
    return policy


# ---------------------------------------------------------------- bundles, as nel gate finds and matches them


def _bundle_name(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    benchmark = data.get("benchmark") if isinstance(data, dict) else None
    name = benchmark.get("name") if isinstance(benchmark, dict) else None
    return str(name) if name else None


def results_dir(value: str, side: str) -> Path:
    """A run directory, or the folder of one eval-*.json bundle (as nel gate accepts either), or a nel-next run's
    record id (a SLURM run's results copied from the cluster, shards merged)."""
    path = Path(value).expanduser()
    if path.is_file() and path.name.startswith("eval-") and path.suffix == ".json":
        return path.parent
    if not path.is_dir():
        if (recorded := next_run_dir(value)) is not None:
            return recorded
        raise ToolError(f"{side} {value}: not a directory. Give the folder `nel eval run -o DIR` wrote (one sub-folder "
                        "per benchmark), one eval-*.json bundle, or a nel-next run's record id; or, for NEL 0.2.6, "
                        "the run's directory, host:path, record id or invocation id.")
    return path


def discover(directory: Path, side: str) -> tuple[dict[str, Path], list[str]]:
    """eval-*.json bundles by benchmark name: in the folder itself, or exactly one per sub-folder."""
    found: dict[str, Path] = {}
    warnings: list[str] = []

    def register(path: Path) -> None:
        name = _bundle_name(path)
        if name is None:
            warnings.append(f"{side}: {path} is not a readable eval bundle (no benchmark.name); skipped")
            return
        if name in found:
            raise ToolError(f"{side} {directory}: benchmark {name!r} appears twice ({found[name]} and {path}); keep one.")
        found[name] = path

    for path in sorted(directory.glob("eval-*.json")):
        register(path)
    for sub in sorted(p for p in directory.iterdir() if p.is_dir()):
        candidates = sorted(sub.glob("eval-*.json"))
        if len(candidates) == 1:
            register(candidates[0])
        elif len(candidates) > 1:
            warnings.append(f"{side}: {sub} holds {len(candidates)} eval bundles; skipped (nel gate skips it too)")
    if not found:
        raise ToolError(f"{side} {directory}: no benchmark results (no eval-*.json bundle in it or in its sub-folders). "
                        "Give the folder `nel eval run -o DIR` wrote, after the run finished.")
    return found, warnings


# ---------------------------------------------------------------- the tool's models


class GateResultsInput(StrictModel):
    baseline: str = Field(description="Reference run: nel-next run folder (`nel eval run -o DIR`), eval-*.json bundle or record id; NEL 0.2.6 "
                                      "directory, host:path, record id or invocation id.")
    candidate: str = Field(description="Run to judge (e.g. quantized), named like baseline.")
    policy: str = Field(description="Policy YAML (`nel gate --policy` format): version: 1, defaults, benchmarks.<name>.{tier: "
                                    "critical|supporting|advisory, metric: pass@1|mean_reward, max_drop (a fraction: 0.02 = two points), "
                                    "max_relative_drop, relative_guard_below, direction}.")
    output_dir: str | None = Field(None, description=f"Write the report there as {REPORT_NAME} (nel gate's "
                                   "--output JSON). Default: write nothing.")


class CompareEvidence(BaseModel):
    """`nel compare`'s paired test on the same benchmark: evidence only, it does not drive the gate."""

    test: str = Field(description="mcnemar (0/1 rewards) or sign (averaged repeats).")
    p_value: float | None
    n_regressions: int
    n_improvements: int
    verdict: str = Field(description="nel compare's PASS / WARN / BLOCK / INCONCLUSIVE at this benchmark's max_drop.")


class BenchmarkGate(BaseModel):
    benchmark: str
    tier: Tier
    status: Status = Field("PASS", description="PASS; BREACH (a threshold crossed); INSUFFICIENT_EVIDENCE (too few paired "
                           "problems, or the CI straddles max_drop); MISSING (required, absent from a run).")
    metric: str = ""
    baseline_score: float | None = None
    candidate_score: float | None = None
    delta: float | None = Field(None, description="candidate - baseline, mean of the paired per-problem deltas.")
    relative_drop_pct: float | None = Field(None, description="100 * delta / baseline_score (negative: a drop).")
    delta_ci_lower: float | None = None
    delta_ci_upper: float | None = None
    n_paired: int = 0
    max_drop_threshold: float = 0.0
    max_relative_drop_threshold: float | None = None
    direction: Direction = "higher_is_better"
    absolute_breached: bool = False
    relative_breached: bool = False
    reasons: list[str] = Field(default_factory=list)
    advice: str | None = Field(None, description="When the evidence is insufficient: how many paired problems would decide "
                               "max_drop at the discordance observed.")
    compare: CompareEvidence | None = None


class GateResultsOutput(BaseModel):
    verdict: Verdict = Field(description="GO: every critical/supporting benchmark passed; NO-GO: one breached or is "
                             "missing; INCONCLUSIVE: one lacks the evidence to decide. Advisory ones never decide.")
    verdict_reasons: list[str]
    benchmarks: list[BenchmarkGate]
    missing: list[str] = Field(description="Required benchmarks absent from baseline or candidate.")
    warnings: list[str]
    policy: str
    baseline: str
    candidate: str
    report_path: str | None = None


# ---------------------------------------------------------------- the gate


def _damage_interval(result: BenchmarkGate, policy: ResolvedPolicy) -> tuple[float | None, float | None]:
    low, high = result.delta_ci_lower, result.delta_ci_upper
    if low is None or high is None:
        return None, None
    if policy.direction == "higher_is_better":
        return round(-high, 6), round(-low, 6)
    return low, high


def apply_thresholds(result: BenchmarkGate, policy: ResolvedPolicy, allow_point_estimate: bool) -> None:
    """The relative guardrail on the point estimate, then the absolute max_drop on the CI of the damage."""
    if result.delta is None:
        if not result.reasons:
            result.reasons.append("No metric delta available for gate decision")
        return
    damage = -result.delta if policy.direction == "higher_is_better" else result.delta
    low, high = _damage_interval(result, policy)
    base = result.baseline_score
    guarded = policy.relative_guard_below is None or (base is not None and float(base) < policy.relative_guard_below)
    if policy.max_relative_drop is not None and base not in (None, 0) and damage > 0 and guarded:
        relative = damage / abs(float(base))
        if relative > policy.max_relative_drop:
            result.relative_breached, result.status = True, "BREACH"
            result.reasons.append(f"Relative drop {relative * 100:.1f}% exceeds threshold "
                                  f"{policy.max_relative_drop * 100:.1f}%")
            return
    if low is not None and high is not None:
        span = f"95% CI on damage [{low:.4f}, {high:.4f}]"
        if low > policy.max_drop:
            result.absolute_breached, result.status = True, "BREACH"
            result.reasons.append(f"{span} exceeds threshold {policy.max_drop:.4f}")
        elif high <= policy.max_drop:
            result.status = "PASS"
            result.reasons.append(f"{span} is within threshold {policy.max_drop:.4f}")
        else:
            result.status = "INSUFFICIENT_EVIDENCE"
            result.reasons.append(f"{span} straddles threshold {policy.max_drop:.4f}")
        return
    if not allow_point_estimate:
        result.status = "INSUFFICIENT_EVIDENCE"
        result.reasons.append("No confidence interval available for required benchmark")
        return
    if damage > policy.max_drop:
        result.absolute_breached, result.status = True, "BREACH"
        result.reasons.append(f"Point estimate damage {damage:.4f} exceeds threshold {policy.max_drop:.4f}")
        return
    result.status = "PASS"
    result.reasons.append(f"Point estimate damage {damage:.4f} is within threshold {policy.max_drop:.4f}")


def _scores(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    scores = (data.get("benchmark") or {}).get("scores") if isinstance(data, dict) else None
    return scores if isinstance(scores, dict) else {}


def _float(value: Any) -> float | None:
    try:
        return None if value is None or isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def _auto_metric(base_path: Path, cand_path: Path) -> str:
    """nel gate's choice when the policy names no metric: mean_reward, pass@1, a scorer: metric, by what both bundles score."""
    base, cand = _scores(base_path), _scores(cand_path)
    shared = [m for m in sorted(set(base) | set(cand))
              if isinstance(base.get(m), dict) and isinstance(cand.get(m), dict)
              and _float(base[m].get("value")) is not None and _float(cand[m].get("value")) is not None]
    for preferred in GATED_METRICS:
        if preferred in shared:
            return preferred
    return next((m for m in shared if m.startswith("scorer:")), "mean_reward")


def _from_bundle_scores(result: BenchmarkGate, base_path: Path, cand_path: Path, policy: ResolvedPolicy) -> None:
    """No paired evidence: the bundles' own scores (their CI if given as ci_lower/ci_upper), point estimate for advisory."""
    result.metric = policy.metric or _auto_metric(base_path, cand_path)
    base, cand = _scores(base_path).get(result.metric), _scores(cand_path).get(result.metric)
    if not isinstance(base, dict) or not isinstance(cand, dict) or not base or not cand:
        return
    base_value, cand_value = _float(base.get("value")), _float(cand.get("value"))
    if base_value is None or cand_value is None:
        return
    bounds = [_float(base.get("ci_lower")), _float(base.get("ci_upper")), _float(cand.get("ci_lower")), _float(cand.get("ci_upper"))]
    _decide_on_scores(result, policy, base_value, cand_value, None if None in bounds else bounds)


def _decide_on_scores(result: BenchmarkGate, policy: ResolvedPolicy, base_value: float, cand_value: float,
                      bounds: list[Any] | None) -> None:
    """No paired decision: the two runs' own scores, the CI of their difference from each one's [low, high]
    (base_low, base_high, cand_low, cand_high) where known, and the point estimate for advisory benchmarks only."""
    result.baseline_score, result.candidate_score = base_value, cand_value
    result.delta = round(cand_value - base_value, 6)
    if base_value != 0:
        result.relative_drop_pct = round(100 * result.delta / base_value, 2)
    if bounds is not None:
        base_low, base_high, cand_low, cand_high = bounds
        result.delta_ci_lower = round(cand_low - base_high, 6)
        result.delta_ci_upper = round(cand_high - base_low, 6)
    apply_thresholds(result, policy, allow_point_estimate=result.tier == "advisory")


def _evidence(name: str, base_path: Path, cand_path: Path, max_drop: float) -> CompareEvidence | None:
    def bundle(path: Path) -> nextresults.Bundle:
        return nextresults.Bundle(name=name, directory=path.parent, path=path, data={})

    try:
        compared = nextresults.compare_bundles(bundle(base_path), bundle(cand_path), max_drop=max_drop)
    except ToolError:
        return None
    return CompareEvidence(test=compared.test, p_value=compared.p_value, n_regressions=compared.n_regressions,
                           n_improvements=compared.n_improvements, verdict=compared.verdict)


def gate_benchmark(name: str, base_path: Path, cand_path: Path, policy: ResolvedPolicy,
                   base_records: dict[tuple[int, int], dict[str, Any]], cand_records: dict[tuple[int, int], dict[str, Any]]) -> BenchmarkGate:
    """One benchmark against its resolved policy: paired per-problem deltas and their CI when results.jsonl exist
    (the records are nextresults.paired_records of each bundle's folder)."""
    result = BenchmarkGate(benchmark=name, tier=policy.tier, direction=policy.direction, max_drop_threshold=policy.max_drop,
                           max_relative_drop_threshold=policy.max_relative_drop)
    result.compare = _evidence(name, base_path, cand_path, policy.max_drop)
    if not base_records or not cand_records:
        result.status = "INSUFFICIENT_EVIDENCE"
        result.reasons.append("Per-sample results (results.jsonl) missing or empty")
        _from_bundle_scores(result, base_path, cand_path, policy)
        return result
    result.metric = policy.metric or _auto_metric(base_path, cand_path)
    base_values = problem_values(nextresults.per_problem_rewards(base_records), result.metric)
    cand_values = problem_values(nextresults.per_problem_rewards(cand_records), result.metric)
    if not _gate_paired(result, base_values, cand_values, lambda shared: paired.category_clusters(base_records, shared), policy):
        _from_bundle_scores(result, base_path, cand_path, policy)
    return result


def _gate_paired(result: BenchmarkGate, base_values: dict[Any, float] | None, cand_values: dict[Any, float] | None,
                 clusters: Callable[[list[Any]], list[str] | None], policy: ResolvedPolicy) -> bool:
    """The decision on paired per-problem values (either engine's); False, with the reason, when they cannot decide."""
    if base_values is None or cand_values is None:
        result.status = "INSUFFICIENT_EVIDENCE"
        result.reasons.append(f"Metric {result.metric!r} is not supported for paired gating")
        return False
    interval = paired.paired_interval(base_values, cand_values, clusters, policy.confidence)
    result.n_paired = interval.n if interval else 0
    if interval is None or interval.n < MIN_PAIRED_ITEMS:
        result.status = "INSUFFICIENT_EVIDENCE"
        result.reasons.append(f"Only {result.n_paired} paired items (minimum {MIN_PAIRED_ITEMS})")
        if interval is not None and policy.direction == "higher_is_better":
            result.advice = paired.advice(interval, policy.max_drop)
        return False
    result.baseline_score, result.candidate_score = round(interval.baseline, 6), round(interval.candidate, 6)
    result.delta = round(interval.delta, 6)
    if result.baseline_score != 0:
        result.relative_drop_pct = round(100 * interval.delta / result.baseline_score, 2)
    result.delta_ci_lower, result.delta_ci_upper = interval.low, interval.high
    apply_thresholds(result, policy, allow_point_estimate=False)
    if result.status == "INSUFFICIENT_EVIDENCE" and policy.direction == "higher_is_better":
        result.advice = paired.advice(interval, policy.max_drop)
    return True


# NEL 0.2.6 runs: nel gate cannot read them (results.yml, not eval-*.json bundles), so the same rules are applied to
# what they hold: per-sample scores (nemo-evaluator's per-sample outputs, one row per sample and repeat) paired by
# sample id, else the task's headline score with its stderr.


def _fraction(score: ScoreValue | None) -> tuple[float, float | None] | None:
    if score is None:
        return None
    scale = 100.0 if score.scale == "percent" else 1.0
    return score.value / scale, (score.stderr / scale if score.stderr is not None else None)


def gate_nel_task(name: str, base: tuple[Path, TaskScores], cand: tuple[Path, TaskScores], policy: ResolvedPolicy) -> BenchmarkGate:
    """One NEL 0.2.6 task against its resolved policy, by the rules gate_benchmark applies to nel-next bundles."""
    result = BenchmarkGate(benchmark=name, tier=policy.tier, direction=policy.direction, max_drop_threshold=policy.max_drop,
                           max_relative_drop_threshold=policy.max_relative_drop, metric=policy.metric or "pass@1")
    base_samples, cand_samples = per_sample_scores(base[0]), per_sample_scores(cand[0])
    has_samples = bool(base_samples and cand_samples)
    if has_samples:
        if _gate_paired(result, problem_values(base_samples, result.metric), problem_values(cand_samples, result.metric),
                        lambda shared: None, policy):
            return result
    else:
        result.status = "INSUFFICIENT_EVIDENCE"
        result.reasons.append("Per-sample results (nemo-evaluator-per-sample-outputs) missing or empty")
    # no paired decision: the headline scores, on the point estimate for advisory only. As nel gate's bundle fallback
    # has no CI, too few pairs gets none; a run without per-sample outputs gets the unpaired CI from NEL's stderr.
    base_score, cand_score = _fraction(base[1].headline), _fraction(cand[1].headline)
    if base_score is None or cand_score is None:
        return result
    (base_value, base_se), (cand_value, cand_se) = base_score, cand_score
    bounds = None
    if not has_samples and base_se is not None and cand_se is not None:
        z = paired.normal_quantile(paired.two_sided(policy.confidence))
        bounds = [base_value - z * base_se, base_value + z * base_se, cand_value - z * cand_se, cand_value + z * cand_se]
    _decide_on_scores(result, policy, round(base_value, 6), round(cand_value, 6), bounds)
    return result


def aggregate(benchmarks: list[BenchmarkGate]) -> tuple[Verdict, list[str]]:
    """NO-GO on a gated BREACH or MISSING, INCONCLUSIVE on gated INSUFFICIENT_EVIDENCE, else GO; advisory never counts."""
    gated = [b for b in benchmarks if b.tier in ("critical", "supporting")]

    def named(status: str) -> list[str]:
        return [f"{b.benchmark} [{b.tier}]" for b in gated if b.status == status]

    breached, missing, insufficient = named("BREACH"), named("MISSING"), named("INSUFFICIENT_EVIDENCE")
    if breached or missing:
        reasons = [f"BREACH: {', '.join(breached)}"] if breached else []
        reasons += [f"MISSING: {', '.join(missing)}"] if missing else []
        return "NO-GO", reasons
    if insufficient:
        # nel gate's own action line says "add repeats" whatever the temperature; this one says how many problems
        actions = [f"Action: {b.benchmark}: {b.advice}" for b in gated if b.status == "INSUFFICIENT_EVIDENCE" and b.advice]
        return "INCONCLUSIVE", [f"INSUFFICIENT_EVIDENCE: {', '.join(insufficient)}",
                                *(actions or ["Action: re-run these benchmarks with more problems (per-problem results "
                                              "make a paired interval), or relax their max_drop."])]
    passed = sum(1 for b in gated if b.status == "PASS")
    return "GO", [f"All {passed} gated benchmark(s) passed" if passed else "No gated benchmarks evaluated"]


def gate_results(request: GateResultsInput, confidence: float = paired.DEFAULT_CONFIDENCE) -> GateResultsOutput:
    """Release gate by `nel gate`'s rules: GO / NO-GO / INCONCLUSIVE for a candidate run against a baseline under a policy,
    with the reason per benchmark; two finished nel-next runs or two NEL 0.2.6 runs.
    """
    policy_path = Path(request.policy).expanduser()
    policy = load_policy(policy_path)
    base_nel, cand_nel = _nel_tasks(request.baseline), _nel_tasks(request.candidate)
    if (base_nel is None) != (cand_nel is None):
        raise ToolError("baseline and candidate come from different engines (one NEL 0.2.6 run, one nel-next run): their "
                        "scores are not computed the same way. Gate runs of one engine against each other.")
    warnings: list[str] = []
    gate_one: Callable[[str], BenchmarkGate]
    if base_nel is not None and cand_nel is not None:
        base_label, cand_label, base_names, cand_names = request.baseline, request.candidate, set(base_nel), set(cand_nel)
        warnings.append("NEL 0.2.6 runs: `nel gate` reads only nel-next bundles, so its rules were applied here to the "
                        "tasks' per-sample outputs, paired by sample id (headline scores where a task kept none).")

        def gate_one(name: str) -> BenchmarkGate:
            return gate_nel_task(name, base_nel[name], cand_nel[name], policy.resolve(name, confidence))
    else:
        base_dir, cand_dir = results_dir(request.baseline, "baseline"), results_dir(request.candidate, "candidate")
        base_bundles, base_warnings = discover(base_dir, "baseline")
        cand_bundles, cand_warnings = discover(cand_dir, "candidate")
        base_label, cand_label, base_names, cand_names = str(base_dir), str(cand_dir), set(base_bundles), set(cand_bundles)
        warnings += base_warnings + cand_warnings

        def gate_one(name: str) -> BenchmarkGate:
            records = {side: nextresults.paired_records(bundles[name].parent)
                       for side, bundles in (("baseline", base_bundles), ("candidate", cand_bundles))}
            for side, side_records in records.items():
                if lost := nextresults.unanswered(side_records):
                    warnings.append(f"{side} {name}: {len(lost)} problem(s) had requests that got no answer (infra_error); "
                                    "nel gate counts them as wrong, as this verdict does: resume_run re-runs them before a "
                                    "release decision.")
            return gate_benchmark(name, base_bundles[name], cand_bundles[name], policy.resolve(name, confidence),
                                  records["baseline"], records["candidate"])

    missing = sorted(policy.required_benchmarks() - (base_names & cand_names))
    results = [BenchmarkGate(benchmark=name, tier=policy.resolve(name).tier, status="MISSING",
                             reasons=[f"Required benchmark {name!r} not found in evaluation results"]) for name in missing]
    if base_only := sorted(base_names - cand_names):
        warnings.append(f"Baseline-only benchmarks (no candidate): {', '.join(base_only)}")
    if cand_only := sorted(cand_names - base_names):
        warnings.append(f"Candidate-only benchmarks (no baseline): {', '.join(cand_only)}")
    results += [gate_one(name) for name in sorted(base_names & cand_names)]
    verdict, reasons = aggregate(results)
    output = GateResultsOutput(verdict=verdict, verdict_reasons=reasons, benchmarks=results, missing=missing,
                               warnings=warnings, policy=str(policy_path), baseline=base_label, candidate=cand_label)
    if request.output_dir:
        output.report_path = str(write_report(output, Path(request.output_dir).expanduser()))
    return output


def _nel_tasks(value: str) -> dict[str, tuple[Path, TaskScores]] | None:
    """A NEL 0.2.6 run's tasks (local, host:path, ledger or invocation id), or None when value names no such run."""
    path = Path(value).expanduser()
    if path.is_file() or (path.is_dir() and (any(path.glob("eval-*.json")) or any(path.glob("*/eval-*.json")))):
        return None  # nel-next's bundles
    try:
        if not engines.for_record(ledger.get(value.strip())).results_by_location:
            return None
    except ToolError:
        pass  # not a ledger id
    try:
        return tasks_by_name(locate_run(value)) or None
    except ToolError:
        return None


def write_report(output: GateResultsOutput, directory: Path) -> Path:
    """The report as nel gate's --output JSON (report_version, verdict, verdict_reasons, benchmarks, missing, warnings)."""
    report = {"report_version": REPORT_VERSION, **output.model_dump(mode="json", include={"verdict", "verdict_reasons",
                                                                                          "benchmarks", "missing", "warnings"})}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / REPORT_NAME
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report, indent=2), encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise ToolError(f"output_dir {directory}: cannot write {REPORT_NAME} ({exc.strerror or exc}).") from None
    return path


def write_rule_policy(path: Path, benchmarks: list[str], max_drop_points: float, confidence: float) -> Path:
    """The user's rule ("at most max_drop points lost, at this confidence") as a `nel gate --policy` file: every
    benchmark critical on pass@1, max_drop as nel gate reads it (a fraction of the 0-1 score). nel gate judges at 95%
    only; the comment says when the rule's confidence is another."""
    import yaml

    policy = {"version": 1, "defaults": {"tier": "critical", "metric": "pass@1", "max_drop": round(max_drop_points / 100, 6)},
              "benchmarks": {name: {} for name in benchmarks}}
    GatePolicy.model_validate(policy)  # nel gate's schema, so `nel gate --policy` reads it
    note = "" if confidence == paired.DEFAULT_CONFIDENCE else (
        f"\n# nel gate judges at 95% only: the rule's {100 * confidence:g}% was applied by quanteval, not by this file")
    text = (f"# quanteval evaluate: at most {max_drop_points:g} accuracy points lost, at {100 * confidence:g}% confidence"
            f"{note}\n# check: nel gate BASELINE_RUN CANDIDATE_RUN --policy {path.name}\n")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
    except OSError as exc:
        raise ToolError(f"{path}: cannot write the gate policy ({exc.strerror or exc}).") from None
    return path
