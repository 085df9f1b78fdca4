"""Sampled evaluations (repeats, temperature, top_p) in evaluate_quantization: refused before serving when they make no
sense, said when they add nothing, the same on both sides, and power said before the run (from the benchmark's size and
the repeats) and after it (the advice in both dimensions: repeats and problems), on real-shaped nel-next run folders."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
from next_runs import make_run
from pydantic import ValidationError
from tiers import requires

from quanteval.workflow import paired, sampling
from quanteval.workflow.compare import CompareResultsInput, compare_results
from quanteval.workflow.evaluate import EvaluateQuantizationInput, evaluation_key

REPO = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO / "examples/checkpoints/tiny-add-bf16"
ARGS = {"baseline_checkpoint": "a", "candidate_checkpoint": "b", "benchmarks": ["x.py"]}


@pytest.mark.parametrize(("field", "value", "said"), [
    ("repeats", 0, "repeats 0: give 1 to 1000 samples per problem"),
    ("temperature", -0.1, "temperature -0.1: give 0 (greedy) to 2"),
    ("top_p", 0, "top_p 0: give a probability in (0, 1]"),
    ("top_p", 1.5, "top_p 1.5: give a probability in (0, 1]"),
])
def test_sampling_that_makes_no_sense_is_refused_naming_the_fix(field, value, said):
    with pytest.raises(ValidationError, match=said.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        EvaluateQuantizationInput(**ARGS, **{field: value})


def test_over_mcp_and_the_cli_bad_sampling_is_refused_before_anything_is_served(tmp_path, capsys):
    import anyio
    from mcp import Client

    from quanteval.faces import cli
    from quanteval.faces.server import build_server

    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool("evaluate_quantization", {
                "baseline_checkpoint": str(tmp_path / "a"), "candidate_checkpoint": str(tmp_path / "b"),
                "benchmarks": ["x.py"], "repeats": 0, "output_dir": str(tmp_path / "out")})

    result = anyio.run(go)
    assert result.is_error and "repeats 0: give 1 to 1000" in result.content[0].text
    code = cli.main(["evaluate", str(tmp_path / "a"), str(tmp_path / "b"), "--benchmarks", "x.py", "--top-p", "0"])
    assert code == cli.EXIT_USAGE and "top_p 0: give a probability in (0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_both_sides_get_the_same_repeats_and_sampling_and_a_one_pass_key_is_unchanged():
    from quanteval import engines

    values = engines.evaluating().evaluation.endpoint_values("http://127.0.0.1:9/v1", "chat_completions", "m", 64, "/o", 2,
                                                         None, 8, sampling.sampling_values(0.7, 0.95))
    assert values["benchmarks[0].repeats"] == values["benchmarks[1].repeats"] == 8
    assert values["services.model.generation.temperature"] == 0.7 and values["services.model.generation.top_p"] == 0.95
    plain = engines.evaluating().evaluation.endpoint_values("http://127.0.0.1:9/v1", "chat_completions", "m", 64, "/o", 1, None)
    assert not any("repeats" in key or "temperature" in key or "top_p" in key for key in plain)
    one_pass = EvaluateQuantizationInput(**ARGS)
    sampled = EvaluateQuantizationInput(**ARGS, repeats=8, temperature=0.7)
    assert evaluation_key(CHECKPOINT, one_pass) != evaluation_key(CHECKPOINT, sampled)
    assert evaluation_key(CHECKPOINT, one_pass) == evaluation_key(CHECKPOINT, EvaluateQuantizationInput(**ARGS, repeats=1))


def test_repeats_at_temperature_zero_are_said_to_add_nothing():
    (note,) = sampling.notes_before({"aime25": None}, 8, None, None, 0.95)
    assert "repeats 8 at temperature 0 (greedy)" in note and "add no evidence" in note
    assert sampling.notes_before({"aime25": None}, 8, 0.6, None, 0.95) == []


def test_thirty_problems_at_one_repeat_cannot_decide_one_point_and_the_repeats_that_could_are_named_up_front():
    (note,) = sampling.notes_before({"aime25": 30}, 1, 0.6, 1, 0.95)
    needed = sampling.repeats_for_margin(30, 1, 0.95)
    assert "aime25: 30 problems x 1 repeat likely cannot decide the 1-point margin at 95%" in note
    assert f"~{needed} repeats per side would" in note and "or more problems" in note
    # the count is what it says: at that many repeats a model near 50% gives an interval well inside the margin (the
    # rest is power: it decides in 80% of runs), at a quarter of them one wider than the margin
    assert sampling.half_width_points(30, needed, 0.95) < 0.71 and sampling.half_width_points(30, needed // 4, 0.95) > 1
    (enough,) = sampling.notes_before({"big": 5000}, 8, 0.6, 5, 0.95)
    assert "can decide the 5-point margin" in enough
    (greedy,) = sampling.notes_before({"aime25": 30}, 1, 0.0, 1, 0.95)
    assert "known after the run" in greedy and "repeats add nothing at temperature 0" in greedy
    (tiny,) = sampling.notes_before({"t": 5}, 1, 0.6, 1, 0.95)
    assert "5 problems cannot decide any margin" in tiny


def _repeated(real_run: Path, root: Path, right: list[list[int]]) -> Path:
    """A run of one benchmark with one results.jsonl row per problem x repeat: right[problem][repeat] is its reward."""
    run = make_run(real_run, root, {"bench": [0.0]})
    folder = run / "bench"
    (row,) = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    rows = [{**row, "problem_idx": p, "repeat": r, "reward": float(v)} for p, values in enumerate(right) for r, v in enumerate(values)]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bundle_path = next(folder.glob("eval-*.json"))
    bundle = json.loads(bundle_path.read_text())
    bundle["benchmark"].update(samples=len(right), repeats=len(right[0]))
    bundle_path.write_text(json.dumps(bundle))
    return run


@requires("nel-next")
def test_after_the_run_the_repeat_count_the_standard_error_and_advice_in_both_dimensions_are_shown(real_run, tmp_path):
    chance = random.Random(7)
    # 30 problems answered right about half the time by both sides: sampling noise, no true drop
    base = [[int(chance.random() < 0.5) for _ in range(4)] for _ in range(30)]
    cand = [[int(chance.random() < 0.5) for _ in range(4)] for _ in range(30)]
    answer = compare_results(CompareResultsInput(baseline=str(_repeated(real_run, tmp_path / "b", base)),
                                                 candidate=str(_repeated(real_run, tmp_path / "c", cand)), max_drop=1))
    (row,) = answer.comparisons
    assert row.repeats == 4 and "4 repeats each averaged per problem" in row.method
    assert row.verdict == "inconclusive"
    assert f"± {100 * row.delta_stderr:.2f} points (SE) over 30 problems x 4 repeats" in row.why
    assert "paired problems would decide the 1-point margin" in row.why  # more problems
    assert "Repeats: ~" in row.why and "repeats per side (now 4) would decide it over the same 30 problems" in row.why


@requires("nel-next")
def test_repeats_that_always_agree_are_said_to_add_nothing(real_run, tmp_path):
    base = [[1] * 3 if p % 2 else [0] * 3 for p in range(30)]
    cand = [[1] * 3 if p % 3 else [0] * 3 for p in range(30)]
    answer = compare_results(CompareResultsInput(baseline=str(_repeated(real_run, tmp_path / "b", base)),
                                                 candidate=str(_repeated(real_run, tmp_path / "c", cand)), max_drop=1))
    (row,) = answer.comparisons
    assert row.verdict == "inconclusive" and "scored alike" in row.why and "only more problems decide" in row.why


def test_the_repeats_advised_after_the_run_decide_in_about_the_stated_share_of_simulated_runs():
    """Simulated sampled runs (per-problem chances drawn once, samples at each side): at the advised repeats the
    interval decides the margin in roughly 80% of runs."""
    chance = random.Random(3)
    problems, margin = 40, 0.10
    q = [chance.choice((0.2, 0.5, 0.8)) for _ in range(problems)]

    def run(repeats: int) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
        side = lambda: {p: [float(chance.random() < q[p]) for _ in range(repeats)] for p in range(problems)}  # noqa: E731
        return side(), side()

    base, cand = run(8)
    mean = lambda values: {p: sum(v) / len(v) for p, v in values.items()}  # noqa: E731
    interval = paired.paired_interval(mean(base), mean(cand))
    within = paired.sampling_variance(base, cand, list(range(problems)))
    assert interval is not None and within is not None and within > 0
    # sized as the advice sizes it, at the true delta (0 here; the advice says "if the true delta is the observed one")
    needed = paired.repeats_to_decide(dataclasses.replace(interval, delta=0.0), 8, within, margin)
    assert needed is not None
    decided = 0
    for _ in range(200):
        b, c = run(needed)
        sim = paired.paired_interval(mean(b), mean(c))
        assert sim is not None and sim.low is not None
        decided += sim.low >= -margin
    assert 0.65 <= decided / 200 <= 0.95


@requires("skills-in-nel-next", "slow")
def test_a_skills_benchmarks_size_is_counted_before_serving_and_the_margin_it_cannot_decide_is_said(monkeypatch):
    from quanteval import engines
    from quanteval.workflow.evaluate import _sampling_notes

    monkeypatch.setenv("NEMO_SKILLS_EXTRA_BENCHMARK_MAP", str(REPO / "examples/benchmarks/skills/benchmark_map.json"))
    assert engines.evaluating().evaluation.benchmark_sizes(["skills://tiny_mcq", "x.py"]) == {"skills://tiny_mcq": 200}
    request = EvaluateQuantizationInput(baseline_checkpoint="a", candidate_checkpoint="b", benchmarks=["skills://tiny_mcq"],
                                        repeats=1, temperature=0.7, max_drop=1)
    (note,) = _sampling_notes(request)
    assert note.startswith("skills://tiny_mcq: 200 problems x 1 repeat likely cannot decide the 1-point margin at 95%")


@requires("skills-in-nel-next")
def test_defaults_come_from_the_benchmarks_recipe_and_a_users_own_benchmark_runs_greedy_once():
    from quanteval.engines.recipes import parse_recipe, recipes_dir
    from quanteval.workflow.evaluate import resolve_protocol

    aime = parse_recipe(recipes_dir() / "aime2025.md")
    assert (aime.repeats, aime.temperature, aime.top_p) == (16, 0.6, 0.95)  # read from its YAML fragment's params
    args = {"baseline_checkpoint": "a", "candidate_checkpoint": "b"}
    request, (note,) = resolve_protocol(EvaluateQuantizationInput(**args, benchmarks=["skills://aime25"]))
    assert (request.repeats, request.temperature, request.top_p) == (16, 0.6, 0.95)
    assert note.startswith("repeats 16, temperature 0.6 and top_p 0.95 from the aime2025 recipe, the same for both sides")
    request, notes = resolve_protocol(EvaluateQuantizationInput(**args, benchmarks=["skills://aime25"], repeats=4, temperature=1))
    assert (request.repeats, request.temperature, request.top_p) == (4, 1, None)  # the user's values win
    request, (note,) = resolve_protocol(EvaluateQuantizationInput(**args, benchmarks=["skills://aime25"], temperature=0))
    assert request.repeats == 1 and "aime2025 recipe's 16 repeats are for sampled answers: greedy runs 1" in note
    request, (note,) = resolve_protocol(EvaluateQuantizationInput(**args, benchmarks=["mine.py"]))
    assert (request.repeats, request.temperature, request.top_p) == (1, None, None)
    assert note == "Greedy (temperature 0), 1 repeat: quanteval knows no recipe for mine.py."
    assert EvaluateQuantizationInput(**args, benchmarks=["mine.py"]).repeats is None  # None: the recipe's, else 1
