"""The SLURM command builders of quanteval.clusters.slurm that need no cluster: what they send, and what they read
back from a local bash (the host `local`)."""

from __future__ import annotations

import pytest

from quanteval.clusters import slurm, ssh
from quanteval.models import ToolError


def test_job_chains_reads_every_chain_file_in_one_round_trip(tmp_path):
    first, second = tmp_path / "one" / ".nel_job_chain", tmp_path / "two words" / ".slurm_job_id.list"
    first.parent.mkdir()
    second.parent.mkdir()
    first.write_text("100\n101\n")
    second.write_text("200 201\n\n202\n")
    chains = slurm.job_chains(ssh.LOCAL, {"a.0": str(first), "b.0": str(second), "c.0": str(tmp_path / "missing")})
    assert chains == {"a.0": ["100", "101"], "b.0": ["200", "201", "202"], "c.0": []}


def test_cancel_chain_cancels_the_chain_and_its_afternotok_successors(monkeypatch):
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(slurm, "run_remote", lambda host, command, timeout: sent.append((host, command)))
    slurm.cancel_chain("alice@login", "alice", "/runs/x y/.nel_job_chain", "1234")
    ids = "$( (cat '/runs/x y/.nel_job_chain' 2>/dev/null; echo 1234) | sort -u)"
    # squeue %E names a dependency as afternotok:ID(state): the "(" keeps job 3's pattern off job 31's successors
    successors = f"$(squeue -h -u alice -o '%i %E' | grep -E \"afternotok:($(echo {ids} | tr ' ' '|'))\\(\" | cut -d' ' -f1)"
    assert sent == [("alice@login", f"scancel {ids} {successors}")]
    sent.clear()
    slurm.cancel_successors("alice@login", "alice", ["3", "31"])  # what can never start behind completed jobs, only
    assert sent == [("alice@login", "scancel $(squeue -h -u alice -o '%i %E' | grep -E \"afternotok:(3|31)\\(\" | "
                                    "cut -d' ' -f1) 2>/dev/null; true")]
    with pytest.raises(ToolError, match="not SLURM job ids"):
        slurm.cancel_chain("alice@login", "alice", "/runs/.nel_job_chain", "1234; rm -rf ~")


def test_one_node_script_writes_the_header_then_the_environment_then_the_commands():
    script = slurm.one_node_script("quanteval-d1", "04:00:00", ["echo start", "exec serve --port 8000"],
                                   output="server.log", gpus_per_node=2, account="acct", env={"HF_HUB_OFFLINE": "1"})
    assert script == ("#!/bin/bash\n#SBATCH --job-name=quanteval-d1\n#SBATCH --output=server.log\n#SBATCH --nodes=1\n"
                      "#SBATCH --ntasks=1\n#SBATCH --time=04:00:00\n#SBATCH --gpus-per-node=2\n#SBATCH --account=acct\n"
                      "export HF_HUB_OFFLINE=1\necho start\nexec serve --port 8000\n")
    assert "--gpus-per-node" not in slurm.one_node_script("j", "1:00", ["true"], output="o.log")
