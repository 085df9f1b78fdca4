"""Skill pack speed: offline install and the cost of serving the pack over MCP.

Run by hand: .venv/bin/python benchmarks/bench_skillpack.py

`nel skills add` (the alternative) downloads NEL's skills file by file from the GitHub API, so it
needs the network and is not timed here; `quanteval skills install` copies from the installed
package. Printed: install time for all skills into a fresh folder (median of N), the time to build
the MCP server with and without the pack's resources, and a list + read of resources over an
in-process MCP client.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import anyio

from quanteval.faces import skillpack
from quanteval.faces.server import build_server

RUNS = 10


def median_ms(action) -> float:
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        action()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def install_once() -> None:
    folder = Path(tempfile.mkdtemp())
    try:
        skillpack.install_skills(folder / "skills")
    finally:
        shutil.rmtree(folder)


def build_without_pack() -> None:
    original = skillpack.register_mcp
    skillpack.register_mcp = lambda server: None
    try:
        build_server()
    finally:
        skillpack.register_mcp = original


def list_and_read() -> None:
    from mcp import Client

    async def scenario():
        async with Client(build_server()) as client:
            resources = (await client.list_resources()).resources
            for resource in resources:
                await client.read_resource(str(resource.uri))

    anyio.run(scenario)


def main() -> None:
    files = len(skillpack.pack_files())
    install = median_ms(install_once)
    with_pack = median_ms(build_server)
    without_pack = median_ms(build_without_pack)
    read_all = median_ms(list_and_read)
    print(f"pack: {files} files, {len(skillpack.skill_names())} skills")
    print(f"skills install (all skills, links rewritten): {install:8.1f} ms median of {RUNS}")
    print(f"build_server with pack resources:             {with_pack:8.1f} ms")
    print(f"build_server without them:                    {without_pack:8.1f} ms  (difference {with_pack - without_pack:+.1f} ms)")
    print(f"MCP list + read every resource (in-process):  {read_all:8.1f} ms")


if __name__ == "__main__":
    main()
