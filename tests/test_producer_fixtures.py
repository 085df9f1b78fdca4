"""Checkpoints written by the real quantizers (tests/data/producers/, made by examples/make_producer_checkpoints.py).

The fixtures are well-formed (valid safetensors headers, an index that names what the shards hold, a quantization
config a loader finds), and inspect_checkpoint reads each one's facts as the producer wrote them, compared with
manifest.json, the record of what each producer was asked to write. A fact inspect gets wrong today is an
xfail(strict) naming the wrong fact: fixing inspect turns it into a failure until the entry below is removed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from quanteval.serving import checkpoint

PRODUCERS = Path(__file__).parent / "data" / "producers"
MANIFEST = json.loads((PRODUCERS / "manifest.json").read_text(encoding="utf-8"))
FIXTURES: dict[str, dict] = MANIFEST["fixtures"]
WRITTEN = sorted(name for name, entry in FIXTURES.items() if entry["status"] == "written")

# quant_method each producer writes into config.json (auto-round's auto_gptq format names GPTQ).
METHOD = {"nvidia-modelopt": "modelopt", "llmcompressor": "compressed-tensors", "auto-round": "auto-round", "bitsandbytes": "bitsandbytes"}
METHOD_OVERRIDE = {"autoround-w4a16-gptq": "gptq"}

# (fixture, fact) -> what inspect_checkpoint reports wrongly today.
KNOWN_WRONG: dict[tuple[str, str], str] = {}
# Activation precision a format implies though the producer was not asked for it: LLM.int8() multiplies in int8,
# quantizing each activation row at run time (outlier columns stay 16-bit).
RUN_TIME_ACTIVATIONS = {"bnb-int8": {"bits": 8, "dynamic": True}}


def inspect(name: str) -> checkpoint.CheckpointReport:
    request = checkpoint.InspectCheckpointInput.model_validate({"checkpoint": str(PRODUCERS / name)})
    return checkpoint.inspect_checkpoint(request)


def test_manifest_matches_the_folders():
    folders = sorted(p.name for p in PRODUCERS.iterdir() if p.is_dir())
    assert folders == WRITTEN
    for name, entry in FIXTURES.items():
        assert entry["producer_version"] == MANIFEST["versions"][entry["producer"]], name
        assert entry["status"] in ("written", "failed"), name
        if entry["status"] == "failed":
            assert entry["error"], f"{name}: a failed scheme records the producer's error"


@pytest.mark.parametrize("name", WRITTEN)
def test_fixture_is_well_formed(name):
    root = PRODUCERS / name
    files = sorted(p.name for p in root.iterdir())
    assert files == sorted(FIXTURES[name]["files"])
    shards = sorted(p for p in root.glob("*.safetensors"))
    assert shards, f"{name}: no safetensors file"
    names_in = {}
    for shard in shards:
        with safe_open(shard, framework="numpy") as handle:  # parses the header, checks offsets against the file
            keys = handle.keys()  # a safe_open handle is not iterable
            for key in keys:
                names_in[key] = shard.name
                assert handle.get_slice(key).get_shape() is not None
        header_len = int.from_bytes(shard.read_bytes()[:8], "little")
        assert not any(shard.read_bytes()[8 + header_len :]), f"{shard.name}: tensor bytes are zeroed"
    index = root / "model.safetensors.index.json"
    if index.exists():
        assert json.loads(index.read_text())["weight_map"] == names_in
    else:
        assert len(shards) == 1
    config = json.loads((root / "config.json").read_text())
    qc = config.get("quantization_config")
    if FIXTURES[name]["intent"]["kv_only"]:
        assert qc and qc.get("kv_cache_scheme"), f"{name}: the KV-cache scheme is in config.json"
    else:
        assert qc or (root / "hf_quant_config.json").exists(), f"{name}: no quantization config"


def _facts(name: str) -> list[str]:
    intent = FIXTURES[name]["intent"]
    facts = ["detected", "method", "kv_cache", "activations", "logical_parameter_count"]
    weights = intent["weights"] or {}
    if weights.get("bits"):
        facts.append("weight_bits")
    if weights.get("group_size"):
        facts.append("group_size")
    if FIXTURES[name]["producer"] != "bitsandbytes":  # bitsandbytes' config names no version
        facts.append("producer")
    return facts


CASES = [
    pytest.param(
        name,
        fact,
        id=f"{name}-{fact}",
        marks=[pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[(name, fact)])] if (name, fact) in KNOWN_WRONG else [],
    )
    for name in WRITTEN
    for fact in _facts(name)
]


@pytest.fixture(scope="module")
def reports() -> dict[str, checkpoint.CheckpointReport]:
    return {}


@pytest.mark.parametrize(("name", "fact"), CASES)
def test_inspect_reports_what_the_producer_wrote(name, fact, reports):
    if name not in reports:
        reports[name] = inspect(name)  # must not raise on any real producer's checkpoint
    quant = reports[name].quantization
    entry = FIXTURES[name]
    intent = entry["intent"]
    if fact == "detected":
        assert quant.detected
    elif fact == "method":
        assert quant.method == METHOD_OVERRIDE.get(name, METHOD[entry["producer"]])
    elif fact == "kv_cache":
        assert (quant.kv_cache_quant_algo is not None) == bool(intent["kv_cache"]), quant.kv_cache_quant_algo
    elif fact == "activations":  # weight-only (None) vs quantized activations, their bits and dynamic/static scales
        wanted = intent["activations"] or RUN_TIME_ACTIVATIONS.get(name)
        got = quant.activations
        if "mixed" in name:  # groups disagree (W8A8 attention, W4A16 MLP): no single precision to report
            assert got is None or got.bits is None, got
        elif wanted is None:
            assert got is None, got
        else:
            assert got is not None and got.bits == wanted["bits"], got
            assert got.dynamic == (wanted["dynamic"] in (True, "local")), got
    elif fact == "weight_bits":
        assert quant.weight_bits == intent["weights"]["bits"]
    elif fact == "group_size":
        assert quant.group_size == intent["weights"]["group_size"]
    elif fact == "logical_parameter_count":  # the unquantized model's parameters, whatever the packing
        assert reports[name].weights.logical_parameter_count == MANIFEST["parameter_count"][entry["model"]]
    elif fact == "producer":
        # llm-compressor's config carries the compressed-tensors version that wrote the format
        version = MANIFEST["versions"]["compressed-tensors"] if entry["producer"] == "llmcompressor" else entry["producer_version"]
        assert quant.producer and version in quant.producer, quant.producer


@pytest.mark.parametrize("name", WRITTEN)
def test_no_producers_config_contradicts_its_weights(name):
    """Every real quantizer's checkpoint (packed, mixed-precision and 8-bit alike) agrees with its own config.json by
    checkpoint.config_conflicts: the check that refuses a misdescribed checkpoint names none of these."""
    assert inspect(name)._conflicts == []
