"""The MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in tests/mcp_clients, run on the Node 22
installed there) against `quanteval-mcp --http` on 127.0.0.1: every server scenario that applies to quanteval passes,
one parametrized case each, and every other scenario the suite lists is named below with why it does not apply. Most
of those ask for the fixtures of the suite's "everything server" (tools, prompts and resources named test_*), which a
real server does not have; a few ask for optional capabilities quanteval does not declare. Two of them would pass here
for the wrong reason (an unknown tool is a tool error whose text says so), so they are listed rather than run.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiers import CONFORMANCE, MCP_CLIENTS, NODE, VENV_BIN, requires, user_env

from quanteval.localproc import free_port

pytestmark = requires("npm")

# What each scenario that applies checks.
APPLIES = {
    "server-initialize": "the initialize handshake over streamable HTTP",
    "ping": "ping answers {}",
    "tools-list": "every tool has a name, a description and an input schema",
    "resources-list": "every resource (the skills and recipes) has a uri and a name",
    "prompts-list": "every prompt has a name and a description",
    "server-sse-multiple-streams": "three concurrent POSTs in one session, each answered on a working SSE stream",
    "dns-rebinding-protection": "a foreign Host/Origin is refused (4xx), localhost's is served",
}

FIXTURE = "needs the suite's everything-server fixture {}, which quanteval does not have"
NO_LOGGING = "logging/setLevel: quanteval declares no `logging` capability (it logs to stderr), so it answers Method not found"
NOT_APPLICABLE = {
    "tools-call-simple-text": FIXTURE.format("tool test_simple_text") + " (it would pass: an unknown tool is a tool error with text)",
    "tools-call-error": FIXTURE.format("tool test_error_handling") + " (it would pass: an unknown tool is a tool error with text)",
    "tools-call-image": FIXTURE.format("tool test_image_content"),
    "tools-call-audio": FIXTURE.format("tool test_audio_content"),
    "tools-call-embedded-resource": FIXTURE.format("tool test_embedded_resource"),
    "tools-call-mixed-content": FIXTURE.format("tool test_multiple_content_types"),
    "tools-call-with-progress": FIXTURE.format("tool test_tool_with_progress")
                                + " (quanteval's own progress reports: test_mcp_long_calls, test_evaluate_real)",
    "tools-call-with-logging": NO_LOGGING + "; and " + FIXTURE.format("tool test_tool_with_logging"),
    "tools-call-sampling": FIXTURE.format("tool test_sampling") + "; quanteval never asks the client to sample",
    "tools-call-elicitation": FIXTURE.format("tool test_elicitation") + "; quanteval never elicits",
    "elicitation-sep1034-defaults": FIXTURE.format("tool test_elicitation_sep1034_defaults") + "; quanteval never elicits",
    "elicitation-sep1330-enums": FIXTURE.format("tool test_elicitation_sep1330_enums") + "; quanteval never elicits",
    "json-schema-2020-12": FIXTURE.format("tool json_schema_2020_12_tool") + " (a pending scenario)",
    "server-sse-polling": FIXTURE.format("tool test_reconnection, which closes its SSE stream mid-call,")
                          + " (a pending scenario)",
    "logging-set-level": NO_LOGGING,
    "completion-complete": "completion/complete: quanteval declares no `completions` capability, and the scenario "
                           "completes the fixture prompt test_prompt_with_arguments",
    "resources-read-text": FIXTURE.format("resource test://static-text"),
    "resources-read-binary": FIXTURE.format("resource test://static-binary"),
    "resources-templates-read": FIXTURE.format("resource template test://template/{id}/data"),
    "resources-subscribe": "resources/subscribe: quanteval declares resources.subscribe false (its resources are "
                           "files of the package that do not change while it runs)",
    "resources-unsubscribe": "resources/unsubscribe: quanteval declares resources.subscribe false",
    "prompts-get-simple": FIXTURE.format("prompt test_simple_prompt"),
    "prompts-get-with-args": FIXTURE.format("prompt test_prompt_with_arguments"),
    "prompts-get-embedded-resource": FIXTURE.format("prompt test_prompt_with_embedded_resource"),
    "prompts-get-with-image": FIXTURE.format("prompt test_prompt_with_image"),
}


def conformance(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(NODE), str(CONFORMANCE), *args], cwd=MCP_CLIENTS, capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """quanteval-mcp --http on a free port of 127.0.0.1, with a state dir of its own, for the module; stopped after."""
    state = tmp_path_factory.mktemp("conformance-state")
    env = user_env(QUANTEVAL_STATE_DIR=str(state), QUANTEVAL_LEDGER=str(state / "ledger.sqlite3"))
    port = free_port()
    server = subprocess.Popen([str(VENV_BIN / "quanteval-mcp"), "--http", "--port", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url, timeout=1)
            except urllib.error.HTTPError:
                break  # it answers (a bare GET is not a valid MCP request)
            except OSError:
                assert server.poll() is None, server.stderr.read() if server.stderr else server.returncode
                assert time.monotonic() < deadline, "quanteval-mcp --http did not come up in 30 s"
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


def test_the_clients_run_on_the_projects_node_22():
    done = subprocess.run([str(NODE), "--version"], capture_output=True, text=True, timeout=30)
    major, minor = (int(part) for part in done.stdout.strip().lstrip("v").split(".")[:2])
    assert (major, minor) >= (22, 19), done.stdout  # the MCP Inspector 2.x needs Node >= 22.19


def test_every_server_scenario_of_the_suite_is_run_or_said_not_to_apply():
    """The suite's own list (active and pending): a scenario a new version adds is not silently left out."""
    done = conformance("list", "--server")
    assert done.returncode == 0, done.stderr
    listed = set(re.findall(r"^\s+- (\S+)", done.stdout, flags=re.MULTILINE))
    assert listed, done.stdout
    assert not APPLIES.keys() & NOT_APPLICABLE.keys()
    assert listed == APPLIES.keys() | NOT_APPLICABLE.keys(), (
        f"not run and not said to not apply: {sorted(listed - APPLIES.keys() - NOT_APPLICABLE.keys())}; "
        f"no longer in the suite: {sorted(APPLIES.keys() | NOT_APPLICABLE.keys() - listed)}")


@pytest.mark.parametrize("scenario", list(APPLIES))
def test_the_conformance_scenario_passes(server_url: str, scenario: str, tmp_path: Path):
    done = conformance("server", "--url", server_url, "--scenario", scenario, "--output-dir", str(tmp_path))
    (results,) = tmp_path.glob(f"server-{scenario}-*/checks.json")
    checks = json.loads(results.read_text())
    said = [(check["status"], check["id"], check.get("errorMessage")) for check in checks if check["status"] != "INFO"]
    assert done.returncode == 0 and said and all(status == "SUCCESS" for status, _, _ in said), (
        f"{scenario} ({APPLIES[scenario]}): {said}\n{done.stdout[-3000:]}{done.stderr[-2000:]}")


def test_the_inspectors_skills_extension_verifier_passes_every_skill_and_digest():
    """MCP Inspector 2.12's SEP-2640 verifier (`--method skills/list --verify --require-digests`) against quanteval-mcp
    over stdio: every skill conforms and every file's bytes match the digest and size skills/list gives."""
    from tiers import INSPECTOR

    from quanteval.faces.skillpack import skill_names

    env = user_env(PATH=f"{NODE.parent}:{user_env()['PATH']}")
    done = subprocess.run([str(NODE), str(INSPECTOR), "--cli", str(VENV_BIN / "quanteval-mcp"), "--method", "skills/list",
                           "--verify", "--require-digests"], capture_output=True, text=True, env=env, timeout=120,
                          check=False, cwd=MCP_CLIENTS)
    assert done.returncode == 0, (done.stdout[-1500:], done.stderr[-1500:])
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(report["name"] for report in reports) == sorted(skill_names())
    assert all(not report["conformance"] and not report["frontmatter"] for report in reports), reports
    files = [entry for report in reports for entry in report["files"]]
    assert files and all(entry["status"] == "verified" for entry in files), [e for e in files if e["status"] != "verified"]
