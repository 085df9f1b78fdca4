"""`quanteval-mcp --root DIR` stops at what a config sends a launch to, not only at the arguments: an output directory,
checkpoint, mount or benchmark file outside the root is refused naming its key, for both engines, and nothing is
written outside. Over a real MCP session (the SDK's in-process client), as an IDE connects."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from tiers import BENCH, REPO

from quanteval.faces.server import build_server
from quanteval.models import ToolError

CHECKPOINT = REPO / "examples" / "checkpoints" / "tiny-add-bf16"


def calls(root: Path, *steps: tuple[str, dict]) -> list:
    async def go():
        async with Client(build_server(root=root)) as client:
            return [await client.call_tool(name, arguments) for name, arguments in steps]

    return anyio.run(go)


def _refused(result, key: str) -> None:
    assert result.is_error, result.structured_content
    text = result.content[0].text
    assert key in text and "outside the workspace root" in text, text


@pytest.fixture
def workspace(tmp_path: Path) -> tuple[Path, Path]:
    inside, outside = tmp_path / "workspace", tmp_path / "elsewhere"
    inside.mkdir()
    return inside, outside


def _nel_config(inside: Path, output_dir: Path) -> dict:
    config = str(inside / "eval.yaml")
    return {"steps": [("build_config", {"execution": "local", "deployment": "vllm", "model_type": "base", "benchmarks": ["general_knowledge"],
                                        "config_path": config}),
                      ("set_config_value", {"config_path": config, "key": "execution.output_dir", "value": str(output_dir)})],
            "config": config}


def test_a_nel_config_whose_output_dir_is_outside_is_refused_and_nothing_is_written_there(workspace):
    inside, outside = workspace
    nel = _nel_config(inside, outside / "results")
    *_, dry, canary, override = calls(inside, *nel["steps"], ("dry_run", {"config_path": nel["config"]}),
                                      ("launch_canary", {"config_path": nel["config"]}),
                                      ("set_config_value", {"config_path": nel["config"], "key": "execution.output_dir", "value": str(inside / "results")}))
    _refused(dry, "execution.output_dir")
    _refused(canary, "execution.output_dir")
    assert not outside.exists()
    assert not override.is_error
    # inside now, but an override sends it out again
    (by_override,) = calls(inside, ("launch_full_run", {"config_path": nel["config"], "overrides": [f"execution.output_dir={outside}"]}))
    _refused(by_override, "execution.output_dir")
    assert not outside.exists()


def test_a_checkpoint_or_a_docker_mount_outside_the_root_is_refused(workspace):
    inside, outside = workspace
    nel = _nel_config(inside, inside / "results")
    config = nel["config"]
    *_, checkpoint, _, mount = calls(
        inside, *nel["steps"],
        ("set_config_value", {"config_path": config, "key": "deployment.checkpoint_path", "value": str(CHECKPOINT)}),
        ("dry_run", {"config_path": config}),
        ("set_config_value", {"config_path": config, "key": "deployment.checkpoint_path", "value": str(inside)}),
        ("launch_canary", {"config_path": config, "overrides": ["++execution.extra_docker_args=-v /:/host"]}))
    _refused(checkpoint, "deployment.checkpoint_path")
    assert mount.is_error and "-v/--volume/--mount" in mount.content[0].text


def _built_next_config(inside: Path) -> tuple[str, tuple]:
    """build_config's step for a nel-next config inside the root, its benchmark file inside too."""
    config = str(inside / "next.yaml")
    bench = inside / "tiny_add.py"
    bench.write_text(BENCH.read_text())
    return config, ("build_config", {"engine": "nel-next", "execution": "local", "deployment": "none", "model_type": "base",
                                     "benchmarks": [str(bench)], "config_path": config})


def test_a_nel_next_config_is_confined_too_output_dir_and_byob_file(workspace):
    inside, outside = workspace
    config, build = _built_next_config(inside)
    steps = [build,
             ("set_config_value", {"config_path": config, "key": "output.dir", "value": str(outside)}),
             ("launch_canary", {"config_path": config}),
             ("set_config_value", {"config_path": config, "key": "output.dir", "value": str(inside / "results")}),
             ("set_config_value", {"config_path": config, "key": "benchmarks[0].name", "value": str(BENCH)}),
             ("launch_canary", {"config_path": config})]
    results = calls(inside, *steps)
    assert not results[0].is_error, results[0].content[0].text
    _refused(results[2], "output.dir")
    _refused(results[5], "benchmarks[0].name")
    assert not outside.exists()


def test_arguments_that_are_lists_of_benchmark_files_and_a_deployment_plan_are_confined(workspace):
    inside, _ = workspace
    from quanteval.serving.deploy import PlanDeploymentInput, plan_deployment

    # a real plan, made outside the rooted server, then sent whole to it (a client can send any plan)
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(CHECKPOINT), framework="vllm", check_args=False)).model_dump(mode="json")
    evaluate, deploy = calls(inside, ("evaluate_quantization", {"baseline_checkpoint": str(inside), "candidate_checkpoint": str(inside),
                                                                "benchmarks": [str(BENCH)]}),
                             ("launch_deployment", {"plan": plan}))
    _refused(evaluate, "benchmarks[0]")
    _refused(deploy, "plan.checkpoint")


def test_slurm_paths_are_on_the_cluster_and_not_confined(tmp_path):
    from quanteval.engines import launchplan

    nel = tmp_path / "nel.yaml"
    nel.write_text("defaults:\n  - execution: slurm/default\n  - deployment: none\n  - _self_\n"
                   "execution:\n  output_dir: /lustre/me/results\n  hostname: login\n  account: a\n"
                   "target:\n  api_endpoint:\n    url: http://x/v1/chat/completions\n    model_id: m\n"
                   "evaluation:\n  tasks:\n    - name: ifeval\n")
    plan = launchplan.plan(nel)
    assert plan.engine.name == "nel" and plan.engine.run.launch_paths(plan) == []
    nel_next = tmp_path / "next.yaml"
    nel_next.write_text("services:\n  model:\n    type: api\n    url: http://x/v1/chat/completions\n    protocol: chat_completions\n"
                        "benchmarks:\n  - name: /x/b.py\n    solver:\n      type: simple\n      service: model\n"
                        "cluster:\n  type: slurm\n  hostname: login\n  account: a\noutput:\n  dir: /x\n")
    plan = launchplan.plan(nel_next)
    assert plan.engine.name == "nel-next" and plan.engine.run.launch_paths(plan) == []


# ---------------------------------------------------------------- interpolations, overrides, BYOB forms


def test_a_nel_interpolation_or_override_that_resolves_outside_is_refused_and_dry_run_writes_nothing_there(workspace, monkeypatch):
    inside, outside = workspace
    monkeypatch.delenv("QE_UNSET_DIR", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_confinement_test_value")
    nel = _nel_config(inside, inside / "results")
    config = nel["config"]
    sneaky = f"${{oc.env:QE_UNSET_DIR,{outside}}}/x"
    results = calls(
        inside, *nel["steps"],
        ("set_config_value", {"config_path": config, "key": "execution.output_dir", "value": sneaky}),
        ("dry_run", {"config_path": config}),
        ("set_config_value", {"config_path": config, "key": "execution.output_dir", "value": str(inside / "results")}),
        ("set_config_value", {"config_path": config, "key": "deployment.checkpoint_path", "value": f"${{oc.env:QE_UNSET_DIR,{CHECKPOINT}}}"}),
        ("dry_run", {"config_path": config}),
        ("set_config_value", {"config_path": config, "key": "deployment.checkpoint_path", "value": str(inside)}),
        ("dry_run", {"config_path": config, "overrides": [f"execution.output_dir={sneaky}"]}),
        ("dry_run", {"config_path": config, "overrides": ["++deployment.cache_path=${oc.env:QE_UNSET_DIR}"]}),
        ("set_config_value", {"config_path": config, "key": "deployment.checkpoint_path", "value": f"{inside}/$(touch {outside})"}),
        ("dry_run", {"config_path": config}))
    output_dir, checkpoint, override, unresolvable, shell = (results[i] for i in (3, 6, 8, 9, 11))
    _refused(output_dir, "execution.output_dir")
    _refused(checkpoint, "deployment.checkpoint_path")
    _refused(override, "execution.output_dir")
    assert unresolvable.is_error and "deployment.cache_path" in unresolvable.content[0].text and "cannot resolve" in unresolvable.content[0].text
    assert shell.is_error and "deployment.checkpoint_path" in shell.content[0].text and "shell" in shell.content[0].text
    assert not outside.exists()  # no scripts, no .secrets.env


@pytest.mark.slow
def test_nel_dry_run_over_the_root_renders_inside_when_the_interpolation_resolves_inside(workspace, monkeypatch):
    inside, outside = workspace
    monkeypatch.setenv("QE_RESULTS_DIR", str(inside / "results"))
    monkeypatch.setenv("HF_TOKEN", "hf_confinement_test_value")
    nel = _nel_config(inside, outside)
    shutil.copytree(CHECKPOINT, inside / CHECKPOINT.name)
    *_, missing, _, dry = calls(inside, *nel["steps"],
                       ("apply_checkpoint", {"config_path": nel["config"], "checkpoint": str(inside / CHECKPOINT.name)}),
                       ("set_config_value", {"config_path": nel["config"], "key": "evaluation.nemo_evaluator_config.config.params.extra.tokenizer",
                                             "value": "/checkpoint"}),
                       ("list_missing_values", {"config_path": nel["config"]}),
                       ("set_config_value", {"config_path": nel["config"], "key": "execution.output_dir",
                                             "value": f"${{oc.env:QE_RESULTS_DIR,{outside}}}"}),
                       ("dry_run", {"config_path": nel["config"]}))
    assert not dry.is_error, dry.content[0].text
    assert dry.structured_content["ok"], (dry.structured_content["error"], missing.structured_content)
    assert Path(dry.structured_content["invocation_dir"]).is_relative_to(inside)
    assert not outside.exists()


@pytest.fixture
def next_config(workspace) -> tuple[str, list]:
    """A nel-next config inside the root that nel-next accepts, with its benchmark file inside too."""
    inside, _ = workspace
    config, build = _built_next_config(inside)
    steps = [build,
             ("set_config_value", {"config_path": config, "key": "services.model.url", "value": "http://127.0.0.1:9/v1/chat/completions"}),
             ("set_config_value", {"config_path": config, "key": "output.dir", "value": str(inside / "results")})]
    return config, steps


def _evil(outside: Path) -> Path:
    """A benchmark file outside the root that leaves a mark when imported."""
    outside.mkdir(exist_ok=True)
    evil = outside / "evil.py"
    evil.write_text(f"open({str(outside / 'imported')!r}, 'w').close()\n" + BENCH.read_text().replace('"tiny_add"', '"evil"'))
    return evil


def test_nel_next_output_dir_and_byob_files_are_checked_after_expansion_and_overrides(workspace, next_config, monkeypatch):
    inside, outside = workspace
    config, steps = next_config
    evil = _evil(outside)
    monkeypatch.delenv("QE_UNSET", raising=False)
    results = calls(inside, *steps,
                    ("set_config_value", {"config_path": config, "key": "output.dir", "value": f"${{QE_UNSET:-{outside}/out}}"}),
                    ("dry_run", {"config_path": config}),
                    ("set_config_value", {"config_path": config, "key": "output.dir", "value": str(inside / "results")}),
                    ("set_config_value", {"config_path": config, "key": "benchmarks[0].name", "value": f"{evil}:evil"}),
                    ("launch_canary", {"config_path": config}),
                    ("set_config_value", {"config_path": config, "key": "benchmarks[0].name", "value": f"${{QE_UNSET:-{evil}}}"}),
                    ("launch_canary", {"config_path": config}),
                    ("set_config_value", {"config_path": config, "key": "benchmarks[0].name", "value": str(inside / "tiny_add.py")}),
                    ("launch_canary", {"config_path": config, "overrides": [f"benchmarks.0.name={evil}:evil"]}),
                    ("launch_canary", {"config_path": config, "overrides": ["output.dir=${QE_UNSET}"]}))
    assert not any(result.is_error for result in results[:3]), [r.content[0].text for r in results[:3] if r.is_error]
    _refused(results[4], "output.dir")
    _refused(results[7], "benchmarks[0].name")
    _refused(results[9], "benchmarks[0].name")
    _refused(results[11], "benchmarks[0].name")
    assert results[12].is_error and "QE_UNSET" in results[12].content[0].text and "--root" in results[12].content[0].text
    assert not (outside / "imported").exists() and not (outside / "out").exists()


def test_a_nel_next_playbook_outside_the_root_is_refused(workspace, next_config):
    """nel-next's composer reads a benchmark's `playbook:` file and merges it in: a launch reads it too."""
    inside, outside = workspace
    config, steps = next_config
    outside.mkdir()
    (outside / "playbook.yaml").write_text("repeats: 1\n")
    calls(inside, *steps)
    text = Path(config).read_text()
    Path(config).write_text(text.replace("  - name: ", f"  - playbook: {outside / 'playbook.yaml'}\n    name: ", 1))
    (with_playbook,) = calls(inside, ("dry_run", {"config_path": config}))
    _refused(with_playbook, "defaults/playbook file")


def test_resume_run_checks_the_config_it_resumes(workspace, next_config):
    """A run recorded inside the root whose config now names a benchmark file outside: resume_run would import it."""
    from quanteval import ledger

    inside, outside = workspace
    config, steps = next_config
    evil = _evil(outside)
    run_dir = inside / "results" / "canary-1"
    run_dir.mkdir(parents=True)
    (run_dir / "exit_code").write_text("1\n")
    calls(inside, *steps)
    record = ledger.add("canary", status="failed", config_path=config, invocation_id="canary-1", executor="local",
                        details={"engine": "nel-next", "pid": 2**22 + 7, "pgid": 2**22 + 7, "run_dir": str(run_dir),
                                 "log_path": str(run_dir / "nel.log"), "tasks": ["tiny_add"], "run_overrides": []})
    (resumed,) = calls(inside, ("set_config_value", {"config_path": config, "key": "benchmarks[0].name", "value": f"{evil}:evil"}),
                       ("resume_run", {"record_id": record.id}))[1:]
    _refused(resumed, "benchmarks[0].name")
    assert not (outside / "imported").exists()


# ---------------------------------------------------------------- a handle that is a path on disk


def test_a_relative_name_that_looks_like_a_handle_but_is_a_link_outside_is_checked_as_a_path(workspace, monkeypatch):
    inside, outside = workspace
    outside.mkdir()
    shutil.copytree(CHECKPOINT, outside / CHECKPOINT.name)
    (inside / "hflink").symlink_to(outside)
    (inside / "models").mkdir()
    shutil.copytree(CHECKPOINT, inside / "models" / CHECKPOINT.name)
    monkeypatch.chdir(inside)  # as `quanteval-mcp --root` does
    handle = f"hflink/{CHECKPOINT.name}"
    inspect, evaluate, plan, fine = calls(
        inside, ("inspect_checkpoint", {"checkpoint": handle}),
        ("evaluate_quantization", {"baseline_checkpoint": handle, "candidate_checkpoint": str(inside / "models" / CHECKPOINT.name),
                                   "benchmarks": [str(inside / "b.py")]}),
        ("plan_deployment", {"checkpoint": handle, "framework": "vllm"}),
        ("inspect_checkpoint", {"checkpoint": f"models/{CHECKPOINT.name}"}))
    _refused(inspect, "checkpoint")
    _refused(evaluate, "baseline_checkpoint")
    _refused(plan, "checkpoint")
    assert not fine.is_error, fine.content[0].text  # a relative name inside the root still works


# ---------------------------------------------------------------- default outputs


def test_evaluate_quantization_without_output_dir_writes_inside_the_root(workspace, isolated_state):
    inside, _ = workspace
    bench = inside / "tiny_add.py"
    bench.write_text(BENCH.read_text())
    (inside / "baseline").mkdir()  # not a checkpoint: the call stops once it has made its working directory
    (inside / "candidate").mkdir()
    (result,) = calls(inside, ("evaluate_quantization", {"baseline_checkpoint": str(inside / "baseline"),
                                                         "candidate_checkpoint": str(inside / "candidate"), "benchmarks": [str(bench)]}))
    assert result.is_error
    made = sorted((inside / ".quanteval" / "evaluations").iterdir())
    # the call's output directory holds its lock (two calls cannot share one) before anything is served; nothing went to the state dir
    assert [path.name for path in made] == [".quanteval-evaluate.lock"]
    assert not (isolated_state / "evaluations").exists()


# ---------------------------------------------------------------- records read over the root


def _nel_next_record(run_dir: Path, log_line: str):
    from quanteval import ledger

    run_dir.mkdir(parents=True)
    (run_dir / "nel.log").write_text(f"starting\n{log_line}\nTraceback (most recent call last):\nRuntimeError: boom\n")
    (run_dir / "exit_code").write_text("1\n")
    return ledger.add("canary", status="failed", config_path=None, invocation_id=run_dir.name, executor="local",
                      details={"engine": "nel-next", "pid": 2**22 + 9, "pgid": 2**22 + 9, "run_dir": str(run_dir),
                               "log_path": str(run_dir / "nel.log"), "tasks": ["tiny_add"]})


def test_run_logs_and_run_status_never_read_a_record_outside_the_root(workspace):
    inside, outside = workspace
    elsewhere = _nel_next_record(outside / "cli-run", "outside-log-line-7f3a")  # a CLI run, in the shared ledger
    here = _nel_next_record(inside / "results" / "mcp-run", "inside-log-line")
    logs, status, kill, validate, compare, logs_here = calls(
        inside, ("run_logs", {"record_id": elsewhere.id}), ("run_status", {"record_id": elsewhere.id}),
        ("kill_run", {"record_id": elsewhere.id}), ("validate_run", {"run": elsewhere.id}),
        ("compare_results", {"baseline": here.id, "candidate": elsewhere.id}), ("run_logs", {"record_id": here.id}))
    for result in (logs, status, kill, validate, compare):
        _refused(result, "run_dir")
        assert "outside-log-line" not in result.content[0].text
    assert not logs_here.is_error and "inside-log-line" in logs_here.content[0].text


# ---------------------------------------------------------------- start_eval_server over MCP


def _start_eval_server(root: Path, open_eval_server: bool, arguments: dict):
    """start_eval_server over MCP; a server it started is stopped before returning."""
    async def go():
        async with Client(build_server(root=root, open_eval_server=open_eval_server)) as client:
            started = await client.call_tool("start_eval_server", arguments)
            if not started.is_error:
                await client.call_tool("stop_eval_server", {"record_id": started.structured_content["record_id"]})
            return started

    return anyio.run(go)


def _ns(directory: Path) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    ns = directory / "ns"
    ns.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{REPO / "tests" / "standins" / "fake_ns.py"}" "$@"\n')
    ns.chmod(0o755)
    return str(ns)


def test_start_eval_server_over_mcp_stays_on_loopback_runs_ns_from_the_root_and_needs_a_real_token(workspace, monkeypatch):
    from quanteval.localproc import free_port

    inside, outside = workspace
    monkeypatch.setenv("QUANTEVAL_EVAL_TOKEN", "q7Lm2Xv9Rt4Kp8Wz-c3Fh6Jd1")
    port = free_port()
    base = {"port": port, "output_root": str(inside / "srv")}
    outside_ns = _start_eval_server(inside, False, {**base, "ns_command": _ns(outside)})
    _refused(outside_ns, "ns_command")
    other_name = _start_eval_server(inside, False, {**base, "ns_command": "bash"})
    assert other_name.is_error and "ns_command" in other_name.content[0].text
    _refused(_start_eval_server(inside, True, {**base, "data_dir": str(outside)}), "data_dir")
    open_bind = _start_eval_server(inside, False, {**base, "bind_host": "0.0.0.0"})
    assert open_bind.is_error and "--allow-open-eval-server" in open_bind.content[0].text
    home = _start_eval_server(inside, True, {**base, "bind_host": "0.0.0.0", "token_env": "HOME"})
    assert home.is_error and "token_env" in home.content[0].text
    monkeypatch.setenv("QUANTEVAL_EVAL_TOKEN", "short")
    short = _start_eval_server(inside, True, {**base, "bind_host": "0.0.0.0"})
    assert short.is_error and "at least 16" in short.content[0].text
    # allowed: ns inside the root on loopback; and beyond loopback with a real token when the server allows it
    monkeypatch.setenv("QUANTEVAL_EVAL_TOKEN", "q7Lm2Xv9Rt4Kp8Wz-c3Fh6Jd1")
    inside_ns = _start_eval_server(inside, False, {**base, "ns_command": _ns(inside / "bin")})
    assert not inside_ns.is_error, inside_ns.content[0].text
    opened = _start_eval_server(inside, True, {**base, "port": free_port(), "bind_host": "0.0.0.0", "ns_command": _ns(outside)})
    assert not opened.is_error, opened.content[0].text
    assert opened.structured_content["auth"] == "bearer token from $QUANTEVAL_EVAL_TOKEN"
    default_root = _start_eval_server(inside, False, {"port": free_port(), "ns_command": _ns(inside / "bin")})
    assert Path(default_root.structured_content["output_root"]).is_relative_to(inside)


def test_quanteval_mcp_help_names_the_eval_server_option(cli_env):
    shown = subprocess.run(["quanteval-mcp", "--help"], capture_output=True, text=True, env=cli_env, timeout=60)
    assert "--allow-open-eval-server" in shown.stdout


@pytest.mark.parametrize("read_only", [True, False])
def test_a_skills_name_that_is_a_path_imports_nothing_from_outside(workspace, read_only):
    """`skills://../../<dir>` names a dataset module NeMo-Skills would import from anywhere: validate_config (read-only
    too) and launch_canary refuse it by its name, before anything is imported; a real name still reaches the probe."""
    inside, outside = workspace
    package = outside / "payload"
    package.mkdir(parents=True)
    marker = outside / "imported"
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    config = inside / "next.yaml"
    config.write_text(f"benchmarks:\n  - name: skills://../../../../../../../../..{package}\n    solver: {{type: simple, service: model}}\n"
                      + "services:\n  model: {type: api, url: 'http://127.0.0.1:9/v1/chat/completions', protocol: chat_completions, model: m}\n"
                      + f"output:\n  dir: {inside / 'out'}\n")

    async def go():
        async with Client(build_server(root=inside, read_only=read_only)) as client:
            validated = await client.call_tool("validate_config", {"config_path": str(config)})
            launched = None if read_only else await client.call_tool("launch_canary", {"config_path": str(config)})
            return validated, launched

    validated, launched = anyio.run(go)
    problems = validated.structured_content["problems"]
    assert [p["rule"] for p in problems if p["rule"] == "skills_name"] == ["skills_name"], problems
    assert "not a NeMo-Skills benchmark name" in next(p["message"] for p in problems if p["rule"] == "skills_name")
    if launched is not None:
        assert launched.is_error and "not a NeMo-Skills benchmark name" in launched.content[0].text
    assert not marker.exists()


@pytest.mark.parametrize("placed", ["map outside", "folder outside"])
def test_the_servers_extra_benchmark_map_reaching_outside_the_root_imports_nothing(workspace, monkeypatch, placed):
    """The operator's NEMO_SKILLS_EXTRA_BENCHMARK_MAP, or a folder it maps a name to, outside the root: a confined
    validate_config and launch_canary refuse skills:// by it, and nothing from it is imported."""
    inside, outside = workspace
    marker = outside / "imported"
    for where in (inside, outside):
        package = where / "payload"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\nMETRICS_TYPE = 'math'\n")
        (package / "test.jsonl").write_text('{"problem": "1+1", "expected_answer": "2"}\n')
    mapping = outside / "map.json" if placed == "map outside" else inside / "map.json"
    mapping.write_text(json.dumps({"payload": str((outside if placed == "folder outside" else inside) / "payload")}))
    monkeypatch.setenv("NEMO_SKILLS_EXTRA_BENCHMARK_MAP", str(mapping))
    config = inside / "next.yaml"
    config.write_text("benchmarks:\n  - name: skills://payload\n    solver: {type: simple, service: model}\n"
                      + "services:\n  model: {type: api, url: 'http://127.0.0.1:9/v1/chat/completions', protocol: chat_completions, model: m}\n"
                      + f"output:\n  dir: {inside / 'out'}\n")

    async def go():
        async with Client(build_server(root=inside)) as client:
            return (await client.call_tool("validate_config", {"config_path": str(config)}),
                    await client.call_tool("launch_canary", {"config_path": str(config)}))

    validated, launched = anyio.run(go)
    refusal = next(p["message"] for p in validated.structured_content["problems"] if p["rule"] == "skills_unavailable")
    assert "NEMO_SKILLS_EXTRA_BENCHMARK_MAP" in refusal and "outside the workspace root" in refusal
    assert launched.is_error and "NEMO_SKILLS_EXTRA_BENCHMARK_MAP" in launched.content[0].text
    assert not marker.exists()


# ---------------------------------------------------------------- commands are a capability, not a value

NEL_SHELL_VALUES = [
    ("deployment.served_model_name", "tiny$(touch {marker})"),
    ("deployment.extra_args", "--max-model-len 32768; touch {marker}; true"),
    ("deployment.env_vars.FOO", "lit:x$(touch {marker})"),
    ("execution.extra_docker_args", "--rm `touch {marker}`"),
]


@pytest.mark.parametrize(("key", "value"), NEL_SHELL_VALUES, ids=[key for key, _ in NEL_SHELL_VALUES])
def test_a_nel_value_written_unquoted_into_run_sh_cannot_carry_a_command(workspace, key, value):
    """NEL's run.sh splices these values into its `docker run` lines unquoted: shell syntax in one is a command on
    launch. validate_config calls it an error naming the key, and launch_canary refuses it, with --root or without."""
    inside, outside = workspace
    marker = outside / "ran"
    outside.mkdir()
    nel = _nel_config(inside, inside / "results")
    steps = [*nel["steps"], ("set_config_value", {"config_path": nel["config"], "key": key, "value": value.format(marker=marker)}),
             ("validate_config", {"config_path": nel["config"]}), ("launch_canary", {"config_path": nel["config"]})]
    *_, validated, launched = calls(inside, *steps)
    [problem] = [p for p in validated.structured_content["problems"] if p["rule"] == "shell_syntax"]
    assert problem["key"] == key and problem["severity"] == "error" and not validated.structured_content["valid"]
    assert launched.is_error and key in launched.content[0].text and "shell command" in launched.content[0].text

    from quanteval.workflow.runs import LaunchCanaryInput, launch_canary  # the CLI's path: no --root

    with pytest.raises(ToolError, match="shell command"):
        launch_canary(LaunchCanaryInput(config_path=nel["config"]))
    assert not marker.exists()


def test_commands_in_a_config_are_named_and_refused_under_root_unless_the_server_allows_them(workspace, monkeypatch):
    """evaluation.pre_cmd (NEL) and services.model.setup_commands (nel-next) are commands by design: validate_config names
    each with what would run; under --root a launch refuses them unless quanteval-mcp runs with --allow-commands, even
    where the operator trusts NEL's pre_cmd (NEMO_EVALUATOR_TRUST_PRE_CMD, a gate for the operator, not the client)."""
    monkeypatch.setenv("NEMO_EVALUATOR_TRUST_PRE_CMD", "1")
    inside, outside = workspace
    marker = outside / "ran"
    nel = _nel_config(inside, inside / "results")
    next_config, build_next = _built_next_config(inside)
    steps = [*nel["steps"], ("set_config_value", {"config_path": nel["config"], "key": "evaluation.pre_cmd", "value": f"touch {marker}"}),
             build_next, ("set_config_value", {"config_path": next_config, "key": "services.model",
                                               "value": {"type": "vllm", "model": str(CHECKPOINT), "protocol": "chat_completions",
                                                         "setup_commands": [f"touch {marker}"]}})]
    calls(inside, *steps)
    for config, key in ((nel["config"], "evaluation.pre_cmd"), (next_config, "services.model.setup_commands.0")):
        validated, launched = calls(inside, ("validate_config", {"config_path": config}), ("launch_canary", {"config_path": config}))
        [named] = [p for p in validated.structured_content["problems"] if p["rule"] == "runs_command"]
        assert named["key"] == key and f"touch {marker}" in named["message"]
        assert launched.is_error and "--allow-commands" in launched.content[0].text and key in launched.content[0].text

    async def allowed():
        async with Client(build_server(root=inside, allow_commands=True)) as client:
            return await client.call_tool("launch_canary", {"config_path": nel["config"]})

    # allowed, NEL's launch goes on to its own checks (this machine has no docker, so nothing runs)
    launched = anyio.run(allowed)
    assert launched.is_error and "--allow-commands" not in launched.content[0].text and "docker" in launched.content[0].text.lower()
    assert not marker.exists()


# ---------------------------------------------------------------- every way to a run, one check


def test_every_way_a_result_tool_reaches_a_run_is_confined(workspace, real_run):
    """A run outside the root is refused however it is named: as nel-next's invocation id (`nel-next:/dir`), as
    host:path on this machine, as an id no record of this ledger has (NEL would look it up, or a prefix of it, in its
    own job database), and as a CLI evaluation that recorded no output folder; the run inside stays readable."""
    from quanteval import ledger

    inside, outside = workspace
    shutil.copytree(real_run.parent, outside / "run")
    shutil.copytree(real_run.parent, inside / "run")
    evaluation = ledger.add("evaluation", status="succeeded", details={"request": {"output_dir": None}})
    # the record a nel-next run outside has in the shared ledger: its invocation id is its folder
    ledger.add("full_run", status="succeeded", invocation_id=f"nel-next:{outside / 'run'}", executor="local",
               details={"engine": "nel-next", "run_dir": str(outside / "run")})
    results = calls(inside, ("extract_scores", {"run": f"nel-next:{outside / 'run'}"}),
                    ("validate_run", {"run": f"local:{outside / 'run'}"}),
                    ("extract_scores", {"run": "a1b2"}),
                    ("run_status", {"record_id": evaluation.id}),
                    ("extract_scores", {"run": str(inside / "run")}))
    *refused, fine = results
    for result, said in zip(refused, ["outside the workspace root", "outside the workspace root",
                                      "no run of this server's records", "recorded no output folder"], strict=True):
        assert result.is_error and said in result.content[0].text, result.content[0].text
    assert not fine.is_error, fine.content[0].text


def test_list_runs_under_root_shows_only_what_the_root_may_see(workspace, real_run):
    """The ledger is shared with the CLI: a confined client sees the records whose paths lie inside its root (paged
    after filtering), not a CLI evaluation elsewhere or a run with no recorded location."""
    from quanteval import ledger

    inside, outside = workspace
    mine = ledger.add("evaluation", status="succeeded", details={"request": {"output_dir": str(inside / "out")}})
    served = ledger.add("deployment", status="stopped", config_path=str(inside / "model"), details={})
    elsewhere = ledger.add("evaluation", status="succeeded", details={"request": {"output_dir": str(outside / "out")}})
    unplaced = ledger.add("full_run", status="succeeded", invocation_id="abc123", executor="local", details={"engine": "nel"})
    far_server = ledger.add("deployment", status="stopped", config_path=str(outside / "model"), details={})
    (listed, paged) = calls(inside, ("list_runs", {}), ("list_runs", {"limit": 1, "offset": 1}))
    shown = {run["record_id"] for run in listed.structured_content["runs"]}
    assert shown == {mine.id, served.id} and listed.structured_content["total"] == 2, shown
    assert not shown & {elsewhere.id, unplaced.id, far_server.id}
    assert [run["record_id"] for run in paged.structured_content["runs"]] == [mine.id]  # newest first: the server, then it
    assert paged.structured_content["next_offset"] is None

    from quanteval.workflow.runs import ListRunsInput, list_runs  # the CLI sees the whole ledger

    assert {mine.id, elsewhere.id, unplaced.id, far_server.id} <= {run.record_id for run in list_runs(ListRunsInput(limit=50)).runs}


def test_a_server_started_elsewhere_is_not_watched_or_stopped_by_a_confined_client(workspace):
    """deployment_status / stop_deployment / eval_server_status / stop_eval_server take only what list_runs shows."""
    from quanteval import ledger

    inside, outside = workspace
    far = ledger.add("deployment", status="ready", config_path=str(outside / "model"), details={})
    far_eval = ledger.add("eval_server", status="running", details={"output_root": str(outside / "eval")})

    async def go():
        async with Client(build_server(root=inside, toolsets=["runs", "deploy", "evalserver"])) as client:
            return [await client.call_tool(tool, {"record_id": record.id}) for tool, record in
                    (("deployment_status", far), ("stop_deployment", far), ("eval_server_status", far_eval),
                     ("stop_eval_server", far_eval))]

    for result in anyio.run(go):
        assert result.is_error and "outside the workspace root" in result.content[0].text, result.content[0].text
    assert ledger.get(far.id).status == "ready" and ledger.get(far_eval.id).status == "running"  # untouched


def test_evaluate_reuses_a_finished_run_only_from_inside_the_root(workspace):
    """evaluate_quantization reuses a full run of the same evaluation: over MCP with --root, never one whose folder lies
    outside (its results would be read, and reported, as this evaluation's), also in start_evaluation's own process."""
    from quanteval import ledger, paths
    from quanteval.workflow import background
    from quanteval.workflow.evaluate import _finished_run

    inside, outside = workspace
    for where in (inside, outside):
        (where / "run").mkdir(parents=True)
    far = ledger.add("full_run", status="succeeded", config_path=str(outside / "c.yaml"), executor="local",
                     details={"evaluation_key": "k", "run_dir": str(outside / "run"), "engine": "nel-next"})
    assert _finished_run("k") == far  # the CLI: the user's own ledger
    token = paths.CALL_POLICY.set(paths.Policy(root=inside, absolute_only=True))
    try:
        assert _finished_run("k") is None
        near = ledger.add("full_run", status="succeeded", config_path=str(inside / "c.yaml"), executor="local",
                          details={"evaluation_key": "k", "run_dir": str(inside / "run"), "engine": "nel-next"})
        assert _finished_run("k") == near
        record = background.start({"bogus": "request"}, root=inside)  # the job fails at once on the bogus request
        assert ledger.get(record.id).details["root"] == str(inside)
    finally:
        paths.CALL_POLICY.reset(token)


@pytest.mark.slow
def test_what_a_confined_call_writes_unasked_stays_inside_the_root(workspace, real_run, monkeypatch):
    """A comparison without output_dir, a rule-in-points gate policy, a server's log: under --root they go to
    ROOT/.quanteval, not to the state dir outside it."""
    from quanteval.localproc import free_port

    inside, _outside = workspace
    run, model = inside / "run", inside / "model"
    shutil.copytree(real_run, run)
    shutil.copytree(CHECKPOINT, model)
    monkeypatch.setenv("QUANTEVAL_VLLM_LAUNCHER", f"{sys.executable} {REPO / 'tests' / 'standins' / 'fake_inference_server.py'}")
    compared, gated = calls(inside, ("compare_results", {"baseline": str(run), "candidate": str(run)}),
                            ("gate_results", {"baseline": str(run), "candidate": str(run), "max_drop": 5}))
    assert not compared.is_error and not gated.is_error, (compared.content[0].text, gated.content[0].text)

    async def go():
        async with Client(build_server(root=inside, toolsets=["deploy"])) as client:
            started = await client.call_tool("launch_deployment", {"checkpoint": str(model), "framework": "vllm", "port": free_port()})
            if not started.is_error:
                await client.call_tool("stop_deployment", {"record_id": started.structured_content["record_id"]})
            return started

    started = anyio.run(go)
    assert not started.is_error, started.content[0].text
    written = [compared.structured_content["report_html"], gated.structured_content["policy"], started.structured_content["log_path"]]
    assert all(Path(path).is_relative_to(inside / ".quanteval") for path in written), written
