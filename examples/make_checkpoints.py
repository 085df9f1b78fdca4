"""Rebuild the bundled example checkpoints in examples/checkpoints/ (tiny, real files).

    .venv/bin/python examples/make_checkpoints.py

The same factory builds the test fixtures, so examples and tests stay in one format.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # tests/factories.py is the one checkpoint writer

from factories import make_checkpoint  # noqa: E402

EXAMPLES = {
    "llama-tiny-bf16": dict(chat_template="plain"),
    "llama-tiny-fp8": dict(quant="FP8", legacy_modelopt=True, chat_template="plain"),
    "qwen3-tiny-nvfp4": dict(
        quant="NVFP4", legacy_modelopt=False, chat_template="reasoning", model_type="qwen3", max_position_embeddings=40960
    ),
}


def main() -> None:
    for name, options in EXAMPLES.items():
        target = HERE / "checkpoints" / name
        shutil.rmtree(target, ignore_errors=True)
        make_checkpoint(target, **options)
        print(f"wrote {target.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
