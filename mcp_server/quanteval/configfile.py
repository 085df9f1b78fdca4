"""The config-file layer: round-trip YAML, dotted paths, atomic edits with a diff. It knows no engine.

Edits go through ruamel.yaml's round-trip mode so comments and key order survive, and
through `edit_config`, which holds an exclusive lock on the config's directory while it reads,
changes and atomically replaces the config — two writers never lose each other's update.

Dotted paths address nested keys; a list element is addressed by index
(`evaluation.tasks[0]`) or, for lists of named entries such as `evaluation.tasks`, by
name (`evaluation.tasks[ns_gpqa].nemo_evaluator_config.config.params.temperature`).

Which files are evaluation configs at all is the engines' knowledge: callers pass a `Check` that refuses others.
"""

from __future__ import annotations

import difflib
import fcntl
import io
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from quanteval import paths
from quanteval.models import ToolError

MISSING = "???"  # OmegaConf's marker for a value that must be filled in (nel-next configs use it too)

# Refuses (ToolError) a parsed file that is not the kind of config the caller reads or rewrites.
Check = Callable[[CommentedMap, Path], None]

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
    except RecursionError:
        raise ToolError(_too_deep(source)) from None
    if doc is None:
        return CommentedMap()
    if not isinstance(doc, CommentedMap):
        raise ToolError(f"{source}: the top level must be a mapping (keys like `execution:`, `evaluation:`), not {_kind(doc)}.")
    _check_expansion(doc, source)
    return doc


MAX_EXPANDED_NODES = 50_000  # a NEL config has a few hundred; nested YAML aliases can expand to billions
MAX_DEPTH = 64  # a NEL config nests under 10 levels; every reader of a config (JSON, diffs, walks) recurses


def _too_deep(source: str) -> str:
    return (f"{source}: the YAML nests deeper than {MAX_DEPTH} levels (a config nests under 10). Flatten it; the file "
            "was not changed.")


def _check_expansion(doc: Any, source: str) -> None:
    """Refuse a document whose aliases expand past MAX_EXPANDED_NODES (a "billion laughs" file), or that nests
    deeper than MAX_DEPTH.

    ruamel shares aliased nodes, so loading is cheap; reading them out (JSON, diffs) is not.
    The walk stops at the bound, so it costs at most MAX_EXPANDED_NODES steps.
    """
    stack, seen = [(doc, 1)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if depth > MAX_DEPTH:
            raise ToolError(_too_deep(source))
        if seen > MAX_EXPANDED_NODES:
            raise ToolError(
                f"{source}: the YAML expands to more than {MAX_EXPANDED_NODES} values (nested aliases `*name`?). "
                "Replace the aliases with the values they stand for."
            )
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)


def dump_config(doc: CommentedMap, layout: Layout = NEL_LAYOUT) -> str:
    buffer = io.StringIO()
    _yaml(layout).dump(doc, buffer)
    return buffer.getvalue()


MAX_CONFIG_BYTES = 1_000_000  # NEL configs are a few KB; anything this large is the wrong file


def read_text(path: Path) -> str:
    if not path.is_file():
        raise ToolError(f"{path}: no such config file. Create one with build_config, or check the path.")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ToolError(f"{path}: {path.stat().st_size} bytes, too large for a NEL config (limit {MAX_CONFIG_BYTES}). Check the path.")
    return path.read_text(encoding="utf-8")


def load_config(path: str | Path, check: Check | None = None) -> CommentedMap:
    """Load a config for reading or round-trip editing (comments and order kept); `check` refuses other files."""
    path = Path(path).expanduser()
    doc = parse_config_text(read_text(path), str(path))
    if check is not None:
        check(doc, path)
    return doc


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


def edit_config(path: str | Path, mutate: Callable[[CommentedMap], None], check: Check | None = None) -> str:
    """Apply `mutate` to the config under an exclusive lock and replace the file atomically.

    Returns the unified diff ("" when nothing changed). Bad YAML, a file `check` refuses, or a ToolError
    from `mutate` leaves the file untouched.
    """
    path = Path(path).expanduser()
    with _locked(path):
        before = read_text(path)
        doc = parse_config_text(before, str(path))
        if check is not None:
            check(doc, path)
        mutate(doc)
        after = dump_config(doc, guess_layout(before))
        if after == before:
            return ""
        paths.write_file(path, after)
    lines = before.splitlines(keepends=True), after.splitlines(keepends=True)
    return "".join(difflib.unified_diff(*lines, f"a/{path.name}", f"b/{path.name}"))


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


def value_at(doc: Any, dotted: str) -> Any:
    """The value at `dotted`, or None where the path does not exist."""
    return get_path(doc, dotted) if has_path(doc, dotted) else None


def missing_value_paths(doc: Any) -> list[str]:
    return [path for path, value in walk(doc) if value == MISSING]


def as_round_trip(value: Any) -> Any:
    """JSON objects/lists as round-trip nodes, so they are written in block style like the rest of the file."""
    if isinstance(value, dict) and not isinstance(value, CommentedMap):
        return CommentedMap((key, as_round_trip(item)) for key, item in value.items())
    if isinstance(value, list) and not isinstance(value, CommentedSeq):
        return CommentedSeq(as_round_trip(item) for item in value)
    return value


def parse_yaml_value(text: str) -> Any:
    """One value written as YAML text (`[a, b]`, `{limit_samples: 10}`, a block), as a round-trip node."""
    wrapped = parse_config_text(f"value: {text}" if "\n" not in text else "value:\n" + "\n".join("  " + line for line in text.splitlines()), "yaml_value")
    return wrapped["value"]


def load_plain(path: Path) -> dict:
    """The config as plain data via libyaml: validation needs no comments, and this is ~10x faster than round-trip."""
    import yaml

    if not path.is_file():
        raise ToolError(f"{path}: no such config file. Create one with build_config, or check the path.")
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise ToolError(f"{path}: invalid YAML at {where}: {exc.problem or exc.context or 'invalid YAML'}. Fix the YAML syntax there.") from None
    except RecursionError:
        raise ToolError(_too_deep(str(path))) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ToolError(f"{path}: the top level must be a mapping (keys like `execution:`, `evaluation:`).")
    _check_expansion(doc, str(path))  # libyaml shares aliased nodes too: every walk after this one is bounded
    return doc


def list_at(parent: Any, key: str, shown: str) -> CommentedSeq:
    """The list at parent[key], created empty where it is missing or null (an edit appends to it); `shown` is its
    dotted path, named when the config holds something else there."""
    items = parent.get(key)
    if items is None:
        items = parent[key] = CommentedSeq()
    if not isinstance(items, list):
        raise ToolError(f"{shown} must be a list. Fix the config or rebuild it with build_config.")
    return items
