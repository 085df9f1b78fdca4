"""What a config makes an engine run in a shell on this machine, besides the engine's own preset commands.

Two kinds of values, for both engines:
- commands: a key named *_cmd, *command or *commands (NEL's deployment.command and pre_cmd/post_cmd, nel-next's
  setup_commands, pre_cmd, server_cmd, capture_cmd, a sandbox metric's command) runs its value as a shell command on
  launch. Named by validate_config and dry_run; under `quanteval-mcp --root` a launch with one (other than the
  engine's preset) is refused unless the server was started with --allow-commands: who may edit a config must not
  thereby run programs as the server's user. An argument that imports Python (--trust-remote-code, a plugin;
  serverflags.CODE_FLAGS) of a server the engine starts on this machine (ConfigRole.host_server_args) counts as one.
- spliced values: the keys each engine writes unquoted into the shell script it runs (ConfigRole.shell_spliced: NEL's
  deployment.* values, docker args, mounts and env values; nel-next's server args, env, mounts, image). A value there
  with shell syntax (`;`, `|`, `&`, `$(`, backquotes, redirections, a newline) would run as a command: validate_config
  calls it an error and every launch refuses it, with or without --root.

Both are checked on the config as the engine will run it (LaunchPlan.reading: composed from its defaults and config
groups, overridden, interpolated), not on the file as written: a `${other.key}` or a config group
(`deployment=mine`) brings values the file does not show.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator
from typing import Any

from quanteval import redact
from quanteval.engines.base import LaunchPlan, Problem
from quanteval.serving import serverflags

COMMAND_NAME = re.compile(r"(?:^|_)(?:cmd|command|commands)$")
SHELL_SYNTAX = ("`", "$(", ";", "|", "&", "<", ">", "\n", "\r")


def leaves(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every scalar of a plain config with its dotted key (list items by index: a.b.0)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from leaves(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from leaves(value, f"{prefix}.{index}")
    else:
        yield prefix, node


def _named_key(key: str) -> str:
    """The last named component of a dotted key (setup_commands for services.model.setup_commands.0)."""
    return next(part for part in reversed(key.split(".")) if not part.isdigit())


def values(doc: dict[str, Any], overrides: list[str] | None = None) -> list[tuple[str, Any]]:
    """The config's scalars by dotted key, with the launch's overrides (`key=value`, `++key=value`) over them."""
    found = dict(leaves(doc))
    for override in overrides or []:
        key, equals, value = override.lstrip("+~").partition("=")
        if equals:
            found[key.strip()] = value
    return list(found.items())


def commands(pairs: list[tuple[str, Any]], presets: dict[str, str], server_args: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(key, value) of every non-empty command value that is not the engine's own preset for that key, and of every
    argument of a server started on this machine (`server_args`: ConfigRole.host_server_args) that makes it import Python
    beyond the framework's own (--trust-remote-code, a plugin: serverflags.CODE_FLAGS), which runs code as a command
    does."""
    return [(key, str(value)) for key, value in pairs
            if (COMMAND_NAME.search(_named_key(key)) and value not in (None, "") and str(value).strip() != presets.get(key, "\0").strip())
            or (isinstance(value, str) and any(fnmatch.fnmatchcase(key, pattern) for pattern in server_args)
                and serverflags.code_flags(value.split()))]


def shell_syntax(value: str) -> str | None:
    """The first piece of shell syntax in a value, or None."""
    return next((piece for piece in SHELL_SYNTAX if piece in value), None)


def spliced_syntax(pairs: list[tuple[str, Any]], patterns: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(key, value, the shell syntax in it) for every spliced string value carrying some, and for every spliced key
    whose own name carries some (an env var or mount named `X;touch y` is written as `-e X;touch y`); command keys
    excluded."""
    found = []
    for key, value in pairs:
        if COMMAND_NAME.search(_named_key(key)) or not any(fnmatch.fnmatchcase(key, pattern) for pattern in patterns):
            continue
        if piece := shell_syntax(key):
            found.append((key, key, piece))
        elif isinstance(value, str) and (piece := shell_syntax(value)):
            found.append((key, value, piece))
    return found


def executed(plan: LaunchPlan) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]], dict[str, Any]]:
    """The launch's values as the engine will run them (resolved, by dotted key), the same before the engine's own
    interpolation (what its command presets are written in), and that uninterpolated config; the file with the
    overrides over it where the engine could not compose the config (its launch then fails before anything runs)."""
    resolved, raw = plan.reading.resolved, plan.reading.raw or plan.reading.resolved
    if resolved is None:
        pairs = values(plan.doc, plan.override_list)
        return pairs, pairs, plan.doc
    written = dict(leaves(raw))
    # a value the engine could not resolve is marked "\0..." with its error (nelexec.UNRESOLVED): checked as written
    pairs = [(key, written.get(key, value) if isinstance(value, str) and value.startswith("\0") else value)
             for key, value in leaves(resolved)]
    return pairs, list(written.items()), raw


def _commands(plan: LaunchPlan) -> list[tuple[str, str]]:
    """(key, value as it runs) of each command the launch runs beyond the engine's presets, which are compared
    uninterpolated, as the engine's packaged configs write them."""
    resolved, raw, raw_doc = executed(plan)
    shown_as = dict(resolved)
    return [(key, str(shown_as.get(key, value)))
            for key, value in commands(raw, plan.engine.config.command_presets(raw_doc), plan.engine.config.host_server_args)]


def shown(value: str, limit: int = 200) -> str:
    """A value as a message shows it: secrets masked (a composed value may hold an interpolated ${oc.env:TOKEN}),
    newlines visible, bounded."""
    text = redact.scrub(value).replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def problems(plan: LaunchPlan, reported: list[Problem]) -> list[Problem]:
    """validate_config's findings: shell syntax in a spliced value (an error), and each command the config runs
    (a warning), but for a command key the engine's own rules already call an error (NEL's untrusted pre_cmd)."""
    engine = plan.engine
    refused = {problem.key.rsplit(".", 1)[-1] for problem in reported if problem.severity == "error"}
    found = [Problem(key=key, severity="error", rule="shell_syntax", message=(
                 f"{shown(value)!r} holds {piece!r}, and {engine.name} writes {key} unquoted into the shell script it "
                 f"runs{_as_composed(plan, key, value)}: it would run as a command."),
                 fix="Remove the shell syntax (a value is one argument or name); a command belongs in a command key.")
             for key, value, piece in spliced_syntax(executed(plan)[0], engine.config.shell_spliced)]
    found += [Problem(key=key, severity="warning", rule="runs_command", message=(
                  f"makes the model server import Python beyond the framework's own on launch: {shown(value)!r}."
                  if any(fnmatch.fnmatchcase(key, pattern) for pattern in engine.config.host_server_args) else
                  f"runs on launch as a shell command on the machine that runs it: {shown(value)!r}."),
                  fix="Keep it only if you wrote it for this run; over `quanteval-mcp --root` a launch with it needs the "
                      "server started with --allow-commands.")
              for key, value in _commands(plan) if _named_key(key) not in refused]
    return found


def _as_composed(plan: LaunchPlan, key: str, value: str) -> str:
    """Where a value the file does not hold as such comes from: the engine's composition."""
    written = dict(values(plan.doc, plan.override_list)).get(key)
    if written == value:
        return ""
    return "; the value is the engine's composition of the config (an interpolation, a config group or a default)"


def launch_refusal(plan: LaunchPlan, allow_commands: bool = True) -> str | None:
    """Why a launch of this plan is refused: shell syntax in a spliced value (always), a command when commands are not
    allowed (quanteval-mcp --root without --allow-commands); None when it may start."""
    engine = plan.engine
    if spliced := spliced_syntax(executed(plan)[0], engine.config.shell_spliced):
        key, value, piece = spliced[0]
        return (f"{key}: {shown(value)!r} holds {piece!r}, which {engine.name} would run as a shell command (it writes "
                f"{key} unquoted into its script{_as_composed(plan, key, value)}). Remove it; validate_config lists "
                "every such value.")
    if not allow_commands and (found := _commands(plan)):
        named = "; ".join(f"{key} = {shown(value, 80)!r}" for key, value in found[:5])
        return (f"this config runs commands on launch ({named}), and this MCP server (--root) does not let a config "
                "run commands: remove them, or start quanteval-mcp with --allow-commands if you trust every client.")
    return None
