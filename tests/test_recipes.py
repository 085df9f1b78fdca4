"""Task recipes: the agreed format, real NEL task names, and fragments NEL itself accepts.

Each recipe's YAML fragment is inserted into recipes/examples/example_eval.yaml, every `???`
is filled with a plausible value, and the result goes through NEL's own `nel run --dry-run`
(a real subprocess, dummy secrets in the environment) and quanteval's validate_config.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tiers import REPO

from quanteval import envvars
from quanteval.engines import recipes
from quanteval.workflow import tasks

RECIPES = sorted((REPO / "recipes" / "tasks").glob("*.md"))
BASE_CONFIG = REPO / "recipes" / "examples" / "example_eval.yaml"
REQUIRED_RECIPES = {
    "mmlu_pro", "mmmu_pro", "gpqa", "aime2025", "livecodebench",
    "ifbench", "scicode", "aa_lcr", "ns_hle_aa", "tau2_bench_telecom",
}
NEL = Path(sys.executable).with_name("nel")

# Values a person would type for each kind of `???`; anything else gets a name-like string.
FILLED_VALUES = {
    "hostname": "login.cluster.example",
    "account": "eval-account",
    "output_dir": "/lustre/evals/quanteval-test",
    "checkpoint_path": "/lustre/checkpoints/model-fp8",
    "served_model_name": "model-fp8",
    "temperature": 0.6,
    "top_p": 0.95,
    "max_new_tokens": 32768,
    "url": "https://judge.example/v1",
    "model_id": "judge-model",
}


def _fill_missing(node, key: str = ""):
    if isinstance(node, dict):
        return {k: _fill_missing(v, k) for k, v in node.items()}
    if isinstance(node, list):
        return [_fill_missing(v, key) for v in node]
    if node == "???":
        return FILLED_VALUES.get(key, f"filled-{key}")
    return node


def _recipe_config(recipe: tasks.Recipe, tmp_path: Path) -> Path:
    base = yaml.safe_load(BASE_CONFIG.read_text())
    base["evaluation"]["tasks"] = yaml.safe_load(recipe.yaml_fragment)
    config = tmp_path / f"{recipe.name}.yaml"
    config.write_text(yaml.safe_dump(_fill_missing(base), sort_keys=False))
    return config


def _dummy_secrets(names) -> dict[str, str]:
    env = dict(os.environ, NEMO_EVALUATOR_TELEMETRY_LEVEL="0", USER=os.environ.get("USER", "tester"))
    env.update({name: "dummy-not-a-secret" for name in names})
    return env


def test_every_required_recipe_is_there():
    assert {path.stem for path in RECIPES} >= REQUIRED_RECIPES


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_follows_the_agreed_format(path: Path):
    recipe = recipes.parse_recipe(path)
    assert recipe.name == path.stem
    assert recipe.run_time in {"short", "medium", "long"}
    assert recipe.scale in {"fraction", "percent"}
    assert recipe.repeats >= 1
    text = path.read_text()
    headings = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert headings == ["Task Details", "Params", "YAML", "Score Extraction"]
    assert text.count("```yaml") == 1
    fragment = yaml.safe_load(recipe.yaml_fragment)
    assert isinstance(fragment, list) and len(fragment) == 1, "the YAML block is ONE evaluation.tasks item"
    assert fragment[0]["name"] == recipe.nel_task
    # The score path the recipe promises is spelled out in its Score Extraction section, stderr included.
    score_path = f"results.tasks.{recipe.nel_task}.metrics.{recipe.metric}.scores.{recipe.score}"
    assert f"{score_path}.value" in text and f"{score_path}.stats.stderr" in text


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_names_one_real_nel_task(path: Path):
    recipe = recipes.parse_recipe(path)
    matches = tasks.lookup(recipe.nel_task)
    assert [entry.harness for entry in matches] == [recipe.harness], f"{recipe.nel_task} must be unambiguous in NEL"


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_env_vars_are_known_and_documented(path: Path):
    recipe = recipes.parse_recipe(path)
    documented = (REPO / "env.example").read_text()
    for name in recipe.env_vars:
        assert name in envvars.KNOWN_ENV_VARS
        assert re.search(rf"^#?\s*{name}=", documented, re.MULTILINE), f"{name} missing from env.example"
    # Every host:VAR the fragment forwards must be declared, or NEL refuses to run with it unset.
    for forwarded in re.findall(r"host:([A-Z0-9_]+)", recipe.yaml_fragment):
        assert forwarded in recipe.env_vars


@pytest.fixture(scope="module")
def nel_dry_run(tmp_path_factory) -> subprocess.CompletedProcess:
    """One `nel run --dry-run` of the base config holding every recipe's fragment (one run costs ~8 s of CPU)."""
    workdir = tmp_path_factory.mktemp("dry-run")
    base = yaml.safe_load(BASE_CONFIG.read_text())
    base["evaluation"]["tasks"] = [yaml.safe_load(recipes.parse_recipe(path).yaml_fragment)[0] for path in RECIPES]
    config = workdir / "all_recipes.yaml"
    config.write_text(yaml.safe_dump(_fill_missing(base), sort_keys=False))
    names = {name for path in RECIPES for name in recipes.parse_recipe(path).env_vars}
    return subprocess.run(
        [str(NEL), "run", "--config", str(config), "--dry-run"],
        cwd=workdir, env=_dummy_secrets([*names, "HF_TOKEN", "DUMMY_API_KEY"]),
        capture_output=True, text=True, timeout=300,
    )


@pytest.mark.parametrize("index_and_path", list(enumerate(RECIPES)), ids=lambda item: item[1].stem)
def test_recipe_in_base_config_passes_nel_dry_run(index_and_path, nel_dry_run):
    index, path = index_and_path
    recipe = recipes.parse_recipe(path)
    assert nel_dry_run.returncode == 0, nel_dry_run.stdout[-2000:] + nel_dry_run.stderr[-2000:]
    assert "Job submission failed" not in nel_dry_run.stdout
    # NEL renders one job script per task, under <task>.<position>/; the recipe's task must be among them.
    assert f"/{recipe.nel_task}.{index}/artifacts" in nel_dry_run.stdout


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_in_base_config_passes_validate_config(path: Path, tmp_path: Path, monkeypatch):
    from quanteval import registry

    recipe = recipes.parse_recipe(path)
    config = _recipe_config(recipe, tmp_path)
    for name, value in _dummy_secrets([*recipe.env_vars, "HF_TOKEN", "DUMMY_API_KEY"]).items():
        monkeypatch.setenv(name, value)
    spec = registry.get_tool("validate_config")
    result = registry.call_tool(spec, registry.parse_arguments(spec, {"config_path": str(config)}))
    assert result.valid and result.warnings == 0, result.model_dump()["problems"]


def test_base_config_leaves_only_person_specific_values_missing():
    base = yaml.safe_load(BASE_CONFIG.read_text())
    assert base["defaults"][-1] == "_self_"
    missing = sorted(re.findall(r"^\s*(\w+): \?\?\?", BASE_CONFIG.read_text(), re.MULTILINE))
    assert missing == sorted(
        ["hostname", "account", "output_dir", "checkpoint_path", "served_model_name", "temperature", "top_p", "max_new_tokens"]
    )
    assert base["target"]["api_endpoint"]["api_key_name"] == "DUMMY_API_KEY"
