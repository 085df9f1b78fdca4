"""Every place an engine writes a config value into a shell on this machine is in that engine's table
(RUN_SH_SPLICES for NEL 0.2.6's run.sh, SHELL_SITES for nel-next's shell=True calls), read from the engines' own
installed code: a splice a new release adds fails here until the table names its keys. Each key in a table is refused
with shell syntax in it, in a value as the engine composes it or in a key's own name; over MCP, nel-next's
`nat serve --config_file ...` (run with shell=True) runs nothing."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import test_confine
from test_confine import _refused, calls
from tiers import REPO, requires

from quanteval import engines
from quanteval.engines import commands
from quanteval.engines.base import LaunchPlan, Reading
from quanteval.engines.nel import configrole as nel
from quanteval.engines.nel_next import configrole as nel_next

RUN_SH = next(REPO.glob(".venv/lib/python3*/site-packages/nemo_evaluator_launcher/executors/local/run.template.sh"), None)
NEL_NEXT_PACKAGE = next(REPO.glob(".venv-nel-next/lib/python3*/site-packages/nemo_evaluator"), None)
workspace, next_config = test_confine.workspace, test_confine.next_config  # fixtures
SHELL_CALL = re.compile(r"shell=True|create_subprocess_shell\(|\bos\.system\(|\bos\.popen\(")
DEFINITION = re.compile(r"^(\s*)(?:async\s+)?(?:def|class)\s+(\w+)")


def test_nels_run_sh_splices_only_what_the_table_names():
    assert RUN_SH is not None, "NEL 0.2.6's local executor template is not installed in .venv"
    spliced = set(re.findall(r"\{\{\s*([\w.]+)", RUN_SH.read_text()))
    assert spliced == set(nel.RUN_SH_SPLICES) - {nel.SECRETS_ENV}, (
        f"run.sh splices names RUN_SH_SPLICES lacks: {sorted(spliced - set(nel.RUN_SH_SPLICES))}; "
        f"names it no longer has: {sorted(set(nel.RUN_SH_SPLICES) - spliced - {nel.SECRETS_ENV})}")


def _shell_sites(package: Path) -> set[str]:
    """file:Class.function of every line that runs a shell, the enclosing definitions read by indentation (a site
    inside a string of source text, as ecs_fargate's in-container server, is found too)."""
    found = set()
    for file in sorted(package.rglob("*.py")):
        relative = file.relative_to(package).as_posix()
        if "/tests/" in f"/{relative}":
            continue
        lines = file.read_text(errors="replace").splitlines()
        for index, line in enumerate(lines):
            if not SHELL_CALL.search(line.split("#", 1)[0]):
                continue
            names, indent = [], len(line) - len(line.lstrip())
            for above in reversed(lines[:index]):
                if (match := DEFINITION.match(above)) and len(match.group(1)) < indent:
                    names.insert(0, match.group(2))
                    indent = len(match.group(1))
            found.add(f"{relative}:{'.'.join(names)}")
    return found


@requires("nel-next")
def test_nel_nexts_shell_sites_are_the_tables():
    assert NEL_NEXT_PACKAGE is not None
    sites = _shell_sites(NEL_NEXT_PACKAGE)
    assert sites == set(nel_next.SHELL_SITES), (f"nel-next runs a shell at sites SHELL_SITES lacks: {sorted(sites - set(nel_next.SHELL_SITES))}; "
                                                f"sites it no longer has: {sorted(set(nel_next.SHELL_SITES) - sites)}")


def _nested(key: str, value: object) -> dict:
    doc: dict = {}
    *parents, last = key.split(".")
    node = doc
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return doc


TABLES = [(engine, pattern) for engine in map(engines.by_name, ("nel", "nel-next")) for pattern in engine.config.shell_spliced]


@pytest.mark.parametrize(("engine", "pattern"), TABLES, ids=[f"{engine.name}:{pattern}" for engine, pattern in TABLES])
def test_every_spliced_key_refuses_shell_syntax_as_composed_and_in_its_name(engine, pattern):
    key = pattern.replace("*", "x")
    composed = LaunchPlan(config_path="/nowhere.yaml", overrides=(), doc={}, engine=engine,
                          reading=Reading(resolved=_nested(key, "ok $(touch /tmp/never)")))
    assert (refusal := commands.launch_refusal(composed)) and key in refusal and "$(" in refusal, refusal
    if pattern.endswith(".*"):  # a name there (an env var's, a mount's) is written too
        named = LaunchPlan(config_path="/nowhere.yaml", overrides=(), doc={}, engine=engine,
                           reading=Reading(resolved=_nested(pattern[:-1] + "X;touch /tmp/never", "ok")))
        assert (refusal := commands.launch_refusal(named)) and ";" in refusal, refusal


@requires("nel-next")
def test_a_nat_config_file_cannot_carry_a_command_over_mcp(workspace, next_config):
    """nel-next starts a NAT agent with `nat serve --config_file {nat_config_file} ...` and shell=True."""
    inside, outside = workspace
    outside.mkdir()
    marker = outside / "ran"
    config, steps = next_config
    key = "services.agent.nat_config_file"
    *_, validated, canary = calls(inside, *steps,
                                  ("set_config_value", {"config_path": config, "key": "services.agent",
                                                        "value": {"type": "nat", "port": 8123,
                                                                  "nat_config_file": f"x.yml; touch {marker}; true"}}),
                                  ("validate_config", {"config_path": config}),
                                  ("launch_canary", {"config_path": config}))
    [problem] = [p for p in validated.structured_content["problems"] if p["rule"] == "shell_syntax"]
    assert problem["key"] == key and not validated.structured_content["valid"]
    assert canary.is_error and key in canary.content[0].text and "shell command" in canary.content[0].text
    # the file it names is read by `nat serve`: inside the root
    (elsewhere,) = calls(inside, ("set_config_value", {"config_path": config, "key": key, "value": str(outside / "agent.yml")}),
                         ("launch_canary", {"config_path": config}))[1:]
    _refused(elsewhere, key)
    assert not marker.exists()
