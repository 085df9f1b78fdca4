"""The SQLite ledger: survives restarts, several processes write at once without losing anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quanteval import ledger
from quanteval.models import ToolError

WRITER = """
import sys
from quanteval import ledger
worker, count = int(sys.argv[1]), int(sys.argv[2])
for index in range(count):
    record = ledger.add("canary", status="submitted", config_hash=f"w{worker}", details={"index": index})
    ledger.update(record.id, status="running", details={"worker": worker})
    ledger.update(record.id, status="succeeded", message=f"done {worker}.{index}")
"""


def test_records_survive_a_process_restart() -> None:
    code = ("from quanteval import ledger; r = ledger.add('full_run', status='submitted', config_path='/c.yaml', "
            "config_hash='abc', invocation_id='inv123', executor='slurm', host='login', details={'reason': 'why'}); "
            "ledger.update(r.id, status='running'); print(r.id)")
    record_id = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                               env=dict(os.environ)).stdout.strip()
    record = ledger.get(record_id)
    assert (record.kind, record.status, record.host, record.details) == ("full_run", "running", "login", {"reason": "why"})
    assert ledger.get("inv123").id == record_id
    assert [event.status for event in ledger.events(record_id)] == ["submitted", "running"]


def test_concurrent_writers_in_several_processes_lose_nothing() -> None:
    workers, per_worker = 6, 25
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(worker), str(per_worker)], env=dict(os.environ),
                              stderr=subprocess.PIPE, text=True) for worker in range(workers)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read()

    assert ledger.count(kind="canary") == workers * per_worker
    assert ledger.count(kind="canary", status="succeeded") == workers * per_worker
    for worker in range(workers):
        records = ledger.find(config_hash=f"w{worker}", limit=1000)
        assert sorted(record.details["index"] for record in records) == list(range(per_worker))
        assert all(record.details["worker"] == worker for record in records)
        assert all([event.status for event in ledger.events(record.id)] == ["submitted", "running", "succeeded"]
                   for record in records)


def test_find_and_count_filter_by_several_kinds_and_status() -> None:
    ledger.add("dry_run", status="passed")
    ledger.add("canary", status="failed")
    ledger.add("canary", status="succeeded")
    ledger.add("deployment", status="running")
    assert ledger.count(kinds=["dry_run", "canary"]) == 3
    assert ledger.count(kinds=["dry_run", "canary"], status="failed") == 1
    assert [record.kind for record in ledger.find(kinds=["canary", "deployment"], limit=2)] == ["deployment", "canary"]
    assert ledger.count(kind="canary") == 2  # the older single-kind form still works


def test_update_merges_details_and_records_messages() -> None:
    record = ledger.add("canary", status="submitted", details={"limit_samples": 10})
    ledger.update(record.id, details={"jobs": {"x.0": "running"}}, message="status poll failed: ssh down")
    updated = ledger.get(record.id)
    assert updated.details == {"limit_samples": 10, "jobs": {"x.0": "running"}}
    assert updated.status == "submitted"
    assert ledger.events(record.id)[-1].message == "status poll failed: ssh down"


def test_unknown_record_and_unreadable_ledger_are_clear_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ToolError, match="list_runs"):
        ledger.get("canary-missing")
    with pytest.raises(ToolError, match="list_runs"):
        ledger.update("canary-missing", status="killed")
    broken = tmp_path / "broken.sqlite3"
    broken.write_bytes(b"this is not a database" * 100)
    monkeypatch.setenv("QUANTEVAL_LEDGER", str(broken))
    with pytest.raises(ToolError, match="move it aside"):
        ledger.find()
    assert broken.read_bytes() == b"this is not a database" * 100  # nothing overwritten


def test_details_round_trip_as_json() -> None:
    details = {"gate": "forced: reason", "nested": {"a": [1, 2]}, "unicode": "ü"}
    record = ledger.add("full_run", status="submitted", details=details)
    assert ledger.get(record.id).details == json.loads(json.dumps(details))


def test_an_update_only_from_a_status_is_dropped_once_another_writer_moved_the_record() -> None:
    """A watcher writes what it saw only while the record still says what it read; the stopper's status stands."""
    record = ledger.add("deployment", status="loading")
    ledger.update(record.id, status="stopped", message="SIGTERM")
    unchanged = ledger.update(record.id, status="exited", message="gone", details={"seen": True}, only_from=("loading",))
    assert (unchanged.status, unchanged.details) == ("stopped", {})
    assert [event.status for event in ledger.events(record.id)] == ["loading", "stopped"]
    assert ledger.update(record.id, status="cancelled", only_from=("stopped",)).status == "cancelled"
