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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_plan_names_unset_env_vars_without_failing(repo: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    env = {key: value for key, value in cli_env.items() if key != "HF_TOKEN"}
    done = plan(repo, env | {"QUANTEVAL_RECIPES_DIR": str(tmp_path / "none")}, tmp_path, "--tasks", "ns_gpqa")
    assert done.returncode == 0, done.stderr
    assert "HF_TOKEN" in done.stdout and "not ready yet" in done.stdout


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_demo_ends_naming_the_one_value_only_the_user_has(repo: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    """scripts/demo's command without HF_TOKEN: everything else is derived; the token is named once, with how to give it."""
    env = {key: value for key, value in cli_env.items() if key not in ("HF_TOKEN", "DUMMY_API_KEY", "QUANTEVAL_RECIPES_DIR")}
    done = plan(repo, env, tmp_path, "--tasks", "gpqa,aime2025", "--config", str(tmp_path / "demo.yaml"), "--output-dir", str(tmp_path / "results"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    still = out.split("still needs a value (only you can give these):\n")[1].split("validation:")[0]
    assert still.strip().splitlines() == [still.strip().splitlines()[0]] and still.strip().startswith("- HF_TOKEN: export HF_TOKEN=")
    assert "tokenizer" not in out  # derived or not needed: never asked of the user
    assert len([line for line in out.splitlines() if "Blackwell" in line]) == 1  # the NVFP4 note, once
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert len(notes) == len(set(notes))
    ready = plan(repo, env | {"HF_TOKEN": "hf_dummy"}, tmp_path, "--tasks", "gpqa,aime2025", "--config", str(tmp_path / "demo.yaml"),
                 "--output-dir", str(tmp_path / "results"), "--force")
    assert ready.returncode == 0, ready.stderr
    assert "missing values: none" in ready.stdout and "ready for a canary" in ready.stdout and "FAILED" not in ready.stdout


@pytest.mark.slow
def test_plan_set_writes_the_users_values_after_the_checkpoint(repo: Path, env_with_token: dict[str, str], tmp_path: Path) -> None:
    config = tmp_path / "slurm.yaml"
    done = plan(repo, env_with_token | {"USER": "tester"}, tmp_path, "--tasks", "gpqa", "--execution", "slurm", "--deployment", "sglang",
                "--config", str(config), "--set", "execution.hostname=login.example", "--set", "execution.account=llm_eval",
                "--set", "execution.output_dir=/lustre/evals", "--set", "evaluation.nemo_evaluator_config.config.params.temperature=0.7")
    assert done.returncode == 0, done.stderr
    written = yaml.safe_load(config.read_text())
    assert written["execution"]["account"] == "llm_eval" and written["execution"]["output_dir"] == "/lustre/evals"
    assert written["evaluation"]["nemo_evaluator_config"]["config"]["params"]["temperature"] == 0.7  # the user's value wins
    # login.example is no cluster: what only the cluster can tell stays unchecked, so the plan is not ready
    assert "ready for a canary" not in done.stdout and "login.example could not be asked" in done.stdout
    bad = plan(repo, env_with_token, tmp_path, "--tasks", "gpqa", "--set", "no-equals-sign")
    assert bad.returncode != 0 and "KEY=VALUE" in bad.stderr


def test_plan_on_slurm_without_a_host_is_not_ready_and_names_what_only_the_cluster_knows(repo, env_with_token, tmp_path):
    done = plan(repo, env_with_token, tmp_path, "--execution", "slurm", "--tasks", "ns_gpqa", "--json",
                "--set", "execution.account=acct", "--set", "execution.output_dir=/lustre/me/results")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert not report["ready"]
    unknown = " ".join(report["cluster_unknowns"])
    for fact in ("execution.partition", "execution.gres", "execution.walltime", "--host"):
        assert fact in unknown
    text = plan(repo, env_with_token, tmp_path, "--execution", "slurm", "--tasks", "ns_gpqa", "--config", "b.yaml").stdout
    assert "not checked against the cluster:" in text and "ready for a canary" not in text


def test_plan_on_slurm_with_a_host_asks_the_real_cluster(repo, env_with_token, tmp_path, slurm_cluster):
    """The cluster is read over SSH (sinfo/scontrol on the test suite's SLURM): partition, gres for this model's one GPU,
    walltime within the partition's limit, and the ssh config's user instead of $USER."""
    env = env_with_token | {"USER": "not-the-cluster-user"}
    done = plan(repo, env, tmp_path, "--execution", "slurm", "--deployment", "sglang", "--tasks", "ns_gpqa", "--json",
                "--host", slurm_cluster.ssh_alias, "--set", "execution.account=quanteval-test",
                "--set", f"execution.output_dir={slurm_cluster.jobs_dir / tmp_path.name}")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["cluster_unknowns"] == []
    assert [s["tool"] for s in report["steps"]].count("apply_cluster") == 1
    execution = yaml.safe_load(Path(report["config_path"]).read_text())["execution"]
    assert execution["hostname"] == slurm_cluster.ssh_alias and execution["username"] == slurm_cluster.user
    assert execution["partition"] in ("debug", "hopper") and execution["gres"] == "gpu:1" and execution["walltime"]
    assert any("H100" in note and "Marlin" in note for note in report["notes"])  # NVFP4 measured on Hopper
