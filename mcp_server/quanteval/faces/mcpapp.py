"""The MCP server built on the SDK, generated from the tool registry. Wiring only (`quanteval-mcp` starts it).

Tools are served from the registry directly, not through the SDK's function-signature
machinery: the SDK fills defaults and drops unknown keys before a function tool sees its
arguments, and reports an exception raised while parsing them as a bare "Error executing
tool X". Here the raw arguments reach `registry.run`, the same path the CLI takes, so a
misspelled key, a "was this given" check and every error message behave as on the CLI.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import weakref
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server import NotificationOptions
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceNotFoundError
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INVALID_PARAMS,
    CallToolResult,
    GetPromptResult,
    ListResourcesResult,
    ListToolsResult,
    ResourceLink,
    TextContent,
    ToolAnnotations,
)
from mcp_types import Resource as MCPResource
from mcp_types import Tool as MCPTool

from quanteval import __version__, paths, registry
from quanteval.models import ToolError, cancellable_by, cancellation_point

if TYPE_CHECKING:
    from quanteval.faces.mcpskills import SkillsExtension

log = logging.getLogger("quanteval.faces.server")

_in_flight = [0]  # tool calls running now (the event loop's thread only changes it)


def calls_in_flight() -> int:
    return _in_flight[0]

INSTRUCTIONS = (
    "How much accuracy did quantizing a checkpoint cost? One call answers it on this machine: evaluate_quantization "
    "(baseline and candidate checkpoints, benchmarks, the largest acceptable drop in points) serves both, runs a canary and a full run "
    "each, and gives the verdict; a client that cuts calls at 60 s calls start_evaluation (the same arguments), then "
    "wait_for_run until it is not running. Step by step instead (an existing config, a SLURM cluster, NEL container tasks, one run at a "
    "time): check_environment, build_config, add_tasks, inspect_checkpoint, apply_checkpoint, list_missing_values, "
    "apply_cluster (SLURM), validate_config, dry_run, launch_canary, validate_run, launch_full_run, compare_results "
    "or gate_results. Tools for SLURM (cluster), serving a checkpoint alone (deploy) and training loops (evalserver) "
    "are off until enable_toolsets turns their toolset on. Paths are absolute."
)


# Files a tool reports by path that a client may need to read: served as resources (QuantevalServer._report_links).
REPORT_FILES = {"report_html": "text/html", "report_markdown": "text/markdown", "chart_png": "image/png",
                "report_path": "application/json", "policy_path": "application/yaml"}
REPORTS_URI = "quanteval://reports/"
REPORTS_PER_SESSION = 64  # the newest reports a session's calls wrote; older ones are dropped
REPORT_MAX_BYTES = 16 * 1024 * 1024  # a report is kept in memory: a larger file is not served


@dataclass
class _Report:
    listing: MCPResource
    content: bytes | str


@dataclass
class _SessionState:
    """What one client session changed: the tools enable_toolsets added for it, the reports its calls wrote (the
    bytes as written, newest last). Nothing here is seen by another session of an HTTP server."""
    tools: dict[str, registry.ToolSpec]
    reports: OrderedDict[str, _Report] = field(default_factory=OrderedDict)


def compact_schema(node: Any) -> Any:
    """A pydantic JSON schema without what a model does not need: titles, null defaults, anyOf-with-null.

    Same meaning, about half the bytes: `{"anyOf": [{"type": "string"}, {"type": "null"}]}` becomes
    `{"type": ["string", "null"]}` (an enum gets null among its values); pydantic's "title" of every field repeats its name.
    """
    if isinstance(node, list):
        return [compact_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key == "default" and value is None:
            continue
        if key in ("properties", "$defs"):  # keys here are names, not schema keywords
            out[key] = {name: compact_schema(sub) for name, sub in value.items()}
        else:
            out[key] = compact_schema(value)
    options = out.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        other = next(option for option in options if option != {"type": "null"})
        if isinstance(other.get("type"), str) and "const" not in other:
            del out["anyOf"]
            out = {**other, **out, "type": [other["type"], "null"]}
            if "enum" in other:  # an enum without null would refuse it
                out["enum"] = [*other["enum"], None]
    return out


def _flat_input_schema(model: type) -> dict[str, Any]:
    """The input schema with nested models as plain objects (their fields are checked server-side).

    A nested model is another tool's output passed back as is (launch_deployment's plan): spelling out its
    whole schema in tools/list costs kilobytes and tells the model nothing it can act on. Enums stay inline.
    """
    schema = model.model_json_schema()  # type: ignore[attr-defined]
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, list):
            return [inline(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            kept = {key: value for key, value in node.items() if key != "$ref"}
            return {**({"enum": target["enum"]} if "enum" in target else {"type": "object"}), **kept}
        return {key: inline(value) for key, value in node.items()}

    return compact_schema(inline(schema))


def _listing(spec: registry.ToolSpec, output_schemas: bool) -> MCPTool:
    schema = _flat_input_schema(spec.input_model)
    schema["additionalProperties"] = False  # unknown keys are errors (checked in registry.parse_arguments)
    return MCPTool(
        name=spec.name,
        description=" ".join(spec.description.split()),  # one line: a model needs no line breaks
        input_schema=schema,
        output_schema=compact_schema(spec.output_model.model_json_schema()) if output_schemas else None,
        annotations=ToolAnnotations(
            read_only_hint=spec.read_only,
            destructive_hint=spec.destructive,
            idempotent_hint=spec.idempotent,
            open_world_hint=spec.open_world,
        ),
    )


def _listing_key(output_schemas: bool) -> str:
    """Changes whenever any quanteval module does (a new install, an edit in a checkout)."""
    import hashlib

    package = Path(__file__).parents[1]  # quanteval/, with every folder of modules
    stats = sorted((str(path.relative_to(package)), path.stat().st_size, path.stat().st_mtime_ns) for path in package.rglob("*.py"))
    return hashlib.sha256(repr((__version__, output_schemas, stats)).encode()).hexdigest()


def _cached_listing(output_schemas: bool) -> dict[str, MCPTool]:
    """Every registered tool's listing, from a file in the state dir while the code is unchanged.

    Building the schemas imports every domain module (about a third of the start-up time); a client's
    first tools/list should not wait for that when nothing changed since the last start.
    """
    import json

    from quanteval import envvars

    key = _listing_key(output_schemas)
    cache_file = envvars.state_dir() / "mcp-tools-list.json"
    try:
        cached = json.loads(cache_file.read_text(encoding="utf-8"))
        if cached.get("key") == key:
            return {name: MCPTool.model_validate(tool) for name, tool in cached["tools"].items()}
    except (OSError, ValueError):
        pass
    listing = {name: _listing(spec, output_schemas) for name, spec in registry.TOOLS.items()}
    payload = {"key": key, "tools": {name: tool.model_dump(mode="json", by_alias=True, exclude_none=True) for name, tool in listing.items()}}
    temporary = cache_file.with_suffix(f".{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps(payload), encoding="utf-8")
        os.replace(temporary, cache_file)
    except OSError:
        temporary.unlink(missing_ok=True)
    return listing


def _error(message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


class QuantevalServer(MCPServer):
    def __init__(self, tools: dict[str, registry.ToolSpec], policy: paths.Policy, output_schemas: bool = True,
                 read_only: bool = False, skills: SkillsExtension | None = None, ceiling: list[str] | None = None) -> None:
        # The Skills extension (faces/mcpskills.py): skills/list, skills/get and the skill:// resources, read live.
        super().__init__(name="quanteval", version=__version__, instructions=INSTRUCTIONS, extensions=[skills] if skills else [],
                         middleware=[skills.advertise_on_handshake] if skills else [])
        self._skills = skills
        self._specs = dict(tools)  # what every session starts with
        self._ceiling = ceiling  # the toolsets enable_toolsets may add (the operator's --toolsets); None: any
        self._policy = policy
        self._output_schemas = output_schemas
        self._read_only = read_only
        # Per client session (an HTTP server has many): weakly keyed, so a session that ends takes its state along.
        self._sessions: weakref.WeakKeyDictionary[Any, _SessionState] = weakref.WeakKeyDictionary()
        self._sessionless = _SessionState(dict(tools))  # requests that belong to no session
        # enable_toolsets changes tools/list: say so in the capabilities (the SDK's run paths pass no options).
        options = self._lowlevel_server.create_initialization_options

        def with_tools_changed(notification_options: NotificationOptions | None = None, *args: Any, **kwargs: Any) -> Any:
            return options(notification_options or NotificationOptions(tools_changed=True), *args, **kwargs)

        self._lowlevel_server.create_initialization_options = with_tools_changed  # type: ignore[method-assign]

    def _state(self, session: Any) -> _SessionState:
        """The state of the client connection a request came on: one per session of the handshake protocol (an HTTP
        session, a stdio client). A request of the stateless 2026-07-28 protocol belongs to no session (the SDK makes
        a connection per request): those share the server's one state, which the operator's --toolsets bounds."""
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        connection = getattr(session, "_connection", None)  # the SDK's per-client Connection behind the per-request proxy
        if connection is None or connection.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return self._sessionless
        if connection not in self._sessions:
            self._sessions[connection] = _SessionState(dict(self._specs))
        return self._sessions[connection]

    def _session_state(self, context: Context | None) -> _SessionState:
        try:
            return self._state(context.request_context.session if context is not None else None)
        except ValueError:  # a Context outside any request
            return self._sessionless

    @functools.cached_property
    def _cached_listing(self) -> dict[str, MCPTool]:
        return _cached_listing(self._output_schemas)

    def _tool_listing(self, tools: dict[str, registry.ToolSpec]) -> list[MCPTool]:
        listing = self._cached_listing
        return [listing[name] if name in listing else _listing(spec, self._output_schemas) for name, spec in tools.items()]

    async def list_tools(self) -> list[MCPTool]:
        return self._tool_listing(self._specs)

    async def _handle_list_tools(self, ctx: Any, params: Any) -> ListToolsResult:
        return ListToolsResult(tools=self._tool_listing(self._state(ctx.session).tools))

    async def list_resources(self) -> list[MCPResource]:
        skill_files = self._skills.resource_listing() if self._skills else []
        return [*skill_files, *await super().list_resources()]

    async def _handle_list_resources(self, ctx: Any, params: Any) -> ListResourcesResult:
        reports = [report.listing for report in self._state(ctx.session).reports.values()]
        return ListResourcesResult(resources=[*await self.list_resources(), *reports])

    async def read_resource(self, uri: Any, context: Context | None = None) -> Iterable[ReadResourceContents] | Any:
        if self._skills and str(uri).startswith("skill://"):
            return self._skills.read(str(uri))  # an unknown or escaping URI: ResourceNotFoundError, -32602
        if str(uri).startswith(REPORTS_URI):
            report = self._session_state(context).reports.get(str(uri))
            if report is None:
                raise ResourceNotFoundError(f"Unknown resource {uri}: a report is served to the session whose call wrote "
                                            f"it, its newest {REPORTS_PER_SESSION}. Call the tool again for a fresh one.")
            return [ReadResourceContents(content=report.content, mime_type=report.listing.mime_type)]
        return await super().read_resource(uri, context)

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Context | None = None) -> CallToolResult:
        from quanteval.faces import toolsetting

        state = self._session_state(context)
        if name not in state.tools and (how := toolsetting.how_to_enable(name, self._read_only, self._ceiling)):
            log.info("tool %s is not served now", name)
            return _error(how)
        try:
            spec = registry.get_tool(name, state.tools)
            if spec.name == "enable_toolsets":
                return await self._enable_toolsets(spec, arguments, context, state)
            from quanteval.workflow import confine  # cheap: what a check needs is imported by the check

            arguments = confine.check_call(name, arguments, self._policy)
            _in_flight[0] += 1
            call_policy = paths.CALL_POLICY.set(self._policy)  # the worker thread runs in a copy of this context
            try:
                result = await anyio.to_thread.run_sync(
                    functools.partial(_run_cancellable, spec, arguments, _progress_reporter(context), self._policy),
                    # Not abandoned: a cancelled call (the client sent notifications/cancelled, closed stdio or dropped its
                    # HTTP session) reaches the tool at its next poll (cancellation_point), and the server waits while it cleans up
                    # (stops the servers it started, records its runs as cancelled) instead of leaving them running.
                    abandon_on_cancel=False,
                )
            finally:
                paths.CALL_POLICY.reset(call_policy)
                _in_flight[0] -= 1
            data, text = registry.result_json(spec, result)
        except ToolError as exc:
            log.info("tool %s failed: %s", name, exc)
            return _error(str(exc))
        except Exception as exc:  # a bug: the client learns its type, the log gets the traceback
            log.exception("tool %s raised", name)
            return _error(registry.internal_error(name, exc))
        links = self._report_links(data, state)
        return CallToolResult(content=[TextContent(type="text", text=text), *links], structured_content=data)

    def _report_links(self, data: Any, state: _SessionState) -> list[ResourceLink]:
        """The reports a tool wrote (report.html/.md, the chart, gate-report.json, the rule's policy), as resources this
        server serves to the calling session: a client on another machine or in a sandbox reads them with
        resources/read, not by path. Only these files are served, each under a name that does not reveal or take a
        path, and with the bytes read now: a file swapped for a link afterwards changes nothing that is served."""
        import hashlib

        links = []
        for key, mime_type in REPORT_FILES.items():
            value = data.get(key) if isinstance(data, dict) else None
            content = self._report_bytes(value) if isinstance(value, str) else None
            if content is None:
                continue
            path = Path(value)  # type: ignore[arg-type]
            uri = f"{REPORTS_URI}{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}/{path.name}"
            listing = MCPResource(uri=uri, name=path.name, description=f"{key} of a quanteval tool call", mime_type=mime_type,
                                  size=len(content))
            state.reports.pop(uri, None)
            state.reports[uri] = _Report(listing, content if mime_type == "image/png" else content.decode("utf-8", "replace"))
            while len(state.reports) > REPORTS_PER_SESSION:
                state.reports.popitem(last=False)
            links.append(ResourceLink(uri=uri, name=path.name, mime_type=mime_type, size=len(content)))
        return links

    def _report_bytes(self, value: str) -> bytes | None:
        """The file a tool reported, if it is a regular file inside the root (where the tool wrote it), not reached
        through a link at its name, and small enough to keep."""
        path = Path(value)
        try:
            resolved = path.parent.resolve() / path.name
            if self._policy.root is not None and not resolved.is_relative_to(self._policy.root):
                return None
            fd = os.open(resolved, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except (OSError, ValueError):
            return None
        with os.fdopen(fd, "rb") as handle:
            status = os.fstat(handle.fileno())
            if not stat.S_ISREG(status.st_mode) or status.st_size > REPORT_MAX_BYTES:
                return None
            return handle.read(REPORT_MAX_BYTES + 1)[:REPORT_MAX_BYTES]

    async def _enable_toolsets(self, spec: registry.ToolSpec, arguments: dict[str, Any], context: Context | None,
                               state: _SessionState) -> CallToolResult:
        """enable_toolsets over MCP: this session is served the toolsets' tools from now on (another session of an
        HTTP server is not), within the toolsets the operator's --toolsets allows; tells the client its tools/list
        changed."""
        from quanteval.faces import toolsetting

        request = registry.parse_arguments(spec, arguments)
        allowed = [name for name in request.toolsets if self._ceiling is None or name in self._ceiling]
        held = registry.select(allowed, self._read_only) if allowed else {}
        added = [name for name in held if name not in state.tools]
        state.tools.update(held)
        if added and context is not None:
            try:
                await context.request_context.session.send_tool_list_changed()  # clients of the 2025 protocol
                await context.notify_tools_changed()  # subscriptions/listen streams (2026-07-28 on)
            except Exception:  # a client that left: the listing has changed all the same
                log.debug("tools/list_changed not sent", exc_info=True)
        message = (f"Added {', '.join(added)}: callable now (tools/list_changed sent)." if added
                   else "Already served: nothing added.")
        if beyond := [name for name in request.toolsets if name not in allowed]:
            message += (f" Not served by this server: {', '.join(beyond)} (its operator started it with --toolsets "
                        f"{','.join(self._ceiling or [])}).")
        if self._read_only and (skipped := set(registry.select(allowed)) - set(held) if allowed else set()):
            message += f" Not served by this --read-only server: {', '.join(sorted(skipped))}."
        answer = toolsetting.EnableToolsetsOutput(tools=list(held), added=added, message=message)
        data, text = registry.result_json(spec, answer)
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, context: Context | None = None
    ) -> GetPromptResult:
        # The SDK reports these as a JSON-RPC error with code 0; they are invalid params.
        prompt = self._prompt_manager.get_prompt(name)
        if prompt is None:
            raise MCPError(INVALID_PARAMS, f"Unknown prompt '{name}'. prompts/list names them.")
        valid = [argument.name for argument in prompt.arguments or []]
        unknown = sorted(set(arguments or {}) - set(valid))
        if unknown:
            raise MCPError(INVALID_PARAMS, f"Prompt {name}: unknown argument(s) {', '.join(unknown)}; valid: {', '.join(valid)}.")
        return await super().get_prompt(name, arguments, context)  # type: ignore[return-value]


def _run_cancellable(spec: registry.ToolSpec, arguments: dict[str, Any], progress: registry.ProgressFn,
                     policy: Any) -> Any:
    """registry.run in the worker thread, where every cancellation_point() learns whether the call was cancelled."""
    with cancellable_by(anyio.from_thread.check_cancelled):
        return registry.run(spec, arguments, progress, policy)


def _progress_reporter(ctx: Context | None) -> registry.ProgressFn:
    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        cancellation_point()  # raises into the tool when the call was cancelled or its client left
        if ctx is None:
            return
        try:
            anyio.from_thread.run(ctx.report_progress, done, total, message)
        except Exception:  # progress is best effort; a client that left must not fail the tool
            log.debug("progress report dropped", exc_info=True)

    return progress


def build_server(
    toolsets: list[str] | None = None, read_only: bool = False, root: Path | None = None, output_schemas: bool = True,
    open_eval_server: bool = False, allow_commands: bool = False, ceiling: list[str] | None = None,
) -> MCPServer:
    """The server: relative paths refused (a client's paths mean nothing in the server's working directory); with
    `open_eval_server`, start_eval_server may bind beyond loopback and run an ns/nel command outside the root; with
    `allow_commands`, a config under the root may run commands on launch (engines/commands.py); `ceiling`: the only
    toolsets enable_toolsets may add (the operator's --toolsets; None: any); `read_only`: no tool writes a file."""
    policy = paths.Policy(root=root, absolute_only=True, open_eval_server=open_eval_server, allow_commands=allow_commands,
                          read_only=read_only)
    server = QuantevalServer(registry.select(toolsets, read_only), policy, output_schemas, read_only, _skills_extension(),
                             ceiling)
    _add_extras(server)
    return server


def _skills_extension() -> SkillsExtension | None:
    """The MCP Skills extension over the skill pack, when the pack is installed."""
    from quanteval.faces import mcpskills

    return mcpskills.extension()


def _add_extras(server: MCPServer) -> None:
    """Resources and prompts (the skill pack) are registered by the skills module when present."""
    try:
        from quanteval.faces import skillpack
    except ImportError:
        return
    skillpack.register_mcp(server)
