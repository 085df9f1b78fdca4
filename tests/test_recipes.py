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


@pytest.mark.slow
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


# ---------------------------------------------------------------- what a recipe says of its data, against the data

# What a recipe (its Markdown and get_task_recipe's nel-next note) may say its answers are, and the test a dataset
# row's expected_answer must pass for that to be true.
ANSWER_TYPES = {
    "integer": (re.compile(r"\binteger answers?\b", re.IGNORECASE), re.compile(r"-?\d+")),
    "multiple choice": (re.compile(r"\bmultiple[- ]choice\b|\bchoice letter\b", re.IGNORECASE), re.compile(r"[A-J]")),
}
PROBLEM_COUNT = re.compile(r"\bthe (\d[\d,]*) (?:problems|questions)\b")
NEMO_SKILLS_VENDORED = Path(os.environ.get("QUANTEVAL_VENDOR_DIR") or REPO.parent / "shared" / "vendor")


def _nemo_skills_rows(name: str) -> tuple[list[dict], str] | None:
    """The rows NeMo-Skills ships in its package for benchmark `name` (DIR/NAME/test.txt, JSON lines: aime24, aime25,
    comp-math-24-25), and where they came from: an installed NeMo-Skills (nel-next's venv, the eval server's), else
    the vendored source tarball. None when neither has them (other benchmarks' data is downloaded by `ns prepare_data`)."""
    import json
    import tarfile

    from quanteval.engines.nemo_skills_source import NEMO_SKILLS_COMMIT

    for venv in (envvars.engine_venv("QUANTEVAL_NEL_NEXT_VENV", ".venv-nel-next"),
                 envvars.engine_venv("QUANTEVAL_NS_VENV", ".venv-nemo-skills")):
        for shipped in venv.glob(f"lib/python3*/site-packages/nemo_skills/dataset/{name}/test.txt"):
            text = shipped.read_text(encoding="utf-8")
            break
        else:
            continue
        break
    else:
        tarball = NEMO_SKILLS_VENDORED / f"nemo-skills-{NEMO_SKILLS_COMMIT}.tar.gz"
        if not tarball.is_file():
            return None
        with tarfile.open(tarball) as archive:
            member = next((m for m in archive.getmembers() if m.name.endswith(f"/nemo_skills/dataset/{name}/test.txt")), None)
            if member is None:
                return None
            text = archive.extractfile(member).read().decode("utf-8")
        shipped = tarball
    try:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError:
        return None  # ids to download (challenge19's test.txt), not the rows themselves
    return (rows, str(shipped)) if rows and all(isinstance(row, dict) and "expected_answer" in row for row in rows) else None


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_what_a_recipe_says_of_its_answers_and_count_is_what_its_data_holds(path: Path):
    """Each answer type a recipe states (its text, and get_task_recipe's note on its nel-next form) and its problem
    count (frontmatter `samples`, "the N problems") hold for every row of the data it names, where that data is here
    offline (NeMo-Skills ships a few benchmarks' rows in its package)."""
    recipe = recipes.parse_recipe(path)
    if recipe.harness != "nemo_skills":
        pytest.skip(f"{recipe.nel_task}: harness {recipe.harness}; only NeMo-Skills' packaged data is at hand offline")
    entry = tasks.resolve(recipe.nel_task).entry
    data_name = entry.harness_task or recipe.nel_task.removeprefix("ns_")
    found = _nemo_skills_rows(data_name)
    if found is None:
        pytest.skip(f"{recipe.nel_task}: NeMo-Skills' '{data_name}' rows are not shipped in its package (downloaded by "
                    f"`ns prepare_data`), or no NeMo-Skills is here ({NEMO_SKILLS_VENDORED}, .venv-nel-next, .venv-nemo-skills)")
    rows, source = found
    stated = "\n".join([*recipe.sections.values(), tasks.get_task_recipe(tasks.GetTaskRecipeInput(name=recipe.name)).nel_next.note])
    claims = {kind for kind, (said, _) in ANSWER_TYPES.items() if said.search(stated)}
    assert claims, f"{path.name} states no answer type ({', '.join(ANSWER_TYPES)})"
    for kind in sorted(claims):
        answer = ANSWER_TYPES[kind][1]
        misfits = [row["expected_answer"] for row in rows if not answer.fullmatch(str(row["expected_answer"]).strip())]
        said = ANSWER_TYPES[kind][0].search(stated)
        context = stated[max(0, said.start() - 80):said.end() + 40].replace("\n", " ")
        assert not misfits, (f"{path.name} (or its nel-next note) says '{said.group(0)}' (…{context}…), but {len(misfits)} "
                             f"of {len(rows)} answers in {source} are not: {misfits[:3]}")
    counts = {int(match.replace(",", "")) for match in PROBLEM_COUNT.findall(stated)} | ({recipe.samples} if recipe.samples else set())
    assert counts <= {len(rows)}, f"{path.name} states {sorted(counts)} problems; {source} holds {len(rows)}"
