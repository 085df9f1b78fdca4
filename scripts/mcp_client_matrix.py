"""The MCP face through clients nobody here wrote: which client x transport passes which check.

    .venv/bin/python scripts/mcp_client_matrix.py [--fastmcp-python PY] [--inspector BIN]

Always: the mcp SDK's own Client (in-process, stdio, streamable HTTP). With --fastmcp-python, a
Python that has `fastmcp` installed (its Client over stdio and HTTP); with --inspector, the MCP
Inspector's `mcp-inspector` (its --cli mode over stdio and HTTP). Neither is a dependency of
quanteval: install them anywhere, e.g. `python -m venv /tmp/f && /tmp/f/bin/pip install fastmcp`
and `npm install @modelcontextprotocol/inspector` in a scratch directory.
Prints a table and the client versions; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from quanteval.localproc import free_port

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
NEL_CONFIG = "execution:\n  output_dir: ???\nevaluation:\n  tasks:\n    - name: ns_gpqa\n"
EXAMPLE_URI = "quanteval://recipes/examples/example_eval.yaml"

# One driver for every Python client: reads operations as JSON on stdin, prints results as JSON.
FASTMCP_DRIVER = r"""
import asyncio, json, sys
from fastmcp import Client
from fastmcp.client.transports import StdioTransport

async def main(target, ops):
    out = []
    async with Client(target) as client:
        for op in ops:
            try:
                if op["op"] == "list_tools":
                    tools = await client.list_tools()
                    out.append({"tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]})
                elif op["op"] == "call":
                    r = await client.call_tool(op["name"], op["arguments"], raise_on_error=False)
                    out.append({"is_error": r.is_error, "text": r.content[0].text if r.content else ""})
                elif op["op"] == "prompt":
                    await client.get_prompt(op["name"], op["arguments"])
                    out.append({"ok": True})
                elif op["op"] == "read":
                    c = (await client.read_resource(op["uri"]))[0]
                    out.append({"mime": getattr(c, "mime_type", None) or getattr(c, "mimeType", None), "text": getattr(c, "text", None)})
            except Exception as exc:
                out.append({"error": str(exc), "code": getattr(getattr(exc, "error", None), "code", None)})
    return out

spec = json.loads(sys.stdin.read())
if spec["url"]:
    target = spec["url"]
else:
    target = StdioTransport(command=spec["command"], args=[], env=spec["env"])
print(json.dumps(asyncio.run(main(target, spec["ops"]))))
"""


def operations(workdir: Path) -> list[dict[str, Any]]:
    config = workdir / "eval.yaml"
    config.write_text(NEL_CONFIG)
    return [
        {"op": "list_tools"},
        {"op": "call", "name": "build_config", "arguments": {"execution": "local", "deployment": "vllm", "model_type": "base",
                                                            "benchmarks": ["coding"], "output_path": str(workdir / "x.yaml")}},
        {"op": "call", "name": "set_config_value", "arguments": _config_args(config, "execution.extra", yaml_value="[a, {b: 1}]")},
        {"op": "call", "name": "get_config_value", "arguments": _config_args(Path("eval.yaml"), "execution")},
        {"op": "call", "name": "build_config", "arguments": {"execution": "local", "deployment": "vllm", "model_type": "base",
                                                            "benchmarks": ["agentic"], "config_path": str(workdir / "y.yaml")}},
        {"op": "prompt", "name": "evaluate_quantized_model", "arguments": {"chekpoint": "/m"}},
        {"op": "read", "uri": EXAMPLE_URI},
    ]


def _config_args(config: Path, key: str, **more: Any) -> dict[str, Any]:
    return {"config_path": str(config), "key": key, **more}


CHECKS = [
    ("tools/list: every default tool, additionalProperties false, polling read-only",
     lambda r: _default_tools() <= {t["name"] for t in r["tools"]} and all(t["inputSchema"].get("additionalProperties") is False for t in r["tools"])
     and all(t.get("annotations", {}).get("readOnlyHint") for t in r["tools"] if t["name"] in ("run_status", "deployment_status"))),
    ("unknown argument key is an error naming it", lambda r: r.get("is_error") and "unknown argument 'output_path'" in r["text"]),
    ("set_config_value with yaml_value works", lambda r: r.get("is_error") is False),
    ("relative path refused with the reason", lambda r: r.get("is_error") and "relative" in r["text"]),
    ("argument error keeps the CLI's message", lambda r: r.get("is_error") and "not bundles for model_type" in r["text"]),
    # The Inspector CLI prints the error's message but not its code.
    ("prompts/get unknown argument: a JSON-RPC error (-32602)",
     lambda r: r.get("code") == -32602 or ("code" not in r and "unknown argument(s) chekpoint" in str(r.get("error", "")))),
    ("example_eval.yaml resource is text", lambda r: str(r.get("mime", "")).startswith("text/") and "evaluation" in (r.get("text") or "")),
]


def _default_tools() -> set[str]:
    from quanteval import registry, toolsets

    return set(registry.select(list(toolsets.DEFAULT_TOOLSETS)))


# ---------------------------------------------------------------- clients


def sdk_client(target: Any, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import anyio
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    async def go() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        async with Client(target) as client:
            for op in ops:
                try:
                    if op["op"] == "list_tools":
                        tools = (await client.list_tools()).tools
                        out.append({"tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]})
                    elif op["op"] == "call":
                        result = await client.call_tool(op["name"], op["arguments"])
                        out.append({"is_error": bool(result.is_error), "text": result.content[0].text})
                    elif op["op"] == "prompt":
                        await client.get_prompt(op["name"], op["arguments"])
                        out.append({"ok": True})
                    elif op["op"] == "read":
                        content = (await client.read_resource(op["uri"])).contents[0]
                        out.append({"mime": content.mime_type, "text": getattr(content, "text", None)})
                except MCPError as exc:
                    out.append({"error": exc.message, "code": exc.code})
        return out

    return anyio.run(go)


def fastmcp_client(python: str, url: str | None, env: dict[str, str], ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    spec = {"url": url, "command": str(BIN / "quanteval-mcp"), "env": env, "ops": ops}
    done = subprocess.run([python, "-c", FASTMCP_DRIVER], input=json.dumps(spec), capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def inspector_client(inspector: str, target: list[str], env: dict[str, str], cwd: Path, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    forwarded = [arg for name in ("PYTHONPATH", "QUANTEVAL_STATE_DIR", "NEMO_EVALUATOR_TELEMETRY_LEVEL") if name in env
                 for arg in ("-e", f"{name}={env[name]}")]  # the Inspector passes the server no other environment
    for op in ops:
        argv = [inspector, "--cli", *forwarded, "--cwd", str(cwd), *target]
        if op["op"] == "list_tools":
            argv += ["--method", "tools/list"]
        elif op["op"] == "call":
            argv += ["--method", "tools/call", "--tool-name", op["name"], "--tool-arg",
                     *(f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in op["arguments"].items())]
        elif op["op"] == "prompt":
            argv += ["--method", "prompts/get", "--prompt-name", op["name"], "--prompt-args", *(f"{k}={v}" for k, v in op["arguments"].items())]
        elif op["op"] == "read":
            argv += ["--method", "resources/read", "--uri", op["uri"]]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
        try:
            data = json.loads(done.stdout)
        except ValueError:
            out.append({"error": (done.stderr or done.stdout)[-500:]})
            continue
        if op["op"] == "list_tools":
            out.append({"tools": data.get("tools", [])})
        elif op["op"] == "call":
            out.append({"is_error": bool(data.get("isError")), "text": (data.get("content") or [{}])[0].get("text", "")})
        elif op["op"] == "read":
            content = (data.get("contents") or [{}])[0]
            out.append({"mime": content.get("mimeType"), "text": content.get("text")})
        else:
            out.append({"ok": True, "error": json.dumps(data)})
    return out


# ---------------------------------------------------------------- running


def _start_http(env: dict[str, str], root: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([str(BIN / "quanteval-mcp"), "--http", "--port", str(port), "--root", str(root)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
        except urllib.error.HTTPError:
            return proc, url
        except OSError:
            time.sleep(0.3)
    proc.terminate()
    raise RuntimeError("HTTP server did not come up")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fastmcp-python", help="a Python with fastmcp installed")
    parser.add_argument("--inspector", help="the mcp-inspector executable (MCP Inspector 2.x)")
    args = parser.parse_args()
    from mcp import StdioServerParameters

    from quanteval.faces.server import build_server

    workdir = Path(tempfile.mkdtemp(prefix="quanteval-matrix-")).resolve()
    env = dict(os.environ, NEMO_EVALUATOR_TELEMETRY_LEVEL="0", QUANTEVAL_STATE_DIR=str(workdir / "state"))
    os.environ.update(QUANTEVAL_STATE_DIR=env["QUANTEVAL_STATE_DIR"], NEMO_EVALUATOR_TELEMETRY_LEVEL="0")
    http, url = _start_http(env, workdir)
    versions = {"mcp SDK": _version("mcp")}
    rows: dict[str, list[dict[str, Any]]] = {}
    try:
        rows["mcp SDK Client, in-process"] = sdk_client(build_server(), operations(workdir))
        rows["mcp SDK Client, stdio"] = sdk_client(StdioServerParameters(command=str(BIN / "quanteval-mcp"), env=env, cwd=str(workdir)),
                                                   operations(workdir))
        rows["mcp SDK Client, streamable HTTP"] = sdk_client(url, operations(workdir))
        if args.fastmcp_python:
            versions["fastmcp"] = subprocess.run([args.fastmcp_python, "-c", "import fastmcp; print(fastmcp.__version__)"],
                                                 capture_output=True, text=True).stdout.strip()
            rows["fastmcp Client, stdio"] = fastmcp_client(args.fastmcp_python, None, env, operations(workdir))
            rows["fastmcp Client, streamable HTTP"] = fastmcp_client(args.fastmcp_python, url, env, operations(workdir))
        if args.inspector:
            inspector = shutil.which(args.inspector) or args.inspector
            versions["MCP Inspector"] = subprocess.run([inspector, "--version"], capture_output=True, text=True).stdout.strip()
            rows["MCP Inspector CLI, stdio"] = inspector_client(inspector, [str(BIN / "quanteval-mcp")], env, workdir, operations(workdir))
            rows["MCP Inspector CLI, streamable HTTP"] = inspector_client(inspector, [url], env, workdir, operations(workdir))
    finally:
        http.terminate()
        http.wait(timeout=30)
    failed = 0
    print("versions: " + ", ".join(f"{name} {version}" for name, version in versions.items()))
    for client, results in rows.items():
        print(f"\n{client}")
        for (label, check), result in zip(CHECKS, results, strict=True):
            try:
                ok = bool(check(result))
            except Exception:
                ok = False
            failed += not ok
            print(f"  {'PASS' if ok else 'FAIL'}  {label}" + ("" if ok else f"   got: {json.dumps(result)[:300]}"))
    return 1 if failed else 0


def _version(distribution: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(distribution)


if __name__ == "__main__":
    sys.exit(main())
