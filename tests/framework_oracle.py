"""The serving frameworks' own loaders as oracles: run SGLang's quantization resolution on checkpoints.

SGLang is imported in a subprocess (tests/oracles/sglang_resolve.py): its import takes ~10 s, sets
logging and torch state, and must not leak into the test process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ORACLES = Path(__file__).parent / "oracles"
_PROBE = (
    f"import sys; sys.argv = ['x', '[]']; sys.path.insert(0, {str(ORACLES)!r}); import sglang_resolve; sglang_resolve.main()"
)


def sglang_available() -> str | None:
    """None when SGLang's ModelConfig imports here, else why not (scripts/install-sglang-parser installs it)."""
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300, check=False)
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or ["unknown error"])[-1]


def sglang_resolve(pairs: list[tuple[str, list[str]]]) -> list[dict]:
    """For each (checkpoint, server args): what SGLang's ModelConfig and get_quant_config make of it."""
    return _run("sglang_resolve.py", pairs)


def vllm_resolve(pairs: list[tuple[str, list[str]]], python: str = sys.executable) -> list[dict]:
    """For each (checkpoint, server args): what vLLM's config reading, overrides and from_config make of it."""
    return _run("vllm_resolve.py", pairs, python)


def _run(script: str, pairs: list[tuple[str, list[str]]], python: str = sys.executable) -> list[dict]:
    done = subprocess.run(
        [python, str(ORACLES / script), json.dumps([[str(p), a] for p, a in pairs])],
        capture_output=True, text=True, timeout=900, check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{script} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
