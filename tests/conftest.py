"""Shared fixtures. Every test gets its own quanteval state directory and ledger, telemetry off."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from tiers import OWN_LANE, REPO, TIER_MARKERS, lane, user_env

os.environ["NEMO_EVALUATOR_TELEMETRY_LEVEL"] = "0"

# The tier a fixture puts its tests in (tests/tiers.py): using the cluster makes a test a SLURM test.
FIXTURE_MARKERS = {"slurm_cluster": "slurm"}

# Seconds each group took in a full run (scripts/test: 4 workers on 2 cores, a fresh machine, 2026-11-29), those over 50:
# xdist hands out the longest first (pytest_collection_modifyitems), so no long group starts near the end and runs on
# alone while the other workers idle (test_mcp_long_calls.py, 276 s but ordered by its 5 tests, once ran on to the end).
# A worker is handed its next group before its current one's last two tests run (xdist), so short groups fill the end.
GROUP_SECONDS = {
    "vllm-cluster-faults": 814, "vllm-tiny-skills": 707, "slurm": 590, "vllm-cluster": 523, "vllm-evaluate": 473,
    "slurm-evaluate": 460, "test_nel_next.py": 415, "vllm-sampled": 343, "vllm-disconnect": 337, "slurm-nel-next": 333,
    "test_mcp_long_calls.py": 276, "test_runs.py": 272, "test_validation.py": 235, "vllm": 230,
    "test_evalserver_real_ns.py": 177, "test_skills_benchmarks.py": 170, "test_mcp_face.py": 117, "test_deploy.py": 110,
    "test_recipes.py": 107, "vllm-nel-next-managed": 106, "test_sample_status.py": 91, "test_confine.py": 89,
    "test_prerequisites.py": 80, "test_skillpack.py": 80, "test_frameworks.py": 76, "test_e2e_chain.py": 63,
    "test_gate.py": 57, "test_evalserver.py": 55, "test_convert.py": 55,
}

# `slurm_cluster`: real sshd + single-node SLURM on 127.0.0.1 for the session (tests/infra/slurm_cluster.py).
pytest_plugins = ["infra.slurm_cluster"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help=f"only the fast tier: deselect what tests/tiers.py marks heavy ({', '.join(TIER_MARKERS)})")


def pytest_configure(config: pytest.Config) -> None:
    for marker, meaning in TIER_MARKERS.items():
        config.addinivalue_line("markers", f"{marker}: {meaning}")
    config.addinivalue_line("markers", f"{OWN_LANE}(name): the xdist group of a vLLM module with checkpoints of its own")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Tier markers from the fixtures a test uses, and its xdist group: its lane when a heavy marker gives it one,
    else its module (module-scoped fixtures are then built once). Here, not in modifyitems: xdist reads the groups there."""
    for fixture, marker in FIXTURE_MARKERS.items():
        if fixture in getattr(item, "fixturenames", ()):
            item.add_marker(marker)
    item.add_marker(pytest.mark.xdist_group(lane(item) or item.path.name))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The queue xdist hands out (scripts/test: --no-loadscope-reorder): the groups a full run measured, longest first
    (GROUP_SECONDS), then the other groups with heavy tests, then the rest, largest first. With --fast, the heavy tiers
    are deselected."""
    def group(item: pytest.Item) -> str:  # the one pytest_itemcollected gave it
        return item.get_closest_marker("xdist_group").args[0]

    sizes = Counter(map(group, items))
    heavy = [item for item in items if any(item.get_closest_marker(marker) for marker in TIER_MARKERS)]
    # Long work first, short work fills the end: a group with heavy tests (long waits on clients, nel-next and ns
    # runs) queued last would run on alone while the other workers idle.
    heavy_groups = {group(item) for item in heavy}
    items.sort(key=lambda item: (-GROUP_SECONDS.get(group(item), 0), group(item) not in heavy_groups, -sizes[group(item)]))
    if not config.getoption("--fast"):
        return
    if heavy:
        config.hook.pytest_deselected(items=heavy)
        dropped = set(heavy)
        items[:] = [item for item in items if item not in dropped]


def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the whole run (xdist's workers share their base's parent), new each run: a test's processes reuse
    what another's made (a framework's check of the same server arguments on the same checkpoint, NEL's facts), as
    one user's do."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "cache"


@pytest.fixture(autouse=True)
def isolated_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("QUANTEVAL_STATE_DIR", str(state))
    monkeypatch.setenv("QUANTEVAL_CACHE_DIR", str(_session_cache(tmp_path_factory)))
    monkeypatch.setenv("QUANTEVAL_LEDGER", str(state / "ledger.sqlite3"))
    monkeypatch.setenv("NEMO_EVALUATOR_TELEMETRY_LEVEL", "0")
    return state


@pytest.fixture(scope="session")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`nel eval run` of tiny_add (40 problems) against the stand-in: the nel-next run every variant is made from
    (tests/next_runs.py), once per session (per xdist worker)."""
    from next_runs import real_nel_run

    return real_nel_run(tmp_path_factory.mktemp("nel-run") / "run", 40)


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def cli_env() -> dict[str, str]:
    """Environment for running the installed console scripts as a user would."""
    return user_env()
