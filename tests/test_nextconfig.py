"""apply_checkpoint on nel-next configs: the model service takes what the checkpoint says, and the result passes
nel-next's own schema (its EvalConfig, run in its venv) and validate_config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import make_checkpoint
from tiers import BENCH, REPO, requires

from quanteval.models import ToolError
from quanteval.workflow.nelconfig import (
    ApplyCheckpointInput,
    BuildConfigInput,
    SetConfigValueInput,
    apply_checkpoint,
    build_config,
    load_config,
    set_config_value,
    to_plain,
)
from quanteval.workflow.validation import ValidateConfigInput, validate_config

HAS_NEL_NEXT = (REPO / ".venv-nel-next" / "bin" / "nel").is_file()


def _config(tmp_path: Path, deployment: str, model_type: str = "chat_reasoning") -> str:
    return build_config(BuildConfigInput(engine="nel-next", execution="local", deployment=deployment, model_type=model_type,
                                         benchmarks=[str(BENCH)], config_path=str(tmp_path / "eval.yaml"))).config_path


def _service(config: str) -> dict:
    return to_plain(load_config(config))["services"]["model"]


def test_a_vllm_service_gets_the_model_its_server_flags_and_a_budget_inside_the_context(tmp_path):
    ckpt = make_checkpoint(tmp_path / "qwen-fp8", quant="FP8", chat_template="plain", max_position_embeddings=8192)
    config = _config(tmp_path, "vllm")
    result = apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(ckpt)))
    service = _service(config)
    assert service["model"] == str(ckpt.resolve()) and service["served_model_name"] == "qwen-fp8"
    assert service["protocol"] == "chat_completions"
    assert "--max-model-len" in service["extra_args"]  # the checkpoint's context, as the NEL path writes it
    assert 0 < service["generation"]["max_tokens"] < 8192
    assert result.missing_values == []
    # again on the same checkpoint: nothing left to change
    assert apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(ckpt))).changes == []


@requires("nel-next")
def test_a_base_model_gets_the_completions_endpoint_and_the_config_is_what_nel_next_accepts(tmp_path):
    base = make_checkpoint(tmp_path / "base", chat_template=None, max_position_embeddings=2048)
    (base / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 40}))
    config = _config(tmp_path, "none")
    set_config_value(SetConfigValueInput(config_path=config, key="services.model.url", value="http://127.0.0.1:9/v1/chat/completions"))
    set_config_value(SetConfigValueInput(config_path=config, key="services.model.model", value="base"))
    result = apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(base)))
    service = _service(config)
    assert service["protocol"] == "completions" and service["url"] == "http://127.0.0.1:9/v1/completions"
    assert any(change.startswith("services.model.protocol:") and "no chat template" in change for change in result.changes)
    assert service["generation"]["top_p"] == 0.8 and service["proxy"]["extra_body"]["top_k"] == 40
    assert service["generation"]["temperature"] == 0.0  # build_config's greedy choice is kept, and said
    assert any("Kept services.model.generation.temperature = 0.0" in note for note in result.notes)
    report = validate_config(ValidateConfigInput(config_path=config))
    assert report.valid, report.problems


def test_the_previous_checkpoints_sampling_is_replaced_but_a_value_set_by_hand_is_kept(tmp_path):
    first = make_checkpoint(tmp_path / "first", chat_template="plain")
    (first / "generation_config.json").write_text(json.dumps({"top_p": 0.9, "top_k": 20}))
    second = make_checkpoint(tmp_path / "second", chat_template="plain")
    (second / "generation_config.json").write_text(json.dumps({"top_p": 0.95, "top_k": 50}))
    config = _config(tmp_path, "vllm")
    apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(first)))
    set_config_value(SetConfigValueInput(config_path=config, key="services.model.proxy.extra_body.top_k", value=7))
    result = apply_checkpoint(ApplyCheckpointInput(config_path=config, checkpoint=str(second)))
    service = _service(config)
    assert service["model"] == str(second.resolve())
    assert service["generation"]["top_p"] == 0.95  # it came from the first checkpoint: replaced
    assert service["proxy"]["extra_body"]["top_k"] == 7  # set by hand: kept, with a note
    assert any("Kept services.model.proxy.extra_body.top_k = 7" in note for note in result.notes)


def test_a_config_with_no_model_service_is_refused_and_left_as_it_was(tmp_path):
    config = Path(_config(tmp_path, "none"))
    text = config.read_text().replace("type: api", "type: nim")
    config.write_text(text)
    ckpt = make_checkpoint(tmp_path / "ckpt", chat_template="plain")
    with pytest.raises(ToolError, match="exactly one vllm, sglang or api service"):
        apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint=str(ckpt)))
    assert config.read_text() == text


@requires("nel-next")
def test_a_docker_cluster_nel_next_accepts_is_refused_at_launch_by_name_and_its_record_says_why(tmp_path):
    """nel-next's docker cluster passes its schema, but quanteval does not launch it: the launch says so, and the
    record written before it says failed with the reason (not a local run started by mistake)."""
    from quanteval import ledger
    from quanteval.workflow.runs import LaunchCanaryInput, launch_canary

    config = tmp_path / "docker.yaml"
    config.write_text(f"services:\n  model:\n    type: api\n    url: http://127.0.0.1:9/v1\n    protocol: chat_completions\n"
                      f"    model: m\nbenchmarks:\n  - name: {BENCH}\n    solver:\n      type: simple\n      service: model\n"
                      f"cluster:\n  type: docker\noutput:\n  dir: {tmp_path / 'out'}\n")
    with pytest.raises(ToolError, match=r"cluster\.type: 'docker' runs of nel-next are not launched by quanteval yet; "
                                        r"use cluster\.type local or slurm"):
        launch_canary(LaunchCanaryInput(config_path=str(config), limit_samples=2))
    [record] = ledger.find(kind="canary")
    assert record.status == "failed" and "not launched by quanteval" in record.details["error"]
    assert not (tmp_path / "out").exists()


@requires("nel-next")
def test_nel_nexts_schema_check_answers_from_its_warm_process_as_a_fresh_interpreter_does(tmp_path, monkeypatch):
    """A launch or validation asks nel-next's schema several times: the first runs in an interpreter of its own (a
    one-shot CLI call pays no warm process), the later ones are forked from one warm nel-next Python (its imports done
    once), and each answers what `python -c` in a fresh interpreter answers: a config it accepts, one it refuses with
    the key, and the defaults fragment it composed in."""
    import subprocess

    from quanteval import warm_python
    from quanteval.engines.nel_next import nelnext

    config = Path(_config(tmp_path, "none"))
    (tmp_path / "fragment.yaml").write_text("services:\n  model:\n    generation:\n      max_tokens: 64\n")
    config.write_text("defaults:\n  - _self_\n  - _base_: fragment.yaml\n" + config.read_text())
    cases = [[], ["services.model.url=http://127.0.0.1:8000/v1/chat/completions", "services.model.model=m"]]
    cold = [nelnext.run_script(nelnext.venv() / "bin" / "python", nelnext._SCHEMA_CHECK, str(config), json.dumps(overrides))
            for overrides in cases]
    started: list[list[str]] = []  # interpreters started for a check (a cold one, or warm_python's own cold retry)
    run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda argv, *rest, **named: (started.append(argv), run(argv, *rest, **named))[1])
    warm_python.close_all()
    monkeypatch.setattr(warm_python, "_ASKED", set())
    first = nelnext._ask_schema(str(config), cases[0])
    assert len(started) == 1 and started[0][-2:] == [str(config), "[]"]
    warm = [nelnext._ask_schema(str(config), overrides) for overrides in cases]
    assert len(started) == 1 and [nelnext.NextReading(**nelnext.last_json(done.stdout)) for done in cold] == warm
    assert first == warm[0]
    refused, accepted = warm
    assert not refused.ok and "services.model.url" in {problem["path"] for problem in refused.problems}
    assert accepted.ok and accepted.files_read == [str((tmp_path / "fragment.yaml").resolve())]
    assert accepted.resolved["services"]["model"]["generation"]["max_tokens"] == 64
