"""`quanteval plan` end to end on the bundled example checkpoint: real tools, real NEL dry-run, a real config file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

EXAMPLE = "examples/checkpoints/qwen3-tiny-nvfp4"


def plan(repo: Path, cli_env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["quanteval", "plan", str(repo / EXAMPLE), *args],
        cwd=cwd, env=cli_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture
def env_with_token(cli_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """A user who exported HF_TOKEN (NEL's dry-run needs every host: variable set), with no recipes dir surprises."""
    return cli_env | {"HF_TOKEN": "hf_dummy_value_for_tests", "QUANTEVAL_RECIPES_DIR": str(tmp_path / "no-recipes")}


def test_plan_writes_a_config_and_prints_a_readable_summary(repo: Path, env_with_token: dict[str, str], tmp_path: Path) -> None:
    done = plan(repo, env_with_token, tmp_path, "--tasks", "ns_gpqa,ns_aime2025", "--output-dir", "results")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    config = tmp_path / "qwen3-tiny-nvfp4-local-vllm.yaml"
    for expected in ("Qwen3ForCausalLM", "NVFP4", "40960", str(config), "ns_gpqa, ns_aime2025", "NEL dry-run:"):
        assert expected in out
    assert "hf_dummy_value_for_tests" not in out + done.stderr
    assert "quanteval call launch_canary --json" in out
    assert f"nel run --config {config} -o ++evaluation.nemo_evaluator_config.config.params.limit_samples=10" in out
    assert f"nel run --config {config}\n" in out + "\n"

    written = yaml.safe_load(config.read_text(encoding="utf-8"))
    assert [task["name"] for task in written["evaluation"]["tasks"]] == ["ns_gpqa", "ns_aime2025"]
    assert written["deployment"]["checkpoint_path"] == str(repo / EXAMPLE)
    assert "--max-model-len 40960" in written["deployment"]["extra_args"]
    assert written["execution"]["output_dir"] == str(tmp_path / "results")


def test_plan_never_overwrites_without_force(repo: Path, env_with_token: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text("# my hand-edited config\n", encoding="utf-8")
    refused = plan(repo, env_with_token, tmp_path, "--config", str(config), "--tasks", "ns_gpqa")
    assert refused.returncode == 1
    assert "already exists" in refused.stderr and "--force" in refused.stderr
    assert config.read_text(encoding="utf-8") == "# my hand-edited config\n"

    forced = plan(repo, env_with_token, tmp_path, "--config", str(config), "--tasks", "ns_gpqa", "--deployment", "sglang", "--json", "--force")
    assert forced.returncode == 0, forced.stderr
    report = json.loads(forced.stdout)
    assert report["config_path"] == str(config) and report["tasks"] == ["ns_gpqa"]
    assert "--context-length 40960" in yaml.safe_load(config.read_text())["deployment"]["extra_args"]


def test_plan_unknown_task_fails_before_writing_anything(repo: Path, env_with_token: dict[str, str], tmp_path: Path) -> None:
    done = plan(repo, env_with_token, tmp_path, "--tasks", "ns_gpqa,aime2025")
    assert done.returncode == 1
    assert "Did you mean" in done.stderr and "ns_aime2025" in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.glob("*.yaml")) == []


def test_plan_missing_checkpoint_is_a_tool_error(env_with_token: dict[str, str], tmp_path: Path) -> None:
    done = subprocess.run(
        ["quanteval", "plan", str(tmp_path / "nope"), "--tasks", "ns_gpqa"],
        cwd=tmp_path, env=env_with_token, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and "nope" in done.stderr and "Traceback" not in done.stderr
    assert list(tmp_path.glob("*.yaml")) == []


def test_plan_names_unset_env_vars_without_failing(repo: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    env = {key: value for key, value in cli_env.items() if key != "HF_TOKEN"}
    done = plan(repo, env | {"QUANTEVAL_RECIPES_DIR": str(tmp_path / "none")}, tmp_path, "--tasks", "ns_gpqa")
    assert done.returncode == 0, done.stderr
    assert "HF_TOKEN" in done.stdout and "not ready yet" in done.stdout


def test_plan_with_bundled_recipes_keeps_their_repeats(repo: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    """The demo's command: recipe names resolve to NeMo-Skills tasks with the recipe's repeat counts."""
    env = cli_env | {"HF_TOKEN": "hf_dummy", "DUMMY_API_KEY": "dummy"}
    env.pop("QUANTEVAL_RECIPES_DIR", None)
    config = tmp_path / "demo.yaml"
    done = plan(repo, env, tmp_path, "--tasks", "gpqa,aime2025", "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["tasks"] == ["ns_gpqa", "ns_aime2025"]
    written = {task["name"]: task for task in yaml.safe_load(config.read_text())["evaluation"]["tasks"]}
    for task, recipe in {"ns_gpqa": "gpqa", "ns_aime2025": "aime2025"}.items():
        text = (repo / "recipes" / "tasks" / f"{recipe}.md").read_text(encoding="utf-8")
        (fragment,) = yaml.safe_load(text.split("```yaml\n")[1].split("```")[0])
        repeats = fragment["nemo_evaluator_config"]["config"]["params"]["extra"]["num_repeats"]
        assert written[task]["nemo_evaluator_config"]["config"]["params"]["extra"]["num_repeats"] == repeats
    assert not any("DUMMY_API_KEY" in name or "HF_TOKEN" in name for name in report["missing_values"])
