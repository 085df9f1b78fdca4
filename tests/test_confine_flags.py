"""Server flags are values too: under `quanteval-mcp --root`, a model server's arguments that name files
(--hf-config-path, --config, --tokenizer, --chat-template, --download-dir, a JSON config's paths) stay inside the
root in every tool that reaches a framework, the framework's own argument check in plan_deployment (a read-only
tool) included, and a flag that loads Python (--trust-remote-code, plugins) needs --allow-commands. Over a real MCP
session on a --read-only --root server, as the attack came."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import anyio
import test_confine
from mcp import Client
from tiers import requires

from quanteval.faces.server import build_server

workspace = test_confine.workspace  # the fixture: ROOT and a folder beside it
CHECKPOINT = test_confine.CHECKPOINT


def _call(root: Path, *steps: tuple[str, dict], read_only: bool = True, allow_commands: bool = False) -> list:
    async def go():
        async with Client(build_server(root=root, read_only=read_only, allow_commands=allow_commands)) as client:
            return [await client.call_tool(name, arguments) for name, arguments in steps]

    return anyio.run(go)


def _remote_code(folder: Path, marker: Path) -> Path:
    """A Hugging Face config folder whose auto_map names a module that leaves a mark when imported."""
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((CHECKPOINT / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n"
                                    "from transformers import LlamaConfig as EvilConfig\n"
                                    "from transformers import LlamaForCausalLM as EvilModel\n")
    return folder


@requires("vllm-venv")
def test_plan_deployment_confines_the_flags_its_framework_check_reads(workspace):
    inside, outside = workspace
    marker = outside / "imported"
    hf_config = _remote_code(outside / "hf-config", marker)
    settings = outside / "settings.yaml"
    settings.write_text("max-model-len: 4242424\n")
    checkpoint = inside / "tiny"
    shutil.copytree(CHECKPOINT, checkpoint)
    plan = {"checkpoint": str(checkpoint), "framework": "vllm"}
    code, config, tokenizer, speculative, relative = _call(
        inside,
        ("plan_deployment", {**plan, "extra_args": ["--trust-remote-code", "--hf-config-path", str(hf_config)]}),
        ("plan_deployment", {**plan, "extra_args": ["--config", str(settings)]}),
        ("plan_deployment", {**plan, "extra_args": [f"--tokenizer={outside}"]}),
        ("plan_deployment", {**plan, "extra_args": ["--speculative-config", json.dumps({"model": str(hf_config)})]}),
        ("plan_deployment", {**plan, "extra_args": ["--chat-template", f"{inside}/../elsewhere/settings.yaml"]}))
    assert code.is_error and "--trust-remote-code" in code.content[0].text and "--allow-commands" in code.content[0].text
    for refused in (config, tokenizer, speculative, relative):
        assert refused.is_error, refused.structured_content
        assert "outside the workspace root" in refused.content[0].text and "4242424" not in refused.content[0].text
    # allowed to run code, the path is still confined
    (allowed,) = _call(inside, ("plan_deployment", {**plan, "extra_args": ["--trust-remote-code", "--hf-config-path", str(hf_config)]}),
                       allow_commands=True)
    assert allowed.is_error and "outside the workspace root" in allowed.content[0].text
    assert not marker.exists()


def test_a_checkpoint_with_its_own_code_is_planned_but_neither_checked_nor_launched_without_the_allowance(workspace):
    """plan_deployment adds --trust-remote-code for a checkpoint with auto_map; its parser check would import the
    checkpoint's Python (inside the root, but written by whoever may write there), so over --root it is not run, and
    launch_deployment of the plan is refused, unless the server allows commands."""
    inside, outside = workspace
    marker = outside / "imported"
    outside.mkdir()
    checkpoint = inside / "own-code"
    shutil.copytree(CHECKPOINT, checkpoint)
    _remote_code(checkpoint, marker)
    (planned,) = _call(inside, ("plan_deployment", {"checkpoint": str(checkpoint), "framework": "vllm"}))
    assert not planned.is_error, planned.content[0].text
    plan = planned.structured_content
    assert "--trust-remote-code" in plan["server_args"]
    assert plan["parser_check"]["checked"] is False and "--allow-commands" in plan["parser_check"]["message"]
    (launched,) = _call(inside, ("launch_deployment", {"plan": plan}), read_only=False)
    assert launched.is_error and "--trust-remote-code" in launched.content[0].text
    # a plan whose environment would load code is refused too
    server_args = [arg for arg in plan["server_args"] if arg != "--trust-remote-code"]
    preloading = {**plan, "server_args": server_args, "argv": [*plan["launcher"], *server_args],
                  "env": {**plan["env"], "LD_PRELOAD": str(outside / "x.so")}}
    (preloaded,) = _call(inside, ("launch_deployment", {"plan": preloading}), read_only=False)
    assert preloaded.is_error and "LD_PRELOAD" in preloaded.content[0].text
    assert not marker.exists()


next_config = test_confine.next_config  # the fixture: a nel-next config inside the root


@requires("slow")
def test_a_configs_server_flags_are_confined_and_code_flags_are_commands(workspace, next_config):
    """A nel-next config's managed server (vLLM started on this machine) reads what its extra_args name, and imports
    Python with --trust-remote-code: a launch over --root checks both, as plan_deployment does."""
    inside, outside = workspace
    outside.mkdir()
    template = outside / "template.jinja"
    template.write_text("{{ messages }}")
    checkpoint = inside / "tiny"
    shutil.copytree(CHECKPOINT, checkpoint)
    config, steps = next_config
    service = {"type": "vllm", "model": str(checkpoint), "protocol": "chat_completions"}
    *_, outside_file, _, validated, code = _call(
        inside, *steps,
        ("set_config_value", {"config_path": config, "key": "services.model", "value": {**service, "extra_args": ["--chat-template", str(template)]}}),
        ("launch_canary", {"config_path": config}),
        ("set_config_value", {"config_path": config, "key": "services.model", "value": {**service, "extra_args": ["--trust-remote-code"]}}),
        ("validate_config", {"config_path": config}),
        ("launch_canary", {"config_path": config}), read_only=False)
    assert outside_file.is_error and "services.model.extra_args" in outside_file.content[0].text
    assert "outside the workspace root" in outside_file.content[0].text
    [named] = [p for p in validated.structured_content["problems"] if p["rule"] == "runs_command"]
    assert named["key"] == "services.model.extra_args.0" and "--trust-remote-code" in named["message"]
    assert code.is_error and "--allow-commands" in code.content[0].text and "services.model.extra_args.0" in code.content[0].text
