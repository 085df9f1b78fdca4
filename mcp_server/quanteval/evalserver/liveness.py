"""Whether the eval server a ledger record names still runs: the one check, for eval_server_status
(faces/evalserver.py) and list_runs (workflow/runs.py). The server is a process group of its own on this machine
(start_eval_server starts it with a new session); it runs while the group has live members."""

from __future__ import annotations

from quanteval import ledger
from quanteval.localproc import group_members, reap

KIND = "eval_server"  # the ledger record's kind


def running(pid: int) -> bool:
    """Whether the server's process group still has live members (an ended leader of ours reaped first)."""
    reap()
    return bool(group_members(pid))


def settle(record: ledger.Record, message: str | None = None) -> ledger.Record:
    """An eval server's record (not stopped) with the status its process shows, stored when it changed: running while
    its process group has live members, else exited (its owner died and took it, a crash, kill -9)."""
    status = "running" if running(record.details.get("pid", 0)) else "exited"
    if status == record.status:
        return record
    return ledger.update(record.id, status=status, message=message, only_from=(record.status,))  # not over a stop meanwhile
