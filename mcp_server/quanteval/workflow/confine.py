"""`quanteval-mcp --root DIR` for what a call reaches, not only for the path arguments a tool is given.

A config inside the root can still name an output directory, a checkpoint, a mount or a benchmark file anywhere, in
so many words or through an interpolation (`${oc.env:VAR,/elsewhere}`, `${VAR:-/elsewhere}`) or an override; the tools
that launch would write there, mount it into a container or import it. Before dry_run, launch_canary and
launch_full_run (and launch_deployment's plan) run, every such local path, as the engine itself reads the config, must
resolve inside the root, or the call is refused naming the key. A run record (run_status, run_logs, resume_run, and
the result tools given a record id) is read only when its config, run directory and logs lie inside the root: the
ledger is shared with the CLI. Paths of a SLURM run are on the cluster: not ours.

A model server's arguments are values too: plan_deployment's extra_args (its framework's argument check reads them
here, even on --read-only) and a launched plan's server_args name no file outside the root, and a flag or plan
environment that loads Python (--trust-remote-code, a plugin, LD_PRELOAD) needs --allow-commands, as a config's
commands do (serving/serverflags.confinement_refusal).

Which paths a launch or a record uses is each engine's knowledge (`RunRole.launch_paths`, `RunRole.record_paths`).
start_eval_server over MCP binds loopback and runs the ns/nel found on PATH or inside the root unless the server was
started with --allow-open-eval-server, and its bearer token comes from a QUANTEVAL_...TOKEN variable of at least
evalserver/backend.MIN_TOKEN_CHARS characters (evalserver/backend.token_refusal).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from quanteval import ledger, paths
from quanteval.localproc import is_loopback
from quanteval.models import ToolError

# Every MCP call passes check_call: what only some tools need (engines, the ledger, the eval server's settings) is
# imported when they are called.

LAUNCHING_TOOLS = frozenset({"dry_run", "launch_canary", "launch_full_run"})
RECORD_TOOLS = frozenset({"run_status", "wait_for_run", "run_logs", "kill_run", "resume_run"})
SERVER_TOOLS = frozenset({"deployment_status", "stop_deployment", "eval_server_status", "stop_eval_server"})
EVAL_SERVER_COMMANDS = ("ns_command", "nel_command")


def visible(record: Any) -> bool:
    """May the running call see this record? Always without --root; under it, when the record's paths lie inside
    (a run's config, run directory and logs; an evaluation's output; a deployment's checkpoint)."""
    policy = paths.CALL_POLICY.get()
    if policy is None or policy.root is None:
        return True
    try:
        if ledger.family(record.kind) == "server":
            where = record.config_path or (record.details.get("output_root") if record.kind == "eval_server" else None)
            if not isinstance(where, str) or not paths.looks_local(where):
                return False
            paths.local_path(where, record.id, paths.Policy(root=policy.root))
        else:
            _check_record(record.id, policy, resuming=False)
            if ledger.family(record.kind) == "run" and not record.config_path:
                return False
    except Exception:  # noqa: BLE001 - a record whose paths cannot be read is not shown to a confined client
        return False
    return True


def check_call(tool: str, arguments: dict[str, Any], policy: paths.Policy) -> dict[str, Any]:
    """Refuse a call that reaches beyond what the policy allows; returns the arguments the tool runs with (an output a
    tool would put in the state dir by default is put inside the root)."""
    if tool == "start_eval_server":
        _check_eval_server(arguments, policy)
    if policy.root is None:
        return arguments
    if tool == "launch_deployment":
        _check_plan(arguments.get("plan"), arguments.get("host"), policy)
    elif tool == "plan_deployment":
        _check_server_args(arguments.get("extra_args"), "extra_args", policy)
    elif tool in LAUNCHING_TOOLS:
        _check_config(tool, arguments, policy)
    elif tool in RECORD_TOOLS:
        _check_record(arguments.get("record_id"), policy, resuming=tool == "resume_run")
    elif tool in SERVER_TOOLS:
        _check_server(arguments.get("record_id"), policy)
    for field, value in arguments.items():  # the result tools take a run by record id too (validate_run, compare ...)
        if paths.PATH_FIELDS.get(field) == "run" and isinstance(value, str):
            _check_run(field, value, policy)
    return _outputs_inside(tool, arguments, policy.root)


def _check_run(field: str, value: str, policy: paths.Policy) -> None:
    """Every way a result tool reaches a run, through one check: a folder (paths.check_arguments checks it), an
    engine-prefixed folder (`nel-next:/dir`, nel-next's invocation ids), host:path on this machine, and a record id,
    invocation id or prefix of one, which must be a record of this ledger whose paths lie inside the root: NEL's own
    job database would find runs anywhere."""
    from quanteval import ledger
    from quanteval.clusters import ssh

    inside = paths.Policy(root=policy.root)
    prefix, colon, rest = value.partition(":")
    if colon and prefix == "nel-next" and rest.startswith(("/", "~")):
        paths.local_path(rest, field, inside)
        return
    if colon and rest.startswith(("/", "~")) and paths.HOST_PATH.match(value):
        if ssh.reaches_this_machine(prefix):  # `local`, `localhost`, 127.0.0.1, this machine's name: its files
            paths.local_path(rest, field, inside)
        return  # a path on a cluster: not ours
    if "/" in value:
        return  # a local folder: checked with the other paths
    try:
        record = ledger.get(value.strip())
    except ToolError:
        raise ToolError(f"{field}: {value!r} is no run of this server's records; under --root give the run's folder "
                        "(inside the root) or its record id (list_runs): an invocation id or a prefix of one is looked up "
                        "in NEL's job database, which reaches runs anywhere.") from None
    _check_record(record.id, policy, resuming=False)


def _check_config(tool: str, arguments: dict[str, Any], policy: paths.Policy) -> None:
    from quanteval.engines import commands, launchplan

    config_path = arguments.get("config_path")
    if not isinstance(config_path, str):
        return
    config = paths.local_path(config_path, "config_path", policy)
    overrides = [o for o in arguments.get("overrides") or [] if isinstance(o, str)]
    plan = launchplan.plan(config, overrides)  # the tool gets this plan back: the config is read once per call
    if tool != "dry_run" and (refusal := commands.launch_refusal(plan, policy.allow_commands)):
        raise ToolError(refusal)  # dry_run renders without running: it shows what would run
    for key, path in plan.engine.run.launch_paths(plan):
        paths.local_path(str(path), key, paths.Policy(root=policy.root))


def _known_record(record_id: Any) -> Any:
    """The ledger record a tool was given, or None when there is none by that id (the tool itself says so)."""
    from quanteval import ledger

    if not isinstance(record_id, str):
        return None
    try:
        return ledger.get(record_id.strip())
    except ToolError:
        return None


def _check_server(record_id: Any, policy: paths.Policy) -> None:
    """A deployment or eval server is watched or stopped over a confined MCP server only when list_runs would show it
    (its checkpoint or output inside the root): one started from the CLI elsewhere is not this client's."""
    if (record := _known_record(record_id)) is None:
        return  # the tool says there is no such record
    token = paths.CALL_POLICY.set(policy)
    try:
        shown = visible(record)
    finally:
        paths.CALL_POLICY.reset(token)
    if not shown:
        raise ToolError(f"{record.id}: this {record.kind} serves from outside the workspace root {policy.root} (started "
                        "elsewhere, from the CLI or another server); this MCP server leaves it alone.")


def _check_record(record_id: Any, policy: paths.Policy, resuming: bool) -> None:
    """A run record's config, run directory and logs (with `resuming`, all that resume starts again) inside the root."""
    from quanteval import engines

    if (record := _known_record(record_id)) is None:
        return  # the tool says there is no such run
    if record.kind == "evaluation":  # start_evaluation's job: where the evaluation it runs writes
        output_dir = (record.details.get("request") or {}).get("output_dir")
        if not isinstance(output_dir, str):
            raise ToolError(f"{record.id}: this evaluation recorded no output folder (started from the CLI without one), "
                            f"so it is not known to lie inside the workspace root {policy.root}; this server leaves it alone.")
        paths.local_path(output_dir, f"{record.id} output_dir", paths.Policy(root=policy.root))
        return
    if ledger.family(record.kind) != "run":
        return  # the tool refuses it
    for what, path in engines.for_record(record).run.record_paths(record, resuming):
        paths.local_path(str(path), f"{record.id} {what}", paths.Policy(root=policy.root))
    if resuming and record.config_path and Path(record.config_path).is_file():  # resume launches its config again
        _check_config("resume_run", {"config_path": record.config_path, "overrides": record.details.get("overrides") or []}, policy)


def _outputs_inside(tool: str, arguments: dict[str, Any], root: Path) -> dict[str, Any]:
    """What evaluate_quantization (directly or through start_evaluation) and start_eval_server write by default to
    the state dir goes inside the root."""
    if tool in ("evaluate_quantization", "start_evaluation") and not arguments.get("output_dir"):
        return {**arguments, "output_dir": str(root / paths.STATE_IN_ROOT / "evaluations")}
    if tool == "start_eval_server" and not arguments.get("output_root"):
        from quanteval.evalserver.backend import DEFAULT_PORT

        return {**arguments, "output_root": str(root / paths.STATE_IN_ROOT / "eval-server" / str(arguments.get("port", DEFAULT_PORT)))}
    return arguments


def _check_eval_server(arguments: dict[str, Any], policy: paths.Policy) -> None:
    """start_eval_server runs commands for anyone who can reach it: over MCP its token must be a real one, and unless
    the server allows it, it binds loopback and runs ns/nel from PATH or the root."""
    from quanteval.evalserver.backend import TOKEN_ENV_DEFAULT, TOKEN_ENV_PATTERN, ServerSettings, token_refusal

    token_env = arguments.get("token_env", TOKEN_ENV_DEFAULT)
    if not isinstance(token_env, str) or not re.match(TOKEN_ENV_PATTERN, token_env):
        raise ToolError(f"token_env: {token_env!r} is not a token variable; over MCP it must be named QUANTEVAL_...TOKEN "
                        f"(e.g. {TOKEN_ENV_DEFAULT}), so no other environment variable can become the token.")
    if refusal := token_refusal(os.environ.get(token_env, "").strip(), token_env, loopback=True):
        raise ToolError(refusal)
    if policy.open_eval_server:
        return
    host = arguments.get("bind_host", ServerSettings.model_fields["bind_host"].default)
    if not isinstance(host, str) or not is_loopback(host):
        raise ToolError(f"bind_host: {host!r} is beyond loopback; this MCP server lets start_eval_server bind only 127.0.0.1 "
                        "or ::1. Start quanteval-mcp with --allow-open-eval-server to allow it (with a token), or run "
                        "`quanteval serve-eval --host ...` yourself.")
    if policy.root is None:
        return
    for field in EVAL_SERVER_COMMANDS:
        command = arguments.get(field)
        default = ServerSettings.model_fields[field].default
        if command is None or command == default:
            continue  # the one installed on this machine's PATH
        if not isinstance(command, str) or "/" not in command:
            raise ToolError(f"{field}: {command!r}: over this MCP server it is {default!r} (found on PATH) or a path inside "
                            f"the workspace root {policy.root}; start quanteval-mcp with --allow-open-eval-server for others.")
        paths.local_path(command, field, policy)


def _check_plan(plan: Any, host: Any, policy: paths.Policy) -> None:
    """launch_deployment's plan (sent whole by the client): its checkpoint and every path among the server arguments
    (model, chat template, download dir ...) must be inside the root when it runs here; a flag or an environment
    variable that loads code needs --allow-commands."""
    from quanteval.clusters import ssh
    from quanteval.serving.frameworks import VLLM_CPU_ENV

    if not isinstance(plan, dict) or not ssh.names_this_machine(host) or not ssh.names_this_machine(plan.get("host")):
        return
    checkpoint = plan.get("checkpoint")
    if isinstance(checkpoint, str) and (paths.looks_local(checkpoint) or paths.on_disk(checkpoint)):
        paths.local_path(checkpoint, "plan.checkpoint", paths.Policy(root=policy.root))
    _check_server_args(plan.get("server_args"), "plan.server_args", policy)
    env, planned = plan.get("env") or {}, {"HF_HUB_OFFLINE", *VLLM_CPU_ENV}  # what plan_deployment puts in a plan's env
    if isinstance(env, dict) and not policy.allow_commands and (other := sorted(set(map(str, env)) - planned)):
        raise ToolError(f"plan.env: {', '.join(other)}: a plan's environment is what plan_deployment sets ({', '.join(sorted(planned))}); "
                        "another variable can make the server load code (LD_PRELOAD, PYTHONPATH, VLLM_PLUGINS ...). Remove it, "
                        "or start quanteval-mcp with --allow-commands if you trust every client.")


def _check_server_args(args: Any, field: str, policy: paths.Policy) -> None:
    """A model server's arguments (plan_deployment's extra_args, which its framework's argument check reads here too;
    a plan's server_args) name no path outside the root, and load no Python unless the server allows commands."""
    from quanteval.serving import serverflags

    if isinstance(args, list) and policy.root is not None and (
            refusal := serverflags.confinement_refusal([str(arg) for arg in args], field, policy.root, policy.allow_commands)):
        raise ToolError(refusal)
