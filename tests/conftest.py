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

# The lanes first, the longest first (seconds in a full run on CI's 2 cores, 2026-11-28): SLURM's (~900, mostly
# waiting on the cluster), the cluster evaluations' and their faults' (~900 each: vLLM inside SLURM jobs), the tiny-add
# vLLM lane's and the one-call evaluations' (~700 each), tiny-skills' against ns eval (~650), its verdict's and its
# sampled repeats' (~500 each), the disconnect-per-phase test's (~350); the other groups after them.
FIRST_LANES = {name: order for order, name in enumerate((  # the longest first (a full run's lane sums, loaded)
    "vllm-cluster", "vllm-tiny-skills", "vllm-cluster-faults", "slurm-evaluate", "slurm-nel-next", "slurm", "vllm",
    "vllm-evaluate", "vllm-skills-verdict", "vllm-sampled", "vllm-disconnect"))}

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
    """The queue xdist hands out (scripts/test: --no-loadscope-reorder): the lanes first, each on a worker of its own
    as workers come free (the longest work), then the groups with heavy tests, then the rest, largest first. With --fast,
    the heavy tiers are deselected."""
    def group(item: pytest.Item) -> str:  # the one pytest_itemcollected gave it
        return item.get_closest_marker("xdist_group").args[0]

    sizes = Counter(map(group, items))
    heavy = [item for item in items if any(item.get_closest_marker(marker) for marker in TIER_MARKERS)]
    # Long work first, short work fills the end: a group with heavy tests (long waits on clients, nel-next and ns
    # runs) queued last would run on alone while the other workers idle.
    heavy_groups = {group(item) for item in heavy}
    items.sort(key=lambda item: (FIRST_LANES.get(group(item), len(FIRST_LANES)), group(item) not in heavy_groups,
                                 -sizes[group(item)]))
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
