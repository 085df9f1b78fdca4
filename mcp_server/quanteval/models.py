"""Shared pieces every domain module may import: the user-facing error and progress reporting.

Models specific to one domain live next to the functions that use them; only what
several domains share lives here.
"""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, ConfigDict


class ToolError(Exception):
    """A failure the person can act on: the message names the file or key and the fix.

    Raised by tool functions; the MCP server returns it as a tool error and the CLI
    prints it on stderr with exit code 1. Anything else raised by a tool is a bug and
    reaches the client only as a generic message, never as a traceback.
    """


class ProgressFn(Protocol):
    def __call__(self, progress: float, total: float | None = None, message: str | None = None) -> None: ...


def no_progress(progress: float, total: float | None = None, message: str | None = None) -> None:
    """The progress reporter used when nobody listens (CLI, tests)."""


class StrictModel(BaseModel):
    """Tool inputs reject unknown keys, so a misspelled argument is an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")
