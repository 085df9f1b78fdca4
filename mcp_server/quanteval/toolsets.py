"""The toolsets a client can load alone (`quanteval-mcp --toolsets config,runs`); each tool in registry.TOOLS names its own.

Plain data without pydantic: `quanteval-mcp` reads it on its fast start path (help, option checks).
"""

from __future__ import annotations

from typing import NamedTuple


class Toolset(NamedTuple):
    description: str  # one line, shown by `quanteval-mcp --help` and `quanteval tools`
    default: bool  # served when `--toolsets` is not given


TOOLSETS: dict[str, Toolset] = {
    "setup": Toolset("check this machine, inspect a checkpoint", default=True),
    "config": Toolset("build, edit and validate an evaluation config; find and add tasks", default=True),
    "runs": Toolset("dry-run, launch, watch, kill and resume evaluation runs", default=True),
    "results": Toolset("validate, score, compare and gate runs; evaluate_quantization end to end", default=True),
    # The evaluation skill asks the cluster on SLURM (ssh_check, cluster_info, apply_cluster, remote_grep); a client
    # turns it on with enable_toolsets when it needs it (a sixth of the default tools/list otherwise).
    "cluster": Toolset("SLURM over ssh: access, partitions, placement, queue, remote logs", default=False),
    # Serving a checkpoint on its own (the deployment skill); evaluate_quantization serves its checkpoints itself.
    "deploy": Toolset("serve a checkpoint on its own: plan, launch, status, stop", default=False),
    # For whoever runs a training loop; its start options alone are a tenth of the full tools/list.
    "evalserver": Toolset("the HTTP eval server a training loop delegates evaluations to", default=False),
}
DEFAULT_TOOLSETS: tuple[str, ...] = tuple(name for name, toolset in TOOLSETS.items() if toolset.default)


def described(indent: str = "  ") -> str:
    """One line per toolset: name, on (served by default) or off, what it holds."""
    width = max(len(name) for name in TOOLSETS)
    return "\n".join(
        f"{indent}{name:<{width}}  {'on ' if toolset.default else 'off'}  {toolset.description}" for name, toolset in TOOLSETS.items()
    )


def parse(text: str | None) -> list[str] | None:
    """`--toolsets` as given: comma-separated names, `default` for the default ones; None (every tool) for `all`.

    Raises ValueError naming what is unknown.
    """
    names = [name.strip() for name in (text or "default").split(",") if name.strip()]
    if "all" in names:
        return None
    chosen = list(dict.fromkeys(expanded for name in names for expanded in (DEFAULT_TOOLSETS if name == "default" else [name])))
    unknown = [name for name in chosen if name not in TOOLSETS]
    if unknown:
        raise ValueError(f"unknown toolset(s) {', '.join(unknown)}; choose from all, default, {', '.join(TOOLSETS)}")
    return chosen
