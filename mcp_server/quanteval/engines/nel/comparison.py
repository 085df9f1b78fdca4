"""NEL 0.2.6 runs side by side: what must match between two runs of one task, read from the run configs NEL saved.

The facets follow runresults.CHECK_ITEMS; compare_results' checklist compares them. Loaded only when two runs are
compared (it reads NEL's config rules: deployment flags, NeMo-Skills' generation overrides).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from quanteval.engines.nel import config as nel_config
from quanteval.engines.nel.nelfacts import REPEAT_KEYS
from quanteval.engines.nel.runtree import METADATA_FILE, RESULTS_FILE, load_yaml, repeats, run_config
from quanteval.engines.runresults import TaskScores, family_facts
from quanteval.models import ToolError
from quanteval.serving import frameworks
from quanteval.serving.serverflags import parse_extra_args

PROMPT_KEYS = re.compile(r"prompt|template|system|few_?shot|chat", re.IGNORECASE)
REASONING_KEYS = re.compile(r"reason|think", re.IGNORECASE)
JUDGE_KEYS = re.compile(r"judge", re.IGNORECASE)
# Server flags that move scores (the rest tune speed and memory); --quantization legitimately differs.
SCORE_FLAGS = ("--kv-cache-dtype", "--reasoning-parser", "--chat-template", "--dtype")
# extra keys that are not the run's settings: the tokenizer follows the checkpoint (compared under model).
NOT_SETTINGS = re.compile(r"^(tokenizer|tokenizer_backend|args|top_k)$")


def _adapter_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The adapter's settings in one shape, whether NEL wrote the flat form (params_to_add, process_reasoning_traces,
    custom_system_prompt, ...) or the interceptor list (payload_modifier, reasoning, system_message, ...)."""
    adapter = ((config.get("target") or {}).get("api_endpoint") or {}).get("adapter_config") or {}
    settings = {key: value for key, value in adapter.items() if key != "interceptors"}
    for item in adapter.get("interceptors") or []:
        if isinstance(item, dict) and item.get("enabled", True) is not False:
            settings[f"interceptor:{item.get('name')}"] = item.get("config") or {}
    payload = settings.get("interceptor:payload_modifier") or {}
    added = dict(settings.get("params_to_add") or {}) | dict(payload.get("params_to_add") or {})
    settings["params_to_add"] = added
    return settings


def resolved_config(task_dir: Path) -> dict[str, Any] | None:
    """NEL's fully resolved launcher config for this task (artifacts/metadata.yaml), or None."""
    metadata = load_yaml(task_dir / "artifacts" / METADATA_FILE) or {}
    resolved = metadata.get("launcher_resolved_config") or (metadata.get("metadata") or {}).get("launcher_resolved_config")
    return resolved if isinstance(resolved, dict) and resolved else None


def _serving(resolved: dict[str, Any] | None, report: Any) -> dict[str, Any] | None:
    deployment = (resolved or {}).get("deployment")
    if not isinstance(deployment, dict) or not deployment.get("type"):
        return None
    try:
        flags = dict(parse_extra_args(str(deployment.get("extra_args") or "")))
    except ToolError:
        flags = {}
    scored = {flag: flags[flag] for flag in SCORE_FLAGS if flag in flags}
    # The KV-cache dtype the checkpoint itself calls for (apply_checkpoint writes it) is part of its quantization, named
    # by compare_results when the two checkpoints' KV caches differ; another value is a serving choice that moves scores.
    framework = str(deployment["type"])
    info = frameworks.FRAMEWORK_INFO.get(framework)
    kv_flag = info.kv_cache_flag if info else None
    if kv_flag in scored and report is not None and scored[kv_flag] == frameworks.kv_cache_dtype(framework, report.quantization.kv_cache_quant_algo):
        del scored[kv_flag]
    # the served context is compared with the model family (model.served_context)
    return {"framework": deployment.get("type"), "image": deployment.get("image")} | scored


def _report(resolved: dict[str, Any] | None, checkpoint: str | None) -> Any:
    """The checkpoint's report: the user's checkpoint, else the one the resolved config names; None: not readable here."""
    if checkpoint:
        from quanteval.serving import checkpoint as checkpoints

        return checkpoints.inspect_checkpoint(checkpoints.InspectCheckpointInput(checkpoint=checkpoint))
    return nel_config.model_source_report(resolved, Path.cwd()) if resolved else None


def _model(resolved: dict[str, Any] | None, report: Any) -> dict[str, Any] | None:
    """The checkpoint's model family, with the context the deployment's flags serve."""
    if report is None:
        return None
    context, _ = nel_config.serving_context(resolved or {}, report)
    return family_facts(report, context)


def facets(task_dir: Path, scores: TaskScores, checkpoint: str | None = None) -> dict[str, Any] | None:
    """What must match between two runs of one task, read from the saved run configs and results. None: unknown."""
    config = run_config(task_dir)
    if not config:
        return None
    params = (config.get("config") or {}).get("params") or {}
    extra = params.get("extra") or {}
    adapter = _adapter_settings(config)
    added = adapter["params_to_add"]
    overrides = nel_config.ns_generation_overrides(extra.get("args"))
    versioning = ((load_yaml(task_dir / "artifacts" / RESULTS_FILE) or {}).get("metadata") or {}).get("versioning")
    counts = sorted({s.count for s in scores.scores if s.count is not None})
    resolved = resolved_config(task_dir)
    args = extra.get("args")
    generation = {k: params.get(k) for k in ("temperature", "top_p", "max_new_tokens")} | {"top_k": extra.get("top_k", added.get("top_k"))}
    generation |= {k: v for k, v in added.items() if k not in ("chat_template_kwargs", "top_k")}
    generation |= overrides  # NeMo-Skills ++inference.* wins over NEL's params
    classified = [PROMPT_KEYS, REASONING_KEYS, JUDGE_KEYS]
    report = _report(resolved, checkpoint)
    return {
        "model": _model(resolved, report),
        "serving": _serving(resolved, report),
        "task": {"harness": config.get("framework_name"), "task": (config.get("config") or {}).get("type")},
        "container": versioning,
        "prompts": {
            "params": {k: v for k, v in extra.items() if PROMPT_KEYS.search(k)},
            "system_prompt": {k: adapter.get(k) for k in ("use_system_prompt", "custom_system_prompt") if adapter.get(k) is not None}
            | ({"interceptor": adapter["interceptor:system_message"]} if "interceptor:system_message" in adapter else {}),
        },
        "extra_args": {
            "args": shlex.split(args) if isinstance(args, str) else args,
            "other": {k: v for k, v in extra.items() if not NOT_SETTINGS.match(k) and not any(p.search(k) for p in classified)
                      and k not in REPEAT_KEYS},
        },
        "generation": generation,
        "reasoning": {
            "params": {k: v for k, v in extra.items() if REASONING_KEYS.search(k)},
            "chat_template_kwargs": added.get("chat_template_kwargs"),
            "adapter": {k: v for k, v in adapter.items() if REASONING_KEYS.search(k) and k != "params_to_add"},
        },
        "repeats": repeats(params),
        "samples": {"limit_samples": params.get("limit_samples"), "scored": counts},
        "judge": {k: v for k, v in extra.items() if JUDGE_KEYS.search(k)},
    }

