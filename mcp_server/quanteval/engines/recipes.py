"""Task recipes: recipes/tasks/<name>.md, reviewed by people, one per benchmark (its NEL task, YAML fragment,
params, env vars and score path). Knowledge both engines share, so it lives beside them: both engines' rules read
the recipes (with task_context_problem: what a task needs of the served context), the workflow's task tools list and
add them.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from quanteval.engines.catalogue import load_yaml, lookup
from quanteval.models import ToolError

RECIPE_SECTIONS = ("Task Details", "Params", "YAML", "Score Extraction")


def pack_dir() -> Path:
    """Root of the skill pack's files (recipes/, skills/, references/).

    In a source checkout (editable install) that is the repository root next to
    mcp_server/; an installed wheel carries a copy under the package as `_pack/`.
    """
    package = Path(__file__).resolve().parents[1]  # quanteval/, this module lives in quanteval/engines/
    checkout = package.parent.parent
    if (checkout / "recipes").is_dir():
        return checkout
    return package / "_pack"


def recipes_dir() -> Path:
    explicit = os.environ.get("QUANTEVAL_RECIPES_DIR")
    return Path(explicit).expanduser() if explicit else pack_dir() / "recipes" / "tasks"


class Recipe(BaseModel):
    name: str = Field(description="Recipe name (the file stem), e.g. gpqa.")
    nel_task: str = Field(description="The task name as NEL lists it, e.g. ns_gpqa.")
    harness: str = Field(description="Harness of the task, e.g. nemo_skills.")
    run_time: str = Field(description="Rough run time: short, medium or long.")
    metric: str = Field(description="Metric holding the headline score in results.yml.")
    score: str = Field(description="Score name under that metric.")
    scale: str = Field(description="fraction (0-1) or percent (0-100).")
    env_vars: list[str] = Field(default_factory=list, description="Environment variable names the task needs.")
    judge: bool = Field(default=False, description="Whether an LLM judge scores the task.")
    repeats: int = Field(default=1, description="How many times the recipe repeats each sample.")
    temperature: float | None = Field(
        default=None, description="Sampling temperature the YAML fragment's params state; null: the model card's.")
    top_p: float | None = Field(default=None, description="top_p the YAML fragment's params state; null when none.")
    samples: int | None = Field(
        default=None, description="Questions in the full dataset, one repeat (validate_run's expected count); null when unknown.")
    choices: int | None = Field(
        default=None, description="Options per question of a multiple-choice benchmark (validate_run's chance level); null otherwise.")
    prompt_tokens: int | None = Field(
        default=None, description="Longest prompt of the benchmark in tokens, its template included (approximate); null when unknown.")
    answer_tokens: int | None = Field(
        default=None, description="Smallest generation budget that does not truncate the answers; null when unknown.")
    score_path: str = Field(description="Dotted path of the headline score in artifacts/results.yml.")
    sections: dict[str, str] = Field(description="The recipe's Markdown sections by heading (Task Details, Params, ...).")
    yaml_fragment: str = Field(description="The evaluation.tasks list item, as YAML text.")
    path: str = Field(description="The recipe file.")


def recipe_error(path: Path, problem: str) -> ToolError:
    return ToolError(f"{path}: {problem}. Fix the recipe file.")


def parse_recipe(path: Path) -> Recipe:
    """Parse one recipe file; every format problem is a ToolError naming the file."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise recipe_error(path, f"cannot read ({exc.strerror})") from None
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---" or "---" not in (line.strip() for line in lines[1:]):
        raise recipe_error(path, "no YAML frontmatter between '---' lines at the top")
    end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    try:
        front = load_yaml("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        raise recipe_error(path, f"frontmatter is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(front, dict):
        raise recipe_error(path, "frontmatter must be a mapping of keys")
    missing = [key for key in ("name", "nel_task", "harness", "run_time", "metric", "score", "scale") if not front.get(key)]
    if missing:
        raise recipe_error(path, f"frontmatter lacks {', '.join(missing)}")
    if front["name"] != path.stem:
        raise recipe_error(path, f"frontmatter name '{front['name']}' differs from the file name '{path.stem}'")

    sections: dict[str, str] = {}
    heading: str | None = None
    for line in lines[end + 1 :]:
        if line.startswith("## "):
            heading = line[3:].strip()
            sections[heading] = ""
        elif heading is not None:
            sections[heading] += line + "\n"
    sections = {key: value.strip("\n") for key, value in sections.items()}
    absent = [name for name in RECIPE_SECTIONS if name not in sections]
    if absent:
        raise recipe_error(path, f"missing section(s) {', '.join('## ' + name for name in absent)}")

    fragment = _single_yaml_block(path, sections["YAML"])
    try:
        items = load_yaml(fragment)
    except yaml.YAMLError as exc:
        raise recipe_error(path, f"the ```yaml block is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not (isinstance(items, list) and len(items) == 1 and isinstance(items[0], dict)):
        raise recipe_error(path, "the ```yaml block must be exactly one evaluation.tasks list item ('- name: <task>')")
    fragment_task = str(items[0].get("name", ""))
    if fragment_task.split(".")[-1] != str(front["nel_task"]).split(".")[-1]:
        raise recipe_error(path, f"the YAML item's name '{fragment_task}' differs from nel_task '{front['nel_task']}'")

    params = ((items[0].get("nemo_evaluator_config") or {}).get("config") or {}).get("params") or {}
    try:
        return Recipe(
            name=front["name"],
            nel_task=str(front["nel_task"]),
            harness=str(front["harness"]),
            run_time=str(front["run_time"]),
            metric=str(front["metric"]),
            score=str(front["score"]),
            scale=str(front["scale"]),
            env_vars=[str(name) for name in front.get("env_vars") or []],
            judge=bool(front.get("judge", False)),
            repeats=int(front.get("repeats") or 1),
            temperature=float(params["temperature"]) if params.get("temperature") is not None else None,
            top_p=float(params["top_p"]) if params.get("top_p") is not None else None,
            samples=int(front["samples"]) if front.get("samples") is not None else None,
            choices=int(front["choices"]) if front.get("choices") is not None else None,
            prompt_tokens=int(front["prompt_tokens"]) if front.get("prompt_tokens") is not None else None,
            answer_tokens=int(front["answer_tokens"]) if front.get("answer_tokens") is not None else None,
            score_path=f"results.tasks.{fragment_task.split('.')[-1]}.metrics.{front['metric']}.scores.{front['score']}.value",
            sections=sections,
            yaml_fragment=fragment,
            path=str(path),
        )
    except (TypeError, ValueError) as exc:
        raise recipe_error(path, f"a frontmatter value has the wrong type ({exc})") from None


def _single_yaml_block(path: Path, section: str) -> str:
    blocks: list[str] = []
    current: list[str] | None = None
    for line in section.splitlines():
        stripped = line.strip()
        if current is None and stripped.startswith("```yaml"):
            current = []
        elif current is not None and stripped.startswith("```"):
            blocks.append("\n".join(current) + "\n")
            current = None
        elif current is not None:
            current.append(line)
    if len(blocks) != 1:
        raise recipe_error(path, f"'## YAML' must hold exactly one ```yaml block (found {len(blocks)})")
    return blocks[0]


_recipe_memo: dict[Path, tuple[tuple[int, int], Recipe]] = {}


def _cached_recipe(path: Path) -> Recipe:
    """parse_recipe, remembered until the file's size or mtime changes (list_tasks reads every recipe)."""
    stat = path.stat()
    key = (stat.st_size, stat.st_mtime_ns)
    cached = _recipe_memo.get(path)
    if cached is None or cached[0] != key:
        cached = _recipe_memo[path] = (key, parse_recipe(path))
    return cached[1]


def list_recipes() -> list[Recipe]:
    """Every recipe in recipes_dir(), sorted by name."""
    directory = recipes_dir()
    if not directory.is_dir():
        return []
    return [_cached_recipe(path) for path in sorted(directory.glob("*.md")) if path.stem.lower() != "readme"]


def recipe_for_benchmark(name: str) -> Recipe | None:
    """The recipe of a nel-next `skills://NAME` benchmark: the one whose NEL task runs the same NeMo-Skills benchmark."""
    if not name.startswith("skills://"):
        return None
    wanted = name.removeprefix("skills://")
    for recipe in list_recipes():
        entries = lookup(recipe.nel_task if "." in recipe.nel_task else f"{recipe.harness}.{recipe.nel_task}")
        if len(entries) == 1 and entries[0].harness_task == wanted:
            return recipe
    return None


def task_context_problem(task: str, recipe: Recipe | None, context: int | None, budget: int | None,
                         context_flag: str) -> tuple[str, str, str, str] | None:
    """(severity, rule, message, fix) when a task cannot work within the served context or its token budget, from the
    figures its recipe gives (longest prompt, smallest answer budget); None when fine or unknown."""
    if not recipe or not recipe.prompt_tokens or not recipe.answer_tokens or not context:
        return None
    need = recipe.prompt_tokens + recipe.answer_tokens
    if context < need:
        return ("error", "context_too_small_for_task",
                f"'{task}' needs a context of {need} tokens (prompts up to ~{recipe.prompt_tokens}, answers up to {recipe.answer_tokens}: "
                f"recipe {recipe.name}); the served context is {context}.",
                f"Serve a context of at least {need} ({context_flag}) if the model allows it, or drop '{task}'.")
    if budget is not None and budget < recipe.answer_tokens:
        return ("warning", "budget_truncates_answers",
                f"max tokens {budget} is below the {recipe.answer_tokens} '{task}' answers need (recipe {recipe.name}): truncated answers score 0.",
                f"Set it to at least {recipe.answer_tokens}; the {context}-token context leaves room up to {context - recipe.prompt_tokens}.")
    return None


def recipes_by_task() -> dict[str, Recipe]:
    """Recipes keyed by their NEL task name and by harness.task."""
    by_task: dict[str, Recipe] = {}
    for recipe in list_recipes():
        by_task[recipe.nel_task] = recipe
        by_task[f"{recipe.harness}.{recipe.nel_task}"] = recipe
    return by_task

