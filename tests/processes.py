"""What is still running: the tests' check that servers and runs were stopped, leaving no process behind."""

from __future__ import annotations

import os
import time
from pathlib import Path


def running_with(*needles: str, state_dir: str | Path | None = None) -> list[str]:
    """Command lines (first 200 characters) of live processes whose command line contains every needle; with
    `state_dir`, only those started under that quanteval state dir (QUANTEVAL_STATE_DIR in their environment), so a
    test on one xdist worker does not see another test's servers of the same checkpoint."""
    wanted = f"QUANTEVAL_STATE_DIR={state_dir}".encode() if state_dir is not None else None
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            text = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not all(needle in text for needle in needles):
                continue
            if wanted is not None and wanted not in (proc / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        found.append(text[:200])
    return found


def still_running(pid: int) -> bool:
    """Whether this pid is a process that still runs: there, and not a zombie waiting for its parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def own_state_dir() -> str:
    """The state dir conftest gave the running test."""
    return os.environ["QUANTEVAL_STATE_DIR"]


def wait_until(condition, timeout_s: float, what) -> float:
    """Seconds until condition() holds, polled every 0.5 s; what: a description, or a function giving one (the state
    at the deadline, not at the start)."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout_s, f"timed out after {timeout_s} s waiting for {what() if callable(what) else what}"
        time.sleep(0.5)
    return time.monotonic() - started
