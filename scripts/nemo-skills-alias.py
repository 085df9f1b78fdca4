"""Run by scripts/setup-nel-next with nel-next's venv Python, after NeMo-Skills is installed into it.

nel-next 0.3.0 grades NeMo-Skills' math and multichoice benchmarks with
`from nemo_skills.evaluation.evaluator.math_grader import extract_answer, math_equal`: no NeMo-Skills commit has had
that module (the grader is nemo_skills.evaluation.math_grader), so math fails with ModuleNotFoundError and multichoice
silently compares the response's first character. This writes a module at that path re-exporting the real grader,
only while it is needed: not when nel-next no longer imports that path, nor when NeMo-Skills has the module itself
(then it says the alias can go). Then it checks that this NeMo-Skills fits nel-next's skills.py.
Its extract_answer gives "" where NeMo-Skills' gives None (a response with no answer in it): nel-next's multichoice
grading calls .strip() on it, retries the problem as a system error and, after three draws without an answer (a weak
model sampled at temperature 1), aborts the whole benchmark; NeMo-Skills' own evaluation scores such an answer wrong,
and so does nel-next's with "" (math_equal too: "" equals no non-empty answer).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

MARK = "# quanteval alias (scripts/setup-nel-next)"
WANTED = "nemo_skills.evaluation.evaluator.math_grader"
ALIAS = f"""{MARK}: nel-next 0.3.0 imports the grader from here; NeMo-Skills keeps it in
# nemo_skills.evaluation.math_grader. extract_answer: "" for no answer, where nel-next's multichoice grading would
# call .strip() on None and abort the benchmark.
from nemo_skills.evaluation.math_grader import *  # noqa: F401,F403
from nemo_skills.evaluation.math_grader import extract_answer as _extract_answer
from nemo_skills.evaluation.math_grader import math_equal  # noqa: F401


def extract_answer(*args, **kwargs):
    found = _extract_answer(*args, **kwargs)
    return "" if found is None else found
"""


def main() -> int:
    import nemo_evaluator.environments.skills as nel_skills
    import nemo_skills.evaluation.evaluator as evaluator
    from nemo_skills.dataset import utils

    alias = Path(evaluator.__file__).parent / "math_grader.py"
    ours = alias.is_file() and alias.read_text().startswith(MARK)
    why = ("nel-next no longer imports it" if WANTED not in inspect.getsource(nel_skills)
           else "this NeMo-Skills has that module itself" if alias.is_file() and not ours else None)
    if why:
        if ours:
            alias.unlink()
        print(f"setup-nel-next: no {WANTED} alias: {why}; drop the alias from scripts/setup-nel-next")
    elif not ours or alias.read_text() != ALIAS:
        alias.write_text(ALIAS)
        print(f"setup-nel-next: wrote the {WANTED} alias")
    found = utils.get_dataset_module("gsm8k")
    if isinstance(found, tuple) and len(found) != 2:
        print(f"setup-nel-next: this NeMo-Skills' get_dataset_module returns {len(found)} values; nel-next unpacks 2",
              file=sys.stderr)
        return 1
    if WANTED in inspect.getsource(nel_skills) and importlib.util.find_spec(WANTED) is None:
        print(f"setup-nel-next: {WANTED} is still missing", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
