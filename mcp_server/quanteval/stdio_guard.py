"""Keep library prints off the stdout that carries JSON (CLI) or MCP frames (stdio server).

NEL and the libraries it pulls print to stdout freely; Python-level redirection misses
subprocesses and C code, so this works at the file-descriptor level.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[int]:
    """Point fd 1 (and sys.stdout) at stderr for the block; yield a private fd of the real stdout."""
    sys.stdout.flush()
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    saved_sys_stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        yield real_stdout
    finally:
        sys.stderr.flush()
        sys.stdout = saved_sys_stdout
        os.dup2(real_stdout, 1)
        os.close(real_stdout)
