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


def test_the_core_at_the_top_is_small_and_each_folder_holds_its_domain():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert top == ["configfile", "envvars", "failures", "ledger", "localproc", "models", "paths", "redact", "registry", "stdio_guard",
                   "toolsets", "warm_python", "zygote"]
    assert {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(LAYER)


def test_registry_names_resolve_to_the_folder_modules():
    from quanteval import registry

    for spec in registry.TOOLS.values():
        assert spec.module.split(".")[0] in LAYER, spec.fn
        assert spec.function.__module__ == f"quanteval.{spec.module}"
