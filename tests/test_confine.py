"""`quanteval-mcp --root DIR` stops at what a config sends a launch to, not only at the arguments: an output directory,
checkpoint, mount or benchmark file outside the root is refused naming its key, for both engines, and nothing is
written outside. Over a real MCP session (the SDK's in-process client), as an IDE connects."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client

from quanteval.faces.server import build_server
from quanteval.workflow import confine

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "examples" / "benchmarks" / "tiny_add.py"
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


def test_a_nel_next_config_is_confined_too_output_dir_and_byob_file(workspace):
    inside, outside = workspace
    config = str(inside / "next.yaml")
    inside_bench = inside / "tiny_add.py"
    inside_bench.write_text(BENCH.read_text())
    steps = [("build_config", {"engine": "nel-next", "execution": "local", "deployment": "none", "model_type": "base",
                               "benchmarks": [str(inside_bench)], "config_path": config}),
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


def test_slurm_paths_are_on_the_cluster_and_not_confined():
    doc = {"defaults": [{"execution": "slurm/default"}], "execution": {"type": "slurm", "output_dir": "/lustre/me/results"},
           "deployment": {"checkpoint_path": "/lustre/me/ckpt"}}
    assert confine.launch_paths(doc) == []
    assert confine.launch_paths({"benchmarks": [{"name": "/x/b.py"}], "cluster": {"type": "slurm"}, "output": {"dir": "/x"}}) == []
