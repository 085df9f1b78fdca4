"""How a config names a NeMo-Skills benchmark in nel-next (`skills://NAME`): the names alone, checked before anything
is imported. Both the launch check (nelnext.py) and the benchmark probes (skills.py) read them, so they sit below both.
"""

from __future__ import annotations

import re
from typing import Any

SCHEME = "skills://"
# NeMo-Skills' benchmark names (aime24, math-500, ruler.niah_single_1 ...): a name is a dataset module NeMo-Skills
# imports, so one that is a path (`skills://../../elsewhere`) would import a package from anywhere.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def name_problem(name: str) -> str | None:
    """Why `skills://NAME` is not a NeMo-Skills benchmark name, or None: checked before anything is imported."""
    if NAME_PATTERN.fullmatch(name) and ".." not in name:
        return None
    return (f"skills://{name} is not a NeMo-Skills benchmark name (letters, digits, '_', '-' and '.', no '/' or '..'): "
            "a name is a dataset module NeMo-Skills imports, never a path. Name a benchmark in NeMo-Skills' dataset folder.")


def skills_names(benchmarks: list[Any]) -> dict[int, str]:
    """index -> NAME for each `skills://NAME` item of a config's benchmarks list."""
    return {i: str(b["name"])[len(SCHEME):] for i, b in enumerate(benchmarks)
            if isinstance(b, dict) and str(b.get("name", "")).startswith(SCHEME)}
