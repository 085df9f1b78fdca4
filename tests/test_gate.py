"""gate_results against its oracle, the real `nel gate` (nel-next's venv), on run folders from the real `nel eval run`.

One real run of tiny_add against the inference stand-in (every answer wrong) gives the folder layout and the
results.jsonl / eval-*.json rows; baseline and candidate variants rewrite their rewards, scores and benchmark names.
For each policy case our verdict, per-benchmark states, scores, CIs and reasons equal `nel gate --format json`'s.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
from next_runs import NEL, make_run, nel_json, write_policy
from results_factory import binary_samples, make_invocation, make_task
from tiers import requires

from quanteval.models import ToolError
from quanteval.workflow.gate import GateResultsInput, gate_results
from quanteval.workflow.paired import t_quantile

N_PROBLEMS = 40

pytestmark = requires("nel-next")


def nel_gate(baseline: Path, candidate: Path, policy: Path) -> dict:
    return nel_json("gate", "--policy", policy, baseline, candidate)


COMPARED = ("benchmark", "tier", "status", "metric", "n_paired", "max_drop_threshold", "max_relative_drop_threshold",
            "direction", "absolute_breached", "relative_breached", "reasons")
NUMBERS = ("baseline_score", "candidate_score", "delta", "relative_drop_pct", "delta_ci_lower", "delta_ci_upper")


def same_reasons(ours: list[str], theirs: list[str]) -> bool:
    """nel gate's reasons, but for its action line ("re-run with more items, add repeats, ..."): ours says how many
    problems would decide, and never repeats (they add nothing at temperature 0)."""
    def kept(reasons: list[str]) -> list[str]:
        return [r for r in reasons if not r.startswith("Action:")]

    assert not any("repeats" in r for r in ours if r.startswith("Action:")), ours
    return kept(ours) == kept(theirs) and any(r.startswith("Action:") for r in ours) == any(r.startswith("Action:") for r in theirs)


def assert_same_as_nel_gate(baseline: Path, candidate: Path, policy: Path) -> dict:
    ours = gate_results(GateResultsInput(baseline=str(baseline), candidate=str(candidate), policy=str(policy)))
    theirs = nel_gate(baseline, candidate, policy)
    mine = ours.model_dump(mode="json")
    assert mine["verdict"] == theirs["verdict"]
    assert same_reasons(mine["verdict_reasons"], theirs["verdict_reasons"]), (mine["verdict_reasons"], theirs["verdict_reasons"])
    assert mine["missing"] == theirs["missing"]
    assert mine["warnings"] == theirs["warnings"]
    assert [b["benchmark"] for b in mine["benchmarks"]] == [b["benchmark"] for b in theirs["benchmarks"]]
    for our, their in zip(mine["benchmarks"], theirs["benchmarks"], strict=True):
        assert {k: our[k] for k in COMPARED} == {k: their[k] for k in COMPARED}, our["benchmark"]
        for key in NUMBERS:
            assert (our[key] is None) == (their[key] is None), (our["benchmark"], key)
            if their[key] is not None:
                assert our[key] == pytest.approx(their[key], abs=2e-6), (our["benchmark"], key)
    return mine


def half_right(n: int = N_PROBLEMS) -> list[float]:
    return [1.0 if i % 2 == 0 else 0.0 for i in range(n)]


def drop(rewards: list[float], k: int) -> list[float]:
    """The first k right answers turned wrong."""
    out, left = list(rewards), k
    for i, value in enumerate(out):
        if left and value > 0:
            out[i], left = 0.0, left - 1
    return out


def states(result: dict) -> dict[str, str]:
    return {b["benchmark"]: b["status"] for b in result["benchmarks"]}


def test_go_critical_and_supporting_within_their_drops_advisory_regression_ignored(real_run, tmp_path):
    base = make_run(real_run, tmp_path / "base", {"alpha": half_right(), "beta": half_right(), "gamma": half_right(),
                                                   "clustered": half_right()}, categories={"clustered": 4})
    cand = make_run(real_run, tmp_path / "cand", {"alpha": half_right(), "beta": drop(half_right(), 1),
                                                   "gamma": drop(half_right(), 15), "clustered": drop(half_right(), 1)},
                    categories={"clustered": 4})
    policy = write_policy(tmp_path / "policy.yaml", """\
version: 1
defaults: {tier: supporting, max_drop: 0.2, metric: pass@1}
benchmarks:
  alpha: {tier: critical, metric: pass@1, max_drop: 0.05}
  beta: {metric: mean_reward}
  gamma: {tier: advisory, max_drop: 0.01}
""")
    result = assert_same_as_nel_gate(base, cand, policy)
    assert result["verdict"] == "GO"
    assert states(result) == {"alpha": "PASS", "beta": "PASS", "clustered": "PASS", "gamma": "BREACH"}


def test_no_go_on_a_critical_breach_and_on_the_relative_guardrail(real_run, tmp_path):
    base = make_run(real_run, tmp_path / "base", {"alpha": half_right(), "beta": half_right(), "gamma": half_right()})
    cand = make_run(real_run, tmp_path / "cand", {"alpha": drop(half_right(), 12), "beta": drop(half_right(), 2),
                                                   "gamma": half_right()})
    policy = write_policy(tmp_path / "policy.yaml", """\
version: 1
defaults: {max_drop: 0.015}
benchmarks:
  alpha: {tier: critical, metric: pass@1, max_drop: 0.05}
  beta: {tier: supporting, metric: pass@1, max_drop: 0.5, max_relative_drop: 0.05, relative_guard_below: 0.9}
  gamma: {tier: supporting, metric: mean_reward, max_drop: 0.02}
""")
    result = assert_same_as_nel_gate(base, cand, policy)
    assert result["verdict"] == "NO-GO"
    assert states(result) == {"alpha": "BREACH", "beta": "BREACH", "gamma": "PASS"}
    by_name = {b["benchmark"]: b for b in result["benchmarks"]}
    assert by_name["alpha"]["absolute_breached"] and by_name["beta"]["relative_breached"]


def test_inconclusive_on_too_few_problems_a_straddling_ci_and_no_per_problem_results(real_run, tmp_path):
    base = make_run(real_run, tmp_path / "base", {"few": half_right(6), "close": half_right(), "nojsonl": half_right(),
                                                   "adv": half_right()}, no_results=("nojsonl", "adv"))
    cand = make_run(real_run, tmp_path / "cand", {"few": half_right(6), "close": drop(half_right(), 1),
                                                   "nojsonl": half_right(), "adv": drop(half_right(), 2)},
                    no_results=("nojsonl", "adv"))
    policy = write_policy(tmp_path / "policy.yaml", """\
version: 1
benchmarks:
  few: {tier: critical, metric: pass@1, max_drop: 0.05}
  close: {tier: supporting, metric: pass@1, max_drop: 0.05}
  nojsonl: {tier: supporting, metric: pass@1}
  adv: {tier: advisory, max_drop: 0.2}
""")
    result = assert_same_as_nel_gate(base, cand, policy)
    assert result["verdict"] == "INCONCLUSIVE"
    assert states(result) == {"adv": "PASS", "close": "INSUFFICIENT_EVIDENCE", "few": "INSUFFICIENT_EVIDENCE",
                              "nojsonl": "INSUFFICIENT_EVIDENCE"}


def test_missing_required_benchmark_is_no_go_and_one_sided_benchmarks_are_warnings(real_run, tmp_path):
    base = make_run(real_run, tmp_path / "base", {"alpha": half_right(), "beta": half_right(), "only_base": half_right()})
    cand = make_run(real_run, tmp_path / "cand", {"alpha": half_right(), "only_cand": half_right()})
    policy = write_policy(tmp_path / "policy.yaml", """\
version: 1
defaults: {metric: pass@1}
benchmarks:
  alpha: {tier: critical}
  beta: {tier: critical}
  nowhere: {tier: advisory}
""")
    result = assert_same_as_nel_gate(base, cand, policy)
    assert result["verdict"] == "NO-GO"
    assert result["missing"] == ["beta"]
    assert states(result) == {"alpha": "PASS", "beta": "MISSING"}


@pytest.mark.slow
def test_cli_exit_codes_and_report(real_run, tmp_path, cli_env):
    base = make_run(real_run, tmp_path / "base", {"alpha": half_right()})
    cand = make_run(real_run, tmp_path / "cand", {"alpha": drop(half_right(), 12)})
    few = make_run(real_run, tmp_path / "few", {"alpha": half_right(5)})
    policy = write_policy(tmp_path / "policy.yaml", "benchmarks:\n  alpha: {tier: critical, metric: pass@1}\n")

    def gate(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["quanteval", "gate", *argv, "--policy", str(policy)], capture_output=True, text=True,
                              env=cli_env, timeout=120, check=False)

    def nel_gate_exit(baseline: Path, candidate: Path) -> int:  # the real `nel gate`, strict as CI runs it
        return subprocess.run([str(NEL), "gate", "--policy", str(policy), str(baseline), str(candidate), "--no-report"], capture_output=True,
                              text=True, env=cli_env, timeout=120, check=False).returncode

    go = gate(str(base), str(base), "--output-dir", str(tmp_path / "report"))
    assert go.returncode == 0 == nel_gate_exit(base, base), go.stderr
    assert go.stdout.startswith("verdict: GO")
    assert json.loads((tmp_path / "report" / "gate-report.json").read_text())["verdict"] == "GO"
    no_go = gate(str(base), str(cand), "--json")
    assert no_go.returncode == 1 == nel_gate_exit(base, cand), no_go.stderr  # nel gate's codes: a CI script takes either
    assert json.loads(no_go.stdout)["verdict"] == "NO-GO"
    inconclusive = gate(str(few), str(few))
    assert inconclusive.returncode == 2 == nel_gate_exit(few, few), inconclusive.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    error = gate(str(empty), str(base))
    assert error.returncode == 1 and "no benchmark results" in error.stderr


@pytest.mark.slow
def test_max_drop_in_points_gates_as_the_policy_it_writes_in_nel_gates_fraction(real_run, tmp_path, cli_env):
    """The user's rule in the unit they type (points, as evaluate_quantization and compare_results take it): the
    policy handed to nel gate says 0.02 for 2 points, and nel gate reads that file to the same verdict."""
    base = make_run(real_run, tmp_path / "base", {"alpha": half_right()})
    cand = make_run(real_run, tmp_path / "cand", {"alpha": drop(half_right(), 8)})  # 8 of 40 problems: 20 points lost
    for points, verdict in ((50, "GO"), (2, "NO-GO")):
        out = tmp_path / f"rule-{points}"
        ours = gate_results(GateResultsInput(baseline=str(base), candidate=str(cand), max_drop=points, output_dir=str(out)))
        written = out / "nel-gate-policy.yaml"
        assert ours.policy == str(written) and f"max_drop: {points / 100:g}" in written.read_text()
        assert ours.verdict == verdict == nel_gate(base, cand, written)["verdict"]
    cli = subprocess.run(["quanteval", "gate", str(base), str(cand), "--max-drop", "2"], capture_output=True, text=True,
                         env=cli_env, timeout=120, check=False)
    assert cli.returncode == 1 and cli.stdout.startswith("verdict: NO-GO"), cli.stderr
    with pytest.raises(ToolError, match="exactly one"):
        gate_results(GateResultsInput(baseline=str(base), candidate=str(cand)))
    with pytest.raises(ToolError, match="exactly one"):
        gate_results(GateResultsInput(baseline=str(base), candidate=str(cand), max_drop=2, policy=str(written)))
    with pytest.raises(ValueError, match="points"):  # 0.02 typed for two points: refused, not read as 0.02 points
        GateResultsInput(baseline=str(base), candidate=str(cand), max_drop=0.02)
    # without output_dir each rule's policy has a file of its own (one shared path was rewritten by every gate)
    strict, loose = (gate_results(GateResultsInput(baseline=str(base), candidate=str(cand), max_drop=points)) for points in (2, 50))
    assert strict.policy != loose.policy and strict.verdict == "NO-GO" and loose.verdict == "GO"
    assert "max_drop: 0.02" in Path(strict.policy).read_text() and "max_drop: 0.5" in Path(loose.policy).read_text()


@pytest.mark.parametrize(("text", "says"), [
    ("version: 1\nbenchmarks:\n  alpha: {tier: blocker, metric: pass@1}\n", "benchmarks.alpha.tier"),
    ("version: 1\ndefaults: {max_drop: -0.1}\n", "max_drop must be >= 0"),
    ("version: 1\nthresholds: {alpha: 0.1}\n", "thresholds"),
    ("version: 2\n", "Unsupported gate policy version"),
    ("benchmarks:\n  alpha: {tier: critical}\n", "alpha: required benchmark must resolve to an explicit metric"),
    ("benchmarks:\n  alpha: {metric: accuracy}\n", "unsupported metric 'accuracy'"),
    ("- alpha\n- beta\n", "must be a YAML mapping"),
])
def test_a_policy_that_is_not_a_valid_gate_policy_is_a_clear_error_and_nel_gate_refuses_it_too(real_run, tmp_path, text, says):
    run = make_run(real_run, tmp_path / "run", {"alpha": half_right()})
    policy = write_policy(tmp_path / "policy.yaml", text)
    with pytest.raises(ToolError, match="not a valid nel gate policy|invalid gate policy|YAML mapping") as failure:
        gate_results(GateResultsInput(baseline=str(run), candidate=str(run), policy=str(policy)))
    assert says in str(failure.value) and str(policy) in str(failure.value)
    done = subprocess.run([str(NEL), "gate", "--policy", str(policy), str(run), str(run), "--format", "json",
                           "--no-report", "--no-strict"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0


def test_a_run_folder_without_benchmarks_or_a_missing_policy_is_a_clear_error(real_run, tmp_path):
    run = make_run(real_run, tmp_path / "run", {"alpha": half_right()})
    policy = write_policy(tmp_path / "policy.yaml", "benchmarks:\n  alpha: {metric: pass@1}\n")
    empty = tmp_path / "empty"
    (empty / "alpha").mkdir(parents=True)
    with pytest.raises(ToolError, match=r"candidate .*empty: no benchmark results \(no eval-\*\.json"):
        gate_results(GateResultsInput(baseline=str(run), candidate=str(empty), policy=str(policy)))
    with pytest.raises(ToolError, match="baseline .*: not a directory"):
        gate_results(GateResultsInput(baseline=str(tmp_path / "nope"), candidate=str(run), policy=str(policy)))
    with pytest.raises(ToolError, match="no such file"):
        gate_results(GateResultsInput(baseline=str(run), candidate=str(run), policy=str(tmp_path / "none.yaml")))


def test_t_quantile_matches_scipy():
    # scipy.stats.t.ppf(0.975, df), from nel-next's venv
    for df, expected in ((1, 12.706204736174694), (5, 2.5705818356363146), (39, 2.022690920036761), (999, 1.9623414611334493)):
        assert t_quantile(0.975, df) == pytest.approx(expected, rel=1e-12)


def test_gate_results_over_a_real_mcp_session(real_run, tmp_path):
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    base = make_run(real_run, tmp_path / "base", {"alpha": half_right()})
    cand = make_run(real_run, tmp_path / "cand", {"alpha": drop(half_right(), 12)})
    policy = write_policy(tmp_path / "policy.yaml", "benchmarks:\n  alpha: {tier: critical, metric: pass@1}\n")
    bad = write_policy(tmp_path / "bad.yaml", "benchmarks:\n  alpha: {tier: critical}\n")

    async def go():
        async with Client(build_server()) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            ok = await client.call_tool("gate_results", {"baseline": str(base), "candidate": str(cand), "policy": str(policy)})
            refused = await client.call_tool("gate_results", {"baseline": str(base), "candidate": str(cand), "policy": str(bad)})
            nel = await client.call_tool("gate_results", {"baseline": str(nel_base), "candidate": str(nel_cand), "policy": str(policy)})
            return tools["gate_results"], ok, refused, nel

    nel_base = _nel_run(tmp_path / "nel", "b0000004", {"alpha": half_right()})
    nel_cand = _nel_run(tmp_path / "nel", "c0000004", {"alpha": drop(half_right(), 12)})
    tool, ok, refused, nel = anyio.run(go)
    assert not nel.is_error and nel.structured_content["verdict"] == "NO-GO"  # NEL 0.2.6 runs, same rewards, same answer
    assert nel.structured_content["benchmarks"][0]["delta_ci_upper"] == ok.structured_content["benchmarks"][0]["delta_ci_upper"]
    assert tool.annotations.read_only_hint and tool.annotations.idempotent_hint
    assert not ok.is_error, ok.content[0].text
    assert ok.structured_content["verdict"] == "NO-GO"
    assert ok.structured_content["benchmarks"][0]["status"] == "BREACH"
    assert refused.is_error and "explicit metric" in refused.content[0].text


def test_a_folder_holding_two_local_runs_is_not_read_as_one_run(real_run, tmp_path):
    """Sub-directories are parts of one run only in nel-next's SLURM layout (nel_eval.sbatch, shard_<i>/): a folder
    of two local runs of the same benchmark must not have one silently stand for both."""
    from quanteval.engines.nel_next.results import next_run_dir
    from quanteval.workflow.results import ExtractScoresInput, ValidateRunInput, extract_scores, validate_run

    folder = tmp_path / "runs"
    for name in ("monday", "tuesday"):
        shutil.copytree(real_run.parent, folder / name)
    assert next_run_dir(str(folder / "monday")) == folder / "monday"
    assert next_run_dir(str(folder)) is None
    assert validate_run(ValidateRunInput(run=str(folder))).verdict == "fail"  # read as NEL 0.2.6 task dirs: no results.yml
    assert all(task.headline is None for task in extract_scores(ExtractScoresInput(run=str(folder))).tasks)


# NEL 0.2.6 runs: `nel gate` cannot read them, so the oracle is `nel gate` on nel-next runs holding the same rewards.

def _nel_run(root: Path, invocation: str, rewards: dict[str, list[float]], *, per_sample: bool = True) -> Path:
    run = make_invocation(root, invocation)
    for index, (task, values) in enumerate(rewards.items()):
        share = sum(values) / len(values)
        make_task(run, task, index, value=share, stderr=math.sqrt(share * (1 - share) / len(values)), count=len(values),
                  limit_samples=None, samples=binary_samples([int(v) for v in values]) if per_sample else None)
    return run


POLICIES = {
    "no-go": ({"alpha": half_right(), "beta": half_right(), "gamma": half_right()},
              {"alpha": drop(half_right(), 12), "beta": drop(half_right(), 2), "gamma": half_right()},
              "version: 1\ndefaults: {max_drop: 0.015}\nbenchmarks:\n  alpha: {tier: critical, metric: pass@1, max_drop: 0.05}\n"
              "  beta: {tier: supporting, metric: pass@1, max_drop: 0.5, max_relative_drop: 0.05, relative_guard_below: 0.9}\n"
              "  gamma: {tier: supporting, metric: mean_reward, max_drop: 0.02}\n", "NO-GO"),
    "go": ({"alpha": half_right(), "beta": half_right(), "gamma": half_right()},
           {"alpha": half_right(), "beta": drop(half_right(), 1), "gamma": drop(half_right(), 15)},
           "version: 1\ndefaults: {tier: supporting, max_drop: 0.2, metric: pass@1}\nbenchmarks:\n"
           "  alpha: {tier: critical, metric: pass@1, max_drop: 0.05}\n  gamma: {tier: advisory, max_drop: 0.01}\n", "GO"),
    "inconclusive-and-missing": ({"few": half_right(6), "close": half_right(), "only_base": half_right()},
                                 {"few": half_right(6), "close": drop(half_right(), 1)},
                                 "version: 1\nbenchmarks:\n  few: {tier: critical, metric: pass@1, max_drop: 0.05}\n"
                                 "  close: {tier: supporting, metric: pass@1, max_drop: 0.05}\n", "INCONCLUSIVE"),
    "missing": ({"alpha": half_right()}, {"alpha": half_right()},
                "version: 1\nbenchmarks:\n  alpha: {tier: critical, metric: pass@1}\n  beta: {tier: critical, metric: pass@1}\n",
                "NO-GO"),
}


@pytest.mark.parametrize("case", sorted(POLICIES))
def test_nel_026_runs_are_gated_as_nel_gate_gates_the_same_rewards(real_run, tmp_path, case):
    base_rewards, cand_rewards, text, verdict = POLICIES[case]
    policy = write_policy(tmp_path / "policy.yaml", text)
    oracle = nel_gate(make_run(real_run, tmp_path / "next-base", base_rewards),
                      make_run(real_run, tmp_path / "next-cand", cand_rewards), policy)
    ours = gate_results(GateResultsInput(baseline=str(_nel_run(tmp_path / "nel", "b0000001", base_rewards)),
                                         candidate=str(_nel_run(tmp_path / "nel", "c0000001", cand_rewards)),
                                         policy=str(policy))).model_dump(mode="json")
    assert ours["verdict"] == oracle["verdict"] == verdict
    assert same_reasons(ours["verdict_reasons"], oracle["verdict_reasons"]) and ours["missing"] == oracle["missing"]
    assert any("NEL 0.2.6" in w for w in ours["warnings"])
    assert [w for w in ours["warnings"] if "NEL 0.2.6" not in w] == oracle["warnings"]
    for our, their in zip(ours["benchmarks"], oracle["benchmarks"], strict=True):
        assert {k: our[k] for k in COMPARED} == {k: their[k] for k in COMPARED}, our["benchmark"]
        for key in NUMBERS:
            assert our[key] == pytest.approx(their[key], abs=2e-6), (our["benchmark"], key)


def test_nel_026_runs_without_per_sample_outputs_decide_only_where_the_unpaired_ci_can(tmp_path):
    """Headline scores and NEL's stderr only: a required benchmark passes or breaches only when the (conservative,
    unpaired) CI of the drop is clear of max_drop."""
    policy = write_policy(tmp_path / "policy.yaml", "version: 1\nbenchmarks:\n"
                          "  close: {tier: critical, metric: pass@1, max_drop: 0.05}\n"
                          "  far: {tier: critical, metric: pass@1, max_drop: 0.05}\n"
                          "  same: {tier: supporting, metric: pass@1, max_drop: 0.1}\n")
    n = 2000
    base = _nel_run(tmp_path, "b0000002", {"close": half_right(n), "far": half_right(n), "same": half_right(n)}, per_sample=False)
    cand = _nel_run(tmp_path, "c0000002", {"close": drop(half_right(n), 20), "far": drop(half_right(n), 500),
                                            "same": half_right(n)}, per_sample=False)
    result = gate_results(GateResultsInput(baseline=str(base), candidate=str(cand), policy=str(policy)))
    by_name = {b.benchmark: b for b in result.benchmarks}
    assert by_name["far"].status == "BREACH" and by_name["far"].delta == pytest.approx(-0.25)
    assert by_name["close"].status == "INSUFFICIENT_EVIDENCE"  # a 1-point drop, but ±6 points of unpaired CI straddle 5
    assert any("Per-sample results" in r for r in by_name["close"].reasons)
    assert by_name["same"].status == "PASS" and by_name["same"].n_paired == 0  # [-0.062, +0.062] within 0.1
    assert result.verdict == "NO-GO"


def test_a_nel_026_run_against_a_nel_next_run_is_refused(real_run, tmp_path):
    policy = write_policy(tmp_path / "policy.yaml", "version: 1\nbenchmarks:\n  alpha: {tier: critical, metric: pass@1}\n")
    nel = _nel_run(tmp_path / "nel", "b0000003", {"alpha": half_right()})
    nxt = make_run(real_run, tmp_path / "next", {"alpha": half_right()})
    with pytest.raises(ToolError, match="different engines"):
        gate_results(GateResultsInput(baseline=str(nel), candidate=str(nxt), policy=str(policy)))


def test_validate_run_says_which_checkpoint_a_nel_next_run_served_or_that_it_went_unchecked(real_run, tmp_path):
    """nel-next records only the served model name. validate_run reads what quanteval recorded at launch (the server's
    model path) and checks it against expected_checkpoint; where nothing was recorded it says the checkpoint went
    unchecked instead of passing in silence."""
    from quanteval.engines.nel_next import nelnext
    from quanteval.workflow.results import ValidateRunInput, validate_run

    run = tmp_path / "run"
    shutil.copytree(real_run.parent, run)
    shutil.rmtree(run / "tiny_add")  # half its answers right: a run whose every answer is wrong is suspect
    shutil.copytree(make_run(real_run, tmp_path / "answers", {"tiny_add": half_right(40)}) / "tiny_add", run / "tiny_add")
    unknown = validate_run(ValidateRunInput(run=str(run)))
    assert unknown.verdict == "pass" and unknown.tasks[0].served_checkpoint is None
    assert any(f.check == "checkpoint" and f.severity == "warning" and "went unchecked" in f.message for f in unknown.tasks[0].findings)
    asked = validate_run(ValidateRunInput(run=str(run), expected_checkpoint=str(tmp_path / "model")))
    assert asked.verdict == "inconclusive" and any("checkpoint" in reason for reason in asked.reasons)

    served, other = tmp_path / "model", tmp_path / "other-model"
    served.mkdir()
    other.mkdir()
    (tmp_path / "link").symlink_to(served)
    nelnext.write_run_facts(run, nelnext.run_facts({"services": {}}, {"checkpoint": str(served), "served": {
        "id": "m", "root": str(served), "max_model_len": 256}}))
    right = validate_run(ValidateRunInput(run=str(run), expected_checkpoint=str(tmp_path / "link")))
    assert right.verdict == "pass"
    assert (right.tasks[0].loaded_checkpoint, right.tasks[0].served_checkpoint) == (str(served), str(served))
    wrong = validate_run(ValidateRunInput(run=str(run), expected_checkpoint=str(other)))
    assert wrong.verdict == "fail" and any(f"served {served}, not {other}" in reason for reason in wrong.reasons)


def _widened(template: Path, folder: Path, problems: int) -> Path:
    """The real run's folder with `problems` problems (its first row repeated under new problem ids)."""
    shutil.copytree(template, folder)
    first = json.loads((folder / "results.jsonl").read_text().splitlines()[0])
    (folder / "results.jsonl").write_text("".join(json.dumps({**first, "problem_idx": i}) + "\n" for i in range(problems)))
    return folder


@pytest.mark.slow
def test_one_interval_per_comparison_in_compare_results_gate_results_and_the_report(real_run, tmp_path):
    """The issue's runs (200 problems, 4 flipped to wrong, 3 to right): compare_results said [-3.00, +2.00] points and
    gate_results [-3.11, +2.11]. Now both (and evaluate_quantization, which calls them) give nel gate's interval,
    also where problems carry categories (clustered SE), and the same advice."""
    from quanteval.workflow.compare import CompareResultsInput, compare_results
    from quanteval.workflow.gate import write_rule_policy

    template = _widened(real_run, tmp_path / "template", 200)
    base = [1.0] * 150 + [0.0] * 50
    cand = [0.0] * 4 + [1.0] * 146 + [1.0] * 3 + [0.0] * 47
    baseline = make_run(template, tmp_path / "base", {"tiny_add": base, "clustered": base}, categories={"clustered": 5})
    candidate = make_run(template, tmp_path / "cand", {"tiny_add": cand, "clustered": cand}, categories={"clustered": 5})
    for run in (baseline, candidate):
        shutil.copy(real_run.parent / "checkpoint.json", run / "checkpoint.json")  # a run, as compare_results reads it
    policy = write_rule_policy(tmp_path / "rule" / "nel-gate-policy.yaml", ["clustered", "tiny_add"], 2, 0.95)
    gate = gate_results(GateResultsInput(baseline=str(baseline), candidate=str(candidate), policy=str(policy)))
    compared = compare_results(CompareResultsInput(baseline=str(baseline), candidate=str(candidate), max_drop=2,
                                                   output_dir=str(tmp_path / "report")))
    oracle = nel_gate(baseline, candidate, policy)
    rows = {row.task: row for row in compared.comparisons}
    for ours, theirs in zip(gate.benchmarks, oracle["benchmarks"], strict=True):
        row = rows[ours.benchmark]
        assert (row.ci_low, row.ci_high) == (ours.delta_ci_lower, ours.delta_ci_upper), ours.benchmark
        assert ours.delta_ci_lower == pytest.approx(theirs["delta_ci_lower"], abs=2e-6)
        assert ours.delta_ci_upper == pytest.approx(theirs["delta_ci_upper"], abs=2e-6)
        assert ours.status == theirs["status"]
        assert row.verdict == {"PASS": "acceptable", "BREACH": "not acceptable", "INSUFFICIENT_EVIDENCE": "inconclusive"}[ours.status]
        assert ours.advice is None if ours.status == "PASS" else ours.advice in row.why  # one piece of advice too
    assert rows["tiny_add"].verdict == "inconclusive" and rows["clustered"].verdict == "acceptable"
    assert (round(100 * rows["tiny_add"].ci_low, 2), round(100 * rows["tiny_add"].ci_high, 2)) == (-3.11, 2.11)
    assert rows["clustered"].ci_low != rows["tiny_add"].ci_low  # the categories were used, in both tools
    assert "[-3.11, +2.11]" in Path(compared.report_markdown).read_text()
    assert gate.verdict == oracle["verdict"] == "INCONCLUSIVE"
    assert any(r.startswith("Action: tiny_add: ~1221 paired problems would decide") for r in gate.verdict_reasons)
