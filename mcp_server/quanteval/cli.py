"""`quanteval`: the registry's tools from the shell, plus a few friendly wrappers. Wiring only.

Exit codes: 0 ok, 1 tool error (message on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from pydantic import BaseModel

from quanteval import __version__
from quanteval.models import ToolError
from quanteval.stdio_guard import stdout_to_stderr

EXIT_OK, EXIT_TOOL_ERROR, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def run_tool(name: str, arguments: dict[str, Any]) -> BaseModel:
    """Validate and run a tool with library prints kept off stdout. Raises UsageError / ToolError."""
    from quanteval import registry

    try:
        spec = registry.get_tool(name)
        request = registry.parse_arguments(spec, arguments)
    except ToolError as exc:
        raise UsageError(str(exc)) from None

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        if os.environ.get("QUANTEVAL_PROGRESS"):
            of = f"/{total:g}" if total else ""
            print(f"[{name}] {done:g}{of} {message or ''}".rstrip(), file=sys.stderr)

    return registry.call_tool(spec, request, progress)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _load_json_arguments(text: str) -> dict[str, Any]:
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as handle:
                text = handle.read()
        except OSError as exc:
            raise UsageError(f"Cannot read arguments file {text[1:]}: {exc.strerror}") from None
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise UsageError(f"--json is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(value, dict):
        raise UsageError("--json must be a JSON object of the tool's arguments, e.g. '{\"path\": \"./model\"}'")
    return value


def cmd_tools(args: argparse.Namespace) -> int:
    from quanteval import registry

    if args.json:
        emit_json(
            [
                {
                    "name": spec.name,
                    "description": spec.description,
                    "input_schema": spec.input_model.model_json_schema(),
                    "output_schema": spec.output_model.model_json_schema(),
                    "annotations": {
                        "read_only": spec.read_only,
                        "destructive": spec.destructive,
                        "idempotent": spec.idempotent,
                        "open_world": spec.open_world,
                    },
                }
                for spec in registry.TOOLS.values()
            ]
        )
        return EXIT_OK
    width = max(len(name) for name in registry.TOOLS)
    for spec in registry.TOOLS.values():
        summary = spec.description.replace("\n", " ").split(". ", 1)[0].rstrip(".") + "."
        sys.stdout.write(f"{spec.name:<{width}}  {summary}\n")
    return EXIT_OK


def cmd_call(args: argparse.Namespace) -> int:
    arguments = _load_json_arguments(args.json)
    with stdout_to_stderr():
        result = run_tool(args.tool, arguments)
    emit_json(result.model_dump(mode="json"))
    return EXIT_OK


def cmd_inspect(args: argparse.Namespace) -> int:
    with stdout_to_stderr():
        report = run_tool("inspect_checkpoint", {"path": args.path})
    if args.json:
        emit_json(report.model_dump(mode="json"))
    else:
        from quanteval.checkpoint import format_report

        sys.stdout.write(format_report(report) + "\n")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quanteval",
        description="Evaluate quantized LLM checkpoints with NeMo Evaluator Launcher.",
    )
    parser.add_argument("--version", action="version", version=f"quanteval {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    tools = sub.add_parser("tools", help="list the tools with their descriptions (and schemas with --json)")
    tools.add_argument("--json", action="store_true", help="names, descriptions, schemas and annotations as JSON")
    tools.set_defaults(func=cmd_tools)

    call = sub.add_parser("call", help="run one tool: quanteval call <tool> --json '<arguments object>'")
    call.add_argument("tool", help="tool name (see `quanteval tools`)")
    call.add_argument("--json", default="{}", help="arguments as a JSON object, '-' for stdin, or @file")
    call.set_defaults(func=cmd_call)

    insp = sub.add_parser("inspect", help="inspect a checkpoint directory or a cached HF handle")
    insp.add_argument("path", help="checkpoint directory or Hugging Face handle (org/name) already in the local cache")
    insp.add_argument("--json", action="store_true", help="print the full report as JSON")
    insp.set_defaults(func=cmd_inspect)

    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:
        print(f"quanteval: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ToolError as exc:
        print(f"quanteval: {exc}", file=sys.stderr)
        return EXIT_TOOL_ERROR
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: say so without a traceback unless asked
        if os.environ.get("QUANTEVAL_DEBUG"):
            raise
        print(f"quanteval: internal error ({type(exc).__name__}); rerun with QUANTEVAL_DEBUG=1 for details", file=sys.stderr)
        return EXIT_TOOL_ERROR


if __name__ == "__main__":
    sys.exit(main())
