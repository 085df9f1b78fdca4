"""Adding an engine is its package's files and one line in engines.ENGINES: a throwaway engine written here (a toy
whose config is nel-next's under a `toy:` section) is picked for its config's shape, found by its name, and found
by evaluate_quantization's capability lookup when it declares the evaluation capability, never when it does not."""

from __future__ import annotations

import sys
import textwrap

import pytest
from test_engines import role_problems

from quanteval import engines
from quanteval.models import ToolError
from quanteval.workflow import evaluate, tasks

TOY_FILES = {
    "__init__.py": "",
    # its config role: nel-next's members, but its own shape
    "configrole.py": """
        from quanteval.engines.nel_next.configrole import *  # noqa: F403

        def owns(doc):
            return isinstance(doc, dict) and "toy" in doc
        """,
    # its evaluation capability: nel-next's, but it says when evaluate_quantization asks it
    "evaluation.py": """
        from quanteval.engines.nel_next.evaluation import *  # noqa: F403
        from quanteval.models import ToolError

        def evaluation_problems(benchmarks):
            raise ToolError(f"the toy engine was asked about {benchmarks}")

        def task_form(qualified_name, repeats=1):
            return {"toy": qualified_name}, "the toy's form"
        """,
    "engine.py": """
        from quanteval.engines.base import Engine
        from quanteval.engines.nel_next import placement, runs
        from toy_engine import configrole, evaluation

        ENGINE = Engine(name="toy", config=configrole, run=runs, placement=placement)
        EVALUATING = Engine(name="toy", config=configrole, run=runs, placement=placement, evaluation=evaluation)
        """,
    "results.py": """
        from quanteval.engines.nel_next.results import NelNextResults

        class ToyResults(NelNextResults):
            name = "toy"
        """,
}
NEL_NEXT, NEL = engines.ENGINES


@pytest.fixture
def register(tmp_path, monkeypatch):
    """Write the toy package and register the given ENGINES lines for the test (the registry is read afresh)."""
    for name, text in TOY_FILES.items():
        (tmp_path / "toy_engine").mkdir(exist_ok=True)
        (tmp_path / "toy_engine" / name).write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))

    def lines(*table: tuple[str, str, str]) -> None:
        monkeypatch.setattr(engines, "ENGINES", table)
        engines.registered.cache_clear()
        engines.readers.cache_clear()

    yield lines
    engines.registered.cache_clear()
    engines.readers.cache_clear()
    for module in [name for name in sys.modules if name.split(".")[0] == "toy_engine"]:
        del sys.modules[module]


def _toy(declaration: str = "ENGINE") -> tuple[str, str, str]:
    return ("toy", f"toy_engine.engine:{declaration}", "toy_engine.results:ToyResults")


def _evaluate_request(tmp_path) -> evaluate.EvaluateQuantizationInput:
    return evaluate.EvaluateQuantizationInput(baseline_checkpoint=str(tmp_path / "bf16"), candidate_checkpoint=str(tmp_path / "fp8"),
                                              benchmarks=["skills://gsm8k"], max_drop=2.0)


def test_one_registry_line_makes_a_new_engine_picked_by_its_config_and_found_by_name(register):
    register(_toy(), NEL_NEXT, NEL)
    toy = engines.by_name("toy")
    assert role_problems(toy) == []  # it fills every role it has
    assert engines.for_config({"toy": {}, "benchmarks": []}) is toy  # asked first, it owns its shape
    assert engines.for_config({"benchmarks": [{"name": "skills://gsm8k"}]}).name == "nel-next"  # not the others'
    assert engines.for_config({"execution": {}}).name == "nel"
    assert engines.known_config({"toy": {}}) and not engines.known_config({"services": {"db": {"image": "x"}}})
    assert [reader.name for reader in engines.readers()] == ["toy", "nel-next", "nel"]
    with pytest.raises(ToolError, match="unknown engine 'toyy': the known ones are toy, nel-next, nel"):
        engines.by_name("toyy")


def test_an_engine_named_apart_from_its_line_is_refused(register):
    register(("toys", "toy_engine.engine:ENGINE", "toy_engine.results:ToyResults"), NEL)
    with pytest.raises(ToolError, match=r"engines not named as their ENGINES line: toy \(its line: toys\)"):
        engines.for_config({"toy": {}})


def test_an_engine_without_the_evaluation_capability_is_never_picked_to_evaluate(register):
    register(_toy(), NEL_NEXT, NEL)  # asked first, but it cannot evaluate
    assert engines.evaluating().name == "nel-next"


def test_the_evaluate_path_finds_the_engine_that_declares_the_capability(register, tmp_path):
    register(NEL, _toy("EVALUATING"), NEL_NEXT)  # the first that has it, wherever its line is
    assert engines.evaluating().name == "toy"
    with pytest.raises(ToolError, match=r"the toy engine was asked about \['skills://gsm8k'\]"):
        evaluate.evaluate_quantization(_evaluate_request(tmp_path))
    assert tasks.nel_next_form("nemo_skills.ns_gpqa").benchmark == {"toy": "nemo_skills.ns_gpqa"}


def test_with_no_engine_that_evaluates_the_evaluate_path_says_so(register, tmp_path):
    register(_toy(), NEL)
    with pytest.raises(ToolError, match=r"no engine here evaluates a served model in one call \(none of toy, nel has the "
                                        r"evaluation capability\): use the step-by-step tools"):
        evaluate.evaluate_quantization(_evaluate_request(tmp_path))
