"""Deployments on this machine: plans checked by SGLang's own parser, and real server processes.

No GPU here, so the server is tests/standins/fake_inference_server.py, a real HTTP process speaking
SGLang's endpoints, started through the same launcher path as `python3 -m sglang.launch_server`
(QUANTEVAL_SGLANG_LAUNCHER replaces only the launcher prefix).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import make_checkpoint
from tiers import CHECKPOINTS, REPO, requires

from quanteval import ledger
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

EXAMPLES = sorted((REPO / "examples" / "checkpoints").iterdir())
STANDIN = REPO / "tests" / "standins" / "fake_inference_server.py"
LLAMA_BF16 = REPO / "examples" / "checkpoints" / "llama-tiny-bf16"


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch):
    """Use the stand-in server as SGLang's launcher, with the given --fake-* options."""

    def use(*fake_options: str) -> None:
        monkeypatch.setenv("QUANTEVAL_SGLANG_LAUNCHER", shlex.join([sys.executable, str(STANDIN), *fake_options]))

    return use


@pytest.fixture
def launched():
    """Launch through the tool; every deployment is stopped afterwards even when a test fails."""
    ids: list[str] = []

    def launch(checkpoint: Path = LLAMA_BF16, **kwargs) -> object:
        if "plan" not in kwargs:  # the parser check has its own tests; skipping it saves seconds per launch
            kwargs["plan"] = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), check_args=False))
        result = launch_deployment(LaunchDeploymentInput(**kwargs))
        ids.append(result.record_id)
        return result

    yield launch
    for deployment_id in ids:
        stop_deployment(StopDeploymentInput(record_id=deployment_id, grace_s=2))


# --- plans ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("checkpoint", EXAMPLES, ids=lambda p: p.name)
def test_sglang_argv_for_every_bundled_example_is_accepted_by_sglangs_own_parser(checkpoint: Path):
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework="sglang"))
    assert plan.parser_check.checked, plan.parser_check.message
    assert plan.parser_check.ok, plan.parser_check.message
    assert plan.argv[:3] == ["python3", "-m", "sglang.launch_server"]
    args = plan.server_args
    assert args[args.index("--model-path") + 1] == str(checkpoint)
    assert args[args.index("--served-model-name") + 1] == checkpoint.name
    assert args[args.index("--context-length") + 1] == str(json.loads((checkpoint / "config.json").read_text())["max_position_embeddings"])
    assert args[-4:] == ["--host", "127.0.0.1", "--port", "30000"]
    assert "--quantization" not in args  # SGLang reads the ModelOpt config of all three itself


@pytest.mark.slow
def test_qwen3_reasoning_checkpoint_gets_its_parsers_per_framework():
    checkpoint = str(REPO / "examples" / "checkpoints" / "qwen3-tiny-nvfp4")
    sglang = plan_deployment(PlanDeploymentInput(checkpoint=checkpoint, framework="sglang", gpu_type="B200"))
    assert sglang.server_args[sglang.server_args.index("--reasoning-parser") + 1] == "qwen3"
    assert "--tool-call-parser" in sglang.server_args
    assert sglang.parser_check.ok, sglang.parser_check.message
    assert not [w for w in sglang.warnings if w.level == "error"]

    # For a cluster's GPU nodes: `vllm serve`, checked by the real vLLM (its CPU build, from .venv-vllm).
    vllm = plan_deployment(PlanDeploymentInput(checkpoint=checkpoint, framework="vllm", host="cluster", gpu_type="B200",
                                               tensor_parallel_size=2, port=8100, served_model_name="q"))
    assert vllm.argv[:4] == ["vllm", "serve", "--model", checkpoint] and vllm.device == "gpu" and vllm.host == "cluster"
    assert vllm.server_args[2:8] == ["--served-model-name", "q", "--tensor-parallel-size", "2", "--max-model-len", "40960"]
    assert vllm.server_args[vllm.server_args.index("--reasoning-parser") + 1] == "qwen3"
    assert "--enable-auto-tool-choice" in vllm.server_args
    assert vllm.parser_check.checked and vllm.parser_check.ok, vllm.parser_check.message
    assert vllm.parser_check.resolved["max_model_len"] == 40960 and vllm.parser_check.resolved["quantization"] == "modelopt_fp4"

    # On this machine (no GPU): vLLM's CPU backend has no NVFP4 kernels, said before anything starts.
    here = plan_deployment(PlanDeploymentInput(checkpoint=checkpoint, framework="vllm", check_args=False))
    assert here.device == "cpu" and here.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert any(w.level == "error" and "NVFP4" in w.message and "GPU" in w.message for w in here.warnings), here.warnings


def test_plain_llama_gets_no_parsers_and_a_local_checkpoint_runs_offline():
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(LLAMA_BF16), check_args=False))
    assert "--reasoning-parser" not in plan.server_args and "--tool-call-parser" not in plan.server_args
    assert plan.env == {"HF_HUB_OFFLINE": "1"}
    assert plan.command.startswith("python3 -m sglang.launch_server --model-path ")


def test_vllm_on_this_cpu_starts_without_aot_so_its_compile_cache_loads_and_a_users_setting_wins(monkeypatch):
    # vllm-cpu 0.32's AOT artifact never loads on torch 2.13 (every start compiled again); torch.compile's own caches do
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(LLAMA_BF16), framework="vllm", check_args=False))
    assert plan.device == "cpu" and plan.env["VLLM_USE_AOT_COMPILE"] == "0" and plan.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert "--enforce-eager" not in plan.argv and plan.serving.numerics == "default"
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(LLAMA_BF16), framework="vllm", check_args=False))
    assert "VLLM_USE_AOT_COMPILE" not in plan.env


@pytest.mark.parametrize(
    ("quant", "framework", "gpu_type", "level", "words"),
    [
        # Hopper serves NVFP4 through Marlin weight-only kernels: a warning about what the accuracy measures.
        ("NVFP4", "sglang", "H100", "warning", "accuracy"),
        ("NVFP4", "sglang", "H200", "warning", "Marlin"),
        ("NVFP4", "vllm", "H100", "warning", "Marlin"),
        ("FP8", "sglang", "A100", "error", "compute capability"),
        ("W4A16_AWQ", "sglang", None, "error", "trtllm"),
        ("W4A8_AWQ", "vllm", None, "error", "TensorRT-LLM"),
    ],
)
def test_hardware_and_format_mismatches_are_warned(tmp_path, quant, framework, gpu_type, level, words):
    checkpoint = make_checkpoint(tmp_path / "ckpt", quant=quant)
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework=framework, gpu_type=gpu_type, check_args=False))
    assert any(w.level == level and words in w.message for w in plan.warnings), plan.warnings


def test_formats_that_match_the_hardware_are_not_warned(tmp_path):
    fp8 = make_checkpoint(tmp_path / "fp8", quant="FP8")
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(fp8), gpu_type="H100", check_args=False))
    assert plan.warnings == []
    nvfp4 = make_checkpoint(tmp_path / "nvfp4", quant="NVFP4", legacy_modelopt=False)
    assert plan_deployment(PlanDeploymentInput(checkpoint=str(nvfp4), gpu_type="B200", check_args=False)).warnings == []


def test_a_gpu_plan_made_on_a_machine_without_one_is_the_gpu_hosts_command(tmp_path, monkeypatch):
    """Asked over MCP for "the vLLM command on an H100", the plan gave this machine's vLLM CPU build (its venv's python
    and release, device gpu). A GPU plan is the framework's own command, says whose host runs it, and claims no release."""
    import shutil

    monkeypatch.delenv("QUANTEVAL_VLLM_LAUNCHER", raising=False)
    checkpoint = make_checkpoint(tmp_path / "w8a8", quant="FP8")
    gpu = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework="vllm", gpu_type="H100", check_args=False))
    assert gpu.device == "gpu" and gpu.command.startswith("vllm serve ") and gpu.serving.version is None, gpu.command
    if shutil.which("nvidia-smi") is None:
        assert any("no GPU" in note and "H100 host" in note for note in gpu.notes), gpu.notes
        cpu = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework="vllm", check_args=False))
        assert cpu.device == "cpu" and cpu.launcher != gpu.launcher


def test_mixed_precision_needs_no_quantization_flag_and_sglang_accepts_the_args(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "mixed", quant="MIXED_PRECISION")
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint)))
    assert "--quantization" not in plan.server_args  # SGLang resolves modelopt_mixed from the config (tests/test_frameworks.py)
    assert plan.parser_check.ok, plan.parser_check.message


def test_bitsandbytes_gets_its_load_format_on_sglang(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "bnb", quant="bitsandbytes")
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint)))
    assert plan.server_args[plan.server_args.index("--load-format") + 1] == "bitsandbytes"
    assert plan.parser_check.ok, plan.parser_check.message
    vllm = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework="vllm", check_args=False))
    assert "--load-format" not in vllm.server_args


def test_trust_remote_code_checkpoint_gets_the_flag(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "remote", auto_map=True)
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint)))
    assert "--trust-remote-code" in plan.server_args and plan.parser_check.ok


def test_arguments_sglang_rejects_are_reported_with_its_own_message():
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(LLAMA_BF16), extra_args=["--mem-fraction-static", "lots"]))
    assert plan.parser_check.checked and plan.parser_check.ok is False
    assert "--mem-fraction-static" in plan.parser_check.message and "lots" in plan.parser_check.message


def test_bad_plan_inputs_are_clear_errors(tmp_path):
    with pytest.raises(ToolError, match="gpu_type: 'V100'.*Use one of"):
        plan_deployment(PlanDeploymentInput(checkpoint=str(LLAMA_BF16), gpu_type="V100"))
    with pytest.raises(ToolError, match="no such checkpoint"):
        plan_deployment(PlanDeploymentInput(checkpoint=str(tmp_path / "missing")))
    with pytest.raises(ValueError):
        PlanDeploymentInput(checkpoint=str(LLAMA_BF16), framwork="vllm")


@pytest.mark.slow
def test_plan_deployment_through_the_cli(cli_env):
    out = subprocess.run(
        ["quanteval", "call", "plan_deployment", "--json", json.dumps({"checkpoint": str(LLAMA_BF16), "framework": "vllm"})],
        capture_output=True, text=True, env=cli_env, check=True,
    )
    plan = json.loads(out.stdout)
    # No `vllm` on PATH here: the CPU venv's module, which (unlike vllm-cpu's console script) starts.
    assert plan["argv"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and plan["argv"][0].endswith("/bin/python")
    assert plan["served_model_name"] == "llama-tiny-bf16" and plan["parser_check"]["ok"], plan["parser_check"]


# --- launch, status, stop ------------------------------------------------------------------------


def test_host_local_means_this_machine_like_every_tool_that_takes_a_host(standin, launched):
    standin()
    result = launched(port=free_port(), host="local")
    assert result.host is None and result.pid and ledger.get(result.record_id).executor == "local"
    assert deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=20)).status == "ready"


def test_healthy_start_serves_the_model_and_stop_leaves_no_process(standin, launched):
    standin("--fake-load-s", "1.5", "--fake-workers", "2")
    result = launched(port=free_port())
    assert ledger.get(result.record_id).kind == "deployment"
    first = deployment_status(DeploymentStatusInput(record_id=result.record_id))
    assert first.status == "loading"

    ready = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=20))
    assert ready.status == "ready", ready.message
    assert ready.health_status == 200 and ready.served_models == ["llama-tiny-bf16"] and ready.served_name_matches
    assert ready.chat_reply and ready.chat_latency_s is not None and ready.chat_latency_s < 5
    assert ready.endpoint_url == f"http://127.0.0.1:{result.port}/v1/chat/completions"
    assert ready.config_values == {"target.api_endpoint.url": ready.endpoint_url, "target.api_endpoint.model_id": "llama-tiny-bf16"}
    assert any("fired up and ready to roll" in line for line in ready.log_tail)
    assert ledger.get(result.record_id).status == "ready"

    members = group_members(result.pid)
    assert len(members) >= 4  # shell wrapper, server, two workers
    stopped = stop_deployment(StopDeploymentInput(record_id=result.record_id))
    assert stopped.stopped and stopped.how == "SIGTERM" and stopped.remaining_pids == []
    assert group_members(result.pid) == [] and not any(Path(f"/proc/{pid}").exists() and
                                                        "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
                                                        for pid in members)
    assert deployment_status(DeploymentStatusInput(record_id=result.record_id)).status == "stopped"
    assert stop_deployment(StopDeploymentInput(record_id=result.record_id)).how == "already stopped"


def test_slow_start_reports_loading_with_503_then_ready(standin, launched):
    standin("--fake-load-s", "4")
    result = launched(port=free_port())
    deadline = time.monotonic() + 3
    status = deployment_status(DeploymentStatusInput(record_id=result.record_id))
    while status.health_status != 503 and time.monotonic() < deadline:  # the port opens a moment after launch
        time.sleep(0.2)
        status = deployment_status(DeploymentStatusInput(record_id=result.record_id))
    assert status.status == "loading" and status.health_status == 503
    assert "normal" in status.message and status.failures == []
    ready = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=20))
    assert ready.status == "ready" and ready.elapsed_s >= 4


@pytest.mark.parametrize(
    ("mode", "fix_words"),
    [("oom", "--mem-fraction-static"), ("cuda-graph", "--disable-cuda-graph")],
)
def test_crash_with_a_known_error_gives_the_fix(standin, launched, mode, fix_words):
    standin("--fake-mode", mode, "--fake-load-s", "0.2")
    result = launched(port=free_port())
    status = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=15))
    assert status.status == "failed"
    assert status.process == "exited with code 1"
    assert status.failures and fix_words in status.failures[0].fix
    assert fix_words in status.message
    assert ledger.get(result.record_id).status == "failed"
    assert not Path(f"/proc/{result.pid}").exists()  # the ended server was reaped (localproc.reap): no zombie


def test_hang_while_loading_times_out_and_stop_escalates_to_sigkill(standin, launched):
    standin("--fake-mode", "hang", "--fake-ignore-sigterm", "--fake-workers", "1")
    result = launched(port=free_port(), startup_timeout_s=1.5)
    status = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=15))
    assert status.status == "timed_out" and status.health_status == 503
    assert "startup_timeout_s" in status.message
    stopped = stop_deployment(StopDeploymentInput(record_id=result.record_id, grace_s=1))
    assert stopped.stopped and "SIGKILL" in stopped.how
    assert group_members(result.pid) == []


def test_busy_port_explicit_is_an_error_default_is_replaced(standin, launched):
    standin("--fake-load-s", "0.2")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        with pytest.raises(ToolError, match=f"port: {busy} is already in use"):
            launched(port=busy)
        plan = plan_deployment(PlanDeploymentInput(checkpoint=str(LLAMA_BF16), port=busy, check_args=False))
        result = launched(plan=plan)
        assert result.port != busy and f"Port {busy} was busy; using free port {result.port}" in result.notes[0]
        assert f"--port {result.port}" in result.command
        status = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=15))
        assert status.status == "ready" and status.endpoint_url.endswith(f":{result.port}/v1/chat/completions")


def test_a_plan_with_errors_is_not_launched_unless_forced(standin, launched, tmp_path):
    standin()
    checkpoint = make_checkpoint(tmp_path / "awq", quant="W4A16_AWQ")
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), check_args=False))
    before = ledger.count(kind="deployment")
    with pytest.raises(ToolError, match="TensorRT-LLM.*force=true"):
        launched(plan=plan)
    assert ledger.count(kind="deployment") == before
    with pytest.raises(ToolError, match="exactly one of plan"):
        launch_deployment(LaunchDeploymentInput())


def test_a_missing_launcher_is_a_clear_error(monkeypatch, launched):
    monkeypatch.setenv("QUANTEVAL_SGLANG_LAUNCHER", "/nonexistent/python -m sglang.launch_server")
    result = launched(port=free_port())
    status = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=10))
    assert status.status == "failed" and status.process == "exited with code 127"
    assert any("/nonexistent/python" in line for line in status.log_tail)


def test_status_of_unknown_or_foreign_ids_is_a_clear_error():
    with pytest.raises(ToolError, match="No ledger record 'deployment-nope'"):
        deployment_status(DeploymentStatusInput(record_id="deployment-nope"))
    other = ledger.add("canary", status="running")
    with pytest.raises(ToolError, match="is a canary record, not a deployment"):
        stop_deployment(StopDeploymentInput(record_id=other.id))


def test_status_survives_a_new_process(standin, launched, cli_env):
    """A CLI call in another process (not the launcher's parent) probes and stops the same server."""
    standin("--fake-load-s", "0.2")
    result = launched(port=free_port())
    env = {**cli_env, **{k: os.environ[k] for k in ("QUANTEVAL_STATE_DIR", "QUANTEVAL_LEDGER")}}
    call = ["quanteval", "call", "deployment_status", "--json", json.dumps({"record_id": result.record_id, "wait_s": 15})]
    status = json.loads(subprocess.run(call, capture_output=True, text=True, env=env, check=True).stdout)
    assert status["status"] == "ready" and status["chat_reply"]
    call = ["quanteval", "call", "stop_deployment", "--json", json.dumps({"record_id": result.record_id})]
    stopped = json.loads(subprocess.run(call, capture_output=True, text=True, env=env, check=True).stdout)
    assert stopped["stopped"] and group_members(result.pid) == []


def test_trtllm_plan_uses_trtllm_serve_flags_and_says_it_is_unchecked(tmp_path):
    checkpoint = make_checkpoint(tmp_path / "awq", quant="W4A16_AWQ")
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework="trtllm", tensor_parallel_size=4))
    assert plan.argv[:2] == ["trtllm-serve", str(checkpoint)]
    assert plan.server_args[plan.server_args.index("--tp_size") + 1] == "4"
    assert plan.server_args[plan.server_args.index("--max_seq_len") + 1] == "4096"
    assert plan.port == 8000 and plan.warnings == [] and plan.parser_check.checked is False
    assert plan.served_model_name == str(checkpoint) and "--served_model_name" not in plan.server_args
    named = plan_deployment(PlanDeploymentInput(checkpoint=str(checkpoint), framework="trtllm", served_model_name="awq"))
    assert named.server_args[named.server_args.index("--served_model_name") + 1] == "awq"


def test_vllm_plan_launches_through_the_same_path_with_its_own_launcher(monkeypatch, launched):
    monkeypatch.setenv("QUANTEVAL_VLLM_LAUNCHER", shlex.join([sys.executable, str(STANDIN), "--fake-load-s", "0.2"]))
    plan = plan_deployment(PlanDeploymentInput(
        checkpoint=str(LLAMA_BF16), framework="vllm", served_model_name="llama-vllm", port=free_port(), check_args=False,
        gpu_type="H100",  # the stand-in plays a GPU vLLM: this checkpoint's head_dim 16 has no CPU kernel
    ))
    assert plan.server_args[:2] == ["--model", str(LLAMA_BF16)]  # accepted by `vllm serve` and the api_server module
    assert "Launcher replaced by QUANTEVAL_VLLM_LAUNCHER." in plan.notes
    result = launched(plan=plan)
    status = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=15))
    assert status.status == "ready" and status.served_models == ["llama-vllm"] and status.chat_reply


def test_a_cpu_vllm_plan_takes_vllms_default_numerics_and_the_eager_path_only_when_asked(monkeypatch, launched):
    """--enforce-eager moves answers (serving.deployment's docstring): quanteval no longer adds it on CPU; asked for,
    the plan says so, and the deployment's record keeps how it computes, from the arguments that run."""
    monkeypatch.setenv("QUANTEVAL_VLLM_LAUNCHER", shlex.join([sys.executable, str(STANDIN), "--fake-load-s", "0.2"]))
    bf16 = CHECKPOINTS / "tiny-add-bf16"
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(bf16), framework="vllm", port=free_port(), check_args=False))
    assert plan.device == "cpu" and "--enforce-eager" not in plan.server_args
    assert (plan.serving.numerics, plan.serving.flags, plan.serving.device) == ("default", [], "cpu")
    eager = plan_deployment(PlanDeploymentInput(checkpoint=str(bf16), framework="vllm", port=free_port(), check_args=False,
                                                extra_args=["--enforce-eager"]))
    assert (eager.serving.numerics, eager.serving.flags) == ("eager", ["--enforce-eager"])
    assert any("eager numeric path" in note for note in eager.notes)
    claimed = eager.model_copy(update={"serving": eager.serving.model_copy(update={"numerics": "default"})})
    record = ledger.get(launched(plan=claimed).record_id)
    assert record.details["serving"]["numerics"] == "eager"  # what runs, not what the client's plan claimed


@pytest.mark.parametrize(
    ("log_line", "fix_words"),
    [  # the servers' own messages (SGLang 0.5.23 / vLLM source)
        ("ValueError: ModelOpt NVFP4 native dense GEMM backends require SM100+. ", "B200"),
        ("ValueError: Current platform does not support NVFP4 quantization with the selected MoE backend. "
         "Please use Blackwell and above, or use moe_runner_backend=marlin on SM80+.", "B200"),
        ("ValueError: Quantization method specified in the model config (modelopt_fp4) does not match the quantization "
         "method specified in the `quantization` argument (modelopt).", "Drop --quantization"),
        ("ValueError: ModelOpt currently only supports: FP8, NVFP4, NVFP4_AWQ, MIXED_PRECISION quantization", "trtllm"),
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "--gpu-memory-utilization"),
        ("OSError: [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use",
         "another port"),
    ],
)
def test_known_server_failures_in_a_log_map_to_fixes(standin, launched, log_line, fix_words):
    standin("--fake-load-s", "0.1", "--fake-mode", "fail", "--fake-fail-line", log_line)
    result = launched(port=free_port())
    status = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=10))
    assert status.status == "failed" and len(status.failures) == 1
    assert fix_words in status.failures[0].fix and fix_words in status.message


def test_deployment_status_over_mcp_masks_secrets_in_the_log_and_names_the_fix(standin, launched, monkeypatch):
    """The failure line and the log tail are quoted masked, and the fix comes from the one failure table."""
    import anyio
    from mcp import Client

    from quanteval import failures
    from quanteval.faces.server import build_server

    monkeypatch.setenv("HF_TOKEN", "hf_planted_value_for_the_server")
    line = ("torch.OutOfMemoryError: CUDA out of memory (request with Authorization: Bearer nvapi-PLANTEDkey0123456789, "
            "HF_TOKEN hf_planted_value_for_the_server)")
    standin("--fake-load-s", "0.1", "--fake-mode", "fail", "--fake-fail-line", line)
    result = launched(port=free_port())

    async def go():
        async with Client(build_server(toolsets=["deploy"])) as client:
            return await client.call_tool("deployment_status", {"record_id": result.record_id, "wait_s": 10})

    status = anyio.run(go)
    assert not status.is_error, status.content[0].text
    shown = status.content[0].text + json.dumps(status.structured_content)
    assert "nvapi-PLANTED" not in shown and "hf_planted_value_for_the_server" not in shown
    found = status.structured_content["failures"]
    assert len(found) == 1 and "Authorization: Bearer ***" in found[0]["line"] and "HF_TOKEN <HF_TOKEN>" in found[0]["line"]
    known = failures.server_failure(line)
    assert known is not None and (found[0]["meaning"], found[0]["fix"]) == (known.meaning, known.fix)
    assert any("Authorization: Bearer ***" in tail for tail in status.structured_content["log_tail"])


def test_nothing_from_the_client_can_add_lines_to_a_slurm_job_script():
    with pytest.raises(ValueError, match="partition"):
        LaunchDeploymentInput(checkpoint=str(LLAMA_BF16), host="cluster", partition="gpu\nrm -rf ~")
    with pytest.raises(ValueError, match="time_limit"):
        LaunchDeploymentInput(checkpoint=str(LLAMA_BF16), host="cluster", time_limit="1:00\n#SBATCH --exclusive")
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(LLAMA_BF16), check_args=False))
    for tampered in (
        plan.model_copy(update={"server_args": [*plan.server_args, "x\nQUANTEVAL_EOF\ncurl evil"],
                                "argv": [*plan.argv, "x\nQUANTEVAL_EOF\ncurl evil"]}),
        plan.model_copy(update={"env": {"A=1; rm -rf ~; B": "1"}}),
    ):
        with pytest.raises(ToolError, match="cannot go into a job script"):
            launch_deployment(LaunchDeploymentInput(plan=tampered, host="cluster"))
    assert ledger.count(kind="deployment") == 0  # refused before anything was recorded or sent


def test_a_plan_cannot_swap_in_another_command(standin):
    standin()
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(LLAMA_BF16), check_args=False))
    tampered = plan.model_copy(update={"launcher": ["/bin/sh", "-c", "touch /tmp/pwned"],
                                       "argv": ["/bin/sh", "-c", "touch /tmp/pwned", *plan.server_args]})
    with pytest.raises(ToolError, match="not the sglang launcher for this machine.*QUANTEVAL_SGLANG_LAUNCHER"):
        launch_deployment(LaunchDeploymentInput(plan=tampered))
    assert ledger.count(kind="deployment") == 0


def test_weights_that_do_not_fit_the_gpus_are_an_error_and_the_default_tp_fits(tmp_path):
    """A 200 GB checkpoint: a real safetensors header, the data a sparse hole (no disk used)."""
    root = make_checkpoint(tmp_path / "big")
    for shard in root.glob("*.safetensors"):
        shard.unlink()
    size = 200 * 10**9
    header = json.dumps({"lm_head.weight": {"dtype": "BF16", "shape": [size // 2 // 8192, 8192],
                                                       "data_offsets": [0, size]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(root / "model.safetensors", "wb") as handle:
        handle.write(struct.pack("<Q", len(header)) + header)
        handle.truncate(8 + len(header) + size)
    one = plan_deployment(PlanDeploymentInput(checkpoint=str(root), gpu_type="H100", tensor_parallel_size=1, check_args=False))
    assert [w.level for w in one.warnings] == ["error"]
    assert "do not fit 1 x H100" in one.warnings[0].message and "at least 3 H100" in one.warnings[0].message
    sized = plan_deployment(PlanDeploymentInput(checkpoint=str(root), gpu_type="H100", check_args=False))
    assert sized.tensor_parallel_size == 4 and sized.warnings == []  # 3 GPUs needed; 4 divides the heads


def test_a_ready_deployment_fills_a_deployment_none_config(standin, launched, tmp_path):
    from quanteval.workflow import nelconfig

    config = tmp_path / "eval.yaml"
    nelconfig.build_config(nelconfig.BuildConfigInput(
        execution="local", deployment="none", model_type="chat_reasoning", benchmarks=["core_reasoning"], config_path=str(config)
    ))
    standin("--fake-load-s", "0.2")
    result = launched(port=free_port())
    status = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=15))
    assert status.status == "ready"
    for path, value in status.config_values.items():
        nelconfig.set_config_value(nelconfig.SetConfigValueInput(config_path=str(config), key=path, value=value))
    missing = nelconfig.list_missing_values(nelconfig.ListMissingValuesInput(config_path=str(config))).missing_values
    assert "target.api_endpoint.model_id" not in missing
    doc = nelconfig.load_config(config)
    assert nelconfig.get_path(doc, "target.api_endpoint.url") == status.endpoint_url
    assert nelconfig.get_path(doc, "target.api_endpoint.model_id") == "llama-tiny-bf16"


def test_an_hf_handle_is_served_as_the_handle(tmp_path, monkeypatch):
    """The server resolves the handle from its own HF cache, so the plan works on any machine."""
    repo_dir = tmp_path / "hf" / "hub" / "models--nvidia--Tiny-FP8"
    make_checkpoint(repo_dir / "snapshots" / "0123abcd", quant="FP8")
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text("0123abcd")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    plan = plan_deployment(PlanDeploymentInput(checkpoint="nvidia/Tiny-FP8"))
    args = plan.server_args
    assert args[args.index("--model-path") + 1] == "nvidia/Tiny-FP8" == plan.checkpoint
    assert args[args.index("--served-model-name") + 1] == "nvidia/Tiny-FP8"
    assert plan.env == {} and plan.parser_check.ok, plan.parser_check.message


def test_list_runs_shows_a_running_deployment_and_eval_servers_over_mcp(standin, launched):
    """A server left running (e.g. by a client that went away) is visible: list_runs lists deployments and eval
    servers with where they listen, and its kind filter takes them."""
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    standin()
    result = launched()
    server = ledger.add("eval_server", status="running", details={"port": 8123})

    async def listing(arguments: dict) -> dict:
        async with Client(build_server()) as client:
            answer = await client.call_tool("list_runs", arguments)
            assert not answer.is_error, answer.content[0].text
            return answer.structured_content

    everything = anyio.run(listing, {})
    rows = {row["record_id"]: row for row in everything["runs"]}
    assert rows[result.record_id]["kind"] == "deployment" and rows[result.record_id]["note"] == result.endpoint_url
    assert rows[server.id]["kind"] == "eval_server" and rows[server.id]["note"] == "port 8123"
    only = anyio.run(listing, {"kind": "deployment"})
    assert [row["record_id"] for row in only["runs"]] == [result.record_id]
    assert [row["record_id"] for row in anyio.run(listing, {"kind": "eval_server"})["runs"]] == [server.id]


def test_a_server_killed_behind_its_records_back_shows_as_ended_in_list_runs(standin, launched):
    """Its owner died and took it (an evaluation's server), or kill -9: the record said `loading` for good. list_runs,
    where a user looks for what is still running, settles it as deployment_status would."""
    from quanteval.workflow.runs import ListRunsInput, list_runs

    standin("--fake-load-s", "60")
    result = launched(port=free_port())
    listed = {run.record_id: run for run in list_runs(ListRunsInput(kind="deployment")).runs}
    assert listed[result.record_id].status == "loading"
    os.killpg(result.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while group_members(result.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    listed = {run.record_id: run for run in list_runs(ListRunsInput(kind="deployment")).runs}
    assert listed[result.record_id].status in ("failed", "exited"), listed[result.record_id]
    assert "not running" in ledger.events(result.record_id)[-1].message


def test_a_watcher_that_saw_a_server_loading_does_not_overwrite_the_stop_recorded_meanwhile(standin, launched):
    """evaluate stops its server while a client lists runs: list_runs read the record `loading`, the stopper killed the
    server and wrote `stopped`, then list_runs found the server gone. Its `exited` must not land over the stop (a full
    run of the suite caught a cancelled evaluation's server listed `exited` this way)."""
    from quanteval.serving import deploy

    standin("--fake-load-s", "60")
    result = launched(port=free_port())
    seen = ledger.get(result.record_id)
    assert seen.status == "loading"
    deploy.stop_deployment(deploy.StopDeploymentInput(record_id=result.record_id, grace_s=5))
    assert deploy.settle(seen).status == "stopped"  # the stale `loading` it read changes nothing now
    assert [event.status for event in ledger.events(result.record_id)][-1] == "stopped"


# ---------------------------------------------------------------- which kernels a named GPU runs, over MCP


def _plan_over_mcp(**arguments: object) -> dict:
    import anyio
    from mcp import Client

    from quanteval import toolsets
    from quanteval.faces.server import build_server

    async def go() -> dict:
        async with Client(build_server(toolsets=list(toolsets.TOOLSETS))) as client:
            result = await client.call_tool("plan_deployment", {"check_args": False, **arguments})
            assert not result.is_error, result.content[0].text
            return result.structured_content

    return anyio.run(go)


@pytest.mark.parametrize(("checkpoint", "framework", "gpu", "kernel", "activations", "weight_only"), [
    # llm-compressor's W8A8 (int8 weights per channel, dynamic int8 activations per token)
    ("tiny-add-w8a8", "vllm", "A100", "int8 CUTLASS scaled-mm", "int8", False),
    ("tiny-add-w8a8", "sglang", "A100", "int8 CUTLASS scaled-mm", "int8", False),
    # ModelOpt NVFP4: Marlin's weight-only FP4 below Blackwell, FP4 tensor cores on it
    ("qwen3-tiny-nvfp4", "vllm", "H100", "Marlin FP4 weight-only kernels", "16-bit", True),
    ("qwen3-tiny-nvfp4", "sglang", "H100", "Marlin FP4 weight-only kernels", "16-bit", True),
    ("qwen3-tiny-nvfp4", "vllm", "B200", "native FP4 (NVFP4) GEMM", "FP4 (NVFP4)", False),
    # ModelOpt FP8: no FP8 tensor cores on an A100 (vLLM falls back to Marlin; SGLang refuses), native on H100
    ("llama-tiny-fp8", "vllm", "A100", "Marlin FP8 weight-only kernels", "16-bit", True),
    ("llama-tiny-fp8", "sglang", "A100", None, "FP8", None),
    ("llama-tiny-fp8", "vllm", "H100", "native FP8 CUTLASS scaled-mm", "FP8", False),
    # weight-only by design: Marlin, and the accuracy measured is the format's
    ("tiny-add-w4a16", "vllm", "A100", "Marlin weight-only (W4A16)", "16-bit", True),
])
def test_a_plan_for_a_named_gpu_says_which_kernels_serve_the_checkpoint(checkpoint, framework, gpu, kernel, activations,
                                                                         weight_only):
    plan = _plan_over_mcp(checkpoint=str(CHECKPOINTS / checkpoint), framework=framework, gpu_type=gpu)
    path = plan["kernel_path"]
    assert (path["gpu"], path["kernel"], path["activations"], path["weight_only"]) == (gpu, kernel, activations, weight_only), path
    if weight_only and checkpoint != "tiny-add-w4a16":  # a format whose activations are quantized, served weight-only
        assert "not what ships" in path["meaning"], path
    if kernel is None:
        assert "compute capability >= 8.9" in path["meaning"], path
    assert "cpu_wna16_kernel" not in json.dumps(plan)  # this machine's CPU facts only under parser_check.this_machine


def test_a_plan_for_this_cpu_labels_what_it_measured_here_and_names_no_gpu_kernel():
    plan = _plan_over_mcp(checkpoint=str(CHECKPOINTS / "tiny-add-w4a16"), framework="vllm")
    assert plan["device"] == "cpu" and plan["kernel_path"] is None
    assert set(plan["parser_check"]["this_machine"]) <= {"vllm_cpu_gemm_wna16"}


def test_a_plan_for_a_host_no_ssh_config_names_says_it_is_unverified(tmp_path, monkeypatch):
    config = tmp_path / "ssh_config"
    config.write_text("Host known-login\n  HostName 127.0.0.1\n")
    monkeypatch.setenv("QUANTEVAL_SSH_CONFIG", str(config))
    unknown = _plan_over_mcp(checkpoint=str(CHECKPOINTS / "tiny-add-w8a8"), framework="vllm", gpu_type="A100", host="typo-login")
    [said] = [w for w in unknown["warnings"] if "typo-login" in w["message"]]
    assert "unverified" in said["message"] and str(config) in said["message"]
    known = _plan_over_mcp(checkpoint=str(CHECKPOINTS / "tiny-add-w8a8"), framework="vllm", gpu_type="A100", host="user@known-login")
    assert not [w for w in known["warnings"] if "unverified" in w["message"]]


def test_a_cluster_jobs_vllm_for_cpu_gets_the_same_environment_as_a_local_one_and_the_plans_values_win():
    # The job's server is started by the cluster evaluation's own command line: without VLLM_CPU_ENV there, every job's
    # vLLM for CPU compiled again (the AOT artifact never loads on torch 2.13).
    from quanteval.serving.frameworks import VLLM_CPU_ENV
    from quanteval.workflow.evaluate_cluster import Cluster, server_command

    def cluster(cpu: bool) -> Cluster:
        return Cluster(host="login", partition="p", walltime="01:00:00", account=None, gpus_per_node=0, output_dir="/o",
                       job_path="/bin", nel_next="nel", vllm_launcher=["python", "-m", "vllm.entrypoints.openai.api_server"],
                       vllm_release="vllm-cpu 0.32.0" if cpu else "vllm 0.32.0", vllm_cpu=cpu,
                       checkpoints={"baseline": "/ckpt"})

    command = server_command(cluster(True), "baseline", ["--max-model-len", "256"], {"VLLM_CPU_KVCACHE_SPACE": "4"}, 8001)
    env = dict(item.split("=", 1) for item in command[1:command.index("python")])
    assert env == {**VLLM_CPU_ENV, "VLLM_CPU_KVCACHE_SPACE": "4"} and env["VLLM_USE_AOT_COMPILE"] == "0"
    assert command[command.index("--model") + 1] == "/ckpt" and command[command.index("--port") + 1] == "8001"
    gpu = server_command(cluster(False), "baseline", [], {}, 8002)
    assert gpu[0] == "python" and not any(part.startswith("VLLM_") for part in gpu)


@requires("vllm")
def test_an_accepted_server_check_is_kept_for_the_next_call_until_what_it_read_changes(tmp_path, monkeypatch):
    """vLLM's own check of a plan's arguments (its parser and model-config resolution: ~7 CPU-s of imports in a process
    that has not warmed one, as each `quanteval evaluate` is) is asked once: the same arguments on another port get the
    kept answer without asking vLLM; a checkpoint file that changed is asked again (and answers the new value), and a
    refusal is asked each time (its fix is the user's next step)."""
    from quanteval import warm_python
    from quanteval.serving.deploy import check_server_args

    monkeypatch.setenv("QUANTEVAL_CACHE_DIR", str(tmp_path / "cache"))
    checkpoint = tmp_path / "tiny-add-bf16"
    checkpoint.mkdir()
    for item in (CHECKPOINTS / "tiny-add-bf16").iterdir():
        (checkpoint / item.name).symlink_to(item) if item.name != "config.json" else shutil.copy(item, checkpoint / item.name)
    asked: list[list[str]] = []
    ask = warm_python.run
    monkeypatch.setattr(warm_python, "run", lambda python, preload, code, argv, *rest, **named: (
        asked.append(json.loads(argv[0])), ask(python, preload, code, argv, *rest, **named))[1])

    def check(port: int, *more: str):
        return check_server_args("vllm", ["--model", str(checkpoint), "--served-model-name", "tiny", "--port", str(port),
                                          *more], local_model=True)

    first, again = check(8001), check(8002)
    assert first.ok and again == first and first.resolved["max_model_len"] == 256 and len(asked) == 1
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 128}))
    changed = check(8003)
    assert changed.ok and changed.resolved["max_model_len"] == 128 and len(asked) == 2
    refused, refused_again = check(8004, "--max-model-len", "two"), check(8004, "--max-model-len", "two")
    assert refused.ok is False and refused_again.ok is False and len(asked) == 4


def test_a_planned_port_lies_outside_the_ephemeral_range_and_is_free(tmp_path, monkeypatch):
    """A server binds its port seconds after quanteval chose it (an evaluation's sides, a launch whose port was busy);
    in the kernel's ephemeral range any outgoing connection may take the port meanwhile. The port is free and outside
    this machine's range; where the range covers every server port (a tuned host), the kernel's own pick is the answer."""
    from quanteval import localproc

    low, high = localproc.ephemeral_ports()
    picked = {localproc.free_port() for _ in range(100)}
    assert all(not low <= port <= high and localproc.port_free(port) for port in picked), picked
    tuned = tmp_path / "ip_local_port_range"
    tuned.write_text("1024\t65535\n")
    monkeypatch.setattr(localproc, "EPHEMERAL_RANGE_FILE", tuned)
    assert localproc.ephemeral_ports() == (1024, 65535) and localproc.port_free(localproc.free_port())
    assert localproc.ephemeral_ports("61000 32768") == localproc.LINUX_EPHEMERAL_PORTS  # nonsense: Linux's default
