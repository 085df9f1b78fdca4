"""`quanteval-mcp --root DIR` and links inside the root: a file a tool writes goes where its resolved path says and
replaces a link planted at its name instead of writing through it; a folder that is a link out is refused; a report
served as a resource is the bytes written, to the session that wrote it; `--read-only` writes nothing. And a client
session's enable_toolsets is its own. Over a real MCP session (the SDK's in-process client), as tests/test_confine.py
drives a rooted server; sessions of the handshake protocol (mode="legacy"), as HTTP sessions are: a request of the
stateless 2026-07-28 protocol belongs to no session."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import test_confine
from mcp import Client
from test_confine import calls
from tiers import requires

from quanteval.faces.server import build_server

workspace = test_confine.workspace  # the fixture: ROOT and a folder beside it



def _outside_files(outside: Path, *names: str) -> dict[str, Path]:
    outside.mkdir(parents=True, exist_ok=True)
    files = {}
    for name in names:
        files[name] = outside / f"victim-{name}"
        files[name].write_text(f"precious {name}\n")
    return files


def _plant(folder: Path, targets: dict[str, Path]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in targets.items():
        (folder / name).symlink_to(target)


def _untouched(targets: dict[str, Path]) -> None:
    for name, target in targets.items():
        assert target.read_text() == f"precious {name}\n", f"{target} was written through the link {name}"


@requires("nel-next")  # real_run: a real nel-next run to compare and gate
def test_compare_results_replaces_links_planted_at_its_report_names_and_writes_nothing_outside(workspace, real_run):
    inside, outside = workspace
    run, out = inside / "run", inside / "out"
    shutil.copytree(real_run, run)
    victims = _outside_files(outside, "report.html", "report.md", "comparison.png")
    _plant(out, victims)
    (compared,) = calls(inside, ("compare_results", {"baseline": str(run), "candidate": str(run), "output_dir": str(out)}))
    assert not compared.is_error, compared.content[0].text
    _untouched(victims)
    for name in victims:  # the reports are where the tool said, as files of their own
        assert (out / name).is_file() and not (out / name).is_symlink()
    assert "<html" in (out / "report.html").read_text().lower()


@requires("nel-next")  # real_run: a real nel-next run to compare and gate
def test_gate_results_replaces_a_link_at_its_policy_name_and_a_read_only_server_writes_nothing(workspace, real_run):
    inside, outside = workspace
    run, out = inside / "run", inside / "gate"
    shutil.copytree(real_run, run)
    victims = _outside_files(outside, "nel-gate-policy.yaml", "gate-report.json")
    _plant(out, victims)
    gate = {"baseline": str(run), "candidate": str(run), "max_drop": 5}
    (gated,) = calls(inside, ("gate_results", {**gate, "output_dir": str(out)}))
    assert not gated.is_error, gated.content[0].text
    _untouched(victims)
    assert gated.structured_content["policy"] == str(out / "nel-gate-policy.yaml")
    assert not (out / "nel-gate-policy.yaml").is_symlink() and not (out / "gate-report.json").is_symlink()

    async def read_only():
        async with Client(build_server(root=inside, read_only=True)) as client:
            return [await client.call_tool("gate_results", gate),
                    await client.call_tool("gate_results", {**gate, "output_dir": str(inside / "elsewhere")})]

    before = sorted(path for path in inside.rglob("*"))
    plain, asked = anyio.run(read_only)
    assert not plain.is_error, plain.content[0].text
    assert plain.structured_content["verdict"] == gated.structured_content["verdict"]
    assert "--read-only" in plain.structured_content["policy"]
    assert asked.is_error and "--read-only" in asked.content[0].text, asked.content[0].text
    assert sorted(path for path in inside.rglob("*")) == before  # no policy, no report, no ROOT/.quanteval


@requires("nel-next")  # real_run: a real nel-next run to compare and gate
def test_a_linked_state_folder_in_the_root_sends_no_unasked_write_outside(workspace, real_run):
    """ROOT/.quanteval, where a confined call writes what it was not given a place for, planted as a link out (and a
    folder under it, and an output_dir that is a link out): refused, naming the link, and nothing is written there."""
    inside, outside = workspace
    run = inside / "run"
    shutil.copytree(real_run, run)
    outside.mkdir()
    (inside / ".quanteval").symlink_to(outside, target_is_directory=True)
    (inside / "out").symlink_to(outside, target_is_directory=True)
    compared, gated, out = calls(inside, ("compare_results", {"baseline": str(run), "candidate": str(run)}),
                                 ("gate_results", {"baseline": str(run), "candidate": str(run), "max_drop": 5}),
                                 ("compare_results", {"baseline": str(run), "candidate": str(run), "output_dir": str(inside / "out" / "sub")}))
    for result in (compared, gated, out):
        assert result.is_error and "outside the workspace root" in result.content[0].text, result.content[0].text
    assert list(outside.iterdir()) == []
    (inside / ".quanteval").unlink()
    (inside / ".quanteval").mkdir()
    (inside / ".quanteval" / "comparisons").symlink_to(outside, target_is_directory=True)
    (deeper,) = calls(inside, ("compare_results", {"baseline": str(run), "candidate": str(run)}))
    assert deeper.is_error and "outside the workspace root" in deeper.content[0].text, deeper.content[0].text
    assert list(outside.iterdir()) == []


@requires("nel-next")  # real_run: a real nel-next run to compare and gate
def test_a_report_swapped_for_a_link_after_the_call_is_served_as_written_and_only_to_its_session(workspace, real_run):
    inside, outside = workspace
    run, out = inside / "run", inside / "out"
    shutil.copytree(real_run, run)
    secret = _outside_files(outside, "secret")["secret"]
    server = build_server(root=inside)

    async def go():
        async with Client(server, mode="legacy") as client, Client(server, mode="legacy") as other:
            result = await client.call_tool("compare_results", {"baseline": str(run), "candidate": str(run), "output_dir": str(out)})
            assert not result.is_error, result.content[0].text
            link = next(block for block in result.content if block.type == "resource_link" and block.name == "report.md")
            written = (out / "report.md").read_text()
            (out / "report.md").unlink()
            (out / "report.md").symlink_to(secret)
            served = (await client.read_resource(link.uri)).contents[0].text
            listed = {str(resource.uri) for resource in (await client.list_resources()).resources}
            others = {str(resource.uri) for resource in (await other.list_resources()).resources}
            try:
                refused = str(await other.read_resource(link.uri))
            except Exception as exc:  # noqa: BLE001  (the SDK's error for an unknown resource)
                refused = str(exc)
            return written, served, str(link.uri), listed, others, refused

    written, served, uri, listed, others, refused = anyio.run(go)
    assert served == written and "precious" not in served
    assert uri in listed and uri not in others
    assert "session whose call wrote it" in refused, refused


def test_a_sessions_enable_toolsets_is_its_own(tmp_path):
    server = build_server(toolsets=["setup", "results"], root=tmp_path)

    async def go():
        async with Client(server, mode="legacy") as one, Client(server, mode="legacy") as two:
            enabled = await one.call_tool("enable_toolsets", {"toolsets": ["deploy"]})
            mine = {tool.name for tool in (await one.list_tools()).tools}
            theirs = {tool.name for tool in (await two.list_tools()).tools}
            refused = await two.call_tool("plan_deployment", {"checkpoint": str(tmp_path), "framework": "vllm"})
        return enabled, mine, theirs, refused

    enabled, mine, theirs, refused = anyio.run(go)
    assert not enabled.is_error and "plan_deployment" in mine and "plan_deployment" not in theirs
    assert refused.is_error and 'call enable_toolsets with toolsets ["deploy"]' in refused.content[0].text


def test_the_operators_toolsets_are_a_ceiling_for_enable_toolsets(tmp_path):
    """`quanteval-mcp --toolsets setup,cluster` serves setup and lets a client add cluster, nothing else."""
    ceiled = build_server(toolsets=["setup"], root=tmp_path, ceiling=["setup", "cluster"])

    async def go():
        async with Client(ceiled, mode="legacy") as client:
            beyond = await client.call_tool("enable_toolsets", {"toolsets": ["deploy", "cluster"]})
            listed = {tool.name for tool in (await client.list_tools()).tools}
            outside = await client.call_tool("plan_deployment", {"checkpoint": str(tmp_path), "framework": "vllm"})
        return beyond, listed, outside

    beyond, listed, outside = anyio.run(go)
    assert beyond.structured_content["added"] and all(name not in listed for name in ("plan_deployment", "launch_deployment"))
    assert "ssh_check" in listed and "deploy (its operator started it with --toolsets setup,cluster)" in beyond.structured_content["message"]
    assert outside.is_error and "did not serve" in outside.content[0].text, outside.content[0].text


def test_a_run_named_as_host_path_on_this_machine_by_any_of_its_names_is_confined(workspace):
    """`localhost:/path`, `127.0.0.1:/path` and `user@localhost:/path` are this machine's files, as `local:/path` is:
    one outside the root is refused, not taken for a cluster's."""
    import getpass
    import socket

    inside, outside = workspace
    names = ["local", "localhost", "127.0.0.1", f"{getpass.getuser()}@localhost", socket.gethostname()]
    results = calls(inside, *(("validate_run", {"run": f"{name}:{outside / 'run'}"}) for name in names))
    for name, result in zip(names, results, strict=True):
        assert result.is_error and "outside the workspace root" in result.content[0].text, (name, result.content[0].text)
