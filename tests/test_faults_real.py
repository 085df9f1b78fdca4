"""Faults against the real servers (run under the heavy lock, one at a time machine-wide):

- Ctrl-C / SIGTERM to a real `quanteval evaluate` while the real vLLM (CPU build) is still starting: no vLLM process
  is left, and the deployment's record says cancelled (not loading).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from processes import running_with

from quanteval import ledger
from quanteval.engines.nel_next import nelnext
from quanteval.localproc import group_members

REPO = Path(__file__).resolve().parents[1]
CHECKPOINTS = REPO / "examples" / "checkpoints"
BF16, W8A8 = CHECKPOINTS / "tiny-add-bf16", CHECKPOINTS / "tiny-add-w8a8"
BENCH = REPO / "examples" / "benchmarks" / "tiny_add.py"
VENV_BIN = REPO / ".venv" / "bin"


@pytest.mark.skipif(not (REPO / ".venv-vllm" / "bin" / "python").is_file() or not nelnext.nel_binary().is_file(),
                    reason="needs the vLLM and nel-next venvs: bash scripts/setup builds both")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_while_vllm_starts_leaves_no_server_and_a_cancelled_record(tmp_path, signum):
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", NEMO_EVALUATOR_TELEMETRY_LEVEL="0")
    env.pop("QUANTEVAL_VLLM_LAUNCHER", None)
    argv = [str(VENV_BIN / "quanteval"), "evaluate", str(BF16), str(W8A8), "--benchmarks", str(BENCH),
            "--output-dir", str(tmp_path / "out")]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        while not running_with("vllm", str(BF16)) and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
        assert running_with("vllm", str(BF16)), "vLLM never started"
        time.sleep(8)  # well inside its ~50 s start: the engine is loading, /health does not answer yet
        (deployment,) = ledger.find(kind="deployment")
        assert deployment.status == "loading"
        child.send_signal(signum)
        _, stderr = child.communicate(timeout=90)
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        for record in ledger.find(kind="deployment"):  # what a failing run left behind, stopped for the next test
            if record.details.get("pgid") and group_members(record.details["pgid"]):
                os.killpg(record.details["pgid"], signal.SIGKILL)
    assert child.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    assert running_with("vllm", str(BF16)) == []
    (deployment,) = ledger.find(kind="deployment")
    assert deployment.status == "cancelled", [e.status for e in ledger.events(deployment.id)]
    assert group_members(deployment.details["pgid"]) == []
    assert ledger.find(kind="canary") == []  # nothing was launched against a server that never came up
