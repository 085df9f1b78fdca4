"""dry_run shows what a person must review before a canary: NEL's own warnings (a parameter a task's command never
reads, ...) per task, and every server and client launch in full, as NEL rendered them (the real NEL 0.2.6, SLURM
and local executors). apply_checkpoint writes the evaluation tokenizer only where tasks read it, so NEL has nothing
to warn about afterwards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiers import REPO

from quanteval.workflow import runs
from quanteval.workflow.nelconfig import ApplyCheckpointInput, apply_checkpoint, load_config, to_plain
from quanteval.workflow.tasks import AddTasksInput, add_tasks

CORPUS = REPO / "tests" / "data" / "broken_configs"
CHECKPOINT = REPO / "examples" / "checkpoints" / "llama-tiny-bf16"
PLANTED = "hf_planted_secret_value_123"


@pytest.fixture(autouse=True)
def nel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_EVALUATOR_EXEC_DB_FILE", str(tmp_path / "exec-db" / "exec.v1.jsonl"))
    monkeypatch.setenv("HF_TOKEN", PLANTED)
    monkeypatch.setenv("DUMMY_API_KEY", "dummy")


def _config(tmp_path: Path, name: str, tokenizer: str = "Qwen/Qwen3-8B") -> Path:
    """A corpus config as users write them: the tokenizer set once for every task, though GPQA and AIME never read it
    (tokenizer "???": as build_config leaves it)."""
    text = (CORPUS / name).read_text().replace("../../../examples/checkpoints/llama-tiny-bf16", str(CHECKPOINT))
    text = text.replace("tokenizer: Qwen/Qwen3-8B", f"tokenizer: {tokenizer}")
    text = text.replace("output_dir: nel-results", f"output_dir: {tmp_path / 'out'}")
    path = tmp_path / "eval.yaml"
    path.write_text(text)
    return path


def _tokenizer_warnings(result: runs.DryRunOutput) -> dict[str | None, str]:
    return {w.task: w.message for w in result.nel_warnings if "config.params.extra.tokenizer" in w.message}


@pytest.mark.slow
def test_slurm_dry_run_returns_nels_warnings_per_task_and_the_launches_in_full(tmp_path):
    config = _config(tmp_path, "valid_slurm_vllm.yaml")
    result = runs.dry_run(runs.DryRunInput(config_path=str(config)))
    assert result.ok, result.error
    assert set(_tokenizer_warnings(result)) == {"ns_gpqa", "ns_aime2025"}  # NEL's own check, tagged with its task
    assert all("not used in the command template" in m and "Valid params" not in m for m in _tokenizer_warnings(result).values())

    server, client = result.scripts[0].launch_commands[:2]
    assert server.startswith("srun ") and "--container-image vllm/vllm-openai" in server
    assert f"{CHECKPOINT}:/checkpoint:ro" in server
    # NEL encodes the server command in base64 on SLURM: it comes back decoded, every flag reviewable.
    assert "<base64 of: vllm serve /checkpoint" in server and "--max-model-len 4096" in server
    assert client.startswith("srun ") and "eval-factory/nemo-skills" in client
    assert "run_eval --run_config config_ef.yaml" in client and "<base64, " in client  # the eval config: by size
    assert PLANTED not in result.model_dump_json()


@pytest.mark.slow
def test_local_dry_run_joins_docker_continuations_and_the_client_body(tmp_path):
    result = runs.dry_run(runs.DryRunInput(config_path=str(_config(tmp_path, "valid_local_vllm.yaml"))))
    assert result.ok, result.error
    script = next(s for s in result.scripts if s.name.endswith("run.sh") and "gpqa" in s.name)
    server, client = script.launch_commands[:2]
    assert server.startswith("docker run ") and "\\" not in server and "vllm serve /checkpoint" in server
    assert client.startswith("docker run ") and "bash -c '" in client and "run_eval --run_config config_ef.yaml" in client
    assert PLANTED not in result.model_dump_json()


@pytest.mark.slow
def test_apply_checkpoint_puts_the_tokenizer_only_under_the_tasks_that_read_it_and_nel_agrees(tmp_path):
    config = _config(tmp_path, "valid_slurm_vllm.yaml", tokenizer="???")
    add_tasks(AddTasksInput(config_path=str(config), tasks=["lm-evaluation-harness.ifeval"]))
    applied = apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint=str(CHECKPOINT)))
    doc = to_plain(load_config(str(config)))
    assert "tokenizer" not in json.dumps(doc["evaluation"]["nemo_evaluator_config"])
    by_name = {task["name"]: task for task in doc["evaluation"]["tasks"]}
    ifeval = by_name["lm-evaluation-harness.ifeval"]["nemo_evaluator_config"]["config"]["params"]["extra"]
    assert ifeval["tokenizer"] == "/checkpoint"  # the checkpoint, mounted into the evaluation container on SLURM
    assert "tokenizer" not in json.dumps(by_name["ns_gpqa"]) and "tokenizer" not in json.dumps(by_name["ns_aime2025"])
    assert any("set under the tasks that read it instead" in c for c in applied.changes)

    result = runs.dry_run(runs.DryRunInput(config_path=str(config)))
    assert result.ok, result.error
    assert _tokenizer_warnings(result) == {}, result.nel_warnings


def test_without_readers_the_tokenizer_goes_and_a_hand_set_one_is_kept_with_a_note(tmp_path):
    config = _config(tmp_path, "valid_slurm_vllm.yaml", tokenizer="???")
    apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint=str(CHECKPOINT)))
    assert "tokenizer" not in config.read_text()
    config = _config(tmp_path, "valid_slurm_vllm.yaml")
    applied = apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint=str(CHECKPOINT)))
    assert "tokenizer: Qwen/Qwen3-8B" in config.read_text()
    assert any("set by hand" in n and "ns_gpqa, ns_aime2025 never read it" in n for n in applied.notes), applied.notes


def test_nels_packaged_task_list_is_parsed_once_per_process_and_each_lookup_gets_its_own_copy(monkeypatch):
    """NEL looks its tasks up 2 + N times in a SLURM dry run or launch of N tasks, each lookup a ~0.9 CPU-s parse of
    the same packaged file: the process NEL's calls run in (nelexec) parses it once. Each lookup still gets what a
    fresh parse gives, and what one caller changes in its copy the next does not see."""
    from nemo_evaluator_launcher.common import mapping
    from nemo_evaluator_launcher.common.container_metadata import intermediate_repr

    from quanteval.engines.nel import nelexec

    fresh = mapping.load_tasks_mapping()
    parse, parses = intermediate_repr._load_irs_from_package, []
    monkeypatch.setattr(intermediate_repr, "_load_irs_from_package", lambda *args: parses.append(args) or parse(*args))
    nelexec.parse_packaged_task_list_once()
    first = mapping.load_tasks_mapping()
    first[("lm-evaluation-harness", "mmlu")]["defaults"]["config"] = "changed by a caller"
    second = mapping.load_tasks_mapping()
    assert len(parses) == 1 and len(fresh) > 400
    assert second == fresh and second[("lm-evaluation-harness", "mmlu")]["defaults"]["config"] != "changed by a caller"
