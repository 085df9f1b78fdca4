"""vLLM's own quantization resolution for checkpoints, run in a subprocess (see sglang_resolve.py for the contract).

vLLM's ModelConfig cannot be built on a CPU-only machine (it inspects the model class in a subprocess that
needs the whole CUDA stack), so this runs the parts of it that decide quantization, all vLLM's own code:
transformers_utils.config.get_config (reads config.json, falls back to hf_quant_config.json), every
method's override_quantization_method in ModelConfig._verify_quantization's order (the order is copied
from vllm 0.33 config/model.py: it is a local list there), then get_quantization_config(name).from_config
and get_min_capability(). Needs vllm installed (`pip install --no-deps vllm==0.33.0 cbor2 openai-harmony
openai cloudpickle` on top of the SGLang CPU install).
"""

from __future__ import annotations

import json
import logging
import sys

OVERRIDES = ["auto_gptq", "gptq", "gptq_marlin", "auto_awq", "awq", "awq_marlin", "inc", "moe_wna16", "modelopt",
             "modelopt_fp4", "modelopt_mxfp8", "mxfp8", "modelopt_mixed", "mxfp4", "gpt_oss_mxfp4", "deepseek_v4_fp8", "humming"]


def _layer_methods(config, layers: dict) -> dict[str, str | None]:  # noqa: ANN001
    """For a mixed checkpoint, the quantize method vLLM's config picks for each listed layer: its own get_quant_method
    handed a linear layer made without __init__ (that needs a process group; dispatch reads only the class).
    Experts are left out: vLLM builds them as RoutedExperts with a moe_config no bare object has."""
    from vllm.model_executor.layers.linear import RowParallelLinear

    methods: dict[str, str | None] = {}
    for name in layers:
        if ".experts." not in f"{name}.":
            method = config.get_quant_method(object.__new__(RowParallelLinear), prefix=name)
            methods[name] = type(method).__name__ if method is not None else None
    return methods


def resolve(path: str, server_args: list[str]) -> dict:
    from vllm.model_executor.layers import quantization as me_quant
    from vllm.transformers_utils.config import get_config

    requested = server_args[server_args.index("--quantization") + 1] if "--quantization" in server_args else None
    out: dict = {"quantization": None, "quant_config": None, "min_capability": None, "error": None, "layer_methods": {}}
    try:
        hf_config = get_config(path, trust_remote_code=False)
        quant_cfg = getattr(hf_config, "quantization_config", None)
        quantization = requested
        if quant_cfg is not None:
            quant_cfg = quant_cfg if isinstance(quant_cfg, dict) else quant_cfg.to_dict()
            quant_method = quant_cfg.get("quant_method", "")
            methods = [q for q in me_quant.QUANTIZATION_METHODS if q not in OVERRIDES] + OVERRIDES
            for name in methods:
                override = me_quant.get_quantization_config(name).override_quantization_method(quant_cfg, quantization, hf_config=hf_config)
                if override is not None:
                    quant_method = quantization = override
                    break
            quant_method = quant_method or None
            if quantization is None:
                quantization = quant_method
            elif quantization != quant_method:
                raise ValueError(f"Quantization method specified in the model config ({quant_method}) does not match "
                                 f"the quantization method specified in the `quantization` argument ({quantization}).")
        out["quantization"] = quantization
        if quantization is not None:
            config = me_quant.get_quantization_config(quantization).from_config(quant_cfg or {})
            out["quant_config"] = type(config).__name__
            out["min_capability"] = config.get_min_capability()
            out["layer_methods"] = _layer_methods(config, (quant_cfg or {}).get("quantized_layers") or {})
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:600]
    return out


def main() -> None:
    pairs = json.loads(sys.argv[1])
    logging.disable(logging.WARNING)
    print(json.dumps([resolve(path, args) for path, args in pairs]))


if __name__ == "__main__":
    main()
