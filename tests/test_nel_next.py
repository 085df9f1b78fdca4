"""nel-next through the workflow when things go wrong: the real `nel eval run` (nel-next's venv) against the
inference stand-in (it answers instantly, so these stay fast; the real vLLM runs in test_evaluate_real.py).

A benchmark failing inside `nel eval run` fails the run, never passes it; an output directory that cannot be
written is a clear error before any server starts; SIGTERM mid-evaluation stops the servers, marks the run
cancelled, and a second call resumes from what finished.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import next_config_against
from next_runs import standin_server
from processes import own_state_dir, running_with, wait_until
from tiers import BENCH, REPO, requires

from quanteval import ledger
from quanteval.engines.nel_next import nel_cli, nelnext
from quanteval.models import ToolError
from quanteval.workflow.evaluate import EvaluateQuantizationInput, evaluate_quantization

STANDIN = REPO / "tests" / "standins" / "fake_inference_server.py"
BF16 = REPO / "examples" / "checkpoints" / "tiny-add-bf16"
W8A8 = REPO / "examples" / "checkpoints" / "tiny-add-w8a8"

pytestmark = requires("nel-next")

BROKEN_BENCH = '''
from pathlib import Path
from nemo_evaluator.environments.custom import benchmark, scorer

@benchmark(name="broken", dataset=str(Path(__file__).with_name("broken.jsonl")), prompt="{question}", target_field="answer")
@scorer
def broken(sample):
    raise RuntimeError("scorer bug: every sample fails")
'''


@pytest.fixture
def standin_vllm(monkeypatch) -> str:
    # answering the sums: a canary whose every answer is wrong is suspect, and neither the gate nor evaluate goes on
    launcher = shlex.join([sys.executable, str(STANDIN), "--fake-load-s", "0.2", "--fake-answers", "sum"])
    monkeypatch.setenv("QUANTEVAL_VLLM_LAUNCHER", launcher)
    monkeypatch.setenv("NEMO_EVALUATOR_TELEMETRY_LEVEL", "0")
    return launcher


def _standins_running() -> list[str]:
    return running_with(str(STANDIN), str(BF16.parent), state_dir=own_state_dir())


PROXY_PORT = """
import runpy, sys
if sys.argv[1] == "quanteval":
    runpy.run_path(sys.argv[2], run_name="launched")["own_proxy_port"]()  # what nel_command runs before nel's CLI
from nemo_evaluator.adapters import proxy
print(proxy._find_free_port(4000))
"""


def test_each_local_run_puts_its_adapter_proxy_on_a_port_of_its_own():
    """nel-next alone probes 127.0.0.1:4000 and binds it later: two runs at once on one host both take it, and the
    loser sends its requests to the winner's proxy (its model's answers scored as the loser's). Runs quanteval starts
    take a port from the OS instead."""
    import socket

    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", 4000))
        except OSError:
            pytest.skip("127.0.0.1:4000 is taken here: nel-next alone would not pick it either")
    python, _p, launcher = nelnext.nel_command()[:3]

    def port(how: str) -> int:
        done = subprocess.run([python, "-P", "-c", PROXY_PORT, how, launcher], capture_output=True, text=True,
                              env=nelnext.child_env(), timeout=120, check=True)
        return int(done.stdout.split()[-1])

    assert port("nel alone") == 4000  # the shared port the race is for
    assert port("quanteval") not in (4000, port("quanteval"))


SLURM_CONFIG = """
services:
  model: {{type: vllm, model: /models/m, served_model_name: m, protocol: chat_completions, port: 8123,
          startup_timeout: 600,
          pre_cmd: exec vllm serve /models/m --port 8123}}
benchmarks:
  - {{name: {bench}, solver: {{type: simple, service: model}}, max_problems: 10}}
cluster: {{type: slurm, hostname: login, walltime: "00:30:00", node_pools: {{default: {{partition: debug, nodes: 1}}}}}}
output: {{dir: {out}, timestamped: false}}
"""


def test_each_slurm_job_quanteval_submits_puts_its_proxy_on_a_port_of_its_own(tmp_path):
    """Inside a SLURM job nel-next's script runs the node's plain `nel`, whose proxy takes 127.0.0.1:4000: two jobs on
    one node (a baseline and a candidate sharing its GPUs) raced for it, and one side's requests went to the other's
    model or nowhere (CI: 200 of 200 infra_error). The script quanteval's `nel` writes defines a `nel` that picks a
    port from the OS, with the node's own Python, and polls its server's health every second on the same budget."""
    config = tmp_path / "config.yaml"
    config.write_text(SLURM_CONFIG.format(bench=BENCH, out=tmp_path / "out"))
    done = subprocess.run([*nelnext.nel_command(), "eval", "run", str(config), "--dry-run"], capture_output=True,
                          text=True, env=nelnext.child_env(), cwd=tmp_path, timeout=120, check=True)
    script = Path(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("Generated:"))).read_text()
    assert "seq 1 $(( 120 * 5 ))" in script and "    sleep 1\ndone" in script  # 600 s either way
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    function = script[script.index("# quanteval: nel-next"):script.index("\nnel eval run ")]
    job = f"""{function}
nel --help | head -1
cli=$(type -P nel); "${{cli%/*}}/python" -P -c "${{_QUANTEVAL_NEL%%if __name__*}}
own_proxy_port()
from nemo_evaluator.adapters import proxy
print('proxy port', proxy._find_free_port(4000))"
"""
    ran = subprocess.run(["bash", "-c", job], capture_output=True, text=True, timeout=120,
                         env={**nelnext.child_env(), "PATH": f"{nelnext.venv() / 'bin'}:/usr/bin:/bin"})
    assert ran.stdout.startswith("Usage: nel "), ran.stderr
    assert int(ran.stdout.split("proxy port")[1]) != 4000


STUB_NEL = """#!/bin/bash
echo "$* | ${NEL_OUTPUT_DIR:-}" >> "$STUB_CALLS"
"""


def _held_job(tmp_path: Path, wait_s: int) -> tuple[subprocess.Popen, Path, Path]:
    """A canary's job at the end of its benchmarks, as nel-next's script reaches `nel eval report` with quanteval's
    `nel` function (a stub `nel` on the PATH stands for nel-next, recording its calls)."""
    bin_dir, out = tmp_path / "bin", tmp_path / "canary"
    bin_dir.mkdir()
    (out / "logs").mkdir(parents=True)
    (bin_dir / "nel").write_text(STUB_NEL)
    (bin_dir / "nel").chmod(0o755)
    function = nel_cli.JOB_NEL.format(source="", end=nel_cli.END_OF_SOURCE, wait=nel_cli.WAIT_VARIABLE,
                                      done=nel_cli.DONE_FILE, claim=nel_cli.CLAIM_DIR, next=nel_cli.NEXT_FILE)
    calls = tmp_path / "calls"
    job = subprocess.Popen(["bash", "-c", f'{function}\nnel eval report "$OUTPUT_DIR" -f markdown'], text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={
                               "PATH": f"{bin_dir}:/usr/bin:/bin", "OUTPUT_DIR": str(out), "SLURM_JOB_ID": "7",
                               "NEL_EXIT_CODE": "0", nel_cli.WAIT_VARIABLE: str(wait_s), "STUB_CALLS": str(calls)})
    return job, out, calls


def test_a_canary_job_serves_on_for_the_full_run_quanteval_names_and_ends_when_none_comes(tmp_path):
    """A cluster evaluation's canary job keeps its server once its benchmarks are done: quanteval writes the full
    run's configs (nel-next's own, from its dry-run) and names their directory; the job evaluates them against the
    same server and ends. One server start per side instead of one per run (the cluster ratio 1.33x -> 0.9x). A job
    that hears nothing ends by itself, and a word that comes too late is not written where nobody reads it."""
    config = tmp_path / "config.yaml"
    full = tmp_path / "full-run"
    config.write_text(SLURM_CONFIG.format(bench=BENCH, out=full))
    job, out, calls = _held_job(tmp_path, wait_s=60)
    wait_until(lambda: (out / nel_cli.DONE_FILE).is_file(), 30, "the canary's job to say its run is over")
    assert (out / nel_cli.DONE_FILE).read_text().strip() == "0" and job.poll() is None  # serving on
    cluster_job = {"job_id": "7", "hostname": "local", "username": None, "remote_dir": str(out),
                   "done_file": nel_cli.DONE_FILE}
    held = ledger.add("canary", status="succeeded", details={"slurm_jobs": [cluster_job]})
    record = ledger.add("full_run", status="launching")
    continued = nelnext.continue_in_job(record, held, str(config), [f"output.dir={full}"],
                                        {"output": {"dir": str(full)}}, {})
    assert continued is not None and continued.details["slurm_jobs"] == [
        {"job_id": "7", "hostname": "local", "username": None, "remote_dir": str(full)}]
    said, _ = job.communicate(timeout=60)
    assert job.returncode == 0, said
    name = BENCH.name.replace(".", "_")
    ran = calls.read_text().splitlines()
    assert ran[0].startswith(f"eval run {full}/config_") and ran[0].endswith(f" | {full}/{ran[0].split('config_')[1].split('.yaml')[0]}")
    assert ran[1:] == [f"eval report {full} -f markdown -o {full}/report.md | ", f"eval report {out} -f markdown | "], ran
    assert name in ran[0] and "not submitted; this run ran in SLURM job 7" in (full / "nel_eval.sbatch").read_text()
    assert list((full / "logs").glob("eval-*-7.log"))

    # nobody names a next run: the job stops waiting and ends, and a word after that is refused, not left unread
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    job, out, calls = _held_job(quiet, wait_s=1)
    said, _ = job.communicate(timeout=30)
    assert job.returncode == 0 and "no next run" in said and calls.read_text().splitlines() == [
        f"eval report {out} -f markdown | "]
    late = nelnext.continue_in_job(ledger.add("full_run", status="launching"), ledger.add(
        "canary", status="succeeded", details={"slurm_jobs": [{**cluster_job, "remote_dir": str(out)}]}), str(config),
        [f"output.dir={full}"], {"output": {"dir": str(full)}}, {})
    assert late is None and not (out / nel_cli.NEXT_FILE).exists()

    # a canary that failed (or kill_run of it): its job is told no next run comes, and ends now
    failed = tmp_path / "failed"
    failed.mkdir()
    job, out, calls = _held_job(failed, wait_s=600)
    wait_until(lambda: (out / nel_cli.DONE_FILE).is_file(), 30, "the canary's job to say its run is over")
    canary = ledger.add("canary", status="failed", details={"slurm_jobs": [{**cluster_job, "remote_dir": str(out)}]})
    assert nelnext.release_hold(canary) and not nelnext.release_hold(canary)  # told once
    said, _ = job.communicate(timeout=30)
    assert "no next run" in said and calls.read_text().splitlines() == [f"eval report {out} -f markdown | "]


@requires("slow")  # whole nel-next runs: 25-90 s
def test_a_benchmark_failing_inside_nel_eval_run_fails_the_canary_and_nothing_runs_after_it(standin_vllm, tmp_path):
    bench = tmp_path / "broken.py"
    bench.write_text(BROKEN_BENCH)
    (tmp_path / "broken.jsonl").write_text("".join(json.dumps({"question": f"{i}+1", "answer": str(i + 1)}) + "\n" for i in range(20)))
    with pytest.raises(ToolError, match="canary") as failure:
        evaluate_quantization(EvaluateQuantizationInput(
            baseline_checkpoint=str(BF16), candidate_checkpoint=str(W8A8), benchmarks=[str(bench)],
            output_dir=str(tmp_path / "out"), canary_problems=5))
    assert "broken" in str(failure.value)
    canaries = ledger.find(kind="canary")
    assert [c.status for c in canaries] == ["failed"]  # whatever nel's exit code, checkpoint.json says it failed
    assert ledger.find(kind="full_run") == []  # the gate held: no full run after a failed canary
    assert all(d.status == "stopped" for d in ledger.find(kind="deployment"))
    assert _standins_running() == []


def test_an_output_directory_that_cannot_be_written_is_refused_before_any_server_starts(standin_vllm, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(ToolError, match="output_dir"):
        evaluate_quantization(EvaluateQuantizationInput(
            baseline_checkpoint=str(BF16), candidate_checkpoint=str(W8A8), benchmarks=[str(BENCH)],
            output_dir=str(blocker / "results")))
    assert ledger.find(kind="deployment") == []
    assert blocker.read_text() == "not a directory"


@requires("slow")  # whole nel-next runs: 25-90 s
def test_sigterm_mid_evaluation_cancels_stops_the_servers_and_a_second_call_resumes(standin_vllm, tmp_path, cli_env):
    env = {**cli_env, "QUANTEVAL_VLLM_LAUNCHER": standin_vllm, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0",
           "QUANTEVAL_STATE_DIR": os.environ["QUANTEVAL_STATE_DIR"]}
    env.pop("QUANTEVAL_LEDGER", None)
    argv = ["quanteval", "evaluate", str(BF16), str(W8A8), "--benchmarks", str(BENCH), "--output-dir", str(tmp_path / "out")]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    seen = []
    assert child.stderr is not None
    for line in child.stderr:  # progress lines; stop once the candidate's full run is under way
        seen.append(line)
        if "candidate full run" in line or time.monotonic() > deadline:
            break
    assert any("candidate full run" in line for line in seen), "".join(seen)[-2000:]
    child.send_signal(signal.SIGTERM)
    child.communicate(timeout=120)
    assert child.returncode not in (0, 3, 4)  # no verdict from an interrupted evaluation
    full_runs = {r.details.get("checkpoint"): r for r in ledger.find(kind="full_run")}
    assert full_runs[str(BF16)].status == "succeeded"
    assert full_runs[str(W8A8)].status == "cancelled"
    assert all(d.status == "stopped" for d in ledger.find(kind="deployment"))
    assert _standins_running() == []

    # the same evaluation under the user's margin (the rule is not part of what is reused): 0, acceptable
    second = subprocess.run([*argv, "--max-drop", "5", "--json"], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert second.returncode == 0, second.stderr[-2000:]
    result = json.loads(second.stdout)
    assert result["baseline"]["reused"] and not result["candidate"]["reused"]
    assert result["baseline"]["full_run_record_id"] == full_runs[str(BF16)].id


@requires("slow")  # a canary and part of a full run through the stand-in
@pytest.mark.parametrize("victim", ["quanteval evaluate", "quanteval-mcp"])
def test_sigkill_of_the_process_that_serves_an_evaluation_leaves_no_server(tmp_path, cli_env, victim):
    """`kill -9` runs no cleanup of its own: the servers and nel-next runs an evaluation started watch their owner and
    stop within seconds of its death (their process groups, the stand-in's two worker processes included), from the
    CLI or an MCP server that ran evaluate_quantization itself."""
    launcher = shlex.join([sys.executable, str(STANDIN), "--fake-load-s", "0.2", "--fake-answers", "sum",
                           "--fake-workers", "2", "--fake-answer-s", "0.5"])
    env = {**cli_env, "QUANTEVAL_VLLM_LAUNCHER": launcher, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0",
           "QUANTEVAL_STATE_DIR": os.environ["QUANTEVAL_STATE_DIR"]}
    arguments = {"baseline_checkpoint": str(BF16), "candidate_checkpoint": str(W8A8), "benchmarks": [str(BENCH)],
                 "output_dir": str(tmp_path / "out")}
    if victim == "quanteval evaluate":
        child = subprocess.Popen(["quanteval", "evaluate", str(BF16), str(W8A8), "--benchmarks", str(BENCH), "--output-dir",
                                  arguments["output_dir"]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    else:
        child = subprocess.Popen(["quanteval-mcp"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        assert child.stdin is not None
        for message in ({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}},
                        {"jsonrpc": "2.0", "method": "notifications/initialized"},
                        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "evaluate_quantization", "arguments": arguments}}):
            child.stdin.write((json.dumps(message) + "\n").encode())
        child.stdin.flush()
    deadline = time.monotonic() + 180
    while not ledger.find(kind="full_run", status="running"):
        assert child.poll() is None and time.monotonic() < deadline, "no full run started"
        time.sleep(0.5)
    assert _standins_running(), "a server is serving the run"
    child.kill()
    child.wait(timeout=10)
    def left() -> list[str]:  # its servers, and its nel-next runs (which would retry against the dead servers for long)
        return [*_standins_running(), *running_with("nel", "eval", "run", str(tmp_path))]

    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left() == []
    # and nothing it recorded still says loading, ready or running where a user looks for what runs
    from quanteval.workflow.runs import ListRunsInput, list_runs

    live = [(run.kind, run.status) for run in list_runs(ListRunsInput(limit=100)).runs if run.status in ("loading", "ready", "running")]
    assert live == []
    # its servers ended with it, and say so (not "failed": nothing went wrong with them)
    servers = [(run.record_id, run.status) for run in list_runs(ListRunsInput(limit=100)).runs if run.kind == "deployment"]
    assert servers and all(status in ("stopped", "cancelled") for _, status in servers), servers


def test_wait_for_run_returns_when_the_canary_finishes_and_at_once_when_it_has(tmp_path, monkeypatch):
    """Over a real MCP session: the assistant waits in one call instead of polling run_status."""
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server
    from quanteval.workflow.nelconfig import BuildConfigInput, SetConfigValueInput, build_config, set_config_value
    from quanteval.workflow.runs import LaunchCanaryInput, launch_canary

    monkeypatch.setenv("NEMO_EVALUATOR_TELEMETRY_LEVEL", "0")
    with standin_server("--model", str(BF16), "--served-model-name", "tiny", "--max-model-len", "256") as port:
        config = build_config(BuildConfigInput(engine="nel-next", execution="local", deployment="none", model_type="chat_reasoning",
                                               benchmarks=[str(BENCH)], config_path=str(tmp_path / "eval.yaml"))).config_path
        for key, value in {"services.model.url": f"http://127.0.0.1:{port}/v1/chat/completions",
                           "services.model.model": "tiny", "services.model.generation.max_tokens": 16}.items():
            set_config_value(SetConfigValueInput(config_path=config, key=key, value=value))
        launched = launch_canary(LaunchCanaryInput(config_path=config, limit_samples=5))

        async def go():
            async with Client(build_server()) as client:
                started = time.monotonic()
                first = await client.call_tool("wait_for_run", {"record_id": launched.record_id, "timeout_s": 120})
                waited = time.monotonic() - started
                started = time.monotonic()
                again = await client.call_tool("wait_for_run", {"record_id": launched.record_id, "timeout_s": 120})
                return first, waited, again, time.monotonic() - started

        first, waited, again, instant = anyio.run(go)
    assert not first.is_error, first.content[0].text
    assert first.structured_content["status"] == "succeeded" and waited < 110  # returned at the change, not the timeout
    assert again.structured_content["status"] == "succeeded" and instant < 5  # a finished run: no wait at all


@requires("slow")  # whole nel-next runs: 25-90 s
def test_a_base_model_is_evaluated_through_the_completions_endpoint(standin_vllm, tmp_path):
    """No chat template: the chat endpoint would refuse every request, so the config asks /v1/completions."""
    import shutil

    import yaml

    base = tmp_path / "tiny-add-base"
    shutil.copytree(BF16, base)
    tokenizer_config = json.loads((base / "tokenizer_config.json").read_text())
    del tokenizer_config["chat_template"]
    (base / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    result = evaluate_quantization(EvaluateQuantizationInput(
        baseline_checkpoint=str(base), candidate_checkpoint=str(W8A8), benchmarks=[str(BENCH)],
        output_dir=str(tmp_path / "out"), canary_problems=3, max_problems=20))
    base_config = yaml.safe_load(Path(result.baseline.config_path).read_text())["services"]["model"]
    candidate_config = yaml.safe_load(Path(result.candidate.config_path).read_text())["services"]["model"]
    assert base_config["protocol"] == "completions" and base_config["url"].endswith("/v1/completions")
    assert candidate_config["protocol"] == "chat_completions" and candidate_config["url"].endswith("/v1/chat/completions")


def test_a_run_whose_wrapper_finishes_between_the_two_reads_is_not_taken_for_killed(tmp_path, monkeypatch):
    """exit_code reads the wrapper's file, then looks for the process group. The wrapper can write its code and exit
    in between (seen in CI: a run that completed recorded as killed, -9): the file is read again once the group is gone."""
    from quanteval import localproc
    from quanteval.clusters.executor import LOCAL

    def wrapper_finishes_now(pgid: int) -> list[int]:
        (tmp_path / nelnext.EXIT_CODE_NAME).write_text("0\n")
        return []

    job = nelnext.local_job({"pid": -1, "pgid": 999999, "run_dir": str(tmp_path)})
    monkeypatch.setattr(localproc, "group_members", wrapper_finishes_now)
    assert LOCAL.exit_code(job) == 0
    (tmp_path / nelnext.EXIT_CODE_NAME).unlink()
    monkeypatch.setattr(localproc, "group_members", lambda pgid: [])
    assert LOCAL.exit_code(job) == -9  # gone without a code: killed
    assert (LOCAL.states([job])[0].status, LOCAL.states([job])[0].note) == ("failed", "killed (no exit code)")


def _dead_endpoint_config(tmp_path: Path) -> str:
    """A nel-next config of the tiny_add benchmark against a closed port: every request fails at once."""
    return next_config_against(tmp_path, "http://127.0.0.1:9/v1/chat/completions")


@requires("slow")  # whole nel-next runs: 25-90 s
def test_a_canary_whose_requests_all_failed_does_not_open_the_gate(tmp_path):
    """nel-next 0.3.0 finishes a run against a dead endpoint with exit 0, a score of 0 and runtime.model_errors 0: the
    failed requests are only in its failure report (infra_error). validate_run counts them, so the canary does not
    pass and the full run is refused, instead of a 0 that would read as a total accuracy loss."""
    from quanteval.workflow.results import ValidateRunInput, validate_run
    from quanteval.workflow.runs import LaunchCanaryInput, LaunchFullRunInput, WaitForRunInput, launch_canary, launch_full_run, wait_for_run

    config = _dead_endpoint_config(tmp_path)
    canary = launch_canary(LaunchCanaryInput(config_path=config, limit_samples=1))
    assert wait_for_run(WaitForRunInput(record_id=canary.record_id, timeout_s=240)).status == "succeeded"  # nel-next's own view
    report = validate_run(ValidateRunInput(run=canary.record_id))
    assert report.verdict == "fail" and "infra_error 1" in report.reasons[0], report.reasons
    with pytest.raises(ToolError, match="requests got no answer"):
        launch_full_run(LaunchFullRunInput(config_path=config))


@requires("slow")  # whole nel-next runs: 25-90 s
def test_a_shard_in_quantevals_environment_does_not_shard_its_runs_and_a_shard_run_is_named_as_one(tmp_path, monkeypatch):
    """nel-next evaluates one shard when NEL_SHARD_IDX/NEL_TOTAL_SHARDS (or a SLURM array task's variables) are set,
    and reports the run complete. quanteval run inside a SLURM array job: its runs are still the whole benchmark. A run
    made with them by hand is refused by validate_run, naming the shard and the merge."""
    from quanteval.workflow.results import ValidateRunInput, validate_run
    from quanteval.workflow.runs import LaunchCanaryInput, WaitForRunInput, launch_canary, wait_for_run

    for variable, value in (("NEL_SHARD_IDX", "0"), ("NEL_TOTAL_SHARDS", "2"), ("SLURM_ARRAY_TASK_ID", "0"),
                            ("SLURM_ARRAY_TASK_COUNT", "2")):
        monkeypatch.setenv(variable, value)
    config = _dead_endpoint_config(tmp_path)
    canary = launch_canary(LaunchCanaryInput(config_path=config, limit_samples=6))
    assert wait_for_run(WaitForRunInput(record_id=canary.record_id, timeout_s=240)).status == "succeeded"
    assert [task.evaluated_samples for task in validate_run(ValidateRunInput(run=canary.record_id)).tasks] == [6]

    by_hand = tmp_path / "by-hand"
    done = subprocess.run([str(nelnext.nel_binary()), "eval", "run", config, "-O", f"output.dir={by_hand}",
                           "-O", "benchmarks.0.max_problems=6"], capture_output=True, text=True, timeout=240, check=False,
                          env={**os.environ, "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    report = validate_run(ValidateRunInput(run=str(by_hand)))
    assert report.verdict == "fail"
    assert any("3 of 6 samples evaluated: the bundle is shard 0 of 2" in reason and "nel eval merge" in reason
               for reason in report.reasons), report.reasons


@requires("slow")  # whole nel-next runs: 25-90 s
def test_sampled_repeats_reach_both_runs_and_the_answer_shows_them_with_the_release_facts(standin_vllm, tmp_path):
    """repeats, temperature and top_p are set identically on both sides; the stand-in answers every sample alike, so
    the sampled repeats are named as copies and counted once; the answer carries each side's answer length,
    truncation and failures with their denominators, tokens/s and the weight bytes W8A8 saved."""
    import yaml

    said: list[str] = []
    result = evaluate_quantization(EvaluateQuantizationInput(
        baseline_checkpoint=str(BF16), candidate_checkpoint=str(W8A8), benchmarks=[str(BENCH)], output_dir=str(tmp_path / "out"),
        canary_problems=3, max_problems=20, repeats=3, temperature=0.7, top_p=0.9, max_drop=5),
        lambda done, total=None, message=None: said.append(message or ""))
    for side in (result.baseline, result.candidate):
        config = yaml.safe_load(Path(side.config_path).read_text())
        assert config["services"]["model"]["generation"] | {"max_tokens": None} == {"temperature": 0.7, "top_p": 0.9, "max_tokens": None}
        assert [b["repeats"] for b in config["benchmarks"]] == [3]
    assert any("20 problems x 3 repeats" in message for message in said[:3])  # said before anything was served
    (row,) = result.comparisons
    assert row.repeats == 1 and "3 repeats are copies" in row.why
    (check,) = result.outputs
    assert check.baseline.samples == check.candidate.samples == 60 and check.copies == ["baseline", "candidate"]
    assert check.candidate.truncated.said == "truncated: 0/60 (0.0%)" and check.candidate.failed.said == "failed: 0/60 (0.0%)"
    assert check.candidate.tokens_per_second and check.candidate.measured_on == "measured on vllm CPU; GPU kernels differ"
    assert result.weights is not None and result.weights.ratio < 0.75 and not result.weights.size_not_reduced


@requires("slow")  # whole nel-next runs: 25-90 s
def test_the_noise_floors_server_loads_while_the_candidate_runs_and_progress_only_goes_forward(standin_vllm, tmp_path):
    """The noise floor (the baseline on the other numeric path) is a third server: it loads beside the candidate's
    runs, as the candidate's loads beside the baseline's, never three at a time; its runs follow the candidate's."""
    steps: list[tuple[float, str]] = []
    result = evaluate_quantization(EvaluateQuantizationInput(
        baseline_checkpoint=str(BF16), candidate_checkpoint=str(W8A8), benchmarks=[str(BENCH)], output_dir=str(tmp_path / "out"),
        canary_problems=3, max_problems=20, noise_floor=True),
        lambda done, total=None, message=None: steps.append((done, message or "")))
    floor = result.noise_floor_run
    assert floor is not None and floor.serving is not None and floor.serving.numerics == "eager"
    assert floor.seconds["serve_beside_candidate"] > 0, floor.seconds
    assert any("noise-floor: starting vllm on tiny-add-bf16 while the candidate runs" in said for _, said in steps), steps
    (row,) = result.noise_floor
    assert row.serving_flips == 0 and row.message in result.reasons
    assert [done for done, _ in steps] == sorted(done for done, _ in steps)  # comparing comes after the floor's steps
    deployments = ledger.find(kind="deployment")
    assert len(deployments) == 3 and all(record.status == "stopped" for record in deployments)
