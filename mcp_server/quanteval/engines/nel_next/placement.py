"""nel-next's PlacementRole (engines/base.py): apply_cluster's execution/deployment keys mapped to its cluster/services."""

from __future__ import annotations

from typing import Any

from quanteval.engines.nel_next.config import PLACEMENT_KEYS, WALLTIME_DEFAULT
from quanteval.engines.nel_next.config import placement_edits as edits
from quanteval.engines.nel_next.config import placement_view as view

native = False
writes_host = True  # nel-next submits to the host its config names


def key(key: str) -> str:
    return PLACEMENT_KEYS.get(key, key)


def defaults(doc: Any) -> dict[str, Any]:
    """nel-next's own walltime default (its SlurmCluster's); the parallel sizes are NEL 0.2.6's (placement_form)."""
    return {"execution.walltime": WALLTIME_DEFAULT}
