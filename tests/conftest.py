"""Shared fixtures. Every test gets its own quanteval state directory and ledger, telemetry off."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

os.environ["NEMO_EVALUATOR_TELEMETRY_LEVEL"] = "0"

# `slurm_cluster`: real sshd + single-node SLURM on 127.0.0.1 for the session (tests/infra/slurm_cluster.py).
pytest_plugins = ["infra.slurm_cluster"]


@pytest.fixture(autouse=True)
def isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("QUANTEVAL_STATE_DIR", str(state))
    monkeypatch.setenv("QUANTEVAL_LEDGER", str(state / "ledger.sqlite3"))
    monkeypatch.setenv("NEMO_EVALUATOR_TELEMETRY_LEVEL", "0")
    return state


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def cli_env() -> dict[str, str]:
    """Environment for running the installed console scripts as a user would."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    return env
