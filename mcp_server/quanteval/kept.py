"""Answers kept on disk for the next process: an answer costly to make (a framework's import, a child process) and
fixed by what it was made from. The caller names that in the key (`key_of`); an answer whose inputs are files it
learns only in the making keeps their stats beside it (`paths.file_stats`) and checks them on reading. Each kind is a
folder of at most KEPT files under envvars.cache_dir(); one that cannot be read or written costs only the work again."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from quanteval import envvars, paths

KEPT = 256  # per kind: the oldest go first


def key_of(*made_from: Any) -> str:
    return hashlib.sha256(json.dumps(made_from, default=str).encode()).hexdigest()[:32]


def installs(venv: Path, *packages: str) -> tuple[tuple[str, int, int], ...]:
    """What tells one install of `packages` in `venv` from the next (their dist-info RECORD files, rewritten by every
    install): part of a key, empty where none is installed there."""
    return paths.file_stats(sorted(record for package in packages
                                   for record in venv.glob(f"lib/python*/site-packages/{package}[-_]*.dist-info/RECORD")))


def read(kind: str, key: str) -> str | None:
    try:
        return (envvars.cache_dir() / kind / f"{key}.json").read_text(encoding="utf-8")
    except OSError:
        return None


def keep(kind: str, key: str, text: str) -> OSError | None:
    """Written whole (a temporary file renamed: a reader in another process sees the old answer or the new). Returns
    why it could not be, for a caller that says so."""
    folder = envvars.cache_dir() / kind
    temporary = folder / f".{key}.{os.getpid()}.tmp"
    try:
        folder.mkdir(exist_ok=True)
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, folder / f"{key}.json")
        answers = sorted(folder.glob("*.json"), key=lambda path: path.stat().st_mtime_ns)
        for old in answers[:-KEPT]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        return exc
    return None
