"""The skill pack over MCP per the Skills extension (SEP-2640, io.modelcontextprotocol/skills).

Every check runs through a real MCP session: `mcp.Client(server)` in-process, `mcp.Client` over a `quanteval-mcp`
stdio subprocess, or raw JSON-RPC lines to one (the 2025-06-18 handshake Claude Code speaks). The SDK client has no
method for skills/list or skills/get, so they go out as plain requests.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import yaml
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp_types import RequestParams
from pydantic import TypeAdapter
from tiers import REPO

from quanteval.faces import skillpack
from quanteval.faces.server import build_server

EXTENSION = "io.modelcontextprotocol/skills"
SKILLS = ["compare-results", "deployment", "evaluation", "monitor"]
# URIs that try to leave the skill pack, or name nothing it serves; each must be refused with -32602.
ESCAPES = [
    "skill://../../etc/passwd",
    "skill://..",
    "skill://evaluation/../../../etc/passwd",
    "skill://evaluation/../monitor/SKILL.md",
    "skill://evaluation/./SKILL.md",
    "skill://evaluation//SKILL.md",
    "skill://evaluation/%2e%2e/%2e%2e/pyproject.toml",
    "skill://evaluation/..\\..\\pyproject.toml",
    "skill:///etc/passwd",
    "skill://common/slurm-setup.md",  # skills/common is shared guidance inside each skill, not a skill
    "skill://mcp_server/quanteval/__init__.py",
]


class SkillParams(RequestParams):
    uri: str | None = None
    cursor: str | None = None


async def ask(client: Client, method: str, **params: Any) -> dict[str, Any]:
    request = types.Request(method=method, params=SkillParams(**params))
    return await client.session.send_request(request, TypeAdapter(dict[str, Any]))


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """What `quanteval skills install` writes, from the real command."""
    from tiers import user_env

    dest = tmp_path_factory.mktemp("installed") / "skills"
    done = subprocess.run(["quanteval", "skills", "install", "--dest", str(dest)], capture_output=True, text=True,
                          env=user_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    return dest


def installed_files(installed: Path, skill: str) -> dict[str, bytes]:
    return {path.relative_to(installed / skill).as_posix(): path.read_bytes()
            for path in sorted((installed / skill).rglob("*")) if path.is_file()}


# ---------------------------------------------------------------- in-process


def test_skills_list_get_and_read_serve_what_install_writes(installed):
    async def go():
        async with Client(build_server()) as client:
            listed = await ask(client, "skills/list")
            got = {entry["uri"]: await ask(client, "skills/get", uri=entry["uri"]) for entry in listed["skills"]}
            read = {}
            for entry in listed["skills"]:
                for resource in entry["resources"]:
                    read[resource["uri"]] = (await client.read_resource(resource["uri"])).contents[0]
            return client.server_capabilities, listed, got, read

    capabilities, listed, got, read = anyio.run(go)
    assert capabilities.extensions == {EXTENSION: {}}  # no directoryRead: resources/directory/read is not served
    assert capabilities.resources is not None  # the spec requires the resources capability beside the extension
    # protocol 2026-07-28 (what mcp.Client speaks): resultType and the list-caching hints
    assert (listed["resultType"], listed["ttlMs"], listed["cacheScope"]) == ("complete", 0, "private")
    assert "nextCursor" not in listed
    assert [entry["uri"] for entry in listed["skills"]] == [f"skill://{name}/SKILL.md" for name in SKILLS]
    for entry in listed["skills"]:
        name = entry["uri"].split("/")[2]
        files = installed_files(installed, name)
        # the front matter, verbatim, of the SKILL.md served and installed; its name is the URI's last skill segment
        assert entry["frontmatter"] == front_matter(files["SKILL.md"].decode())
        assert entry["frontmatter"]["name"] == name and entry["frontmatter"]["description"]
        # every file install writes, each once, with the sha256 and length of the installed bytes
        assert [r["uri"] for r in entry["resources"]][0] == entry["uri"]
        assert {r["uri"]: (r["digest"], r["size"]) for r in entry["resources"]} == {
            f"skill://{name}/{path}": (sha256(data), len(data)) for path, data in files.items()}
        for resource in entry["resources"]:
            content = read[resource["uri"]]
            path = resource["uri"].removeprefix(f"skill://{name}/")
            assert content.text.encode() == files[path]
            assert sha256(content.text.encode()) == resource["digest"]
            assert content.mime_type == ("text/markdown" if path.endswith(".md") else "text/yaml")
        # skills/get answers the same entry
        answer = got[entry["uri"]]
        assert answer["resultType"] == "complete" and answer["skill"] == entry and "ttlMs" in answer
    # the references a skill links to are files of that skill, reachable as the spec resolves relative links
    evaluation = read["skill://evaluation/SKILL.md"].text
    assert "(references/multi-node.md)" in evaluation and "skill://evaluation/references/multi-node.md" in read


def test_a_client_without_the_extension_gets_the_skills_as_plain_resources(installed):
    async def go():
        async with Client(build_server()) as client:
            listing = {str(resource.uri): resource for resource in (await client.list_resources()).resources}
            texts = {uri: (await client.read_resource(uri)).contents[0].text for uri in listing if uri.startswith("skill://")}
            return listing, texts

    listing, texts = anyio.run(go)
    expected = {f"skill://{name}/{path}": data for name in SKILLS for path, data in installed_files(installed, name).items()}
    assert set(texts) == set(expected)
    for uri, data in expected.items():
        assert texts[uri].encode() == data
        assert listing[uri].size == len(data)
    skill = listing["skill://evaluation/SKILL.md"]
    assert skill.name == "evaluation" and skill.mime_type == "text/markdown"
    assert skill.description == front_matter(expected["skill://evaluation/SKILL.md"].decode())["description"]
    # no second copy of a skill under another scheme; the pack's shared folders stay readable as quanteval://
    assert not [uri for uri in listing if uri.startswith("quanteval://skills/")]
    assert "quanteval://recipes/examples/example_eval.yaml" in listing


@pytest.mark.parametrize("uri", ESCAPES)
def test_a_uri_outside_the_served_skill_files_is_refused_with_a_clear_error(uri):
    async def go():
        async with Client(build_server()) as client:
            with pytest.raises(MCPError) as read:
                await client.read_resource(uri)
            with pytest.raises(MCPError) as get:
                await ask(client, "skills/get", uri=uri)
            return read.value, get.value

    read, get = anyio.run(go)
    for error in (read, get):
        assert error.code == -32602, error
        assert uri in error.message and "skill://evaluation/SKILL.md" in error.message, error.message
        assert "root:" not in error.message and "[project]" not in error.message  # no file's content leaked


def test_skills_get_wants_a_skill_md_and_skills_list_has_one_page():
    async def go():
        async with Client(build_server()) as client:
            with pytest.raises(MCPError) as not_skill_md:
                await ask(client, "skills/get", uri="skill://evaluation/references/multi-node.md")
            with pytest.raises(MCPError) as cursor:
                await ask(client, "skills/list", cursor="page-2")
            return not_skill_md.value, cursor.value

    not_skill_md, cursor = anyio.run(go)
    assert not_skill_md.code == -32602 and "give skill://evaluation/SKILL.md" in not_skill_md.message
    assert cursor.code == -32602 and "page-2" in cursor.message


@pytest.fixture
def pack_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the skill pack that the server serves instead of this checkout's."""
    root = tmp_path / "pack"
    for folder in skillpack.PACK_FOLDERS:
        shutil.copytree(REPO / folder, root / folder)
    monkeypatch.setattr(skillpack, "pack_root", lambda: root)
    return root


def test_a_digest_changes_when_its_file_does_and_only_that_one(pack_copy):
    server = build_server()

    async def state():
        async with Client(server) as client:
            entry = (await ask(client, "skills/get", uri="skill://evaluation/SKILL.md"))["skill"]
            text = (await client.read_resource("skill://evaluation/references/multi-node.md")).contents[0].text
            return {r["uri"]: r["digest"] for r in entry["resources"]}, text

    before, _ = anyio.run(state)
    reference = pack_copy / "references" / "multi-node.md"
    reference.write_text(reference.read_text() + "\nOne more line.\n")
    after, text = anyio.run(state)  # the same server, still running: nothing is cached
    changed = "skill://evaluation/references/multi-node.md"
    assert {uri for uri in before if before[uri] != after[uri]} == {changed}
    assert after[changed] == sha256(text.encode()) and text.endswith("One more line.\n")


def test_a_skill_whose_folder_and_front_matter_names_differ_is_not_served(pack_copy):
    skill_md = pack_copy / "skills" / "monitor" / "SKILL.md"
    skill_md.write_text(skill_md.read_text().replace("name: monitor", "name: watcher", 1))

    async def go():
        async with Client(build_server()) as client:
            listed = await ask(client, "skills/list")
            with pytest.raises(MCPError) as get:
                await ask(client, "skills/get", uri="skill://monitor/SKILL.md")
            resources = {str(resource.uri) for resource in (await client.list_resources()).resources}
            return listed, get.value, resources

    listed, get, resources = anyio.run(go)
    assert [entry["frontmatter"]["name"] for entry in listed["skills"]] == ["compare-results", "deployment", "evaluation"]
    assert get.code == -32602 and not [uri for uri in resources if uri.startswith("skill://monitor/")]


def test_the_workflow_prompt_is_the_installed_evaluation_skill(installed):
    async def go():
        async with Client(build_server()) as client:
            return await client.get_prompt(skillpack.WORKFLOW_PROMPT, {"checkpoint": "/data/m"})

    text = anyio.run(go).messages[0].content.text
    body = (installed / "evaluation" / "SKILL.md").read_text().split("---\n", 2)[2].lstrip()
    assert text.endswith(body) and "skill://evaluation/references/multi-node.md" in text


# ---------------------------------------------------------------- a real quanteval-mcp over stdio


def test_skills_over_stdio_with_the_sdk_client(cli_env, installed):
    async def go():
        async with Client(StdioServerParameters(command="quanteval-mcp", env=cli_env)) as client:
            listed = await ask(client, "skills/list")
            got = await ask(client, "skills/get", uri="skill://deployment/SKILL.md")
            read = (await client.read_resource("skill://deployment/SKILL.md")).contents[0].text
            with pytest.raises(MCPError) as escape:
                await client.read_resource("skill://deployment/../../pyproject.toml")
            return client.server_capabilities, listed, got, read, escape.value

    capabilities, listed, got, read, escape = anyio.run(go)
    assert capabilities.extensions == {EXTENSION: {}}
    assert [entry["frontmatter"]["name"] for entry in listed["skills"]] == SKILLS
    entry = got["skill"]
    assert entry == next(e for e in listed["skills"] if e["uri"] == "skill://deployment/SKILL.md")
    skill_md = (installed / "deployment" / "SKILL.md").read_bytes()
    assert read.encode() == skill_md and entry["resources"][0] == {
        "uri": "skill://deployment/SKILL.md", "digest": sha256(skill_md), "size": len(skill_md)}
    assert escape.code == -32602


def test_skills_over_stdio_with_the_2025_handshake(cli_env, installed):
    """The handshake Claude Code and VS Code speak: the extension is in the initialize result's capabilities (the
    SDK leaves it out below 2026-07-28), skills/list and skills/get answer, a skill file reads, an escape is refused."""
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "skills/list"},
        {"jsonrpc": "2.0", "id": 3, "method": "skills/get", "params": {"uri": "skill://monitor/SKILL.md"}},
        {"jsonrpc": "2.0", "id": 4, "method": "resources/read", "params": {"uri": "skill://monitor/references/run-validation.md"}},
        {"jsonrpc": "2.0", "id": 5, "method": "skills/get", "params": {"uri": "skill://../../etc/passwd"}},
        {"jsonrpc": "2.0", "id": 6, "method": "resources/read", "params": {"uri": "skill://monitor/../../../etc/passwd"}},
        {"jsonrpc": "2.0", "id": 7, "method": "resources/list"},
    ]
    proc = subprocess.Popen(["quanteval-mcp"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=cli_env, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    answers: dict[Any, dict] = {}
    try:
        proc.stdin.write("".join(json.dumps(request) + "\n" for request in requests))
        proc.stdin.flush()
        while len(answers) < 7:
            line = proc.stdout.readline()
            assert line, f"the server ended after {sorted(answers)}"
            message = json.loads(line)
            answers[message.get("id")] = message
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert answers[1]["result"]["capabilities"]["extensions"] == {EXTENSION: {}}
    listed = answers[2]["result"]
    assert "resultType" not in listed and "ttlMs" not in listed  # 2026-07-28 fields stay off a 2025 session
    assert [entry["uri"] for entry in listed["skills"]] == [f"skill://{name}/SKILL.md" for name in SKILLS]
    monitor = answers[3]["result"]["skill"]
    files = installed_files(installed, "monitor")
    assert monitor["frontmatter"] == front_matter(files["SKILL.md"].decode())
    assert monitor["resources"] == [{"uri": f"skill://monitor/{path}", "digest": sha256(data), "size": len(data)}
                                    for path, data in files.items()]
    assert answers[4]["result"]["contents"][0]["text"].encode() == files["references/run-validation.md"]
    for refused in (answers[5], answers[6]):
        assert refused["error"]["code"] == -32602 and "skill://<skill>/<path>" in refused["error"]["message"]
    plain = {resource["uri"] for resource in answers[7]["result"]["resources"]}
    assert {f"skill://monitor/{path}" for path in files} <= plain
