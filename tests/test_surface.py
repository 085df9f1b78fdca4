"""The whole tool surface, as MCP clients and CLI users see it."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
from pathlib import Path

import anyio
import pytest
from mcp import Client

from quanteval import registry, toolsets
from quanteval.faces.server import build_server
from quanteval.localproc import free_port

CONTRACT = """check_environment inspect_checkpoint build_config get_config_value set_config_value
delete_config_value list_missing_values list_tasks get_task_recipe add_tasks apply_checkpoint validate_config
dry_run launch_canary launch_full_run run_status run_logs kill_run resume_run list_runs ssh_check slurm_queue
remote_grep check_registry_credentials plan_deployment launch_deployment deployment_status stop_deployment
validate_run extract_scores compare_results wait_for_run evaluate_quantization gate_results""".split()


def list_tools(**options):
    async def go():
        async with Client(build_server(**options)) as client:
            return (await client.list_tools()).tools

    return anyio.run(go)


def test_every_contract_tool_is_registered():
    missing = [name for name in CONTRACT if name not in registry.TOOLS]
    assert not missing, f"contract tools not registered: {missing}"


def test_every_tool_has_description_schemas_and_annotations():
    tools = {tool.name: tool for tool in list_tools()}  # output schemas are listed by default
    assert set(tools) == set(registry.TOOLS)
    for name, spec in registry.TOOLS.items():
        tool = tools[name]
        assert len(tool.description) > 60, f"{name}: description must say what it does and when to use it"
        assert tool.input_schema["type"] == "object"
        assert tool.output_schema and tool.output_schema["type"] == "object", name
        annotations = tool.annotations
        assert annotations.read_only_hint is spec.read_only
        assert annotations.destructive_hint is spec.destructive
        assert annotations.idempotent_hint is spec.idempotent
        assert annotations.open_world_hint is spec.open_world
        # a read-only tool cannot also be destructive
        assert not (spec.read_only and spec.destructive), name
        # MCP clients see exactly the input model's fields, required where the model requires them
        fields = spec.input_model.model_fields
        assert set(tool.input_schema.get("properties", {})) == set(fields), name
        assert set(tool.input_schema.get("required", [])) == {f for f, info in fields.items() if info.is_required()}, name
        # every input field is described for the model that calls the tool
        for field, schema in tool.input_schema.get("properties", {}).items():
            assert schema.get("description"), f"{name}.{field} has no description"


def test_structured_content_equals_json_text():
    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool("check_environment", {"probe_gpus": False})

    result = anyio.run(go)
    assert not result.is_error
    assert json.loads(result.content[0].text) == result.structured_content
    assert result.structured_content["python"].startswith("3.")


def test_tool_error_reaches_the_client_as_an_error_result_without_traceback(tmp_path):
    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool("inspect_checkpoint", {"checkpoint": str(tmp_path / "absent")})

    result = anyio.run(go)
    assert result.is_error
    text = result.content[0].text
    assert "absent" in text and "no such checkpoint directory" in text
    assert "Traceback" not in text


def test_cli_tools_json_lists_every_tool(cli_env):
    out = subprocess.run(["quanteval", "tools", "--json"], capture_output=True, text=True, env=cli_env, check=True)
    listed = json.loads(out.stdout)
    assert [tool["name"] for tool in listed] == list(registry.TOOLS)
    assert all(tool["input_schema"]["type"] == "object" for tool in listed)


@pytest.mark.parametrize(
    ("argv", "code", "stderr_part"),
    [
        (["call", "no_such_tool"], 2, "Unknown tool"),
        (["call", "inspect_chekpoint"], 2, "Did you mean: inspect_checkpoint"),
        (["call", "check_environment", "--json", "{not json"], 2, "not valid JSON"),
        (["call", "check_environment", "--json", "[1]"], 2, "JSON object"),
        (["call", "check_environment", "--json", '{"probe_gpu": false}'], 2, "probe_gpu"),
        (["call", "inspect_checkpoint", "--json", '{"checkpoint": "/definitely/not/here"}'], 1, "no such checkpoint"),
    ],
)
def test_cli_exit_codes(cli_env, argv, code, stderr_part):
    out = subprocess.run(["quanteval", *argv], capture_output=True, text=True, env=cli_env)
    assert out.returncode == code, out.stderr
    assert stderr_part in out.stderr
    assert out.stdout == ""
    assert "Traceback" not in out.stderr


def test_cli_flags_that_mirror_a_tool_field_take_its_default_and_help():
    """`quanteval evaluate --max-drop` and friends: one default and one description, the input model's."""
    from quanteval.faces.cli import build_parser
    from quanteval.workflow.evaluate import EvaluateQuantizationInput
    from quanteval.workflow.gate import GateResultsInput

    parser = build_parser()
    args = parser.parse_args(["evaluate", "/a", "/b", "--benchmarks", "x.py,y.py"])
    fields = EvaluateQuantizationInput.model_fields
    assert args.benchmarks == ["x.py", "y.py"]
    for name in ("max_drop", "confidence", "canary_problems"):
        assert getattr(args, name) == fields[name].default
    subcommands = parser._subparsers._group_actions[0].choices
    for command, model in (("evaluate", EvaluateQuantizationInput), ("gate", GateResultsInput)):
        text = " ".join(subcommands[command].format_help().split())
        for name in ("policy", "output_dir"):
            assert " ".join(model.model_fields[name].description.split()) in text, (command, name)
    evaluate = " ".join(subcommands["evaluate"].format_help().split())
    assert "Default: 0.95." in evaluate and " ".join(fields["max_drop"].description.split()) in evaluate


def test_every_cli_flag_of_a_tool_command_is_a_field_with_its_default_help_and_choices():
    """Each friendly command mirrors one input model: every flag but --help/--json is one of its fields and takes the
    field's description, default and Literal choices, so the CLI cannot drift from what MCP clients see."""
    import typing

    from quanteval.evalserver.backend import ServerSettings
    from quanteval.faces.cli import _unwrap_optional, build_parser
    from quanteval.serving.checkpoint import InspectCheckpointInput
    from quanteval.workflow.evaluate import EvaluateQuantizationInput
    from quanteval.workflow.evaluate_cluster import ClusterSettings
    from quanteval.workflow.gate import GateResultsInput
    from quanteval.workflow.plan import PlanRequest

    models = {"inspect": InspectCheckpointInput, "plan": PlanRequest, "evaluate": EvaluateQuantizationInput,
              "gate": GateResultsInput, "serve-eval": ServerSettings}
    subcommands = build_parser()._subparsers._group_actions[0].choices
    mirrored = 0
    for command, model in models.items():
        parser = subcommands[command]
        parser.format_help()  # the field flags are added on first use
        for action in parser._actions:
            if action.dest in ("help", "json"):
                continue
            owner, name = model, action.dest
            if command == "evaluate" and name.startswith("cluster_"):  # --host's settings: fields of its `cluster`
                owner, name = ClusterSettings, name.removeprefix("cluster_")
            assert name in owner.model_fields, f"quanteval {command} {action.option_strings}: not a field of {owner.__name__}"
            field = owner.model_fields[name]
            assert " ".join(field.description.split()) in " ".join(action.help.replace("%%", "%").split()), (command, action.dest)
            kind = _unwrap_optional(field.annotation)
            if typing.get_origin(kind) is typing.Literal:
                assert list(action.choices) == list(typing.get_args(kind)), (command, action.dest)
            if action.option_strings and not field.is_required() and kind is not bool and action.nargs != argparse.ZERO_OR_MORE:
                # an appended flag (plan --set) starts empty: the model's own default applies when none is given
                # a nested field's flag (evaluate's cluster settings) too: `cluster` is given only when one is
                nested = owner is not model
                expected = None if isinstance(action, argparse._AppendAction) or nested else field.get_default(call_default_factory=True)
                assert action.default == expected, (command, action.dest)
            mirrored += 1
    assert mirrored >= 43  # inspect 1, plan 10, evaluate 9, gate 4, serve-eval 19 today


def test_cli_call_prints_only_json(cli_env):
    out = subprocess.run(
        ["quanteval", "call", "check_environment", "--json", '{"probe_gpus": false}'],
        capture_output=True, text=True, env=cli_env, check=True,
    )
    assert json.loads(out.stdout)["quanteval"]


def test_stdio_server_speaks_only_protocol_on_stdout(cli_env, tmp_path):
    """Spawn quanteval-mcp as an IDE would, drive it, and check every stdout line is a JSON-RPC message."""
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
         "params": {"name": "check_environment", "arguments": {"probe_gpus": False}}},
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call",
         "params": {"name": "inspect_checkpoint", "arguments": {"checkpoint": str(tmp_path / "nope")}}},
    ]
    proc = subprocess.Popen(
        ["quanteval-mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=cli_env, text=True,
    )
    answers = {}
    try:
        for request in requests:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            if "id" in request:
                while True:
                    line = proc.stdout.readline()
                    assert line, f"server closed stdout; stderr: {proc.stderr.read()[-2000:]}"
                    message = json.loads(line)  # anything that is not JSON fails here
                    assert message["jsonrpc"] == "2.0"
                    if message.get("id") == request["id"]:
                        answers[request["id"]] = message
                        break
    finally:
        proc.stdin.close()
        proc.wait(timeout=20)
    rest = proc.stdout.read()
    assert all(json.loads(line)["jsonrpc"] == "2.0" for line in rest.splitlines() if line.strip())
    # by default the evaluation workflow's toolsets: everything but the eval server's tools
    assert {tool["name"] for tool in answers[2]["result"]["tools"]} == set(registry.select(list(toolsets.DEFAULT_TOOLSETS)))
    assert "start_eval_server" not in {tool["name"] for tool in answers[2]["result"]["tools"]}
    assert answers[3]["result"]["structuredContent"]["quanteval"]
    assert answers[4]["result"]["isError"] is True


# What the model reads of tools/list over stdio: names, descriptions and input schemas, as compact JSON (as sent).
# A size budget, not a speed claim: every tool the default serves costs context in every session of every client.
DEFAULT_LISTING_BUDGET = 24_000


def model_visible_characters(tools: list[dict]) -> int:
    """Characters of the tools' names, descriptions and input schemas as the server sends them (compact JSON);
    benchmarks/bench_startup.py prints the same figure."""
    seen = [{key: tool[key] for key in ("name", "description", "inputSchema") if key in tool} for tool in tools]
    return len(json.dumps(seen, ensure_ascii=False, separators=(",", ":")))


def _stdio_tools_list(cli_env, *options: str) -> list[dict]:
    """tools/list over a real stdio session, as the client receives it."""
    proc = subprocess.Popen(["quanteval-mcp", *options], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=cli_env, text=True)
    try:
        for request in ({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
                        {"jsonrpc": "2.0", "method": "notifications/initialized"},
                        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}):
            proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        while True:
            message = json.loads(proc.stdout.readline())
            if message.get("id") == 2:
                return message["result"]["tools"]
    finally:
        proc.stdin.close()
        proc.wait(timeout=20)


@pytest.mark.slow
def test_default_tools_list_stays_within_its_size_budget(cli_env):
    """The default toolsets fit the budget docs/USAGE.md states; the rest are one flag away (`--toolsets all`)."""
    default = _stdio_tools_list(cli_env)
    everything = _stdio_tools_list(cli_env, "--toolsets", "all")
    assert {tool["name"] for tool in default} == set(registry.select(list(toolsets.DEFAULT_TOOLSETS)))
    assert {tool["name"] for tool in everything} == set(registry.TOOLS)
    size = model_visible_characters(default)
    assert size < DEFAULT_LISTING_BUDGET, (
        f"the default tools/list is {size} model-visible characters, over the {DEFAULT_LISTING_BUDGET} budget: "
        "tighten descriptions, or serve a toolset only on request (quanteval/toolsets.py)")
    assert_readme_states(len(default), size, len(everything), model_visible_characters(everything))


# docs/USAGE.md's figures for the two listings: "33 tools of which a model reads about 23k characters" (default) and
# "--toolsets all` for all 40 tools (~32k characters". Tool counts must be exact; characters within README_K_SLACK.
README_DEFAULT = re.compile(r"(\d+) tools of which a model reads about (\d+)k characters")
README_ALL = re.compile(r"`--toolsets all` for all (\d+) tools \(~(\d+)k characters")
README_K_SLACK = 1_000  # a figure rounded to thousands, plus ~500 characters of drift before it must be restated


def assert_readme_states(default_tools: int, default_chars: int, all_tools: int, all_chars: int) -> None:
    """docs/USAGE.md states what tools/list measures (the figures benchmarks/bench_startup.py also prints)."""
    readme = " ".join((Path(__file__).resolve().parents[1] / "docs" / "USAGE.md").read_text(encoding="utf-8").split())
    stated = {}
    for label, pattern in (("default", README_DEFAULT), ("all", README_ALL)):
        match = pattern.search(readme)
        assert match, f"docs/USAGE.md no longer states the {label} tools/list figure in the form {pattern.pattern!r}"
        stated[label] = (int(match[1]), int(match[2]) * 1000)
    measured = {"default": (default_tools, default_chars), "all": (all_tools, all_chars)}
    for label, (tools, chars) in measured.items():
        said_tools, said_chars = stated[label]
        assert said_tools == tools and abs(said_chars - chars) <= README_K_SLACK, (
            f"docs/USAGE.md says the {label} tools/list has {said_tools} tools and ~{said_chars // 1000}k model-visible "
            f"characters; measured {tools} tools, {chars} characters: restate it ({round(chars / 1000)}k)")


@pytest.mark.slow
def test_stdio_and_http_transports_give_identical_results(cli_env, repo):
    """The same tools and the same structured answers over stdio and streamable HTTP (127.0.0.1 only)."""
    import time
    import urllib.request

    from mcp import StdioServerParameters

    example = str(repo / "examples" / "checkpoints" / "llama-tiny-fp8")
    port = free_port()
    http = subprocess.Popen(["quanteval-mcp", "--http", "--port", str(port)], env=cli_env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/mcp", timeout=1)
            except urllib.error.HTTPError:
                break  # it answers (a bare GET is not a valid MCP request)
            except OSError:
                assert http.poll() is None, http.stderr.read()
                assert time.monotonic() < deadline, "HTTP server did not come up"
                time.sleep(0.2)

        async def session(target):
            async with Client(target) as client:
                tools = sorted(tool.name for tool in (await client.list_tools()).tools)
                result = await client.call_tool("inspect_checkpoint", {"checkpoint": example})
                return tools, result.structured_content

        over_stdio = anyio.run(session, StdioServerParameters(command="quanteval-mcp", env=cli_env))
        over_http = anyio.run(session, f"http://127.0.0.1:{port}/mcp")
    finally:
        http.terminate()
        http.wait(timeout=20)
    assert over_stdio == over_http
    assert over_stdio[1]["quantization"]["quant_algo"] == "FP8"


# ---------------------------------------------------------------- the surface, snapshotted

SURFACE_SNAPSHOT = Path(__file__).parent / "data" / "tool_surface.json"
UPDATE_HINT = ("QUANTEVAL_UPDATE_SURFACE=1 .venv/bin/python -m pytest tests/test_surface.py -k surface_snapshot, "
               "then read `git diff tests/data/tool_surface.json`")


def _schema_type(schema: dict, defs: dict) -> str:
    """A short, stable spelling of a JSON-schema type: what a client must send."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return _schema_type(defs[name], defs) if "enum" in defs.get(name, {}) else name
    if "enum" in schema:  # an optional enum lists null among its values
        values = [value for value in schema["enum"] if value is not None]
        return "enum[" + ",".join(str(value) for value in values) + "]" + ("|null" if None in schema["enum"] else "")
    if "anyOf" in schema:
        return "|".join(_schema_type(option, defs) for option in schema["anyOf"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):  # the server's compact form of anyOf [X, null]
        return "|".join(_schema_type({**schema, "type": one}, defs) for one in kind)
    if kind == "array":
        return f"array[{_schema_type(schema.get('items', {}), defs)}]"
    return kind


def tool_surface() -> dict:
    """What a model reads (description, each argument's type and description) and what a client checks (required,
    output fields, annotations), as an MCP client sees them, with the toolset that serves each tool."""
    surface = {}
    for tool in list_tools(output_schemas=True):
        inputs, outputs = tool.input_schema, tool.output_schema or {}
        required = set(inputs.get("required", []))
        defs = {**inputs.get("$defs", {}), **outputs.get("$defs", {})}
        annotations = tool.annotations
        surface[tool.name] = {
            "toolset": registry.TOOLS[tool.name].toolset,
            "description": tool.description,
            "arguments": {name: {"type": ("" if name in required else "?") + _schema_type(schema, defs),
                                 "description": schema.get("description", "")}
                          for name, schema in inputs.get("properties", {}).items()},
            "returns": sorted(outputs.get("properties", {})),
            "annotations": [hint for hint, on in (("read_only", annotations.read_only_hint),
                                                  ("destructive", annotations.destructive_hint),
                                                  ("idempotent", annotations.idempotent_hint),
                                                  ("open_world", annotations.open_world_hint)) if on],
        }
    return dict(sorted(surface.items()))


def test_tool_surface_snapshot():
    """A rename, a new argument, a changed annotation or toolset, and any change to the text a model reads (a tool's or
    an argument's description) is a deliberate, reviewed diff of tool_surface.json."""
    surface = tool_surface()
    if os.environ.get("QUANTEVAL_UPDATE_SURFACE"):
        SURFACE_SNAPSHOT.write_text(json.dumps(surface, indent=1) + "\n")
    committed = json.loads(SURFACE_SNAPSHOT.read_text())
    changed = sorted(name for name in surface.keys() | committed.keys() if surface.get(name) != committed.get(name))
    assert not changed, f"the tool surface changed for {changed}; review the diff, then regenerate: {UPDATE_HINT}"


VOCABULARY_RETIRED = {  # old names of one concept; docs/USAGE.md's vocabulary table gives the one kept
    "path": "checkpoint / config_path / key", "output": "config_path", "where": "host", "run_id": "record_id",
    "deployment_id": "record_id", "server_id": "record_id", "state": "status", "gpus": "tensor_parallel_size",
}


def test_one_name_per_concept():
    surface = tool_surface()
    used = {(tool, name) for tool, entry in surface.items() for name in [*entry["arguments"], *entry["returns"]]}
    # remote_grep's path is a file on the remote host; check_environment's gpus is the list of GPUs it found
    exempt = {("remote_grep", "path"), ("check_environment", "gpus")}
    offenders = sorted(f"{tool}.{name} (use {VOCABULARY_RETIRED[name]})" for tool, name in used - exempt
                       if name in VOCABULARY_RETIRED)
    assert not offenders, offenders


def test_readme_and_server_instructions_name_only_registered_tools(repo):
    import re

    from quanteval.faces import server

    readme = (repo / "docs" / "USAGE.md").read_text()
    table = readme[readme.index("| step | tools |"):]
    table = table[:table.index("\n\n")]
    listed = re.findall(r"`([a-z_]+)`", table)
    assert sorted(listed) == sorted(registry.TOOLS), "docs/USAGE.md's tool table and the registry differ"
    named = re.findall(r"[a-z]+_[a-z_]+", server.INSTRUCTIONS)
    assert set(named) <= set(registry.TOOLS), set(named) - set(registry.TOOLS)


def test_the_claude_plugin_manifest_ships_these_skills_and_this_server_at_this_version(repo):
    """One install brings skills and tools together, matching in version (.claude-plugin/plugin.json)."""
    import json
    import shutil
    import tomllib

    manifest = json.loads((repo / ".claude-plugin" / "plugin.json").read_text())
    version = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"]
    assert manifest["name"] == "quanteval" and manifest["version"] == version
    skills_dir = repo / manifest["skills"]
    names = sorted(p.parent.name for p in skills_dir.glob("*/SKILL.md"))
    assert names == sorted(["evaluation", "deployment", "monitor", "compare-results"]), names
    server = manifest["mcpServers"]["quanteval"]
    assert server["command"] == "quanteval-mcp"
    assert shutil.which(server["command"], path=str(repo / ".venv" / "bin")), "the console script the manifest starts"


def test_tool_text_says_nel_alone_only_where_both_engines_are_not_meant():
    """Every tool runs configs of both engines: "NEL" alone reads as either, so a description or argument names NEL
    0.2.6 where only it is meant (its catalogue, its job ids, its eval-server backend) and says neither otherwise."""
    bare = re.compile(r"\bNEL\b(?! 0\.2\.6)")
    found = [f"{name}: {text[max(0, hit.start() - 40):hit.end() + 40]}" for name, texts in _tool_texts().items()
             for text in texts for hit in bare.finditer(text)]
    assert found == []


def _tool_texts() -> dict[str, list[str]]:
    from quanteval import registry

    def descriptions(node: object) -> list[str]:
        if isinstance(node, dict):
            own = [str(node["description"])] if isinstance(node.get("description"), str) else []
            return own + [text for value in node.values() for text in descriptions(value)]
        return [text for value in node for text in descriptions(value)] if isinstance(node, list) else []

    return {name: [spec.description, *descriptions(spec.input_model.model_json_schema())]
            for name, spec in registry.TOOLS.items()}
