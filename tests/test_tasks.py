"""The NEL task catalogue, recipes and add_tasks, against NEL's real packaged task list and real files."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from quanteval.engines import catalogue
from quanteval.engines import recipes as recipe_files
from quanteval.models import ToolError
from quanteval.workflow import tasks

GPQA_RECIPE = """---
name: gpqa
nel_task: ns_gpqa
harness: nemo_skills
run_time: medium
metric: pass@1
score: accuracy
scale: percent
env_vars: [HF_TOKEN]
judge: false
repeats: 8
---
## Task Details
GPQA Diamond, 198 questions.

## Params
Eight repeats keep the stderr near one point.

## YAML
```yaml
- name: ns_gpqa  # reviewed recipe
  nemo_evaluator_config:
    config:
      params:
        extra:
          num_repeats: 8
```

## Score Extraction
`results.tasks.ns_gpqa.metrics.pass@1.scores.accuracy.value`
"""

CONFIG = """# my eval config
evaluation:
  tasks:
    - name: ns_ifbench  # keep me
deployment:
  served_model_name: tiny
"""


@pytest.fixture(autouse=True)
def empty_recipes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Tests see only the recipes they write, not the bundled ones (which change as they are reviewed)."""
    directory = tmp_path / "recipes"
    directory.mkdir()
    monkeypatch.setenv("QUANTEVAL_RECIPES_DIR", str(directory))
    return directory


@pytest.fixture
def recipes(empty_recipes: Path) -> Path:
    (empty_recipes / "gpqa.md").write_text(GPQA_RECIPE, encoding="utf-8")
    return empty_recipes


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    return path


# --- catalogue -------------------------------------------------------------------------------


def test_catalogue_matches_nel_packaged_task_list() -> None:
    source = yaml.load(catalogue.nel_tasks_file().read_bytes(), Loader=yaml.CSafeLoader)
    entries = tasks.catalogue()
    assert len(entries) == source["metadata"]["num_tasks"] == 421
    gpqa = tasks.lookup("ns_gpqa")
    assert [entry.qualified_name for entry in gpqa] == ["nemo_skills.ns_gpqa"]
    assert gpqa[0].container.startswith("nvcr.io/nvidia/eval-factory/nemo-skills")
    assert tasks.lookup("nemo_skills.ns_gpqa") == gpqa


def test_catalogue_agrees_with_nel_own_mapping() -> None:
    from nemo_evaluator_launcher.common.mapping import load_tasks_mapping

    mapping = load_tasks_mapping()
    assert {entry.qualified_name for entry in tasks.catalogue()} == {f"{h}.{t}" for h, t in mapping}


@pytest.mark.parametrize("name", ["mmlu_pro", "humaneval"])
def test_ambiguous_names_are_reported_with_qualified_names(name: str) -> None:
    matches = tasks.lookup(name)
    assert len(matches) > 1
    with pytest.raises(ToolError) as error:
        tasks.get_task_recipe(tasks.GetTaskRecipeInput(name=name))
    for entry in matches:
        assert entry.qualified_name in str(error.value)


def test_unknown_name_is_empty_and_suggestions_are_usable() -> None:
    assert tasks.lookup("aime2025") == []
    suggestions = tasks.suggest("aime2025")
    assert "ns_aime2025" in suggestions
    # an ambiguous near-miss is offered in its qualified form, which a config can use
    assert all(len(tasks.lookup(name)) == 1 for name in tasks.suggest("mmlu_pr"))


@pytest.fixture
def own_cache(isolated_state: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's cache, not the session's (conftest shares one across tests): the files it looks at are its own."""
    monkeypatch.setenv("QUANTEVAL_CACHE_DIR", str(isolated_state / "cache"))
    return isolated_state / "cache"


def test_cache_is_written_reused_and_invalidated_when_the_file_changes(tmp_path: Path, own_cache: Path) -> None:
    source = tmp_path / "all_tasks_irs.yaml"
    shutil.copy(catalogue.nel_tasks_file(), source)
    assert len(tasks.catalogue(source)) == 421
    cache_files = list(own_cache.glob("tasks-catalogue/nel-*.json"))
    assert len(cache_files) == 1

    catalogue._memo.clear()  # a new process: only the JSON cache is left, and NEL's YAML is not parsed again
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(catalogue, "_parse_tasks_file", lambda path: pytest.fail(f"{path} parsed again"))
        assert len(tasks.catalogue(source)) == 421

    document = yaml.load(source.read_bytes(), Loader=yaml.CSafeLoader)
    document["tasks"] = document["tasks"][:5]
    source.write_text(yaml.dump(document, Dumper=yaml.CSafeDumper), encoding="utf-8")
    os.utime(source, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert [entry.name for entry in tasks.catalogue(source)] == [task["name"] for task in document["tasks"]]


def test_corrupt_cache_is_rebuilt(own_cache: Path) -> None:
    catalogue._memo.clear()
    tasks.catalogue()
    (cache,) = own_cache.glob("tasks-catalogue/nel-*.json")
    cache.write_text("{not json", encoding="utf-8")
    catalogue._memo.clear()
    assert len(tasks.catalogue()) == 421
    assert json.loads(cache.read_text(encoding="utf-8"))["tasks"]


# --- list_tasks ------------------------------------------------------------------------------


def test_list_tasks_ranks_name_matches_first_and_paginates() -> None:
    first = tasks.list_tasks(tasks.ListTasksInput(query="gpqa", limit=3))
    assert first.total > 3 and first.next_offset == 3 and len(first.tasks) == 3
    assert first.tasks[0].name == "gpqa"
    pages = [first]
    while pages[-1].next_offset is not None:
        pages.append(tasks.list_tasks(tasks.ListTasksInput(query="gpqa", limit=3, offset=pages[-1].next_offset)))
    names = [task.qualified_name for page in pages for task in page.tasks]
    assert len(names) == len(set(names)) == first.total


def test_list_tasks_harness_filter_and_ambiguity_flag() -> None:
    result = tasks.list_tasks(tasks.ListTasksInput(query="mmlu_pro", harness="simple_evals"))
    assert result.tasks and all(task.harness == "simple_evals" for task in result.tasks)
    mmlu_pro = next(task for task in result.tasks if task.name == "mmlu_pro")
    assert mmlu_pro.ambiguous and mmlu_pro.qualified_name == "simple_evals.mmlu_pro"
    assert len(tasks.list_tasks(tasks.ListTasksInput(limit=200)).tasks) == 200


def test_list_tasks_unknown_harness_suggests() -> None:
    with pytest.raises(ToolError, match="Did you mean: nemo_skills"):
        tasks.list_tasks(tasks.ListTasksInput(harness="nemo-skills"))


def test_list_tasks_marks_tasks_with_recipes(recipes: Path) -> None:
    (task,) = [t for t in tasks.list_tasks(tasks.ListTasksInput(query="ns_gpqa")).tasks if t.name == "ns_gpqa"]
    assert task.recipe == "gpqa"


# --- recipes ---------------------------------------------------------------------------------


def test_recipe_is_parsed(recipes: Path) -> None:
    recipe = recipe_files.parse_recipe(recipes / "gpqa.md")
    assert (recipe.nel_task, recipe.harness, recipe.repeats, recipe.env_vars) == ("ns_gpqa", "nemo_skills", 8, ["HF_TOKEN"])
    assert recipe.score_path == "results.tasks.ns_gpqa.metrics.pass@1.scores.accuracy.value"
    assert set(recipe_files.RECIPE_SECTIONS) <= set(recipe.sections)
    assert yaml.safe_load(recipe.yaml_fragment)[0]["nemo_evaluator_config"]["config"]["params"]["extra"]["num_repeats"] == 8
    assert [r.name for r in tasks.list_recipes()] == ["gpqa"]


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        (GPQA_RECIPE.replace("name: gpqa\n", "name: gpqa2\n"), "differs from the file name"),
        (GPQA_RECIPE.replace("metric: pass@1\n", ""), "lacks metric"),
        (GPQA_RECIPE.replace("## Score Extraction", "## Scores"), "missing section"),
        (GPQA_RECIPE.replace("```yaml\n- name: ns_gpqa", "```yaml\n- name: ns_aime2025"), "differs from nel_task"),
        (GPQA_RECIPE.replace("## Score Extraction", "```yaml\n- name: x\n```\n## Score Extraction"), "exactly one"),
        (GPQA_RECIPE[4:], "frontmatter"),
    ],
)
def test_broken_recipes_name_the_file_and_problem(recipes: Path, broken: str, message: str) -> None:
    (recipes / "gpqa.md").write_text(broken, encoding="utf-8")
    with pytest.raises(ToolError, match=message) as error:
        recipe_files.parse_recipe(recipes / "gpqa.md")
    assert "gpqa.md" in str(error.value)


def test_get_task_recipe_with_and_without_recipe(recipes: Path) -> None:
    with_recipe = tasks.get_task_recipe(tasks.GetTaskRecipeInput(name="gpqa"))
    assert with_recipe.has_recipe and with_recipe.recipe and with_recipe.recipe.repeats == 8
    assert with_recipe.task.qualified_name == "nemo_skills.ns_gpqa"
    by_task_name = tasks.get_task_recipe(tasks.GetTaskRecipeInput(name="ns_gpqa"))
    assert by_task_name.recipe == with_recipe.recipe

    bare = tasks.get_task_recipe(tasks.GetTaskRecipeInput(name="simple_evals.mmlu_pro"))
    assert not bare.has_recipe and bare.recipe is None
    assert yaml.safe_load(bare.yaml_fragment) == [{"name": "simple_evals.mmlu_pro"}]
    assert "No reviewed recipe" in bare.note


def test_bundled_recipes_parse_and_name_real_nel_tasks(monkeypatch: pytest.MonkeyPatch, repo: Path) -> None:
    monkeypatch.delenv("QUANTEVAL_RECIPES_DIR", raising=False)
    assert tasks.recipes_dir() == repo / "recipes" / "tasks"
    for recipe in tasks.list_recipes():
        resolved = tasks.resolve(recipe.name)
        assert resolved.entry.harness == recipe.harness, recipe.path
        assert tasks.resolve(recipe.nel_task).recipe == recipe


# --- add_tasks -------------------------------------------------------------------------------


def test_add_tasks_inserts_recipe_fragment_and_bare_names(recipes: Path, config: Path) -> None:
    result = tasks.add_tasks(tasks.AddTasksInput(config_path=str(config), tasks=["gpqa", "ns_aime2025", "simple_evals.mmlu_pro"]))
    assert [(a.task, a.recipe, a.repeats) for a in result.added] == [
        ("ns_gpqa", "gpqa", 8),
        ("ns_aime2025", None, None),
        ("simple_evals.mmlu_pro", None, None),
    ]
    assert result.env_vars == ["HF_TOKEN"] and not result.judge_needed
    assert "+    - name: ns_aime2025" in result.diff
    text = config.read_text(encoding="utf-8")
    assert "# my eval config" in text and "# keep me" in text and "# reviewed recipe" in text
    written = yaml.safe_load(text)["evaluation"]["tasks"]
    assert [task["name"] for task in written] == ["ns_ifbench", "ns_gpqa", "ns_aime2025", "simple_evals.mmlu_pro"]
    assert written[1]["nemo_evaluator_config"]["config"]["params"]["extra"]["num_repeats"] == 8


def test_add_tasks_skips_tasks_already_present(recipes: Path, config: Path) -> None:
    result = tasks.add_tasks(tasks.AddTasksInput(config_path=str(config), tasks=["nemo_skills.ns_ifbench", "gpqa", "ns_gpqa"]))
    assert [a.task for a in result.added] == ["ns_gpqa"]
    assert [s.requested for s in result.skipped] == ["nemo_skills.ns_ifbench", "ns_gpqa"]
    again = tasks.add_tasks(tasks.AddTasksInput(config_path=str(config), tasks=["gpqa"]))
    assert again.added == [] and again.diff == ""
    assert [t["name"] for t in yaml.safe_load(config.read_text())["evaluation"]["tasks"]] == ["ns_ifbench", "ns_gpqa"]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["gpqa", "aime2025"], "Did you mean: .*ns_aime2025"),
        (["gpqa", "mmlu_pro"], "ambiguous.*lm-evaluation-harness.mmlu_pro.*simple_evals.mmlu_pro"),
    ],
)
def test_add_tasks_bad_names_fail_before_anything_is_written(recipes: Path, config: Path, names: list[str], message: str) -> None:
    with pytest.raises(ToolError, match=message):
        tasks.add_tasks(tasks.AddTasksInput(config_path=str(config), tasks=names))
    assert config.read_text(encoding="utf-8") == CONFIG


def test_add_tasks_creates_evaluation_tasks_and_rejects_a_non_list(recipes: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("deployment:\n  type: vllm\n", encoding="utf-8")
    tasks.add_tasks(tasks.AddTasksInput(config_path=str(empty), tasks=["ns_aime2025"]))
    assert yaml.safe_load(empty.read_text())["evaluation"]["tasks"] == [{"name": "ns_aime2025"}]

    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("evaluation:\n  tasks: ns_gpqa\n", encoding="utf-8")
    with pytest.raises(ToolError, match="evaluation.tasks must be a list"):
        tasks.add_tasks(tasks.AddTasksInput(config_path=str(wrong), tasks=["gpqa"]))
    assert wrong.read_text(encoding="utf-8") == "evaluation:\n  tasks: ns_gpqa\n"


def test_add_tasks_through_the_cli(recipes: Path, config: Path, cli_env: dict[str, str]) -> None:
    import subprocess

    arguments = json.dumps({"config_path": str(config), "tasks": ["gpqa"]})
    done = subprocess.run(["quanteval", "call", "add_tasks", "--json", arguments], env=cli_env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["added"][0]["recipe"] == "gpqa"
    bad = subprocess.run(
        ["quanteval", "call", "add_tasks", "--json", json.dumps({"config_path": str(config), "tasks": ["gpqq"]})],
        env=cli_env, capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode == 1 and "Did you mean" in bad.stderr and "Traceback" not in bad.stderr
