"""NEL 0.2.6's PlacementRole (engines/base.py): apply_cluster's neutral form is NEL 0.2.6's own execution/deployment
keys, so the view, keys and edits are the config's own."""

from __future__ import annotations

from typing import Any

from quanteval.engines.base import PARALLEL_KEYS
from quanteval.engines.nel.config import deployment_type

native = True
writes_host = False  # apply_cluster leaves execution.hostname as the config has it


def view(doc: Any) -> Any:
    return doc


def key(key: str) -> str:
    return key


def edits(values: dict[str, Any]) -> dict[str, Any]:
    return values


def defaults(doc: Any) -> dict[str, Any]:
    """NEL 0.2.6's packaged defaults: the deployment type's parallel sizes (configs/deployment/<type>.yaml) and the
    SLURM walltime (configs/execution/slurm/default.yaml)."""
    from quanteval.engines.nel import nelfacts

    deployment = nelfacts.packaged_defaults(f"deployment/{deployment_type(doc)}")
    parallel = {f"deployment.{key}": deployment[key] for key in PARALLEL_KEYS if key in deployment}
    walltime = nelfacts.packaged_defaults("execution/slurm/default").get("walltime")
    return parallel if walltime is None else {**parallel, "execution.walltime": walltime}
