"""The release rules beside accuracy, on real-shaped nel-next run folders (a real `nel eval run`, its per-sample records
set: results.jsonl, inference_log.jsonl): output length (the user's ±N% rule), truncation and failed responses with
their denominators (unverified where the engine does not say, never 0%), repeats that are copies, and what the
quantization bought (weight bytes per side, SIZE_NOT_REDUCED; tokens/s labelled with what measured them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from next_runs import sampled_run
from pydantic import ValidationError
from tiers import requires

from quanteval.engines.nel_next import nelnext
from quanteval.workflow.compare import CompareResultsInput, compare_results

pytestmark = requires("nel-next")
REPO = Path(__file__).resolve().parents[1]
N = 40


def answers(tokens: int = 20, cut: int = 0, right: int = N, repeats: int = 1, response=None) -> list[list[dict]]:
    """N problems; the first `cut` answers end at the length limit; `right` of them scored right."""
    return [[{"reward": 1.0 if p < right else 0.0, "completion_tokens": tokens, "finish_reason": "length" if p < cut else "stop",
              "response": response(p, r) if response else f"answer {p} {r}"} for r in range(repeats)] for p in range(N)]


BF16, W8A8 = REPO / "examples/checkpoints/tiny-add-bf16", REPO / "examples/checkpoints/tiny-add-w8a8"


def compare(real_run, tmp_path, base, cand, temperature=None, **rule):
    """Two comparable runs (the same config and serving recorded) of tiny-add BF16 and W8A8."""
    return compare_results(CompareResultsInput(
        baseline=str(sampled_run(real_run, tmp_path / "base", base, temperature=temperature, checkpoint=BF16)),
        candidate=str(sampled_run(real_run, tmp_path / "cand", cand, temperature=temperature, checkpoint=W8A8)),
        max_drop=5, output_dir=str(tmp_path / "report"), **rule))


def test_a_candidate_that_rambles_is_caught_by_the_length_rule(real_run, tmp_path):
    answer = compare(real_run, tmp_path, answers(tokens=100), answers(tokens=130), max_length_change=5)
    (check,) = answer.outputs
    assert answer.comparisons[0].verdict == "acceptable"  # accuracy alone: nothing lost
    assert answer.acceptability == "not acceptable"
    assert check.length_change == pytest.approx(0.30) and check.blocks == "not acceptable"
    assert check.baseline.mean_completion_tokens == 100 and check.candidate.median_completion_tokens == 130
    said = " ".join(answer.reasons)
    assert "+30.0% mean completion tokens per problem over 40 problems" in said and "beyond the ±5% length rule" in said
    # within the rule, or without one, the length is said and decides nothing
    within = compare(real_run, tmp_path / "w", answers(tokens=100), answers(tokens=103), max_length_change=5)
    assert within.acceptability == "acceptable" and "+3.0% mean completion tokens" in " ".join(within.reasons)


def test_answers_cut_at_max_tokens_on_one_side_block_an_acceptable_verdict_with_the_fix(real_run, tmp_path):
    answer = compare(real_run, tmp_path, answers(), answers(cut=2))  # 2 of 40: 5%, over the 1% default
    (check,) = answer.outputs
    assert (check.candidate.truncated.count, check.candidate.truncated.of) == (2, 40)
    assert check.baseline.truncated.said == "truncated: 0/40 (0.0%)"
    assert answer.comparisons[0].verdict == "acceptable" and answer.acceptability == "inconclusive"
    said = " ".join(answer.reasons)
    assert "the candidate's truncated: 2/40 (5.0%) is over 1%" in said and "Raise max_tokens" in said


def test_no_finish_reasons_is_unverified_never_zero(real_run, tmp_path):
    bare = [[{"reward": 1.0}] for _ in range(N)]  # no inference_log lines: the engine said nothing of them
    answer = compare(real_run, tmp_path, bare, bare)
    (check,) = answer.outputs
    assert check.candidate.truncated.count is None and check.candidate.mean_completion_tokens is None
    assert "truncated: unverified (no finish reasons recorded), not 0%" in " ".join(answer.reasons)
    assert answer.acceptability == "acceptable"  # said, not a failure of the candidate


def test_sampled_repeats_that_are_copies_are_named_and_counted_once(real_run, tmp_path):
    varied = answers(repeats=4, right=20, response=lambda p, r: f"answer {p} take {r}")
    copied = answers(repeats=4, right=20, response=lambda p, r: f"answer {p}")
    answer = compare(real_run, tmp_path, varied, copied, temperature=0.8)
    (check,) = answer.outputs
    assert check.copies == ["candidate"]
    (row,) = answer.comparisons
    assert row.repeats == 1 and "the candidate's 4 repeats are copies: counted as 1 sample per problem" in row.why
    assert "repeats are copies: every problem got one and the same answer in every repeat" in " ".join(answer.reasons)
    assert compare(real_run, tmp_path / "v", varied, varied, temperature=0.8).outputs[0].copies == []
    # greedy repeats are alike by design: not named
    assert compare(real_run, tmp_path / "g", varied, copied, temperature=0.0).outputs[0].copies == []


def test_speed_is_shown_per_side_labelled_with_what_measured_it(real_run, tmp_path):
    base, cand = sampled_run(real_run, tmp_path / "b", answers()), sampled_run(real_run, tmp_path / "c", answers())
    stats = json.loads((base / "bench" / "runtime_stats.json").read_text())
    answer = compare_results(CompareResultsInput(baseline=str(base), candidate=str(cand), output_dir=str(tmp_path / "r")))
    (check,) = answer.outputs
    assert check.baseline.tokens_per_second == stats["tokens_per_second"] > 0
    assert check.baseline.latency_p90_ms == stats["latency_percentiles_ms"]["p90"]
    assert check.candidate.measured_on == "measured on vllm CPU; GPU kernels differ"
    nelnext.write_run_facts(cand, {})  # a run served outside quanteval: no label is guessed
    assert compare_results(CompareResultsInput(baseline=str(base), candidate=str(cand))).outputs[0].candidate.measured_on is None


def test_what_the_quantization_bought_and_a_candidate_that_is_not_smaller(real_run, tmp_path):
    def with_checkpoints(name: str, candidate: str):
        return compare_results(CompareResultsInput(
            baseline=str(sampled_run(real_run, tmp_path / name / "b", answers())),
            candidate=str(sampled_run(real_run, tmp_path / name / "c", answers())), max_drop=5,
            baseline_checkpoint=str(REPO / "examples/checkpoints/tiny-add-bf16"),
            candidate_checkpoint=str(REPO / "examples/checkpoints" / candidate), output_dir=str(tmp_path / name / "r")))

    w8a8 = with_checkpoints("w8a8", "tiny-add-w8a8")
    assert w8a8.weights is not None and not w8a8.weights.size_not_reduced and w8a8.weights.ratio < 0.75
    assert w8a8.acceptability == "acceptable" and "weights on disk: baseline" in " ".join(w8a8.reasons)
    w2 = with_checkpoints("w2", "tiny-add-w2-rtn")
    assert w2.weights is not None and w2.weights.size_not_reduced
    assert w2.acceptability == "not acceptable"
    said = " ".join(w2.reasons)
    assert "SIZE_NOT_REDUCED: the candidate's weights are not smaller" in said and "stored dequantized" in said
    # named whatever the accuracy says: a candidate whose loss is undecided is still told it saved no bytes
    lost = compare_results(CompareResultsInput(
        baseline=str(sampled_run(real_run, tmp_path / "lost" / "b", answers())),
        candidate=str(sampled_run(real_run, tmp_path / "lost" / "c", answers(right=36))), max_drop=5,
        baseline_checkpoint=str(REPO / "examples/checkpoints/tiny-add-bf16"),
        candidate_checkpoint=str(REPO / "examples/checkpoints/tiny-add-w2-rtn"), output_dir=str(tmp_path / "lost" / "r")))
    assert lost.acceptability == "inconclusive" and any(r.startswith("SIZE_NOT_REDUCED") for r in lost.reasons)


def test_one_checkpoint_against_itself_has_no_size_question(real_run, tmp_path):
    # A repeatability or serving check runs the same checkpoint on both sides: not a candidate that saved no bytes.
    itself = compare_results(CompareResultsInput(
        baseline=str(sampled_run(real_run, tmp_path / "b", answers())),
        candidate=str(sampled_run(real_run, tmp_path / "c", answers())), max_drop=5,
        baseline_checkpoint=str(W8A8), candidate_checkpoint=str(W8A8) + "/", output_dir=str(tmp_path / "r")))
    assert itself.weights is None and itself.acceptability == "acceptable"
    assert not any("SIZE_NOT_REDUCED" in reason for reason in itself.reasons)


def test_a_length_rule_that_is_not_a_percentage_is_refused():
    with pytest.raises(ValidationError, match=r"max_length_change 0.05 reads as a fraction: it is a percentage, use 5"):
        CompareResultsInput(baseline="a", candidate="b", max_length_change=0.05)
    with pytest.raises(ValidationError, match=r"max_length_change 250: give a percentage in \(0, 100\]"):
        CompareResultsInput(baseline="a", candidate="b", max_length_change=250)


@pytest.mark.slow
def test_the_gate_keeps_nel_gates_verdict_and_shows_quantevals_rules_beside_it(real_run, tmp_path, capsys):
    """On runs where one side cut 5% of its answers at max_tokens: `nel gate` (the real one) and quanteval's own
    verdict say GO on accuracy; the release verdict beside it is INCONCLUSIVE, with the fix, and is the exit code."""
    import os
    import subprocess

    from next_runs import NEL

    from quanteval.faces import cli
    from quanteval.workflow.gate import GateResultsInput, gate_results, write_rule_policy

    base = sampled_run(real_run, tmp_path / "base", answers(), checkpoint=BF16)
    cand = sampled_run(real_run, tmp_path / "cand", answers(cut=2), checkpoint=W8A8)
    gated = gate_results(GateResultsInput(baseline=str(base), candidate=str(cand), max_drop=5))
    policy = write_rule_policy(tmp_path / "policy.yaml", ["bench"], 5, 0.95)
    theirs = subprocess.run([str(NEL), "gate", "--policy", str(policy), str(base), str(cand), "--format", "json",
                             "--no-report", "--no-strict"], capture_output=True, text=True, timeout=120, check=False,
                            env={**os.environ, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"})
    assert json.loads(theirs.stdout)["verdict"] == gated.verdict == "GO"
    assert gated.release_verdict == "INCONCLUSIVE"
    (check,) = gated.release_rules
    assert check.candidate.truncated.count == 2 and check.blocks == "inconclusive"
    code = cli.main(["gate", str(base), str(cand), "--max-drop", "5"])
    shown = capsys.readouterr().out
    assert code == cli.EXIT_GATE_INCONCLUSIVE and shown.startswith("verdict: GO")
    assert "release rules (quanteval's, beside nel gate's GO): INCONCLUSIVE" in shown and "Raise max_tokens" in shown


def test_the_report_shows_each_sides_answers_and_what_the_quantization_bought(real_run, tmp_path):
    answer = compare(real_run, tmp_path, answers(tokens=100), answers(tokens=130, cut=2), max_length_change=5)
    markdown = Path(answer.report_markdown).read_text()
    assert "## Answers and what the quantization bought" in markdown
    assert "| bench | candidate | 130.0 / 130 | 2/40 (5.0%) | 0/40 (0.0%) |" in markdown
    assert "| bench | change | +30.0% per problem |" in markdown and "weights on disk: baseline" in markdown
    page = Path(answer.report_html).read_text()
    assert "<td>2/40 (5.0%)</td>" in page and "weights on disk: baseline" in page


def test_over_mcp_the_rules_arguments_reach_compare_and_gate_and_their_answers_come_back(real_run, tmp_path):
    """The SDK drops arguments a tool's signature does not name: max_length_change must reach both tools."""
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    base = sampled_run(real_run, tmp_path / "base", answers(tokens=100), checkpoint=BF16)
    cand = sampled_run(real_run, tmp_path / "cand", answers(tokens=130), checkpoint=W8A8)

    async def go():
        async with Client(build_server()) as client:
            arguments = {"baseline": str(base), "candidate": str(cand), "max_drop": 5, "max_length_change": 5}
            return (await client.call_tool("compare_results", arguments | {"output_dir": str(tmp_path / "r")}),
                    await client.call_tool("gate_results", arguments))

    compared, gated = anyio.run(go)
    assert not compared.is_error and not gated.is_error, (compared.content, gated.content)
    assert compared.structured_content["acceptability"] == "not acceptable"
    assert compared.structured_content["outputs"][0]["length_change"] == pytest.approx(0.3)
    assert (gated.structured_content["verdict"], gated.structured_content["release_verdict"]) == ("GO", "NO-GO")


def test_the_chart_has_a_length_and_truncation_panel_a_size_and_speed_panel_and_the_noise_band(real_run, tmp_path):
    from quanteval.workflow.comparison_report import chart_panels, noise_bands, redraw_with_noise
    from quanteval.workflow.noise import NoiseFloor

    answer = compare_results(CompareResultsInput(
        baseline=str(sampled_run(real_run, tmp_path / "b", answers(tokens=100), checkpoint=BF16)),
        candidate=str(sampled_run(real_run, tmp_path / "c", answers(tokens=130, cut=2), checkpoint=W8A8)), max_drop=5,
        baseline_checkpoint=str(BF16), candidate_checkpoint=str(W8A8), output_dir=str(tmp_path / "r")))
    panels = chart_panels(answer.comparisons, answer.outputs, answer.weights)
    assert [p.title for p in panels] == ["Scores", "Delta", "Length and truncation", "Size and speed"]
    length, size = panels[2], panels[3]
    assert (length.labels, length.baseline, length.candidate) == (["bench"], [100.0], [130.0])
    assert length.notes == ["truncated 0.0% / 5.0%"]
    assert size.labels == ["weights on disk", "bench tokens/s"] and size.baseline == [1.0, 1.0]
    assert size.candidate[0] == pytest.approx(answer.weights.ratio, abs=1e-4) and "GB -> " in size.notes[0]
    assert panels[1].bands == [None]  # no noise floor measured: no band
    floor = [NoiseFloor(task="bench", quantization_flips=0, serving_flips=1, serving_delta=-0.005, serving_ci_low=-0.014,
                        serving_ci_high=0.004, within_noise=True, message="")]
    assert chart_panels(answer.comparisons, answer.outputs, answer.weights, noise_bands(floor))[1].bands == [pytest.approx(1.4)]
    png = Path(answer.chart_png)
    before, page = png.read_bytes(), Path(answer.report_html).read_text()
    assert before.startswith(b"\x89PNG")
    redraw_with_noise(answer, 0.05, floor)  # evaluate_quantization's, once its noise floor is measured
    after = png.read_bytes()
    assert after.startswith(b"\x89PNG") and after != before
    import base64
    assert base64.b64encode(after).decode() in Path(answer.report_html).read_text() != page
    # a run without token counts or speed: only the two accuracy panels
    assert [p.title for p in chart_panels(answer.comparisons, [], None)] == ["Scores", "Delta"]


def _vllm_log(device: str, tokens: int, max_model_len: int, gib_consumed: float, gpu: bool) -> str:
    """A server log as vLLM 0.32 prints it: its logger's prefix, then the format strings copied from its source
    (v1/core/kv_cache_utils.py, v1/worker/cpu_worker.py, v1/worker/gpu_model_runner.py, v1/worker/gpu_worker.py)."""
    concurrency = tokens / max_model_len
    lines = ["(EngineCore_DP0 pid=4242) INFO 11-28 04:11:01 [cpu_model_runner.py:68] Starting to load model /m...",
             "(EngineCore_DP0 pid=4242) INFO 11-28 04:11:09 [kv_cache_utils.py:2328] "
             + "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"  # noqa: UP031 (vLLM's own format string)
             % (device, f"{tokens:,}", f"{max_model_len:,}", concurrency)]
    if gpu:
        lines += ["(EngineCore_DP0 pid=4242) INFO 11-28 04:11:05 [gpu_model_runner.py:5150] "
                  + "Model loading took %s GiB memory and %.6f seconds" % (round(gib_consumed, 2), 3.25),  # noqa: UP031 (vLLM's own format string)
                  "(EngineCore_DP0 pid=4242) INFO 11-28 04:11:08 [gpu_worker.py:760] Available KV cache memory: %s GiB" % 61.4]  # noqa: UP031 (vLLM's own format string)
    else:
        lines.append("(EngineCore_DP0 pid=4242) INFO 11-28 04:11:08 [cpu_worker.py:260] "
                     + f"Auto set ({4.0}/{125.7}) GiB for KV cache on node 0, with {6.0} GiB requested memory for the "
                     f"worker. {gib_consumed} GiB memory was consumed by non-kv usages.")
    return "\n".join(lines) + "\n"


def test_served_memory_is_read_from_each_sides_vllm_log_and_unverified_where_it_is_not_printed():
    from quanteval.workflow import release

    cpu = release.served_memory(_vllm_log("CPU", 58240, 2048, 1.73, gpu=False))
    assert (cpu.device, cpu.kv_cache_tokens, cpu.max_concurrency, cpu.kv_cache_gib) == ("CPU", 58240, 28.44, 4.0)
    assert cpu.weights_gib is None and cpu.non_kv_gib == 1.73  # vLLM's CPU runner prints no "Model loading took"
    assert "model memory" not in cpu.said and "non-KV memory 1.73 GiB" in cpu.said
    gpu = release.served_memory(_vllm_log("GPU", 1_203_456, 32768, 8.04, gpu=True))
    assert (gpu.kv_cache_tokens, gpu.weights_gib, gpu.kv_cache_gib) == (1203456, 8.04, 61.4)
    assert gpu.said.startswith("KV cache 1,203,456 tokens (36.73x requests of 32,768 tokens); KV cache 61.4 GiB; model 8.04 GiB")
    nothing = release.served_memory("INFO started\n")
    assert (nothing.kv_cache_tokens, nothing.kv_cache_gib, nothing.weights_gib) == (None, None, None)
    assert nothing.said == "KV cache tokens unverified; KV cache memory unverified; model memory unverified"
    bought = release.served_memory_bought(_vllm_log("CPU", 40000, 2048, 2.5, gpu=False), _vllm_log("CPU", 58240, 2048, 1.73, gpu=False))
    assert "KV cache capacity x1.46" in bought.message and bought.candidate.kv_cache_tokens == 58240
    assert release.served_memory_bought(None, None).baseline.said.endswith("(no server log)")


def test_evaluate_quantization_reads_each_sides_served_memory_from_its_deployments_log(tmp_path):
    from quanteval import ledger
    from quanteval.workflow.evaluate import CheckpointEvaluation, _server_log
    from quanteval.workflow.release import served_memory_bought

    log = tmp_path / "server.log"
    log.write_text(_vllm_log("CPU", 58240, 2048, 1.73, gpu=False))
    served = ledger.add("deployment", status="stopped", details={"log_path": str(log)})
    here = CheckpointEvaluation(role="candidate", checkpoint="c", reused=False, deployment_record_id=served.id)
    gone = ledger.add("deployment", status="stopped", details={"log_path": "/on/the/cluster/server.log"})
    there = CheckpointEvaluation(role="baseline", checkpoint="b", reused=False, deployment_record_id=gone.id)
    bought = served_memory_bought(_server_log(there), _server_log(here))
    assert bought.candidate.kv_cache_tokens == 58240 and bought.baseline.kv_cache_tokens is None
    assert bought.baseline.said.endswith("(no server log)")
    assert _server_log(CheckpointEvaluation(role="baseline", checkpoint="b", reused=True)) is None
