"""The test cluster itself: what the other tests (and NEL's SLURM executor) rely on it doing."""

from __future__ import annotations

import re
import subprocess
import time

from infra.slurm_cluster import SlurmCluster


def ssh(cluster: SlurmCluster, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Plain `ssh <alias> <command>` the way NEL runs it: found on PATH, no options of ours."""
    return subprocess.run(
        ["ssh", f"{cluster.user}@{cluster.ssh_alias}", command],
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError("condition not met in time")


def test_openssh_reaches_the_cluster_through_the_alias_with_strict_host_key_checking(slurm_cluster):
    done = ssh(slurm_cluster, "echo $SLURM_CONF; sinfo -h -n localhost -p debug -o %T")
    assert done.returncode == 0, done.stderr
    conf, state = done.stdout.split()
    assert conf == str(slurm_cluster.slurm_conf)
    assert state in {"idle", "mixed", "allocated"}


def test_the_cluster_has_typed_gpus_a_job_can_get_and_a_blackwell_partition_without_nodes(slurm_cluster):
    """GRES gpu:h100:8 on the real node (devices are /dev/null stand-ins), gpu:b200:8 on a node with no slurmd."""
    gres = slurm_cluster.run("sinfo -h -o '%P|%G'").stdout.split()
    assert sorted(gres) == ["blackwell|gpu:b200:8", "debug*|gpu:h100:8", "hopper|gpu:h100:8"]
    out = slurm_cluster.jobs_dir / "gpu-%j.out"
    done = slurm_cluster.run(f"sbatch --parsable -p hopper --gres=gpu:h100:2 -o {out} --wrap 'echo $CUDA_VISIBLE_DEVICES'")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    wait_for(lambda: (slurm_cluster.jobs_dir / f"gpu-{job_id}.out").is_file()
             and (slurm_cluster.jobs_dir / f"gpu-{job_id}.out").read_text().strip() != "")
    assert (slurm_cluster.jobs_dir / f"gpu-{job_id}.out").read_text().strip() == "0,1"
    too_many = slurm_cluster.run("sbatch --test-only -p hopper --gres=gpu:9 --wrap true")
    assert too_many.returncode != 0 and "Requested node configuration is not available" in too_many.stderr


def test_sbatch_over_ssh_then_squeue_shows_it_and_sacct_c_reports_it_finished(slurm_cluster):
    out = slurm_cluster.jobs_dir / "infra-%j.out"
    done = ssh(slurm_cluster, f"sbatch --parsable -o {out} --wrap 'echo hello-from-slurm'")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert job_id.isdigit()

    def finished() -> bool:
        return f"{job_id}|COMPLETED" in slurm_cluster.run("squeue -h -t all -o '%i|%T'").stdout

    wait_for(finished)
    assert (slurm_cluster.jobs_dir / f"infra-{job_id}.out").read_text().strip() == "hello-from-slurm"
    wait_for(lambda: re.search(rf"^{job_id}\s.*COMPLETED", slurm_cluster.run("sacct -c -n").stdout, re.M) is not None)
    # Without slurmdbd plain sacct fails: the tools must fall back to `sacct -c`.
    assert slurm_cluster.run("sacct -n").returncode != 0


def test_rsync_uses_the_alias_like_nels_upload(slurm_cluster, tmp_path):
    source = tmp_path / "rundir"
    source.mkdir()
    (source / "run.sub").write_text("#!/bin/bash\necho hi\n")
    target = slurm_cluster.jobs_dir / "rsync-target"
    done = subprocess.run(
        ["rsync", "-qcaz", str(source), f"{slurm_cluster.user}@{slurm_cluster.ssh_alias}:{target}"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (target / "rundir" / "run.sub").read_text() == "#!/bin/bash\necho hi\n"


def test_nel_ssh_utils_open_a_master_connection_and_run_commands(slurm_cluster):
    from nemo_evaluator_launcher.common.ssh_utils import master_connection, run_remote_command

    with master_connection(slurm_cluster.user, slurm_cluster.ssh_alias) as control_socket:
        out = run_remote_command("squeue -h -o %i | wc -l", slurm_cluster.user, slurm_cluster.ssh_alias, control_socket)
    assert out.strip().isdigit()


def test_slurmctld_restart_keeps_submitted_jobs(slurm_cluster):
    job_id = slurm_cluster.run("sbatch --parsable -o /dev/null --wrap 'sleep 60'").stdout.strip()
    assert job_id.isdigit()
    slurm_cluster.stop("slurmctld")
    assert slurm_cluster.run("squeue -h", timeout=60).returncode != 0
    slurm_cluster.up()
    assert job_id in slurm_cluster.run("squeue -h -o %i").stdout
    slurm_cluster.run(f"scancel {job_id}")


def test_setup_is_fast_once_the_packages_are_installed(slurm_cluster):
    # Recorded for the closing note; generous bound for a 2-core CI machine.
    assert slurm_cluster.setup_seconds < 60
