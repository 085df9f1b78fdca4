"""validate_config against `nel run --dry-run` on the same filled config.

Run by hand: .venv/bin/python benchmarks/bench_validate.py [execution] [deployment] [model_type]

Builds a config with build_config, fills it like a user would (apply_checkpoint on the
bundled example checkpoint, set_config_value for the rest), then times:
  - `nel run --config <file> --dry-run` (what a user would otherwise run to check a config),
  - validate_config in a fresh process (cold: imports and caches included),
  - validate_config in a running server (warm: what an assistant's repeated calls cost).
Prints medians and the ratios. Dummy secrets are set because NEL needs every host: variable.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_seconds  # noqa: E402

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
BUNDLES = {
    "base": ["general_knowledge", "coding", "long_context", "multilingual"],
    "chat_reasoning": ["core_reasoning", "agentic", "long_context", "multilingual"],
}
CHECKPOINT = {"base": REPO / "examples/checkpoints/llama-tiny-bf16", "chat_reasoning": REPO / "examples/checkpoints/qwen3-tiny-nvfp4"}
FILLS = {
    "execution.hostname": "login.cluster.example",
    "execution.account": "llm_eval",
    "execution.output_dir": "/lustre/fs1/bench/nel-results",
    "deployment.image": "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.6",
    "deployment.served_model_name": "meta/llama-3.1-8b-instruct",
    "target.api_endpoint.model_id": "meta/llama-3.1-8b-instruct",
}



def main() -> None:
    execution, deployment, model_type = (sys.argv[1:4] + ["local", "vllm", "chat_reasoning"][len(sys.argv) - 1 :])[:3]
    workdir = Path(tempfile.mkdtemp(prefix="bench-validate-"))
    env = dict(
        os.environ,
        HOME=str(workdir),
        QUANTEVAL_STATE_DIR=str(workdir / "state"),
        NEMO_EVALUATOR_TELEMETRY_LEVEL="0",
        HF_TOKEN="dummy",
        NVIDIA_API_KEY="dummy",
        NGC_API_KEY="dummy",
        DUMMY_API_KEY="dummy",
        USER=os.environ.get("USER", "bench"),
    )
    os.environ.update(env)

    from quanteval.workflow import nelconfig, validation

    built = nelconfig.build_config(
        nelconfig.BuildConfigInput(execution=execution, deployment=deployment, model_type=model_type, benchmarks=BUNDLES[model_type], config_path=str(workdir))
    )
    if deployment in ("vllm", "sglang", "trtllm"):
        nelconfig.apply_checkpoint(nelconfig.ApplyCheckpointInput(config_path=built.config_path, checkpoint=str(CHECKPOINT[model_type])))
    for path in nelconfig.missing_value_paths(nelconfig.load_config(built.config_path)):
        value = "meta-llama/Llama-3.1-8B-Instruct" if path.endswith("tokenizer") else FILLS.get(path, {"chat_template_kwargs": {"enable_thinking": True}})
        nelconfig.set_config_value(nelconfig.SetConfigValueInput(config_path=built.config_path, key=path, value=value))
    config = built.config_path
    print(f"config: {config} ({len(built.tasks)} tasks: {execution}/{deployment}/{model_type})")

    def nel_dry_run() -> None:
        subprocess.run([str(BIN / "nel"), "run", "--config", config, "--dry-run"], env=env, cwd=workdir, capture_output=True, check=True)

    def cold() -> None:
        call = json.dumps({"config_path": config})
        subprocess.run([str(BIN / "quanteval"), "call", "validate_config", "--json", call], env=env, capture_output=True, check=True)

    request = validation.ValidateConfigInput(config_path=config)
    first = validation.validate_config(request)
    assert first.valid, first.problems

    nel_s = median_seconds(nel_dry_run, 3)
    cold_s = median_seconds(cold, 3)
    warm_s = median_seconds(lambda: validation.validate_config(request), 20)
    print(f"nel run --dry-run:            {nel_s * 1000:9.1f} ms (median of 3)")
    print(f"validate_config, new process: {cold_s * 1000:9.1f} ms (median of 3)  {nel_s / cold_s:6.1f}x faster")
    print(f"validate_config, warm server: {warm_s * 1000:9.1f} ms (median of 20) {nel_s / warm_s:6.0f}x faster")


if __name__ == "__main__":
    main()
