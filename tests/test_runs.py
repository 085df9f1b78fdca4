"""Run lifecycle against the real NEL: dry-run, hashing, the canary gate, status and log classification.

NEL's own executors and execution database are used throughout; runs that would need Docker or
GPUs are represented by the files NEL's run scripts write (stage.exit, logs, results), laid out
exactly as NEL reads them back. SLURM is covered in test_runs_slurm.py against a real cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from results_factory import make_invocation, make_task  # noqa: E402
from tiers import BENCH, CHECKPOINTS, REPO, requires  # noqa: E402

from quanteval import failures, ledger, paths
from quanteval.engines import launchplan
from quanteval.engines.base import SCRIPT_HEAD_LINES
from quanteval.engines.nel.runs import repeat_overrides
from quanteval.models import ToolError
from quanteval.workflow import runs

PLANTED = "planted-judge-secret-9f8e7d"


def config_hash_of(path: str, overrides: list[str] | None = None) -> str:
    """The hash the canary gate matches: the config as its engine composes it (NEL: defaults + file + overrides)."""
    plan = launchplan.plan(path, overrides or [])
    return plan.engine.run.compose(plan).config_hash


@pytest.fixture(autouse=True)
def nel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """NEL's execution database in the test's own directory, and a secret NEL will write to .secrets.env."""
    exec_db = tmp_path / "nel-exec-db" / "exec.v1.jsonl"
    monkeypatch.setenv("NEMO_EVALUATOR_EXEC_DB_FILE", str(exec_db))
    monkeypatch.setenv("JUDGE_API_KEY", PLANTED)
    return exec_db


def write_config(directory: Path, *, executor: str = "local", url: str = "http://127.0.0.1:9/v1/chat/completions",
                 tasks: tuple[str, ...] = ("lm-evaluation-harness.ifeval", "lm-evaluation-harness.gsm8k"),
                 name: str = "run.yaml", extra: str = "") -> Path:
    execution = f"""execution:
  output_dir: {directory / 'out'}
"""
    if executor == "slurm":
        execution = f"""execution:
  hostname: cluster-login
  username: evaluser
  account: acct
  output_dir: {directory / 'remote-out'}
"""
    task_lines = "\n".join(f"    - name: {task}" for task in tasks)
    path = directory / name
    path.write_text(f"""# a comment NEL ignores
defaults:
  - execution: {'slurm/default' if executor == 'slurm' else executor}
  - deployment: none
  - _self_
{execution}target:
  api_endpoint:
    url: {url}
    model_id: tiny-model
    api_key_name: JUDGE_API_KEY
evaluation:
  env_vars:
    JUDGE_KEY_FOR_TASK: host:JUDGE_API_KEY
  tasks:
{task_lines}
{extra}""")
    return path


def test_dry_run_local_renders_scripts_and_locks_away_secrets(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    result = runs.dry_run(runs.DryRunInput(config_path=str(config)))

    assert result.ok and result.error is None
    assert result.executor == "local" and result.invocation_id
    assert Path(result.invocation_dir).is_dir()
    names = {script.name for script in result.scripts}
    assert {"run_all.sequential.sh", "lm-evaluation-harness.ifeval.0/run.sh",
            "lm-evaluation-harness.gsm8k.1/run.sh"} <= names
    assert all(script.size_bytes > 0 and 0 < len(script.head) <= SCRIPT_HEAD_LINES for script in result.scripts)
    # NEL wrote the real secret into .secrets.env; the file is now private and the value never comes back.
    assert len(result.secrets_files_protected) == 2
    for secrets_file in map(Path, result.secrets_files_protected):
        assert PLANTED in secrets_file.read_text()
        assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert PLANTED not in result.model_dump_json()
    record = ledger.get(result.record_id)
    assert (record.kind, record.status, record.config_hash) == ("dry_run", "passed", result.config_hash)
    assert PLANTED not in json.dumps(record.details)


def test_dry_run_slurm_returns_scripts_nel_only_printed(tmp_path: Path) -> None:
    config = write_config(tmp_path, executor="slurm", tasks=("lm-evaluation-harness.ifeval",))
    result = runs.dry_run(runs.DryRunInput(config_path=str(config)))

    assert result.ok, result.error
    assert result.executor == "slurm" and result.invocation_dir is None
    assert [script.name for script in result.scripts] == ["task0/run.sub"]
    head = "\n".join(result.scripts[0].head)
    assert "#SBATCH --account acct" in head
    assert PLANTED not in result.model_dump_json()
    assert ledger.get(result.record_id).host == "cluster-login"


def test_dry_run_reports_nels_error_as_a_message(tmp_path: Path) -> None:
    config = write_config(tmp_path, url="???")
    result = runs.dry_run(runs.DryRunInput(config_path=str(config)))

    assert not result.ok and result.scripts == []
    assert "target.api_endpoint.url" in result.error
    assert "Traceback" not in result.error and 'File "' not in result.error
    assert ledger.get(result.record_id).status == "failed"


def test_dry_run_new_key_without_plus_is_nels_hydra_error(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    result = runs.dry_run(runs.DryRunInput(
        config_path=str(config), overrides=["evaluation.nemo_evaluator_config.config.params.limit_samples=5"]))
    assert not result.ok
    assert "limit_samples" in result.error and "HYDRA_FULL_ERROR" not in result.error


def test_dry_run_missing_config_file_is_a_tool_error(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="no such config file"):
        runs.dry_run(runs.DryRunInput(config_path=str(tmp_path / "nope.yaml")))
    assert ledger.count() == 0


def test_config_hash_ignores_the_canary_limit_and_the_file_location(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    copy = tmp_path / "elsewhere" / "same.yaml"
    copy.parent.mkdir()
    copy.write_text(config.read_text())
    base = config_hash_of(str(config))

    assert config_hash_of(str(copy)) == base
    assert config_hash_of(str(config), ["target.api_endpoint.model_id=other"]) != base
    # The canary's own limit override does not change the hash it is recorded with.
    with pytest.raises(ToolError):
        runs.launch_canary(runs.LaunchCanaryInput(config_path=str(config), limit_samples=3))
    (canary,) = ledger.find(kind="canary")
    assert canary.config_hash == base


def test_local_canary_without_docker_daemon_fails_fast_and_says_so(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    started = time.monotonic()
    with pytest.raises(ToolError, match="Docker") as error:
        runs.launch_canary(runs.LaunchCanaryInput(config_path=str(config)))
    assert time.monotonic() - started < 60
    assert "slurm" in str(error.value)
    (canary,) = ledger.find(kind="canary")
    assert canary.status == "failed" and "Docker" in canary.details["error"]
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_full_run_refused_without_a_canary_and_force_needs_a_reason(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with pytest.raises(ToolError, match="no canary has run for this config.*launch_canary"):
        runs.launch_full_run(runs.LaunchFullRunInput(config_path=str(config)))
    with pytest.raises(ToolError, match="reason"):
        runs.launch_full_run(runs.LaunchFullRunInput(config_path=str(config), force=True))
    with pytest.raises(ToolError, match="reason"):
        runs.launch_full_run(runs.LaunchFullRunInput(config_path=str(config), force=True, reason="   "))
    assert ledger.find(kind="full_run") == []


def test_forced_full_run_records_the_reason(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    with pytest.raises(ToolError, match="Docker"):  # gate skipped; the launch itself then needs Docker
        runs.launch_full_run(runs.LaunchFullRunInput(config_path=str(config), force=True,
                                                     reason="canary passed on the twin cluster yesterday"))
    (full,) = ledger.find(kind="full_run")
    assert full.details["forced"] is True
    assert full.details["reason"] == "canary passed on the twin cluster yesterday"
    assert full.details["gate"].startswith("forced:")


def write_exec_db_job(exec_db: Path, invocation: str, executor: str, data: dict) -> None:
    """Record a job in NEL's execution database with NEL's own writer (in a child: NEL fixes the path at import)."""
    code = ("import json, sys, time; from nemo_evaluator_launcher.common.execdb import ExecutionDB, JobData; "
            "inv, executor, data = json.loads(sys.argv[1]); "
            "ExecutionDB().write_job(JobData(invocation_id=inv, job_id=inv + '.0', timestamp=time.time(), "
            "executor=executor, data=data, config={}))")
    subprocess.run([sys.executable, "-c", code, json.dumps([invocation, executor, data])], check=True,
                   env={**os.environ, "NEMO_EVALUATOR_EXEC_DB_FILE": str(exec_db)})


def record_finished_local_run(tmp_path: Path, exec_db: Path, invocation: str, *, exit_code: int,
                              logs: dict[str, str] | None = None, kind: str = "canary",
                              config_hash: str | None = None) -> ledger.Record:
    """A local NEL run as its run.sh leaves it: task dir with logs/stage.exit and artifacts, plus NEL's exec-db entry."""
    invocation_dir = make_invocation(tmp_path / "out", invocation=invocation)
    task_dir = make_task(invocation_dir, exit_code=exit_code, logs=logs)
    write_exec_db_job(exec_db, invocation, "local", {"output_dir": str(task_dir), "container": "c", "eval_image": "i"})
    return ledger.add(kind, status="submitted", config_path="x.yaml", config_hash=config_hash,
                      invocation_id=invocation, executor="local")


def test_run_status_reads_nel_and_records_the_transition(tmp_path: Path, nel_env: Path) -> None:
    record = record_finished_local_run(tmp_path, nel_env, "aa11bb22cc33dd44", exit_code=0)
    status = runs.run_status(runs.RunRef(record_id=record.invocation_id))

    assert status.record_id == record.id and status.reachable
    assert status.status == "succeeded" and [job.status for job in status.jobs] == ["succeeded"]
    assert [event.status for event in status.history] == ["submitted", "succeeded"]
    failed = record_finished_local_run(tmp_path, nel_env, "ff11bb22cc33dd44", exit_code=1)
    assert runs.run_status(runs.RunRef(record_id=failed.id)).status == "failed"


def test_run_logs_classifies_failures_with_file_and_line(tmp_path: Path, nel_env: Path) -> None:
    log = "\n".join([
        "starting evaluation",
        "Traceback (most recent call last):",
        '  File "eval.py", line 3, in <module>',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "HTTP 429 Too Many Requests from the judge endpoint",
        f"+ export 'JUDGE_API_KEY={PLANTED}'",
        "done",
    ])
    record = record_finished_local_run(tmp_path, nel_env, "bb11bb22cc33dd44", exit_code=1,
                                       logs={"client-bb11bb22cc33dd44.0.log": log})
    result = runs.run_logs(runs.RunLogsInput(record_id=record.id, lines=3))

    by_class = {hit.failure_class: hit for hit in result.failures}
    assert by_class["oom"].line == 4 and by_class["oom"].file.endswith("client-bb11bb22cc33dd44.0.log")
    assert by_class["traceback"].line == 2
    assert by_class["rate_limit"].line == 5
    assert result.failure_classes == ["oom", "rate_limit", "traceback"]  # most specific first
    # run_status says failed, so the most specific failure is named with its fix.
    assert result.diagnosis.failure_class == "oom" and result.diagnosis.line_number == 4
    client_tail = next(tail for tail in result.tails if tail.file.endswith(".0.log"))
    assert len(client_tail.lines) == 3 and client_tail.lines[-1] == "done"
    assert PLANTED not in result.model_dump_json()


def test_run_logs_over_mcp_masks_secrets_by_value_and_by_shape(tmp_path: Path, nel_env: Path) -> None:
    """A job's log echoes the requests it sent and the keys it used: what run_logs returns shows none of them."""
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    nvapi, hf, sk = "nvapi-PLANTEDs3cr3tKey9f8e7d", "hf_" + "PLANTEDaB3dE5gH7jK9mN1pQ3sT5vW7yZ9", "sk-PLANTED0123456789abcdefXYZ"
    log = "\n".join([
        f"POST http://judge:8000/v1/chat/completions headers={{'Authorization': 'Bearer {nvapi}'}}",
        f"curl -H 'Authorization: Bearer {nvapi}' http://judge:8000/v1/models",
        f"openai.AuthenticationError: Error code: 401 - Incorrect API key provided: {sk}",
        f"huggingface_hub login with {hf} failed",
        f"judge key from env: {PLANTED}",
        "done",
    ])
    record = record_finished_local_run(tmp_path, nel_env, "cc11bb22cc33dd44", exit_code=1,
                                       logs={"client-cc11bb22cc33dd44.0.log": log})

    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool("run_logs", {"record_id": record.id, "lines": 10})

    result = anyio.run(go)
    assert not result.is_error, result.content[0].text
    shown = result.content[0].text + json.dumps(result.structured_content)
    for secret in (nvapi, hf, sk, PLANTED):
        assert secret not in shown
    tail = next(t for t in result.structured_content["tails"] if t["file"].endswith(".0.log"))["lines"]
    assert "Authorization: Bearer ***" in tail[1] and "'Bearer ***'" in tail[0]
    assert tail[2].endswith("API key provided: ***") and "login with *** failed" in tail[3]
    assert tail[4] == "judge key from env: <JUDGE_API_KEY>" and tail[5] == "done"
    diagnosis = result.structured_content["diagnosis"]
    assert diagnosis["failure_class"] == "missing_credentials" and diagnosis["line"].endswith("provided: ***")


@pytest.mark.parametrize(("line", "failure_class"), [
    ("slurmstepd: error: Detected 1 oom_kill event in StepId=12.0", "oom"),
    ("slurmstepd: error: *** JOB 12 ON localhost CANCELLED AT 2026-11-21T10:00:00 DUE TO TIME LIMIT ***", "timeout"),
    ("openai.AuthenticationError: Error code: 401 - Unauthorized", "missing_credentials"),
    ("pyxis: importing docker image: nvcr.io/nvidia/eval-factory/x:1", "container"),
    ("srun: unrecognized option '--container-image=nvcr.io/nvidia/eval-factory/nemo_skills:26.01'", "container"),
    ("sbatch: error: invalid partition specified: batch", "sbatch_rejected"),
    ("sbatch: error: Batch job submission failed: Requested node configuration is not available", "sbatch_rejected"),
    ("requests.exceptions.HTTPError: 500 Server Error: Internal Server Error for url: http://node:8000/v1", "http_error"),
    ("openai.BadRequestError: Error code: 400 - This model's maximum context length is 40960 tokens", "http_error"),
    ("FileNotFoundError: [Errno 2] No such file or directory: '/nemo_run/code/nemo_skills/dataset/gpqa/test.jsonl'",
     "missing_dataset"),
    ("datasets.exceptions.DatasetNotFoundError: Dataset 'Idavidrein/gpqa' is a gated dataset", "missing_dataset"),
    ("+ TIMEOUT=3600", None),  # the job script's own set -x echo, not a timeout
    ("TIMEOUT=3600", None),
    ("++ export 'REQUEST_TIMEOUT=3600'", None),
    ("ReadTimeout: HTTPConnectionPool(host='node', port=8000): Read timed out.", "timeout"),
    ("srun: error: task 0: Killed", "killed"),
    ("Sandbox execution failed: connection refused", "sandbox"),
    ("judge model returned an error for sample 12", "judge"),
    ("json.decoder.JSONDecodeError: Expecting value", "parse"),
    ("scoring failed for task gpqa", "scoring"),
    ("ValueError: bad value", "exception"),
    ("evaluation finished: 198 samples", None),
])
def test_failure_classes(line: str, failure_class: str | None) -> None:
    assert failures.classify(line) == failure_class


def test_failure_patterns_work_in_gnu_grep(tmp_path: Path) -> None:
    """Remote logs are grepped with `grep -E -i` on the cluster, so the patterns must mean the same there."""
    sample = tmp_path / "log"
    sample.write_text("fine\nCUDA out of memory\nall good\nrate limit hit\n")
    found = subprocess.run(["grep", "-n", "-i", "-E", failures.ANY_FAILURE_ERE, str(sample)], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert [line.split(":")[0] for line in found] == ["2", "4"]


@pytest.mark.slow
def test_gate_passes_a_validated_canary_and_refuses_a_failed_one(tmp_path: Path, nel_env: Path) -> None:
    config = write_config(tmp_path)
    config_hash = config_hash_of(str(config))
    failed = record_finished_local_run(tmp_path, nel_env, "cc11bb22cc33dd44", exit_code=1, config_hash=config_hash)
    with pytest.raises(ToolError, match=f"{failed.id}: failed"):
        runs.launch_full_run(runs.LaunchFullRunInput(config_path=str(config)))
    assert ledger.get(failed.id).status == "failed"  # the gate refreshed it from NEL

    partial = record_finished_local_run(tmp_path, nel_env, "cd11bb22cc33dd44", exit_code=0, config_hash=config_hash)
    ledger.update(partial.id, details={"tasks": ["lm-evaluation-harness.ifeval"]})
    with pytest.raises(ToolError, match=f"{partial.id}: did not run lm-evaluation-harness.gsm8k"):
        runs.launch_full_run(runs.LaunchFullRunInput(config_path=str(config)))

    passed = record_finished_local_run(tmp_path, nel_env, "dd11bb22cc33dd44", exit_code=0, config_hash=config_hash)
    ledger.update(passed.id, details={"tasks": ["lm-evaluation-harness.ifeval", "lm-evaluation-harness.gsm8k"]})
    with pytest.raises(ToolError, match="Docker"):  # the gate opened; only the local executor's Docker is missing
        runs.launch_full_run(runs.LaunchFullRunInput(config_path=str(config)))
    (full,) = ledger.find(kind="full_run")
    assert full.details["gate"].startswith(f"canary {passed.id}") and full.details["forced"] is False
    assert ledger.get(passed.id).details["validation_passed"] is True


def test_killing_a_finished_run_leaves_its_outcome(tmp_path: Path, nel_env: Path) -> None:
    record = record_finished_local_run(tmp_path, nel_env, "ee11bb22cc33dd44", exit_code=0)
    killed = runs.kill_run(runs.RunRef(record_id=record.id))
    assert killed.status == "succeeded" and ledger.get(record.id).status == "succeeded"
    assert killed.jobs[0].status == "unknown" and killed.jobs[0].note  # NEL said why it could not kill


def test_resume_returns_at_once_while_nels_background_script_runs(tmp_path: Path, nel_env: Path) -> None:
    """NEL's local resume starts run.sh in the background; it inherits NEL's output and must not hold the call."""
    record = record_finished_local_run(tmp_path, nel_env, "ab11bb22cc33dd44", exit_code=1)
    task_dir = next((tmp_path / "out").glob("*-ab11bb22cc33dd44/*.0"))
    # Stands in for the docker-running script NEL renders: same stage files, echoes to its inherited stdout.
    (task_dir / "run.sh").write_text('echo $$ > script.pid; echo "$(date +%s)" > logs/stage.running; '
                                     'echo "evaluating"; sleep 30; echo "$(date +%s) 0" > logs/stage.exit\n')
    started = time.monotonic()
    try:
        resumed = runs.resume_run(runs.RunRef(record_id=record.id))
        assert time.monotonic() - started < 20
        assert resumed.invocation_id == "ab11bb22cc33dd44" and resumed.status == "submitted"
        assert runs.run_status(runs.RunRef(record_id=record.id)).status == "running"
    finally:
        deadline = time.monotonic() + 10
        while not (task_dir / "script.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        os.killpg(int((task_dir / "script.pid").read_text()), 9)


def test_status_of_unknown_run_is_a_clear_error() -> None:
    with pytest.raises(ToolError, match="list_runs"):
        runs.run_status(runs.RunRef(record_id="canary-doesnotexist"))


def test_list_runs_filters_and_paginates(tmp_path: Path) -> None:
    for index in range(5):
        ledger.add("canary", status="failed" if index % 2 else "succeeded", config_hash=f"h{index}")
    ledger.add("dry_run", status="passed")
    ledger.add("deployment", status="running")
    ledger.add("eval_job", status="running")  # an eval server's job: its server lists it

    everything = runs.list_runs(runs.ListRunsInput())  # servers too: one left running is visible
    assert everything.total == 7 and sorted({run.kind for run in everything.runs}) == ["canary", "deployment", "dry_run"]
    page = runs.list_runs(runs.ListRunsInput(kind="canary", offset=1, limit=2))
    assert page.total == 5 and [run.config_hash for run in page.runs] == ["h3", "h2"]
    assert runs.list_runs(runs.ListRunsInput(status="failed")).total == 2


def test_tools_run_from_the_cli_with_nothing_but_json_on_stdout(tmp_path: Path, cli_env: dict[str, str]) -> None:
    config = write_config(tmp_path)
    completed = subprocess.run([str(Path(sys.executable).parent / "quanteval"), "call", "dry_run", "--json",
                                json.dumps({"config_path": str(config)})], capture_output=True, text=True,
                               env={**cli_env, "NEMO_EVALUATOR_EXEC_DB_FILE": os.environ["NEMO_EVALUATOR_EXEC_DB_FILE"]},
                               timeout=120)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout)
    assert result["ok"] is True and PLANTED not in completed.stdout


def test_dry_run_over_stdio_mcp_reports_progress_and_keeps_stdout_clean(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """NEL prints its scripts; over stdio only JSON-RPC may reach stdout, with progress while NEL works."""
    config = write_config(tmp_path)
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "dry_run", "arguments": {"config_path": str(config)}, "_meta": {"progressToken": "p1"}}},
    ]
    env = {**cli_env, "NEMO_EVALUATOR_EXEC_DB_FILE": os.environ["NEMO_EVALUATOR_EXEC_DB_FILE"]}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "quanteval-mcp")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True)
    lines: list[str] = []
    try:
        for request in requests:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            while "id" in request:
                line = proc.stdout.readline()
                assert line, "server closed stdout"
                lines.append(line)
                if json.loads(line).get("id") == request["id"]:
                    break
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    messages = [json.loads(line) for line in lines]  # every stdout line is JSON-RPC
    progress = [m for m in messages if m.get("method") == "notifications/progress"]
    assert progress and progress[-1]["params"]["progress"] == 2
    result = messages[-1]["result"]
    assert not result.get("isError") and result["structuredContent"]["ok"] is True
    assert PLANTED not in "".join(lines)


def test_a_canary_runs_one_repeat_where_the_config_repeats_and_keeps_the_hash(tmp_path: Path) -> None:
    config = tmp_path / "repeats.yaml"
    config.write_text("""defaults:
  - execution: local
  - deployment: none
  - _self_
execution:
  output_dir: /tmp/out
target:
  api_endpoint:
    url: http://127.0.0.1:9/v1/chat/completions
    model_id: m
evaluation:
  nemo_evaluator_config:
    config:
      params:
        extra:
          n_samples: 3
  tasks:
    - name: ns_aime2025
      nemo_evaluator_config:
        config:
          params:
            extra:
              num_repeats: 16
    - name: lm-evaluation-harness.ifeval
""")
    overrides, notes = repeat_overrides(_plain(config), 1)
    assert overrides == ["++evaluation.nemo_evaluator_config.config.params.extra.n_samples=1",
                         "++evaluation.tasks.0.nemo_evaluator_config.config.params.extra.num_repeats=1"]
    assert "ns_aime2025: the canary runs num_repeats=1 (config: 16); the full run uses 16." in notes
    # NEL composes them, and the canary's overrides stay out of the hash that ties it to the full run.
    full = config_hash_of(str(config))
    assert config_hash_of(str(config), overrides) != full
    assert repeat_overrides(_plain(config), 16)[0] == ["++evaluation.nemo_evaluator_config.config.params.extra.n_samples=16"]


def test_start_evaluation_refuses_what_evaluate_quantization_refuses_and_starts_nothing(tmp_path):
    """The same pre-flight as the one-call form: an error at once, no evaluation recorded, no job started."""
    from quanteval import registry

    same = str(tmp_path)
    spec = registry.get_tool("start_evaluation")
    with pytest.raises(ToolError, match="same directory"):
        registry.run(spec, {"baseline_checkpoint": same, "candidate_checkpoint": same, "benchmarks": ["x.py"]})
    with pytest.raises(ToolError, match="no such BYOB file"):
        registry.run(spec, {"baseline_checkpoint": same, "candidate_checkpoint": str(tmp_path / "b"),
                            "benchmarks": [str(tmp_path / "missing.py")]})
    with pytest.raises(ToolError, match="outside"):  # --root confines the paths inside the object too
        registry.run(spec, {"baseline_checkpoint": "/etc", "candidate_checkpoint": same, "benchmarks": ["x.py"]},
                     policy=paths.Policy(root=tmp_path, absolute_only=True))
    assert ledger.find(kind="evaluation") == []


def test_run_logs_of_an_evaluation_job_is_its_own_log_not_a_nel_invocation(tmp_path):
    """start_evaluation's record is a run like the others for run_logs (over MCP): its log's tail, masked, and for a
    failed one the diagnosis, where it said "no NEL invocation (its launch failed)" of an evaluation that succeeded."""
    import anyio
    from mcp import Client

    from quanteval import ledger
    from quanteval.faces.server import build_server

    log = tmp_path / "job.log"
    log.write_text("[evaluate] baseline: serving\n[evaluate] HF_TOKEN=hf_aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3f\n"
                   "[evaluate] verdict: acceptable\n")
    done = ledger.add("evaluation", status="succeeded", executor="local", details={"log_path": str(log)})
    failed_log = tmp_path / "failed.log"
    failed_log.write_text("[evaluate] baseline: serving\nOSError: [Errno 28] No space left on device: '/scratch/out/x'\n")
    failed = ledger.add("evaluation", status="failed", executor="local", details={"log_path": str(failed_log)})

    async def go():
        async with Client(build_server()) as client:
            return [await client.call_tool("run_logs", {"record_id": record.id}) for record in (done, failed)]

    ok, bad = anyio.run(go)
    assert not ok.is_error, ok.content[0].text
    (tail,) = ok.structured_content["tails"]
    assert tail["lines"][-1] == "[evaluate] verdict: acceptable" and "hf_aB3" not in str(tail)
    assert ok.structured_content["diagnosis"] is None
    assert not bad.is_error, bad.content[0].text
    assert bad.structured_content["diagnosis"]["failure_class"] == "disk_full"


def _plain(path) -> dict:
    from quanteval import configfile

    return configfile.to_plain(configfile.load_config(path))


def test_a_refresh_that_read_a_run_running_leaves_the_cancel_written_meanwhile(tmp_path):
    """list_runs (or wait_for_run) read a nel-next run running; evaluate cancelled it and recorded why; the refresh
    that then found its process gone must not land `failed` over `cancelled`."""
    from quanteval import engines

    gone = subprocess.Popen(["true"])
    gone.wait()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record = ledger.add("full_run", status="running", executor="local", invocation_id=f"nel-next:{run_dir}",
                        details={"engine": "nel-next", "run_dir": str(run_dir), "pgid": gone.pid, "tasks": ["sums"]})
    seen = ledger.get(record.id)
    ledger.update(record.id, status="cancelled", message="cancelled: evaluate_quantization was interrupted")
    assert engines.for_record(seen).run.refresh(seen).record.status == "cancelled"
    assert ledger.get(record.id).status == "cancelled"


def test_kill_run_changes_only_a_live_status_so_a_succeeded_canary_still_opens_the_gate(tmp_path):
    """kill_run on a nel-next canary that succeeded (or a run whose process ended since the last poll) leaves its
    outcome; over MCP, as a client would send it. A live one is killed."""
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    gone = subprocess.Popen(["true"])
    gone.wait()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    details = {"engine": "nel-next", "run_dir": str(run_dir), "pgid": gone.pid, "tasks": ["sums"]}
    done = ledger.add("canary", status="succeeded", executor="local", invocation_id=f"nel-next:{run_dir}", details=details)
    live = subprocess.Popen(["sleep", "60"], start_new_session=True)
    running = ledger.add("canary", status="running", executor="local", invocation_id=f"nel-next:{run_dir}",
                         details={**details, "pgid": live.pid})

    async def go():
        async with Client(build_server()) as client:
            return [await client.call_tool("kill_run", {"record_id": record.id}) for record in (done, running)]

    try:
        kept, killed = anyio.run(go)
    finally:
        live.kill()
        live.wait()
    assert not kept.is_error and kept.structured_content["status"] == "succeeded", kept.content[0].text
    assert ledger.get(done.id).status == "succeeded"
    assert not killed.is_error and ledger.get(running.id).status == "killed", killed.content[0].text


def test_a_record_of_a_kind_this_version_does_not_know_is_named_with_the_known_kinds():
    """A ledger shared with a newer quanteval may hold a kind this one does not know: run_status (over MCP) names it
    and the kinds it knows instead of failing on validation; ledger.add refuses one before writing anything."""
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    with ledger.connect() as conn:
        conn.execute("INSERT INTO records (id, kind, status, created_at, updated_at) VALUES ('probe-1', 'probe', 'running', 0, 0)")

    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool("run_status", {"record_id": "probe-1"})

    result = anyio.run(go)
    assert result.is_error
    assert "Unknown record kind 'probe'" in result.content[0].text and "canary, full_run, evaluation" in result.content[0].text
    before = ledger.count()
    with pytest.raises(ToolError, match="knows dry_run, canary, full_run, evaluation, deployment, eval_server, eval_job"):
        ledger.add("probe", status="running")  # type: ignore[arg-type]
    assert ledger.count() == before


@requires("nel-next", "slow")
def test_wait_for_run_reports_an_evaluations_workflow_steps_over_mcp(tmp_path, monkeypatch):
    """MCP progress in the evaluation's own units, as the CLI prints them ([8/17] candidate: ...): the step number of
    the steps in all, its name as the message; not seconds of wait_for_run's own timeout. A stand-in for vLLM
    (tests/standins, answering each sum) serves both checkpoints: the steps are the point, not the serving."""
    import shlex

    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server
    from quanteval.workflow.evaluate import STEPS_PER_CHECKPOINT

    standin = [sys.executable, str(REPO / "tests" / "standins" / "fake_inference_server.py"), "--fake-answers", "sum",
               "--fake-load-s", "2"]
    monkeypatch.setenv("QUANTEVAL_VLLM_LAUNCHER", shlex.join(standin))
    seen: list[tuple[float, float | None, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message or ""))

    async def go() -> tuple[dict, int]:
        async with Client(build_server()) as client:
            started = await client.call_tool("start_evaluation", {
                "baseline_checkpoint": str(CHECKPOINTS / "tiny-add-bf16"), "candidate_checkpoint": str(CHECKPOINTS / "tiny-add-w8a8"),
                "benchmarks": [str(BENCH)], "output_dir": str(tmp_path / "out"), "max_drop": 2})
            assert not started.is_error, started.content[0].text
            calls = 0
            while True:
                waited = await client.call_tool("wait_for_run", {"record_id": started.structured_content["record_id"],
                                                                 "timeout_s": 20}, progress_callback=on_progress)
                calls += 1
                assert not waited.is_error, waited.content[0].text
                if waited.structured_content["status"] != "running" or calls > 30:
                    return waited.structured_content, calls

    answer, calls = anyio.run(go)
    assert answer["status"] == "succeeded", answer
    steps = 2 * STEPS_PER_CHECKPOINT + 1  # each checkpoint's steps and the comparison
    stepped = [(done, message) for done, total, message in seen if total is not None]
    assert stepped and all(total == steps for _, total, _ in seen if total is not None), seen
    assert all(done == int(done) and 0 <= done <= steps for done, _ in stepped), seen
    assert [done for done, _ in stepped] == sorted(done for done, _ in stepped), seen  # steps only go forward
    assert len({done for done, _ in stepped}) >= 3, seen  # it reported the workflow moving, not one number
    # whose step: "candidate canary ...: running"; step 0 also carries the notes on what the sampling can decide
    names = {message.split()[0].rstrip(":") for done, message in stepped if done > 0}
    assert names <= {"baseline", "candidate", "comparing"} and {"baseline", "candidate"} <= names, sorted({m for _, m in stepped})
    # before the job's first step only its state, never seconds: no total at all
    assert all(total is None and message.startswith("running") for _, total, message in seen[:len(seen) - len(stepped)]), seen


def test_a_cancelled_wait_for_run_returns_within_a_fraction_of_its_poll_interval(tmp_path):
    """wait_for_run on a SLURM run polls every 10 s; a call cancelled meanwhile (its client left, or SIGTERM) slept
    out the whole interval before it noticed (7.8 s measured at SIGTERM). Now it stops within a fraction of a second."""
    import threading

    from quanteval.models import ToolError, cancellable_by

    record = ledger.add("canary", status="running", executor="slurm", invocation_id="nel-next:/cluster/run",
                        details={"engine": "nel-next", "run_dir": "/cluster/run", "tasks": ["sums"], "slurm_jobs": [
                            {"hostname": "nowhere.invalid", "username": "u", "remote_dir": "/cluster/run", "job_id": 7}]})
    cancel_at = time.monotonic() + 1.0

    def check() -> None:
        if time.monotonic() > cancel_at:
            raise ToolError("cancelled")

    ended: list[float] = []

    def wait() -> None:
        with cancellable_by(check), contextlib.suppress(ToolError):
            runs.wait_for_run(runs.WaitForRunInput(record_id=record.id, timeout_s=30))
        ended.append(time.monotonic())

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    waiter.join(20)
    assert ended and ended[0] - cancel_at < 1.0, (ended and ended[0] - cancel_at)
