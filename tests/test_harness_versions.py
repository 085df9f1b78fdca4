"""The harness is part of the comparison: two nel-next runs graded by another nel-next release, or by another NeMo-Skills
for skills:// benchmarks, are not comparable, and the answer names which. The versions come from where they are true:
nel-next's own bundle (sdk_version) and the NeMo-Skills installed in nel-next's venv, recorded when a run starts here.
"""

from __future__ import annotations

import json
from pathlib import Path

from next_runs import make_run
from tiers import NEL_NEXT, requires

from quanteval.engines.nel_next import nelnext
from quanteval.workflow.compare import CompareResultsInput, compare_results

pytestmark = requires("nel-next")
SKILLS_CONFIG = {"benchmarks": [{"name": "skills://tiny_mcq"}]}


def run(real_run: Path, root: Path, *, sdk: str = "0.3.0", harness: dict[str, str] | None = None) -> Path:
    folder = make_run(real_run, root, {"tiny_add": [1.0] * 40})
    bundle_path = next((folder / "tiny_add").glob("eval-*.json"))
    bundle = json.loads(bundle_path.read_text())
    bundle_path.write_text(json.dumps({**bundle, "sdk_version": sdk}))
    (folder / "checkpoint.json").write_text(json.dumps({"completed_benchmarks": {"tiny_add": {}}, "failed_benchmarks": {}}))
    nelnext.write_run_facts(folder, nelnext.run_facts({"benchmarks": [{"name": "tiny_add"}]}, {}, harness))
    return folder


def container_item(baseline: Path, candidate: Path, tmp_path: Path):
    result = compare_results(CompareResultsInput(baseline=str(baseline), candidate=str(candidate), max_drop=2,
                                                 output_dir=str(tmp_path / f"report-{candidate.name}")))
    return result, next(item for item in result.checklist if item.item == "container")


@requires("slow")
def test_the_same_harness_is_comparable_and_another_nel_next_or_nemo_skills_is_named(real_run, tmp_path):
    skills = {"nemo-skills": "0.7.0 (467b057)"}
    baseline = run(real_run, tmp_path / "baseline", harness=skills)
    same, item = container_item(baseline, run(real_run, tmp_path / "same", harness=skills), tmp_path)
    assert item.status == "same" and "0.3.0" in item.baseline and same.comparability != "not comparable"

    other_skills, item = container_item(baseline, run(real_run, tmp_path / "skills", harness={"nemo-skills": "0.7.0 (a1b2c3d)"}), tmp_path)
    assert item.status == "different" and other_skills.comparability == "not comparable"
    assert any("container differs [nemo-skills]" in reason for reason in other_skills.reasons), other_skills.reasons

    other_nel, item = container_item(baseline, run(real_run, tmp_path / "nel", sdk="0.3.1", harness=skills), tmp_path)
    assert item.status == "different" and any("[nemo-evaluator]" in reason for reason in other_nel.reasons)

    # a run on a cluster records no NeMo-Skills (its venv is not ours to read): not evidence of a difference
    _, item = container_item(baseline, run(real_run, tmp_path / "cluster", harness={}), tmp_path)
    assert item.status == "same", item


def test_nemo_skills_is_read_from_nel_next_venv_with_its_commit_when_installed_from_git(tmp_path, monkeypatch):
    """The venv setup builds (NeMo-Skills installed from a source folder) and one where pip installed it from git."""
    assert nelnext.local_harness({"benchmarks": [{"name": "tiny_add.py"}]}) == {}  # no skills:// benchmark: not asked
    here = nelnext.local_harness(SKILLS_CONFIG)["nemo-skills"]
    assert here.startswith("0.7.0 (") and "467b057" in here, here

    info = tmp_path / "venv" / "lib" / "python3.12" / "site-packages" / "nemo_skills-0.7.1.dist-info"
    info.mkdir(parents=True)
    (info / "direct_url.json").write_text(json.dumps({"url": "https://github.com/NVIDIA-NeMo/Skills.git", "vcs_info": {
        "vcs": "git", "commit_id": "0123456789abcdef0123456789abcdef01234567"}}))
    monkeypatch.setenv("QUANTEVAL_NEL_NEXT_VENV", str(tmp_path / "venv"))
    assert nelnext.local_harness(SKILLS_CONFIG) == {"nemo-skills": "0.7.1 (0123456789abcdef0123456789abcdef01234567)"}
    info.rename(info.with_name("other"))
    assert nelnext.local_harness(SKILLS_CONFIG) == {"nemo-skills": "not installed"}
    assert NEL_NEXT.exists()
