"""NEL config files: build from NEL's templates, round-trip edits, missing values, checkpoint facts.

Edits go through ruamel.yaml's round-trip mode so comments and key order survive, and
through `edit_config`, which holds an exclusive lock on the config's directory while it reads,
changes and atomically replaces the config — two writers never lose each other's update.

Dotted paths address nested keys; a list element is addressed by index
(`evaluation.tasks[0]`) or, for lists of named entries such as `evaluation.tasks`, by
name (`evaluation.tasks[ns_gpqa].nemo_evaluator_config.config.params.temperature`).
"""

from __future__ import annotations

import difflib
import fcntl
import io
import os
import re
import shlex
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from quanteval import envvars
from quanteval.engines import NEL_SECTIONS, EngineName, is_nel_next
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress
from quanteval.serving import checkpoint, frameworks
from quanteval.serving.frameworks import Execution
from quanteval.serving.frameworks import NelDeployment as Deployment
from quanteval.workflow import tasks

MISSING = "???"  # OmegaConf's marker for a value that must be filled in


# ---------------------------------------------------------------------------
# Round-trip YAML


Layout = tuple[int, int, int]  # ruamel's (mapping, sequence, offset) indentation
NEL_LAYOUT: Layout = (2, 4, 2)  # NEL's templates: "  tasks:\n    - name: ..."


def guess_layout(text: str) -> Layout:
    """The file's own indentation, so an edit does not re-indent lines it did not touch."""
    from ruamel.yaml.util import load_yaml_guess_indent

    indented = (line for line in text.splitlines() if line.startswith(" ") and not line.lstrip().startswith(("#", "-")))
    mapping = next((len(line) - len(line.lstrip(" ")) for line in indented), NEL_LAYOUT[0])
    if not re.search(r"^\s*- ", text, re.M):  # no block sequence to learn from
        return (mapping, NEL_LAYOUT[1], NEL_LAYOUT[2])
    try:
        _, sequence, offset = load_yaml_guess_indent(text)
    except Exception:  # unparsable text: the real parse reports it with line and column
        return NEL_LAYOUT
    return (mapping, sequence, offset)


def _yaml(layout: Layout = NEL_LAYOUT) -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap long command lines or extra_args
    mapping, sequence, offset = layout
    yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
    # Write null as `null` (ruamel's default is an empty value, easy to misread as a forgotten value).
    yaml.representer.add_representer(type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null"))
    return yaml


def parse_config_text(text: str, source: str) -> CommentedMap:
    """Parse YAML text into a round-trip mapping; bad YAML becomes a ToolError with line and column."""
    try:
        doc = _yaml().load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        problem = exc.problem or exc.context or "invalid YAML"
        raise ToolError(f"{source}: invalid YAML at {where}: {problem}. Fix the YAML syntax there; the file was not changed.") from None
    if doc is None:
        return CommentedMap()
    if not isinstance(doc, CommentedMap):
        raise ToolError(f"{source}: the top level must be a mapping (keys like `execution:`, `evaluation:`), not {_kind(doc)}.")
    _check_expansion(doc, source)
    return doc


MAX_EXPANDED_NODES = 50_000  # a NEL config has a few hundred; nested YAML aliases can expand to billions


def _check_expansion(doc: Any, source: str) -> None:
    """Refuse a document whose aliases expand past MAX_EXPANDED_NODES (a "billion laughs" file).

    ruamel shares aliased nodes, so loading is cheap; reading them out (JSON, diffs) is not.
    The walk stops at the bound, so it costs at most MAX_EXPANDED_NODES steps.
    """
    stack, seen = [doc], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_EXPANDED_NODES:
            raise ToolError(
                f"{source}: the YAML expands to more than {MAX_EXPANDED_NODES} values (nested aliases `*name`?). "
                "Replace the aliases with the values they stand for."
            )
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def dump_config(doc: CommentedMap, layout: Layout = NEL_LAYOUT) -> str:
    buffer = io.StringIO()
    _yaml(layout).dump(doc, buffer)
    return buffer.getvalue()


MAX_CONFIG_BYTES = 1_000_000  # NEL configs are a few KB; anything this large is the wrong file


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise ToolError(f"{path}: no such config file. Create one with build_config, or check the path.")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ToolError(f"{path}: {path.stat().st_size} bytes, too large for a NEL config (limit {MAX_CONFIG_BYTES}). Check the path.")
    return path.read_text(encoding="utf-8")


def _nel_config(doc: CommentedMap, path: Path) -> CommentedMap:
    """Refuse YAML that is not a run config of either engine, so config tools never read or rewrite other files."""
    if path.suffix not in (".yaml", ".yml") or (doc and not (NEL_SECTIONS & set(doc) or is_nel_next(doc))):
        raise ToolError(
            f"{path}: not an evaluation config (a .yaml/.yml file with NEL 0.2.6 sections execution:, deployment:, "
            "evaluation: or nel-next sections services:, benchmarks:, cluster:). Create one with build_config."
        )
    return doc


def load_config(path: str | Path) -> CommentedMap:
    """Load a NEL config for reading or round-trip editing (comments and order kept)."""
    path = Path(path).expanduser()
    return _nel_config(parse_config_text(_read_text(path), str(path)), path)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    # Lock the directory, not the file: the config is replaced by rename, so a lock on its inode would
    # not hold, and a sidecar lock file would be left behind beside the user's config.
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_atomically(path: Path, text: str) -> None:
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as temp:
            temp.write(text)
            temp.flush()
            os.fsync(temp.fileno())
        os.chmod(temp_name, mode)
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise


def unified_diff(before: str, after: str, path: Path) -> str:
    return "".join(
        difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path.name}", f"b/{path.name}")
    )


def edit_config(path: str | Path, mutate: Callable[[CommentedMap], None]) -> str:
    """Apply `mutate` to the config under an exclusive lock and replace the file atomically.

    Returns the unified diff ("" when nothing changed). Bad YAML or a ToolError from
    `mutate` leaves the file untouched.
    """
    path = Path(path).expanduser()
    with _locked(path):
        before = _read_text(path)
        doc = _nel_config(parse_config_text(before, str(path)), path)
        mutate(doc)
        after = dump_config(doc, guess_layout(before))
        if after == before:
            return ""
        _write_atomically(path, after)
    return unified_diff(before, after, path)


# ---------------------------------------------------------------------------
# Dotted paths

_SEGMENT = re.compile(r"([^.\[\]]+)|\[([^\]]*)\]|(\.)")

PathStep = str | int  # str: mapping key or entry name (in a list); int: list index


class MissingKeyError(ToolError):
    """A mapping along the path lacks the key (set_path creates it; get/delete report it)."""


def parse_path(dotted: str) -> list[tuple[str, PathStep]]:
    """`a.b[ns_gpqa].c[0]` -> [("key","a"), ("key","b"), ("name","ns_gpqa"), ("key","c"), ("index",0)]."""
    steps: list[tuple[str, PathStep]] = []
    position = 0
    expect_key = True
    while position < len(dotted):
        match = _SEGMENT.match(dotted, position)
        if not match:
            raise ToolError(f"path '{dotted}': cannot parse at character {position + 1}. Use keys joined by dots, e.g. deployment.extra_args or evaluation.tasks[ns_gpqa].name.")
        key, selector, dot = match.groups()
        if key is not None:
            if not expect_key:
                raise ToolError(f"path '{dotted}': a '.' is missing before '{key}'.")
            steps.append(("key", key.strip()))
            expect_key = False
        elif selector is not None:
            selector = selector.strip().strip("'\"")
            if not selector or not steps or (expect_key and steps):
                raise ToolError(f"path '{dotted}': empty or misplaced [..]. Use [<index>] or [<task name>] right after a list key.")
            if re.fullmatch(r"-?\d+", selector):
                steps.append(("index", int(selector)))
            else:
                steps.append(("name", selector))
            expect_key = False
        else:
            if expect_key:
                raise ToolError(f"path '{dotted}': empty key between dots.")
            expect_key = True
        position = match.end()
    if not steps or expect_key:
        raise ToolError(f"path '{dotted}': empty or ends with '.'. Give a key path such as deployment.tensor_parallel_size.")
    return steps


def format_path(steps: list[tuple[str, PathStep]]) -> str:
    text = ""
    for kind, step in steps:
        text += f"[{step}]" if kind in ("index", "name") else (f".{step}" if text else str(step))
    return text


def _named_index(seq: list, name: str, where: str) -> int:
    matches = [i for i, item in enumerate(seq) if isinstance(item, dict) and item.get("name") == name]
    if len(matches) == 1:
        return matches[0]
    names = [str(item.get("name")) for item in seq if isinstance(item, dict) and "name" in item]
    if not matches:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else f" Entries: {', '.join(names) or '(none)'}."
        raise ToolError(f"{where}: no entry named '{name}'.{hint}")
    raise ToolError(f"{where}: {len(matches)} entries are named '{name}' (indices {matches}). Address one by index, e.g. [{matches[0]}].")


def _kind(node: Any) -> str:
    if isinstance(node, dict):
        return "a mapping"
    if isinstance(node, list):
        return "a list"
    return "null" if node is None else f"a {type(node).__name__.lower().replace('scalar', '')} value"


def _step_into(node: Any, kind: str, step: PathStep, where: str) -> tuple[Any, Any]:
    """Return (container key/index, child) for one step, or raise a ToolError naming what exists."""
    if kind == "key":
        if not isinstance(node, dict):
            raise ToolError(f"{where}: is {_kind(node)}, not a mapping; cannot look up key '{step}'.")
        if step not in node:
            close = difflib.get_close_matches(str(step), [str(k) for k in node], n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else f" Keys here: {', '.join(map(str, node)) or '(none)'}."
            raise MissingKeyError(f"{where}: has no key '{step}'.{hint}")
        return step, node[step]
    if not isinstance(node, list):
        raise ToolError(f"{where}: is {_kind(node)}, not a list; [{step}] needs a list.")
    if kind == "index":
        assert isinstance(step, int)
        if not -len(node) <= step < len(node):
            raise ToolError(f"{where}: index {step} is out of range (the list has {len(node)} entries).")
        return step, node[step]
    index = _named_index(node, str(step), where)
    return index, node[index]


def get_path(doc: Any, dotted: str) -> Any:
    """The value at `dotted`; ToolError naming the nearest keys when it does not exist."""
    steps = parse_path(dotted)
    node = doc
    for depth, (kind, step) in enumerate(steps):
        _, node = _step_into(node, kind, step, format_path(steps[:depth]) or "(top level)")
    return node


def has_path(doc: Any, dotted: str) -> bool:
    try:
        get_path(doc, dotted)
    except ToolError:
        return False
    return True


def _parent_of(doc: Any, steps: list[tuple[str, PathStep]], create: bool) -> Any:
    node = doc
    for depth, (kind, step) in enumerate(steps[:-1]):
        where = format_path(steps[:depth]) or "(top level)"
        try:
            _, child = _step_into(node, kind, step, where)
        except MissingKeyError:
            if not create:
                raise
            child = CommentedMap() if steps[depth + 1][0] == "key" else CommentedSeq()
            node[step] = child
        if child is None and create:
            child = CommentedMap() if steps[depth + 1][0] == "key" else CommentedSeq()
            node[step] = child
        node = child
    return node


def set_path(doc: Any, dotted: str, value: Any) -> None:
    """Set the value at `dotted`, creating missing intermediate mappings. Existing comments stay."""
    steps = parse_path(dotted)
    parent = _parent_of(doc, steps, create=True)
    kind, step = steps[-1]
    where = format_path(steps[:-1]) or "(top level)"
    if kind == "key":
        if not isinstance(parent, dict):
            raise ToolError(f"{where}: is {_kind(parent)}, not a mapping; cannot set key '{step}'.")
        parent[step] = value
        return
    index, _ = _step_into(parent, kind, step, where)
    parent[index] = value


def delete_path(doc: Any, dotted: str) -> Any:
    """Remove the key or list entry at `dotted` and return what was there; ToolError when absent."""
    steps = parse_path(dotted)
    parent = _parent_of(doc, steps, create=False)
    kind, step = steps[-1]
    where = format_path(steps[:-1]) or "(top level)"
    try:
        index, old = _step_into(parent, kind, step, where)
    except MissingKeyError as exc:
        raise ToolError(f"{exc} Nothing was deleted.") from None
    del parent[index]
    return old


def to_plain(node: Any) -> Any:
    """Round-trip nodes (CommentedMap, ScalarFloat, quoted strings, ...) as plain JSON-able Python values."""
    if isinstance(node, dict):
        return {str(key): to_plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [to_plain(item) for item in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return str(node)


def walk(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every (dotted path, value) below `node`, tasks addressed by name where their names are unique."""
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path, value
            yield from walk(value, path)
    elif isinstance(node, list):
        names = [item.get("name") for item in node if isinstance(item, dict)]
        for index, item in enumerate(node):
            name = item.get("name") if isinstance(item, dict) else None
            unique = isinstance(name, str) and names.count(name) == 1 and not re.search(r"[.\[\]]", name)
            path = f"{prefix}[{name if unique else index}]"
            yield path, item
            yield from walk(item, path)


# ---------------------------------------------------------------------------
# build_config

ModelType = Literal["base", "chat_reasoning"]
Export = Literal["none", "mlflow", "wandb"]


def benchmark_bundles() -> dict[str, list[str]]:
    """Benchmark bundles per model type, as NEL's own build-config defines them."""
    from nemo_evaluator_launcher.common.build_config import _SUPPORTED_BENCHMARKS_BY_MODEL_TYPE

    return {model_type: sorted(bundles) for model_type, bundles in _SUPPORTED_BENCHMARKS_BY_MODEL_TYPE.items()}


def _templates_dir() -> Path:
    # NEL resolves templates with MultiplexedPath.joinpath(a, b), which Python 3.11 rejects;
    # joining one segment at a time works on every version.
    import importlib.resources

    return Path(str(importlib.resources.files("nemo_evaluator_launcher.resources") / "config_templates"))


def _merge(base: CommentedMap, override: CommentedMap) -> None:
    """NEL's deep_merge (mappings merge, lists extend, scalars replace), keeping comments and order."""
    for key, value in override.items():
        current = base.get(key)
        if key in base and isinstance(current, dict) and isinstance(value, dict):
            _merge(current, value)
        elif key in base and isinstance(current, list) and isinstance(value, list):
            current.extend(value)
        else:
            base[key] = value
            if key in override.ca.items:
                base.ca.items[key] = override.ca.items[key]


class BuildConfigInput(StrictModel):
    engine: EngineName = Field("nel", description=(
        "'nel' (NEL 0.2.6, container tasks) or 'nel-next' (BYOB .py files, skills://NAME, built-ins)."))
    execution: Execution = Field(description="'local' (Docker here) or 'slurm' (a cluster over SSH).")
    deployment: Deployment = Field(
        description="Server NEL starts; 'none': an existing endpoint (target.api_endpoint)."
    )
    model_type: ModelType = Field(description="Chat or reasoning model (chat endpoint) or base model (completions).")
    benchmarks: list[str] = Field(
        min_length=1,
        description="nel bundles (base: general_knowledge, coding, long_context, multilingual; chat_reasoning: core_reasoning, agentic, "
                    "long_context, multilingual) or nel-next benchmarks (BYOB .py file, skills://NAME, built-in).",
    )
    export: Export = Field("none", description="Automatic export after the run.")
    config_path: str | None = Field(
        None,
        description="New .yaml file to write (must not exist).",
    )

    @model_validator(mode="after")
    def _bundles_fit_model_type(self) -> BuildConfigInput:
        if self.engine == "nel-next":
            if self.deployment not in ("none", "vllm", "sglang"):
                raise ValueError(f"deployment '{self.deployment}': nel-next configs here take none (an existing endpoint), vllm or sglang")
            return self
        supported = benchmark_bundles()[self.model_type]
        unknown = [name for name in self.benchmarks if name not in supported]
        if unknown:
            raise ValueError(f"benchmarks {unknown} are not bundles for model_type '{self.model_type}'; choose from {supported}")
        return self


class BuildConfigOutput(BaseModel):
    config_path: str = Field(description="The config file that was written.")
    tasks: list[str] = Field(description="Task names in evaluation.tasks.")
    missing_values: list[str] = Field(description="Dotted paths still set to ??? — fill them with set_config_value or apply_checkpoint.")


def _output_path(request: BuildConfigInput) -> Path:
    if request.config_path and Path(request.config_path).suffix in (".yaml", ".yml"):
        path = Path(request.config_path).expanduser()
        if path.exists():
            raise ToolError(f"{path}: already exists; build_config never overwrites a file. Choose another output path, or edit this one with set_config_value.")
        if not path.parent.is_dir():
            raise ToolError(f"{path.parent}: directory does not exist. Create it first or choose another output path.")
        return path
    directory = Path(request.config_path).expanduser() if request.config_path else Path.cwd()
    if directory.exists() and not directory.is_dir():
        raise ToolError(f"{directory}: exists and is not a directory. Give a *.yaml path or a directory as output.")
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted(Path(name).stem.replace("://", "_") for name in request.benchmarks) if request.engine == "nel-next" else sorted(request.benchmarks)
    # NEL configs keep their historical names; nel-next ones are told apart by a prefix.
    prefix = "nelnext_" if request.engine == "nel-next" else ""
    stem = f"{prefix}{request.execution}_{request.deployment}_{request.model_type}_{'_'.join(names)}"[:120]
    candidate, counter = directory / f"{stem}.yaml", 1
    while candidate.exists():  # like NEL: a numbered sibling, never an overwrite
        candidate, counter = directory / f"{stem}_{counter}.yaml", counter + 1
    return candidate


def build_config_document(execution: str, deployment: str, model_type: str, benchmarks: list[str], export: str) -> CommentedMap:
    """The merged config, from NEL's templates in NEL's order (execution, export, model type, bundles, deployment)."""
    templates = _templates_dir()
    parts = [f"execution/{execution}.yaml", f"export/{export}.yaml", f"evaluation/{model_type}/default.yaml"]
    parts += [f"evaluation/{model_type}/{bundle}.yaml" for bundle in benchmarks]
    parts.append(f"deployment/{deployment}.yaml")
    doc = CommentedMap()
    for part in parts:
        file = templates / part
        _merge(doc, parse_config_text(file.read_text(encoding="utf-8"), str(file)))
    # Hydra needs _self_ last in defaults, exactly as NEL's build-config arranges it.
    defaults = doc.setdefault("defaults", CommentedSeq())
    for index in reversed(range(len(defaults))):
        if defaults[index] == "_self_":
            del defaults[index]
    defaults.append("_self_")
    for entry in defaults:  # drop the blank lines that ended each template's defaults block
        if isinstance(entry, CommentedMap):
            entry.ca.items.clear()
    return doc


def missing_value_paths(doc: Any) -> list[str]:
    return [path for path, value in walk(doc) if value == MISSING]


def build_config(request: BuildConfigInput) -> BuildConfigOutput:
    """Use when there is no config yet: writes a new NEL config (never overwrites). Then fill its missing_values
    (apply_checkpoint, set_config_value) and validate_config.
    """
    path = _output_path(request)
    if request.engine == "nel-next":
        return _build_next_config(request, path)
    doc = build_config_document(request.execution, request.deployment, request.model_type, request.benchmarks, request.export)
    try:
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(dump_config(doc))
    except FileExistsError:
        raise ToolError(f"{path}: already exists; build_config never overwrites a file. Choose another output path.") from None
    tasks = [str(task.get("name")) for task in doc.get("evaluation", {}).get("tasks", []) if isinstance(task, dict)]
    return BuildConfigOutput(config_path=str(path.resolve()), tasks=tasks, missing_values=missing_value_paths(doc))


def _build_next_config(request: BuildConfigInput, path: Path) -> BuildConfigOutput:
    """A nel-next config: one model service (an existing endpoint, or a vLLM/SGLang server nel-next starts), a simple
    solver per benchmark, the local or SLURM cluster, output without a timestamp (quanteval names each run's directory).
    A BYOB file given by a relative path is written as an absolute one: nel-next resolves it against its own cwd."""
    from quanteval.engines.nel_next import nelnext

    benchmarks = [str(Path(name).expanduser().resolve()) if name.endswith(".py") else name for name in request.benchmarks]
    protocol = "completions" if request.model_type == "base" else "chat_completions"
    # on SLURM the results go to a directory on the cluster, which only the person knows
    output_dir = str(path.parent / "results") if request.execution == "local" else MISSING
    plain = nelnext.config_document(benchmarks=benchmarks, protocol=protocol, execution=request.execution, output_dir=output_dir)
    if request.deployment != "none":
        plain["services"]["model"] = {"type": request.deployment, "model": MISSING, "protocol": protocol,
                                      "served_model_name": MISSING, "generation": plain["services"]["model"]["generation"]}
    doc = as_round_trip(plain)
    doc.yaml_set_start_comment("nel-next (nemo-evaluator >= 0.3) config, written by quanteval build_config.\n"
                               "??? marks values to fill: apply_checkpoint, deployment_status's config_values, set_config_value.")
    try:
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(dump_config(doc))
    except FileExistsError:
        raise ToolError(f"{path}: already exists; build_config never overwrites a file. Choose another output path.") from None
    return BuildConfigOutput(config_path=str(path.resolve()), tasks=benchmarks, missing_values=missing_value_paths(doc))


# ---------------------------------------------------------------------------
# get / set / delete

_CONFIG_FIELD = "The NEL config file (.yaml)."
_KEY_FIELD = "Dotted key; tasks by name or index, e.g. evaluation.tasks[ns_gpqa].nemo_evaluator_config.config.params.temperature."


class GetConfigValueInput(StrictModel):
    config_path: str = Field(description=_CONFIG_FIELD)
    key: str = Field(description=_KEY_FIELD)


class GetConfigValueOutput(BaseModel):
    key: str
    value: Any = Field(description="The value as JSON (mappings and lists included).")
    missing: bool = Field(description="True when the value is ??? (must still be filled in).")


def get_config_value(request: GetConfigValueInput) -> GetConfigValueOutput:
    """Use to read a NEL config before changing it: one value or section by dotted key."""
    value = get_path(load_config(request.config_path), request.key)
    return GetConfigValueOutput(key=request.key, value=to_plain(value), missing=value == MISSING)


class SetConfigValueInput(StrictModel):
    config_path: str = Field(description=_CONFIG_FIELD)
    key: str = Field(description="Dotted key, as in get_config_value; missing parents are created.")
    value: Any = Field(
        None,
        description="New value as JSON (objects become mappings). Give value or yaml_value.",
    )
    yaml_value: str | None = Field(
        None,
        description="New value as YAML text instead, e.g. '[a, b]' or '{limit_samples: 10}'.",
    )

    @model_validator(mode="after")
    def _one_value(self) -> SetConfigValueInput:
        if self.yaml_value is not None and "value" in self.model_fields_set:
            raise ValueError("give either value or yaml_value, not both")
        return self


class ConfigEditOutput(BaseModel):
    config_path: str
    key: str
    changed: bool = Field(description="False when the file already held this value.")
    diff: str = Field(description="Unified diff of the file (empty when unchanged).")


def _parse_yaml_value(text: str) -> Any:
    wrapped = parse_config_text(f"value: {text}" if "\n" not in text else "value:\n" + "\n".join("  " + line for line in text.splitlines()), "yaml_value")
    return wrapped["value"]


def as_round_trip(value: Any) -> Any:
    """JSON objects/lists as round-trip nodes, so they are written in block style like the rest of the file."""
    if isinstance(value, dict) and not isinstance(value, CommentedMap):
        return CommentedMap((key, as_round_trip(item)) for key, item in value.items())
    if isinstance(value, list) and not isinstance(value, CommentedSeq):
        return CommentedSeq(as_round_trip(item) for item in value)
    return value


def set_config_value(request: SetConfigValueInput) -> ConfigEditOutput:
    """Use to fill a ??? or change a setting: sets one dotted key, keeping comments and order; atomic, returns a diff.
    """
    value = _parse_yaml_value(request.yaml_value) if request.yaml_value is not None else as_round_trip(request.value)
    diff = edit_config(request.config_path, lambda doc: set_path(doc, request.key, value))
    return ConfigEditOutput(config_path=request.config_path, key=request.key, changed=bool(diff), diff=diff)


class DeleteConfigValueInput(StrictModel):
    config_path: str = Field(description=_CONFIG_FIELD)
    key: str = Field(description="Dotted key, as in get_config_value; evaluation.tasks[ns_gpqa] removes that task.")


def delete_config_value(request: DeleteConfigValueInput) -> ConfigEditOutput:
    """Use to drop a task or a stray key: removes one dotted key or list entry; returns a diff."""
    diff = edit_config(request.config_path, lambda doc: delete_path(doc, request.key))
    return ConfigEditOutput(config_path=request.config_path, key=request.key, changed=bool(diff), diff=diff)


# ---------------------------------------------------------------------------
# Facts about a config every later step needs


def deployment_type(doc: Any) -> str:
    """vllm, sglang, nim, trtllm, none, ...: deployment.type, else the `deployment:` entry of defaults."""
    deployment = doc.get("deployment")
    if isinstance(deployment, dict) and isinstance(deployment.get("type"), str):
        return str(deployment["type"])
    for entry in doc.get("defaults") or []:
        if isinstance(entry, dict) and isinstance(entry.get("deployment"), str):
            return str(entry["deployment"])
    return "none"


def execution_type(doc: Any) -> str:
    """local or slurm (lepton, ...): execution.type, else the `execution:` entry of defaults."""
    execution = doc.get("execution")
    if isinstance(execution, dict) and isinstance(execution.get("type"), str):
        return str(execution["type"])
    for entry in doc.get("defaults") or []:
        if isinstance(entry, dict) and isinstance(entry.get("execution"), str):
            return str(entry["execution"]).split("/")[0]
    return "local"


def config_tasks(doc: Any) -> list[tuple[str, Any]]:
    """(path, task mapping) for every entry of evaluation.tasks, paths by name where unique."""
    evaluation = doc.get("evaluation")
    task_list = evaluation.get("tasks") if isinstance(evaluation, dict) else None
    if not isinstance(task_list, list):
        return []
    names = [task.get("name") for task in task_list if isinstance(task, dict)]
    found = []
    for index, task in enumerate(task_list):
        name = task.get("name") if isinstance(task, dict) else None
        unique = isinstance(name, str) and names.count(name) == 1 and not re.search(r"[.\[\]]", name)
        found.append((f"evaluation.tasks[{name if unique else index}]", task))
    return found


def recipes_by_task() -> dict[str, tasks.Recipe]:
    """Recipes keyed by their NEL task name and by harness.task."""
    by_task: dict[str, tasks.Recipe] = {}
    for recipe in tasks.list_recipes():
        by_task[recipe.nel_task] = recipe
        by_task[f"{recipe.harness}.{recipe.nel_task}"] = recipe
    return by_task


_HOST_REF = re.compile(r"^host:([A-Za-z_][A-Za-z0-9_]*)$")
_OC_ENV_REF = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(,[^}]*)?\}")


def env_var_references(doc: Any) -> list[tuple[str, str]]:
    """(path, variable name) for every `host:VAR` value and every `${oc.env:VAR}` without a default.

    `target.api_endpoint.api_key_name` counts too: NEL forwards that variable from the host.
    """
    references = []
    for path, value in walk(doc):
        if not isinstance(value, str):
            continue
        host = _HOST_REF.match(value.strip())
        if host:
            references.append((path, host.group(1)))
        references += [(path, match.group(1)) for match in _OC_ENV_REF.finditer(value) if not match.group(2)]
    target = doc.get("target")
    endpoint = target.get("api_endpoint") if isinstance(target, dict) else None
    key_name = endpoint.get("api_key_name") if isinstance(endpoint, dict) else None
    if isinstance(key_name, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key_name) and not env_var_defined(doc, key_name):
        references.append(("target.api_endpoint.api_key_name", key_name))
    return references


# ---------------------------------------------------------------------------
# list_missing_values


class ListMissingValuesInput(StrictModel):
    config_path: str = Field(description=_CONFIG_FIELD)


class UnsetEnvVar(BaseModel):
    name: str = Field(description="Environment variable name (never its value).")
    paths: list[str] = Field(description="Config paths that refer to it, or 'recipe:<name>' when a task recipe needs it.")
    note: str | None = Field(None, description="What the variable is for (from env.example / quanteval's list of known variables).")


class ListMissingValuesOutput(BaseModel):
    config_path: str
    missing_values: list[str] = Field(description="Every dotted path still set to ??? (NEL itself stops at the first).")
    unset_env_vars: list[UnsetEnvVar] = Field(description="Variables the config or its tasks' recipes need that are unset here.")
    complete: bool = Field(description="True when nothing above is left.")


def list_missing_values(request: ListMissingValuesInput) -> ListMissingValuesOutput:
    """Use after build_config/apply_checkpoint: what a NEL config still needs (??? values, unset env vars), names only.
    """
    doc = load_config(request.config_path)
    needed: dict[str, list[str]] = {}
    for path, name in env_var_references(doc):
        needed.setdefault(name, []).append(path)
    recipes = recipes_by_task()
    for _, task in config_tasks(doc):
        recipe = recipes.get(str(task.get("name"))) if isinstance(task, dict) else None
        for name in recipe.env_vars if recipe else []:
            if not env_var_defined(doc, name):  # e.g. DUMMY_API_KEY: lit:dummy, written by apply_checkpoint
                needed.setdefault(name, []).append(f"recipe:{recipe.name}")
    unset = [
        UnsetEnvVar(name=name, paths=list(dict.fromkeys(paths)), note=envvars.KNOWN_ENV_VARS.get(name))
        for name, paths in needed.items()
        if not os.environ.get(name)
    ]
    missing = missing_value_paths(doc)
    return ListMissingValuesOutput(config_path=request.config_path, missing_values=missing, unset_env_vars=unset, complete=not missing and not unset)


# ---------------------------------------------------------------------------
# extra_args: server flags as (flag, value) options

# Flags NEL's own deployment command already passes (configs/deployment/*.yaml): repeating them in
# extra_args makes the server see them twice; their values belong in the deployment keys.
NEL_COMMAND_FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        "--tensor-parallel-size": "deployment.tensor_parallel_size",
        "--pipeline-parallel-size": "deployment.pipeline_parallel_size",
        "--data-parallel-size": "deployment.data_parallel_size",
        "--port": "deployment.port",
        "--trust-remote-code": "(always passed by NEL's vLLM command)",
        "--served-model-name": "deployment.served_model_name",
        "--gpu-memory-utilization": "deployment.gpu_memory_utilization",
    },
    "sglang": {
        "--model-path": "deployment.checkpoint_path / deployment.hf_model_handle",
        "--host": "(always 0.0.0.0 in NEL's SGLang command)",
        "--port": "deployment.port",
        "--served-model-name": "deployment.served_model_name",
        "--tp-size": "deployment.tensor_parallel_size",
        "--tensor-parallel-size": "deployment.tensor_parallel_size",  # SGLang's long alias of --tp-size
        "--dp-size": "deployment.data_parallel_size",
        "--data-parallel-size": "deployment.data_parallel_size",
        "--pp-size": "deployment.pipeline_parallel_size",
        "--pipeline-parallel-size": "deployment.pipeline_parallel_size",
    },
    "trtllm": {
        "--tp_size": "deployment.tensor_parallel_size",
        "--pp_size": "deployment.pipeline_parallel_size",
        "--host": "(always 0.0.0.0 in NEL's TensorRT-LLM command)",
        "--port": "deployment.port",
        "--backend": "(always pytorch in NEL's TensorRT-LLM command)",
        "--trust_remote_code": "(always passed by NEL's TensorRT-LLM command)",
    },
}

CONTEXT_LENGTH_FLAGS = {name: info.context_flag for name, info in frameworks.FRAMEWORK_INFO.items()}


def parse_extra_args(text: str) -> list[tuple[str, str | None]]:
    """`--a 1 --b --c=x` -> [("--a","1"), ("--b",None), ("--c","x")]; stray words become (word, None)."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ToolError(f"deployment.extra_args: cannot split '{text}' into flags ({exc}). Balance the quotes.") from None
    options: list[tuple[str, str | None]] = []
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if token.startswith("-") and "=" in token:
            flag, value = token.split("=", 1)
            options.append((flag, value))
        elif token.startswith("-") and index + 1 < len(tokens) and not tokens[index + 1].startswith("--"):
            options.append((token, tokens[index + 1]))
            index += 1
        else:
            options.append((token, None))
        index += 1
    return options


def render_extra_args(options: list[tuple[str, str | None]]) -> str:
    return " ".join(flag if value is None else f"{flag} {shlex.quote(value)}" for flag, value in options)


def merge_extra_args(current: str, additions: list[tuple[str, str | None]]) -> str:
    """Add or replace flags: one occurrence per flag, the addition's value wins, order kept."""
    options = parse_extra_args(current)
    for flag, value in additions:
        positions = [i for i, (existing, _) in enumerate(options) if existing == flag]
        if positions:
            options[positions[0]] = (flag, value)
            options = [option for i, option in enumerate(options) if i not in positions[1:]]
        else:
            options.append((flag, value))
    return render_extra_args(options)


# ---------------------------------------------------------------------------
# apply_checkpoint


class ApplyCheckpointInput(StrictModel):
    config_path: str = Field(description="Config deploying with vllm, sglang or trtllm (nel-next: one vllm, sglang or api service).")
    checkpoint: str = Field(description="Checkpoint directory, or HF handle (org/name) in the local cache.")
    served_model_name: str | None = Field(None, description="Default: the HF handle or checkpoint folder name.")
    tensor_parallel_size: int | None = Field(
        None, ge=1, description="GPUs per replica. Default: smallest fit on H100."
    )
    cluster_checkpoint_path: str | None = Field(
        None,
        description="Checkpoint path where the job runs, if not this copy's.",
    )


class ApplyCheckpointOutput(BaseModel):
    config_path: str
    changes: list[str] = Field(description="One line per key written or removed: `key: old -> new`.")
    diff: str = Field(description="Unified diff of the config file.")
    missing_values: list[str] = Field(description="Paths still set to ??? afterwards.")
    notes: list[str] = Field(description="Checkpoint warnings, framework notes and the defaults taken from the checkpoint, each once.")


EVALUATION_CHECKPOINT_MOUNT = "/checkpoint"
GLOBAL_PARAMS = "evaluation.nemo_evaluator_config.config.params"
GLOBAL_ADAPTER = "evaluation.nemo_evaluator_config.target.api_endpoint.adapter_config"
GLOBAL_TOKENIZER = f"{GLOBAL_PARAMS}.extra.tokenizer"
SAMPLING_PARAMS = ("temperature", "top_p")  # NEL params; top_k has none, so it reaches the server through params_to_add
DUMMY_KEY_VALUE = "lit:dummy"  # NeMo-Skills sends some key; a self-deployed server ignores it

# Room left for the prompt when the generation budget comes from the serving context: a quarter of the
# context, at most 8192 tokens (Qwen3's card: 32768 generated tokens in its 40960 context).
PROMPT_RESERVE_TOKENS = 8192

# NeMo-Skills overrides in a task's extra.args that set generation: they come after NEL's own flags, so they win.
_NS_INFERENCE = re.compile(r"^\+{0,2}inference\.(tokens_to_generate|temperature|top_p|top_k)=(.*)$")
_NS_TO_PARAM = {"tokens_to_generate": "max_new_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}


def generation_budget(context: int) -> int:
    """max_new_tokens that fits a serving context with room left for the prompt."""
    return context - min(PROMPT_RESERVE_TOKENS, context // 4)


def owned_flags(framework: str) -> set[str]:
    """Server flags apply_checkpoint computes from the checkpoint (and so replaces on every call)."""
    info = frameworks.FRAMEWORK_INFO[framework]
    return {info.context_flag, info.trust_remote_code_flag, "--quantization", "--reasoning-parser"}


def _scalar(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None if text in ("null", "None") else text


def ns_generation_overrides(args: Any) -> dict[str, Any]:
    """{param: value} for the generation settings a NeMo-Skills extra.args string overrides (last one wins)."""
    if not isinstance(args, str):
        return {}
    try:
        tokens = shlex.split(args)
    except ValueError:
        return {}
    found: dict[str, Any] = {}
    for token in tokens:
        match = _NS_INFERENCE.match(token)
        if match:
            found[_NS_TO_PARAM[match.group(1)]] = _scalar(match.group(2).strip("'\""))
    return found


def value_at(doc: Any, dotted: str) -> Any:
    return get_path(doc, dotted) if has_path(doc, dotted) else None


def task_generation(doc: Any, task_path: str) -> dict[str, tuple[Any, str]]:
    """Effective max_new_tokens / temperature / top_p / top_k of one task: {param: (value, key that set it)}.

    NEL merges evaluation.nemo_evaluator_config under the task's own; NeMo-Skills `++inference.*` in
    extra.args overrides both; top_k reaches the server only through the payload modifier (params_to_add).
    """
    found: dict[str, tuple[Any, str]] = {}
    for prefix in ("evaluation.nemo_evaluator_config", f"{task_path}.nemo_evaluator_config"):
        params = value_at(doc, f"{prefix}.config.params")
        if isinstance(params, dict):
            for key in ("max_new_tokens", *SAMPLING_PARAMS):
                if params.get(key) is not None and params.get(key) != MISSING:
                    found[key] = (params[key], f"{prefix}.config.params.{key}")
        added = value_at(doc, f"{prefix}.target.api_endpoint.adapter_config.params_to_add")
        if isinstance(added, dict):
            for key in ("top_k", "max_tokens", *SAMPLING_PARAMS):
                if added.get(key) is not None:
                    found["max_new_tokens" if key == "max_tokens" else key] = (added[key], f"{prefix}.target.api_endpoint.adapter_config.params_to_add.{key}")
    task_params = value_at(doc, f"{task_path}.nemo_evaluator_config.config.params.extra.args")
    global_args = value_at(doc, f"{GLOBAL_PARAMS}.extra.args")
    for where, args in ((f"{GLOBAL_PARAMS}.extra.args", global_args), (f"{task_path}.nemo_evaluator_config.config.params.extra.args", task_params)):
        for key, value in ns_generation_overrides(args).items():
            found[key] = (value, where)
    return found


def thinking_setting(doc: Any, task_path: str | None = None) -> tuple[Any, str] | None:
    """(enable_thinking value, key) as the payload modifier sends it for a task (task level wins), or None."""
    prefixes = ["evaluation.nemo_evaluator_config"] + ([f"{task_path}.nemo_evaluator_config"] if task_path else [])
    found = None
    for prefix in prefixes:
        key = f"{prefix}.target.api_endpoint.adapter_config.params_to_add.chat_template_kwargs"
        kwargs = value_at(doc, key)
        if isinstance(kwargs, dict):
            for name in ("enable_thinking", "thinking"):
                if name in kwargs:
                    found = (kwargs[name], f"{key}.{name}")
    return found


def serving_context(doc: Any, report: checkpoint.CheckpointReport | None) -> tuple[int | None, str]:
    """The context the server will run with: its context-length flag, else the checkpoint's own limit."""
    framework = deployment_type(doc)
    flag = CONTEXT_LENGTH_FLAGS.get(framework)
    raw = value_at(doc, "deployment.extra_args")
    if flag and isinstance(raw, str):
        try:
            values = dict(parse_extra_args(raw))
        except ToolError:
            values = {}
        if str(values.get(flag) or "").isdigit():
            return int(str(values[flag])), f"deployment.extra_args {flag}"
    if report and report.context_length:
        return report.context_length, "the checkpoint's max_position_embeddings"
    return None, ""


@cache
def template_params() -> dict[str, set[Any]]:
    """NEL's template params (temperature 1.0, max_new_tokens 131072, ...): values nobody chose for this model."""
    values: dict[str, Any] = {}
    for model_type in ("base", "chat_reasoning"):
        file = _templates_dir() / "evaluation" / model_type / "default.yaml"
        params = value_at(parse_config_text(file.read_text(encoding="utf-8"), str(file)), GLOBAL_PARAMS)
        for key, value in to_plain(params or {}).items():
            if not isinstance(value, (dict, list)):
                values.setdefault(key, set()).add(value)
    return values


def model_source_report(doc: Any, config_path: Path) -> checkpoint.CheckpointReport | None:
    """inspect_checkpoint's report for the config's model when it is readable here (local path or cached HF handle)."""
    deployment = doc.get("deployment")
    if not isinstance(deployment, dict):
        return None
    local, handle = deployment.get("checkpoint_path"), deployment.get("hf_model_handle")
    if isinstance(local, str) and local not in ("", MISSING):
        path = Path(local).expanduser()
        if not path.is_absolute():
            path = config_path.parent / path
        if (path / "config.json").is_file():
            return inspect_cached(str(path.resolve()), (path / "config.json").stat().st_mtime_ns)
    elif isinstance(handle, str) and handle not in ("", MISSING):
        # The HF cache layout (models--org--name/refs/main); refs/main changes when a new revision lands.
        repo = checkpoint.hf_hub_cache() / ("models--" + handle.replace("/", "--"))
        ref = repo / "refs" / "main"
        if repo.is_dir():
            return inspect_cached(handle, (ref if ref.is_file() else repo).stat().st_mtime_ns)
    return None


@cache
def inspect_cached(path: str, mtime_ns: int) -> checkpoint.CheckpointReport | None:
    try:
        return checkpoint.inspect_checkpoint(checkpoint.InspectCheckpointInput(checkpoint=path))
    except ToolError:
        return None  # a broken checkpoint is inspect_checkpoint's to report, not a config problem


def mount_checkpoint_for_evaluation(doc: CommentedMap, local_path: str | None) -> list[str]:
    """execution.mounts.evaluation[<checkpoint>] = /checkpoint, replacing any other checkpoint mounted there.

    A mapping key, not a dotted path: it holds dots and slashes. Returns one change line per edit.
    """
    changes = []
    execution = doc.get("execution")
    mounts = execution.get("mounts") if isinstance(execution, dict) else None
    evaluation = mounts.get("evaluation") if isinstance(mounts, dict) else None
    if isinstance(evaluation, dict):
        for source in [key for key, target in evaluation.items() if target == EVALUATION_CHECKPOINT_MOUNT and key != local_path]:
            del evaluation[source]
            changes.append(f"execution.mounts.evaluation: removed {source} -> {EVALUATION_CHECKPOINT_MOUNT}")
    if local_path is None:
        return changes
    execution = doc.setdefault("execution", CommentedMap())
    if not isinstance(execution.get("mounts"), dict):
        execution["mounts"] = CommentedMap()
    if not isinstance(execution["mounts"].get("evaluation"), dict):
        execution["mounts"]["evaluation"] = CommentedMap()
    if execution["mounts"]["evaluation"].get(local_path) != EVALUATION_CHECKPOINT_MOUNT:
        execution["mounts"]["evaluation"][local_path] = EVALUATION_CHECKPOINT_MOUNT
        changes.append(f"execution.mounts.evaluation: {local_path} -> {EVALUATION_CHECKPOINT_MOUNT}")
    return changes


def _is_nemo_skills(name: str) -> bool:
    return any(entry.harness == "nemo_skills" for entry in tasks.lookup(name))


def _sibling(path: str, key: str) -> str:
    return f"{path.rsplit('.', 1)[0]}.{key}"


def _reads_tokenizer(name: str) -> bool:
    return any(entry.reads_tokenizer for entry in tasks.lookup(name))


def env_var_defined(doc: Any, name: str) -> bool:
    """The config itself gives `name` a value (env_vars or evaluation.env_vars), so the host need not."""
    for mapping in (doc.get("env_vars"), (doc.get("evaluation") or {}).get("env_vars") if isinstance(doc.get("evaluation"), dict) else None):
        if isinstance(mapping, dict) and isinstance(mapping.get(name), str) and not str(mapping[name]).startswith("host:"):
            return True
    return False


def apply_checkpoint(request: ApplyCheckpointInput, progress: ProgressFn = no_progress) -> ApplyCheckpointOutput:  # noqa: C901
    """Use after add_tasks, and again whenever the checkpoint changes: sets all the config takes from it (model, TP, server
    flags, token budget, sampling, thinking, tokenizer).
    """
    config_path = Path(request.config_path).expanduser()
    doc = load_config(config_path)
    if is_nel_next(doc):
        from quanteval.workflow import nextconfig

        return nextconfig.apply_checkpoint_next(request, progress)
    framework = deployment_type(doc)
    if framework not in CONTEXT_LENGTH_FLAGS:
        raise ToolError(
            f"{request.config_path}: deployment is '{framework}'; apply_checkpoint configures a server NEL starts (vllm, sglang or trtllm). "
            "For an existing endpoint set target.api_endpoint.model_id/url with set_config_value; for NIM set deployment.image."
        )
    progress(0, 2, "inspecting checkpoint")
    report = checkpoint.inspect_checkpoint(checkpoint.InspectCheckpointInput(checkpoint=request.checkpoint))
    progress(1, 2, "writing config")
    handle = report.hf_handle
    if framework == "trtllm" and handle and not request.cluster_checkpoint_path:
        raise ToolError(f"{request.checkpoint}: NEL's TensorRT-LLM deployment reads a local checkpoint_path only. Give the checkpoint's directory (or cluster_checkpoint_path).")
    local_path = request.cluster_checkpoint_path or (None if handle else report.checkpoint)
    served_name = request.served_model_name or handle or Path(report.checkpoint).name
    flags = report.deployment_flags.get(framework)
    additions = [option for option in parse_extra_args(" ".join(shlex.quote(arg) for arg in flags.args)) if option[0] not in NEL_COMMAND_FLAGS[framework]] if flags else []
    parser = frameworks.REASONING_PARSERS.get(report.architecture.model_type or "", {}).get(framework) if report.reasoning else None
    if parser:
        additions.append(("--reasoning-parser", parser))
    tp = request.tensor_parallel_size or (report.gpu_fit[0].tensor_parallel_size if report.gpu_fit else None)
    context = report.context_length
    budget = generation_budget(context) if context else None
    changes: list[str] = []
    notes: list[str] = []

    def write(doc: CommentedMap, path: str, value: Any) -> None:
        old = value_at(doc, path)
        if old != value or not has_path(doc, path):
            set_path(doc, path, value)
            changes.append(f"{path}: {to_plain(old)!r} -> {to_plain(value)!r}")

    def remove(doc: CommentedMap, path: str, why: str) -> None:
        if has_path(doc, path):
            delete_path(doc, path)
            changes.append(f"{path}: removed ({why})")

    def mutate(doc: CommentedMap) -> None:
        changes.clear()
        notes.clear()
        old = model_source_report(doc, config_path)  # what the config pointed at before: its values are ours to replace
        old_sources = {str(v) for v in (value_at(doc, "deployment.checkpoint_path"), value_at(doc, "deployment.hf_model_handle")) if v}
        if local_path:
            write(doc, "deployment.checkpoint_path", local_path)
            if framework != "trtllm":
                write(doc, "deployment.hf_model_handle", None)
        else:
            write(doc, "deployment.hf_model_handle", handle)
            write(doc, "deployment.checkpoint_path", None)
        write(doc, "deployment.served_model_name", served_name)
        if tp:
            write(doc, "deployment.tensor_parallel_size", tp)
        # The checkpoint's flags replace ours in place; an owned flag this checkpoint does not need goes.
        merged = parse_extra_args(merge_extra_args(str(value_at(doc, "deployment.extra_args") or ""), additions))
        needed = {flag for flag, _ in additions}
        write(doc, "deployment.extra_args", render_extra_args([o for o in merged if o[0] in needed or o[0] not in owned_flags(framework)]))
        _apply_image(doc, framework, write, notes)
        _apply_thinking(doc, report, write, remove)
        _apply_generation(doc, report, old, budget, context, write, notes)
        _apply_tokenizer(doc, report, old, old_sources, local_path, write, remove, notes, changes)
        task_names = [str(task.get("name")) for _, task in config_tasks(doc) if isinstance(task, dict)]
        if any(_is_nemo_skills(name) for name in task_names):
            if not value_at(doc, "target.api_endpoint.api_key_name"):
                write(doc, "target.api_endpoint.api_key_name", "DUMMY_API_KEY")
            key_name = str(value_at(doc, "target.api_endpoint.api_key_name"))
            if key_name == "DUMMY_API_KEY" and not env_var_defined(doc, key_name):
                write(doc, f"evaluation.env_vars.{key_name}", DUMMY_KEY_VALUE)
                notes.append("NeMo-Skills tasks send an API key even to a self-deployed server: the config now gives DUMMY_API_KEY a dummy value (evaluation.env_vars), nothing to export.")

    diff = edit_config(config_path, mutate)
    # this framework's own verdict on the format (flags.notes) replaces the checkpoint's summary across frameworks
    summary = set(checkpoint.format_warnings(report.quantization)) if flags else set()
    warnings = [warning for warning in report.warnings if warning not in summary]
    notes = list(dict.fromkeys(warnings + (list(flags.notes) if flags else []) + notes))
    missing = missing_value_paths(load_config(config_path))
    return ApplyCheckpointOutput(config_path=request.config_path, changes=changes, diff=diff, missing_values=missing, notes=notes)


WriteFn = Callable[[CommentedMap, str, Any], None]


def _apply_image(doc: CommentedMap, framework: str, write: WriteFn, notes: list[str]) -> None:
    """A serving image that cannot move between the baseline and the quantized run: the release quanteval's facts
    for this framework were checked against, where the config names none (NEL's default is `:latest`) or a moving tag."""
    from quanteval.workflow.validation import unpinned_image

    pinned = frameworks.PINNED_IMAGES.get(framework)
    current = value_at(doc, "deployment.image")
    if pinned and (current is None or unpinned_image(current)):
        write(doc, "deployment.image", pinned)
        notes.append(f"deployment.image pinned to {pinned}, the {framework} release quanteval's facts were checked against "
                     f"(was {current or 'unset: NEL default latest'}); use your own pinned tag if you serve another release.")


def _apply_thinking(doc: CommentedMap, report: checkpoint.CheckpointReport, write: WriteFn, remove: Callable[[CommentedMap, str, str], None]) -> None:
    """Thinking on for a chat template with a reasoning toggle (unless the config already chose); gone for one without."""
    key = f"{GLOBAL_ADAPTER}.params_to_add"
    added = value_at(doc, key)
    if report.reasoning:
        if added == MISSING or (added is None and has_path(doc, key)):
            write(doc, key, CommentedMap(chat_template_kwargs=CommentedMap(enable_thinking=True)))
        elif isinstance(added, dict) and thinking_setting(doc) is None:
            write(doc, f"{key}.chat_template_kwargs.enable_thinking", True)
        return
    why = "the chat template has no reasoning toggle"
    if added == MISSING:  # NEL's template says: remove the field for models without a reasoning toggle
        remove(doc, key, why)
        return
    for path, _ in list(walk(doc)):
        if path.endswith("params_to_add.chat_template_kwargs") and has_path(doc, path):
            kwargs = get_path(doc, path)
            for name in ("enable_thinking", "thinking"):
                if isinstance(kwargs, dict) and name in kwargs:
                    remove(doc, f"{path}.{name}", why)
            if isinstance(kwargs, dict) and not kwargs:
                remove(doc, path, "empty")
            parent = path.rsplit(".", 1)[0]
            if has_path(doc, parent) and get_path(doc, parent) in ({}, None):
                remove(doc, parent, "empty")


def _apply_generation(
    doc: CommentedMap, report: checkpoint.CheckpointReport, old: checkpoint.CheckpointReport | None,
    budget: int | None, context: int | None, write: WriteFn, notes: list[str],
) -> None:
    """max_new_tokens within the serving context, and the checkpoint's sampling where nobody chose other values."""
    template = template_params()
    old_budget = generation_budget(old.context_length) if old and old.context_length else None
    if budget and context:
        for path, value in list(walk(doc)):
            if not path.endswith("config.params.max_new_tokens") or not isinstance(value, int) or isinstance(value, bool):
                continue
            is_global = path == f"{GLOBAL_PARAMS}.max_new_tokens"
            if value >= context or (is_global and (value in template.get("max_new_tokens", ()) or value == old_budget)):
                write(doc, path, budget)
                if value >= context:
                    notes.append(f"{path} was {value}, not below the serving context {context}: every request would be refused. Now {budget}, leaving {context - budget} tokens for the prompt.")
    defaults = report.generation_defaults
    taken = []
    for key in SAMPLING_PARAMS:
        want = defaults.get(key)
        path = f"{GLOBAL_PARAMS}.{key}"
        if want is None:
            continue
        current = value_at(doc, path)
        if current is None or current in template.get(key, ()) or (old is not None and current == old.generation_defaults.get(key)):
            if current != want:
                write(doc, path, want)
                taken.append(f"{key} {want}")
        elif current != want:
            notes.append(f"Kept {path} = {current}; the checkpoint's generation_config.json recommends {want}.")
    top_k = defaults.get("top_k")
    top_k_path = f"{GLOBAL_ADAPTER}.params_to_add.top_k"
    current_top_k = value_at(doc, top_k_path)
    old_top_k = old.generation_defaults.get("top_k") if old else None
    if top_k is not None and (current_top_k is None or current_top_k == old_top_k):
        if current_top_k != top_k and isinstance(value_at(doc, f"{GLOBAL_ADAPTER}.params_to_add") or {}, dict):
            write(doc, top_k_path, top_k)
            taken.append(f"top_k {top_k} (sent by the payload modifier: NEL has no top_k param)")
    elif top_k is None and current_top_k is not None and current_top_k == old_top_k:
        delete_path(doc, top_k_path)
        notes.append(f"{top_k_path}: removed (it came from the previous checkpoint's generation_config.json).")
    if taken:
        notes.append(f"Sampling from the checkpoint's generation_config.json (NEL's template values replaced): {', '.join(taken)}.")


def _apply_tokenizer(
    doc: CommentedMap, report: checkpoint.CheckpointReport, old: checkpoint.CheckpointReport | None, old_sources: set[str],
    local_path: str | None, write: WriteFn, remove: Callable[[CommentedMap, str, str], None], notes: list[str], changes: list[str],
) -> None:
    """The evaluation container's tokenizer: the HF handle, or on SLURM the checkpoint mounted at /checkpoint.

    Only lm-evaluation-harness, ruler and genai-perf tasks read it, and NEL warns about a parameter a task's command
    never reads: so it goes where the readers are, globally when every task reads it, else under each reading task,
    and nowhere without readers. With readers and no way to reach a local checkpoint from the evaluation container
    (NEL's local executor mounts nothing there) it stays ??? with a note.
    """
    handle = report.hf_handle
    on_slurm = execution_type(doc) == "slurm"
    tokenizer = handle or (EVALUATION_CHECKPOINT_MOUNT if local_path and on_slurm else None)
    entries = [(path, str(task.get("name"))) for path, task in config_tasks(doc) if isinstance(task, dict)]
    readers = [(path, name) for path, name in entries if _reads_tokenizer(name)]
    if readers and len(readers) == len(entries):
        targets = [GLOBAL_TOKENIZER]
    else:
        targets = [f"{path}.nemo_evaluator_config.config.params.extra.tokenizer" for path, _ in readers]
    ours = {MISSING, EVALUATION_CHECKPOINT_MOUNT, *old_sources} | ({old.hf_handle} if old and old.hf_handle else set())
    present = [path for path, _ in walk(doc) if path.endswith("params.extra.tokenizer")]
    backend = next((value_at(doc, _sibling(path, "tokenizer_backend")) for path in present if value_at(doc, path) in ours
                    and value_at(doc, _sibling(path, "tokenizer_backend")) is not None), None)
    for path in present:
        if path in targets:
            continue
        if value_at(doc, path) not in ours:
            idle = [name for task_path, name in entries if (task_path, name) not in readers and not path.startswith(f"{task_path}.")]
            notes.append(f"Kept {path} = {value_at(doc, path)} (set by hand), though {', '.join(idle) or 'no task'} never read it: "
                         "NEL warns about it (dry_run's nel_warnings).")
            continue
        why = "no task in this config reads the evaluation tokenizer" if not readers else "set under the tasks that read it instead"
        remove(doc, path, why)
        remove(doc, _sibling(path, "tokenizer_backend"), "goes with the tokenizer")
        if value_at(doc, path.rsplit(".", 1)[0]) == {}:
            remove(doc, path.rsplit(".", 1)[0], "empty")
    mounted = False
    for path in targets:
        current = value_at(doc, path)
        if current is not None and current not in ours:
            notes.append(f"Kept {path} = {current} (set by hand); check it is {report.hf_handle or 'the tokenizer of ' + Path(report.path).name}.")
            continue
        write(doc, path, tokenizer or MISSING)
        if backend is not None:
            write(doc, _sibling(path, "tokenizer_backend"), backend)
        mounted = mounted or tokenizer == EVALUATION_CHECKPOINT_MOUNT
        if not tokenizer:
            notes.append(
                f"{path} is still ???: {', '.join(name for _, name in readers)} read it, and NEL's local executor cannot show a local "
                "checkpoint to the evaluation container. Set it to the model's Hugging Face handle (quanteval plan --set KEY=VALUE, "
                "or set_config_value)."
            )
    changes += mount_checkpoint_for_evaluation(doc, str(local_path) if mounted else None)
