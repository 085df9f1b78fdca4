"""End to end, as the evaluation skill says: `quanteval call` subprocesses from an empty directory to a config that
validates clean and passes NEL's dry-run, for NVFP4 Qwen3 + SGLang (SLURM), FP8 Llama + vLLM, a BF16 baseline
derived from the quantized config, and a reasoning model with thinking on — then checked against what the server
would enforce. The submitted canary on the real SLURM cluster is the cluster tests' part (tests/test_runs_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from chain_scenarios import cli_env, enforced_checks, run_scenario, scenarios
from tiers import requires

# Every test reads the module's four scenarios, each a dozen `quanteval call` processes (~30 s in all): the slow tier.
pytestmark = requires("slow")

MOST_CALLS = 12  # the skill's flow: build, add tasks, inspect, apply, list missing, 3 SLURM values, validate, dry-run


@pytest.fixture(scope="module")
def transcripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple]:
    root = tmp_path_factory.mktemp("chain")
    env = cli_env(root / "home")
    configs: dict[str, Path] = {}
    done = {}
    for scenario in scenarios(root / "checkpoints"):
        transcript, config = run_scenario(scenario, root / scenario.name, env, configs)
        done[scenario.name] = (scenario, transcript, config)
    return done


SCENARIOS = ["nvfp4-qwen3-sglang-slurm", "fp8-llama-vllm-local", "bf16-baseline-from-quantized-config", "reasoning-thinking-on-vllm-local"]


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_reaches_a_canary_ready_config_that_the_server_accepts(transcripts: dict[str, tuple], name: str) -> None:
    scenario, transcript, config = transcripts[name]
    assert len(transcript.calls) <= MOST_CALLS, transcript.calls
    for check, (ok, detail) in enforced_checks(config, scenario.checkpoint).items():
        assert ok, f"{name}: {check}: {detail}"


def test_the_baseline_config_keeps_nothing_of_the_quantized_checkpoint(transcripts: dict[str, tuple]) -> None:
    _, _, quantized = transcripts["nvfp4-qwen3-sglang-slurm"]
    _, _, baseline = transcripts["bf16-baseline-from-quantized-config"]
    q, b = yaml.safe_load(quantized.read_text()), yaml.safe_load(baseline.read_text())
    # GPQA and AIME never read the evaluation tokenizer: no checkpoint is mounted for it, the quantized one least of all
    assert "evaluation" not in (b["execution"].get("mounts") or {}) and "qwen3-tiny-nvfp4" not in baseline.read_text()
    assert b["deployment"]["checkpoint_path"] == "/lustre/fs1/models/qwen3-tiny-bf16"
    assert b["deployment"]["served_model_name"] == "qwen3-tiny-bf16"
    # everything else that moves a score is the same as the quantized run's, but the KV cache: the quantized
    # checkpoint's is FP8 (served with --kv-cache-dtype), the baseline's 16-bit
    assert b["evaluation"]["tasks"] == q["evaluation"]["tasks"]
    assert q["deployment"]["extra_args"] == b["deployment"]["extra_args"].replace(
        "--context-length 40960", "--context-length 40960 --kv-cache-dtype fp8_e4m3")
    assert "--kv-cache-dtype" not in b["deployment"]["extra_args"]
    q_params, b_params = (d["evaluation"]["nemo_evaluator_config"]["config"]["params"] for d in (q, b))
    assert b_params == q_params


def test_thinking_is_on_and_parsed_for_the_reasoning_model(transcripts: dict[str, tuple]) -> None:
    _, _, config = transcripts["reasoning-thinking-on-vllm-local"]
    doc = yaml.safe_load(config.read_text())
    adapter = doc["evaluation"]["nemo_evaluator_config"]["target"]["api_endpoint"]["adapter_config"]
    assert adapter["params_to_add"]["chat_template_kwargs"] == {"enable_thinking": True}
    assert adapter["params_to_add"]["top_k"] == 20  # Qwen3's generation_config.json
    assert "--reasoning-parser qwen3" in doc["deployment"]["extra_args"]


def test_the_llama_config_has_no_thinking_settings(transcripts: dict[str, tuple]) -> None:
    _, _, config = transcripts["fp8-llama-vllm-local"]
    doc = yaml.safe_load(config.read_text())
    assert "params_to_add" not in doc["evaluation"]["nemo_evaluator_config"]["target"]["api_endpoint"]["adapter_config"]
    assert doc["deployment"]["extra_args"] == "--max-model-len 4096 --kv-cache-dtype fp8"  # its FP8 KV cache
    assert doc["evaluation"]["nemo_evaluator_config"]["config"]["params"]["max_new_tokens"] == 3072
