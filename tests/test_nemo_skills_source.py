"""Where setup gets NeMo-Skills (scripts/nemo-skills-source.sh, used by setup-nel-next and setup-nemo-skills): the
user's variable, else the project's vendored tarball, else the pinned commit from GitHub; and when none installs,
one line that says what to set, and setup goes on without it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tiers import REPO

from quanteval.engines import nemo_skills_source


def _bash(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if not key.endswith("_SKILLS_SRC")}
    environment |= {"QUANTEVAL_SETUP_LOG": str(tmp_path / "setup.log"), **env}
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source scripts/progress.sh; "
                                         f"source scripts/nemo-skills-source.sh; {script}"],
                          cwd=REPO, env=environment, capture_output=True, text=True, timeout=120, check=False)


def test_the_source_is_the_variable_else_the_vendored_tarball_else_the_pinned_upstream_commit(tmp_path: Path) -> None:
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    ask = "nemo_skills_source QUANTEVAL_NEL_NEXT_SKILLS_SRC"

    assert _bash(ask, tmp_path, QUANTEVAL_VENDOR_DIR=str(vendor)).stdout.strip() == nemo_skills_source.NEMO_SKILLS_UPSTREAM
    tarball = vendor / f"nemo-skills-{nemo_skills_source.NEMO_SKILLS_COMMIT}.tar.gz"
    tarball.write_bytes(b"")
    assert _bash(ask, tmp_path, QUANTEVAL_VENDOR_DIR=str(vendor)).stdout.strip() == str(tarball)
    mine = "git+https://example.org/my/Skills@abc1234"
    assert _bash(ask, tmp_path, QUANTEVAL_VENDOR_DIR=str(vendor), QUANTEVAL_NEL_NEXT_SKILLS_SRC=mine).stdout.strip() == mine


def test_a_source_that_cannot_be_had_is_one_line_naming_what_to_set(tmp_path: Path) -> None:
    """A git URL with no network to its host (here a name that never resolves) and a path that does not exist."""
    pip = REPO / ".venv" / "bin" / "pip"
    unreachable = "git+https://github.invalid/NVIDIA-NeMo/Skills@467b057"
    done = _bash(f"install_nemo_skills {pip} {unreachable} QUANTEVAL_NEL_NEXT_SKILLS_SRC || echo refused", tmp_path)
    assert done.stdout.strip() == "refused", done.stderr
    lines = done.stderr.strip().splitlines()
    assert "installing" in lines[0] and len(lines) == 2, lines
    assert "could not install " + unreachable in lines[1] and "set QUANTEVAL_NEL_NEXT_SKILLS_SRC" in lines[1], lines[1]
    assert "github.invalid" in (tmp_path / "setup.log").read_text()  # pip's own words are kept, in the log

    done = _bash(f"install_nemo_skills {pip} {tmp_path}/nowhere.tar.gz QUANTEVAL_NEMO_SKILLS_SRC || echo refused", tmp_path)
    assert done.stdout.strip() == "refused"
    assert done.stderr.count("\n") == 1 and "QUANTEVAL_NEMO_SKILLS_SRC=" in done.stderr and "neither a path" in done.stderr


def test_setup_without_the_tarball_installs_the_pinned_commit_from_github(tmp_path: Path) -> None:
    done = subprocess.run(["bash", "scripts/setup-nel-next"], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if not k.endswith("_SKILLS_SRC")},
                               "QUANTEVAL_SETUP_DRY_RUN": "1", "QUANTEVAL_VENDOR_DIR": str(tmp_path),
                               "QUANTEVAL_SETUP_LOG": str(tmp_path / "setup.log")}, check=False)
    assert done.returncode == 0, done.stderr
    assert f"install --no-deps {nemo_skills_source.NEMO_SKILLS_UPSTREAM}" in done.stderr, done.stderr


def test_setup_keys_an_installed_tarball_by_its_content_not_its_date(tmp_path: Path) -> None:
    """The vendored tarball is copied afresh onto each machine: the same bytes under a new date must leave setup's stamps
    (setup-nel-next, setup-nemo-skills) standing, or every first run reinstalls NeMo-Skills in both venvs (~35 s)."""
    first, again, other = (tmp_path / name for name in ("first.tar.gz", "again.tar.gz", "other.tar.gz"))
    first.write_bytes(b"467b057")
    again.write_bytes(b"467b057")
    other.write_bytes(b"8b18f39")
    os.utime(again, (1_000_000_000, 1_000_000_000))

    def fingerprint(path: Path) -> str:
        done = _bash(f"nemo_skills_fingerprint {path}", tmp_path)
        assert done.returncode == 0 and done.stdout.strip(), done.stderr
        return done.stdout

    assert fingerprint(first) == fingerprint(again) != fingerprint(other)
    for script in ("setup-nel-next", "setup-nemo-skills"):
        assert "nemo_skills_fingerprint" in (REPO / "scripts" / script).read_text(), script
