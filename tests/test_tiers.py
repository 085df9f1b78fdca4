"""The tiers a developer relies on: `--fast` runs exactly the tests no heavy marker names, a fixture puts its tests in
their tier, and a missing component skips with the command that brings it."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import tiers
from tiers import REPO, TIER_MARKERS, requires


def collected(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


@pytest.mark.slow
def test_fast_runs_every_test_no_heavy_marker_names_and_only_those():
    with ThreadPoolExecutor() as pool:  # three collections of the whole suite, side by side
        everything, fast, heavy = pool.map(lambda args: collected(*args), [(), ("--fast",), ("-m", " or ".join(TIER_MARKERS))])
    assert fast and heavy and fast | heavy == everything and not fast & heavy
    assert not any("test_mcp_long_calls.py" in test or "test_evaluate_real.py" in test for test in fast)
    # the SLURM cluster's users are heavy by the fixture alone (test_runs_slurm.py names no marker)
    assert any("test_runs_slurm.py" in test for test in collected("-m", "slurm"))


def test_a_missing_component_skips_naming_the_command_that_brings_it(monkeypatch, tmp_path):
    monkeypatch.setattr(tiers, "VLLM_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    marks = requires("vllm", "slow")
    assert {mark.name for mark in marks} == {"vllm", "slow", "skip"}
    (skip,) = [mark for mark in marks if mark.name == "skip"]
    assert skip.kwargs["reason"] == "no vLLM venv: bash scripts/setup builds .venv-vllm"
    with pytest.raises(ValueError, match="unknown need 'vlm'"):
        requires("vlm")


def test_each_group_the_queue_orders_by_its_seconds_is_a_group_of_the_suite():
    """conftest.GROUP_SECONDS orders xdist's queue by group name: a lane renamed or a module moved would silently fall
    back to the unmeasured order, a long group then queued last."""
    import re

    import conftest

    sources = "\n".join(path.read_text() for path in (REPO / "tests").glob("test_*.py"))
    own_lanes = set(re.findall(r'own_lane\("([\w-]+)"\)', sources)) | set(re.findall(r'_LANE = "([\w-]+)"', sources))
    groups = own_lanes | set(tiers.LANES) | {path.name for path in (REPO / "tests").glob("test_*.py")}
    assert set(conftest.GROUP_SECONDS) <= groups, set(conftest.GROUP_SECONDS) - groups


def test_the_suite_runs_on_the_versions_quanteval_pins():
    """setup --dev adds SGLang's parser and its imports to .venv after quanteval: on a fresh machine pip's newest
    openai (anyio>=4.10) replaced the anyio==4.9.0 quanteval pins for NEL's leptonai, and the suite ran on another
    anyio than users get. Each exact pin of quanteval's is what .venv holds."""
    from importlib import metadata

    from packaging.requirements import Requirement

    pinned = [Requirement(line) for line in metadata.requires("quanteval") or []]
    exact = {req.name: spec.version for req in pinned for spec in req.specifier
             if spec.operator == "==" and (req.marker is None or req.marker.evaluate({"extra": "dev"}))}
    assert "anyio" in exact
    assert {name: metadata.version(name) for name in exact} == exact
