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


def resolve(path: str, server_args: list[str]) -> dict:
    from vllm.model_executor.layers import quantization as me_quant
    from vllm.transformers_utils.config import get_config

    requested = server_args[server_args.index("--quantization") + 1] if "--quantization" in server_args else None
    out: dict = {"quantization": None, "quant_config": None, "min_capability": None, "error": None}
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
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:600]
    return out


def main() -> None:
    pairs = json.loads(sys.argv[1])
    logging.disable(logging.WARNING)
    print(json.dumps([resolve(path, args) for path, args in pairs]))


if __name__ == "__main__":
    main()
