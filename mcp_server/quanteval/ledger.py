"""The SQLite record of dry-runs, canaries, full runs, deployments and eval jobs.

One file (QUANTEVAL_LEDGER, default <state dir>/ledger.sqlite3) shared by every process
of the user — an IDE's MCP server and a CLI in a terminal at the same time — so it uses
WAL mode, a busy timeout and short transactions. Every status change is also kept as an
event, so the history of a run survives restarts.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from quanteval.envvars import ledger_path
from quanteval.models import ToolError

# Every kind of record, by what takes its id: the run tools an engine's "run" and an "evaluation" (start_evaluation's
# job); list_runs also the "server"s (deployment_status, eval_server_status); the eval server its own "eval_job"s.
KINDS = {"dry_run": "run", "canary": "run", "full_run": "run", "evaluation": "evaluation", "deployment": "server",
         "eval_server": "server", "eval_job": "eval_job"}
RecordKind = Literal[tuple(KINDS)]  # type: ignore[valid-type]


def kinds(*families: str) -> tuple[str, ...]:
    return tuple(kind for kind, family in KINDS.items() if family in families)


def family(kind: str) -> str:
    """The family of a record kind; a kind this version does not know (a newer quanteval's ledger) is named."""
    if kind not in KINDS:
        raise ToolError(f"Unknown record kind {kind!r}: this quanteval knows {', '.join(KINDS)}; a newer one may have written it.")
    return KINDS[kind]

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    config_path TEXT,
    config_hash TEXT,
    invocation_id TEXT,
    executor TEXT,
    host TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    details TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS records_kind ON records(kind, created_at);
CREATE INDEX IF NOT EXISTS records_hash ON records(config_hash);
CREATE INDEX IF NOT EXISTS records_invocation ON records(invocation_id);
CREATE TABLE IF NOT EXISTS events (
    record_id TEXT NOT NULL REFERENCES records(id),
    at REAL NOT NULL,
    status TEXT NOT NULL,
    message TEXT
);
CREATE INDEX IF NOT EXISTS events_record ON events(record_id, at);
"""


class Event(BaseModel):
    at: float
    status: str
    message: str | None = None


class Record(BaseModel):
    id: str
    kind: RecordKind
    status: str
    config_path: str | None = None
    config_hash: str | None = None
    invocation_id: str | None = None
    executor: str | None = None
    host: str | None = None
    created_at: float
    updated_at: float
    details: dict[str, Any] = Field(default_factory=dict)


@contextmanager
def connect(path: Path | None = None) -> Iterator[sqlite3.Connection]:
    path = path or ledger_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    except sqlite3.Error as exc:
        raise ToolError(f"Cannot open the ledger {path}: {exc}. Set QUANTEVAL_LEDGER to a writable file.") from None
    try:
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.executescript(SCHEMA)
        yield conn
    except sqlite3.DatabaseError as exc:
        raise ToolError(_unusable(path, exc)) from None
    finally:
        conn.close()


def _unusable(path: Path, exc: sqlite3.DatabaseError) -> str:
    if "readonly" in str(exc):  # SQLite's "attempt to write a readonly database": the file is fine, keep it
        return (f"The ledger {path} is read-only ({exc}): make it and its directory writable, or set QUANTEVAL_LEDGER "
                "to a writable file.")
    return f"The ledger {path} is unreadable ({exc}); move it aside to start a fresh one."


def _record(row: sqlite3.Row) -> Record:
    data = dict(row)
    data["details"] = json.loads(data["details"] or "{}")
    family(data["kind"])
    return Record(**data)


def add(
    kind: RecordKind,
    *,
    status: str,
    config_path: str | None = None,
    config_hash: str | None = None,
    invocation_id: str | None = None,
    executor: str | None = None,
    host: str | None = None,
    details: dict[str, Any] | None = None,
    message: str | None = None,
) -> Record:
    now, _ = time.time(), family(kind)  # an unknown kind is refused before anything is written
    record_id = f"{kind.replace('_', '')}-{uuid.uuid4().hex[:10]}"
    with connect() as conn:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO records (id, kind, status, config_path, config_hash, invocation_id, executor, host,"
            " created_at, updated_at, details) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (record_id, kind, status, config_path, config_hash, invocation_id, executor, host, now, now,
             json.dumps(details or {})),
        )
        conn.execute("INSERT INTO events VALUES (?,?,?,?)", (record_id, now, status, message))
        conn.execute("COMMIT")
    return get(record_id)


def update(
    record_id: str,
    *,
    status: str | None = None,
    invocation_id: str | None = None,
    details: dict[str, Any] | None = None,
    message: str | None = None,
    config_hash: str | None = None,
    executor: str | None = None,
    host: str | None = None,
    only_from: tuple[str, ...] | None = None,
) -> Record:
    """Change a record; `details` is merged into the stored details. A status change is logged as an event. The
    config hash, executor and host are set once a launch knows them (a record is written before its launch starts).

    `only_from`: change it only while its status is still one of these, in the same transaction as the read (a watcher
    that saw a server loading and found it gone must not overwrite the `stopped` its stopper wrote meanwhile); else the
    record is returned unchanged."""
    now = time.time()
    with connect() as conn:
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute("SELECT * FROM records WHERE id = ?", (record_id,)).fetchone()
        if row is None:
            conn.execute("ROLLBACK")
            raise ToolError(f"No ledger record '{record_id}'. list_runs shows the known ids.")
        current = _record(row)
        if only_from is not None and current.status not in only_from:
            conn.execute("ROLLBACK")
            return current
        merged = {**current.details, **(details or {})}
        conn.execute(
            "UPDATE records SET status = ?, invocation_id = ?, config_hash = ?, executor = ?, host = ?, details = ?,"
            " updated_at = ? WHERE id = ?",
            (status or current.status, invocation_id or current.invocation_id, config_hash or current.config_hash,
             executor or current.executor, host or current.host, json.dumps(merged), now, record_id),
        )
        if (status and status != current.status) or message:
            conn.execute("INSERT INTO events VALUES (?,?,?,?)", (record_id, now, status or current.status, message))
        conn.execute("COMMIT")
    return get(record_id)


def get(record_id_or_invocation: str) -> Record:
    """A record by its id, or by the NEL invocation id it ran as."""
    with connect() as conn:
        row = conn.execute(
            "SELECT * FROM records WHERE id = ? OR invocation_id = ? ORDER BY created_at DESC LIMIT 1",
            (record_id_or_invocation, record_id_or_invocation),
        ).fetchone()
    if row is None:
        raise ToolError(f"No ledger record '{record_id_or_invocation}'. list_runs shows the known ids.")
    return _record(row)


def _where(kinds: list[RecordKind] | None, status: str | None, config_hash: str | None) -> tuple[str, list[Any]]:
    clauses, params = [f"kind IN ({','.join('?' * len(kinds))})"] if kinds else [], list(kinds or [])
    for column, value in (("status", status), ("config_hash", config_hash)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    return (f"WHERE {' AND '.join(clauses)}" if clauses else ""), params


def find(*, kind: RecordKind | None = None, kinds: list[RecordKind] | None = None, status: str | None = None,
         config_hash: str | None = None, limit: int = 50, offset: int = 0) -> list[Record]:
    """Records newest first, filtered by whatever is given (`kinds`: any of several kinds)."""
    where, params = _where([kind] if kind else kinds, status, config_hash)
    with connect() as conn:
        rows = conn.execute(f"SELECT * FROM records {where} ORDER BY created_at DESC LIMIT ? OFFSET ?", (*params, limit, offset)).fetchall()
    return [_record(row) for row in rows]


def count(*, kind: RecordKind | None = None, kinds: list[RecordKind] | None = None, status: str | None = None) -> int:
    where, params = _where([kind] if kind else kinds, status, None)
    with connect() as conn:
        return conn.execute(f"SELECT COUNT(*) FROM records {where}", params).fetchone()[0]


def events(record_id: str) -> list[Event]:
    with connect() as conn:
        rows = conn.execute("SELECT at, status, message FROM events WHERE record_id = ? ORDER BY at", (record_id,))
        return [Event(**dict(row)) for row in rows.fetchall()]
