"""enable_toolsets: toolsets a client turns on while connected, as github-mcp-server's dynamic toolsets do, so an IDE
whose only link is the MCP connection never needs a restart with another `--toolsets` to call a tool it was told of.

The MCP server adds the toolsets' tools to its tools/list and sends notifications/tools/list_changed (mcpapp.py);
the CLI already runs every tool, so there this tool only says which tools the toolsets hold.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from quanteval import registry
from quanteval.models import StrictModel
from quanteval.toolsets import TOOLSETS

ToolsetName = Literal.__getitem__(tuple(TOOLSETS))  # type: ignore[attr-defined]  # the names toolsets.py declares


class EnableToolsetsInput(StrictModel):
    toolsets: list[ToolsetName] = Field(min_length=1, description="cluster (SLURM over ssh), deploy (serve a checkpoint on "
                                                                  "its own), evalserver (for training loops), or any other.")


class EnableToolsetsOutput(BaseModel):
    tools: list[str] = Field(description="The tools these toolsets hold, callable now.")
    added: list[str] = Field(description="Those this call added to tools/list.")
    message: str


def enable_toolsets(request: EnableToolsetsInput) -> EnableToolsetsOutput:
    """Use when a tool you were told of is not in your tools/list: turns its toolset on for this server (tools/list
    grows; clients are notified)."""
    return EnableToolsetsOutput(tools=list(registry.select(list(request.toolsets))), added=[],
                                message="The CLI runs every tool: nothing to turn on.")


def how_to_enable(name: str, read_only: bool = False, ceiling: list[str] | None = None) -> str | None:
    """For a tool this server does not serve now: the call that makes it callable, or None when no toolset holds it.
    `ceiling`: the toolsets the operator's --toolsets allows (None: any)."""
    spec = registry.TOOLS.get(name)
    if spec is None:
        return None
    if read_only and not spec.read_only:
        return (f"{name} changes things, and this server was started --read-only: it serves only tools that change "
                "nothing. Use the quanteval CLI, or a server started without --read-only.")
    if ceiling is not None and spec.toolset not in ceiling:
        return (f"{name} is in the {spec.toolset} toolset, which this server's operator did not serve (--toolsets "
                f"{','.join(ceiling)}). Use the quanteval CLI, or a server started with that toolset.")
    return (f"{name} is in the {spec.toolset} toolset ({TOOLSETS[spec.toolset].description}), not served by this server "
            f"now: call enable_toolsets with toolsets [\"{spec.toolset}\"], then call {name}.")
