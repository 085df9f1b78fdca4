"""The real vLLM (CPU build, .venv-vllm from scripts/setup) through launch_deployment / deployment_status /
stop_deployment, on the embedded model and its llm-compressor variants. Two server starts in all (~50 s each)."""

from __future__ import annotations

import json
import re
import shutil
import socket
from pathlib import Path

import httpx
import pytest
from tiers import CHECKPOINTS, REPO, requires

from quanteval.localproc import free_port, group_members
from quanteval.models import ToolError
from quanteval.serving.deploy import (
    DeploymentStatusInput,
    LaunchDeploymentInput,
    PlanDeploymentInput,
    StopDeploymentInput,
    deployment_status,
    launch_deployment,
    plan_deployment,
    stop_deployment,
)

W8A8 = CHECKPOINTS / "tiny-add-w8a8"

pytestmark = requires("vllm")


def _chat(url: str, model: str, content: str, **extra) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0, **extra}
    return httpx.post(url, json=body, timeout=60, trust_env=False)


def _use_ledger(monkeypatch: pytest.MonkeyPatch, state: Path) -> None:
    monkeypatch.setenv("QUANTEVAL_STATE_DIR", str(state))
    monkeypatch.setenv("QUANTEVAL_LEDGER", str(state / "ledger.sqlite3"))


@pytest.fixture(scope="module")
def w8a8(tmp_path_factory: pytest.TempPathFactory):
    """One real vLLM of the W8A8 variant for the tests below, recorded in its own ledger (each test has its own
    otherwise); its request log shows each request's SamplingParams."""
    state = tmp_path_factory.mktemp("w8a8-state")
    with pytest.MonkeyPatch.context() as monkeypatch:
        _use_ledger(monkeypatch, state)
        plan = plan_deployment(PlanDeploymentInput(checkpoint=str(W8A8), framework="vllm", port=free_port(), extra_args=["--enable-log-requests"]))
        assert plan.device == "cpu" and plan.parser_check.ok, plan.parser_check.message
        assert plan.parser_check.resolved["quantization"] == "compressed-tensors"
        assert plan.parser_check.resolved["max_model_len"] == 256 and not [w for w in plan.warnings if w.level == "error"]
        launched = launch_deployment(LaunchDeploymentInput(plan=plan))
        try:
            status = deployment_status(DeploymentStatusInput(record_id=launched.record_id, wait_s=240))
            assert status.status == "ready", (status.message, status.log_tail)
            yield launched, status, state
        finally:
            stop_deployment(StopDeploymentInput(record_id=launched.record_id, grace_s=20))


def test_w8a8_serves_for_real_and_reports_what_it_serves(w8a8):
    _, status, _ = w8a8
    assert status.served_models == ["tiny-add-w8a8"] and status.served_context == 256
    assert status.served_quantization == "compressed-tensors"
    # the chat template the model was trained on is what the server renders: the answer is right
    reply = _chat(status.endpoint_url, "tiny-add-w8a8", "17+58", max_tokens=8)
    assert reply.json()["choices"][0]["message"]["content"] == "75"
    # vLLM's own 400 for a budget above the served context: the rule validate_config enforces before a run
    too_long = _chat(status.endpoint_url, "tiny-add-w8a8", "17+58", max_tokens=1000)
    assert too_long.status_code == 400 and "max_model_len=256" in too_long.text


def _sampling_logged(log: str) -> list[str]:
    return re.findall(r"SamplingParams\((.*?)\)", log)


def test_the_sampling_a_nel_next_config_takes_from_the_checkpoint_reaches_vllm(w8a8, tmp_path):
    """temperature/top_p (nel-next's generation) and top_k (no nel-next field: the adapter proxy's extra_body) as
    apply_checkpoint writes them from generation_config.json, checked in vLLM's own request log, not in our config."""
    from quanteval.workflow.nelconfig import ApplyCheckpointInput, BuildConfigInput, SetConfigValueInput, apply_checkpoint, build_config, set_config_value
    from quanteval.workflow.runs import LaunchCanaryInput, WaitForRunInput, launch_canary, wait_for_run
    from quanteval.workflow.validation import ValidateConfigInput, validate_config

    launched, status, _ = w8a8
    sampling_model = tmp_path / "tiny-add-w8a8"  # the same weights, with a model card's recommended sampling
    shutil.copytree(W8A8, sampling_model)
    (sampling_model / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}))
    config = build_config(BuildConfigInput(engine="nel-next", execution="local", deployment="none", model_type="chat_reasoning",
                                           benchmarks=[str(REPO / "examples" / "benchmarks" / "tiny_add.py")],
                                           config_path=str(tmp_path / "eval.yaml"))).config_path
    set_config_value(SetConfigValueInput(config_path=config, key="services.model.url", value=status.endpoint_url))
    set_config_value(SetConfigValueInput(config_path=config, key="services.model.model", value="tiny-add-w8a8"))
    applied = apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(sampling_model)))
    assert "services.model.proxy.extra_body.top_k: None -> 20 (the checkpoint's generation_config.json)" in applied.changes
    assert "services.model.generation.top_p: None -> 0.95 (the checkpoint's generation_config.json)" in applied.changes
    assert any("Kept services.model.generation.temperature = 0.0" in note for note in applied.notes)  # build_config's greedy choice
    set_config_value(SetConfigValueInput(config_path=config, key="services.model.generation.temperature", value=0.6))
    report = validate_config(ValidateConfigInput(config_path=config))
    assert report.valid, report.problems

    before = len(_sampling_logged(Path(launched.log_path).read_text(errors="replace")))
    run = launch_canary(LaunchCanaryInput(config_path=config, limit_samples=4))
    finished = wait_for_run(WaitForRunInput(record_id=run.record_id, timeout_s=240))
    assert finished.status == "succeeded", finished
    logged = _sampling_logged(Path(launched.log_path).read_text(errors="replace"))[before:]
    assert len(logged) == 4, logged
    for params in logged:
        assert "temperature=0.6," in params and "top_p=0.95," in params and "top_k=20," in params, params
        assert "max_tokens=192," in params, params  # apply_checkpoint's budget: the 256-token context less the prompt reserve


def test_the_nel_next_chain_tool_by_tool_over_mcp_against_the_real_server(w8a8, tmp_path):
    """What an IDE does through MCP: build_config -> apply_checkpoint -> validate_config -> dry_run -> launch_canary ->
    wait_for_run -> run_logs -> validate_run -> launch_full_run (gated by that canary) -> extract_scores ->
    compare_results, for a baseline and a candidate config against the real vLLM, with nel-next running each run."""
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    _, status, _ = w8a8
    bench = str(REPO / "examples" / "benchmarks" / "tiny_add.py")

    async def chain() -> dict:
        seen: dict = {}
        async with Client(build_server()) as client:
            async def call(tool: str, **arguments) -> dict:
                result = await client.call_tool(tool, arguments)
                assert not result.is_error, f"{tool}: {result.content[0].text}"
                return result.structured_content

            for role in ("baseline", "candidate"):
                config = (await call("build_config", engine="nel-next", execution="local", deployment="none", model_type="chat_reasoning",
                                     benchmarks=[bench], config_path=str(tmp_path / f"{role}.yaml")))["config_path"]
                await call("set_config_value", config_path=config, key="services.model.url", value=status.endpoint_url)
                await call("set_config_value", config_path=config, key="services.model.model", value="tiny-add-w8a8")
                await call("set_config_value", config_path=config, key="output.dir", value=str(tmp_path / f"{role}-results"))
                # 100 of the 1000 problems: what is checked here is the chain, not the score (whole runs: test_evaluate_real)
                await call("set_config_value", config_path=config, key="benchmarks[0].max_problems", value=100)
                applied = await call("apply_checkpoint", config_path=config, checkpoint=str(W8A8))
                assert applied["missing_values"] == []
                assert (await call("validate_config", config_path=config))["valid"]
                dry = await call("dry_run", config_path=config)
                assert dry["ok"], dry
                canary = await call("launch_canary", config_path=config, limit_samples=5)
                waited = await call("wait_for_run", record_id=canary["record_id"], timeout_s=240)
                assert waited["status"] == "succeeded", waited
                logs = await call("run_logs", record_id=canary["record_id"], lines=20)
                assert logs  # the canary's own log comes back
                assert (await call("validate_run", run=canary["record_id"]))["verdict"] == "pass"
                full = await call("launch_full_run", config_path=config)
                assert full["gate"] and canary["record_id"] in full["gate"]
                done = await call("wait_for_run", record_id=full["record_id"], timeout_s=300)
                assert done["status"] == "succeeded", done
                seen[role] = {"full": full["record_id"], "scores": await call("extract_scores", run=full["record_id"])}
            seen["compare"] = await call("compare_results", baseline=seen["baseline"]["full"], candidate=seen["candidate"]["full"], max_drop=2,
                                         output_dir=str(tmp_path / "compare"))
        return seen

    seen = anyio.run(chain)
    for role in ("baseline", "candidate"):
        (task,) = seen[role]["scores"]["tasks"]
        assert task["scores"][0]["value"] == 1.0, task  # the W8A8 variant adds every held-out pair right
    compared = seen["compare"]
    assert compared["comparability"] == "comparable" and compared["acceptability"] == "acceptable", compared["reasons"]


def test_a_chat_model_asked_through_completions_is_a_suspect_canary_and_the_gate_stays_shut(w8a8, tmp_path):
    """The issue's path over MCP against real vLLM: a config built for a base model (protocol completions), a
    checkpoint trained with its chat template (apply_checkpoint keeps the person's completions, with a warning), a
    canary whose answers the scorer cannot read: validate_run says suspect with the causes, launch_full_run refuses."""
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    _, status, _ = w8a8
    bench = str(REPO / "examples" / "benchmarks" / "tiny_add.py")

    async def chain() -> dict:
        async with Client(build_server()) as client:
            async def call(tool: str, **arguments):
                return await client.call_tool(tool, arguments)

            config = (await call("build_config", engine="nel-next", execution="local", deployment="none", model_type="base",
                                 benchmarks=[bench], config_path=str(tmp_path / "base.yaml"))).structured_content["config_path"]
            for key, value in {"services.model.url": status.endpoint_url.replace("/chat/completions", "/completions"),
                               "services.model.model": "tiny-add-w8a8", "output.dir": str(tmp_path / "results")}.items():
                await call("set_config_value", config_path=config, key=key, value=value)
            applied = (await call("apply_checkpoint", config_path=config, checkpoint=str(W8A8))).structured_content
            canary = (await call("launch_canary", config_path=config, limit_samples=10)).structured_content
            waited = (await call("wait_for_run", record_id=canary["record_id"], timeout_s=240)).structured_content
            return {"applied": applied, "waited": waited, "validated": (await call("validate_run", run=canary["record_id"])),
                    "full": await call("launch_full_run", config_path=config)}

    seen = anyio.run(chain)
    assert any(note.startswith("Kept services.model.protocol = completions") for note in seen["applied"]["notes"])
    assert seen["waited"]["status"] == "succeeded", seen["waited"]
    report = seen["validated"].structured_content
    assert report["verdict"] == "suspect", report
    assert "every one of the 10 scored answers is wrong" in report["reasons"][0] and "The run asked through completions." in \
        report["reasons"][0]
    assert seen["full"].is_error and "allow_suspect_canary=true and a reason" in seen["full"].content[0].text


def test_the_server_runs_with_quantevals_cpu_environment_in_two_processes(w8a8):
    """frameworks.VLLM_CPU_ENV reaches the server launch_deployment starts, and through it the engine core vLLM spawns
    (a spawned child gets its parent's environment; the engine's own /proc environ is overwritten by its process
    title): the model's one worker inside the engine (two processes serve, not three), its OpenMP threads (torch's
    libgomp, which vLLM preloads) sleeping when idle instead of spinning on the cores the rest of an evaluation needs."""
    from quanteval.serving.frameworks import VLLM_CPU_ENV

    launched, _, _ = w8a8

    def read(pid: int, name: str) -> list[str]:
        return Path(f"/proc/{pid}/{name}").read_bytes().decode(errors="replace").split("\0")

    commands = {pid: read(pid, "cmdline") for pid in group_members(launched.pid)}  # also launch's shell and its sleep
    serving = {pid: command for pid, command in commands.items()  # the venv's Pythons, the engine by its process title
               if (command[0].startswith("VLLM::") or ".venv-vllm" in command[0]) and "resource_tracker" not in " ".join(command)}
    (api_server,) = [pid for pid, command in serving.items() if "vllm.entrypoints.openai.api_server" in command]
    assert len(serving) == 2 and any(command[0].startswith("VLLM::EngineCore") for command in serving.values()), commands
    env = dict(item.split("=", 1) for item in read(api_server, "environ") if "=" in item)
    assert {key: env.get(key) for key in VLLM_CPU_ENV} == VLLM_CPU_ENV and env["OMP_WAIT_POLICY"] == "PASSIVE"


def test_stopping_leaves_no_process_behind(w8a8, monkeypatch):
    launched, _, state = w8a8
    _use_ledger(monkeypatch, state)
    stopped = stop_deployment(StopDeploymentInput(record_id=launched.record_id, grace_s=20))
    assert stopped.stopped and stopped.remaining_pids == []
    assert group_members(launched.pid) == []  # the API server, engine core and worker processes are all gone
    assert deployment_status(DeploymentStatusInput(record_id=launched.record_id)).status == "stopped"


def test_a_head_size_the_cpu_has_no_kernel_for_is_refused_before_launch_and_explained_if_forced(tmp_path):
    # llama-tiny-bf16 has head_dim 16; give it the embedded tokenizer so vLLM gets as far as the attention kernel.
    checkpoint = tmp_path / "head16"
    shutil.copytree(CHECKPOINTS / "llama-tiny-bf16", checkpoint)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(CHECKPOINTS / "tiny-add-bf16" / name, checkpoint / name)
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework="vllm", port=free_port()))
    errors = [w.message for w in plan.warnings if w.level == "error"]
    assert errors and "head_dim 16" in errors[0], plan.warnings
    with pytest.raises(ToolError, match="head_dim 16.*force=true"):
        launch_deployment(LaunchDeploymentInput(plan=plan))

    # Forced: vLLM's CPU engine reports healthy, then dies at the first request. The status must not say ready.
    launched = launch_deployment(LaunchDeploymentInput(plan=plan, force=True))
    try:
        status = deployment_status(DeploymentStatusInput(record_id=launched.record_id, wait_s=240))
        assert status.status == "failed", (status.message, status.log_tail)
        assert any("head size" in f.meaning for f in status.failures), status.failures
        assert "head_dim=16" in status.failures[0].line
    finally:
        assert stop_deployment(StopDeploymentInput(record_id=launched.record_id, grace_s=20)).stopped
    assert group_members(launched.pid) == []


def test_w4a16_needs_a_kernel_some_cpu_builds_lack_and_the_plan_says_which_this_one_is():
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(CHECKPOINTS / "tiny-add-w4a16"), framework="vllm"))
    has_kernel = plan.parser_check.this_machine["vllm_cpu_gemm_wna16"]
    errors = [w.message for w in plan.warnings if w.level == "error"]
    if has_kernel:  # measured here: it serves and answers (CPUWNA16LinearKernel)
        assert errors == []
    else:
        assert errors and "cpu_gemm_wna16" in errors[0] and "W8A8" in errors[0]


def test_an_explicit_busy_port_is_an_error_and_nothing_starts():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        plan = plan_deployment(PlanDeploymentInput(checkpoint=str(W8A8), framework="vllm", check_args=False))
        with pytest.raises(ToolError, match=f"port: {port} is already in use"):
            launch_deployment(LaunchDeploymentInput(plan=plan, port=port))


def test_a_base_model_without_chat_template_is_refused_by_vllm_and_caught_by_validate_config_first(tmp_path):
    """The real server's refusal, and validate_config naming it before any run (vLLM reports the model root)."""
    import json

    from quanteval.workflow.nelconfig import BuildConfigInput, SetConfigValueInput, build_config, set_config_value
    from quanteval.workflow.validation import ValidateConfigInput, validate_config

    base = tmp_path / "tiny-add-base"
    shutil.copytree(CHECKPOINTS / "tiny-add-bf16", base)
    tokenizer_config = json.loads((base / "tokenizer_config.json").read_text())
    del tokenizer_config["chat_template"]
    (base / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))

    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(base), framework="vllm", port=free_port(), check_args=False))
    launched = launch_deployment(LaunchDeploymentInput(plan=plan))
    try:
        status = deployment_status(DeploymentStatusInput(record_id=launched.record_id, wait_s=240, chat_probe=False))
        assert status.status == "ready", (status.message, status.log_tail)
        refused = _chat(status.endpoint_url, "tiny-add-base", "17+58", max_tokens=8)
        assert refused.status_code == 400 and "chat template" in refused.text

        config = build_config(BuildConfigInput(engine="nel-next", execution="local", deployment="none",
                                               model_type="chat_reasoning", benchmarks=[str(REPO / "examples" / "benchmarks" / "tiny_add.py")],
                                               config_path=str(tmp_path / "eval.yaml"))).config_path
        for key, value in {"services.model.url": status.endpoint_url, "services.model.model": "tiny-add-base",
                           "services.model.generation.max_tokens": 16}.items():
            set_config_value(SetConfigValueInput(config_path=config, key=key, value=value))
        problems = validate_config(ValidateConfigInput(config_path=config)).problems
        assert [p.rule for p in problems if p.severity == "error"] == ["no_chat_template"], problems

        # and the budget rule, against the context vLLM really serves (256): the real server's 400 above, ours first
        set_config_value(SetConfigValueInput(config_path=config, key="services.model.generation.max_tokens", value=1000))
        rules = {p.rule for p in validate_config(ValidateConfigInput(config_path=config)).problems if p.severity == "error"}
        assert "budget_exceeds_context" in rules
    finally:
        assert stop_deployment(StopDeploymentInput(record_id=launched.record_id, grace_s=20)).stopped
