"""nel-next on SLURM through the same tools as NEL 0.2.6, on the test suite's real cluster (OpenSSH + SLURM on
127.0.0.1): build_config writes nel-next's slurm cluster, validate_config checks it with nel-next's schema,
launch_canary submits through `nel eval run --submit` (scp + `ssh HOST sbatch`), run_status follows the job in
SLURM's queue and accounting (and nel-next's auto-resume chain), run_logs reads the job log on the cluster,
kill_run cancels the chain, resume_run resubmits with `nel eval resume`.

The job runs `nel eval run` bare on the node: without nel-next on the node's PATH it fails there and run_logs
names why; with it on the PATH (sbatch --export) the canary runs the BYOB benchmark against the real vLLM."""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import anyio
import pytest
import yaml
from tiers import BENCH, own_lane, requires

from quanteval import ledger
from quanteval.clusters import slurm
from quanteval.engines.nel_next import nelnext
from quanteval.models import ToolError
from quanteval.workflow.nelconfig import BuildConfigInput, SetConfigValueInput, build_config, set_config_value
from quanteval.workflow.placement import ApplyClusterInput, apply_cluster
from quanteval.workflow.results import ExtractScoresInput, ValidateRunInput, extract_scores, validate_run
from quanteval.workflow.runs import (
    DryRunInput,
    LaunchCanaryInput,
    RunLogsInput,
    RunRef,
    WaitForRunInput,
    dry_run,
    kill_run,
    launch_canary,
    resume_run,
    run_logs,
    run_status,
    wait_for_run,
)
from quanteval.workflow.validation import ValidateConfigInput, validate_config

sys.path.insert(0, str(Path(__file__).parent / "standins"))
from openai_router import Router  # noqa: E402

# A BYOB benchmark the stand-in router answers: "What is A+B?" gets \boxed{A+B}, except 1+1 (\boxed{3}).
SUMS_BENCH = """
import re
from nemo_evaluator.environments.custom import benchmark, scorer
from nemo_evaluator.scoring import ScorerInput

@benchmark(name="sums", dataset={data!r}, prompt="{{question}}", target_field="answer")
@scorer
def sums_scorer(sample: ScorerInput) -> dict:
    found = re.search(r"-?\\d+", sample.response or "")
    return {{"correct": bool(found) and found.group(0) == str(sample.target).strip()}}
"""
SUMS = [{"question": f"What is {a}+{b}?", "answer": str(a + b)} for a in range(1, 5) for b in range(1, 4)]  # 11 of 12 right

pytestmark = [*requires("nel-next", "slurm"), own_lane("slurm-nel-next")]  # a lane of its own, as test_evaluate_slurm


def _config(tmp_path: Path, slurm_cluster, url: str = "http://127.0.0.1:9/v1", model: str = "tiny-add",
            extra: dict | None = None, bench: str = str(BENCH)) -> str:
    config = build_config(BuildConfigInput(engine="nel-next", execution="slurm", deployment="none", model_type="chat_reasoning",
                                           benchmarks=[bench], config_path=str(tmp_path / "next.yaml"))).config_path
    values = {"cluster.hostname": slurm_cluster.ssh_alias, "cluster.account": "quanteval-test",
              "cluster.node_pools.default.partition": "debug", "cluster.walltime": "00:10:00",
              "output.dir": str(slurm_cluster.jobs_dir / tmp_path.name), "services.model.url": url,
              "services.model.model": model, "services.model.generation.max_tokens": 16, **(extra or {})}
    for key, value in values.items():
        set_config_value(SetConfigValueInput(config_path=config, key=key, value=value))
    return config


def _wait_until_done(record_id: str, timeout_s: float = 240) -> str:
    deadline = time.monotonic() + timeout_s
    status = run_status(RunRef(record_id=record_id)).status
    while status in ("submitted", "pending", "running", "resuming") and time.monotonic() < deadline:
        status = wait_for_run(WaitForRunInput(record_id=record_id, timeout_s=30)).status
    return status


def test_build_config_leaves_what_only_the_cluster_knows_and_nel_next_accepts_it_filled(tmp_path, slurm_cluster):
    built = build_config(BuildConfigInput(engine="nel-next", execution="slurm", deployment="none", model_type="chat_reasoning",
                                          benchmarks=[str(BENCH)], config_path=str(tmp_path / "skeleton.yaml")))
    assert {"cluster.hostname", "cluster.account", "cluster.node_pools.default.partition", "output.dir"} <= set(built.missing_values)
    result = validate_config(ValidateConfigInput(config_path=_config(tmp_path, slurm_cluster)))
    assert result.valid, result.problems


def test_a_canary_without_nel_next_on_the_nodes_path_is_submitted_fails_there_and_says_why(tmp_path, slurm_cluster):
    canary = launch_canary(LaunchCanaryInput(config_path=_config(tmp_path, slurm_cluster), limit_samples=5))
    assert canary.executor == "slurm" and canary.host == slurm_cluster.ssh_alias
    record = ledger.get(canary.record_id)
    job = record.details["slurm_jobs"][0]
    assert job["job_id"].isdigit() and job["remote_dir"].startswith(str(slurm_cluster.jobs_dir / tmp_path.name))
    assert "benchmarks.0.max_problems=5" in record.details["run_overrides"]  # the canary's size went with the job

    assert _wait_until_done(canary.record_id) == "failed"
    status = run_status(RunRef(record_id=canary.record_id))
    assert status.jobs[0].slurm_job_id == job["job_id"] and status.jobs[0].slurm_state == "FAILED"
    logs = run_logs(RunLogsInput(record_id=canary.record_id))
    text = "\n".join(line for tail in logs.tails for line in tail.lines)
    assert "nel: command not found" in text, text[-2000:]
    # nel-next's auto-resume reran the failed job (cluster.max_retries) before giving up: run_status said "resuming"
    # in between, not "failed", and the answer came after its last retry
    assert "Infra retry limit (3) reached" in text
    assert logs.diagnosis is not None and "PATH" in logs.diagnosis.advice
    # the canary gate's reason says the same: why the job failed, not only that no results came back
    verdict = validate_run(ValidateRunInput(run=canary.record_id))
    assert verdict.verdict == "fail" and any("command_not_found" in reason for reason in verdict.reasons), verdict.reasons


def test_an_eval_image_needs_containers_the_node_lacks_and_run_logs_says_so(tmp_path, slurm_cluster):
    """cluster.eval_image makes nel-next's job evaluate inside `srun --container-image` (pyxis): sbatch accepts it,
    the node (no pyxis here) fails it, and the failure is named, not left as "failed"."""
    image = "nvcr.io/nvidia/nemo-evaluator:latest"
    config = _config(tmp_path, slurm_cluster, extra={"cluster.eval_image": image, "cluster.max_retries": 0})
    problems = validate_config(ValidateConfigInput(config_path=config)).problems
    assert [(p.rule, p.key, p.severity) for p in problems] == [("unpinned_image", "cluster.eval_image", "warning")]
    assert "nvcr.io/nvidia/nemo-evaluator:<version>" in problems[0].fix
    commands = [c for script in dry_run(DryRunInput(config_path=config)).scripts for c in script.launch_commands]
    assert any(f"--container-image {image}" in c and "nel eval run" in c for c in commands), commands

    canary = launch_canary(LaunchCanaryInput(config_path=config, limit_samples=5))
    assert _wait_until_done(canary.record_id) == "failed"
    logs = run_logs(RunLogsInput(record_id=canary.record_id))
    assert logs.diagnosis is not None and logs.diagnosis.failure_class == "container", logs.diagnosis
    assert "--container-image" in logs.diagnosis.line and "pyxis" in logs.diagnosis.advice
    verdict = validate_run(ValidateRunInput(run=canary.record_id))
    assert verdict.verdict == "fail" and any("container" in reason for reason in verdict.reasons), verdict.reasons


def test_an_api_url_with_the_protocol_path_is_refused_for_slurm(tmp_path, slurm_cluster):
    """nel-next 0.3.0's SLURM job appends /chat/completions itself (its local runs strip it): caught before submitting."""
    config = _config(tmp_path, slurm_cluster, url="http://127.0.0.1:9/v1/chat/completions")
    problems = validate_config(ValidateConfigInput(config_path=config)).problems
    doubled = [p for p in problems if p.rule == "url_path_doubled_on_slurm"]
    assert doubled and doubled[0].key == "services.model.url" and "http://127.0.0.1:9/v1" in doubled[0].fix


def test_with_nel_next_on_the_path_the_job_runs_it_on_the_node_and_kill_and_resume_drive_the_chain(tmp_path, slurm_cluster):
    """sbatch --export gives the job nel-next's venv. The endpoint is a closed port, so each request retries a while:
    the job is running when kill_run cancels it; resume_run resubmits it with `nel eval resume`, and the new job runs
    nel-next's benchmark on the node to the end (nel-next scores unreachable requests 0, validate_run's business)."""
    path = f"ALL,PATH={nelnext.venv() / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    config = _config(tmp_path, slurm_cluster, extra={"cluster.sbatch_extra_flags": {"export": path}})
    canary = launch_canary(LaunchCanaryInput(config_path=config, limit_samples=2))
    first_job = ledger.get(canary.record_id).details["slurm_jobs"][0]["job_id"]
    deadline = time.monotonic() + 60
    while run_status(RunRef(record_id=canary.record_id)).status != "running" and time.monotonic() < deadline:
        time.sleep(1)
    killed = kill_run(RunRef(record_id=canary.record_id))
    assert killed.status == "killed"
    assert run_status(RunRef(record_id=canary.record_id)).status == "killed"

    resumed = resume_run(RunRef(record_id=canary.record_id))
    assert resumed.status == "submitted"
    second_job = ledger.get(canary.record_id).details["slurm_jobs"][0]["job_id"]
    assert int(second_job) > int(first_job)
    assert _wait_until_done(canary.record_id) == "succeeded"
    status = run_status(RunRef(record_id=canary.record_id))
    assert status.jobs[0].slurm_state == "COMPLETED" and second_job in (status.jobs[0].slurm_job_id, status.jobs[0].current_slurm_job_id)
    # the job queued its auto-resume restart job behind it (afternotok), which can never start once it COMPLETED:
    # cancelled when the run was seen to end, not left PENDING (DependencyNeverSatisfied) in the user's queue for good
    chain = {status.jobs[0].slurm_job_id, status.jobs[0].current_slurm_job_id} - {None}
    queued = [job for job in slurm.squeue(slurm_cluster.ssh_alias, all_states=True)
              if any(f":{job_id}" in (job.dependency or "") for job_id in chain)]
    assert queued and all(job.state != "PENDING" for job in queued), queued
    text = "\n".join(line for tail in run_logs(RunLogsInput(record_id=canary.record_id, lines=400)).tails for line in tail.lines)
    assert "command not found" not in text and "=== Evaluation complete ===" in text
    assert "127.0.0.1:9/v1/chat/completions" in text and "/chat/completions/chat/completions" not in text
    # An unsharded run's results (RUN/<benchmark key>/<benchmark>/ on the cluster) read by record id: every request
    # failed, so the score is 0 and validate_run fails it on its unanswered requests (nel-next counts them as infra_error, not model_errors).
    scores = extract_scores(ExtractScoresInput(run=canary.record_id))
    assert [(task.task, task.headline.value) for task in scores.tasks] == [("tiny_add", 0.0)]
    report = validate_run(ValidateRunInput(run=canary.record_id))
    assert report.verdict == "fail" and any("requests got no answer" in reason and "infra_error" in reason for reason in report.reasons), report.reasons


def test_dry_run_renders_nel_nexts_sbatch_script_for_review(tmp_path, slurm_cluster):
    result = dry_run(DryRunInput(config_path=_config(tmp_path, slurm_cluster)))
    assert result.ok, result.error
    sbatch = next(s for s in result.scripts if s.name.endswith(".sbatch"))
    head = "\n".join(sbatch.head)
    assert "#SBATCH --partition=debug" in head and "#SBATCH --time=00:10:00" in head
    assert any(c.startswith("nel eval run ") and "--resume" in c for c in sbatch.launch_commands), sbatch.launch_commands


def test_a_machine_without_scp_is_told_before_anything_is_submitted(tmp_path, slurm_cluster, monkeypatch):
    config = _config(tmp_path, slurm_cluster)
    only_ssh = tmp_path / "bin"
    only_ssh.mkdir()
    (only_ssh / "ssh").symlink_to(slurm_cluster.bin_dir / "ssh")
    monkeypatch.setenv("PATH", str(only_ssh))
    with pytest.raises(ToolError, match="scp is not on PATH: apt-get install openssh-client"):
        launch_canary(LaunchCanaryInput(config_path=config, limit_samples=2))
    assert ledger.find(kind="canary") == []


def test_files_the_job_reads_by_path_that_the_cluster_lacks_are_named_before_anything_is_recorded(tmp_path, slurm_cluster):
    """The job reads BYOB files, instruction templates and the NeMo-Skills map its export names on the node: asked
    over ssh (the login host's file systems are the nodes'), a missing one is named before a record or a job exists."""
    config = _config(tmp_path, slurm_cluster, extra={
        "benchmarks[0].instruction_template": str(tmp_path / "gone" / "prompt.md"),
        "cluster.sbatch_extra_flags": {"export": f"ALL,NEMO_SKILLS_EXTRA_BENCHMARK_MAP={tmp_path / 'gone' / 'map.json'}"}})
    with pytest.raises(ToolError, match=r"reads 2 file\(s\) by path on the node that .* does not have: .*gone/prompt\.md, "
                                        r".*gone/map\.json\. Nothing was submitted"):
        launch_canary(LaunchCanaryInput(config_path=config, limit_samples=2))
    assert ledger.find(kind="canary") == []


def test_a_confined_full_run_on_slurm_reads_its_config_once_and_checks_it_once(tmp_path, slurm_cluster, monkeypatch):
    """The walk of a nel-next launch on SLURM as `quanteval-mcp --root` makes it (confinement, then the tool):
    the YAML is parsed once, nel-next's schema child starts once, the launch check runs once and the ledger is written
    twice (the record before anything starts, then what was submitted); the job still gets its own output.dir."""
    from collections import Counter

    from quanteval import configfile, paths, registry
    from quanteval.engines import launchplan
    from quanteval.workflow import confine

    config = _config(tmp_path, slurm_cluster)
    monkeypatch.setattr(launchplan, "_PLANS", {})
    monkeypatch.setattr(nelnext, "_SCHEMA_CACHE", {})
    calls: Counter[str] = Counter()

    def counted(what, function):
        def wrapper(*args, **kwargs):
            calls[what] += 1
            return function(*args, **kwargs)
        return wrapper

    for owner, name, what in ((configfile, "parse_config_text", "yaml parse"), (nelnext, "_ask_schema", "schema child"),
                              (nelnext, "launch_blocker", "launch check"), (ledger, "add", "ledger write"),
                              (ledger, "update", "ledger write")):
        monkeypatch.setattr(owner, name, counted(what, getattr(owner, name)))
    policy = paths.Policy(root=tmp_path)
    arguments = confine.check_call("launch_full_run", {"config_path": config, "force": True, "reason": "the walk"}, policy)
    full = registry.run(registry.get_tool("launch_full_run"), arguments, policy=policy)
    assert full.status == "submitted" and full.executor == "slurm"
    assert dict(calls) == {"yaml parse": 1, "schema child": 1, "launch check": 1, "ledger write": 2}
    record = ledger.get(full.record_id)
    assert record.details["overrides"] == [] and record.details["run_overrides"][0].startswith("output.dir=")
    assert record.details["run_facts"]["config"]["output"]["dir"] == record.details["run_overrides"][0].split("=", 1)[1]
    kill_run(RunRef(record_id=full.record_id))


def test_apply_cluster_fills_nel_nexts_cluster_from_the_real_cluster(tmp_path, slurm_cluster):
    """The skeleton's ??? for the node pool, walltime, account and user come from sinfo/scontrol/sacctmgr over SSH;
    an api service needs no GPU, so the pool asks for none; nel-next's schema accepts the result."""
    config = build_config(BuildConfigInput(engine="nel-next", execution="slurm", deployment="none", model_type="chat_reasoning",
                                           benchmarks=[str(BENCH)], config_path=str(tmp_path / "next.yaml"))).config_path
    for key, value in {"output.dir": str(slurm_cluster.jobs_dir / tmp_path.name), "services.model.url": "http://127.0.0.1:9/v1",
                       "services.model.model": "tiny-add", "services.model.generation.max_tokens": 16,
                       "cluster.account": "quanteval-test"}.items():
        set_config_value(SetConfigValueInput(config_path=config, key=key, value=value))
    placed = apply_cluster(ApplyClusterInput(config_path=config, host=slurm_cluster.ssh_alias, walltime="00:20:00"))
    doc = yaml.safe_load(Path(config).read_text())
    cluster = doc["cluster"]
    assert cluster["hostname"] == slurm_cluster.ssh_alias and cluster["username"] == slurm_cluster.user
    assert cluster["node_pools"]["default"]["partition"] in ("debug", "hopper") and cluster["walltime"] == "00:20:00"
    assert "gres" not in cluster["node_pools"]["default"] and "execution" not in doc  # nel-next keys only
    assert any("asks for no GPUs" in note for note in placed.placement.notes)
    result = validate_config(ValidateConfigInput(config_path=config))
    assert result.valid, result.problems
    # no walltime asked, on a partition without a limit: nel-next's own default is written (what its runs get when the
    # key is unset), not NEL 0.2.6's one hour
    doc["cluster"].pop("walltime")
    Path(config).write_text(yaml.safe_dump(doc))
    apply_cluster(ApplyClusterInput(config_path=config, partition="debug"))
    assert yaml.safe_load(Path(config).read_text())["cluster"]["walltime"] == "04:00:00"
    # a day asked on the hopper partition's 4-hour limit: capped, and the note names nel-next's own keys
    capped = apply_cluster(ApplyClusterInput(config_path=config, partition="hopper", walltime="1-00:00:00"))
    assert yaml.safe_load(Path(config).read_text())["cluster"]["walltime"] == "04:00:00"
    note = next(note for note in capped.placement.notes if "capped at partition hopper" in note)
    assert note.startswith("cluster.walltime capped") and "cluster.max_walltime" in note and "execution." not in note
    assert validate_config(ValidateConfigInput(config_path=config)).valid


def _sums_bench(tmp_path: Path) -> str:
    data = tmp_path / "sums.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in SUMS))
    bench = tmp_path / "sums.py"
    bench.write_text(SUMS_BENCH.format(data=str(data)))
    return str(bench)


def test_a_sharded_run_is_fetched_merged_by_nel_next_and_carries_the_verdict_chain(tmp_path, slurm_cluster):
    """shards: 2 makes nel-next submit one SLURM job per shard, each writing shard_<i>/ on the cluster; the last one
    merges them there. Driven as an IDE would, over a real MCP session: validate_run, the canary gate, extract_scores,
    compare_results and gate_results read the run by its record id, its results copied back. The router gets exactly
    one of the 12 sums wrong, so the score is 11/12 only if both shards' results made it into the verdict."""
    from mcp import Client

    from quanteval.faces.server import build_server

    router = Router()
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nbenchmarks:\n  sums: {tier: critical, metric: pass@1, max_drop: 0.05}\n")
    try:
        path = f"ALL,PATH={nelnext.venv() / 'bin'}:/usr/local/bin:/usr/bin:/bin"
        config = _config(tmp_path, slurm_cluster, url=f"{router.url}/v1", model="router",
                         extra={"cluster.sbatch_extra_flags": {"export": path}, "cluster.shards": 2}, bench=_sums_bench(tmp_path))

        async def chain() -> dict:
            seen: dict = {}
            async with Client(build_server()) as client:
                async def call(tool: str, arguments: dict) -> dict:
                    result = await client.call_tool(tool, arguments)
                    assert not result.is_error, f"{tool}: {result.content[0].text}"
                    return result.structured_content

                async def finish(record_id: str) -> str:
                    status = "submitted"
                    for _ in range(8):
                        status = (await call("wait_for_run", {"record_id": record_id, "timeout_s": 30}))["status"]
                        if status not in ("submitted", "pending", "running", "resuming"):
                            break
                    return status

                canary = await call("launch_canary", {"config_path": config, "limit_samples": 12})
                seen["canary"], seen["canary_status"] = canary["record_id"], await finish(canary["record_id"])
                seen["validate"] = await call("validate_run", {"run": canary["record_id"]})
                seen["scores"] = await call("extract_scores", {"run": canary["record_id"]})
                full = await call("launch_full_run", {"config_path": config})  # the canary gate reads the fetched results
                seen["full"], seen["full_status"] = full["record_id"], await finish(full["record_id"])
                seen["compare"] = await call("compare_results", {"baseline": canary["record_id"], "candidate": full["record_id"]})
                seen["gate"] = await call("gate_results", {"baseline": canary["record_id"], "candidate": full["record_id"],
                                                           "policy": str(policy)})
            return seen

        seen = anyio.run(chain)
        assert len(ledger.get(seen["canary"]).details["slurm_jobs"]) == 2
        assert seen["canary_status"] == "succeeded" and seen["full_status"] == "succeeded"
        assert seen["validate"]["verdict"] == "pass", seen["validate"]["reasons"]
        assert [task["evaluated_samples"] for task in seen["validate"]["tasks"]] == [12]
        headline = seen["scores"]["tasks"][0]["headline"]
        assert seen["scores"]["tasks"][0]["task"] == "sums" and headline["value"] == pytest.approx(11 / 12, abs=1e-4)  # nel-next rounds to 4 places
        assert [(row["task"], row["delta"]) for row in seen["compare"]["comparisons"]] == [("sums", pytest.approx(0.0))]
        assert [(b["benchmark"], b["status"]) for b in seen["gate"]["benchmarks"]] == [("sums", "PASS")] and seen["gate"]["verdict"] == "GO"
        # this run's requests (model "router"): a port is reused, and another test's client may still knock on it
        assert len({request["messages"][-1]["content"] for request in router.requests if request.get("model") == "router"}) == 12

        # The last shard's job merges on the node; had it died there, `nel eval merge` runs on the copy here.
        shard_1 = Path(ledger.get(seen["full"]).details["slurm_jobs"][1]["remote_dir"])
        shutil.rmtree(shard_1.parent / "sums")
        rescored = extract_scores(ExtractScoresInput(run=seen["full"]))
        assert rescored.tasks[0].headline.value == pytest.approx(11 / 12, abs=1e-4)
        assert (Path(ledger.get(seen["full"]).details["results_dir"]) / "sums").is_dir() and not (shard_1.parent / "sums").exists()

        # A shard whose job died before writing its checkpoint: the run is not passed on the other shard's half.
        for checkpoint in shard_1.rglob("checkpoint.json"):
            checkpoint.unlink()
        report = validate_run(ValidateRunInput(run=seen["full"]))
        assert report.verdict == "fail"
        assert any("shard_1 wrote no checkpoint.json" in reason for reason in report.reasons), report.reasons
    finally:
        router.close()
