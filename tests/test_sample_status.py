"""No sample silently scored as wrong (workflow/samples.py), on nel-next runs whose records are real nel eval run rows.

The variants below rewrite one real run's records (tests/next_runs.py) the way nel-next writes them when a request
failed (scoring_details.error_category infra_error, reward 0) or an answer had nothing to extract (extracted_answer
""); the real `nel gate` on the same folders is the number that counts every such problem as wrong. The whole chain
(a stand-in server failing chosen problems for real, evaluate from the CLI, compare and gate over MCP) is the slow
test at the end.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from next_runs import NEL, make_run, write_policy
from results_factory import make_invocation, make_task
from tiers import BENCH, CHECKPOINTS, REPO, requires, user_env

from quanteval.workflow.compare import CompareResultsInput, compare_results
from quanteval.workflow.gate import GateResultsInput, gate_results
from quanteval.workflow.samples import MAX_INFRA_SHARE

N = 40
pytestmark = requires("nel-next")
INFRA = {"error": "Model returned HTTP 500 after retries: Internal Server Error", "error_category": "infra_error",
         "method": "infra_error", "retries_exhausted": 3}


def run(real_run: Path, root: Path, rewards: list[float], *, infra: tuple[int, ...] = (), unscored: tuple[int, ...] = (),
        no_details: bool = False) -> Path:
    """A tiny_add run: each problem's reward; `infra` problems failed as nel-next records a request with no answer,
    `unscored` ones answered with nothing to extract; every other wrong answer is a wrong number."""
    folder = make_run(real_run, root, {"tiny_add": rewards})
    (folder / "checkpoint.json").write_text(json.dumps({"completed_benchmarks": {"tiny_add": {}}, "failed_benchmarks": {}}))
    results = folder / "tiny_add" / "results.jsonl"
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    for index, row in enumerate(rows):
        row["extracted_answer"] = "" if index in unscored else str(row["expected_answer"]) if row["reward"] else "41"
        row["scoring_details"] = dict(INFRA) if index in infra else {"method": "byob_tiny_add", "extracted": row["extracted_answer"]}
        if index in infra:
            row.update(reward=0.0, model_response="", extracted_answer=None)
        if no_details:
            del row["scoring_details"]
    results.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def nel_gate(baseline: Path, candidate: Path, policy: Path) -> dict:
    done = subprocess.run([str(NEL), "gate", "--policy", str(policy), str(baseline), str(candidate), "--format", "json",
                           "--no-report", "--no-strict"], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)["benchmarks"][0]


def compare(baseline: Path, candidate: Path, tmp_path: Path, max_drop: float = 5):
    return compare_results(CompareResultsInput(baseline=str(baseline), candidate=str(candidate), max_drop=max_drop,
                                               output_dir=str(tmp_path / f"report-{candidate.name}")))


RIGHT = [1.0] * N


def test_a_request_that_got_no_answer_leaves_the_pairing_and_nel_gates_number_stands_beside_it(real_run, tmp_path):
    """One infrastructure error in 40 (2.5%, under the share): our interval pairs the other 39 (nothing lost), nel gate
    counts it as a wrong answer (2.5 points lost, its CI crossing the margin): both numbers, and why they differ."""
    baseline = run(real_run, tmp_path / "baseline", RIGHT)
    candidate = run(real_run, tmp_path / "candidate", [0.0] + RIGHT[1:], infra=(0,))
    policy = write_policy(tmp_path / "policy.yaml", "version: 1\nbenchmarks:\n  tiny_add: {tier: critical, metric: pass@1, max_drop: 0.02}\n")

    row = compare(baseline, candidate, tmp_path, max_drop=2).comparisons[0]
    assert row.samples is not None and row.samples.checked
    assert (row.samples.candidate_infra_errors, row.samples.baseline_infra_errors, row.samples.excluded_pairs) == (1, 0, 1)
    assert row.delta == 0 and row.verdict == "acceptable", row.why
    assert "nel gate/nel compare count the dropped pairs as wrong answers: delta -2.50 points" in row.why

    ours, theirs = gate_results(GateResultsInput(baseline=str(baseline), candidate=str(candidate), policy=str(policy))), nel_gate(baseline, candidate, policy)
    gated = ours.benchmarks[0]
    assert (gated.status, gated.n_paired, gated.delta) == ("PASS", N - 1, 0)
    assert theirs["n_paired"] == N and theirs["status"] == "INSUFFICIENT_EVIDENCE"  # the same runs, errors counted wrong
    assert gated.samples is not None and gated.samples.counted_as_wrong == pytest.approx(
        [theirs["delta"], theirs["delta_ci_lower"], theirs["delta_ci_upper"]], abs=2e-6)
    assert any("1 of 40 pair(s) dropped" in reason for reason in gated.reasons), gated.reasons

    # the same failure on the baseline's side: dropped alike (a gain made of it is no gain either)
    swapped = compare(candidate, baseline, tmp_path / "swapped", max_drop=2).comparisons[0]
    assert swapped.samples is not None and (swapped.samples.baseline_infra_errors, swapped.samples.excluded_pairs) == (1, 1)
    assert swapped.delta == 0 and "delta +2.50 points" in swapped.why


def test_infrastructure_errors_above_their_share_refuse_a_verdict_on_both_tools(real_run, tmp_path):
    """A candidate right on every problem its server answered, its server failing 3 of 40 (7.5%, over 5%): no verdict,
    the reason naming the share. With 8 failures nel gate calls the same perfect candidate a breach (NO-GO)."""
    assert 3 / N > MAX_INFRA_SHARE > 1 / N
    baseline = run(real_run, tmp_path / "baseline", RIGHT)
    candidate = run(real_run, tmp_path / "candidate", [0.0] * 3 + RIGHT[3:], infra=(0, 1, 2))
    result = compare(baseline, candidate, tmp_path)
    assert result.comparisons[0].verdict == "inconclusive" and result.acceptability == "inconclusive"
    assert any("infrastructure errors on 3 of 40 pairs (8%, over 5%)" in reason for reason in result.reasons), result.reasons
    policy = write_policy(tmp_path / "policy.yaml", "version: 1\nbenchmarks:\n  tiny_add: {tier: critical, metric: pass@1, max_drop: 0.05}\n")
    gate = gate_results(GateResultsInput(baseline=str(baseline), candidate=str(candidate), policy=str(policy)))
    assert gate.verdict == "INCONCLUSIVE" and gate.benchmarks[0].status == "INSUFFICIENT_EVIDENCE"

    dead = run(real_run, tmp_path / "dead", [0.0] * 8 + RIGHT[8:], infra=tuple(range(8)))
    gate = gate_results(GateResultsInput(baseline=str(baseline), candidate=str(dead), policy=str(policy)))
    assert gate.verdict == "INCONCLUSIVE" and nel_gate(baseline, dead, policy)["status"] == "BREACH"


def test_unparseable_answers_count_as_wrong_and_are_named_per_side(real_run, tmp_path):
    """A candidate wrong on 6 problems, 4 of them answers with nothing to extract: all 6 count (they are the model's),
    and the answer names the 4 apart from the wrong numbers; no pair is dropped."""
    baseline = run(real_run, tmp_path / "baseline", [0.0] + RIGHT[1:], unscored=(0,))
    candidate = run(real_run, tmp_path / "candidate", [0.0] * 6 + RIGHT[6:], unscored=(0, 1, 2, 3))
    result = compare(baseline, candidate, tmp_path)
    row = result.comparisons[0]
    assert row.delta == pytest.approx(-5 / N)
    assert row.samples is not None and (row.samples.candidate_unscored, row.samples.baseline_unscored, row.samples.excluded_pairs) == (4, 1, 0)
    assert "tiny_add: the candidate produced no parseable answer on 4 problem(s), the baseline on 1; counted as wrong" in " ".join(result.reasons)


def test_records_that_cannot_tell_an_error_from_an_answer_say_the_check_was_not_possible(real_run, tmp_path):
    baseline = run(real_run, tmp_path / "baseline", RIGHT, no_details=True)
    candidate = run(real_run, tmp_path / "candidate", RIGHT, no_details=True)
    result = compare(baseline, candidate, tmp_path)
    assert result.comparisons[0].samples is not None and not result.comparisons[0].samples.checked
    assert any("infrastructure errors not checked: results.jsonl records no scoring_details" in r for r in result.reasons)


def test_nel_0_2_6_runs_name_unparseable_answers_and_say_errors_could_not_be_checked(tmp_path):
    """nemo-evaluator's SampleRecord: `answer` null where nothing was extracted; no request status at all."""
    def nel_run(name: str, scores: list[int], no_answer: set[int]) -> Path:
        run_dir = make_invocation(tmp_path / name, "abc123")
        samples = [{"id": f"s{i}", "sub_query_id": 0, "score": score, "generation": "x", "num_generated_tokens": 1,
                    "num_prompt_tokens": 1, "answer": None if i in no_answer else str(i)} for i, score in enumerate(scores)]
        share = sum(scores) / len(scores)
        make_task(run_dir, "gsm8k", 0, value=share, stderr=0.05, count=len(scores), limit_samples=None, samples=samples)
        return run_dir

    baseline = nel_run("baseline", [1] * N, set())
    candidate = nel_run("candidate", [0, 0, 0] + [1] * (N - 3), {0, 1})
    result = compare(baseline, candidate, tmp_path)
    row = result.comparisons[0]
    assert row.samples is not None and not row.samples.checked and row.samples.candidate_unscored == 2
    text = " ".join(result.reasons)
    assert "NEL 0.2.6's per-sample outputs record no request errors" in text
    assert "the candidate produced no parseable answer on 2 problem(s), the baseline on 0" in text


def test_over_mcp_the_same_account_reaches_the_client(real_run, tmp_path):
    from quanteval.faces.server import build_server

    baseline = run(real_run, tmp_path / "baseline", RIGHT)
    candidate = run(real_run, tmp_path / "candidate", [0.0, 0.0] + RIGHT[2:], infra=(0,), unscored=(1,))

    async def go() -> dict:
        async with Client(build_server()) as client:
            answer = await client.call_tool("compare_results", {"baseline": str(baseline), "candidate": str(candidate),
                                                                "max_drop": 5, "output_dir": str(tmp_path / "mcp")})
            return answer.structured_content

    samples = anyio.run(go)["comparisons"][0]["samples"]
    assert samples["excluded_pairs"] == 1 and samples["candidate_infra_errors"] == 1 and samples["candidate_unscored"] == 1
    assert samples["counted_as_wrong"][0] == pytest.approx(-2 / N)


# ---------------------------------------------------------------- the chain, for real

FAULTS = ["--fake-fault-model", "tiny-add-w8a8", "--fake-fault", r"500@^99\+", "--fake-fault", r"disconnect@^97\+",
          "--fake-fault", r"garbled@^98\+"]


@requires("slow")  # two canaries and two 1000-problem runs through the stand-in; nel-next retries each failure twice (15 s)
def test_a_server_failing_chosen_problems_gets_them_counted_excluded_and_named_from_the_cli_and_over_mcp(tmp_path):
    """The candidate's server answers HTTP 500 on the 9 problems 99+x, drops the connection on the 6 problems 97+x and
    answers nothing parseable on the 11 problems 98+x (none in the canary's first 10): nel-next records 15 infra errors
    and 11 unparseable answers. evaluate (the CLI) pairs 985 problems, counts the 11 as the model's, and shows nel gate's
    number beside its own; compare and gate over MCP on the same runs say the same."""
    from quanteval.faces.server import build_server

    standin = [sys.executable, str(REPO / "tests" / "standins" / "fake_inference_server.py"), "--fake-answers", "sum",
               "--fake-load-s", "0.2", *FAULTS]
    env = user_env(QUANTEVAL_VLLM_LAUNCHER=shlex.join(standin), NEMO_EVALUATOR_TELEMETRY_LEVEL="0")
    done = subprocess.run(["quanteval", "evaluate", str(CHECKPOINTS / "tiny-add-bf16"), str(CHECKPOINTS / "tiny-add-w8a8"),
                           "--benchmarks", str(BENCH), "--output-dir", str(tmp_path / "out"), "--max-drop", "2", "--json"],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode in (0, 3, 4), done.stderr[-3000:]
    answer = json.loads(done.stdout)
    row = answer["comparisons"][0]
    samples = row["samples"]
    assert (samples["candidate_infra_errors"], samples["baseline_infra_errors"], samples["excluded_pairs"]) == (15, 0, 15)
    assert (samples["candidate_unscored"], samples["baseline_unscored"]) == (11, 0)
    assert row["delta"] == pytest.approx(-11 / 985, abs=1e-6)  # the 11 unparseable answers, over the 985 pairs kept
    assert samples["counted_as_wrong"][0] == pytest.approx(-26 / 1000, abs=1e-6)  # nel gate's: all 26 counted wrong
    # [-1.8, -0.5] stays above -2 points; nel gate's [-3.6, -1.6] does not, and nel compare blocks on 26 "regressions"
    assert answer["verdict"] == "acceptable" and answer["gate"]["verdict"] == "GO", answer["reasons"]
    assert "nel compare: BLOCK" in row["why"]
    text = " ".join(answer["reasons"])
    assert "15 of 1000 pair(s) dropped" in text and "no parseable answer on 11 problem(s), the baseline on 0" in text

    base_dir, cand_dir = answer["baseline"]["run_dir"], answer["candidate"]["run_dir"]
    policy = write_policy(tmp_path / "policy.yaml", "version: 1\nbenchmarks:\n  tiny_add: {tier: critical, metric: pass@1, max_drop: 0.02}\n")

    async def go() -> tuple[dict, dict]:
        async with Client(build_server()) as client:
            compared = await client.call_tool("compare_results", {"baseline": base_dir, "candidate": cand_dir, "max_drop": 2,
                                                                  "output_dir": str(tmp_path / "mcp")})
            gated = await client.call_tool("gate_results", {"baseline": base_dir, "candidate": cand_dir, "policy": str(policy)})
            return compared.structured_content, gated.structured_content

    compared, gated = anyio.run(go)
    assert compared["comparisons"][0]["samples"] == samples
    assert gated["verdict"] == "GO" and gated["benchmarks"][0]["n_paired"] == 985
    assert nel_gate(Path(base_dir), Path(cand_dir), policy)["status"] == "INSUFFICIENT_EVIDENCE"
