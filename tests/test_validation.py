"""validate_config: the broken-config corpus, clean build_config combinations, and NEL's own dry-run agreeing."""

from __future__ import annotations

import contextlib
import io
import itertools
import re
import time
from pathlib import Path

import pytest
import yaml
from tiers import REPO

from quanteval.engines.nel import config as nel_config
from quanteval.serving import frameworks
from quanteval.workflow import nelconfig, validation
from quanteval.workflow.nelconfig import ApplyCheckpointInput, BuildConfigInput, SetConfigValueInput
from quanteval.workflow.validation import ValidateConfigInput

EXAMPLES = REPO / "examples" / "checkpoints"
CORPUS = Path(__file__).resolve().parent / "data" / "broken_configs"
# The corpus serves the 4096-token tiny model with AIME and GPQA, as the core_reasoning skeleton writes them: those tasks
# really need longer contexts, which test_task_context.py covers. Here each file shows its own defect.
TASK_CONTEXT_RULES = {"context_too_small_for_task", "budget_truncates_answers"}


def _validate(request: ValidateConfigInput) -> validation.ValidateConfigOutput:
    """validate_config without the task-context rules (see TASK_CONTEXT_RULES)."""
    result = validation.validate_config(request)
    problems = [p for p in result.problems if p.rule not in TASK_CONTEXT_RULES]
    errors = sum(p.severity == "error" for p in problems)
    return result.model_copy(update={"problems": problems, "errors": errors, "warnings": len(problems) - errors, "valid": not errors})

BUNDLES = {"base": ["general_knowledge", "coding", "long_context", "multilingual"], "chat_reasoning": ["core_reasoning", "agentic", "long_context", "multilingual"]}
# Small bundles for NEL's dry-run: NEL re-parses its 16k-line task list per run, so fewer tasks keep it in seconds.
DRY_RUN_BUNDLES = {"base": ["coding"], "chat_reasoning": ["multilingual"]}
CHECKPOINT_FOR = {"base": EXAMPLES / "llama-tiny-bf16", "chat_reasoning": EXAMPLES / "qwen3-tiny-nvfp4"}
ENV = {
    "HF_TOKEN": "hf_dummy",
    "NVIDIA_API_KEY": "nvapi-dummy",
    "NGC_API_KEY": "ngc-dummy",
    "DUMMY_API_KEY": "dummy",
    "JUDGE_API_KEY": "judge-dummy",
    "WANDB_API_KEY": "wandb-dummy",
    "USER": "tester",
}
FILLS = {
    "execution.hostname": "login.cluster.example",
    "execution.account": "llm_eval",
    "execution.output_dir": "/lustre/fs1/tester/nel-results",
    "deployment.image": "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.6",
    "deployment.served_model_name": "meta/llama-3.1-8b-instruct",
    "target.api_endpoint.model_id": "meta/llama-3.1-8b-instruct",
    "export.mlflow.tracking_uri": "http://127.0.0.1:5000",
    "export.mlflow.experiment_name": "quant-eval",
    "export.wandb.project": "quant-eval",
    "export.wandb.entity": "team",
}


@pytest.fixture(autouse=True)
def dummy_secrets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NEMO_EVALUATOR_TRUST_PRE_CMD", raising=False)
    monkeypatch.delenv("QUANTEVAL_CORPUS_UNSET_VAR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # NEL writes its run configs and exec db under ~


def filled_config(tmp_path: Path, execution: str, deployment: str, model_type: str, benchmarks: list[str], export: str = "none") -> Path:
    """A build_config result completed the way a user would: apply_checkpoint, then set_config_value for the rest."""
    built = nelconfig.build_config(BuildConfigInput(execution=execution, deployment=deployment, model_type=model_type, benchmarks=benchmarks, export=export, config_path=str(tmp_path)))
    if deployment in ("vllm", "sglang", "trtllm"):
        nelconfig.apply_checkpoint(ApplyCheckpointInput(config_path=built.config_path, checkpoint=str(CHECKPOINT_FOR[model_type])))
    for path in nelconfig.missing_value_paths(nelconfig.load_config(built.config_path)):
        if path.endswith("params.extra.tokenizer"):
            value: object = "meta-llama/Llama-3.1-8B-Instruct"
        elif path.endswith("adapter_config.params_to_add"):
            value = {"chat_template_kwargs": {"enable_thinking": True}}
        else:
            value = FILLS[path]
        nelconfig.set_config_value(SetConfigValueInput(config_path=built.config_path, key=path, value=value))
    return Path(built.config_path)


def nel_dry_run(config: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """NEL's own dry-run, in process (the local executor needs no Docker for it, the SLURM one no ssh), its packaged
    task list parsed once per process as in quanteval's NEL calls (test_dry_run_review: a lookup gets what a fresh
    parse gives)."""
    from nemo_evaluator_launcher.api.functional import run_eval
    from nemo_evaluator_launcher.api.types import RunConfig

    from quanteval.engines.nel import nelexec

    nelexec.parse_packaged_task_list_once()

    monkeypatch.chdir(workdir)
    with contextlib.redirect_stdout(io.StringIO()):
        invocation = run_eval(RunConfig.from_hydra(config=str(config)), dry_run=True)
    assert invocation
    return invocation


# --- valid configs produce no errors --------------------------------------------------------


@pytest.mark.parametrize(
    "execution,deployment,model_type,export",
    [(e, d, m, x) for e, d, m in itertools.product(["local", "slurm"], ["none", "vllm", "sglang", "nim", "trtllm"], ["base", "chat_reasoning"]) for x in ("none", "mlflow", "wandb")],
)
def test_every_filled_build_config_validates_clean(tmp_path: Path, execution: str, deployment: str, model_type: str, export: str) -> None:
    config = filled_config(tmp_path, execution, deployment, model_type, BUNDLES[model_type], export)
    result = _validate(ValidateConfigInput(config_path=str(config)))
    assert result.problems == [], [problem.model_dump() for problem in result.problems]
    assert result.valid


@pytest.mark.slow
@pytest.mark.parametrize("execution,deployment,model_type", list(itertools.product(["local", "slurm"], ["none", "vllm", "sglang", "nim", "trtllm"], ["base", "chat_reasoning"])))
def test_clean_configs_pass_nels_dry_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, execution: str, deployment: str, model_type: str) -> None:
    config = filled_config(tmp_path, execution, deployment, model_type, DRY_RUN_BUNDLES[model_type])
    assert _validate(ValidateConfigInput(config_path=str(config))).valid
    nel_dry_run(config, tmp_path, monkeypatch)


def test_nel_dry_run_agrees_on_what_validate_reports_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NEL stops at the first ??? where validate_config lists all of them."""
    config = filled_config(tmp_path, "local", "vllm", "base", ["coding"])
    nelconfig.set_config_value(SetConfigValueInput(config_path=str(config), key="deployment.served_model_name", value="???"))
    nelconfig.set_config_value(SetConfigValueInput(config_path=str(config), key="evaluation.nemo_evaluator_config.config.params.extra.tokenizer", value="???"))
    missing = [p.key for p in _validate(ValidateConfigInput(config_path=str(config))).problems if p.rule == "missing_value"]
    assert missing == ["evaluation.nemo_evaluator_config.config.params.extra.tokenizer", "deployment.served_model_name"]
    with pytest.raises(Exception, match="Missing mandatory value") as failure:
        nel_dry_run(config, tmp_path, monkeypatch)
    assert sum(path in str(failure.value) for path in missing) == 1


# --- the broken-config corpus ---------------------------------------------------------------


def corpus_expectations(path: Path) -> list[tuple[str, str, str, str]]:
    """(severity, rule, path, fix substring) from the `# expect:` / `# fix:` header lines."""
    expected: list[tuple[str, str, str, str]] = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if match := re.match(r"# expect: (error|warning) (\S+) (\S+)$", line):
            expected.append((match[1], match[2], match[3], ""))
        elif line.startswith("# fix: "):
            severity, rule, where, _ = expected[-1]
            expected[-1] = (severity, rule, where, line.removeprefix("# fix: "))
    return expected


CORPUS_FILES = sorted(CORPUS.glob("*.yaml"))


def test_corpus_is_large_enough() -> None:
    broken = [path for path in CORPUS_FILES if corpus_expectations(path)]
    assert len(broken) >= 30
    assert len({expectation[1] for path in broken for expectation in corpus_expectations(path)}) >= 25  # distinct rules


@pytest.mark.parametrize("config", CORPUS_FILES, ids=[path.stem for path in CORPUS_FILES])
def test_corpus_config_is_caught_with_path_and_fix(config: Path) -> None:
    expected = corpus_expectations(config)
    result = _validate(ValidateConfigInput(config_path=str(config)))
    problems = result.problems
    found = [(p.severity, p.rule, p.key) for p in problems]
    for severity, rule, where, fix in expected:
        matches = [p for p in problems if (p.severity, p.rule, p.key) == (severity, rule, where)]
        assert matches, f"{config.name}: expected {severity} {rule} at {where}; found {found}"
        assert any(fix in p.fix or fix in p.message for p in matches), f"{config.name}: fix should mention {fix!r}: {[p.fix for p in matches]}"
    # nothing else: a false alarm is a bug too
    assert sorted(found) == sorted((s, r, w) for s, r, w, _ in expected), f"{config.name}: unexpected problems {found}"
    assert result.valid == (not any(severity == "error" for severity, *_ in expected))


# --- overrides, env and behaviour details ---------------------------------------------------


def test_overrides_are_checked(tmp_path: Path) -> None:
    config = CORPUS / "valid_local_vllm.yaml"
    overrides = [
        "++evaluation.nemo_evaluator_config.config.params.limit_samples=10",  # adds: fine
        "evaluation.nemo_evaluator_config.config.params.limit_samples=10",  # adds without ++
        "deployment.tensor_parallel_size=2",  # replaces an existing key: fine
        "+deployment.served_model_name=x",  # + on an existing key
        "~deployment.nothing_here",  # deletes a missing key
        "deployment.extra_args",  # no value
    ]
    result = _validate(ValidateConfigInput(config_path=str(config), overrides=overrides))
    by_path = {p.key: p for p in result.problems}
    assert by_path["override 'evaluation.nemo_evaluator_config.config.params.limit_samples=10'"].rule == "override_needs_plus"
    assert "++evaluation" in by_path["override 'evaluation.nemo_evaluator_config.config.params.limit_samples=10'"].fix
    assert by_path["override '+deployment.served_model_name=x'"].rule == "override_key_exists"
    assert by_path["override '~deployment.nothing_here'"].rule == "override_key_missing"
    assert by_path["override 'deployment.extra_args'"].rule == "malformed_override"
    assert len(result.problems) == 4


def test_overrides_know_nels_defaults() -> None:
    """Keys NEL's packaged defaults supply (walltime on SLURM, port for vLLM) need no ++."""
    overrides = ["execution.walltime=02:00:00", "deployment.port=9000", "deployment.gpu_memory_utilization=0.8", "execution.partitoin=batch"]
    result = _validate(ValidateConfigInput(config_path=str(CORPUS / "valid_slurm_vllm.yaml"), overrides=overrides))
    assert [(p.rule, p.key) for p in result.problems] == [("override_needs_plus", "override 'execution.partitoin=batch'")]
    assert "execution.partition=" in result.problems[0].fix


def test_unset_env_vars_are_names_only_and_can_be_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("DUMMY_API_KEY", "very-secret-value")
    config = CORPUS / "valid_local_vllm.yaml"
    result = _validate(ValidateConfigInput(config_path=str(config)))
    assert [(p.rule, p.key) for p in result.problems if p.severity == "error"] == [("unset_env_var", "evaluation.env_vars.HF_TOKEN")]
    assert "very-secret-value" not in result.model_dump_json()
    assert _validate(ValidateConfigInput(config_path=str(config), check_env=False)).problems == []


def test_trusting_pre_cmd_clears_the_error_and_still_names_what_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEMO_EVALUATOR_TRUST_PRE_CMD", "1")
    problems = _validate(ValidateConfigInput(config_path=str(CORPUS / "pre_cmd_untrusted.yaml"))).problems
    assert [(p.severity, p.rule, p.key) for p in problems] == [("warning", "runs_command", "evaluation.tasks.1.pre_cmd")]


def test_sglang_needs_trust_remote_code_for_custom_code(tmp_path: Path) -> None:
    from factories import make_checkpoint

    checkpoint = make_checkpoint(tmp_path / "ckpt", auto_map=True, chat_template="plain")
    text = (CORPUS / "valid_local_sglang.yaml").read_text().replace("../../../examples/checkpoints/llama-tiny-bf16", str(checkpoint))
    config = tmp_path / "c.yaml"
    config.write_text(text)
    problems = _validate(ValidateConfigInput(config_path=str(config))).problems
    assert [(p.rule, p.key) for p in problems] == [("trust_remote_code", "deployment.extra_args")]
    config.write_text(text.replace('"--context-length 4096"', '"--context-length 4096 --trust-remote-code"'))
    assert _validate(ValidateConfigInput(config_path=str(config))).problems == []


def test_cached_hf_handle_is_checked_against_its_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from factories import make_checkpoint

    cache = tmp_path / "hub"
    make_checkpoint(cache / "models--acme--tiny" / "snapshots" / "rev1", max_position_embeddings=4096, chat_template="plain")
    (cache / "models--acme--tiny" / "refs").mkdir()
    (cache / "models--acme--tiny" / "refs" / "main").write_text("rev1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    text = (CORPUS / "valid_local_vllm.yaml").read_text()
    text = text.replace("checkpoint_path: ../../../examples/checkpoints/llama-tiny-bf16", "checkpoint_path: null").replace("hf_model_handle: null", "hf_model_handle: acme/tiny")
    config = tmp_path / "c.yaml"
    config.write_text(text.replace('"--max-model-len 4096"', '"--max-model-len 32768"'))
    problems = _validate(ValidateConfigInput(config_path=str(config))).problems
    assert [(p.rule, p.key) for p in problems] == [("context_too_long", "deployment.extra_args")]


def test_framework_flag_tables_agree_with_sglangs_parser() -> None:
    """What validate_config says about SGLang flags is checked against SGLang's own argument parser (CPU import)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    sglang = set(parser._option_string_actions)
    tables = frameworks.FRAMEWORK_FLAGS
    assert set(tables["sglang"]) <= sglang
    assert {spelled["sglang"] for table in tables.values() for spelled in table.values() if "sglang" in spelled} <= sglang
    assert set(nel_config.NEL_COMMAND_FLAGS["sglang"]) <= sglang
    # flags called "rejected by SGLang" really are unknown to it
    others = {flag for name, table in tables.items() if name != "sglang" for flag in table}
    assert others - frameworks.SHARED_FLAGS - set(nel_config.NEL_COMMAND_FLAGS["sglang"]) - set(tables["sglang"]) <= others - sglang
    assert nel_config.CONTEXT_LENGTH_FLAGS["sglang"] in sglang
    assert sglang >= frameworks.SHARED_FLAGS


def test_bad_yaml_is_a_tool_error_with_position(tmp_path: Path) -> None:
    from quanteval.models import ToolError

    config = tmp_path / "c.yaml"
    config.write_text("deployment:\n  type: vllm\n extra: 1\n")
    with pytest.raises(ToolError, match="line 3, column 2"):
        _validate(ValidateConfigInput(config_path=str(config)))


def test_a_config_beside_its_run_outputs_is_checked_without_composing_and_a_group_folder_is_composed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NEL's output folder beside the config (its run configs are YAML) is never a config group: validate_config stays
    in-process. A folder the defaults list names (`- deployment: vllm`) is one, and the config is composed."""
    from quanteval.engines.nel import nelexec

    config = filled_config(tmp_path, "local", "vllm", "base", DRY_RUN_BUNDLES["base"])
    run = tmp_path / "nel-results" / "20261128_000000-abcd"
    run.mkdir(parents=True)
    (run / "run_config.yml").write_text(config.read_text())
    asked: list[str] = []
    real_call = nelexec.call
    monkeypatch.setattr(nelexec, "call", lambda op, *args, **kwargs: asked.append(op) or real_call(op, *args, **kwargs))
    assert _validate(ValidateConfigInput(config_path=str(config))).valid and asked == []
    group = tmp_path / "deployment"
    group.mkdir()
    (group / "mine.yaml").write_text("type: vllm\n")
    assert _validate(ValidateConfigInput(config_path=str(config))).valid and asked == ["resolved"]


def test_warm_validation_is_fast() -> None:
    config = CORPUS / "valid_slurm_vllm.yaml"
    _validate(ValidateConfigInput(config_path=str(config)))  # warm: imports, task catalogue, checkpoint facts
    started = time.perf_counter()
    for _ in range(5):
        _validate(ValidateConfigInput(config_path=str(config)))
    assert (time.perf_counter() - started) / 5 < 0.25  # tens of ms on a quiet machine; generous for loaded CI


def test_corpus_yaml_is_loadable_by_plain_yaml() -> None:
    for path in CORPUS_FILES:
        assert isinstance(yaml.safe_load(path.read_text()), dict), path.name
