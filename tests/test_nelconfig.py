"""build_config, round-trip edits, list_missing_values and apply_checkpoint against NEL's real templates."""

from __future__ import annotations

import itertools
import multiprocessing
import threading
from pathlib import Path

import pytest
import yaml
from factories import make_checkpoint
from tiers import REPO

from quanteval import registry
from quanteval.engines.nel import config as nel_config
from quanteval.models import ToolError
from quanteval.workflow import nelconfig
from quanteval.workflow.nelconfig import (
    ApplyCheckpointInput,
    BuildConfigInput,
    DeleteConfigValueInput,
    GetConfigValueInput,
    ListMissingValuesInput,
    SetConfigValueInput,
)

EXAMPLES = REPO / "examples" / "checkpoints"
BUNDLES = {"base": ["general_knowledge", "coding", "long_context", "multilingual"], "chat_reasoning": ["core_reasoning", "agentic", "long_context", "multilingual"]}
COMBINATIONS = list(itertools.product(["local", "slurm"], ["none", "vllm", "sglang", "nim", "trtllm"], ["base", "chat_reasoning"], ["none", "mlflow", "wandb"]))


def build(tmp_path: Path, execution: str = "local", deployment: str = "vllm", model_type: str = "chat_reasoning", benchmarks: list[str] | None = None, export: str = "none") -> Path:
    result = nelconfig.build_config(
        BuildConfigInput(execution=execution, deployment=deployment, model_type=model_type, benchmarks=benchmarks or ["core_reasoning"], export=export, config_path=str(tmp_path))
    )
    return Path(result.config_path)


def nel_reference(execution: str, deployment: str, model_type: str, benchmarks: list[str], export: str) -> dict:
    """What NEL's own build_config merges, from the same packaged templates (its loader is what breaks on 3.11)."""
    from nemo_evaluator_launcher.common.build_config import deep_merge

    def template(part: str) -> dict:
        return yaml.safe_load((nel_config._templates_dir() / part).read_text()) or {}

    config: dict = {}
    for part in [f"execution/{execution}.yaml", f"export/{export}.yaml", f"evaluation/{model_type}/default.yaml"]:
        config = deep_merge(config, template(part))
    for bundle in benchmarks:
        config = deep_merge(config, template(f"evaluation/{model_type}/{bundle}.yaml"))
    config = deep_merge(config, template(f"deployment/{deployment}.yaml"))
    config["defaults"] = [d for d in config.get("defaults", []) if d != "_self_"] + ["_self_"]
    return config


# --- build_config -------------------------------------------------------------------------


def test_bundles_are_nels_own() -> None:
    assert nel_config.benchmark_bundles() == {key: sorted(value) for key, value in BUNDLES.items()}


@pytest.mark.parametrize("execution,deployment,model_type,export", COMBINATIONS)
def test_build_config_matches_nel_for_every_combination(tmp_path: Path, execution: str, deployment: str, model_type: str, export: str) -> None:
    path = build(tmp_path, execution, deployment, model_type, BUNDLES[model_type], export)
    assert yaml.safe_load(path.read_text()) == nel_reference(execution, deployment, model_type, BUNDLES[model_type], export)
    assert path.name == f"{execution}_{deployment}_{model_type}_{'_'.join(sorted(BUNDLES[model_type]))}.yaml"


def test_build_config_keeps_template_comments_and_reports_missing(tmp_path: Path) -> None:
    result = nelconfig.build_config(BuildConfigInput(execution="slurm", deployment="sglang", model_type="chat_reasoning", benchmarks=["core_reasoning"], config_path=str(tmp_path / "c.yaml")))
    text = Path(result.config_path).read_text()
    assert "# SLURM headnode (login) hostname (required)" in text
    assert "# Set to path if using local checkpoint" in text
    assert "checkpoint_path: null" in text
    assert result.tasks == ["ns_mmlu_pro", "ns_gpqa", "ns_livecodebench", "ns_ifbench"]
    assert set(result.missing_values) == {
        "execution.hostname",
        "execution.account",
        "execution.output_dir",
        "evaluation.nemo_evaluator_config.config.params.extra.tokenizer",
        "evaluation.nemo_evaluator_config.target.api_endpoint.adapter_config.params_to_add",
        "deployment.hf_model_handle",
        "deployment.served_model_name",
    }
    assert text.startswith("defaults:\n  - execution: slurm/default\n  - deployment: sglang\n  - _self_\n")


def test_build_config_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "mine.yaml"
    target.write_text("# my precious config\n")
    with pytest.raises(ToolError, match="already exists"):
        nelconfig.build_config(BuildConfigInput(execution="local", deployment="vllm", model_type="base", benchmarks=["coding"], config_path=str(target)))
    assert target.read_text() == "# my precious config\n"
    first = build(tmp_path, model_type="base", benchmarks=["coding"])
    second = build(tmp_path, model_type="base", benchmarks=["coding"])
    assert first != second and second.name.endswith("_1.yaml") and first.exists()


def test_build_config_rejects_bundle_of_other_model_type() -> None:
    spec = registry.get_tool("build_config")
    with pytest.raises(registry.ArgumentsError, match="core_reasoning"):
        registry.parse_arguments(spec, {"execution": "local", "deployment": "vllm", "model_type": "base", "benchmarks": ["core_reasoning"]})
    with pytest.raises(registry.ArgumentsError, match="deployment"):
        registry.parse_arguments(spec, {"execution": "local", "deployment": "ollama", "model_type": "base", "benchmarks": ["coding"]})


# --- paths and edits ------------------------------------------------------------------------


def test_get_by_task_name_and_index(tmp_path: Path) -> None:
    config = str(build(tmp_path))
    by_name = nelconfig.get_config_value(GetConfigValueInput(config_path=config, key="evaluation.tasks[ns_gpqa].nemo_evaluator_config.config.params.extra.num_repeats"))
    assert by_name.value == 5 and not by_name.missing
    assert nelconfig.get_config_value(GetConfigValueInput(config_path=config, key="evaluation.tasks[1].name")).value == "ns_gpqa"
    assert nelconfig.get_config_value(GetConfigValueInput(config_path=config, key="deployment.hf_model_handle")).missing
    with pytest.raises(ToolError, match="no entry named 'ns_gpq'. Did you mean: ns_gpqa"):
        nelconfig.get_config_value(GetConfigValueInput(config_path=config, key="evaluation.tasks[ns_gpq].name"))
    with pytest.raises(ToolError, match="Did you mean: extra_args"):
        nelconfig.get_config_value(GetConfigValueInput(config_path=config, key="deployment.extra_arg"))
    with pytest.raises(ToolError, match="out of range"):
        nelconfig.get_config_value(GetConfigValueInput(config_path=config, key="evaluation.tasks[9]"))


@pytest.mark.parametrize("bad", ["", "a..b", "a.", "[0]", "a[]", "a[0]b"])
def test_malformed_paths_are_clear_errors(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ToolError, match="path"):
        nelconfig.get_config_value(GetConfigValueInput(config_path=str(build(tmp_path)), key=bad))


def test_set_keeps_comments_and_order_and_returns_diff(tmp_path: Path) -> None:
    path = build(tmp_path)
    before = path.read_text()
    result = nelconfig.set_config_value(SetConfigValueInput(config_path=str(path), key="deployment.hf_model_handle", value="Qwen/Qwen3-8B"))
    after = path.read_text()
    assert result.changed
    assert "-  hf_model_handle: ??? # HuggingFace model handle" in result.diff
    assert "+  hf_model_handle: Qwen/Qwen3-8B # HuggingFace model handle" in result.diff
    assert after == before.replace("hf_model_handle: ???", "hf_model_handle: Qwen/Qwen3-8B")
    again = nelconfig.set_config_value(SetConfigValueInput(config_path=str(path), key="deployment.hf_model_handle", value="Qwen/Qwen3-8B"))
    assert not again.changed and again.diff == ""


@pytest.mark.parametrize(
    "text",
    [
        "evaluation:\n  tasks:\n  - name: ns_gpqa  # first\n    env_vars: {}\n  - name: ns_aime2025\ndeployment:\n  type: vllm\n",
        "evaluation:\n    tasks:\n        -   name: ns_gpqa  # first\n            env_vars: {}\n        -   name: ns_aime2025\ndeployment:\n    type: vllm\n",
    ],
)
def test_edit_keeps_the_files_own_indentation(tmp_path: Path, text: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    result = nelconfig.set_config_value(SetConfigValueInput(config_path=str(path), key="deployment.type", value="sglang"))
    assert path.read_text() == text.replace("type: vllm", "type: sglang")
    assert result.diff.count("\n-") == 1 and result.diff.count("\n+") == 2  # one line out; the +++ header and one line in


def test_set_by_task_name_creates_keys_and_parses_yaml(tmp_path: Path) -> None:
    path = build(tmp_path)
    nelconfig.set_config_value(SetConfigValueInput(config_path=str(path), key="evaluation.tasks[ns_gpqa].nemo_evaluator_config.config.params.temperature", yaml_value="0.6"))
    nelconfig.set_config_value(SetConfigValueInput(config_path=str(path), key="evaluation.tasks[ns_ifbench].env_vars", value={"HF_TOKEN": "host:HF_TOKEN"}))
    nelconfig.set_config_value(SetConfigValueInput(config_path=str(path), key="execution.mounts", yaml_value="{deployment: {/data: /data}}"))
    doc = yaml.safe_load(path.read_text())
    gpqa = next(task for task in doc["evaluation"]["tasks"] if task["name"] == "ns_gpqa")
    assert gpqa["nemo_evaluator_config"]["config"]["params"]["temperature"] == 0.6
    assert gpqa["nemo_evaluator_config"]["config"]["params"]["extra"]["num_repeats"] == 5
    assert doc["evaluation"]["tasks"][3]["env_vars"] == {"HF_TOKEN": "host:HF_TOKEN"}
    assert doc["execution"]["mounts"] == {"deployment": {"/data": "/data"}}
    assert "  env_vars:\n        HF_TOKEN: host:HF_TOKEN" in path.read_text()  # block style like the rest of the file


def test_value_and_yaml_value_are_exclusive() -> None:
    spec = registry.get_tool("set_config_value")
    with pytest.raises(registry.ArgumentsError, match="either value or yaml_value"):
        registry.parse_arguments(spec, {"config_path": "c.yaml", "key": "a", "value": 1, "yaml_value": "1"})


def test_delete_task_and_missing_key(tmp_path: Path) -> None:
    path = build(tmp_path)
    result = nelconfig.delete_config_value(DeleteConfigValueInput(config_path=str(path), key="evaluation.tasks[ns_ifbench]"))
    assert "-    - name: ns_ifbench" in result.diff
    assert [task["name"] for task in yaml.safe_load(path.read_text())["evaluation"]["tasks"]] == ["ns_mmlu_pro", "ns_gpqa", "ns_livecodebench"]
    before = path.read_bytes()
    with pytest.raises(ToolError, match="has no key 'checkpoint'.*Nothing was deleted"):
        nelconfig.delete_config_value(DeleteConfigValueInput(config_path=str(path), key="deployment.checkpoint"))
    assert path.read_bytes() == before


def test_duplicate_task_names_need_an_index(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("evaluation:\n  tasks:\n    - name: ns_gpqa\n    - name: ns_gpqa\n")
    with pytest.raises(ToolError, match=r"2 entries are named 'ns_gpqa' \(indices \[0, 1\]\)"):
        nelconfig.set_config_value(SetConfigValueInput(config_path=str(path), key="evaluation.tasks[ns_gpqa].env_vars", value={}))
    nelconfig.set_config_value(SetConfigValueInput(config_path=str(path), key="evaluation.tasks[1].container", value="img:1"))
    assert yaml.safe_load(path.read_text())["evaluation"]["tasks"][1] == {"name": "ns_gpqa", "container": "img:1"}


def test_bad_yaml_reports_line_and_column_and_leaves_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    text = "deployment:\n  type: vllm\n  extra_args: [unclosed\nexecution:\n  output_dir: x\n"
    path.write_text(text)
    with pytest.raises(ToolError, match=r"broken.yaml: invalid YAML at line \d+, column \d+"):
        nelconfig.set_config_value(SetConfigValueInput(config_path=str(path), key="deployment.type", value="sglang"))
    assert path.read_text() == text
    assert not list(tmp_path.glob(".broken.yaml.*.tmp"))


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="no such config file"):
        nelconfig.get_config_value(GetConfigValueInput(config_path=str(tmp_path / "nope.yaml"), key="a"))
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ToolError, match="top level must be a mapping"):
        nelconfig.get_config_value(GetConfigValueInput(config_path=str(listing), key="a"))


def _set_many(config: str, worker: int, count: int) -> None:
    for index in range(count):
        nelconfig.set_config_value(SetConfigValueInput(config_path=config, key=f"evaluation.tasks[ns_gpqa].env_vars.W{worker}_{index}", value=f"lit:{index}"))


def test_parallel_threads_lose_no_update(tmp_path: Path) -> None:
    config = str(build(tmp_path))
    threads = [threading.Thread(target=_set_many, args=(config, worker, 10)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    env = yaml.safe_load(Path(config).read_text())["evaluation"]["tasks"][1]["env_vars"]
    assert len(env) == 80 and env["W7_9"] == "lit:9"


def test_parallel_processes_lose_no_update(tmp_path: Path) -> None:
    config = str(build(tmp_path))
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_set_many, args=(config, worker, 6)) for worker in range(6)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert all(process.exitcode == 0 for process in processes)
    text = Path(config).read_text()
    env = yaml.safe_load(text)["evaluation"]["tasks"][1]["env_vars"]
    assert len(env) == 36
    assert "# HuggingFace model handle" in text  # comments survived 36 rewrites


# --- list_missing_values ------------------------------------------------------------------


def test_list_missing_values_reports_everything_at_once_names_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_123")
    monkeypatch.delenv("NVIDIA_API_KEY", raising=False)
    monkeypatch.delenv("USER", raising=False)
    config = build(tmp_path, execution="slurm", deployment="vllm", benchmarks=["agentic"])
    result = nelconfig.list_missing_values(ListMissingValuesInput(config_path=str(config)))
    assert len(result.missing_values) == 7 and "execution.account" in result.missing_values
    unset = {entry.name: entry for entry in result.unset_env_vars}
    assert "HF_TOKEN" not in unset
    assert unset["NVIDIA_API_KEY"].paths == ["evaluation.tasks[tau2_bench_telecom].env_vars.USER_API_KEY", "recipe:tau2_bench_telecom"]
    assert unset["USER"].paths == ["execution.username"]
    assert "hf_secret_value_123" not in result.model_dump_json()
    assert not result.complete


# --- apply_checkpoint ---------------------------------------------------------------------


def test_apply_checkpoint_sglang_local_dir(tmp_path: Path) -> None:
    config = build(tmp_path, deployment="sglang")
    result = nelconfig.apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint=str(EXAMPLES / "qwen3-tiny-nvfp4")))
    deployment = yaml.safe_load(config.read_text())["deployment"]
    assert deployment["checkpoint_path"] == str((EXAMPLES / "qwen3-tiny-nvfp4").resolve())
    assert deployment["hf_model_handle"] is None
    assert deployment["served_model_name"] == "qwen3-tiny-nvfp4"
    # the checkpoint's FP8 KV cache (kv_cache_scheme) is served as such; the chat template has a thinking toggle
    assert deployment["extra_args"] == "--context-length 40960 --kv-cache-dtype fp8_e4m3 --reasoning-parser qwen3"
    assert deployment["tensor_parallel_size"] == 1
    doc = yaml.safe_load(config.read_text())
    assert doc["target"]["api_endpoint"]["api_key_name"] == "DUMMY_API_KEY"  # ns_* tasks against the self-deployed server
    assert doc["evaluation"]["nemo_evaluator_config"]["target"]["api_endpoint"]["adapter_config"]["params_to_add"] == {"chat_template_kwargs": {"enable_thinking": True}}
    # no task of the bundle reads the evaluation tokenizer, and the local executor could not show it the checkpoint
    assert "tokenizer" not in doc["evaluation"]["nemo_evaluator_config"]["config"]["params"].get("extra", {})
    assert result.missing_values == []
    assert sum("Blackwell" in note for note in result.notes) == 1
    again = nelconfig.apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint=str(EXAMPLES / "qwen3-tiny-nvfp4")))
    assert again.diff == "" and again.changes == []


def test_apply_checkpoint_merges_extra_args_without_duplicates(tmp_path: Path) -> None:
    checkpoint = make_checkpoint(tmp_path / "ckpt", auto_map=True, max_position_embeddings=8192)
    vllm = build(tmp_path, deployment="vllm", model_type="base", benchmarks=["coding"])
    nelconfig.set_config_value(SetConfigValueInput(config_path=str(vllm), key="deployment.extra_args", value="--max-model-len=32768 --enforce-eager --max-model-len 16000"))
    nelconfig.apply_checkpoint(ApplyCheckpointInput(config_path=str(vllm), checkpoint=str(checkpoint), tensor_parallel_size=2, served_model_name="tiny"))
    deployment = yaml.safe_load(vllm.read_text())["deployment"]
    # NEL's vLLM command already passes --trust-remote-code: adding it again would duplicate it
    assert deployment["extra_args"] == "--max-model-len 8192 --enforce-eager"
    assert deployment["tensor_parallel_size"] == 2 and deployment["served_model_name"] == "tiny"
    sglang = build(tmp_path, deployment="sglang", model_type="base", benchmarks=["coding"])
    nelconfig.apply_checkpoint(ApplyCheckpointInput(config_path=str(sglang), checkpoint=str(checkpoint)))
    assert yaml.safe_load(sglang.read_text())["deployment"]["extra_args"] == "--context-length 8192 --trust-remote-code"


def test_apply_checkpoint_reports_unsplittable_extra_args(tmp_path: Path) -> None:
    config = build(tmp_path, deployment="vllm", model_type="base", benchmarks=["coding"])
    nelconfig.set_config_value(SetConfigValueInput(config_path=str(config), key="deployment.extra_args", value='--chat-template "unclosed'))
    before = config.read_bytes()
    with pytest.raises(ToolError, match="deployment.extra_args: cannot split"):
        nelconfig.apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint=str(EXAMPLES / "llama-tiny-bf16")))
    assert config.read_bytes() == before


def test_apply_checkpoint_hf_handle_fills_tokenizer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "hub"
    snapshot = cache / "models--acme--tiny-fp8" / "snapshots" / "abc123"
    make_checkpoint(snapshot, quant="FP8")
    (cache / "models--acme--tiny-fp8" / "refs").mkdir()
    (cache / "models--acme--tiny-fp8" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    config = build(tmp_path, deployment="vllm", model_type="base", benchmarks=["coding"])
    result = nelconfig.apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint="acme/tiny-fp8"))
    doc = yaml.safe_load(config.read_text())
    assert doc["deployment"]["hf_model_handle"] == "acme/tiny-fp8"
    assert doc["deployment"]["checkpoint_path"] is None
    assert doc["deployment"]["served_model_name"] == "acme/tiny-fp8"
    assert doc["evaluation"]["nemo_evaluator_config"]["config"]["params"]["extra"]["tokenizer"] == "acme/tiny-fp8"
    assert result.missing_values == []
    assert "api_key_name" not in str(doc.get("target"))  # adlr_* tasks are not NeMo-Skills


def test_apply_checkpoint_on_slurm_mounts_the_checkpoint_as_tokenizer(tmp_path: Path) -> None:
    config = build(tmp_path, execution="slurm", deployment="vllm", model_type="base", benchmarks=["coding"])
    result = nelconfig.apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint=str(EXAMPLES / "llama-tiny-bf16"), cluster_checkpoint_path="/lustre/models/llama-tiny"))
    doc = yaml.safe_load(config.read_text())
    assert doc["deployment"]["checkpoint_path"] == "/lustre/models/llama-tiny"
    assert doc["execution"]["mounts"] == {"mount_home": False, "evaluation": {"/lustre/models/llama-tiny": "/checkpoint"}}
    assert doc["evaluation"]["nemo_evaluator_config"]["config"]["params"]["extra"]["tokenizer"] == "/checkpoint"
    assert "evaluation.nemo_evaluator_config.config.params.extra.tokenizer" not in result.missing_values


def test_apply_checkpoint_refuses_deployments_without_a_server(tmp_path: Path) -> None:
    for deployment in ("none", "nim"):
        config = build(tmp_path, deployment=deployment, model_type="base", benchmarks=["coding"])
        before = config.read_bytes()
        with pytest.raises(ToolError, match=f"deployment is '{deployment}'"):
            nelconfig.apply_checkpoint(ApplyCheckpointInput(config_path=str(config), checkpoint=str(EXAMPLES / "llama-tiny-bf16")))
        assert config.read_bytes() == before


def test_cli_round_trip(tmp_path: Path, cli_env: dict[str, str]) -> None:
    import json
    import subprocess

    config = build(tmp_path)
    done = subprocess.run(
        ["quanteval", "call", "set_config_value", "--json", json.dumps({"config_path": str(config), "key": "evaluation.tasks[ns_gpqa].name", "value": "nemo_skills.ns_gpqa"})],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["changed"] is True
    failed = subprocess.run(
        ["quanteval", "call", "delete_config_value", "--json", json.dumps({"config_path": str(config), "key": "deployment.nothing"})], capture_output=True, text=True, env=cli_env, timeout=120
    )
    assert failed.returncode == 1 and "has no key 'nothing'" in failed.stderr and "Traceback" not in failed.stderr
