"""`quanteval-mcp`: start the MCP server (stdio by default, `--http` for streamable HTTP on 127.0.0.1).

Importing the MCP SDK takes longer than all of `nel --help` (its protocol types are built at
import). An IDE spawns the server and at once sends `initialize` and `tools/list`, whose answers
depend only on this code and the options. So over stdio those two are answered from the SDK's
own answers recorded by an earlier start (same code, same SDK, same options) while the SDK loads
in a background thread; then the SDK takes over the stream. It is first shown the client's
`initialize` again, under an id of its own whose answer is dropped, so its session state is
exactly as if it had answered itself. With no recording yet, the SDK answers everything.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

REPLAY_ID = "quanteval-replayed-initialize"
_SDK_NAMES = {"build_server", "QuantevalServer", "compact_schema", "INSTRUCTIONS"}


def __getattr__(name: str) -> Any:
    """`from quanteval.faces.server import build_server` keeps working; the SDK loads only when it is used."""
    if name in _SDK_NAMES:
        from quanteval.faces import mcpapp

        return getattr(mcpapp, name)
    raise AttributeError(name)


# ---------------------------------------------------------------------------------------------
# Recorded answers


def _recording_key(options: list[str]) -> str:
    """Changes with any quanteval module, the installed SDK, or the options that shape the answers."""
    import importlib.util

    from quanteval import __version__

    files = list(Path(__file__).parents[1].rglob("*.py"))  # every quanteval module, in every folder
    for package in ("mcp", "mcp_types"):
        spec = importlib.util.find_spec(package)
        if spec and spec.origin:
            files.append(Path(spec.origin))
    stats = sorted((str(path), path.stat().st_size, path.stat().st_mtime_ns) for path in files)
    return hashlib.sha256(repr((__version__, sys.version, options, stats)).encode()).hexdigest()


class _Recording:
    """The SDK's answers to initialize and tools/list, per protocol version the client asked for."""

    def __init__(self, key: str) -> None:
        from quanteval import envvars

        self.path = envvars.state_dir() / "mcp-stdio-answers.json"
        self.key = key
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.answers: dict[str, dict[str, Any]] = data["answers"] if data.get("key") == key else {}
        except (OSError, ValueError, KeyError):
            self.answers = {}
        self._lock = threading.Lock()

    def get(self, method: str, version: str) -> Any:
        return self.answers.get(version, {}).get(method)

    def learn(self, method: str, version: str, result: Any) -> None:
        with self._lock:
            if self.answers.get(version, {}).get(method) == result:
                return
            self.answers.setdefault(version, {})[method] = result
            temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
            try:
                temporary.write_text(json.dumps({"key": self.key, "answers": self.answers}), encoding="utf-8")
                os.replace(temporary, self.path)
            except OSError:  # a read-only state dir: the next start simply waits for the SDK
                temporary.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# The stdio stream, shared by the early answers and the SDK


# Deeper than any tool's arguments go. The SDK's parser gives up near 200 levels and then answers nothing (the client
# waits for ever), and Python's json raises RecursionError near 1,000 (which would end the server).
MAX_NESTING = 64
_ID = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)')


def nesting(line: bytes) -> int:
    """How deep a JSON text's arrays and objects nest (strings skipped), without parsing it."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in line:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _too_deep(line: bytes) -> str | None:
    """The JSON-RPC error line for a request nested deeper than MAX_NESTING (its id found without parsing it), else None."""
    deepest = nesting(line)
    if deepest <= MAX_NESTING:
        return None
    found = _ID.search(line)
    request_id = json.loads(found.group(1)) if found else None
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32600, "message": (
        f"Invalid request: nested {deepest} levels deep; quanteval takes at most {MAX_NESTING} (no tool's arguments go deeper).")}})


class _Input:
    """Lines for the SDK: those held back while it loaded, then the rest of stdin. Notes what each request asks, and
    answers itself a request too deep to parse."""

    def __init__(self, stream: BinaryIO, held: list[bytes], requests: dict[Any, tuple[str, str]], version: list[str],
                 out_fd: int) -> None:
        self._stream, self._held, self._requests, self._version, self._out_fd = stream, held, requests, version, out_fd

    def readline(self) -> str:
        while True:
            line = self._held.pop(0) if self._held else self._stream.readline()
            refusal = _too_deep(line)
            if refusal is None:
                break
            _write_line(self._out_fd, refusal)
        _note_request(line, self._requests, self._version)
        return line.decode("utf-8", errors="replace")

    def __iter__(self):  # anyio's AsyncFile iterates by readline
        return iter(self.readline, "")


def _note_request(line: bytes, requests: dict[Any, tuple[str, str]], version: list[str]) -> None:
    """Remember which ids are initialize / tools/list requests, to record the SDK's answers to them."""
    try:
        message = json.loads(line)
    except ValueError:
        return
    if not isinstance(message, dict) or "id" not in message:
        return
    if message.get("method") == "initialize":
        version[0] = str((message.get("params") or {}).get("protocolVersion", ""))
        requests[message["id"]] = ("initialize", version[0])
    elif message.get("method") == "tools/list" and not (message.get("params") or {}).get("cursor"):
        requests[message["id"]] = ("tools/list", version[0])


class _Output:
    """stdout for the SDK: records its answers to initialize and tools/list, drops the replayed one's answer."""

    def __init__(self, fd: int, recording: _Recording, requests: dict[Any, tuple[str, str]]) -> None:
        self._fd, self._recording, self._requests = fd, recording, requests
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        while "\n" in self._pending:
            line, self._pending = self._pending.split("\n", 1)
            if self._keep(line):
                _write_line(self._fd, line)
        return len(text)

    def flush(self) -> None:
        pass  # every line is written whole, at once

    def _keep(self, line: str) -> bool:
        try:
            message = json.loads(line)
        except ValueError:
            return True
        asked = self._requests.pop(message.get("id"), None) if isinstance(message, dict) else None
        if asked and "result" in message:
            self._recording.learn(asked[0], asked[1], message["result"])
        return not (isinstance(message, dict) and message.get("id") == REPLAY_ID)


def _write_line(fd: int, line: str) -> None:
    data = (line + "\n").encode("utf-8")
    while data:
        data = data[os.write(fd, data) :]


def _answer(fd: int, request_id: Any, result: Any) -> None:
    _write_line(fd, json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}, separators=(",", ":")))


# ---------------------------------------------------------------------------------------------
# Serving


class _Loader(threading.Thread):
    """Imports the SDK and builds the server while the main thread answers what it can."""

    def __init__(self, build: Callable[[], Any]) -> None:
        super().__init__(daemon=True, name="quanteval-sdk-loader")
        self._build = build
        self.server: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.server = self._build()
        except BaseException as exc:  # re-raised in the main thread
            self.error = exc


def _early_answers(stream: BinaryIO, out_fd: int, recording: _Recording, loader: _Loader) -> list[bytes] | None:
    """Answer initialize, tools/list and ping from the recording until a request needs the SDK.

    Returns the lines the SDK must see (the replayed initialize first), or None at end of input.
    """
    held: list[bytes] = []
    version: str | None = None
    while not loader.server:
        line = stream.readline()
        if not line:
            return None
        if (refusal := _too_deep(line)) is not None:
            _write_line(out_fd, refusal)
            continue
        try:
            message = json.loads(line)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            return [*held, line]
        method, params = message.get("method"), message.get("params") or {}
        if method == "initialize" and version is None and recording.get("initialize", str(params.get("protocolVersion"))):
            version = str(params.get("protocolVersion"))
            _answer(out_fd, message.get("id"), recording.get("initialize", version))
            held.insert(0, json.dumps({**message, "id": REPLAY_ID}).encode() + b"\n")
            continue
        if method == "tools/list" and version is not None and not params.get("cursor") and recording.get("tools/list", version):
            _answer(out_fd, message.get("id"), recording.get("tools/list", version))
            continue
        if method == "ping" and "id" in message:
            _answer(out_fd, message["id"], {})
            continue
        held.append(line)
        if "id" in message:
            return held  # a request only the SDK can answer
    return held


def serve_stdio(build: Callable[[], Any], options: list[str]) -> None:
    """Serve MCP on stdin/stdout; fd 0 and 1 point elsewhere meanwhile, so nothing else reaches the wire."""
    in_fd, out_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # children and libraries read EOF, never the protocol stream
    os.close(devnull)
    os.dup2(2, 1)  # stray prints from libraries land on stderr
    sys.stdout = sys.stderr
    stream = os.fdopen(in_fd, "rb")
    recording = _Recording(_recording_key(options))
    loader = _Loader(build)
    loader.start()
    held = _early_answers(stream, out_fd, recording, loader)
    if held is None:
        return
    loader.join()
    if loader.error is not None:
        raise loader.error
    requests: dict[Any, tuple[str, str]] = {}
    _run_sdk(loader.server, _Input(stream, held, requests, [""], out_fd), _Output(out_fd, recording, requests))


def _run_sdk(server: Any, stdin: _Input, stdout: _Output) -> None:
    import anyio
    from mcp.server.stdio import stdio_server

    lowlevel = server._lowlevel_server  # what MCPServer.run_stdio_async runs, with our streams

    async def run() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_on_sigterm, group.cancel_scope)
            async with stdio_server(anyio.wrap_file(stdin), anyio.wrap_file(stdout)) as (read_stream, write_stream):  # type: ignore[arg-type]
                await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
            group.cancel_scope.cancel()

    anyio.run(run)


async def _cancel_on_sigterm(scope: Any) -> None:
    """SIGTERM (the TypeScript SDK's client and the Inspector CLI send it when they close) cancels the calls in
    flight like a client that left: each stops what it started, then the server exits, instead of dying with them.

    It exits itself: such a client keeps stdin open until the server is gone, and a blocked stdin read cannot be
    cancelled, so waiting for the SDK's own shutdown would wait for each other.
    """
    import signal

    import anyio

    from quanteval.faces import mcpapp

    with anyio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _signum in signals:
            scope.cancel()
            with anyio.CancelScope(shield=True):
                while mcpapp.calls_in_flight():
                    await anyio.sleep(0.1)
            os._exit(0)


# ---------------------------------------------------------------------------------------------
# Command line


def _root(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Path | None:
    """--root, checked; over HTTP (any local process may connect) the working directory when not given."""
    root = Path(args.root).expanduser() if args.root else (Path.cwd() if args.http else None)
    if root is not None and not root.is_dir():
        parser.error(f"--root {root}: not a directory")
    return root


# After SIGTERM, how long open connections may finish before they are closed: a client's event stream (GET /mcp)
# never ends by itself, and uvicorn would wait for it for ever. Calls in flight are cancelled and clean up first.
HTTP_SHUTDOWN_GRACE_S = 5


# A connection must send a request's line and headers within this long (from connecting, or from its first byte
# after a response): uvicorn has no such deadline, so a client that sends part of a request and stops held its
# socket for ever. Bodies and the event stream are not timed here: they are the SDK's and the session's business.
HTTP_HEADER_DEADLINE_S = 10.0


def _header_deadline_protocol() -> type:
    """uvicorn's h11 protocol, closing a connection whose request line and headers are not all in by the deadline."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadlineProtocol(H11Protocol):
        _deadline: Any = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:  # still waiting for the end of a request's headers
                self._arm()
            else:
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(HTTP_HEADER_DEADLINE_S, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadlineProtocol


def serve_http(server: Any, port: int, log_level: str) -> None:
    """Streamable HTTP on 127.0.0.1, as the SDK serves it, but one that SIGTERM always stops and a half-sent request
    does not hold open."""
    import uvicorn

    app = server.streamable_http_app(host="127.0.0.1")
    uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level=log_level.lower(),
                                  http=_header_deadline_protocol(), timeout_graceful_shutdown=HTTP_SHUTDOWN_GRACE_S)).run()


def main(argv: list[str] | None = None) -> int:
    from quanteval import toolsets

    parser = argparse.ArgumentParser(
        prog="quanteval-mcp", description="quanteval MCP server (stdio by default).", formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"toolsets (on: served by default):\n{toolsets.described()}",
    )
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP on 127.0.0.1 instead of stdio")
    parser.add_argument("--port", type=int, default=8765, help="HTTP port (with --http; default 8765)")
    parser.add_argument(
        "--root",
        help="workspace root: every file the tools read or write must lie inside it "
        "(default: no restriction over stdio, the working directory over --http)",
    )
    parser.add_argument("--allow-open-eval-server", action="store_true",
                        help="let start_eval_server bind beyond loopback (clients then need its bearer token) and run an "
                        "ns_command/nel_command outside --root; refused by default")
    parser.add_argument("--allow-commands", action="store_true",
                        help="with --root, let a config run commands on launch (pre_cmd, setup_commands, a custom "
                        "deployment command ...); refused by default, as anyone who can edit a config could run programs")
    parser.add_argument("--toolsets", help="comma-separated toolsets to serve (listed below): names, 'default' for "
                        "those on by default, or 'all'; e.g. default,deploy")  # fmt: skip
    parser.add_argument("--read-only", action="store_true", help="serve only the tools that change nothing")
    # Clients validate structured results against them; models do not read them, so they cost no tokens.
    parser.add_argument("--output-schemas", action=argparse.BooleanOptionalAction, default=True,
                        help="list each tool's output schema (default on; --no-output-schemas for a smaller tools/list)")
    parser.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = parser.parse_args(argv)
    import logging

    logging.basicConfig(stream=sys.stderr, level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("mcp").setLevel(args.log_level)  # the SDK logs every tool error at INFO otherwise
    root = _root(args, parser)
    if root is not None:
        os.chdir(root)  # anything a tool still resolves relative to the working directory lands inside the root
    try:
        chosen = toolsets.parse(args.toolsets)  # None: every tool
    except ValueError as exc:
        parser.error(str(exc))

    def build() -> Any:
        from quanteval.faces import mcpapp

        # the operator's --toolsets is a ceiling: a client's enable_toolsets adds only within it
        return mcpapp.build_server(chosen, args.read_only, root, args.output_schemas, args.allow_open_eval_server,
                                   args.allow_commands, ceiling=chosen if args.toolsets else None)

    if args.http:
        serve_http(build(), args.port, args.log_level)
    else:
        serve_stdio(build, [*(sorted(chosen) if chosen is not None else ["all"]), str(args.read_only), str(args.output_schemas)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
