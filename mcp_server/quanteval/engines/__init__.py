"""Evaluation engines behind one seam: which engine a config belongs to, and where each engine lives.

- "nel": NeMo Evaluator Launcher 0.2.6 (`nel run`, containers; Hydra configs with execution/deployment/evaluation),
  driven in-process through its Python API in child processes (quanteval.nelexec).
- "nel-next": NeMo Evaluator >= 0.3 (`nel eval run`, benchmarks in-process; configs with services/benchmarks/
  cluster/output), driven through its CLI from its own Python 3.12 venv (quanteval.engines.nelnext).

The workflow tools keep their names and dispatch on `engine_of(config)`.
"""

from __future__ import annotations

from typing import Any, Literal

Engine = Literal["nel", "nel-next"]

NEL_SECTIONS = frozenset({"defaults", "execution", "deployment", "evaluation", "target", "export"})
NEL_NEXT_SECTIONS = frozenset({"services", "sandboxes", "benchmarks", "cluster", "output"})


def engine_of(doc: Any) -> Engine:
    """The engine a parsed config is written for: nel-next by its sections, NEL 0.2.6 otherwise."""
    keys = set(doc) if isinstance(doc, dict) else set()
    return "nel-next" if keys & NEL_NEXT_SECTIONS and not keys & NEL_SECTIONS else "nel"
