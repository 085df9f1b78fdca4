"""The task tools: list NEL's tasks and the reviewed recipes, show a recipe, add tasks to a config.

The catalogue lives in engines/catalogue.py, the recipes in engines/recipes.py, beside the engines: both engines' rules
read them too. What a task becomes in a config is each engine's (ConfigRole.add_task, and Evaluation.task_form of
the engine that evaluates).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from quanteval import engines
from quanteval.engines.catalogue import TaskEntry, catalogue, load_yaml, lookup, nel_version, suggest
from quanteval.engines.recipes import Recipe, list_recipes, recipe_error, recipes_dir
from quanteval.models import StrictModel, ToolError

# --- resolving a requested name to a recipe or a catalogue task -------------------------------


class ResolvedTask(BaseModel):
    requested: str
    recipe: Recipe | None
    entry: TaskEntry
    config_name: str  # the name to write into evaluation.tasks[].name


def _unknown_task_error(name: str, recipes: list[Recipe]) -> ToolError:
    close = difflib.get_close_matches(name, [recipe.name for recipe in recipes], n=2) + suggest(name)
    hint = f" Did you mean: {', '.join(dict.fromkeys(close))}?" if close else " Run list_tasks to search the catalogue."
    return ToolError(f"tasks: '{name}' is neither a recipe in {recipes_dir()} nor a NEL task.{hint}")


def _ambiguous_task_error(name: str, entries: list[TaskEntry]) -> ToolError:
    qualified = ", ".join(entry.qualified_name for entry in entries)
    return ToolError(f"tasks: '{name}' is ambiguous: NEL has it in several harnesses. Use one of: {qualified}.")


def resolve(name: str, recipes: list[Recipe] | None = None) -> ResolvedTask:
    """A recipe name (file stem), a recipe's nel_task, or a bare / `harness.task` NEL name."""
    name = name.strip()
    recipes = list_recipes() if recipes is None else recipes
    recipe = next((r for r in recipes if r.name == name), None) or next(
        (r for r in recipes if name in (r.nel_task, f"{r.harness}.{r.nel_task}")), None
    )
    if recipe is not None:
        entries = lookup(recipe.nel_task if "." in recipe.nel_task else f"{recipe.harness}.{recipe.nel_task}")
        if not entries:
            raise recipe_error(Path(recipe.path), f"nel_task '{recipe.nel_task}' (harness {recipe.harness}) is not in NEL {nel_version()}'s task list")
        config_name = str(load_yaml(recipe.yaml_fragment)[0]["name"])
        return ResolvedTask(requested=name, recipe=recipe, entry=entries[0], config_name=config_name)
    entries = lookup(name)
    if not entries:
        raise _unknown_task_error(name, recipes)
    if len(entries) > 1:
        raise _ambiguous_task_error(name, entries)
    return ResolvedTask(requested=name, recipe=None, entry=entries[0], config_name=name)


def generic_fragment(config_name: str) -> str:
    """The evaluation.tasks item for a task without a recipe: NEL's own defaults."""
    return f"- name: {config_name}\n"


# --- tools ------------------------------------------------------------------------------------


class ListTasksInput(StrictModel):
    query: str = Field(
        default="",
        description="Text in task names or descriptions, e.g. 'gpqa'. Empty: all.",
    )
    harness: str | None = Field(
        default=None, description="Only this harness, e.g. 'nemo_skills'."
    )
    offset: int = Field(default=0, ge=0, description="Matches to skip (next_offset of the last page).")
    limit: int = Field(default=30, ge=1, le=200, description="Page size.")


class TaskSummary(BaseModel):
    name: str = Field(description="Task name as NEL lists it.")
    harness: str = Field(description="Harness the task belongs to.")
    qualified_name: str = Field(description="`harness.name`; use it in a config when `ambiguous` is true.")
    ambiguous: bool = Field(description="True when several harnesses have a task of this name: the bare name fails in NEL.")
    recipe: str | None = Field(description="Name of the reviewed recipe for this task, if there is one (prefer it in add_tasks).")
    description: str = Field(description="NEL's description, shortened.")


class ListTasksOutput(BaseModel):
    total: int = Field(description="Matches in all, across pages.")
    offset: int
    limit: int
    next_offset: int | None = Field(description="Offset of the next page; null on the last page.")
    nel_version: str = Field(description="Version of NEL whose task list this is.")
    tasks: list[TaskSummary]


def _shorten(text: str, width: int = 200) -> str:
    return text if len(text) <= width else text[: width - 1].rsplit(" ", 1)[0] + "…"


def list_tasks(request: ListTasksInput) -> ListTasksOutput:
    """Use before add_tasks to find a benchmark's exact task name in NEL 0.2.6's catalogue, and whether a recipe
    exists. Paginated.
    """
    entries = catalogue()
    if request.harness is not None:
        harnesses = list(dict.fromkeys(entry.harness for entry in entries))
        if request.harness not in harnesses:
            close = difflib.get_close_matches(request.harness, harnesses, n=3)
            hint = f"Did you mean: {', '.join(close)}?" if close else f"Harnesses: {', '.join(harnesses)}."
            raise ToolError(f"harness: no harness named '{request.harness}'. {hint}")
        entries = [entry for entry in entries if entry.harness == request.harness]

    query = request.query.strip().lower()
    if query:
        ranked = []
        for position, entry in enumerate(entries):
            name = entry.qualified_name.lower()
            if query in (entry.name.lower(), name):
                rank = 0
            elif query in name:
                rank = 1
            elif query in entry.description.lower():
                rank = 2
            else:
                continue
            ranked.append((rank, position, entry))
        entries = [entry for _, _, entry in sorted(ranked, key=lambda item: item[:2])]

    counts: dict[str, int] = {}
    for entry in catalogue():
        counts[entry.name] = counts.get(entry.name, 0) + 1
    recipe_by_task = {(recipe.harness, recipe.nel_task.split(".")[-1]): recipe.name for recipe in list_recipes()}
    page = entries[request.offset : request.offset + request.limit]
    end = request.offset + len(page)
    return ListTasksOutput(
        total=len(entries),
        offset=request.offset,
        limit=request.limit,
        next_offset=end if end < len(entries) else None,
        nel_version=nel_version(),
        tasks=[
            TaskSummary(
                name=entry.name,
                harness=entry.harness,
                qualified_name=entry.qualified_name,
                ambiguous=counts[entry.name] > 1,
                recipe=recipe_by_task.get((entry.harness, entry.name)),
                description=_shorten(entry.description),
            )
            for entry in page
        ],
    )


class GetTaskRecipeInput(StrictModel):
    name: str = Field(
        description="Recipe name ('gpqa') or catalogue task name, bare or 'harness.task'."
    )


class NelNextForm(BaseModel):
    benchmark: dict[str, Any] | None = Field(description="The nel-next `benchmarks` list item, or null when no nel-next benchmark runs the task.")
    note: str = Field(description="What the nel-next form scores, or why there is none.")


def nel_next_form(qualified_name: str, repeats: int = 1) -> NelNextForm:
    """The task as nel-next runs it (get_task_recipe's `nel_next`, named so in the tool's output), from the engine that
    evaluates (engines.evaluating: nel-next): the same mapping as convert_config and add_tasks."""
    benchmark, note = engines.evaluating().evaluation.task_form(qualified_name, repeats)
    return NelNextForm(benchmark=benchmark, note=note)


class GetTaskRecipeOutput(BaseModel):
    name: str = Field(description="The name asked for.")
    has_recipe: bool = Field(description="True when a reviewed recipe exists; false means NEL defaults only.")
    recipe: Recipe | None = Field(description="The recipe: frontmatter fields, Markdown sections and YAML fragment.")
    task: TaskEntry = Field(description="The NEL catalogue entry of the task.")
    yaml_fragment: str = Field(description="The evaluation.tasks list item add_tasks would insert.")
    nel_next: NelNextForm = Field(description="The task's nel-next (nemo-evaluator >= 0.3) form, or why it has none.")
    note: str = Field(description="What to keep in mind about this task.")


def get_task_recipe(request: GetTaskRecipeInput) -> GetTaskRecipeOutput:
    """Use before adding a task: its reviewed recipe (params, repeats, judge, env vars, score path), or the catalogue's
    entry if none exists.
    """
    resolved = resolve(request.name)
    if resolved.recipe is not None:
        recipe = resolved.recipe
        notes = [f"Reviewed recipe {recipe.path}; headline score at {recipe.score_path} ({recipe.scale})."]
        if recipe.env_vars:
            notes.append(f"Needs env vars: {', '.join(recipe.env_vars)}.")
        if recipe.judge:
            notes.append("Scored by an LLM judge: the judge endpoint must be configured.")
        return GetTaskRecipeOutput(
            name=request.name,
            has_recipe=True,
            recipe=recipe,
            task=resolved.entry,
            yaml_fragment=recipe.yaml_fragment,
            nel_next=nel_next_form(resolved.entry.qualified_name, recipe.repeats),
            note=" ".join(notes),
        )
    return GetTaskRecipeOutput(
        name=request.name,
        has_recipe=False,
        recipe=None,
        task=resolved.entry,
        yaml_fragment=generic_fragment(resolved.config_name),
        nel_next=nel_next_form(resolved.entry.qualified_name),
        note=(
            f"No reviewed recipe for {resolved.entry.qualified_name}: the fragment uses NEL's defaults "
            "(params, repeats and score path unchecked). Check the task's docs before a full run."
        ),
    )


class AddTasksInput(StrictModel):
    config_path: str = Field(description="The config file (.yaml).")
    tasks: list[str] = Field(
        min_length=1,
        description="Recipe names ('gpqa', 'aime2025') or catalogue task names, bare or 'harness.task'.",
    )
    replace: bool = Field(
        False, description="Replace the tasks build_config wrote instead of adding to them.",
    )


class AddedTask(BaseModel):
    requested: str = Field(description="The name as given.")
    task: str = Field(description="The name written to evaluation.tasks[].name (nel-next: benchmarks[].name).")
    recipe: str | None = Field(description="The recipe used, or null for NEL defaults.")
    repeats: int | None = Field(description="Repeat count the recipe sets (null without a recipe).")


class SkippedTask(BaseModel):
    requested: str
    reason: str


class AddTasksOutput(BaseModel):
    config_path: str
    added: list[AddedTask]
    skipped: list[SkippedTask] = Field(description="Tasks not added, with why (already present).")
    env_vars: list[str] = Field(description="Env var names the added recipes need (names only).")
    judge_needed: bool = Field(description="True when an added task is scored by an LLM judge.")
    diff: str = Field(description="Unified diff of the config change ('' when nothing changed).")


def add_tasks(request: AddTasksInput) -> AddTasksOutput:
    """Use after build_config: adds tasks (recipe or catalogue task names, checked first; nel-next: as skills://NAME with their
    prompt); returns a diff.
    """
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    recipes = list_recipes()
    resolved = [resolve(name, recipes) for name in request.tasks]
    added: list[AddedTask] = []
    skipped: list[SkippedTask] = []

    def insert(doc: CommentedMap) -> None:
        added.clear()
        skipped.clear()
        engine = engines.for_config(doc)
        present = engine.config.task_keys(doc, clear=request.replace)
        for task in resolved:
            key = task.entry.qualified_name
            if key in present:
                skipped.append(SkippedTask(requested=task.requested, reason=f"{task.config_name} is already in the config"))
                continue
            fragment = YAML().load(task.recipe.yaml_fragment if task.recipe else generic_fragment(task.config_name))[0]
            try:
                written = engine.config.add_task(doc, key, fragment, task.recipe.repeats if task.recipe else None)
            except ToolError as exc:
                skipped.append(SkippedTask(requested=task.requested, reason=str(exc)))
                continue
            present.add(key)
            added.append(AddedTask(requested=task.requested, task=written, recipe=task.recipe.name if task.recipe else None,
                                   repeats=task.recipe.repeats if task.recipe else None))

    diff = engines.edit_config(request.config_path, insert)
    used = [task.recipe for task in resolved if task.recipe and task.recipe.name in {a.recipe for a in added}]
    return AddTasksOutput(
        config_path=request.config_path,
        added=added,
        skipped=skipped,
        env_vars=list(dict.fromkeys(name for recipe in used for name in recipe.env_vars)),
        judge_needed=any(recipe.judge for recipe in used),
        diff=diff,
    )
