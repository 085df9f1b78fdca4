"""The MCP face behaves like the CLI, is safe to leave running, and stays small.

Every check runs through a real MCP client session: `mcp.Client(server)` in-process, or a
`quanteval-mcp` subprocess over stdio as an IDE spawns it.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from tiers import CHECKPOINTS, requires

from quanteval import registry, toolsets
from quanteval.faces import skillpack
from quanteval.faces.server import build_server

NEL_CONFIG = """\
# a NEL run config
execution:
  output_dir: ???
evaluation:
  tasks:
    - name: ns_gpqa
"""


def call(name: str, arguments: dict, server=None):
    async def go():
        async with Client(server or build_server()) as client:
            return await client.call_tool(name, arguments)

    return anyio.run(go)


def cli(cli_env, name: str, arguments: dict, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["quanteval", "call", name, "--json", json.dumps(arguments)], capture_output=True, text=True,
                          env=cli_env, cwd=cwd, timeout=120)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "eval.yaml"
    path.write_text(NEL_CONFIG)
    return path


# ---------------------------------------------------------------- errors read the same as on the CLI


@pytest.mark.parametrize(
    "arguments",
    [
        # a bundle that does not fit the model type (a model validator: it failed outside the SDK handler's try)
        {"execution": "local", "deployment": "vllm", "model_type": "base", "benchmarks": ["agentic"], "config_path": "/tmp/x.yaml"},
        # not a YAML file name
        {"execution": "local", "deployment": "vllm", "model_type": "base", "benchmarks": ["coding"], "config_path": "/tmp/qe-no-suffix"},
        # a NUL byte and a 100k-character path
        {"execution": "local", "deployment": "vllm", "model_type": "base", "benchmarks": ["coding"], "config_path": "/tmp/a\0b.yaml"},
        {"execution": "local", "deployment": "vllm", "model_type": "base", "benchmarks": ["coding"], "config_path": "/" + "a" * 100_000 + ".yaml"},
        # a folder that cannot be made (its parent is a file)
        {"execution": "local", "deployment": "vllm", "model_type": "base", "benchmarks": ["coding"], "config_path": "/dev/null/eval.yaml"},
    ],
)
def test_argument_errors_carry_the_cli_message_over_mcp(cli_env, arguments):
    result = call("build_config", arguments)
    over_cli = cli(cli_env, "build_config", arguments)
    assert result.is_error
    text = result.content[0].text
    assert "Error executing tool" not in text and "internal error" not in text
    assert over_cli.returncode in (1, 2)
    assert over_cli.stderr.strip() == f"quanteval: {text}"


def test_unknown_argument_is_an_error_naming_the_closest_key_and_writes_nothing(cli_env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arguments = {"execution": "local", "deployment": "vllm", "model_type": "base", "benchmarks": ["coding"],
                 "output_path": str(tmp_path / "c.yaml")}
    result = call("build_config", arguments)
    assert result.is_error
    assert "unknown argument 'output_path'" in result.content[0].text
    assert "Did you mean 'config_path'" in result.content[0].text
    assert list(tmp_path.iterdir()) == []
    assert cli(cli_env, "build_config", arguments, cwd=tmp_path).stderr.strip() == f"quanteval: {result.content[0].text}"


def test_every_input_schema_forbids_unknown_keys():
    async def go():
        async with Client(build_server()) as client:
            return (await client.list_tools()).tools

    for tool in anyio.run(go):
        assert tool.input_schema.get("additionalProperties") is False, tool.name


def test_set_config_value_with_yaml_value_works_over_mcp(config):
    result = call("set_config_value", {"config_path": str(config), "key": "execution.extra", "yaml_value": "[a, {b: 1}]"})
    assert not result.is_error, result.content[0].text
    read = call("get_config_value", {"config_path": str(config), "key": "execution.extra"})
    assert read.structured_content["value"] == ["a", {"b": 1}]
    # giving both is still refused, with the reason
    both = call("set_config_value", {"config_path": str(config), "key": "execution.extra", "value": 1, "yaml_value": "2"})
    assert both.is_error and "either value or yaml_value" in both.content[0].text


def test_edits_leave_no_lock_files_beside_the_config(config):
    call("set_config_value", {"config_path": str(config), "key": "execution.output_dir", "value": "/results"})
    call("delete_config_value", {"config_path": str(config), "key": "execution.output_dir"})
    assert sorted(p.name for p in config.parent.iterdir()) == ["eval.yaml"]


def test_internal_errors_name_only_their_type(monkeypatch):
    spec = registry.TOOLS["list_runs"]

    def list_runs(request):
        raise RuntimeError("secret-token-123")

    list_runs.__annotations__ = {"request": spec.input_model, "return": spec.output_model}
    monkeypatch.setitem(registry.TOOLS, "list_runs", registry.ToolSpec(list_runs, "runs", read_only=True))
    result = call("list_runs", {})
    assert result.is_error
    assert "internal error (RuntimeError)" in result.content[0].text
    assert "secret-token-123" not in result.content[0].text


# ---------------------------------------------------------------- paths


def test_relative_paths_are_refused_over_mcp(config, monkeypatch):
    monkeypatch.chdir(config.parent)
    result = call("get_config_value", {"config_path": "eval.yaml", "key": "execution"})
    assert result.is_error and "relative; give an absolute path" in result.content[0].text


@pytest.mark.parametrize(("tool", "arguments"), [
    ("evaluate_quantization", {"baseline_checkpoint": "ckpt-a", "candidate_checkpoint": "/abs/b", "benchmarks": ["x.py"]}),
    ("evaluate_quantization", {"baseline_checkpoint": "/abs/a", "candidate_checkpoint": "ckpt-b", "benchmarks": ["x.py"]}),
    ("gate_results", {"baseline": "/abs/a", "candidate": "/abs/b", "policy": "policy.yaml"}),
])
def test_the_one_call_tools_refuse_relative_paths_over_mcp(tool, arguments):
    result = call(tool, arguments)
    assert result.is_error and "relative; give an absolute path" in result.content[0].text


@pytest.mark.parametrize("output", ["{tmp}/out", "{tmp}"])
def test_build_config_output_must_be_a_yaml_file(tmp_path, output):
    target = output.format(tmp=tmp_path)
    result = call("build_config", {"execution": "local", "deployment": "vllm", "model_type": "base",
                                   "benchmarks": ["coding"], "config_path": target})
    assert result.is_error and ".yaml" in result.content[0].text
    assert list(tmp_path.iterdir()) == []  # no directory made, no config written into one


def test_config_tools_refuse_files_that_are_not_nel_configs(tmp_path):
    other = tmp_path / "compose.yaml"
    other.write_text("services:\n  web:\n    image: nginx\n")
    text_file = tmp_path / "notes.txt"
    text_file.write_text("execution:\n  output_dir: x\n")
    for path in (other, text_file):
        result = call("set_config_value", {"config_path": str(path), "key": "execution.x", "value": 1})
        assert result.is_error and "not an evaluation config" in result.content[0].text
    assert other.read_text() == "services:\n  web:\n    image: nginx\n"


def test_root_confines_every_path_over_stdio(cli_env, tmp_path, config):
    inside = tmp_path / "workspace"
    inside.mkdir()
    (inside / "eval.yaml").write_text(NEL_CONFIG)

    async def go():
        params = StdioServerParameters(command="quanteval-mcp", args=["--root", str(inside)], env=cli_env)
        async with Client(params) as client:
            outside = await client.call_tool("get_config_value", {"config_path": str(config), "key": "execution"})
            escape = await client.call_tool("get_config_value", {"config_path": f"{inside}/../eval.yaml", "key": "execution"})
            allowed = await client.call_tool("get_config_value", {"config_path": str(inside / "eval.yaml"), "key": "execution"})
            build = await client.call_tool("compare_results", {"baseline": "/etc/x/y", "candidate": str(inside / "c")})
            return outside, escape, allowed, build

    outside, escape, allowed, build = anyio.run(go)
    for refused in (outside, escape, build):
        assert refused.is_error and "outside the workspace root" in refused.content[0].text
    assert not allowed.is_error
    assert allowed.structured_content["value"] == {"output_dir": "???"}


def test_root_confines_local_reads_of_remote_tools(tmp_path):
    inside = tmp_path / "workspace"
    inside.mkdir()
    server = build_server(root=inside)
    result = call("remote_grep", {"host": "local", "path": "/etc", "patterns": ["root"]}, server)
    assert result.is_error and "outside the workspace root" in result.content[0].text


def test_instructions_lead_with_the_one_call_answer():
    """A client with only the MCP connection reads these first: the one-call path before the steps."""
    from quanteval.faces.mcpapp import INSTRUCTIONS

    named = [word.strip(".,:;()") for word in INSTRUCTIONS.split() if "_" in word]
    assert named[:3] == ["evaluate_quantization", "start_evaluation", "wait_for_run"], named


DEFAULT = list(toolsets.DEFAULT_TOOLSETS)


def test_every_tool_a_client_is_told_of_is_callable_or_one_enable_toolsets_call_away():
    """What a client reads (the instructions, every default tool's description and argument descriptions, the skill
    pack served as resources): each tool named there is in tools/list, or calling it says which toolset to turn on,
    and after enable_toolsets it is listed and callable, with tools/list_changed on the client's listen stream."""
    from quanteval.faces.mcpapp import INSTRUCTIONS

    async def go() -> None:
        async with Client(build_server(toolsets=DEFAULT)) as client:
            listed = {tool.name: tool for tool in (await client.list_tools()).tools}
            texts = [INSTRUCTIONS] + [json.dumps([tool.description, tool.input_schema]) for tool in listed.values()]
            for resource in (await client.list_resources()).resources:
                texts += [content.text for content in (await client.read_resource(resource.uri)).contents]
            told = {name for name in registry.TOOLS if any(name in text for text in texts)}
            off = sorted(told - set(listed))
            assert {"apply_cluster", "ssh_check", "launch_deployment"} <= set(off), off
            for name in off:
                refused = await client.call_tool(name, {})
                toolset = registry.TOOLS[name].toolset
                assert refused.is_error and f'call enable_toolsets with toolsets ["{toolset}"]' in refused.content[0].text
            async with client.listen(tools_list_changed=True) as changes:
                enabled = await client.call_tool("enable_toolsets", {"toolsets": sorted({registry.TOOLS[n].toolset for n in off})})
                assert not enabled.is_error and set(off) <= set(enabled.structured_content["added"])
                with anyio.fail_after(10):
                    await changes.__anext__()
            relisted = {tool.name for tool in (await client.list_tools()).tools}
            assert set(off) <= relisted
            again = await client.call_tool(off[0], {})  # now the tool itself answers (its arguments are missing)
            assert "enable_toolsets" not in again.content[0].text

    anyio.run(go)


def test_enable_toolsets_over_stdio_with_the_2025_protocol_announces_and_sends_list_changed(cli_env):
    """Claude Code's protocol: the capability says tools/list can change, and the notification comes on the stream."""
    proc = subprocess.Popen(["quanteval-mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=cli_env, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    seen: list[dict] = []

    def send(message: dict, until_id: int | None = None) -> dict | None:
        proc.stdin.write(json.dumps(message) + "\n")
        proc.stdin.flush()
        while until_id is not None:
            seen.append(json.loads(proc.stdout.readline()))
            if seen[-1].get("id") == until_id:
                return seen[-1]
        return None

    try:
        hello = send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}, until_id=1)
        assert hello["result"]["capabilities"]["tools"]["listChanged"] is True
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        answer = send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "enable_toolsets",
                                                                                 "arguments": {"toolsets": ["cluster"]}}}, until_id=2)
        assert "ssh_check" in answer["result"]["structuredContent"]["added"]
        assert any(m.get("method") == "notifications/tools/list_changed" for m in seen), seen
        listed = send({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, until_id=3)
        assert "ssh_check" in {tool["name"] for tool in listed["result"]["tools"]}
    finally:
        proc.stdin.close()
        proc.wait(timeout=20)


def test_enable_toolsets_on_a_read_only_server_adds_only_what_changes_nothing():
    async def go() -> None:
        async with Client(build_server(toolsets=DEFAULT, read_only=True)) as client:
            answer = (await client.call_tool("enable_toolsets", {"toolsets": ["deploy"]})).structured_content
            assert answer["added"] == ["plan_deployment", "deployment_status"]
            assert "launch_deployment" in answer["message"] and "--read-only" in answer["message"]

    anyio.run(go)


# ---------------------------------------------------------------- bounded answers


def test_yaml_alias_bomb_is_refused(tmp_path):
    lines = ["execution:", "  a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert bomb.stat().st_size < 1000
    result = call("get_config_value", {"config_path": str(bomb), "key": "execution"})
    assert result.is_error and "aliases" in result.content[0].text
    started = time.monotonic()  # validate_config read it through libyaml and walked it for minutes
    for tool in ("validate_config", "dry_run", "launch_canary"):
        refused = call(tool, {"config_path": str(bomb)})
        assert refused.is_error and "aliases" in refused.content[0].text, (tool, refused.content[0].text)
    assert time.monotonic() - started < 10


@pytest.mark.slow
def test_yaml_nested_past_any_config_is_a_clear_error_not_a_recursion_error(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("execution:\n  x: " + "[" * 2000 + "]" * 2000 + "\n")
    for tool, arguments in (("get_config_value", {"config_path": str(deep), "key": "execution"}),
                            ("validate_config", {"config_path": str(deep)}),
                            ("set_config_value", {"config_path": str(deep), "key": "execution.y", "value": "1"})):
        refused = call(tool, arguments)
        text = refused.content[0].text  # ours, or libyaml's own limit (1000 levels) where it parses
        assert refused.is_error and ("nests deeper than" in text or "maximum nesting depth" in text), (tool, text)


def test_an_oversized_answer_says_to_narrow_the_request(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("execution:\n  blob: " + "x" * 100_000 + "\n")
    result = call("get_config_value", {"config_path": str(big), "key": "execution"})
    assert result.is_error and "truncated" in result.content[0].text and "Narrow" in result.content[0].text
    assert len(result.content[0].text) < 1000


def test_tool_results_carry_compact_json_equal_to_structured_content():
    result = call("check_environment", {"probe_gpus": False})
    text = result.content[0].text
    assert json.loads(text) == result.structured_content
    assert text == json.dumps(result.structured_content, ensure_ascii=False, separators=(",", ":"))


def test_structured_content_matches_output_schemas_listed_by_default(repo):
    """Output schemas are listed by default, so the client validates structured content against each tool's schema;
    --no-output-schemas leaves them out."""
    async def listed_without():
        async with Client(build_server(output_schemas=False)) as client:
            return (await client.list_tools()).tools

    assert not any(tool.output_schema for tool in anyio.run(listed_without))
    server = build_server()
    checkpoint = str(repo / "examples" / "checkpoints" / "llama-tiny-fp8")

    async def go():
        async with Client(server) as client:
            tools = (await client.list_tools()).tools
            assert all(tool.output_schema for tool in tools)
            return [await client.call_tool("check_environment", {"probe_gpus": False}),
                    await client.call_tool("inspect_checkpoint", {"checkpoint": checkpoint})]

    assert not any(result.is_error for result in anyio.run(go))


# ---------------------------------------------------------------- resources, prompts, annotations


def test_example_config_resource_is_served_as_text():
    async def go():
        async with Client(build_server()) as client:
            return await client.read_resource(skillpack.resource_uri("recipes/examples/example_eval.yaml"))

    content = anyio.run(go).contents[0]
    assert content.mime_type.startswith("text/")
    assert "evaluation" in content.text


def test_polling_tools_are_read_only():
    async def go():
        async with Client(build_server()) as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    tools = anyio.run(go)
    for name in ("run_status", "deployment_status", "eval_server_status"):
        assert tools[name].annotations.read_only_hint is True, name
        assert tools[name].annotations.destructive_hint is False, name


def test_prompt_with_an_unknown_argument_is_an_invalid_params_error():
    async def go():
        async with Client(build_server()) as client:
            with pytest.raises(MCPError) as caught:
                await client.get_prompt(skillpack.WORKFLOW_PROMPT, {"chekpoint": "/data/m"})
            with pytest.raises(MCPError) as unknown:
                await client.get_prompt("no_such_prompt", {})
            return caught.value, unknown.value

    bad_argument, bad_name = anyio.run(go)
    assert bad_argument.code == -32602 and "chekpoint" in bad_argument.message and "checkpoint" in bad_argument.message
    assert bad_name.code == -32602


# ---------------------------------------------------------------- toolsets and read-only


def test_toolsets_and_read_only_select_what_is_served():
    async def names(server):
        async with Client(server) as client:
            return {tool.name for tool in (await client.list_tools()).tools}

    config_only = anyio.run(names, build_server(toolsets=["config"]))
    assert config_only == {name for name, spec in registry.TOOLS.items() if spec.toolset == "config"}
    assert "build_config" in config_only and "launch_canary" not in config_only
    read_only = anyio.run(names, build_server(read_only=True))
    assert read_only == {name for name, spec in registry.TOOLS.items() if spec.read_only}
    # a tool that is not served cannot be called either, and the answer says why and what would serve it
    result = call("set_config_value", {"config_path": "/x.yaml", "key": "a", "value": 1}, build_server(read_only=True))
    assert result.is_error and "started --read-only" in result.content[0].text
    result = call("launch_canary", {"config_path": "/x.yaml"}, build_server(toolsets=["config"]))
    assert result.is_error and 'call enable_toolsets with toolsets ["runs"]' in result.content[0].text
    result = call("no_such_tool", {}, build_server(toolsets=["config"]))
    assert result.is_error and "Unknown tool 'no_such_tool'" in result.content[0].text


def test_every_tool_belongs_to_a_declared_toolset():
    assert set(toolsets.TOOLSETS) == {"setup", "config", "runs", "results", "deploy", "cluster", "evalserver"}
    assert {spec.toolset for spec in registry.TOOLS.values()} == set(toolsets.TOOLSETS)
    assert all(toolset.description and "\n" not in toolset.description for toolset in toolsets.TOOLSETS.values())
    # the evaluation workflow by default; serving a checkpoint alone and the training loop's eval server on request
    assert toolsets.DEFAULT_TOOLSETS == ("setup", "config", "runs", "results")


def test_the_skills_say_to_turn_on_each_toolset_that_is_off_by_default_before_its_tools(repo):
    """Every tool a skill names is in the default tools/list, or the skill (or the shared file it reads) says to call
    enable_toolsets with that tool's toolset."""
    import re

    skills = repo / "skills"
    served = set(registry.select(list(toolsets.DEFAULT_TOOLSETS)))
    for path in [*skills.glob("*/SKILL.md"), *skills.glob("common/*.md")]:
        text = path.read_text()
        named = {word for word in re.findall(r"[a-z]+(?:_[a-z]+)+", text)} & set(registry.TOOLS)
        for toolset in {registry.TOOLS[name].toolset for name in named - served}:
            assert f'`enable_toolsets` with `["{toolset}"]`' in text, (path.name, toolset, sorted(named - served))


def test_unknown_toolset_is_a_usage_error(cli_env):
    out = subprocess.run(["quanteval-mcp", "--toolsets", "config,nope"], capture_output=True, text=True, env=cli_env, timeout=60)
    assert out.returncode == 2 and "nope" in out.stderr and "config" in out.stderr


def test_eval_server_tools_are_served_on_request(cli_env):
    """The default serves the evaluation workflow; `--toolsets all` (or naming evalserver, deploy) adds the rest."""
    async def names(*args: str) -> set[str]:
        async with Client(StdioServerParameters(command="quanteval-mcp", args=list(args), env=cli_env)) as client:
            return {tool.name for tool in (await client.list_tools()).tools}

    assert anyio.run(names, "--toolsets", "all") == set(registry.TOOLS)
    assert anyio.run(names, "--toolsets", "evalserver") == {"start_eval_server", "eval_server_status", "stop_eval_server"}
    deploy = {"plan_deployment", "launch_deployment", "deployment_status", "stop_deployment"}
    assert anyio.run(names, "--toolsets", "default,deploy") == set(registry.select(list(toolsets.DEFAULT_TOOLSETS))) | deploy


# ---------------------------------------------------------------- fast start over stdio


def _stdio_session(cli_env, calls_before_list: bool = False) -> list[dict]:
    """initialize, initialized, tools/list, a tool call, tools/list again: the raw answers, in order."""
    proc = subprocess.Popen(["quanteval-mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=cli_env, text=True)
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "check_environment", "arguments": {"probe_gpus": False}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/list"},
    ]
    if calls_before_list:
        requests[2], requests[3] = requests[3], requests[2]
    for request in requests:  # all at once, as a client that does not wait would
        proc.stdin.write(json.dumps(request) + "\n")
    proc.stdin.flush()
    answers = {}
    while len(answers) < 4:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-2000:]
        message = json.loads(line)
        answers[message["id"]] = message
    proc.stdin.close()
    assert proc.stdout.read() == ""  # nothing more: the replayed initialize's answer never reaches the client
    proc.wait(timeout=30)
    return [answers[i] for i in (1, 2, 3, 4)]


@pytest.mark.parametrize("calls_before_list", [False, True])
def test_second_start_answers_initialize_and_tools_list_as_the_sdk_did(cli_env, calls_before_list):
    first = _stdio_session(cli_env)  # the SDK answers everything and its answers are recorded
    second = _stdio_session(cli_env, calls_before_list)  # initialize and tools/list come from the recording
    assert second[0] == first[0]
    assert second[1]["result"] == first[1]["result"] == second[3]["result"]  # the SDK's own later answer agrees
    assert {tool["name"] for tool in second[1]["result"]["tools"]} == set(registry.select(list(toolsets.DEFAULT_TOOLSETS)))
    assert second[2]["result"]["structuredContent"]["quanteval"]  # the SDK took over the session


def test_compact_input_schemas_accept_what_the_models_accept():
    """Every optional field whose default is null takes null in the listed schema too (clients validate against it)."""
    from jsonschema import Draft202012Validator

    async def go():
        async with Client(build_server()) as client:
            return {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}

    schemas = anyio.run(go)
    for name, spec in registry.TOOLS.items():
        validator = Draft202012Validator(schemas[name])
        for field, info in spec.input_model.model_fields.items():
            if not info.is_required() and info.default is None:
                refused = [error for error in validator.iter_errors({field: None}) if list(error.path) == [field]]
                assert not refused, f"{name}.{field}: null refused by the listed schema"


@pytest.mark.parametrize("depth", [300, 5000])
def test_a_request_nested_too_deep_gets_an_error_and_the_server_serves_on(cli_env, depth):
    """Arguments nested past what the SDK's parser takes (~200 levels) got no answer at all, and past Python's
    recursion limit (~1,000) ended the server: now an error for that id, and the next call is answered."""
    value = "[" * depth + "1" + "]" * depth
    lines = [json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                 "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
             json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}),
             '{"jsonrpc":"2.0","id":"deep","method":"tools/call","params":{"name":"set_config_value","arguments":'
             '{"config_path":"/nowhere.yaml","key":"a","value":' + value + "}}}",
             json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "list_tasks", "arguments": {"limit": 1}}})]
    proc = subprocess.Popen(["quanteval-mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=cli_env, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    answers: dict = {}
    try:
        proc.stdin.write("\n".join(lines) + "\n")
        proc.stdin.flush()
        while 3 not in answers:
            line = proc.stdout.readline()
            assert line, f"the server ended after {sorted(answers, key=str)}"
            message = json.loads(line)
            answers[message.get("id")] = message
    finally:
        proc.stdin.close()
        proc.wait(timeout=20)
    assert answers["deep"]["error"]["code"] == -32600 and f"nested {depth + 3} levels" in answers["deep"]["error"]["message"]
    assert "result" in answers[3], answers[3]


def _wait_for_http(url: str, timeout_s: float = 60) -> None:
    """Until the server at url answers HTTP at all."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(url, timeout=1, trust_env=False)
            return
        except httpx.HTTPError:
            assert time.monotonic() < deadline, "the HTTP server did not start"
            time.sleep(0.2)


def test_sigterm_stops_the_http_server_while_a_client_holds_its_event_stream_open(cli_env):
    """A client's GET /mcp event stream never ends by itself: uvicorn waited for it for ever after SIGTERM. Now the
    server is gone within its shutdown grace."""
    import signal
    import threading

    import httpx

    from quanteval.faces.server import HTTP_SHUTDOWN_GRACE_S
    from quanteval.localproc import free_port

    port = free_port()
    proc = subprocess.Popen(["quanteval-mcp", "--http", "--port", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=cli_env)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        _wait_for_http(url)
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        hello = httpx.post(url, headers=headers, trust_env=False, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        session = {**headers, "mcp-session-id": hello.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
        httpx.post(url, headers=session, trust_env=False, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        opened = threading.Event()

        def listen() -> None:
            try:
                with httpx.stream("GET", url, headers={**session, "Accept": "text/event-stream"}, timeout=None, trust_env=False) as stream:
                    opened.set()
                    for _ in stream.iter_bytes():
                        pass
            except httpx.HTTPError:
                pass

        threading.Thread(target=listen, daemon=True).start()
        assert opened.wait(10)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=HTTP_SHUTDOWN_GRACE_S + 20)
        assert time.monotonic() - started < HTTP_SHUTDOWN_GRACE_S + 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_half_sent_http_requests_are_closed_and_the_server_answers_meanwhile(cli_env, tmp_path):
    """uvicorn has no deadline for a request's headers: 70 sockets that sent part of a request line (or nothing) were
    held open for ever. Now each is closed at the header deadline, and a client is served while they wait."""
    import socket

    import httpx

    from quanteval.localproc import free_port

    port = free_port()
    deadline_s = 2.0  # the real server's code with its deadline shortened, so the test waits seconds, not ten
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from quanteval.faces import server; "
                             f"server.HTTP_HEADER_DEADLINE_S = {deadline_s}; sys.exit(server.main(sys.argv[1:]))",
                             "--http", "--port", str(port), "--root", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cli_env)
    url = f"http://127.0.0.1:{port}/mcp"
    held: list[socket.socket] = []
    try:
        _wait_for_http(url)
        for number in range(70):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            if number % 10:  # one in ten sends nothing at all
                sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")
            held.append(sock)
        opened = time.monotonic()
        headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
        hello = httpx.post(url, headers=headers, trust_env=False, timeout=5, json={
            "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert hello.status_code == 200 and hello.headers["mcp-session-id"]
        for sock in held:
            assert sock.recv(1024) == b""  # closed by the server (recv would time out after 10 s otherwise)
        assert time.monotonic() - opened < deadline_s + 5
    finally:
        for sock in held:
            sock.close()
        proc.terminate()
        proc.wait(timeout=30)


@requires("nel-next")  # real_run
def test_reports_a_tool_wrote_come_back_as_resources_the_client_can_read(real_run, tmp_path):
    """An IDE assistant in a sandbox cannot open a path on the server's machine: compare_results' report, markdown and
    chart come back as resource links, and resources/read serves those files (only those)."""
    import base64

    async def go():
        async with Client(build_server(toolsets=DEFAULT)) as client:
            result = await client.call_tool("compare_results", {"baseline": str(real_run), "candidate": str(real_run),
                                                                 "output_dir": str(tmp_path / "report")})
            assert not result.is_error, result.content[0].text
            links = {block.name: block for block in result.content if block.type == "resource_link"}
            read = {name: (await client.read_resource(link.uri)).contents[0] for name, link in links.items()}
            with pytest.raises(MCPError):
                await client.read_resource("quanteval://reports/0000000000000000/passwd")
            return result.structured_content, links, read

    data, links, read = anyio.run(go)
    assert set(links) == {"report.html", "report.md", "comparison.png"}, set(links)
    assert read["report.html"].text == Path(data["report_html"]).read_text()
    assert read["report.md"].text == Path(data["report_markdown"]).read_text()
    assert base64.b64decode(read["comparison.png"].blob) == Path(data["chart_png"]).read_bytes()
    assert links["comparison.png"].mime_type == "image/png" and str(tmp_path) not in links["report.html"].uri


# ---------------------------------------------------------------- fixes a client can follow from where it is


def _calls(server, *steps: tuple[str, dict]) -> list:
    async def go():
        async with Client(server) as client:
            return [await client.call_tool(name, arguments) for name, arguments in steps]

    return anyio.run(go)


def test_a_new_config_gets_its_folder_made_inside_the_root_and_never_outside(tmp_path):
    """An MCP client has no tool that makes a folder: build_config makes the one it writes into, inside --root only."""
    root = tmp_path / "root"
    root.mkdir()
    wanted = root / "configs" / "model-a" / "eval.yaml"
    outside = tmp_path / "elsewhere" / "eval.yaml"
    build = {"engine": "nel-next", "execution": "local", "deployment": "vllm", "model_type": "base", "benchmarks": ["skills://aime25"]}
    made, refused = _calls(build_server(root=root), ("build_config", build | {"config_path": str(wanted)}),
                           ("build_config", build | {"config_path": str(root / ".." / "elsewhere" / "eval.yaml")}))
    assert not made.is_error, made.content[0].text
    assert made.structured_content["config_path"] == str(wanted) and wanted.is_file()
    assert refused.is_error and "outside the workspace root" in refused.content[0].text
    assert not outside.parent.exists()


def test_a_missing_engine_names_the_absolute_setup_script_and_variable(tmp_path, monkeypatch):
    """nel-next missing: the fix is a command the client can run from any folder (the checkout's script by its
    absolute path, with the venv variable this server reads), not `bash scripts/...` relative to an install it cannot see."""
    venv = tmp_path / "no-nel-next"
    monkeypatch.setenv("QUANTEVAL_NEL_NEXT_VENV", str(venv))
    config = tmp_path / "eval.yaml"
    build = {"engine": "nel-next", "execution": "local", "deployment": "vllm", "model_type": "base",
             "benchmarks": ["skills://aime25"], "config_path": str(config)}
    *_, validated = _calls(build_server(), ("build_config", build),
                           ("apply_checkpoint", {"config_path": str(config), "checkpoint": str(CHECKPOINTS / "tiny-add-bf16")}),
                           ("validate_config", {"config_path": str(config)}))
    assert validated.is_error
    text = validated.content[0].text
    command = re.search(r"`([^`]*setup-nel-next[^`]*)`", text)
    assert command, text
    words = shlex.split(command.group(1))
    assert words[0] == f"QUANTEVAL_NEL_NEXT_VENV={venv}"
    assert words[1] == "bash" and Path(words[2]).is_absolute() and Path(words[2]).is_file(), text
    assert "QUANTEVAL_NEL_NEXT_VENV" in text and str(venv) in text
