"""The question answered for real, as users ask it: `evaluate_quantization` over a stdio MCP session
(`quanteval-mcp`, spawned as an IDE spawns it) and `quanteval evaluate` on the command line, with the real vLLM
(CPU build) serving the embedded model and its llm-compressor variants and the real nel-next evaluating.
Every verdict is checked against `nel compare` (nel-next's own) on the same run folders.

Four vLLM starts in all (~50 s each): BF16 and int2 RTN for the first verdict, W8A8 for the second, and a BF16 copy
with noise for weights whose canary fails (the BF16 run is reused from the ledger). The first call takes the user's
rule (at most 1.5 points lost at 95%) and writes it as a `nel gate` policy; the others gate under the demo's release
policy (the same rule, NVFP4-release shaped); each release verdict is checked against the real `nel gate`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import anyio
import pytest
from factories import noise_checkpoint
from mcp import Client, StdioServerParameters
from next_runs import nel_json
from processes import running_with
from tiers import BENCH, CHECKPOINTS, REPO, own_lane, requires, user_env

from quanteval.faces.cli import evaluation_exit_code, format_evaluation
from quanteval.workflow.compare import CompareResultsInput, compare_results
from quanteval.workflow.evaluate import EvaluateQuantizationOutput

POLICY = REPO / "examples" / "policies" / "tiny_add_release.yaml"  # the demo's: critical, 1.5 points, as NVFP4 releases

# its "nothing left running" checks name only this module's servers: a vLLM lane of its own, beside the others
pytestmark = [*requires("vllm", "nel-next"), own_lane("vllm-evaluate")]


def _nel_compare(baseline: str | Path, candidate: str | Path) -> dict:
    return nel_json("compare", baseline, candidate)


def _nel_gate(baseline: str | Path, candidate: str | Path, policy: str | Path) -> dict:
    return nel_json("gate", "--policy", policy, baseline, candidate)


def _processes_serving(checkpoint: Path, state: dict[str, str]) -> list[str]:
    """This module's servers of the checkpoint (other vLLM lanes may serve the same tiny-add checkpoints meanwhile)."""
    return running_with("vllm", str(checkpoint), state_dir=json.loads(state["env"])["QUANTEVAL_STATE_DIR"])


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("evaluate-real")
    env = user_env(QUANTEVAL_STATE_DIR=str(root / "state"))
    env.pop("QUANTEVAL_LEDGER", None)
    return {"root": str(root), "policy": str(POLICY), **{"env": json.dumps(env)}}


@pytest.fixture(scope="module")
def lossy(state) -> dict:
    """BF16 vs int2 RTN through a real stdio MCP session, with the progress the client receives."""
    env = json.loads(state["env"])
    messages: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    async def go():
        params = StdioServerParameters(command="quanteval-mcp", args=[], env=env)
        async with Client(params) as client:
            return await client.call_tool("evaluate_quantization", {
                "baseline_checkpoint": str(CHECKPOINTS / "tiny-add-bf16"),
                "candidate_checkpoint": str(CHECKPOINTS / "tiny-add-w2-rtn"),
                "benchmarks": [str(BENCH)], "output_dir": str(Path(state["root"]) / "lossy"), "max_drop": 1.5, "confidence": 0.95,
            }, progress_callback=on_progress)

    result = anyio.run(go)
    assert not result.is_error, result.content[0].text
    return {"result": result.structured_content, "progress": messages}


def test_the_lossy_variant_is_a_regression_and_nel_compare_agrees(lossy, state):
    result = lossy["result"]
    assert result["verdict"] == "not acceptable", result["table_markdown"]
    (row,) = result["comparisons"]
    assert row["baseline"] >= 0.99 and 0.80 <= row["candidate"] <= 0.97  # measured: 100% -> 91.9%
    oracle = _nel_compare(result["baseline"]["run_dir"], result["candidate"]["run_dir"])
    assert row["nel_verdict"] == oracle["verdict"] == "BLOCK"
    summary = oracle["flip_report"]["summary"]
    assert (row["n_regressions"], row["n_improvements"], row["n_paired"]) == (
        summary["n_regressions"], summary["n_improvements"], summary["n_paired"]) and row["n_paired"] == 1000
    flip = row["regressed"][0]  # a flip carries both answers and the expected one
    assert flip["baseline_answer"] != flip["candidate_answer"] and flip["expected"]
    for report in ("report_html", "report_markdown"):
        assert Path(result[report]).is_file()
    assert "tiny_add" in Path(result["report_markdown"]).read_text()
    # what the servers really served, and nothing left running
    assert result["candidate"]["served_context"] == 256
    assert _processes_serving(CHECKPOINTS / "tiny-add-bf16", state) == _processes_serving(CHECKPOINTS / "tiny-add-w2-rtn", state) == []
    # the MCP client saw the workflow's stages as progress
    assert any("canary passed" in m for m in lossy["progress"]) and any("comparing" in m for m in lossy["progress"])


def test_the_users_rule_is_written_as_a_nel_gate_policy_and_nel_gate_on_it_says_no_go_too(lossy, state):
    result = lossy["result"]
    gate, policy = result["gate"], Path(result["policy_path"])
    assert policy.parent == Path(result["report_markdown"]).parent  # next to the report
    assert "max_drop: 0.015" in policy.read_text()  # nel gate's unit: a fraction of the 0-1 score
    for rule in (policy, state["policy"]):  # the written rule, and the demo's hand-written policy saying the same
        oracle = _nel_gate(result["baseline"]["run_dir"], result["candidate"]["run_dir"], rule)
        assert gate["verdict"] == oracle["verdict"] == "NO-GO"
        ((ours,), (theirs,)) = (gate["benchmarks"], oracle["benchmarks"])
        assert (ours["status"], ours["tier"], ours["n_paired"]) == (theirs["status"], theirs["tier"], theirs["n_paired"]) == (
            "BREACH", "critical", 1000)
        assert ours["delta_ci_upper"] == pytest.approx(theirs["delta_ci_upper"], abs=1e-4) and ours["delta_ci_upper"] < -0.015
    # one interval: the report's row, the gate's, and compare_results' on the same two runs
    (row,) = result["comparisons"]
    again = compare_results(CompareResultsInput(baseline=result["baseline"]["run_dir"], candidate=result["candidate"]["run_dir"],
                                                max_drop=1.5, output_dir=str(Path(state["root"]) / "again")))
    assert (row["ci_low"], row["ci_high"]) == (ours["delta_ci_lower"], ours["delta_ci_upper"]) == (
        again.comparisons[0].ci_low, again.comparisons[0].ci_high)
    assert f"[{100 * row['ci_low']:+.2f}, {100 * row['ci_high']:+.2f}]" in Path(result["report_markdown"]).read_text()


def test_the_release_gate_under_a_policy_file_exits_3_on_a_rerun(lossy, state):
    gate = lossy["result"]["gate"]
    assert json.loads(Path(gate["report_path"]).read_text())["verdict"] == "NO-GO"
    # the same question again from the CLI: both runs reused, nothing served, and the gate is the exit code
    done = subprocess.run(
        ["quanteval", "evaluate", str(CHECKPOINTS / "tiny-add-bf16"), str(CHECKPOINTS / "tiny-add-w2-rtn"),
         "--benchmarks", str(BENCH), "--output-dir", str(Path(state["root"]) / "lossy"), "--policy", state["policy"]],
        capture_output=True, text=True, env=json.loads(state["env"]), timeout=300, check=False)
    assert done.returncode == 3, done.stderr[-2000:]  # NO-GO
    assert "(reused)" in done.stdout and "release gate" in done.stdout and "verdict: NO-GO" in done.stdout
    assert "BREACH: tiny_add [critical]" in done.stdout


def test_a_candidate_with_noise_for_weights_fails_its_canary_and_that_is_the_answer(lossy, state, tmp_path):
    """The BF16 model with every linear weight replaced by noise: its canary fails where the baseline's passed with
    the same max_tokens. That is the verdict, anomalous (exit 5), with its answers, not "raise max_tokens"."""
    noise = noise_checkpoint(CHECKPOINTS / "tiny-add-bf16", tmp_path / "tiny-add-noise")
    done = subprocess.run(
        ["quanteval", "evaluate", str(CHECKPOINTS / "tiny-add-bf16"), str(noise), "--benchmarks", str(BENCH),
         "--output-dir", str(Path(state["root"]) / "lossy"), "--max-drop", "1.5", "--json"],
        capture_output=True, text=True, env=json.loads(state["env"]), timeout=900, check=False)
    assert done.returncode == 5, (done.returncode, done.stderr[-3000:])
    result = json.loads(done.stdout)
    assert result["verdict"] == "anomalous" and result["baseline"]["reused"]
    why, *notes = result["reasons"]
    assert "broken quantization or a serving bug" in why and "same settings (max_tokens 128" in why, why
    assert [note for note in notes if note.startswith("Candidate: no quantization")], notes  # noise in BF16: not quantized
    assert len(result["responses"]) == 3 and any(r["response"] for r in result["responses"])
    assert result["candidate"]["canary_record_id"] and result["candidate"]["full_run_record_id"] is None  # no full run
    candidate_server = result["candidate"]["deployment_record_id"]  # the server it was served by, named
    assert candidate_server and result["candidate"]["served_model_name"] and result["candidate"]["serving"]
    assert _processes_serving(noise, state) == []
    # validate_run on that canary says what the verdict says, not "raise max_tokens"
    checked = subprocess.run(["quanteval", "call", "validate_run", "--json", json.dumps({"run": result["candidate"]["canary_record_id"]})],
                             capture_output=True, text=True, env=json.loads(state["env"]), timeout=300, check=False)
    failing = [f["message"] for task in json.loads(checked.stdout)["tasks"] for f in task["findings"] if f["severity"] == "fail"]
    assert failing and all("not a setting to raise" in message and "raise services" not in message for message in failing), failing
    # the same answer as the CLI prints it without --json (a second run would serve the noise again: a failed canary
    # is not reused; the text path itself runs for real in the release-gate test above)
    answer = EvaluateQuantizationOutput.model_validate(result)
    text = format_evaluation(answer)
    assert evaluation_exit_code(answer) == 5
    assert "verdict: anomalous" in text and "candidate answer #" in text


def test_a_broken_policy_is_refused_before_anything_is_served(state, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 2\nbenchmarks: {tiny_add: {tier: critical}}\n")
    done = subprocess.run(
        ["quanteval", "evaluate", str(CHECKPOINTS / "tiny-add-bf16"), str(CHECKPOINTS / "tiny-add-w8a8"),
         "--benchmarks", str(BENCH), "--output-dir", str(tmp_path / "out"), "--policy", str(policy)],
        capture_output=True, text=True, env=json.loads(state["env"]), timeout=120, check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert str(policy) in done.stderr and "version" in done.stderr, done.stderr
    assert "starting vllm" not in done.stderr and not (tmp_path / "out").exists()


def _evaluate_refused(state: dict, tmp_path: Path, benchmark: str) -> str:
    done = subprocess.run(
        ["quanteval", "evaluate", str(CHECKPOINTS / "tiny-add-bf16"), str(CHECKPOINTS / "tiny-add-w8a8"),
         "--benchmarks", benchmark, "--output-dir", str(tmp_path / "out")],
        capture_output=True, text=True, env=json.loads(state["env"]), timeout=180, check=False)
    assert done.returncode == 1 and done.stdout == "", done.stderr[-2000:]
    assert "starting vllm" not in done.stderr and not (tmp_path / "out").exists()  # refused before serving
    return done.stderr


def test_a_skills_benchmark_nel_next_cannot_run_is_refused_before_anything_is_served(state, tmp_path):
    """gsm8k's data is not prepared here (no network): validate_config's rule, asked before the first server starts
    rather than after it (nel-next itself would try to download it for up to 5 minutes)."""
    said = _evaluate_refused(state, tmp_path, "skills://gsm8k")
    assert "benchmarks[0]" in said and "`ns prepare_data gsm8k`" in said and "gsm8k/test.jsonl" in said


@requires("nemo-skills")  # to read the METRICS_TYPE from
def test_a_skills_benchmark_nel_next_would_not_grade_is_refused_too(state, tmp_path):
    said = _evaluate_refused(state, tmp_path, "skills://ifeval")
    assert "benchmarks[0].name" in said and "METRICS_TYPE 'if'" in said and "measuring nothing" in said


def test_w8a8_loses_nothing_and_the_baseline_run_is_reused_from_the_cli(lossy, state):
    env = json.loads(state["env"])
    done = subprocess.run(
        ["quanteval", "evaluate", str(CHECKPOINTS / "tiny-add-bf16"), str(CHECKPOINTS / "tiny-add-w8a8"),
         "--benchmarks", str(BENCH), "--output-dir", str(Path(state["root"]) / "w8a8"), "--json", "--policy", state["policy"]],
        capture_output=True, text=True, env=env, timeout=900, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]  # 0: acceptable, and GO
    result = json.loads(done.stdout)
    assert result["baseline"]["reused"] and not result["candidate"]["reused"]
    assert result["baseline"]["run_dir"] == lossy["result"]["baseline"]["run_dir"]
    assert result["verdict"] == "acceptable"
    (row,) = result["comparisons"]
    oracle = _nel_compare(result["baseline"]["run_dir"], result["candidate"]["run_dir"])
    assert row["nel_verdict"] == oracle["verdict"] == "PASS"
    assert row["n_regressions"] == oracle["flip_report"]["summary"]["n_regressions"] == 0
    gate = _nel_gate(result["baseline"]["run_dir"], result["candidate"]["run_dir"], state["policy"])
    assert result["gate"]["verdict"] == gate["verdict"] == "GO"
    assert result["gate"]["benchmarks"][0]["status"] == gate["benchmarks"][0]["status"] == "PASS"


@pytest.mark.parametrize(("problems", "verdict"), [(15, "INCONCLUSIVE"), (60, "BLOCK")])
def test_fewer_problems_give_the_verdict_nel_compare_gives(lossy, tmp_path, problems, verdict):
    """The same two real runs cut to their first problems: too few pairs must not be called a pass or a block."""
    cut = {}
    for side in ("baseline", "candidate"):
        cut[side] = tmp_path / side
        shutil.copytree(lossy["result"][side]["run_dir"], cut[side])
        results = cut[side] / "tiny_add" / "results.jsonl"
        rows = [json.loads(line) for line in results.read_text().splitlines()]
        results.write_text("".join(json.dumps(r) + "\n" for r in rows if r["problem_idx"] < problems))
    oracle = _nel_compare(cut["baseline"], cut["candidate"])
    ours = compare_results(CompareResultsInput(baseline=str(cut["baseline"]), candidate=str(cut["candidate"]),
                                               output_dir=str(tmp_path / "report")))
    (row,) = ours.comparisons
    assert row.nel_verdict == oracle["verdict"] == verdict
    assert (row.n_regressions, row.n_improvements) == (oracle["flip_report"]["summary"]["n_regressions"],
                                                       oracle["flip_report"]["summary"]["n_improvements"])


def test_a_drop_too_large_for_the_format_is_suspect_serving_not_quantization_loss(lossy, tmp_path):
    """The same real 8.1-point drop, told the candidate is 8-bit (W8A8 loses ~0): suspect, never 'not acceptable'."""
    ours = compare_results(CompareResultsInput(
        baseline=lossy["result"]["baseline"]["run_dir"], candidate=lossy["result"]["candidate"]["run_dir"],
        candidate_checkpoint=str(CHECKPOINTS / "tiny-add-w8a8"), output_dir=str(tmp_path / "report")))
    (row,) = ours.comparisons
    assert ours.acceptability == "suspect" and row.verdict == "suspect"
    assert "8-bit" in row.anomaly and "serving or kernel" in row.anomaly and "chat template" in row.anomaly
    # as run (int2 weights stored dequantized: the format is unknown to the checkpoint), the drop is quantization's
    assert lossy["result"]["comparisons"][0]["anomaly"] is None


def test_a_baseline_far_below_its_reference_score_is_suspect(lossy, tmp_path):
    # the int2 run as "baseline" (91.9) against a published 95.0: 3.1 points off is within the 5-point tolerance...
    swapped = {"baseline": lossy["result"]["candidate"]["run_dir"], "candidate": lossy["result"]["baseline"]["run_dir"]}
    near = compare_results(CompareResultsInput(**swapped, reference_scores={"tiny_add": 95}, output_dir=str(tmp_path / "a")))
    assert near.comparisons[0].reference_check.status == "verified" and near.comparisons[0].verdict != "suspect"
    # ...a published 99.5, 7.6 points above what the baseline reaches, points at its serving or protocol, not quantization
    far = compare_results(CompareResultsInput(**swapped, reference_scores={"tiny_add": 99.5}, output_dir=str(tmp_path / "b")))
    assert far.acceptability == "suspect" and far.comparisons[0].reference_check.status == "failed"
    assert "your baseline scores 91.9 where the published score is 99.5" in far.comparisons[0].reference_check.message
