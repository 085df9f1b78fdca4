"""The process start_evaluation starts: `python -m quanteval.workflow.evaluate_job RECORD_ID`.

Runs evaluate_quantization on the request stored in the record, writes its progress into the record (at most once a
second) and its answer next to its log; the record ends succeeded, failed (with the tool error) or cancelled.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from quanteval import ledger, paths
from quanteval.models import ToolError
from quanteval.workflow import background
from quanteval.workflow.evaluate import EvaluateQuantizationInput, evaluate_quantization

PROGRESS_WRITE_EVERY_S = 1.0


def run(record_id: str) -> int:
    record = ledger.get(record_id)
    request = EvaluateQuantizationInput.model_validate(record.details["request"])
    last_write: list[Any] = [0.0, None]  # when, and which step

    def progress(done: float, total: float | None = None, message: str | None = None) -> None:
        # a new step is written at once (wait_for_run reports steps); the same step's new message at most once a second
        if (done, total) != last_write[1] or time.monotonic() - last_write[0] >= PROGRESS_WRITE_EVERY_S:
            ledger.update(record_id, details={"progress": {"done": done, "total": total, "message": message}})
            last_write[:] = [time.monotonic(), (done, total)]

    if root := record.details.get("root"):  # started over MCP with --root: the evaluation keeps to it, reuse included
        paths.CALL_POLICY.set(paths.Policy(root=Path(root), absolute_only=True))
    try:
        answer = evaluate_quantization(request, progress)
    except ToolError as exc:
        ledger.update(record_id, status="failed", message=str(exc)[:300], details={"error": str(exc)})
        return 1
    except KeyboardInterrupt:  # kill_run's SIGTERM: evaluate_quantization stopped what it started
        ledger.update(record_id, status="cancelled", message="cancelled: kill_run")
        return 130
    except Exception as exc:  # a bug: its type in the record, the traceback in the job's log
        ledger.update(record_id, status="failed", details={"error": f"internal error ({type(exc).__name__}); see the job log"})
        raise
    paths.write_file(Path(record.details["result_path"]), json.dumps(answer.model_dump(mode="json")))
    ledger.update(record_id, status="succeeded", details={"progress": {"done": 1, "total": 1, "message": answer.verdict}})
    return 0


if __name__ == "__main__":
    background.interrupt_on_sigterm()
    sys.exit(run(sys.argv[1]))
