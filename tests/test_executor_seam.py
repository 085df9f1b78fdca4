"""Where a run executes, as the tools ask it through clusters/executor.py instead of comparing names.

SLURM is the only executor whose paths and jobs are on another machine's side of an SSH connection; the local
executor runs here; an executor an engine runs itself (nel-next's docker cluster, NEL's lepton) is left to its engine:
neither read over SSH nor rendered as an sbatch job; any other name is refused.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from quanteval import ledger
from quanteval.clusters import executor as executors
from quanteval.clusters import ssh
from quanteval.engines.nel import runtree as results
from quanteval.engines.nel_next import clustertypes
from quanteval.models import ToolError


def test_executors_by_name():
    assert executors.for_name(None) is executors.LOCAL and executors.for_name("slurm") is executors.SLURM
    lepton = executors.for_name("lepton")
    assert lepton.name == "lepton" and isinstance(lepton, executors.EngineManagedExecutor)
    assert executors.LOCAL.poll_interval_s < lepton.poll_interval_s == executors.SLURM.poll_interval_s  # list_runs asks only here
    assert ssh.names_this_machine(None) and ssh.names_this_machine("local") and not ssh.names_this_machine("dlcluster")


def test_an_unknown_executor_is_refused_with_the_known_ones():
    """A typo must not run as another executor (it used to become an engine-managed one, watched by nobody); a record
    or config without a name ran here."""
    with pytest.raises(ToolError, match="unknown executor 'slrum': the known ones are slurm, local, lepton, docker"):
        executors.for_name("slrum")
    assert executors.for_name(None) is executors.for_name("") is executors.UNNAMED is executors.LOCAL
    assert executors.for_name("docker").name == "docker"  # nel-next's, run by nel-next itself


def test_the_known_executors_are_the_engines_own():
    """The names quanteval knows are those NEL 0.2.6 (its execution config groups) and nel-next (its executor registry)
    register, read from the installed packages."""
    import nemo_evaluator_launcher

    nel = {path.name.removesuffix(".yaml") for path in (Path(nemo_evaluator_launcher.__file__).parent / "configs" / "execution").iterdir()}
    registry = next(Path(__file__).parents[1].glob(".venv-nel-next/lib/python3*/site-packages/nemo_evaluator/executors/__init__.py"))
    nel_next = set(re.findall(r'_REGISTRY\["(\w+)"\] =', registry.read_text()))
    assert nel == {"local", "slurm", "lepton"} and nel_next == {"local", "slurm", "docker"}
    assert set(executors.KNOWN) == nel | nel_next


def test_nel_nexts_cluster_types_name_their_executor_and_docker_is_not_launched():
    """nel-next's cluster types are its own vocabulary: local runs here, slurm submits itself (the SLURM executor adopts
    its jobs), docker is not launched by quanteval (no row: refused by name, not run as a local job)."""
    slurm = clustertypes.of({"type": "slurm", "hostname": "login"})
    assert slurm.submits and slurm.executor is executors.SLURM and slurm.binaries == ("ssh", "scp")
    assert clustertypes.of("local").executor is executors.LOCAL and not clustertypes.of("local").submits
    assert clustertypes.of(None) is clustertypes.LOCAL  # nel-next's default cluster
    assert clustertypes.of({"type": "docker"}) is None and "docker" in clustertypes.refusal("docker")
    section = slurm.cluster_section()
    section["node_pools"]["default"]["partition"] = "debug"  # a config's copy, never the table's
    assert clustertypes.SLURM.section["node_pools"]["default"]["partition"] == "???"


def test_only_a_slurm_records_results_are_read_over_ssh():
    lepton = ledger.add("full_run", status="succeeded", executor="lepton", host="lepton-workspace",
                        details={"output_dir": "/results/run"})
    slurm = ledger.add("full_run", status="succeeded", executor="slurm", host="dlcluster",
                       details={"output_dir": "/lustre/run"})
    assert results._output_dir_from_ledger(lepton.id) == "/results/run"
    assert results._output_dir_from_ledger(slurm.id) == "dlcluster:/lustre/run"


# Where code outside clusters/ still asks which executor it has, file by file (none now). Each is a
# decision the executor should make behind its verbs; the test fails on a new one, and on one removed without
# lowering its count here.
DECISIONS_LEFT: dict[str, int] = {}
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


# ---- the verbs engines call instead of asking which executor a run has


def _never_read():
    raise AssertionError("an executor without paths here (or without the extra) read the pairs it was given")
    yield  # a generator: its body runs only when it is read


def test_where_a_runs_files_lie_is_the_executors_answer(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lepton = executors.for_name("lepton")
    assert executors.LOCAL.local_path("out") == tmp_path / "out"
    assert executors.SLURM.local_path("/lustre/out") is None and lepton.local_path("/results") is None
    # paths here, made absolute; a pair without a value is no path; elsewhere, none, and the pairs are never read
    assert executors.LOCAL.local_paths(iter([("config_path", "a.yaml"), ("invocation_dir", None)])) == [
        ("config_path", tmp_path / "a.yaml")]
    assert executors.SLURM.local_paths(_never_read()) == [] and lepton.local_paths(_never_read()) == []
    assert executors.SLURM.results_location("dlcluster", "/lustre/run") == "dlcluster:/lustre/run"
    assert executors.SLURM.results_location(None, "/lustre/run") == "/lustre/run"
    assert executors.LOCAL.results_location("dlcluster", "/runs/x") == "/runs/x"
    assert lepton.results_location("lepton-workspace", "/results/run") == "/results/run"
    assert executors.LOCAL.resolve_output_dir("results") == str(tmp_path / "results")
    assert executors.SLURM.resolve_output_dir("results") == "results"  # a path on the cluster, as written


def test_what_an_executors_settings_need():
    slurm, local = executors.SLURM, executors.LOCAL
    assert slurm.on_cluster and not local.on_cluster and not executors.for_name("lepton").on_cluster  # apply_cluster asks
    why, fix = slurm.output_dir_problem("nel-results") or ("", "")
    assert "relative" in why and "absolute" in fix
    assert slurm.output_dir_problem("/lustre/nel-results") is None and local.output_dir_problem("nel-results") is None
    assert slurm.login_host({"hostname": "dlcluster"}) == "dlcluster" and slurm.login_host({}) is None
    assert local.login_host({"hostname": "dlcluster"}) is None
    assert slurm.gpus_per_node({"gres": "gpu:h100:4"}, "gpu:8") == 4 and slurm.gpus_per_node({}, "gpu:8") == 8
    assert slurm.gpus_per_node({"gpus_per_node": 2, "gres": "gpu:8"}, "gpu:8") == 2
    assert local.gpus_per_node({"gres": "gpu:4"}, "gpu:8") is None
    assert slurm.container_mount("/ckpt", "/checkpoint") == "/checkpoint" and slurm.container_mount(None, "/checkpoint") is None
    assert local.container_mount("/ckpt", "/checkpoint") is None


def test_nels_rules_ask_the_executor(tmp_path):
    from quanteval.engines.nel import rules

    def found(execution: dict) -> set[tuple[str, str]]:
        doc = {"execution": execution, "deployment": {"type": "none"}}
        return {(problem.rule, problem.severity) for problem in rules.validate_document(doc, tmp_path / "c.yaml", check_env=False)}

    on_slurm = found({"type": "slurm", "output_dir": "nel-results", "num_instances": 2, "num_nodes": 2})
    assert {("slurm_output_dir", "error"), ("slurm_hostname", "error"), ("slurm_account", "error")} <= on_slurm
    assert ("num_instances", "warning") not in on_slurm  # SLURM replicates deployments
    here = found({"type": "local", "output_dir": "nel-results", "num_instances": 2, "num_nodes": 2})
    assert not {rule for rule, _ in here} & {"slurm_output_dir", "slurm_hostname", "slurm_account"}
    assert ("num_instances", "warning") in here  # NEL's local executor starts one deployment
    assert ("wrong_type", "error") in found({"type": "local", "output_dir": ""})


def test_the_docker_daemon_is_asked_only_of_an_executor_that_runs_docker(monkeypatch):
    """What NEL's executors run here is NEL's fact, not the executor's: its local one runs docker (whose daemon it asks
    as a run starts), its SLURM one ssh and rsync, lepton nothing here."""
    from quanteval.engines.nel import nelexec, nelfacts

    monkeypatch.setattr(nelexec.shutil, "which", lambda name, *args, **kwargs: None)
    assert nelexec.docker_problem() == "the `docker` command is not installed"
    assert {name for name, programs in nelfacts.EXECUTOR_PROGRAMS.items() if "docker" in programs} == {"local"}
    assert nelfacts.EXECUTOR_PROGRAMS["slurm"] == ("ssh", "rsync") and "lepton" not in nelfacts.EXECUTOR_PROGRAMS


def test_a_cluster_adopts_an_engines_jobs_and_a_local_executor_does_not():
    recorded = {"hostname": "dlcluster", "username": "alice", "remote_dir": "/lustre/run/task0", "slurm_job_id": "42",
                "chain_file": ".slurm_job_id.list"}
    job = executors.SLURM.adopt("inv.0", recorded)
    assert isinstance(job, executors.ClusterJob) and job.login == "alice@dlcluster" and job.slurm_job_id == "42"
    assert executors.LOCAL.adopt("inv.0", recorded) is None and executors.for_name("lepton").adopt("inv.0", recorded) is None


def _cluster_job(job_id: str, slurm_job_id: str) -> executors.ClusterJob:
    return executors.ClusterJob(job_id=job_id, hostname="dlcluster", username="alice", remote_dir=f"/lustre/{job_id}",
                                slurm_job_id=slurm_job_id, chain_file=".chain")


def test_slurm_extras_and_their_no_ops(monkeypatch):
    commands: list[tuple[str, str]] = []
    monkeypatch.setattr(executors.SLURM, "run", lambda job, command, timeout=0: commands.append((job.job_id, command)) or "")
    executors.SLURM.protect_secrets([_cluster_job("a", "1"), _cluster_job("b", "2")])
    assert [(job_id, command.split()[:3]) for job_id, command in commands] == [
        ("a", ["chmod", "600", "/lustre/a/.secrets.env"]), ("b", ["chmod", "600", "/lustre/b/.secrets.env"])]

    states = [executors.JobStatus(job_id="a", status="resuming", current_slurm_job_id="11", restart_job_id="12"),
              executors.JobStatus(job_id="b", status="succeeded", current_slurm_job_id="21"),
              executors.JobStatus(job_id="c", status="running")]
    monkeypatch.setattr(executors.SLURM, "job_states", lambda jobs: states)
    cancelled: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(executors.SLURM, "scancel", lambda job, ids: cancelled.append((job.job_id, ids)))
    executors.SLURM.cancel_leftovers(iter([_cluster_job("a", "1"), _cluster_job("b", "2"), _cluster_job("c", "3")]))
    assert cancelled == [("a", ["11", "12"])]  # an active chain's current and restart jobs; an ended one is left

    for executor in (executors.LOCAL, executors.for_name("lepton")):  # no extras: the jobs are never read
        executor.protect_secrets(_never_read())
        executor.cancel_leftovers(_never_read())


def test_log_failures_here_and_on_a_cluster(tmp_path, monkeypatch):
    logs = tmp_path / "task0" / "logs"
    logs.mkdir(parents=True)
    (logs / "server.log").write_text("loading\ntorch.OutOfMemoryError: CUDA out of memory\ndone\n")
    local = executors.LocalJob(job_id="j", pgid=1, directory=str(logs), exit_file=str(logs / "exit"),
                               log_path=str(logs / "server.log"))
    tails, hits = executors.LOCAL.log_failures(local, 2, 10)
    assert tails == [(str(logs / "server.log"), ["torch.OutOfMemoryError: CUDA out of memory", "done"])]
    assert hits == [(str(logs / "server.log"), 2, "torch.OutOfMemoryError: CUDA out of memory")]

    # the cluster's grep runs over ssh; here the same shell runs on this machine
    monkeypatch.setattr(executors.SLURM, "run", lambda job, command, timeout=0: subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True).stdout)
    job = executors.ClusterJob(job_id="j", hostname="h", username="u", remote_dir=str(tmp_path / "task0"),
                               slurm_job_id="1", chain_file=".chain")
    assert executors.SLURM.log_failures(job, 2, 10) == (tails, hits)


def test_nels_own_jobs_are_answered_by_nels_api_and_a_clusters_by_its_executor(tmp_path, monkeypatch):
    from quanteval.engines.nel import runs as nel_runs

    task_dir = tmp_path / "inv" / "task0"
    (task_dir / "logs").mkdir(parents=True)
    (tmp_path / "inv" / "logs").mkdir()
    (task_dir / "logs" / "stage.log").write_text("RuntimeError: boom\n")
    (tmp_path / "inv" / "logs" / "run.log").write_text("started\n")
    local = ledger.add("canary", status="submitted", executor="local", invocation_id="inv")
    jobs = [{"job_id": "inv.0", "executor": "local", "data": {"output_dir": str(task_dir)}}]
    executor, handles = nel_runs._watch(local, jobs)
    assert isinstance(executor, nel_runs.NelApiExecutor) and executor.place is executors.LOCAL
    assert handles == [nel_runs.NelJob(job_id="inv.0", invocation_id="inv", output_dir=str(task_dir))]
    tails, hits = executor.log_failures(handles[0], 5, 10)
    assert [file for file, _ in tails] == [str(tmp_path / "inv" / "logs" / "run.log"), str(task_dir / "logs" / "stage.log")]
    assert hits == [(str(task_dir / "logs" / "stage.log"), 1, "RuntimeError: boom")]

    slurm = ledger.add("canary", status="submitted", executor="slurm", host="dlcluster", invocation_id="inv2")
    slurm_jobs = [{"job_id": "inv2.0", "executor": "slurm", "data": {
        "hostname": "dlcluster", "username": "alice", "remote_rundir_path": "/lustre/inv2/task0", "slurm_job_id": 7}}]
    executor, handles = nel_runs._watch(slurm, slurm_jobs)
    assert executor is executors.SLURM
    assert handles == [executors.ClusterJob(job_id="inv2.0", hostname="dlcluster", username="alice",
                                            remote_dir="/lustre/inv2/task0", slurm_job_id="7",
                                            chain_file=nel_runs.NEL_CHAIN_FILE)]

    # SLURM-only extras and paths here ask NEL for the jobs only where the executor reads them
    monkeypatch.setattr(nel_runs, "_jobs", lambda record: _never_read())
    nel_runs._protect_remote_secrets(local)
    nel_runs._cancel_chain_leftovers(local)
    assert nel_runs.record_paths(slurm, resuming=False) == []
