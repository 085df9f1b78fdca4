"""A run whose every scored answer is wrong (or a multiple-choice score at chance) is suspect, never "pass": validate_run
says so with the likely causes, for both engines (one rule, runresults.implausible_score), and the canary gate refuses
the full run on such a canary unless the person accepts it (launch_full_run's allow_suspect_canary, with a reason).

Seen by an assistant over MCP: a base-model completions config scored 0 of 200, validate_run passed it and the canary
gate opened at 0 of 10."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import pytest
from factories import next_config_against
from mcp import Client
from next_runs import make_run, standin_server
from results_factory import make_invocation, make_task
from tiers import requires

from quanteval import ledger
from quanteval.engines.runresults import LIKELY_CAUSES
from quanteval.faces.server import build_server
from quanteval.models import ToolError
from quanteval.workflow import runs
from quanteval.workflow.results import ValidateRunInput, validate_run


def _run(real_run: Path, dest: Path, rewards: list[float] | None) -> Path:
    """A copy of the real run directory (checkpoint.json and all) with tiny_add's rewards set (None: every answer wrong)."""
    shutil.copytree(real_run.parent, dest)
    shutil.rmtree(dest / "tiny_add")
    shutil.copytree(make_run(real_run, dest.with_name(dest.name + "-benchmarks"), {"tiny_add": rewards}) / "tiny_add",
                    dest / "tiny_add")
    return dest


def _mcp(*calls: tuple[str, dict]) -> list:
    async def go():
        async with Client(build_server()) as client:
            return [await client.call_tool(name, arguments) for name, arguments in calls]

    return anyio.run(go)


def _suspect(report) -> str:
    (finding,) = [f for task in report.tasks for f in task.findings if f.check == "implausible_score"]
    assert finding.severity == "suspect"
    return finding.message


def test_a_nel_next_run_with_every_answer_wrong_is_suspect_with_its_causes_over_mcp(real_run, tmp_path):
    """The real `nel eval run` of tiny_add against a stand-in that answers "hello": 0 of 40."""
    wrong = _run(real_run, tmp_path / "wrong", None)
    half = _run(real_run, tmp_path / "half", [1.0, 0.0] * 20)
    (answered,) = _mcp(("validate_run", {"run": str(wrong)}))
    assert not answered.is_error, answered.content[0].text
    report = answered.structured_content
    assert report["verdict"] == "suspect", report
    message = next(f["message"] for t in report["tasks"] for f in t["findings"] if f["check"] == "implausible_score")
    assert message.startswith("every one of the 40 scored answers is wrong (score 0)")
    assert all(cause in message for cause in LIKELY_CAUSES) and any("every one of the 40" in r for r in report["reasons"])
    evidence = next(f["evidence"] for t in report["tasks"] for f in t["findings"] if f["check"] == "implausible_score")
    assert evidence and "expected" in evidence[0]["text"] and "hello" in evidence[0]["text"].lower()
    assert validate_run(ValidateRunInput(run=str(half))).verdict == "pass"


def test_a_nel_026_task_at_zero_or_at_chance_over_enough_answers_is_suspect_and_above_chance_passes(tmp_path):
    """gpqa's recipe knows its four choices: 24 points over 80 answers is no better than picking at random; over a
    canary's 10 it says nothing (a model at 40% scores that low in one draw of six), and 0 is every answer wrong."""
    def run(name: str, value: float, count: int = 10) -> Path:
        return make_task(make_invocation(tmp_path / name), "ns_gpqa", metric="pass@1[avg-of-5]", score="symbolic_correct",
                         value=value, count=count, limit_samples=count)

    zero, chance, small, weak = (validate_run(ValidateRunInput(run=str(run(*args)))) for args in
                                 (("zero", 0.0), ("chance", 24.0, 80), ("small", 20.0), ("weak", 40.0, 80)))
    assert zero.verdict == "suspect" and _suspect(zero).startswith("every one of the 10 scored answers is wrong")
    assert "The run asked through the chat endpoint." in _suspect(zero)
    assert chance.verdict == "suspect" and _suspect(chance).startswith(
        "the score 24.0 sits at or below chance (25.0 for 4 choices) over 80 scored answers")
    assert small.verdict == "pass", small.reasons
    assert weak.verdict == "pass", weak.reasons


def test_a_failed_run_stays_failed_and_a_score_without_choices_is_judged_by_zero_only(tmp_path):
    """fail outranks suspect; a benchmark whose choices no recipe knows is suspect only at 0."""
    failed = make_task(make_invocation(tmp_path / "failed"), "ns_gpqa", metric="pass@1[avg-of-5]", score="symbolic_correct",
                       value=0.0, count=10, limit_samples=10, status_codes={"200": 5, "500": 5})
    assert validate_run(ValidateRunInput(run=str(failed))).verdict == "fail"
    low = make_task(make_invocation(tmp_path / "low"), "some_task", value=0.05, count=10, limit_samples=10)
    assert validate_run(ValidateRunInput(run=str(low))).verdict == "pass"


def _next_config(tmp_path: Path) -> str:
    return next_config_against(tmp_path, "http://127.0.0.1:9/v1/completions", model_type="base", model="tiny")


def _canary_of(config: str, run_dir: Path) -> ledger.Record:
    """A finished nel-next canary of this config, as the ledger keeps one (its results: run_dir)."""
    from quanteval.engines import launchplan

    plan = launchplan.plan(config, [])
    composed = plan.engine.run.compose(plan)
    return ledger.add("canary", status="succeeded", config_path=config, config_hash=composed.config_hash,
                      invocation_id="suspect-canary", executor="local",
                      details={"engine": "nel-next", "run_dir": str(run_dir), "pgid": 0,
                               "tasks": composed.tasks})


def test_the_gate_refuses_a_full_run_on_a_suspect_canary_over_mcp_unless_the_person_accepts_it(real_run, tmp_path):
    config = _next_config(tmp_path)
    canary = _canary_of(config, _run(real_run, tmp_path / "canary", None))
    refused, unexplained = _mcp(("launch_full_run", {"config_path": config}),
                                ("launch_full_run", {"config_path": config, "allow_suspect_canary": True}))
    assert refused.is_error
    said = refused.content[0].text
    assert f"the canary of this config (hash {canary.config_hash}) ran, but its score is suspect" in said
    assert "every one of the 40 scored answers is wrong" in said and "allow_suspect_canary=true and a reason" in said
    assert unexplained.is_error and "allow_suspect_canary: a full run on a suspect canary needs a written reason" in \
        unexplained.content[0].text
    assert ledger.find(kind="full_run") == []
    assert ledger.get(canary.id).details["validation_passed"] is False
    # accepted by the person: the gate vouches, and says on what
    gate, vouching = runs._gate(canary.config_hash or "", [], lambda *args: None, allow_suspect=True)
    assert vouching == canary.id and gate.startswith(f"canary {canary.id} (suspect-canary) suspect, accepted by the person (allow_suspect_canary)")
    with pytest.raises(ToolError, match="its score is suspect"):
        runs._gate(canary.config_hash or "", [], lambda *args: None)


@requires("nel-next", "slow")  # a real nel-next canary: ~30 s
def test_a_real_canary_whose_model_answers_nothing_gradable_is_suspect_and_closes_the_gate(tmp_path):
    """End to end: a real `nel eval run` canary against a served model (the stand-in: every answer "hello"), then
    validate_run and launch_full_run over MCP as the assistant called them."""
    from quanteval.workflow.nelconfig import SetConfigValueInput, set_config_value
    from quanteval.workflow.runs import LaunchCanaryInput, WaitForRunInput, launch_canary, wait_for_run

    with standin_server("--model", "tiny", "--served-model-name", "tiny") as port:
        config = _next_config(tmp_path)
        set_config_value(SetConfigValueInput(config_path=config, key="services.model.url",
                                             value=f"http://127.0.0.1:{port}/v1/completions"))
        canary = launch_canary(LaunchCanaryInput(config_path=config, limit_samples=5))
        assert wait_for_run(WaitForRunInput(record_id=canary.record_id, timeout_s=240)).status == "succeeded"
        validated, gated = _mcp(("validate_run", {"run": canary.record_id}), ("launch_full_run", {"config_path": config}))
    assert validated.structured_content["verdict"] == "suspect", json.dumps(validated.structured_content)[:2000]
    assert "The run asked through completions." in validated.structured_content["reasons"][0]
    assert gated.is_error and "every one of the 5 scored answers is wrong" in gated.content[0].text
    assert ledger.find(kind="full_run") == []


def test_a_candidate_canary_whose_requests_got_no_answer_is_an_error_of_the_serving_not_anomalous(real_run, tmp_path):
    """Seen on the cluster: the candidate's canary asked a port no server held any more (10 of 10 infra_error). A
    canary whose every answer is wrong is the verdict's to judge against the baseline's (CanaryFailed: ANOMALOUS);
    one whose requests got no answer says nothing about the checkpoint and stays an error naming them."""
    from quanteval.workflow import evaluate

    config = _next_config(tmp_path)
    unanswered = _run(real_run, tmp_path / "unanswered", None)
    bundle_path = next((unanswered / "tiny_add").glob("eval-*.json"))
    bundle = json.loads(bundle_path.read_text())
    rows = bundle["benchmark"]["samples"]
    bundle["benchmark"]["scores"]["failures"] = {"total_steps": rows, "total_failures": rows, "failure_rate": 1.0,
                                                 "categories": {"infra_error": {"count": rows, "percentage": 1.0}}}
    bundle_path.write_text(json.dumps(bundle))
    with pytest.raises(evaluate.RequestsUnanswered, match=f"{rows} requests got no answer .*infra_error {rows}"):
        evaluate._require_canary_pass(_canary_of(config, unanswered), "candidate canary", config)
    with pytest.raises(evaluate.CanaryFailed, match="every one of the 40 scored answers is wrong"):
        evaluate._require_canary_pass(_canary_of(config, _run(real_run, tmp_path / "wrong", None)), "candidate canary", config)
