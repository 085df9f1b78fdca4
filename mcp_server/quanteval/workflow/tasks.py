"""The NEL task catalogue (cached), the task recipes under recipes/tasks/, and adding tasks to a config.

The catalogue is NEL's own packaged task list (`resources/all_tasks_irs.yaml`, the file
`nel ls tasks` reads). Parsing that 1.3 MB file takes a few hundred milliseconds, so the
parsed entries are cached as JSON in the state directory, keyed by NEL version and the
file's size and mtime; a warm call reads only the small JSON file.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import importlib.util
import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from quanteval import envvars
from quanteval.models import StrictModel, ToolError

log = logging.getLogger(__name__)

NEL_DISTRIBUTION = "nemo-evaluator-launcher"
CATALOGUE_CACHE_SCHEMA = 3


class TaskEntry(BaseModel):
    name: str = Field(description="Task name as NEL lists it, e.g. ns_gpqa.")
    harness: str = Field(description="Harness (evaluation framework) the task belongs to, e.g. nemo_skills.")
    qualified_name: str = Field(description="`harness.name`: unambiguous in a config's evaluation.tasks[].name.")
    container: str = Field(description="Container image NEL runs the task in.")
    description: str = Field(description="NEL's description of the task.")
    endpoint_types: list[str] = Field(description="Endpoint types the task supports (chat, completions, ...).")
    harness_task: str | None = Field(None, description="The harness's own name for the task (config.params.task), e.g. gpqa for ns_gpqa.")
    reads_tokenizer: bool = Field(False, description="The task's command reads config.params.extra.tokenizer (lm-evaluation-harness, ruler, ...).")


def nel_tasks_file() -> Path:
    """The task list packaged with the installed NEL, found without importing NEL (that takes seconds)."""
    spec = importlib.util.find_spec("nemo_evaluator_launcher")
    if spec is None or not spec.submodule_search_locations:
        raise ToolError(
            "nemo_evaluator_launcher is not installed in this Python. "
            "Install it with `pip install nemo-evaluator-launcher==0.2.6` (scripts/setup does)."
        )
    return Path(next(iter(spec.submodule_search_locations))) / "resources" / "all_tasks_irs.yaml"


@functools.cache  # a reinstall also changes the task file's mtime, which the cache key catches
def _nel_version() -> str:
    try:
        return importlib.metadata.version(NEL_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _load_yaml(text: str | bytes) -> Any:
    """PyYAML's C loader where available: about ten times faster than the pure-Python one."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _parse_tasks_file(source: Path) -> list[TaskEntry]:
    document = _load_yaml(source.read_bytes())
    containers = {harness["name"]: harness.get("container", "") for harness in document.get("harnesses") or []}
    entries: list[TaskEntry] = []
    seen: set[str] = set()
    for task in document.get("tasks") or []:
        qualified = f"{task['harness']}.{task['name']}"
        if qualified in seen:  # NEL keeps the first occurrence too
            continue
        seen.add(qualified)
        config = (task.get("defaults") or {}).get("config") or {}
        entries.append(
            TaskEntry(
                name=task["name"],
                harness=task["harness"],
                qualified_name=qualified,
                container=containers.get(task["harness"], ""),
                description=" ".join(str(task.get("description") or "").split()),
                endpoint_types=list(config.get("supported_endpoint_types") or ["chat"]),
                harness_task=(config.get("params") or {}).get("task"),
                reads_tokenizer="config.params.extra.tokenizer" in str((task.get("defaults") or {}).get("command") or ""),
            )
        )
    return entries


_memo: dict[tuple[str, str, int, int], list[TaskEntry]] = {}


def catalogue(source: Path | None = None) -> list[TaskEntry]:
    """Every task NEL knows, in NEL's order. Cached per NEL version and task-file size/mtime."""
    source = source or nel_tasks_file()
    try:
        stat = source.stat()
    except OSError as exc:
        raise ToolError(f"{source}: cannot read NEL's task list ({exc.strerror}). Reinstall nemo-evaluator-launcher.") from None
    version = _nel_version()
    key = (str(source), version, stat.st_size, stat.st_mtime_ns)
    if key in _memo:
        return _memo[key]

    cache_file = envvars.state_dir() / f"tasks-catalogue-nel-{version}.json"
    entries = _read_cache(cache_file, key)
    if entries is None:
        entries = _parse_tasks_file(source)
        _write_cache(cache_file, key, entries)
    _memo.clear()
    _memo[key] = entries
    return entries


def _read_cache(cache_file: Path, key: tuple[str, str, int, int]) -> list[TaskEntry] | None:
    try:
        cached = json.loads(cache_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if cached.get("schema") != CATALOGUE_CACHE_SCHEMA or tuple(cached.get("key") or ()) != key:
        return None
    return [TaskEntry.model_construct(**task) for task in cached["tasks"]]


def _write_cache(cache_file: Path, key: tuple[str, str, int, int], entries: list[TaskEntry]) -> None:
    payload = {"schema": CATALOGUE_CACHE_SCHEMA, "key": list(key), "tasks": [entry.model_dump() for entry in entries]}
    temporary = cache_file.with_suffix(f".{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(payload), encoding="utf-8")
        os.replace(temporary, cache_file)
    except OSError as exc:  # a read-only state dir only costs speed
        log.warning("could not write the task catalogue cache %s: %s", cache_file, exc)
        temporary.unlink(missing_ok=True)


def lookup(name: str, source: Path | None = None) -> list[TaskEntry]:
    """Entries matching `name` or `harness.name`: none = unknown, one = found, several = ambiguous."""
    name = name.strip()
    if "." in name:
        return [entry for entry in catalogue(source) if entry.qualified_name == name]
    return [entry for entry in catalogue(source) if entry.name == name]


def suggest(name: str, n: int = 3, source: Path | None = None) -> list[str]:
    """Closest task names (bare where unique, qualified where the bare name is ambiguous)."""
    entries = catalogue(source)
    counts: dict[str, int] = {}
    for entry in entries:
        counts[entry.name] = counts.get(entry.name, 0) + 1
    candidates = list(dict.fromkeys(entry.name for entry in entries)) + [entry.qualified_name for entry in entries]
    suggestions: list[str] = []
    for match in difflib.get_close_matches(name.strip(), candidates, n=n * 3, cutoff=0.6):
        if counts.get(match, 0) > 1:  # an ambiguous bare name is no use in a config: offer the qualified ones
            suggestions.extend(entry.qualified_name for entry in entries if entry.name == match)
        else:
            suggestions.append(match)
    return list(dict.fromkeys(suggestions))[:n]


# --- recipes: recipes/tasks/<name>.md, reviewed by people, one per benchmark ------------------

RECIPE_SECTIONS = ("Task Details", "Params", "YAML", "Score Extraction")


def pack_dir() -> Path:
    """Root of the skill pack's files (recipes/, skills/, references/).

    In a source checkout (editable install) that is the repository root next to
    mcp_server/; an installed wheel carries a copy under the package as `_pack/`.
    """
    package = Path(__file__).resolve().parents[1]  # quanteval/, this module lives in quanteval/workflow/
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
    samples: int | None = Field(
        default=None, description="Questions in the full dataset, one repeat (validate_run's expected count); null when unknown.")
    prompt_tokens: int | None = Field(
        default=None, description="Longest prompt of the benchmark in tokens, its template included (approximate); null when unknown.")
    answer_tokens: int | None = Field(
        default=None, description="Smallest generation budget that does not truncate the answers; null when unknown.")
    score_path: str = Field(description="Dotted path of the headline score in artifacts/results.yml.")
    sections: dict[str, str] = Field(description="The recipe's Markdown sections by heading (Task Details, Params, ...).")
    yaml_fragment: str = Field(description="The evaluation.tasks list item, as YAML text.")
    path: str = Field(description="The recipe file.")


def _recipe_error(path: Path, problem: str) -> ToolError:
    return ToolError(f"{path}: {problem}. Fix the recipe file.")


def parse_recipe(path: Path) -> Recipe:
    """Parse one recipe file; every format problem is a ToolError naming the file."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise _recipe_error(path, f"cannot read ({exc.strerror})") from None
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---" or "---" not in (line.strip() for line in lines[1:]):
        raise _recipe_error(path, "no YAML frontmatter between '---' lines at the top")
    end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    try:
        front = _load_yaml("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as exc:
        raise _recipe_error(path, f"frontmatter is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(front, dict):
        raise _recipe_error(path, "frontmatter must be a mapping of keys")
    missing = [key for key in ("name", "nel_task", "harness", "run_time", "metric", "score", "scale") if not front.get(key)]
    if missing:
        raise _recipe_error(path, f"frontmatter lacks {', '.join(missing)}")
    if front["name"] != path.stem:
        raise _recipe_error(path, f"frontmatter name '{front['name']}' differs from the file name '{path.stem}'")

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
        raise _recipe_error(path, f"missing section(s) {', '.join('## ' + name for name in absent)}")

    fragment = _single_yaml_block(path, sections["YAML"])
    try:
        items = _load_yaml(fragment)
    except yaml.YAMLError as exc:
        raise _recipe_error(path, f"the ```yaml block is not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not (isinstance(items, list) and len(items) == 1 and isinstance(items[0], dict)):
        raise _recipe_error(path, "the ```yaml block must be exactly one evaluation.tasks list item ('- name: <task>')")
    fragment_task = str(items[0].get("name", ""))
    if fragment_task.split(".")[-1] != str(front["nel_task"]).split(".")[-1]:
        raise _recipe_error(path, f"the YAML item's name '{fragment_task}' differs from nel_task '{front['nel_task']}'")

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
            samples=int(front["samples"]) if front.get("samples") is not None else None,
            prompt_tokens=int(front["prompt_tokens"]) if front.get("prompt_tokens") is not None else None,
            answer_tokens=int(front["answer_tokens"]) if front.get("answer_tokens") is not None else None,
            score_path=f"results.tasks.{fragment_task.split('.')[-1]}.metrics.{front['metric']}.scores.{front['score']}.value",
            sections=sections,
            yaml_fragment=fragment,
            path=str(path),
        )
    except (TypeError, ValueError) as exc:
        raise _recipe_error(path, f"a frontmatter value has the wrong type ({exc})") from None


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
        raise _recipe_error(path, f"'## YAML' must hold exactly one ```yaml block (found {len(blocks)})")
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


def load_recipe(name: str) -> Recipe:
    path = recipes_dir() / f"{name}.md"
    if not path.is_file():
        known = [recipe.name for recipe in list_recipes()]
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else f" Known recipes: {', '.join(known) or 'none'}."
        raise ToolError(f"{path}: no recipe named '{name}'.{hint}")
    return _cached_recipe(path)


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
            raise _recipe_error(Path(recipe.path), f"nel_task '{recipe.nel_task}' (harness {recipe.harness}) is not in NEL {_nel_version()}'s task list")
        config_name = str(_load_yaml(recipe.yaml_fragment)[0]["name"])
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
    """Use before add_tasks to find a benchmark's exact NEL task name in NEL's catalogue, with harness and whether a
    reviewed recipe exists. Paginated.
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
        nel_version=_nel_version(),
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


def nel_next_benchmark(nel_task: str) -> tuple[str | None, str]:
    """The nel-next benchmark that runs this NEL task in-process (`skills://NAME` for a NeMo-Skills task whose
    metrics nel-next grades), or None; and why. convert_config and the recipes' nel-next form both come from here."""
    from quanteval.engines.nel_next import nelnext

    entries = lookup(nel_task)
    entry = entries[0] if len(entries) == 1 else None
    if entry is None or entry.harness != "nemo_skills" or not entry.harness_task:
        harness = entry.harness if entry else "unknown"
        return None, (f"no nel-next benchmark runs {nel_task} (harness {harness}) in-process: only NeMo-Skills tasks map, "
                      "to skills://NAME. Keep it on NEL 0.2.6, or write it as a BYOB benchmark.")
    name = entry.harness_task
    metrics_type = nelnext.skills_metrics_types([name])[name]
    if why := nelnext.skills_grading_problem(name, metrics_type):
        return None, f"{why}. Keep it on NEL 0.2.6."
    graded = f"graded as '{metrics_type}' by NeMo-Skills' grader" if metrics_type else "metrics type unknown: no NeMo-Skills here to ask"
    return f"skills://{name}", (f"skills://{name} runs NeMo-Skills' {name} data in-process, {graded}; nel-next sends the bare "
                                "problem (no NeMo-Skills prompt_config), so its scores are not NEL's: compare nel-next runs only with nel-next runs.")


class NelNextForm(BaseModel):
    benchmark: dict[str, Any] | None = Field(description="The nel-next `benchmarks` list item, or null when no nel-next benchmark runs the task.")
    note: str = Field(description="What the nel-next form scores, or why there is none.")


def nel_next_form(nel_task: str, repeats: int = 1) -> NelNextForm:
    from quanteval.engines.nel_next import nelnext

    name, note = nel_next_benchmark(nel_task)
    if name is None:
        return NelNextForm(benchmark=None, note=note)
    benchmark = nelnext.benchmark_item(name)
    if repeats > 1:
        benchmark["repeats"] = repeats
    return NelNextForm(benchmark=benchmark, note=note)


class GetTaskRecipeInput(StrictModel):
    name: str = Field(
        description="Recipe name ('gpqa') or NEL task name, bare or 'harness.task'."
    )


class GetTaskRecipeOutput(BaseModel):
    name: str = Field(description="The name asked for.")
    has_recipe: bool = Field(description="True when a reviewed recipe exists; false means NEL defaults only.")
    recipe: Recipe | None = Field(description="The recipe: frontmatter fields, Markdown sections and YAML fragment.")
    task: TaskEntry = Field(description="The NEL catalogue entry of the task.")
    yaml_fragment: str = Field(description="The evaluation.tasks list item add_tasks would insert.")
    nel_next: NelNextForm = Field(description="The task's nel-next (nemo-evaluator >= 0.3) form, or why it has none.")
    note: str = Field(description="What to keep in mind about this task.")


def get_task_recipe(request: GetTaskRecipeInput) -> GetTaskRecipeOutput:
    """Use before adding a task: its reviewed recipe (params, repeats, judge, env vars, score path), or NEL's catalogue
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
    config_path: str = Field(description="The NEL config file (.yaml).")
    tasks: list[str] = Field(
        min_length=1,
        description="Recipe names ('gpqa', 'aime2025') or NEL task names, bare or 'harness.task'.",
    )
    replace: bool = Field(
        False, description="Replace the tasks build_config wrote instead of adding to them.",
    )


class AddedTask(BaseModel):
    requested: str = Field(description="The name as given.")
    task: str = Field(description="The name written to evaluation.tasks[].name.")
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


def _task_key(config_name: str) -> str:
    """`harness.task` where the name resolves to one task, so ns_gpqa and nemo_skills.ns_gpqa compare equal."""
    if "." in config_name:
        return config_name
    entries = lookup(config_name)
    return entries[0].qualified_name if len(entries) == 1 else config_name


def add_tasks(request: AddTasksInput) -> AddTasksOutput:
    """Use after build_config: adds benchmarks (recipe or NEL task names, checked first) to evaluation.tasks; returns a
    diff.
    """
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    # nelconfig's validator imports this module, so import it here, not at the top.
    from quanteval.workflow import nelconfig

    recipes = list_recipes()
    resolved = [resolve(name, recipes) for name in request.tasks]
    added: list[AddedTask] = []
    skipped: list[SkippedTask] = []

    def insert(doc: CommentedMap) -> None:
        added.clear()
        skipped.clear()
        evaluation = doc.setdefault("evaluation", CommentedMap())
        if not isinstance(evaluation, dict):
            raise ToolError(f"{request.config_path}: evaluation must be a mapping. Fix the config or rebuild it with build_config.")
        tasks = evaluation.setdefault("tasks", CommentedSeq())
        if tasks is None:
            tasks = evaluation["tasks"] = CommentedSeq()
        if not isinstance(tasks, list):
            raise ToolError(f"{request.config_path}: evaluation.tasks must be a list. Fix the config or rebuild it with build_config.")
        if request.replace:
            tasks.clear()
        present = {_task_key(str(item.get("name"))) for item in tasks if isinstance(item, dict) and item.get("name")}
        for task in resolved:
            key = task.entry.qualified_name
            if key in present:
                skipped.append(SkippedTask(requested=task.requested, reason=f"{task.config_name} is already in evaluation.tasks"))
                continue
            fragment = task.recipe.yaml_fragment if task.recipe else generic_fragment(task.config_name)
            tasks.append(YAML().load(fragment)[0])
            present.add(key)
            added.append(
                AddedTask(
                    requested=task.requested,
                    task=task.config_name,
                    recipe=task.recipe.name if task.recipe else None,
                    repeats=task.recipe.repeats if task.recipe else None,
                )
            )

    diff = nelconfig.edit_config(request.config_path, insert)
    used = [task.recipe for task in resolved if task.recipe and task.recipe.name in {a.recipe for a in added}]
    return AddTasksOutput(
        config_path=request.config_path,
        added=added,
        skipped=skipped,
        env_vars=list(dict.fromkeys(name for recipe in used for name in recipe.env_vars)),
        judge_needed=any(recipe.judge for recipe in used),
        diff=diff,
    )
