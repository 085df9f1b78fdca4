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

from quanteval import checkpoint

PRODUCERS = Path(__file__).parent / "data" / "producers"
MANIFEST = json.loads((PRODUCERS / "manifest.json").read_text(encoding="utf-8"))
FIXTURES: dict[str, dict] = MANIFEST["fixtures"]
WRITTEN = sorted(name for name, entry in FIXTURES.items() if entry["status"] == "written")

# quant_method each producer writes into config.json (auto-round's auto_gptq format names GPTQ).
METHOD = {"nvidia-modelopt": "modelopt", "llmcompressor": "compressed-tensors", "auto-round": "auto-round", "bitsandbytes": "bitsandbytes"}
METHOD_OVERRIDE = {"autoround-w4a16-gptq": "gptq"}

# (fixture, fact) -> what inspect_checkpoint reports wrongly today.
KNOWN_WRONG: dict[tuple[str, str], str] = {
    **{
        (name, "producer"): "producer is None: quantization_config.version (the compressed-tensors version that wrote "
        "the format) is not read"
        for name in WRITTEN
        if FIXTURES[name]["producer"] == "llmcompressor"
    },
    ("autoround-w4a16", "producer"): "producer is None: quantization_config.autoround_version is not read",
    ("autoround-w4a16-gptq", "producer"): "producer is None: quantization_config.autoround_version is not read",
    ("bnb-int8", "logical_parameter_count"): "logical_parameter_count 91470, not 90432: bitsandbytes' per-row "
    "scales (.SCB) and .weight_format tensors are counted as parameters",
    ("llmcompressor-w8a16", "logical_parameter_count"): "logical_parameter_count None: int8 packed four to an int32 "
    "(pack-quantized, weight_packed) is not unpacked, 8-bit packing is not known",
    ("llmcompressor-mixed-w8a8-w4a16", "logical_parameter_count"): "logical_parameter_count None: config groups with "
    "different weight bits (int8 attention, int4 MLP) leave weight_bits unset, so the int32-packed MLP is not unpacked",
    ("modelopt-fp8-pb-wo", "weight_bits"): "weight_bits None: ModelOpt writes quant_algo 'fp8_pb_wo' in lower case "
    "and the upper-case fact table misses it (expected 8)",
    ("modelopt-mxfp4", "weight_bits"): "weight_bits None: ModelOpt writes quant_algo 'mxfp4' in lower case and the "
    "upper-case fact table misses it (expected 4)",
    ("modelopt-mxfp4", "group_size"): "group_size None: MXFP4's block of 32 is fixed by the format (ModelOpt writes no "
    "group_size for it) and is not derived",
    ("modelopt-int4-awq", "group_size"): "group_size None: 128 is only in hf_quant_config.json, config.json is read alone",
    ("modelopt-w4a8-awq", "group_size"): "group_size None: 128 is only in hf_quant_config.json, config.json is read alone",
    ("modelopt-mxfp8", "group_size"): "group_size None: 32 is only in hf_quant_config.json, config.json is read alone",
    ("modelopt-w4a8-nvfp4-fp8", "group_size"): "group_size None: 32 is only in hf_quant_config.json, config.json is "
    "read alone",
    ("modelopt-w4a8-nvfp4-fp8", "weight_bits"): "weight_bits None: W4A8_NVFP4_FP8 is not in the ModelOpt fact table "
    "(expected 4)",
}


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
    facts = ["detected", "method", "kv_cache", "logical_parameter_count"]
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
