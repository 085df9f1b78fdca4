"""Shared pieces every domain module may import: the user-facing error and progress reporting.

Models specific to one domain live next to the functions that use them; only what
several domains share lives here.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
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


_CANCEL_CHECK = threading.local()


@contextlib.contextmanager
def cancellable_by(check: Callable[[], None]) -> Iterator[None]:
    """Inside the block, cancellation_point() calls `check` (on this thread): the face running a tool (an MCP call)
    says there whether its caller still wants the answer."""
    previous = getattr(_CANCEL_CHECK, "check", None)
    _CANCEL_CHECK.check = check
    try:
        yield
    finally:
        _CANCEL_CHECK.check = previous


def cancellation_point() -> None:
    """Called by a wait's every poll: raises into the tool when its call was cancelled (between progress reports, which
    are seconds apart; a client that gave up may kill this process within 4 s). Nothing where no face set a check."""
    check = getattr(_CANCEL_CHECK, "check", None)
    if check is not None:
        check()


def pause(seconds: float, slice_s: float = 0.2) -> None:
    """time.sleep that a cancelled call leaves within slice_s (a poll's wait between status reads is seconds long: a
    SIGTERM or a cancel waited the whole of it)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        cancellation_point()
        time.sleep(min(slice_s, left))
    cancellation_point()


class StrictModel(BaseModel):
    """Tool inputs reject unknown keys, so a misspelled argument is an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")
