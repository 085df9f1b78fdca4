"""The skills and the README against the code they describe: tool names, CLI commands and flags, exit codes.

Every expectation is read from the live code — registry.TOOLS, the parser faces/cli.py builds, and the
functions through which the CLI turns an outcome into an exit code — never from a copy in this file, so a
renamed tool, a dropped flag or a changed exit code fails here with the file and the claim that went stale.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import re
import shlex
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tiers import REPO

from quanteval import registry
from quanteval.faces import cli

SKILL_FILES = sorted((REPO / "skills").rglob("*.md"))
DOCS = [*SKILL_FILES, REPO / "README.md", *(REPO / "docs" / name for name in ("USAGE.md", "EVAL_SERVER.md", "DEVELOPING.md"))]

# Backticked snake_case names in the skills that are not quanteval tools and not a field or value of any
# tool's schema: NEL and HF config keys, nemo-evaluator interceptor keys, NEL task and bundle names, finding rules.
NOT_TOOLS = {
    "api_key", "api_key_name", "chat_template_kwargs", "custom_system_prompt", "enable_thinking", "max_logged_requests",
    "max_logged_responses", "max_new_tokens", "model_id", "params_to_add", "params_to_remove", "process_reasoning_traces",
    "request_timeout", "top_k", "top_p", "use_request_logging", "use_response_logging", "use_system_prompt",
    "general_knowledge", "core_reasoning", "long_context", "mmlu_pro", "checkpoint_not_servable", "skills_not_graded",
    "skills_unavailable", "infra_error", "modelopt_mixed", "timed_out", "quantization_config", "fp8_e4m3",
}


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


@dataclass(frozen=True)
class Unit:
    """A stretch of text a claim is read in: one line of a fenced block, or one prose paragraph (joined)."""

    source: str
    text: str
    fenced: bool = False


def _units(path: Path) -> list[Unit]:
    text = path.read_text(encoding="utf-8")
    units = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.DOTALL):
        block = re.sub(r"\\\n\s*", " ", block)  # shell line continuations
        units += [Unit(_rel(path), line.strip(), fenced=True) for line in block.splitlines() if line.strip()]
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    units += [Unit(_rel(path), " ".join(part.split())) for part in re.split(r"\n\s*\n", prose) if part.strip()]
    return units


# ---------------------------------------------------------------- tool names


def _schema_names(schema: Any) -> set[str]:
    """Property names and enum values anywhere in a JSON schema."""
    names: set[str] = set()
    if isinstance(schema, dict):
        names |= set(schema.get("properties", {}))
        names |= {value for value in schema.get("enum", []) if isinstance(value, str)}
        for value in schema.values():
            names |= _schema_names(value)
    elif isinstance(schema, list):
        for value in schema:
            names |= _schema_names(value)
    return names


def _tool_claims(path: Path) -> list[tuple[str, bool]]:
    """(name, certainly a tool) for each tool-like name in a skill file.

    `quanteval call NAME` and a snake_case name in a checklist line (`- [ ] ... build_config`) are tool
    names for certain; any other backticked snake_case name may also be a config key or a schema field.
    """
    text = path.read_text(encoding="utf-8")
    claims = [(name, True) for name in re.findall(r"quanteval call ([a-z][a-z0-9_]*)", text)]
    for line in re.findall(r"^\s*- \[ \] (.*)$", text, re.MULTILINE):
        claims += [(name, True) for name in re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", line)]
    claims += [(name, False) for name in re.findall(r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)+)`", text)]
    return claims


def test_the_skills_name_tools():
    assert sum(certain for path in SKILL_FILES for _, certain in _tool_claims(path)) >= 20


@pytest.mark.parametrize("path", SKILL_FILES, ids=_rel)
def test_every_tool_a_skill_names_is_registered(path: Path):
    fields: set[str] = set()
    for spec in registry.TOOLS.values():
        fields |= _schema_names(spec.input_model.model_json_schema()) | _schema_names(spec.output_model.model_json_schema())
    wrong = []
    for name, certain in _tool_claims(path):
        if name in registry.TOOLS:
            continue
        if certain:
            wrong.append(f"{_rel(path)}: names tool '{name}', which is not in registry.TOOLS")
        elif name not in fields and name not in NOT_TOOLS:
            wrong.append(f"{_rel(path)}: `{name}` is neither a tool in registry.TOOLS nor a field or value of a tool's "
                         "schema (a config key or task name belongs in NOT_TOOLS)")
    assert not wrong, "\n".join(sorted(set(wrong)))


def _inline_arguments(path: Path) -> list[tuple[str, str]]:
    """(tool, arguments span) for each `tool` followed closely by an inline `{...}` of its arguments."""
    found = []
    for unit in _units(path):
        if not unit.fenced:
            found += re.findall(r"`([a-z][a-z0-9_]*)`[^`]{0,20}`(\{[^`]*\})`", unit.text)
    return [(tool, span) for tool, span in found if tool in registry.TOOLS]


def test_the_skills_show_inline_arguments():
    assert len([pair for path in SKILL_FILES for pair in _inline_arguments(path)]) >= 3


@pytest.mark.parametrize("path", SKILL_FILES, ids=_rel)
def test_every_inline_argument_is_a_field_of_its_tool(path: Path):
    wrong = []
    for tool, span in _inline_arguments(path):
        fields = registry.get_tool(tool).input_model.model_fields
        wrong += [f"{_rel(path)}: `{span}` gives {tool} '{key}', which is not one of its arguments ({', '.join(fields)})"
                  for key in re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"\s*:', span) if key not in fields]
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------- commands and flags


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _commands(path: Path) -> list[Unit]:
    """Each `quanteval ...` command line of a fenced block and each inline `quanteval ...` span."""
    found = []
    for unit in _units(path):
        if unit.fenced and unit.text.startswith("quanteval "):
            found.append(unit)
        elif not unit.fenced:
            found += [Unit(unit.source, span.strip()) for span in re.findall(r"`(quanteval [^`]+)`", unit.text)]
    return found


COMMANDS = [command for path in DOCS for command in _commands(path)]


def test_the_docs_show_commands():
    assert len({c.source for c in COMMANDS}) >= 3 and len(COMMANDS) >= 10


def _argv(command: str) -> list[str]:
    command = re.sub(r"\[(--[^\]]*)\]", r"\1", command)  # `[--host 0.0.0.0]`: an optional part, shown as such
    return shlex.split(command, comments=True)[1:]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.source}: {c.text[:60]}")
def test_every_command_the_docs_show_is_accepted_by_the_cli_parser(command: Unit):
    parser = cli.build_parser()
    argv = _argv(command.text)
    words: list[str] = []
    current = parser
    while len(words) < len(argv) and argv[len(words)] in _subparsers(current):
        current = _subparsers(current)[argv[len(words)]]
        words.append(argv[len(words)])
    assert words, f"{command.source}: `{command.text}`: '{argv[0]}' is not a quanteval subcommand " \
                  f"(choose from {', '.join(_subparsers(parser))})"
    if argv == words:
        return  # a subcommand named in prose, e.g. `quanteval tools`
    current.format_help()  # a subcommand adds the flags mirrored from its tool's input model when first used
    known = set(current._option_string_actions)
    for flag in [arg.split("=", 1)[0] for arg in argv if arg.startswith("--")]:
        assert flag in known, f"{command.source}: `{command.text}`: `quanteval {' '.join(words)}` has no option {flag}"
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{command.source}: `{command.text}` is refused by the CLI parser: {stderr.getvalue().strip()}")
    if getattr(args, "tool", "<").startswith("<") or getattr(args, "json", None) in (None, "{}", "{...}"):
        return
    spec = registry.get_tool(args.tool)
    try:
        registry.parse_arguments(spec, json.loads(args.json))
    except (ValueError, registry.ArgumentsError) as exc:
        pytest.fail(f"{command.source}: `{command.text}`: the arguments do not fit {args.tool}: {exc}")


# ---------------------------------------------------------------- exit codes


class _Outcome:
    """A tool result reduced to what the CLI reads to choose its exit code."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def model_dump(self, **_: Any) -> dict[str, Any]:
        return {}


def _literal_values(tool: str, field: str) -> list[str]:
    annotation = registry.get_tool(tool).output_model.model_fields[field].annotation
    values = list(typing.get_args(annotation))
    assert values and all(isinstance(v, str) for v in values), f"{tool}.{field} is no longer a Literal of verdicts"
    return values


ACCEPTABILITY = _literal_values("evaluate_quantization", "verdict")  # compare's acceptability, and anomalous
GATE_VERDICTS = _literal_values("gate_results", "verdict")
SUSPECT, ANOMALOUS = "suspect", "anomalous"  # anomalous: the candidate's canary failed, so no run was gated


def _evaluate_code(verdict: str, gate: str | None) -> int:
    # a gate whose release rules pass: its release verdict is nel gate's (the one the docs name)
    gated = None if gate is None else _Outcome(verdict=gate, release_verdict=gate)
    return cli.evaluation_exit_code(_Outcome(verdict=verdict, gate=gated))


def _gate_code(verdict: str, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(cli, "run_tool", lambda name, arguments: _Outcome(verdict=verdict, release_verdict=verdict))
    with contextlib.redirect_stdout(io.StringIO()):
        return cli.main(["gate", "base", "cand", "--policy", "policy.yaml", "--json"])


@functools.cache
def _generic_codes() -> dict[str, int]:
    """What `quanteval` exits with when a command works, when a tool fails, and when it is misused."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        return {
            "ok": cli.main(["tools"]),
            "tool error": cli.main(["call", "inspect_checkpoint", "--json", '{"checkpoint": "/nonexistent/checkpoint"}']),
            "bad usage": cli.main(["call", "no_such_tool"]),
        }


@dataclass(frozen=True)
class ExitClaim:
    source: str
    command: str  # evaluate, gate, or "" for the CLI as a whole
    policy: bool
    code: int
    label: str
    text: str


CLAIM_START = re.compile(r"\bexit(?:s|\s+codes?)?:?\s+(?=\d)")
PAIR = re.compile(r"(\d+) ([^,;.()#`]+)")
# The command a prose claim is about: the last backticked command before it (`quanteval gate ...`, `ns eval`).
COMMAND_SPAN = re.compile(r"`([a-z][\w-]*) ([^`]*)`")


def _claim_subject(unit: Unit, before: str) -> tuple[str, str] | None:
    """(quanteval subcommand or "" for quanteval as a whole, the text from the command to the claim), or None
    when the claim is about another program."""
    if unit.fenced:
        program, _, rest = unit.text.partition(" ")
        return (rest.split(" ", 1)[0], before) if program == "quanteval" else None
    spans = list(COMMAND_SPAN.finditer(before))
    if not spans:
        return "", before  # "CLI exit codes: ..." — quanteval's own
    last = spans[-1]
    if last.group(1) != "quanteval":
        return None
    return last.group(2).split(" ", 1)[0], before[last.start():]


def _exit_claims(path: Path) -> list[ExitClaim]:
    claims = []
    for unit in _units(path):
        for start in CLAIM_START.finditer(unit.text):
            subject = _claim_subject(unit, unit.text[: start.start()])
            if subject is None:
                continue
            command, context = subject
            policy = "--policy" in context
            position = start.end()
            while pair := PAIR.match(unit.text, position):
                claims.append(ExitClaim(unit.source, command, policy, int(pair.group(1)), pair.group(2).strip(),
                                        unit.text[start.start(): pair.end()]))
                more = re.compile(r",\s*(?=\d)").match(unit.text, pair.end())
                if not more:
                    break
                position = more.end()
    return claims


EXIT_CLAIMS = [claim for path in DOCS for claim in _exit_claims(path)]


def test_the_docs_state_exit_codes():
    """The claims below are found at all: the evaluation and compare skills and the README each state some."""
    sources = {claim.source for claim in EXIT_CLAIMS}
    assert {"skills/evaluation/SKILL.md", "skills/compare-results/SKILL.md", "README.md"} <= sources
    assert {claim.command for claim in EXIT_CLAIMS} >= {"", "evaluate", "gate"}


def _expected_codes(claim: ExitClaim, monkeypatch: pytest.MonkeyPatch) -> dict[str, set[int]]:
    """Each outcome the label names (alternatives joined by 'or') -> the exit codes the code gives it."""
    expected: dict[str, set[int]] = {}
    for outcome in claim.label.split(" or "):
        outcome = outcome.strip()
        if claim.command == "evaluate" and not claim.policy and outcome in ACCEPTABILITY:
            expected[outcome] = {_evaluate_code(outcome, None)}
        elif claim.command == "evaluate" and claim.policy and outcome == ANOMALOUS:
            expected[outcome] = {_evaluate_code(ANOMALOUS, None)}
        elif claim.command == "evaluate" and claim.policy and outcome in GATE_VERDICTS:
            # the gate's verdict, the comparison's verdict being anything but suspect (or anomalous: no gate then)
            expected[outcome] = {_evaluate_code(v, outcome) for v in ACCEPTABILITY if v not in (SUSPECT, ANOMALOUS)}
        elif claim.command == "evaluate" and claim.policy and (
            found := re.fullmatch(r"an? (\S+) over a suspect serving", outcome)
        ) and found.group(1) in GATE_VERDICTS:
            expected[outcome] = {_evaluate_code(SUSPECT, found.group(1))}
        elif claim.command == "gate" and outcome in GATE_VERDICTS:
            expected[outcome] = {_gate_code(outcome, monkeypatch)}
        elif claim.command not in ("evaluate", "gate") and outcome in _generic_codes():
            expected[outcome] = {_generic_codes()[outcome]}
        else:
            pytest.fail(f"{claim.source}: cannot read '{claim.code} {claim.label}' in \"{claim.text}\" "
                        f"(command: {claim.command or 'any'}{', with --policy' if claim.policy else ''}); "
                        f"name outcomes as the code does: {ACCEPTABILITY}, {GATE_VERDICTS}, "
                        f"'a GO over a suspect serving', or {list(_generic_codes())}")
    return expected


@pytest.mark.parametrize("claim", EXIT_CLAIMS, ids=lambda c: f"{c.source}: {c.command or 'cli'} {c.code} {c.label}")
def test_every_exit_code_the_docs_state_is_the_code_s(claim: ExitClaim, monkeypatch: pytest.MonkeyPatch):
    for outcome, codes in _expected_codes(claim, monkeypatch).items():
        where = f"`quanteval {claim.command}`" if claim.command else "quanteval"
        where += " with --policy" if claim.policy and claim.command == "evaluate" else ""
        assert codes == {claim.code}, (
            f"{claim.source}: says {where} exits {claim.code} for {outcome} (\"{claim.text}\"), "
            f"but the CLI exits {', '.join(map(str, sorted(codes)))}"
        )


def test_the_readme_shows_every_way_to_install_the_skills():
    """Installing into the current project (`--project`) was only in --help: the README shows each option of
    `quanteval skills install` (its commands are parsed by the test above)."""
    install = _subparsers(_subparsers(cli.build_parser())["skills"])["install"]
    flags = {flag for action in install._actions for flag in action.option_strings if flag.startswith("--")} - {"--help"}
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    # the paragraph, commands and notes around the README's `quanteval skills install` commands
    start = readme.find("quanteval skills install --claude --project")
    assert start >= 0, "README.md does not show how to install the skills into the current project (--project)"
    shown = readme[readme.rfind("\n\n", 0, start - 400):readme.find("\n\n", start + 200)]
    missing = sorted(flag for flag in flags if not re.search(rf"(?<![\w-]){flag}(?![\w-])", shown))
    assert not missing, f"README.md does not show these skills install options: {missing}"
