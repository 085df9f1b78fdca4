"""The evaluation skill's calls, from an empty directory to a canary-ready config, as `quanteval call` subprocesses.

Each scenario makes exactly the calls skills/evaluation/SKILL.md prescribes (one per step), counts them and the
characters of output an assistant reads, and then checks the config against what the serving framework and NEL
enforce: budget + prompt within the context, sampling from generation_config.json, server flags accepted by
SGLang's own argument parser (vLLM's is not installed here), validate_config clean and NEL's dry-run passing.
tests/test_e2e_chain.py asserts the checks; benchmarks/bench_chain.py prints the counts.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tiers import REPO  # tests/ is on sys.path: pytest's rootdir, or the benchmark's own insert

EXAMPLES = REPO / "examples" / "checkpoints"

from factories import make_checkpoint  # noqa: E402

# Values only the person can give (Step 4 of the skill): never discovered by a tool.
SLURM_VALUES = {"execution.hostname": "login.cluster.example", "execution.account": "llm_eval", "execution.output_dir": "/lustre/fs1/tester/nel-results"}
MIN_PROMPT_TOKENS = 1024  # GPQA's longest prompts fit in this


@dataclass
class Transcript:
    """What the assistant did: one entry per tool call, with the characters it had to read."""

    workdir: Path
    env: dict[str, str]
    calls: list[tuple[str, int]] = field(default_factory=list)

    def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "quanteval"), "call", tool, "--json", json.dumps(arguments)],
            cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=300, check=False,
        )
        self.calls.append((tool, len(done.stdout) + len(done.stderr if done.returncode else "")))
        if done.returncode != 0:
            raise AssertionError(f"{tool} {arguments} failed ({done.returncode}): {done.stderr[-2000:]}")
        return json.loads(done.stdout)

    def shell(self, what: str, characters: int = 0) -> None:
        """A step the skill does with a plain shell command (cp), counted as a call."""
        self.calls.append((what, characters))

    @property
    def characters(self) -> int:
        return sum(size for _, size in self.calls)


@dataclass
class Scenario:
    name: str
    checkpoint: Path
    execution: str
    deployment: str
    tasks: list[str]
    cluster_checkpoint_path: str | None = None
    derived_from: str | None = None  # a scenario whose config is copied, then re-applied with this checkpoint


def baseline_checkpoint(root: Path) -> Path:
    """The NVFP4 example's BF16 sibling: same Qwen3 shapes, unquantized, Qwen3's own top_k 20 in generation_config.json."""
    path = root / "qwen3-tiny-bf16"
    if not path.exists():
        make_checkpoint(path, chat_template="reasoning", model_type="qwen3", max_position_embeddings=40960)
        generation = json.loads((path / "generation_config.json").read_text())
        (path / "generation_config.json").write_text(json.dumps(generation | {"top_k": 20}))
    return path


def scenarios(root: Path) -> list[Scenario]:
    return [
        Scenario("nvfp4-qwen3-sglang-slurm", EXAMPLES / "qwen3-tiny-nvfp4", "slurm", "sglang", ["gpqa", "aime2025"],
                 cluster_checkpoint_path="/lustre/fs1/models/qwen3-tiny-nvfp4"),
        # a 4096-token model: tasks whose prompts and answers fit it (GPQA and AIME do not: validate_config says so)
        Scenario("fp8-llama-vllm-local", EXAMPLES / "llama-tiny-fp8", "local", "vllm", ["ns_mmlu", "ns_ifeval"]),
        Scenario("bf16-baseline-from-quantized-config", baseline_checkpoint(root), "slurm", "sglang", ["gpqa", "aime2025"],
                 cluster_checkpoint_path="/lustre/fs1/models/qwen3-tiny-bf16", derived_from="nvfp4-qwen3-sglang-slurm"),
        Scenario("reasoning-thinking-on-vllm-local", baseline_checkpoint(root), "local", "vllm", ["aime2025"]),
    ]


def run_scenario(scenario: Scenario, workdir: Path, env: dict[str, str], configs: dict[str, Path]) -> tuple[Transcript, Path]:
    """The skill's calls for one scenario; returns the transcript and the config written."""
    workdir.mkdir(parents=True, exist_ok=True)
    t = Transcript(workdir, env)
    config = workdir / "eval.yaml"
    if scenario.derived_from:  # the documented way to make the baseline config
        shutil.copy(configs[scenario.derived_from], config)
        t.shell("cp quantized.yaml eval.yaml")
    else:
        t.call("build_config", {"execution": scenario.execution, "deployment": scenario.deployment, "model_type": "chat_reasoning",
                                "benchmarks": ["core_reasoning"], "config_path": str(config)})
        t.call("add_tasks", {"config_path": str(config), "tasks": scenario.tasks, "replace": True})
    t.call("inspect_checkpoint", {"checkpoint": str(scenario.checkpoint)})
    apply = {"config_path": str(config), "checkpoint": str(scenario.checkpoint)}
    if scenario.cluster_checkpoint_path:
        apply["cluster_checkpoint_path"] = scenario.cluster_checkpoint_path
    t.call("apply_checkpoint", apply)
    missing = t.call("list_missing_values", {"config_path": str(config)})
    for key in missing["missing_values"]:
        t.call("set_config_value", {"config_path": str(config), "key": key, "value": SLURM_VALUES[key]})
    assert not missing["unset_env_vars"], missing["unset_env_vars"]
    validation = t.call("validate_config", {"config_path": str(config)})
    assert validation["valid"] and validation["problems"] == [], validation["problems"]
    dry = t.call("dry_run", {"config_path": str(config)})
    assert dry["ok"], dry["error"]
    configs[scenario.name] = config
    return t, config


def served_argv(config: Path) -> tuple[str, list[str]]:
    """The server arguments NEL's deployment command passes for this config (model path, parallelism, extra_args)."""
    deployment = yaml.safe_load(config.read_text())["deployment"]
    framework = deployment["type"] if "type" in deployment else next(
        entry["deployment"] for entry in yaml.safe_load(config.read_text())["defaults"] if isinstance(entry, dict) and "deployment" in entry)
    extra = shlex.split(deployment.get("extra_args") or "")
    if framework == "sglang":
        return framework, ["--model-path", "/checkpoint", "--tp-size", str(deployment["tensor_parallel_size"]), *extra]
    return framework, ["/checkpoint", "--tensor-parallel-size", str(deployment["tensor_parallel_size"]), *extra]


def enforced_checks(config: Path, checkpoint: Path) -> dict[str, Any]:
    """What the server and NEL would enforce, checked on the written config: each entry (ok, detail)."""
    from quanteval.engines.nel.config import CONTEXT_LENGTH_FLAGS, config_tasks, task_generation
    from quanteval.serving.deploy import check_server_args

    doc = yaml.safe_load(config.read_text())
    framework, argv = served_argv(config)
    flags = dict(zip(argv, argv[1:], strict=False))
    context = int(flags[CONTEXT_LENGTH_FLAGS[framework]])
    model = json.loads((checkpoint / "config.json").read_text())
    generation = json.loads((checkpoint / "generation_config.json").read_text())
    budgets = {path: task_generation(doc, path) for path, _ in config_tasks(doc)}
    parser = check_server_args(framework, argv)
    checks = {
        "context within the checkpoint": (context <= model["max_position_embeddings"], f"{context} <= {model['max_position_embeddings']}"),
        "budget + prompt within the context": (
            all(g["max_new_tokens"][0] + MIN_PROMPT_TOKENS <= context for g in budgets.values()),
            {path: g["max_new_tokens"][0] for path, g in budgets.items()},
        ),
        "sampling from generation_config.json": (
            all(g.get(key, (None,))[0] == generation[key] for g in budgets.values() for key in ("temperature", "top_p", "top_k") if key in generation),
            {key: generation[key] for key in ("temperature", "top_p", "top_k") if key in generation},
        ),
        "server flags accepted by the framework's parser": (parser.ok is not False, parser.message),
    }
    return checks


def cli_env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"HOME": str(home), "HF_TOKEN": "hf_dummy", "USER": "tester", "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0",
                "QUANTEVAL_STATE_DIR": str(home / "state"), "QUANTEVAL_LEDGER": str(home / "ledger.sqlite3")})
    return env
