"""What is still running: the tests' check that servers and runs were stopped, leaving no process behind."""

from __future__ import annotations

from pathlib import Path


def running_with(*needles: str) -> list[str]:
    """Command lines (first 200 characters) of live processes whose command line contains every needle."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(needle in text for needle in needles):
            found.append(text[:200])
    return found
