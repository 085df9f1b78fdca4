"""SGLang's own quantization resolution for one checkpoint, run in a subprocess by tests/framework_oracle.py.

argv[1]: a JSON list of [checkpoint directory, server arguments quanteval planned]. Prints a JSON
list, one object per pair: {"quantization": what ModelConfig resolved, "quant_config": the
QuantizationConfig class SGLang's loader builds, "min_capability": its get_min_capability(),
"loader": the model loader class for the planned --load-format, "error": what SGLang raised,
"layer_methods": for a mixed checkpoint, layer -> the quantize method class SGLang picks for it}.
One process for all pairs: importing SGLang takes ~10 s here.

This is SGLang 0.5.23's real code (ModelConfig._verify_quantization, model_loader.weight_utils.
get_quant_config, get_model_loader) on CPU. One import is replaced: torchvision, which the
multimodal config modules import at module level and which has no CPU wheel reachable here (the
PyPI wheel links libtorch_cuda). No torchvision code runs during quantization resolution.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import logging
import sys
import types


class _Placeholder(types.ModuleType):
    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(f"{self.__name__}.{name}")


class _TorchvisionPlaceholder:
    def find_spec(self, name, path=None, target=None):  # noqa: ANN001
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):  # noqa: ANN001
        module = _Placeholder(spec.name)
        module.__version__, module.__file__ = "0.0.0", "<placeholder>"
        return module

    def exec_module(self, module):  # noqa: ANN001
        pass


def _layer_methods(path: str, quant_config) -> dict[str, str | None]:  # noqa: ANN001
    """For a mixed checkpoint, the quantize method SGLang's config picks for each layer hf_quant_config.json lists:
    its own get_quant_method, handed a layer of the class the model builds there (FusedMoE for experts, else a linear
    layer). The layers are made without __init__ (that needs a process group); dispatch reads only their class."""
    import os

    from sglang.srt.layers.linear import RowParallelLinear
    from sglang.srt.layers.moe.fused_moe_triton import FusedMoE

    layers = getattr(quant_config, "quantized_layers", None)  # ModelOptMixedPrecisionConfig keeps the map it read
    if layers is None:  # W4AFp8Config does not: the map from the file SGLang read (config.json first)
        with open(os.path.join(path, "config.json")) as handle:
            layers = (json.load(handle).get("quantization_config") or {}).get("quantized_layers")
        hf_quant = os.path.join(path, "hf_quant_config.json")
        if layers is None and os.path.isfile(hf_quant):
            with open(hf_quant) as handle:
                layers = (json.load(handle).get("quantization") or {}).get("quantized_layers")
    methods: dict[str, str | None] = {}
    for name in layers or {}:
        layer = object.__new__(FusedMoE if ".experts." in f"{name}." else RowParallelLinear)
        method = quant_config.get_quant_method(layer, prefix=name)
        methods[name] = type(method).__name__ if method is not None else None
    return methods


def resolve(path: str, server_args: list[str]) -> dict:
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import get_model_loader
    from sglang.srt.model_loader.weight_utils import get_quant_config

    parser = argparse.ArgumentParser()
    parser.add_argument("--quantization")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--trust-remote-code", action="store_true")
    known, _ = parser.parse_known_args(server_args)
    out: dict = {"quantization": None, "quant_config": None, "min_capability": None, "loader": None, "error": None, "layer_methods": {}}
    try:
        model_config = ModelConfig(path, trust_remote_code=known.trust_remote_code, quantization=known.quantization)
        out["quantization"] = model_config.quantization
        load_config = LoadConfig(load_format=known.load_format)
        out["loader"] = type(get_model_loader(load_config, model_config)).__name__
        if model_config.quantization is not None:
            quant_config = get_quant_config(model_config, load_config, {})
            out["quant_config"] = type(quant_config).__name__
            out["min_capability"] = quant_config.get_min_capability()
            out["layer_methods"] = _layer_methods(path, quant_config)
    except Exception as exc:  # what SGLang raises is the verdict
        out["error"] = f"{type(exc).__name__}: {exc}"[:600]
    return out


def main() -> None:
    pairs = json.loads(sys.argv[1])
    try:
        import torchvision  # noqa: F401
    except Exception:  # absent, or the CUDA build next to a CPU torch
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, _TorchvisionPlaceholder())
    logging.disable(logging.WARNING)
    print(json.dumps([resolve(path, args) for path, args in pairs]))


if __name__ == "__main__":
    main()
