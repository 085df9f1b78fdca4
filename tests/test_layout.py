"""The package's folders are its architecture, and imports only point down through them.

faces (MCP, CLI, HTTP) -> workflow (the tools a user calls) -> evalserver (the eval server's job queue and backends)
-> engines / serving -> clusters -> the core modules at the package's top (models, ledger, paths, registry ...). A
module that imports upward would make the folders lie about where a new engine, framework or executor goes, so every
import, lazy ones inside functions too, is checked here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import quanteval

PACKAGE = Path(quanteval.__file__).parent
LAYER = {"faces": 5, "workflow": 4, "evalserver": 3, "engines": 2, "serving": 2, "clusters": 1}  # top-level modules: 0


def _layer(module: str) -> int:
    return LAYER.get(module.split(".")[1], 0)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("quanteval"):
            names.update(f"{node.module}.{alias.name}" if node.module.count(".") < 2 else node.module for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("quanteval"))
    return names


def test_every_import_points_down_or_sideways_within_its_folder():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("quanteval", *path.relative_to(PACKAGE).with_suffix("").parts))
        for imported in _imports(path):
            if _layer(imported) > _layer(module):
                upward.append(f"{module} imports {imported}")
    assert upward == []


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph() -> dict[str, set[str]]:
    """{module: the package's modules it imports}, lazy imports inside functions included; `from a.b import c` is an
    edge to the module a.b.c where one exists, else to a.b. Imports under `if TYPE_CHECKING:` never run: left out."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING":
                node.body = []
        named = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("quanteval"):
                named.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                named.update(alias.name for alias in node.names if alias.name.startswith("quanteval"))
        graph[module] = {target for name in named if (target := resolve(name)) and target != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            module, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in stack:
                    low[module] = min(low[module], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                group = stack[stack.index(module):]
                del stack[stack.index(module):]
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_import_cycles_even_through_imports_inside_functions():
    """A cycle hidden in a function-level import still ties the modules together: neither can be read, moved or
    tested without the other, and which one loads first decides what works. The shared piece goes down instead."""
    assert _cycles(_module_graph()) == []


def test_the_cycle_check_finds_a_cycle_through_a_lazy_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert any("quanteval.engines.base" in targets for targets in _module_graph().values())


def test_the_core_at_the_top_is_small_and_each_folder_holds_its_domain():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert top == ["configfile", "envvars", "failures", "forkserver", "kept", "ledger", "localproc", "models", "paths", "redact",
                   "registry", "stdio_guard", "toolsets", "warm_python", "zygote"]
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(LAYER)


def test_registry_names_resolve_to_the_folder_modules():
    from quanteval import registry

    for spec in registry.TOOLS.values():
        assert spec.module.split(".")[0] in LAYER, spec.fn
        assert spec.function.__module__ == f"quanteval.{spec.module}"


ENGINE_PACKAGES = frozenset(p.name for p in (PACKAGE / "engines").iterdir() if (p / "__init__.py").exists())
# The one tool that speaks two engines by name: convert_config maps a NEL 0.2.6 config to nel-next's.
SPEAKS_TWO_ENGINES = frozenset({"workflow/convert.py"})


def _engine_package(imported: str) -> str | None:
    """The engine package (nel, nel_next) an import names, or None for the neutral engines/*.py and everything else."""
    parts = imported.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "engines" and parts[2] in ENGINE_PACKAGES else None


def _engine_imports() -> dict[str, set[str]]:
    """{module path under the package: the engine packages' modules it imports}, for modules that import any."""
    found: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        named = {imported for imported in _imports(path) if _engine_package(imported)}
        if named:
            found[path.relative_to(PACKAGE).as_posix()] = named
    return found


def test_engine_packages_never_import_each_other():
    """What both engines know (the task recipes, NEL's task catalogue, server flags and generation budgets) lives in
    neutral modules (engines/recipes.py, engines/catalogue.py, serving/serverflags.py); an engine package needs no
    other engine's package, so a new engine is one package and one registry line."""
    crossing = [f"{module} imports {imported}" for module, named in _engine_imports().items() if module.startswith("engines/")
                for imported in sorted(named) if _engine_package(imported) != module.split("/")[1]]
    assert crossing == []


def test_only_convert_config_names_an_engine_package_outside_engines():
    """Outside engines/, modules reach an engine through its seam (engines.for_config / for_record / the registry, the
    Engine interface) and the neutral engines/*.py, never an engine's own package; convert_config alone speaks both."""
    outside = {module: named for module, named in _engine_imports().items() if not module.startswith("engines/")}
    reaching = [f"{module} imports {imported}" for module, named in outside.items()
                if module not in SPEAKS_TWO_ENGINES for imported in sorted(named)]
    assert reaching == []


def test_every_file_the_architecture_page_names_exists():
    """docs/ARCHITECTURE.md names modules by path (`clusters/executor.py`) or by file name (`deploy_local.py`): each
    is a file of the package (or the repository), so a move that leaves the page behind fails here."""
    import re

    page = (PACKAGE.parents[1] / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    names = set(re.findall(r"`([A-Za-z0-9_/]+\.py)`", page))
    files = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")}
    basenames = {path.rsplit("/", 1)[-1] for path in files}
    missing = [name for name in sorted(names)
               if name not in files and name not in basenames and not (PACKAGE.parents[1] / name).is_file()]
    assert missing == [], f"ARCHITECTURE.md names files that do not exist: {missing}"


def test_what_the_architecture_page_says_adding_an_executor_takes_is_what_the_interface_asks():
    """"Adding one" names what a new executor implements: every job verb the Executor leaves abstract (a class without
    one cannot be made), and the optional ones it names are methods the Executor gives a default; the executor verbs
    the Executor paragraph names exist. LocalExecutor and SlurmExecutor are the two that show it."""
    import inspect
    import re

    from quanteval.clusters import executor as executors

    page = (PACKAGE.parents[1] / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    bullet = page.split("- **An executor**:")[1].split("\n- **")[0]
    paragraph = page.split("**Executor** (`clusters/executor.py`).")[1].split("\nWalk of")[0]
    named = set(re.findall(r"`([a-z_]+)`", bullet))
    required = set(executors.Executor.__abstractmethods__)
    assert required <= named, f"the page leaves out verbs a new executor must implement: {sorted(required - named)}"
    optional = {name for name in named - required if hasattr(executors.Executor, name)}
    assert {"adopt", "protect_secrets", "cancel_leftovers"} <= optional
    assert all(inspect.isfunction(getattr(executors.Executor, name)) for name in optional)
    verbs = set(re.findall(r"`([a-z_]+)`", paragraph)) - {"local", "slurm"}
    on_a_class = {name for name in verbs for cls in (executors.Executor, executors.LocalExecutor, executors.SlurmExecutor)
                  if hasattr(cls, name)}
    not_verbs = {"execution", "localproc", "names_this_machine"}  # a config section, a module, ssh's host check
    unknown = sorted(verbs - on_a_class - not_verbs)
    assert unknown == [], f"the Executor paragraph names verbs no executor has: {unknown}"
    for cls in (executors.LocalExecutor, executors.SlurmExecutor):
        assert not inspect.isabstract(cls) and type(executors.EXECUTORS[cls.name]) is cls


# What a newcomer runs first, exactly as the README opens with it.
README_HEAD = """# quanteval

```bash
bash scripts/demo    # set up, then answer for real on the embedded model: how much accuracy did its W8A8 and 2-bit variants lose?
bash scripts/test    # set up everything (venvs, vLLM CPU, nel-next, OpenSSH + SLURM packages) and run the whole test suite
```
"""
README_MAX_CHARACTERS = 12_000


def test_the_readme_is_a_front_page_that_opens_with_the_two_commands():
    """The README is read before anything else: the two commands, the answer, the faces and where to read on fit in a
    front page; the rest lives in docs/, and every page it links to exists."""
    import re

    repo = PACKAGE.parents[1]
    readme = (repo / "README.md").read_text(encoding="utf-8")
    assert readme.startswith(README_HEAD)
    assert len(readme) <= README_MAX_CHARACTERS, f"README.md has {len(readme)} characters; move detail into docs/"
    linked = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme)
    assert {"docs/USAGE.md", "docs/EVAL_SERVER.md", "docs/DEVELOPING.md", "docs/ARCHITECTURE.md"} <= set(linked)
    assert [link for link in linked if not (repo / link).exists()] == []
    for page in ("USAGE.md", "EVAL_SERVER.md", "DEVELOPING.md"):
        text = (repo / "docs" / page).read_text(encoding="utf-8")
        links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text)
        assert [link for link in links if not (repo / "docs" / link).exists()] == [], page
