"""What a test needs and which tier it runs in, said once.

`requires(...)` gives a test (or a module, as `pytestmark`) a skip that names how to get each missing component, and
the tier markers: `vllm` (starts a real vLLM), `slurm` (the real sshd + SLURM cluster), `npm` (the npm MCP clients),
`setup` (runs the setup scripts), `slow` (anything else that takes tens of seconds). conftest adds the same markers
from the fixtures a test uses (`slurm_cluster`, the shared vLLM servers), so a test cannot forget them.

`bash scripts/test --fast` (pytest's `--fast`, conftest) runs what none of these mark; the full suite runs everything
with pytest-xdist on twice as many workers as cores, each heavy marker in a lane of its own (LANES): the SLURM tests
share a worker and its cluster (each worker that needs one starts its own; the two largest SLURM modules take lanes
of their own), one lane starts the tiny-add vLLM servers one at a time (the tests that check "no vLLM left running"
would see another test's server otherwise); modules that check only their own servers take vLLM lanes of their own.
"""

from __future__ import annotations

import os
import sys
from functools import cache
from pathlib import Path
from typing import TypeVar

import pytest

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
CHECKPOINTS = REPO / "examples" / "checkpoints"
BENCH = REPO / "examples" / "benchmarks" / "tiny_add.py"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
NEL_NEXT = REPO / ".venv-nel-next" / "bin" / "nel"
NS_VENV = Path(os.environ.get("QUANTEVAL_NS_VENV") or REPO / ".venv-nemo-skills")
MCP_CLIENTS = REPO / "tests" / "mcp_clients"
# The project's Node 22 (node-linux-* from the npm registry; the system's node may be older), the clients that run on it
NODE = MCP_CLIENTS / "node_modules" / ".bin" / "node"
INSPECTOR = MCP_CLIENTS / "node_modules" / ".bin" / "mcp-inspector"
CONFORMANCE = MCP_CLIENTS / "node_modules" / ".bin" / "conformance"
F = TypeVar("F")

TIER_MARKERS = {
    "vllm": "starts a real vLLM server (CPU build)",
    "slurm": "uses the real sshd + SLURM cluster on 127.0.0.1",
    "npm": "drives the npm MCP clients (Inspector, TypeScript SDK, conformance suite) with the project's Node 22",
    "setup": "runs the setup scripts",
    "slow": "takes tens of seconds for another reason (real nel-next runs, ns eval, long waits)",
}
# xdist lanes (--dist loadgroup): a test with one of these markers runs on the lane's one worker, in this order of
# precedence (a test that needs vLLM and SLURM runs in the vLLM lane, which then starts a cluster of its own).
LANES = ("vllm", "slurm")
# A module whose "nothing left running" checks name only its own servers (checkpoints no other vLLM test serves, or
# servers started under its own state dir) may take a vLLM lane of its own:
# `pytestmark = [*requires("vllm"), own_lane("vllm-tiny-skills")]`.
OWN_LANE = "lane"


@cache
def _nel_next_has_nemo_skills() -> bool:
    return NEL_NEXT.is_file() and any((NEL_NEXT.parent.parent / "lib").glob("python3.*/site-packages/nemo_skills/__init__.py"))


def _missing(need: str) -> str | None:
    """Why `need` is not here (with the command that brings it), or None when it is."""
    if need in ("vllm", "vllm-venv"):  # vllm: a test that starts a server; vllm-venv: one that only reads the venv
        return None if VLLM_PYTHON.is_file() else "no vLLM venv: bash scripts/setup builds .venv-vllm"
    if need == "nel-next":
        return None if NEL_NEXT.is_file() else "no nel-next venv: bash scripts/setup builds .venv-nel-next"
    if need == "nemo-skills":
        return None if (NS_VENV / "bin" / "ns").is_file() else "no NeMo-Skills venv: bash scripts/setup --dev builds .venv-nemo-skills"
    if need == "skills-in-nel-next":
        return None if _nel_next_has_nemo_skills() else ("nel-next's venv has no NeMo-Skills: bash scripts/setup-nel-next "
                                                         "installs the vendored 467b057 (../shared/vendor)")
    if need == "npm":
        return None if all(path.exists() for path in (NODE, INSPECTOR, CONFORMANCE)) else (
            "needs npm's Node 22 and the MCP clients in tests/mcp_clients: bash scripts/setup --dev installs them "
            "(npm ci there, with npm on the PATH)")
    if need in ("slurm", "setup", "slow"):
        return None  # markers only: the cluster fixture says itself what it lacks
    raise ValueError(f"unknown need {need!r}")


class Marks(list):
    """Marks that serve as a module's `pytestmark` and as one decorator of a test function."""

    def __call__(self, test: F) -> F:
        for mark in self:
            test = mark(test)
        return test


def requires(*needs: str) -> Marks:
    """The marks of a test that needs these: a skip naming each missing component and how to get it, and the tier
    markers (vllm, slurm, npm, setup, slow) its needs imply."""
    missing = [why for need in needs if (why := _missing(need))]
    marks = Marks(getattr(pytest.mark, need) for need in needs if need in TIER_MARKERS)
    if missing:
        marks.append(pytest.mark.skip(reason="; ".join(missing)))
    return marks


def own_lane(name: str) -> pytest.MarkDecorator:
    return getattr(pytest.mark, OWN_LANE)(name)


def lane(item: pytest.Item) -> str | None:
    """The xdist group of a test, if it must share a worker with others: its own lane, else its heavy marker's."""
    if (own := item.get_closest_marker(OWN_LANE)) is not None:
        return own.args[0]
    markers = {mark.name for mark in item.iter_markers()}
    return next((name for name in LANES if name in markers), None)


def user_env(**overrides: str) -> dict[str, str]:
    """The environment a user's shell gives quanteval's console scripts: this environment, .venv/bin first on PATH,
    telemetry off, and vLLM started by its own launcher (no test's stand-in)."""
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", NEMO_EVALUATOR_TELEMETRY_LEVEL="0")
    env.pop("QUANTEVAL_VLLM_LAUNCHER", None)
    return env | overrides
