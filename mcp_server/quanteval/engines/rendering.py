"""What both engines show of a rendered run: its scripts' heads and launch commands, secrets masked (quanteval.redact)."""

from __future__ import annotations

import base64
import builtins
import contextlib
import io
import os
import re
from collections.abc import Iterator
from pathlib import Path

from quanteval.engines.base import SCRIPT_HEAD_LINES, RenderedScript
from quanteval.redact import Secrets, scrub

# The commands that start servers and evaluation clients in NEL's scripts (SLURM and local executors).
LAUNCH_COMMAND = re.compile(r"^(srun|docker run|vllm serve|python3? -m sglang\.launch_server|trtllm-serve|nel eval run)\s")
BASE64_PAYLOAD = re.compile(r"[A-Za-z0-9+/]{100,}={0,2}")
SHOWN_PAYLOAD_CHARS = 1000
MAX_LAUNCH_COMMANDS, MAX_LAUNCH_CHARS = 6, 4000


SECRETS_FILE = ".secrets.env"  # NEL 0.2.6 writes one per task, with real values


def secrets_files(root: Path) -> list[Path]:
    """The .secrets.env files NEL left under root; each is private since its creation (secrets_private_from_creation)."""
    return sorted(root.rglob(SECRETS_FILE)) if root.is_dir() else []


def _private_opener(path: str, flags: int) -> int:
    descriptor = os.open(path, flags, 0o600)
    os.fchmod(descriptor, 0o600)  # a file that already existed keeps its mode on open: private before a byte is written
    return descriptor


@contextlib.contextmanager
def secrets_private_from_creation() -> Iterator[None]:
    """While NEL renders a run, every .secrets.env it opens for writing is created mode 0600 (os.open with the mode),
    so it is never readable by others, not even when the launch fails right after writing it. NEL writes these files
    with open() and Path.write_text from several executors; open itself is the one place that sees them all."""
    real_open = builtins.open

    def open_private(file, mode="r", buffering=-1, encoding=None, errors=None, newline=None, closefd=True, opener=None):  # open's own
        if (opener is None and isinstance(file, (str, bytes, os.PathLike)) and set(mode) & set("wax+")
                and os.path.basename(os.fsdecode(file)) == SECRETS_FILE):
            opener = _private_opener
        return real_open(file, mode, buffering, encoding, errors, newline, closefd, opener)

    builtins.open = io.open = open_private  # pathlib opens through io.open
    try:
        yield
    finally:
        builtins.open = io.open = real_open


def _shown_payload(match: re.Match) -> str:
    """A short base64 payload (the server command NEL encodes on SLURM) decoded; a long one (the eval config) by size."""
    try:
        decoded = base64.b64decode(match.group(), validate=True).decode()
    except ValueError:
        return match.group()
    if len(decoded) <= SHOWN_PAYLOAD_CHARS:
        return f"<base64 of: {decoded.strip()}>"
    return f"<base64, {len(match.group())} chars>"


def _logical_lines(script: str) -> list[str]:
    """The script's lines with shell continuation lines joined."""
    logical: list[str] = []
    pending = ""
    for line in script.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].strip() + " "
            continue
        logical.append(pending + line.strip())
        pending = ""
    return logical


def launch_commands(script: str, secrets: Secrets) -> list[str]:
    """The script's launch commands, each whole: shell continuation lines joined, a quoted `bash -c` body kept with its
    command, long base64 payloads (the encoded eval config) replaced by their size, secrets masked. Helper lines
    (hostname lookups with srun) are left out."""
    found = []
    lines = iter(_logical_lines(script))
    for command in lines:
        if not LAUNCH_COMMAND.match(command) or "hostname --ip-address" in command:
            continue
        while command.count("'") % 2:  # a quoted `bash -c '...'` body goes on over the next lines
            following = next(lines, None)
            if following is None:
                break
            command += "\n" + following
        command = scrub(BASE64_PAYLOAD.sub(_shown_payload, command), secrets)
        found.append(command if len(command) <= MAX_LAUNCH_CHARS else command[:MAX_LAUNCH_CHARS] + " …")
    return found[:MAX_LAUNCH_COMMANDS]


def rendered_script(name: str, path: Path | None, body: str, secrets: Secrets) -> RenderedScript:
    return RenderedScript(name=name, path=str(path) if path else None, size_bytes=len(body.encode()),
                          head=scrub("\n".join(body.splitlines()[:SCRIPT_HEAD_LINES]), secrets).splitlines(),
                          launch_commands=launch_commands(body, secrets))
