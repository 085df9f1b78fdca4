"""Timing helper shared by the benchmark scripts (run them from the repo root with .venv/bin/python)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], repeats: int = 3) -> float:
    """Median wall time of `repeats` calls of fn."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)
