"""The skill pack: Agent Skills spec, links, tool names, CLI commands, install and MCP resources.

Commands in the pack are parsed by the real parsers (NEL's simple-parsing parser, quanteval's
argparse parser, and each tool's input model for `quanteval call ... --json`), never executed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

import anyio
import pytest
from skills_ref.validator import validate
from test_surface import CONTRACT as CONTRACT_TOOLS
from tiers import REPO

from quanteval import registry
from quanteval.faces import skillpack

SKILLS = ["evaluation", "deployment", "compare-results", "monitor"]
QUANTEVAL = Path(sys.executable).with_name("quanteval")


def _markdown_files(root: Path) -> list[Path]:
    return sorted(path for folder in skillpack.PACK_FOLDERS for path in (root / folder).rglob("*.md"))


def _pack_text() -> str:
    return "\n".join(path.read_text() for path in _markdown_files(REPO))


def _broken_links(root: Path) -> list[str]:
    broken = []
    for path in _markdown_files(root):
        for target in skillpack.relative_links(path.read_text()):
            if not (path.parent / target).resolve().is_file():
                broken.append(f"{path.relative_to(root)} -> {target}")
    return broken


# ---------------------------------------------------------------- Agent Skills spec


@pytest.mark.parametrize("skill", SKILLS)
def test_skill_passes_the_agent_skills_validator(skill: str):
    assert validate(REPO / "skills" / skill) == []


@pytest.mark.parametrize("skill", SKILLS)
def test_skill_is_short_and_has_a_progress_checklist(skill: str):
    text = (REPO / "skills" / skill / "SKILL.md").read_text()
    assert len(text.splitlines()) < 500
    assert re.search(r"^- \[ \] ", text, re.MULTILINE), "a checklist the assistant copies"


def test_every_skill_folder_is_listed():
    assert skillpack.skill_names(REPO) == sorted(SKILLS)


# ---------------------------------------------------------------- links and tool names


def test_every_relative_link_resolves():
    assert _broken_links(REPO) == []


def test_every_contract_tool_appears_in_the_pack():
    text = _pack_text()
    assert [name for name in CONTRACT_TOOLS if f"`{name}`" not in text and f"call {name} " not in text] == []


def test_every_tool_the_pack_names_exists():
    """A backticked snake_case name that starts like a tool (check_, launch_, ...) must be a registered tool."""
    text = _pack_text()
    prefixes = {name.split("_")[0] for name in CONTRACT_TOOLS}
    # Config keys and report fields that merely share a prefix with tool names.
    not_tools = {"deployment_flags", "get_path", "set_path", "list_recipes", "extract_path", "launch_commands"}
    named = set(re.findall(r"`([a-z]+(?:_[a-z]+)+)`", text)) | set(re.findall(r"quanteval call ([a-z_]+)", text))
    tool_like = {name for name in named if name.split("_")[0] in prefixes} - not_tools
    assert sorted(tool_like - set(registry.TOOLS)) == []


# ---------------------------------------------------------------- commands parse against the real CLIs


def _commands(program: str) -> list[tuple[str, str]]:
    """(file, command) for each `program ...` line in a fenced block and each inline `program ...` span."""
    found = []
    for path in _markdown_files(REPO):
        text = path.read_text()
        lines = []
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL):
            lines += [line.strip() for line in block.splitlines()]
        prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
        lines += [span.strip() for span in re.findall(r"`([^`\n]+)`", prose)]
        found += [(path.name, line) for line in lines if line.startswith(program + " ")]
    return found


def _nel_parser():
    from nemo_evaluator_launcher.cli.main import create_parser

    return create_parser()


NEL_COMMANDS = _commands("nel")
QUANTEVAL_COMMANDS = _commands("quanteval")


def test_the_pack_shows_both_clis():
    assert len(NEL_COMMANDS) >= 5 and len(QUANTEVAL_COMMANDS) >= 10


@pytest.mark.parametrize("source,command", NEL_COMMANDS, ids=lambda x: x if " " not in str(x) else None)
def test_nel_command_parses(source: str, command: str):
    parser = _nel_parser()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            parser.parse_args(shlex.split(command)[1:])
        except SystemExit as exc:
            pytest.fail(f"{source}: `{command}` does not parse: {stderr.getvalue().strip()} ({exc.code})")


def test_nel_parser_rejects_a_wrong_command():
    """The parse check above is meaningful: NEL's parser does reject what it does not know."""
    with contextlib.redirect_stderr(io.StringIO()), pytest.raises(SystemExit):
        _nel_parser().parse_args(["run", "--config", "x.yaml", "--dryrun"])


@pytest.mark.parametrize("source,command", QUANTEVAL_COMMANDS, ids=lambda x: x if " " not in str(x) else None)
def test_quanteval_command_parses(source: str, command: str):
    from quanteval.faces.cli import build_parser

    argv = shlex.split(command)[1:]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{source}: `{command}` does not parse: {stderr.getvalue().strip()} ({exc.code})")
    if args.command == "call" and not args.tool.startswith("<"):
        spec = registry.get_tool(args.tool)
        arguments = json.loads(args.json)
        registry.parse_arguments(spec, arguments)  # raises on a misspelled or missing field


# Flags the pack names for other programs. vLLM cannot be installed here (CUDA wheels), so its flags
# are listed from its documentation; Pyxis's is an srun option.
VLLM_ONLY_FLAGS = {"--max-model-len", "--enable-auto-tool-choice", "--data-parallel-size", "--distributed-executor-backend",
                   "--enforce-eager"}
# srun (Pyxis); the pre-0.5 SGLang name, named as such; `quanteval evaluate`'s option (its parser has it: test_surface)
OTHER_FLAGS = {"--container-image", "--cuda-graph-max-bs", "--noise-floor"}


@pytest.mark.slow
def test_every_server_flag_the_pack_names_exists_in_sglang():
    """Server flags in the pack are checked against SGLang's own argument parser (CPU import)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    sglang = argparse.ArgumentParser()
    ServerArgs.add_cli_args(sglang)
    # Flags of nel / quanteval commands are checked by the parse tests above.
    cli_flags = {flag for _, command in NEL_COMMANDS + QUANTEVAL_COMMANDS for flag in re.findall(r"--[a-z][a-z0-9-]*", command)}
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", _pack_text()))
    unknown = flags - set(sglang._option_string_actions) - cli_flags - VLLM_ONLY_FLAGS - OTHER_FLAGS
    assert sorted(unknown) == []


def test_interceptor_keys_the_pack_names_exist_in_nemo_evaluator():
    """adapter_config keys in the pack are fields of nemo-evaluator's adapter config (the legacy flat form NEL templates use)."""
    from nemo_evaluator.adapters.adapter_config import AdapterConfig, LegacyAdapterConfig

    fields = set(LegacyAdapterConfig.model_fields) | set(AdapterConfig.model_fields)
    text = _pack_text()
    named = {"process_reasoning_traces", "params_to_add", "params_to_remove", "use_system_prompt", "custom_system_prompt",
             "use_request_logging", "max_logged_requests", "use_response_logging", "max_logged_responses"}
    assert all(f"`{key}`" in text for key in named)
    assert sorted(named - fields) == []


# ---------------------------------------------------------------- install


def test_install_for_claude_in_a_project_makes_a_self_contained_pack(tmp_path: Path):
    done = subprocess.run([str(QUANTEVAL), "skills", "install", "--claude", "--project"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    root = tmp_path / ".claude" / "skills"
    assert sorted(entry.name for entry in root.iterdir()) == sorted(SKILLS)
    for skill in SKILLS:
        assert validate(root / skill) == []
    assert (root / "evaluation" / "recipes" / "tasks" / "gpqa.md").is_file()
    assert (root / "evaluation" / "references" / "multi-node.md").is_file()
    assert (root / "evaluation" / "common" / "slurm-setup.md").is_file()
    broken = []
    for path in root.rglob("*.md"):
        for target in skillpack.relative_links(path.read_text()):
            if not (path.parent / target).resolve().is_file():
                broken.append(f"{path.relative_to(root)} -> {target}")
            assert (path.parent / target).resolve().is_relative_to(root.resolve()), f"{path}: {target} leaves the pack"
    assert broken == []
    assert not [p for p in root.rglob("*") if p.name.startswith(".")], "no staging folders left behind"


def test_install_never_overwrites_without_force(tmp_path: Path):
    command = [str(QUANTEVAL), "skills", "install", "--dest", str(tmp_path / "skills")]
    assert subprocess.run(command, capture_output=True, text=True, timeout=60).returncode == 0
    edited = tmp_path / "skills" / "monitor" / "SKILL.md"
    edited.write_text("my local notes")

    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1
    assert "use --force" in again.stderr
    assert edited.read_text() == "my local notes"

    forced = subprocess.run([*command, "--force"], capture_output=True, text=True, timeout=60)
    assert forced.returncode == 0, forced.stderr
    assert edited.read_text().startswith("---\nname: monitor\n")


def test_install_into_a_file_is_refused_with_a_clear_error(tmp_path: Path):
    target = tmp_path / "not-a-folder"
    target.write_text("keep me")
    done = subprocess.run([str(QUANTEVAL), "skills", "install", "--dest", str(target)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "not a directory" in done.stderr and "Traceback" not in done.stderr
    assert target.read_text() == "keep me"


def test_user_level_install_goes_where_each_assistant_looks(tmp_path: Path):
    env = dict(os.environ, HOME=str(tmp_path))
    done = subprocess.run([str(QUANTEVAL), "skills", "install", "--codex", "--opencode"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / ".agents" / "skills" / "evaluation" / "SKILL.md").is_file()
    assert (tmp_path / ".config" / "opencode" / "skills" / "evaluation" / "SKILL.md").is_file()
    assert not (tmp_path / ".claude").exists()


@pytest.mark.slow
def test_the_wheel_carries_the_pack_and_installs_from_it(tmp_path: Path):
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(tmp_path.glob("quanteval-*.whl"))
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    packed = sorted(p.relative_to(site / "quanteval" / "_pack").as_posix()
                    for p in (site / "quanteval" / "_pack").rglob("*") if p.is_file())
    assert packed == sorted(skillpack.pack_files(REPO))

    # The unpacked wheel, not this checkout, serves the install.
    script = (
        "import sys; from pathlib import Path; from quanteval.faces import skillpack; "
        "assert '_pack' in str(skillpack.pack_root()), skillpack.pack_root(); "
        "skillpack.install_skills(Path(sys.argv[1]))"
    )
    env = dict(os.environ, PYTHONPATH=str(site))
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "installed")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "installed" / "evaluation" / "recipes" / "tasks" / "aime2025.md").is_file()


# ---------------------------------------------------------------- MCP resources and prompt


def test_mcp_serves_the_pack_as_resources_and_the_workflow_as_a_prompt():
    """Each skill as installed, under skill:// (the Skills extension: tests/test_mcp_skills.py); the shared folders
    (references/, recipes/) as quanteval://<pack path> besides."""
    from mcp import Client

    from quanteval.faces.server import build_server

    async def scenario():
        async with Client(build_server()) as client:
            resources = await client.list_resources()
            uris = {str(resource.uri) for resource in resources.resources}
            skill = await client.read_resource("skill://evaluation/SKILL.md")
            recipe = await client.read_resource("quanteval://recipes/tasks/gpqa.md")
            prompts = await client.list_prompts()
            prompt = await client.get_prompt(skillpack.WORKFLOW_PROMPT, {"checkpoint": "/data/model-nvfp4"})
            return uris, skill, recipe, prompts, prompt

    uris, skill, recipe, prompts, prompt = anyio.run(scenario)
    shared = {skillpack.resource_uri(path) for path in skillpack.pack_files(REPO) if not path.startswith("skills/")}
    skills = {skillpack.skill_uri(name, path) for name in SKILLS for path in skillpack.skill_files(name, REPO)}
    assert shared | skills == uris
    assert skill.contents[0].text.encode() == skillpack.skill_files("evaluation", REPO)["SKILL.md"]
    assert "ns_gpqa" in recipe.contents[0].text
    assert [p.name for p in prompts.prompts] == [skillpack.WORKFLOW_PROMPT]
    text = prompt.messages[0].content.text
    assert "/data/model-nvfp4" in text and "Step 8.2" in text and "skill://evaluation/" in text
