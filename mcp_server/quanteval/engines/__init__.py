"""Evaluation engines behind one seam: which engine a config belongs to, and where each engine lives.

- "nel": NeMo Evaluator Launcher 0.2.6 (`nel run`, containers; Hydra configs with execution/deployment/evaluation),
  driven in-process through its Python API in child processes (quanteval.engines.nel.nelexec).
- "nel-next": NeMo Evaluator >= 0.3 (`nel eval run`, benchmarks in-process; configs with services/benchmarks/
  cluster/output), driven through its CLI from its own Python 3.12 venv (quanteval.engines.nel_next.nelnext).

The workflow tools keep their names and dispatch on `engine_of(config)`.
"""

from __future__ import annotations

from typing import Any, Literal

Engine = Literal["nel", "nel-next"]

NEL_SECTIONS = frozenset({"defaults", "execution", "deployment", "evaluation", "target", "export"})
NEL_NEXT_SECTIONS = frozenset({"services", "sandboxes", "benchmarks", "cluster", "output"})


def is_nel_next(doc: Any) -> bool:
    """A nel-next config has benchmarks:, or services: whose every entry names its `type` (a docker-compose file's
    services: never does), and none of NEL 0.2.6's sections."""
    if not isinstance(doc, dict) or set(doc) & NEL_SECTIONS:
        return False
    services = doc.get("services")
    typed = isinstance(services, dict) and bool(services) and all(isinstance(s, dict) and "type" in s for s in services.values())
    return "benchmarks" in doc or typed


def engine_of(doc: Any) -> Engine:
    """The engine a parsed config is written for: nel-next by its sections, NEL 0.2.6 otherwise."""
    return "nel-next" if is_nel_next(doc) else "nel"
