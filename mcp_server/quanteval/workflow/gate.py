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
- One departure, said in each answer it changes: a problem whose request got no answer on either side (an
  infrastructure error) is left out of the pairing, where nel gate counts it as a wrong answer; nel gate's number
  is shown beside it, and above workflow/samples.py's share of such problems the benchmark is INSUFFICIENT_EVIDENCE.
- Aggregate: a critical/supporting BREACH or MISSING is NO-GO; else a critical/supporting INSUFFICIENT_EVIDENCE
  is INCONCLUSIVE; else GO. Advisory benchmarks never change the verdict.

Both runs are read by their engine's ResultsReader (engines/runresults.py), so one body gates every engine's runs:
the reader finds the benchmarks (nel-next's bundles as nel gate finds them), their per-problem rewards, the metric
gated when the policy names none, and the runs' own scores when nothing can be paired. The engine's own paired test
(nel compare's McNemar/sign test and its verdict, for nel-next) is attached per benchmark as supporting evidence; as
in nel gate, it does not drive the decision.

NEL 0.2.6 runs, which `nel gate` cannot read, get the same rules: benchmarks are their task names, per-problem values
come from nemo-evaluator's per-sample outputs paired by sample id (no categories: Student t). Without per-sample
outputs the headline scores decide, their CI the unpaired sum of each run's 95% CI from NEL's stderr.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from quanteval import paths
from quanteval.engines.runresults import GATED_METRICS, ResultsReader, RunBenchmark, problem_values
from quanteval.models import StrictModel, ToolError
from quanteval.workflow import paired, release
from quanteval.workflow import samples as samples_rule
from quanteval.workflow.paired import MIN_PAIRED_ITEMS
from quanteval.workflow.results import RunPair, read_pair
from quanteval.workflow.samples import SampleStatus

REPORT_VERSION = 1
REPORT_NAME = "gate-report.json"
RULE_POLICY_NAME = "nel-gate-policy.yaml"  # a rule in points (max_drop), as the `nel gate --policy` file it is

Tier = Literal["critical", "supporting", "advisory"]
Direction = Literal["higher_is_better", "lower_is_better"]
Status = Literal["PASS", "BREACH", "INSUFFICIENT_EVIDENCE", "MISSING"]
Verdict = Literal["GO", "NO-GO", "INCONCLUSIVE"]


# ---------------------------------------------------------------- the policy (nel gate's schema, read as it is)


class _Thresholds(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("max_drop", "max_relative_drop", check_fields=False)
    @classmethod
    def _drops(cls, value: float | None, info: Any) -> float | None:
        if value is not None and value < 0:
            raise ValueError(f"{info.field_name} must be >= 0, got {value}")
        return value

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
        return [f"{where}.max_drop: a `nel gate` policy file takes a fraction of the 0-1 score; {entry.max_drop:g} "
                f"reads as points — use {entry.max_drop / 100:g}"
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


# ---------------------------------------------------------------- the tool's models


class GateResultsInput(StrictModel):
    baseline: str = Field(description="Reference run: a run folder, eval-*.json, host:path, invocation or record id.")
    candidate: str = Field(description="Run to judge (e.g. quantized), named like baseline.")
    policy: str | None = Field(None, description="`nel gate --policy` YAML (its max_drop is a fraction: 0.02 = two points).")
    max_drop: paired.MaxDropPoints = Field(None, description=(
        f"Instead of policy: largest acceptable drop in points (2 = two points) on every shared benchmark; written as {RULE_POLICY_NAME}."))
    output_dir: str | None = Field(None, description=f"Where to write {REPORT_NAME} (nel gate's --output JSON); default none.")
    max_length_change: release.MaxLengthChange = None


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
    samples: SampleStatus | None = Field(None, description="Infrastructure errors (left out of the pairing, unlike nel "
                                         "gate) and unscored answers (counted wrong) per side.")


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
    release_verdict: Verdict = Field("GO", description="verdict with quanteval's rules beside nel gate's (release_rules: "
                                     "truncation, failed requests, sample counts, max_length_change): NO-GO or "
                                     "INCONCLUSIVE where one fails; `verdict` stays nel gate's own.")
    release_rules: list[release.OutputCheck] = Field(default_factory=list, description=(
        "Per benchmark: completion tokens, truncated and failed responses with their denominators, speed, findings."))


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


def _kept_problems(benchmark: RunBenchmark) -> bool:
    return benchmark.problems is not None and bool(benchmark.problems.rewards)


def gate_benchmark(reader: ResultsReader, name: str, base: RunBenchmark, cand: RunBenchmark,
                   policy: ResolvedPolicy) -> BenchmarkGate:
    """One benchmark against its resolved policy: paired per-problem deltas and their CI where both runs kept
    per-problem results, else the runs' own scores (on the point estimate for advisory benchmarks only)."""
    result = BenchmarkGate(benchmark=name, tier=policy.tier, direction=policy.direction, max_drop_threshold=policy.max_drop,
                           max_relative_drop_threshold=policy.max_relative_drop)
    if (test := reader.paired_test(base, cand, policy.max_drop)) is not None:
        result.compare = CompareEvidence(test=test.test, p_value=test.p_value, n_regressions=test.n_regressions,
                                         n_improvements=test.n_improvements, verdict=test.verdict)
    result.metric = policy.metric or reader.gate_metric(base, cand)
    paired_tried = _kept_problems(base) and _kept_problems(cand)
    if not paired_tried:
        result.status = "INSUFFICIENT_EVIDENCE"
        result.reasons.append(f"Per-sample results ({reader.problems_source}) missing or empty")
    else:
        assert base.problems is not None and cand.problems is not None
        base_values = problem_values(base.problems.rewards, result.metric)
        cand_values = problem_values(cand.problems.rewards, result.metric)
        if base_values is not None and cand_values is not None:
            base_values, cand_values = _without_infra_errors(result, base, cand, base_values, cand_values, policy)
            if result.status == "INSUFFICIENT_EVIDENCE":
                return result
        if _gate_paired(result, base_values, cand_values, base.problems.categories, policy):
            if result.samples is not None and result.samples.counted_as_wrong is not None:
                result.reasons.append(samples_rule.counted_as_wrong_note(*result.samples.counted_as_wrong))
            return result
    z = paired.normal_quantile(paired.two_sided(policy.confidence))
    if (scores := reader.gate_scores(base, cand, result.metric, z, paired_tried)) is not None:
        _decide_on_scores(result, policy, *scores)
    return result


def _without_infra_errors(result: BenchmarkGate, base: RunBenchmark, cand: RunBenchmark, base_values: dict[Any, float],
                          cand_values: dict[Any, float], policy: ResolvedPolicy) -> tuple[dict[Any, float], dict[Any, float]]:
    """The pairs left once infrastructure errors are dropped (workflow/samples.py), nel gate's number over every pair
    kept beside it; INSUFFICIENT_EVIDENCE when the errors exceed their share."""
    account = samples_rule.account(result.benchmark, base.problems, cand.problems, base_values, cand_values, policy.confidence)
    result.samples = account.status
    if account.excluded:  # where the rule departs from nel gate's, its reasons say so; else they stay nel gate's
        result.reasons.extend(account.notes)
    if account.refusal:
        result.status = "INSUFFICIENT_EVIDENCE"
        result.reasons.append(account.refusal)
    return account.kept(base_values), account.kept(cand_values)


def _gate_paired(result: BenchmarkGate, base_values: dict[Any, float] | None, cand_values: dict[Any, float] | None,
                 categories: dict[Any, str], policy: ResolvedPolicy) -> bool:
    """The decision on paired per-problem values; False, with the reason, when they cannot decide."""
    if base_values is None or cand_values is None:
        result.status = "INSUFFICIENT_EVIDENCE"
        result.reasons.append(f"Metric {result.metric!r} is not supported for paired gating")
        return False
    interval = paired.paired_interval(base_values, cand_values, categories, policy.confidence)
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


def gate_results(request: GateResultsInput, confidence: float = paired.DEFAULT_CONFIDENCE, runs: RunPair | None = None) -> GateResultsOutput:
    """Release gate by `nel gate`'s rules: GO / NO-GO / INCONCLUSIVE for two finished runs under a policy, per benchmark.
    """
    if (request.policy is None) == (request.max_drop is None):
        raise ToolError("Give policy (a `nel gate --policy` YAML) or max_drop (points), exactly one: max_drop 2 gates every "
                        "benchmark both runs have at most two points lost, at 95%.")
    if request.output_dir and paths.read_only_call():
        raise ToolError("output_dir: this server is --read-only and writes no file; leave output_dir out (the verdict "
                        "and every benchmark's reasons come back in the answer).")
    reader, base, cand = runs or read_pair(request.baseline, request.candidate)
    if request.max_drop is not None:  # the user's rule in points, as the policy nel gate reads (its fraction)
        shared = sorted(set(base.benchmarks) & set(cand.benchmarks))
        if not shared:
            raise ToolError(f"max_drop: the runs have no benchmark in common (baseline {sorted(base.benchmarks)}, candidate "
                            f"{sorted(cand.benchmarks)}): nothing to gate.")
        if paths.read_only_call():  # a --read-only server writes nothing: the rule is gated as the policy it states
            policy = GatePolicy.model_validate(rule_policy(shared, request.max_drop))
            policy_name = f"max_drop {request.max_drop:g} points (no policy file written: this server is --read-only)"
        else:
            # without output_dir: a folder per (runs, rule), so two gates at once never write each other's policy
            unique = hashlib.sha256(json.dumps([request.baseline, request.candidate, request.max_drop, confidence]).encode()).hexdigest()[:12]
            where = Path(request.output_dir).expanduser() if request.output_dir else paths.call_state_dir() / "gate-policies" / unique
            policy_path = write_rule_policy(where / RULE_POLICY_NAME, shared, request.max_drop, confidence)
            policy, policy_name = load_policy(policy_path), str(policy_path)
    else:
        assert request.policy is not None
        policy_path = Path(request.policy).expanduser()
        policy, policy_name = load_policy(policy_path), str(policy_path)
    warnings = list(dict.fromkeys(base.warnings + cand.warnings))
    base_names, cand_names = set(base.benchmarks), set(cand.benchmarks)
    missing = sorted(policy.required_benchmarks() - (base_names & cand_names))
    results = [BenchmarkGate(benchmark=name, tier=policy.resolve(name).tier, status="MISSING",
                             reasons=[f"Required benchmark {name!r} not found in evaluation results"]) for name in missing]
    if base_only := sorted(base_names - cand_names):
        warnings.append(f"Baseline-only benchmarks (no candidate): {', '.join(base_only)}")
    if cand_only := sorted(cand_names - base_names):
        warnings.append(f"Candidate-only benchmarks (no baseline): {', '.join(cand_only)}")
    for name in sorted(base_names & cand_names):
        results.append(gate_benchmark(reader, name, base.benchmarks[name], cand.benchmarks[name], policy.resolve(name, confidence)))
    verdict, reasons = aggregate(results)
    checks = [release.check(name, reader.outputs(base, base.benchmarks[name]), reader.outputs(cand, cand.benchmarks[name]),
                            request.max_length_change) for name in sorted(base_names & cand_names)]
    output = GateResultsOutput(verdict=verdict, verdict_reasons=reasons, benchmarks=results, missing=missing,
                               warnings=warnings, policy=policy_name, baseline=base.label, candidate=cand.label,
                               release_verdict=release_verdict(verdict, checks), release_rules=checks)
    if request.output_dir:
        output.report_path = str(write_report(output, Path(request.output_dir).expanduser()))
    return output


def release_verdict(verdict: Verdict, checks: list[release.OutputCheck]) -> Verdict:
    """nel gate's verdict with quanteval's rules beside it: a GO that a rule blocks is NO-GO (the user's length rule)
    or INCONCLUSIVE (truncation, failed requests, samples: the measurement is not the model's)."""
    if verdict != "GO":
        return verdict
    blocks = {check.blocks for check in checks if check.blocks}
    return "NO-GO" if "not acceptable" in blocks else "INCONCLUSIVE" if blocks else "GO"


def write_report(output: GateResultsOutput, directory: Path) -> Path:
    """The report as nel gate's --output JSON (report_version, verdict, verdict_reasons, benchmarks, missing, warnings)."""
    report = {"report_version": REPORT_VERSION, **output.model_dump(mode="json", include={"verdict", "verdict_reasons",
                                                                                          "benchmarks", "missing", "warnings"})}
    return paths.write_file(directory / REPORT_NAME, json.dumps(report, indent=2))


def rule_policy(benchmarks: list[str], max_drop_points: float) -> dict:
    """The user's rule ("at most max_drop points lost") as nel gate's policy: every benchmark critical on pass@1,
    max_drop as nel gate reads it (a fraction of the 0-1 score)."""
    return {"version": 1, "defaults": {"tier": "critical", "metric": "pass@1", "max_drop": round(max_drop_points / 100, 6)},
            "benchmarks": {name: {} for name in benchmarks}}


def write_rule_policy(path: Path, benchmarks: list[str], max_drop_points: float, confidence: float) -> Path:
    """The user's rule ("at most max_drop points lost, at this confidence") as a `nel gate --policy` file: every
    benchmark critical on pass@1, max_drop as nel gate reads it (a fraction of the 0-1 score). nel gate judges at 95%
    only; the comment says when the rule's confidence is another."""
    import yaml

    policy = rule_policy(benchmarks, max_drop_points)
    GatePolicy.model_validate(policy)  # nel gate's schema, so `nel gate --policy` reads it
    note = "" if confidence == paired.DEFAULT_CONFIDENCE else (
        f"\n# nel gate judges at 95% only: the rule's {100 * confidence:g}% was applied by quanteval, not by this file")
    text = (f"# quanteval evaluate: at most {max_drop_points:g} accuracy points lost, at {100 * confidence:g}% confidence"
            f"{note}\n# check: nel gate BASELINE_RUN CANDIDATE_RUN --policy {path.name}\n")
    return paths.write_file(path, text + yaml.safe_dump(policy, sort_keys=False))
