"""`quanteval-mcp`: the MCP server, generated from the tool registry. Wiring only."""

from __future__ import annotations

import argparse
import functools
import inspect
import logging
import sys
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError as McpToolError
from mcp_types import ToolAnnotations

from quanteval import __version__, registry
from quanteval.models import ToolError

log = logging.getLogger("quanteval.server")

INSTRUCTIONS = (
    "quanteval evaluates the accuracy of (quantized) LLM checkpoints with NeMo Evaluator Launcher. "
    "Typical order: check_environment, inspect_checkpoint, build_config, apply_checkpoint, add_tasks, "
    "list_missing_values, validate_config, dry_run, launch_canary, validate_run, launch_full_run, "
    "extract_scores, compare_results."
)


def _handler(spec: registry.ToolSpec):
    """An async function whose signature is the input model's fields, so MCP clients see flat arguments."""

    async def handler(ctx: Context, **arguments: Any) -> Any:
        request = registry.parse_arguments(spec, arguments)

        def progress(done: float, total: float | None = None, message: str | None = None) -> None:
            try:
                anyio.from_thread.run(ctx.report_progress, done, total, message)
            except Exception:  # progress is best effort; a client that left must not fail the tool
                log.debug("progress report dropped", exc_info=True)

        try:
            return await anyio.to_thread.run_sync(
                functools.partial(registry.call_tool, spec, request, progress), abandon_on_cancel=True
            )
        except ToolError as exc:
            raise McpToolError(str(exc)) from None

    params = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
    annotations: dict[str, Any] = {"ctx": Context, "return": spec.output_model}
    for name, field in spec.input_model.model_fields.items():
        annotation = Annotated[field.annotation, field]
        # a default_factory stays inside the FieldInfo (pydantic refuses it next to a plain default)
        plain_default = not field.is_required() and field.default_factory is None
        default = field.default if plain_default else inspect.Parameter.empty
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
        annotations[name] = annotation
    handler.__signature__ = inspect.Signature(params, return_annotation=spec.output_model)  # type: ignore[attr-defined]
    handler.__annotations__ = annotations
    handler.__name__ = spec.name
    return handler


def build_server() -> MCPServer:
    server = MCPServer(name="quanteval", version=__version__, instructions=INSTRUCTIONS)
    for spec in registry.TOOLS.values():
        server.add_tool(
            _handler(spec),
            name=spec.name,
            description=spec.description,
            structured_output=True,
            annotations=ToolAnnotations(
                title=spec.name.replace("_", " "),
                read_only_hint=spec.read_only,
                destructive_hint=spec.destructive,
                idempotent_hint=spec.idempotent,
                open_world_hint=spec.open_world,
            ),
        )
    _add_extras(server)
    return server


def _add_extras(server: MCPServer) -> None:
    """Resources and prompts (the skill pack) are registered by the skills module when present."""
    try:
        from quanteval import skillpack
    except ImportError:
        return
    skillpack.register_mcp(server)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quanteval-mcp", description="quanteval MCP server (stdio by default).")
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP on 127.0.0.1 instead of stdio")
    parser.add_argument("--port", type=int, default=8765, help="HTTP port (with --http; default 8765)")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("mcp").setLevel(args.log_level)  # the SDK logs every tool error at INFO otherwise
    server = build_server()
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.port)
    else:
        server.run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
