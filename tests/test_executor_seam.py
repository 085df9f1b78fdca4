"""Where a run executes, as the tools ask it through clusters/executor.py instead of comparing names.

SLURM is the only executor whose paths and jobs are on another machine's side of an SSH connection; the local
executor runs here; anything else a config or record names (nel-next's docker cluster, NEL's lepton) is left to its
engine, as the tools treated it before the seam: neither read over SSH nor rendered as an sbatch job.
"""

from __future__ import annotations

import re
from pathlib import Path

from quanteval import ledger
from quanteval.clusters import executor as executors
from quanteval.engines.nel import runtree as results
from quanteval.engines.nel_next import runs as next_runs


def test_executors_by_name():
    assert executors.for_name(None) is executors.LOCAL and executors.for_name("local").on_this_machine
    assert executors.slurm("slurm") is executors.SLURM and not executors.SLURM.on_this_machine
    lepton = executors.for_name("lepton")
    assert lepton.name == "lepton" and executors.slurm("lepton") is None
    assert executors.is_this_machine(None) and executors.is_this_machine("local") and not executors.is_this_machine("dlcluster")


def test_a_nel_next_docker_cluster_is_not_submitted_to_slurm():
    assert next_runs._on_cluster({"cluster": "slurm"})
    assert not next_runs._on_cluster({"cluster": "docker"})
    assert not next_runs._on_cluster({"cluster": "local"})


def test_only_a_slurm_records_results_are_read_over_ssh():
    lepton = ledger.add("full_run", status="succeeded", executor="lepton", host="lepton-workspace",
                        details={"output_dir": "/results/run"})
    slurm = ledger.add("full_run", status="succeeded", executor="slurm", host="dlcluster",
                       details={"output_dir": "/lustre/run"})
    assert results._output_dir_from_ledger(lepton.id) == "/results/run"
    assert results._output_dir_from_ledger(slurm.id) == "dlcluster:/lustre/run"


# Where code outside clusters/ still asks which executor it has (issue 39's count), file by file. Each is a
# decision the executor should make behind its verbs; the test fails on a new one, and on one removed without
# lowering its count here.
DECISIONS_LEFT = {
    "engines/nel/apply.py": 1, "engines/nel/nelexec.py": 2, "engines/nel/rules.py": 3, "engines/nel/runs.py": 7,
    "engines/nel/runtree.py": 1, "engines/nel_next/config.py": 4, "engines/nel_next/convert.py": 1,
    "engines/nel_next/nelnext.py": 5, "engines/nel_next/runs.py": 2, "workflow/confine.py": 2,
    "workflow/evaluate.py": 1, "workflow/placement.py": 1, "workflow/plan.py": 2, "workflow/runs.py": 1,
}
DECISION = re.compile(r"executors\.slurm\(|on_this_machine|is_this_machine|[!=]= \"(slurm|local)\"|in \(\"slurm\"|\"slurm\" in ")


def test_executor_decisions_outside_clusters_only_shrink():
    package = Path(executors.__file__).parents[1]
    found = {}
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith("clusters/"):
            continue
        if count := sum(1 for line in path.read_text().splitlines() if DECISION.search(line)):
            found[relative] = count
    assert found == DECISIONS_LEFT
