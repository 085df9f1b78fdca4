"""convert_config: a NEL 0.2.6 config becomes a nel-next config that nel-next's own schema accepts; every NEL value is
either mapped (named with where it went) or listed as not carried over, with why; nothing is overwritten."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from factories import make_checkpoint
from tiers import REPO, requires

from quanteval.configfile import walk
from quanteval.models import ToolError
from quanteval.workflow.convert import ConvertConfigInput, convert_config
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

pytestmark = requires("nel-next")


def _nel(tmp_path: Path, execution: str, deployment: str, bundle: str = "core_reasoning") -> str:
    return build_config(BuildConfigInput(execution=execution, deployment=deployment, model_type="chat_reasoning", benchmarks=[bundle],
                                         config_path=str(tmp_path / f"nel-{execution}-{deployment}.yaml"))).config_path


def _accounted(source: str, result) -> None:
    """Every non-null leaf of the NEL file is mapped or named as unmapped: nothing dropped silently."""
    named = {m.source for m in result.mapped} | {u.source for u in result.unmapped}
    for path, value in walk(to_plain(load_config(source))):
        if value is None or (isinstance(value, dict | list) and value):
            continue
        assert any(path == n or path.startswith(n + ".") for n in named), f"{path} = {value!r} is neither mapped nor named"


@pytest.mark.slow
def test_a_local_vllm_config_converts_to_one_nel_next_accepts(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_dummy_for_the_schema")  # NEL's template forwards it; nel-next expands ${HF_TOKEN} on load
    source = _nel(tmp_path, "local", "vllm")
    ckpt = make_checkpoint(tmp_path / "qwen3-8b", chat_template="plain", model_type="qwen3", max_position_embeddings=40960)
    apply_checkpoint(ApplyCheckpointInput(config_path=source, checkpoint=str(ckpt)))
    result = convert_config(ConvertConfigInput(config_path=source, output_path=str(tmp_path / "next.yaml")))
    # nel-next's schema and our rules accept it; what stops it from running here is only that NeMo-Skills' gpqa and
    # mmlu-pro data are not prepared (no network to download them): said, with the command that prepares them
    blocking = [p for p in result.problems if p["severity"] == "error"]
    assert {p["rule"] for p in blocking} <= {"skills_data_missing"}, result.problems
    assert all("ns prepare_data" in p["fix"] for p in blocking)
    doc = to_plain(load_config(result.output_path))
    service = doc["services"]["model"]
    assert service["type"] == "vllm" and service["model"] == str(ckpt.resolve()) and service["protocol"] == "chat_completions"
    names = [b["name"] for b in doc["benchmarks"]]
    assert "skills://gpqa" in names and "skills://mmlu-pro" in names
    gpqa = doc["benchmarks"][names.index("skills://gpqa")]
    assert gpqa["repeats"] == 5  # the recipe's num_repeats
    reasons = {u.source: u.reason for u in result.unmapped}
    assert any(key.endswith("extra.args") and "NeMo-Skills" in why for key, why in reasons.items())
    _accounted(source, result)


def test_a_slurm_config_gets_a_node_pool_and_says_what_is_still_unknown(tmp_path):
    source = _nel(tmp_path, "slurm", "sglang")
    for key, value in {"execution.hostname": "login-h100", "execution.username": "alice", "execution.account": "quant",
                       "execution.partition": "batch", "execution.walltime": "02:00:00", "execution.output_dir": "/lustre/alice/evals"}.items():
        set_config_value(SetConfigValueInput(config_path=source, key=key, value=value))
    result = convert_config(ConvertConfigInput(config_path=source, output_path=str(tmp_path / "next.yaml")))
    cluster = to_plain(load_config(result.output_path))["cluster"]
    assert cluster["type"] == "slurm" and cluster["hostname"] == "login-h100" and cluster["username"] == "alice"
    assert cluster["account"] == "quant" and cluster["walltime"] == "02:00:00"
    assert cluster["node_pools"]["default"]["partition"] == "batch"
    assert "services.model.model" in result.missing_values  # the checkpoint is not known yet: apply_checkpoint fills it
    assert not [p for p in result.problems if p["severity"] == "error" and p["rule"] != "missing_value"], result.problems
    _accounted(source, result)


@pytest.mark.slow
def test_an_existing_endpoint_becomes_an_api_service_with_its_key_from_the_environment(tmp_path):
    source = _nel(tmp_path, "local", "none")
    for key, value in {"target.api_endpoint.url": "http://127.0.0.1:8000/v1/chat/completions", "target.api_endpoint.model_id": "m",
                       "target.api_endpoint.api_key_name": "MY_KEY"}.items():
        set_config_value(SetConfigValueInput(config_path=source, key=key, value=value))
    result = convert_config(ConvertConfigInput(config_path=source, output_path=str(tmp_path / "next.yaml")))
    service = to_plain(load_config(result.output_path))["services"]["model"]
    assert service == {**service, "type": "api", "url": "http://127.0.0.1:8000/v1/chat/completions", "model": "m", "api_key": "${MY_KEY}"}
    _accounted(source, result)


def test_bad_inputs_are_clear_errors_and_nothing_is_overwritten(tmp_path):
    source = _nel(tmp_path, "local", "vllm")
    existing = tmp_path / "taken.yaml"
    existing.write_text("keep: me\n")
    with pytest.raises(ToolError, match="never overwrites"):
        convert_config(ConvertConfigInput(config_path=source, output_path=str(existing)))
    assert existing.read_text() == "keep: me\n"
    first = convert_config(ConvertConfigInput(config_path=source, output_path=str(tmp_path / "next.yaml")))
    with pytest.raises(ToolError, match="already a nel-next config"):
        convert_config(ConvertConfigInput(config_path=first.output_path, output_path=str(tmp_path / "again.yaml")))
    compose = tmp_path / "docker-compose.yaml"
    compose.write_text("services:\n  web:\n    image: nginx\n")
    with pytest.raises(ToolError):
        convert_config(ConvertConfigInput(config_path=str(compose), output_path=str(tmp_path / "x.yaml")))
    with pytest.raises(ToolError, match="no such config file"):
        convert_config(ConvertConfigInput(config_path=str(tmp_path / "absent.yaml"), output_path=str(tmp_path / "y.yaml")))
    assert not (tmp_path / "x.yaml").exists() and not (tmp_path / "y.yaml").exists()


def test_convert_config_over_mcp(tmp_path):
    from mcp import Client

    from quanteval.faces.server import build_server

    source = _nel(tmp_path, "local", "vllm")

    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool("convert_config", {"config_path": source, "output_path": str(tmp_path / "next.yaml")})

    result = anyio.run(go)
    assert not result.is_error, result.content[0].text
    assert result.structured_content["mapped"] and Path(result.structured_content["output_path"]).is_file()


needs_ns = requires("nemo-skills")  # NeMo-Skills' dataset modules say each METRICS_TYPE


@needs_ns
def test_tasks_nel_next_would_not_grade_stay_on_nel_with_the_metrics_type_named(tmp_path):
    """core_reasoning holds NeMo-Skills tasks scored as math/multichoice (graded by nel-next 0.3.0) and others (if,
    livecodebench, ...) that nel-next would score by exact match of the whole response: those are not converted."""
    from quanteval.engines.nel_next import skills
    from quanteval.workflow import tasks

    source = _nel(tmp_path, "local", "vllm")
    result = convert_config(ConvertConfigInput(config_path=source, output_path=str(tmp_path / "next.yaml")))
    names = [b["name"] for b in to_plain(load_config(result.output_path))["benchmarks"]]
    task_names = [t["name"] for t in to_plain(load_config(source))["evaluation"]["tasks"]]
    for task in task_names:
        entry = tasks.lookup(task)[0]
        metrics_type = skills.metrics_types([entry.harness_task])[entry.harness_task] if entry.harness_task else None
        converted = f"skills://{entry.harness_task}" in names
        assert converted == (entry.harness == "nemo_skills" and metrics_type in skills.SKILLS_GRADED_TYPES), (task, metrics_type)
        if not converted:
            reason = next(u.reason for u in result.unmapped if u.source.endswith("].name") and u.value == task)
            assert (f"METRICS_TYPE '{metrics_type}'" in reason) if entry.harness == "nemo_skills" else "in-process" in reason
    assert any(not n.startswith("skills://") for n in task_names) or len(names) < len(task_names)
    _accounted(source, result)


@pytest.mark.slow
@needs_ns
def test_every_recipe_has_its_nel_next_form_or_says_why_not(tmp_path):
    """The ten recipes' nel-next form, from the same mapping as convert_config: graded NeMo-Skills benchmarks with the
    recipe's repeats; the rest name why (metrics nel-next does not grade, a harness it does not run)."""
    from quanteval.workflow.tasks import GetTaskRecipeInput, get_task_recipe, list_recipes

    forms = {r.name: get_task_recipe(GetTaskRecipeInput(name=r.name)).nel_next for r in list_recipes()}
    assert len(forms) == 10
    aime = forms["aime2025"].benchmark
    assert {k: aime[k] for k in ("name", "solver", "repeats")} == {"name": "skills://aime25", "solver": {"type": "simple", "service": "model"}, "repeats": 16}
    assert "generic--math" in aime["instruction_template"]  # NeMo-Skills' prompt for aime25
    assert forms["gpqa"].benchmark["name"] == "skills://gpqa" and forms["gpqa"].benchmark["repeats"] == 5
    assert forms["mmlu_pro"].benchmark["name"] == "skills://mmlu-pro" and "repeats" not in forms["mmlu_pro"].benchmark
    assert all("compare nel-next runs only with nel-next runs" in forms[name].note for name in ("aime2025", "gpqa", "mmlu_pro"))
    assert forms["ifbench"].benchmark is None and "METRICS_TYPE 'if'" in forms["ifbench"].note
    assert forms["tau2_bench_telecom"].benchmark is None and "harness tau2_bench" in forms["tau2_bench_telecom"].note
    assert all(form.note for form in forms.values())
    # Each form is one nel-next's schema accepts, in a config of its own.
    config = build_config(BuildConfigInput(engine="nel-next", execution="local", deployment="none", model_type="chat_reasoning",
                                           benchmarks=[f.benchmark["name"] for f in forms.values() if f.benchmark],
                                           config_path=str(tmp_path / "next.yaml"))).config_path
    from quanteval.engines.nel_next import nelnext

    for index, form in enumerate(f for f in forms.values() if f.benchmark):
        set_config_value(SetConfigValueInput(config_path=config, key=f"benchmarks[{index}]", value=form.benchmark))
    for key, value in {"services.model.url": "http://127.0.0.1:8000/v1", "services.model.model": "m", "services.model.generation.max_tokens": 4096,
                       "output.dir": str(tmp_path / "out")}.items():
        set_config_value(SetConfigValueInput(config_path=config, key=key, value=value))
    checked = nelnext.check_schema(config, [])
    assert checked.ok, checked.problems


@needs_ns
def test_a_recipes_nel_next_form_over_mcp():
    from mcp import Client

    from quanteval.faces.server import build_server

    async def go():
        async with Client(build_server()) as client:
            return [await client.call_tool("get_task_recipe", {"name": name}) for name in ("aime2025", "ifbench")]

    aime, ifbench = anyio.run(go)
    assert aime.structured_content["nel_next"]["benchmark"]["name"] == "skills://aime25"
    assert ifbench.structured_content["nel_next"]["benchmark"] is None
    assert "METRICS_TYPE 'if'" in ifbench.structured_content["nel_next"]["note"]


@needs_ns
def test_nel_interpolations_and_unconverted_tasks_are_carried_as_nel_next_reads_them(tmp_path, monkeypatch):
    """NEL's SLURM template says `username: ${oc.env:USER}` (OmegaConf); nel-next expands only ${VAR}, and would ssh
    as a user literally named "${oc.env:USER}". A task that is not converted takes its settings with it, said as such;
    a ??? is said to be one, not a field nel-next lacks."""
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("HF_TOKEN", "hf_dummy_for_the_schema")
    source = _nel(tmp_path, "slurm", "sglang")
    assert to_plain(load_config(source))["execution"]["username"] == "${oc.env:USER}"
    result = convert_config(ConvertConfigInput(config_path=source, output_path=str(tmp_path / "next.yaml")))
    assert to_plain(load_config(result.output_path))["cluster"]["username"] == "${USER}"
    from quanteval.engines.nel_next import nelnext

    assert nelnext.check_schema(result.output_path, []).resolved["cluster"]["username"] == "alice"
    reasons = {u.source: u.reason for u in result.unmapped}
    ifbench = next(key[: -len(".name")] for key, u in ((u.source, u) for u in result.unmapped) if u.value == "ns_ifbench")
    assert "not converted" in reasons[f"{ifbench}.nemo_evaluator_config.config.params.extra.num_repeats"]
    unset = [u for u in result.unmapped if u.value == "???"]
    assert unset and all(u.reason == "??? in the NEL config: no value to carry over." for u in unset)


def test_an_omegaconf_interpolation_in_a_nel_next_config_is_an_error(tmp_path):
    from quanteval.workflow.validation import ValidateConfigInput, validate_config

    config = build_config(BuildConfigInput(engine="nel-next", execution="slurm", deployment="none", model_type="chat_reasoning",
                                           benchmarks=[str(REPO / "examples" / "benchmarks" / "tiny_add.py")],
                                           config_path=str(tmp_path / "next.yaml"))).config_path
    for key, value in {"cluster.hostname": "login", "cluster.account": "a", "cluster.node_pools.default.partition": "batch",
                       "cluster.walltime": "01:00:00", "output.dir": "/lustre/x", "services.model.url": "http://h:8000/v1",
                       "services.model.model": "m", "services.model.generation.max_tokens": 64,
                       "cluster.username": "${oc.env:USER}"}.items():
        set_config_value(SetConfigValueInput(config_path=config, key=key, value=value))
    problems = [p for p in validate_config(ValidateConfigInput(config_path=config)).problems if p.rule == "omegaconf_interpolation"]
    assert [p.key for p in problems] == ["cluster.username"] and "${VAR}" in problems[0].fix
