"""NEL 0.2.6's validation rules, part two: deployment (flags, model source, the checkpoint behind it), execution,
pre_cmd, images, NEL's known issues, and generation (budget vs context, sampling, thinking); and the whole pass.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

from quanteval.clusters import executor as executors
from quanteval.clusters import ssh
from quanteval.configfile import MISSING, value_at, walk
from quanteval.engines import catalogue
from quanteval.engines.base import Problem, unpinned_image, unpinned_image_problem
from quanteval.engines.nel import nelfacts
from quanteval.engines.nel.checks import (
    Context,
    check_env_vars,
    check_evaluation,
    check_missing,
    check_overrides,
    check_tasks,
    check_top_level,
    close,
    extra_args,
    is_unresolved,
)
from quanteval.engines.nel.config import (
    CONTEXT_LENGTH_FLAGS,
    NEL_COMMAND_FLAGS,
    config_tasks,
    deployment_type,
    execution_type,
    serving_context,
    task_generation,
    thinking_setting,
)
from quanteval.engines.recipes import Recipe, recipes_by_task, task_context_problem
from quanteval.models import ToolError
from quanteval.serving import checkpoint, frameworks
from quanteval.serving.serverflags import generation_budget


def _int_at(section: dict, key: str, default: int | None = None) -> int | None:
    value = section.get(key, default)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _check_deployment(ctx: Context) -> None:
    _check_deployment_values(ctx)
    options = extra_args(ctx)
    _check_extra_args_flags(ctx, [flag for flag, _ in options])
    _check_model_source(ctx)
    if ctx.deployment in frameworks.FRAMEWORKS:
        _check_against_checkpoint(ctx, options)


def _check_deployment_values(ctx: Context) -> None:
    """Types and ranges NEL's templates take for granted: one extra_args string, positive sizes, a memory fraction."""
    deployment = ctx.section("deployment")
    raw_args = deployment.get("extra_args")
    if raw_args is not None and not isinstance(raw_args, str):
        ctx.add("deployment.extra_args", "error", "wrong_type", f"extra_args must be one string of server flags, got {type(raw_args).__name__}.", 'Write it as a string: extra_args: "--max-model-len 8192".')
    elif isinstance(raw_args, str):
        try:
            shlex.split(raw_args)
        except ValueError as exc:
            ctx.add("deployment.extra_args", "error", "malformed_extra_args", f"Cannot split the flags: {exc}.", "Balance the quotes in extra_args.")
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "port"):
        value = deployment.get(key)
        if key in deployment and not is_unresolved(value) and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            ctx.add(f"deployment.{key}", "error", "wrong_type", f"{key} must be a positive integer, got {value!r}.", f"Set deployment.{key} to an integer such as 1.")
    gpu_memory = deployment.get("gpu_memory_utilization")
    if gpu_memory is not None and not is_unresolved(gpu_memory) and (not isinstance(gpu_memory, (int, float)) or not 0 < gpu_memory <= 1):
        ctx.add("deployment.gpu_memory_utilization", "error", "wrong_type", f"gpu_memory_utilization must be a fraction in (0, 1], got {gpu_memory!r}.", "Use e.g. 0.9.")


def _check_extra_args_flags(ctx: Context, flags: list[str]) -> None:
    """Flags given twice, flags NEL's command already sets, and another framework's flags."""
    framework = ctx.deployment
    for flag in sorted({flag for flag in flags if flags.count(flag) > 1}):
        ctx.add("deployment.extra_args", "warning", "duplicate_flag", f"{flag} appears {flags.count(flag)} times; the server takes the last.", f"Keep one {flag}.")
    if framework not in NEL_COMMAND_FLAGS:
        return
    for flag in flags:
        owner = NEL_COMMAND_FLAGS[framework].get(flag)
        if owner:
            ctx.add("deployment.extra_args", "error", "flag_set_by_nel", f"{flag} is already in NEL's {framework} command; passing it again conflicts.", f"Remove {flag} from extra_args" + (f" and set {owner}." if owner.startswith("deployment.") else "."))
            continue
        for other, spelled in frameworks.FRAMEWORK_FLAGS.items():
            if other == framework or flag not in spelled or flag in frameworks.SHARED_FLAGS or flag in frameworks.FRAMEWORK_FLAGS.get(framework, {}):
                continue
            equivalent = spelled[flag].get(framework)
            fix = f"Replace {flag} with {equivalent}." if equivalent else f"Remove {flag}; {framework} has no such flag."
            ctx.add("deployment.extra_args", "error", "wrong_framework_flag", f"{flag} is a {other} flag; the {framework} server rejects it.", fix)
            break


def _check_model_source(ctx: Context) -> None:
    """Exactly one of checkpoint_path and hf_model_handle for a server that loads a model."""
    deployment = ctx.section("deployment")
    has_path = isinstance(deployment.get("checkpoint_path"), str) and deployment["checkpoint_path"] not in ("", MISSING)
    has_handle = isinstance(deployment.get("hf_model_handle"), str) and deployment["hf_model_handle"] not in ("", MISSING)
    if has_path and has_handle:
        ctx.add("deployment.hf_model_handle", "error", "both_model_sources", "Both checkpoint_path and hf_model_handle are set; NEL serves hf_model_handle and ignores the local checkpoint.", "Keep one: set hf_model_handle to null to serve the local checkpoint (or checkpoint_path to null).")
    if ctx.deployment in ("vllm", "sglang") and not has_path and not has_handle and "???" not in (deployment.get("checkpoint_path"), deployment.get("hf_model_handle")):
        ctx.add("deployment.checkpoint_path", "error", "no_model_source", "Neither checkpoint_path nor hf_model_handle is set: the server has nothing to load.", "Run apply_checkpoint with the checkpoint directory or HF handle.")


def _check_against_checkpoint(ctx: Context, options: list[tuple[str, str | None]]) -> None:
    report = ctx.checkpoint_report()
    if report is None:
        return
    framework = ctx.deployment
    values = dict(options)
    length_flag = CONTEXT_LENGTH_FLAGS[framework]
    length = values.get(length_flag)
    if report.context_length and length and length.isdigit() and int(length) > report.context_length:
        ctx.add(
            "deployment.extra_args",
            "error",
            "context_too_long",
            f"{length_flag} {length} exceeds the checkpoint's max_position_embeddings ({report.context_length}); the server refuses to start.",
            f"Use {length_flag} {report.context_length} (apply_checkpoint writes it).",
        )
    quantization = values.get("--quantization")
    if quantization and framework in ("vllm", "sglang"):
        _check_quantization_flag(ctx, report, quantization)
    if framework == "sglang" and report.trust_remote_code and "--trust-remote-code" not in values:
        ctx.add("deployment.extra_args", "error", "trust_remote_code", "The checkpoint ships its own model code (auto_map) and SGLang needs --trust-remote-code to load it.", "Add --trust-remote-code to extra_args.")
    deployment = ctx.section("deployment")
    tp = _int_at(deployment, "tensor_parallel_size")
    heads = report.architecture.num_attention_heads
    if tp and heads and heads % tp:
        ctx.add("deployment.tensor_parallel_size", "error", "tp_heads", f"tensor_parallel_size {tp} does not divide the model's {heads} attention heads.", f"Use a divisor of {heads}, e.g. {max(d for d in (1, 2, 4, 8) if heads % d == 0)}.")


def _check_quantization_flag(ctx: Context, report: checkpoint.CheckpointReport, value: str) -> None:
    quant = report.quantization
    expected = frameworks.support(ctx.deployment, quant.format).resolves_as if quant.detected else None
    if not quant.detected:
        if value != "fp8":  # --quantization fp8 quantizes a BF16 model on the fly; every other value needs a quantized checkpoint
            ctx.add("deployment.extra_args", "error", "quantization_mismatch", f"--quantization {value}, but the checkpoint is not quantized.", "Remove --quantization (or point checkpoint_path at the quantized checkpoint).")
        return
    if not frameworks.quantization_flag_fits(value, quant.method, quant.quant_algo, quant.format):
        fix = "Remove --quantization: the server reads the checkpoint's quantization config itself" + (
            f" (it resolves it as {expected})." if expected else ".")
        found = " ".join(part for part in (quant.method, quant.quant_algo) if part)
        ctx.add("deployment.extra_args", "error", "quantization_mismatch", f"--quantization {value} contradicts the checkpoint ({found}); the server fails to load it.", fix)


def _check_execution(ctx: Context) -> None:
    execution = ctx.section("execution")
    if ctx.execution not in executors.KNOWN:  # the rest of this section's rules are the executor's
        ctx.add("execution.type", "error", "unknown_executor", f"execution.type {ctx.execution!r} is not an executor.",
                f"Set execution.type to one of {', '.join(executors.KNOWN)}.")
        return
    executor = executors.for_name(ctx.execution)
    output_dir = execution.get("output_dir")
    if output_dir is not None and (not isinstance(output_dir, str) or not output_dir.strip()):
        ctx.add("execution.output_dir", "error", "wrong_type", "output_dir must be a directory path.", "Set execution.output_dir, e.g. nel-results.")
    elif isinstance(output_dir, str) and not is_unresolved(output_dir) and (problem := executor.output_dir_problem(output_dir)):
        ctx.add("execution.output_dir", "error", f"{executor.name}_output_dir", *problem)
    for key, what in nelfacts.REQUIRED_EXECUTION_KEYS.get(executor.name, {}).items():
        value = execution.get(key)
        if key not in execution or value is None or (isinstance(value, str) and not value.strip()):
            ctx.add(f"execution.{key}", "error", f"{executor.name}_{key}", f"execution.{key} ({what}) is not set.", f"Set execution.{key}.")
    _check_ssh_user(ctx, execution, executor.login_host(execution))
    for key in ("num_nodes", "num_instances", "ntasks_per_node"):
        value = execution.get(key)
        if key in execution and not is_unresolved(value) and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            ctx.add(f"execution.{key}", "error", "wrong_type", f"{key} must be a positive integer, got {value!r}.", f"Set execution.{key} to an integer such as 1.")
    nodes = _int_at(execution, "num_nodes", 1) or 1
    instances = _int_at(execution, "num_instances", 1) or 1
    if instances > 1 and executor.name not in nelfacts.REPLICATING_EXECUTORS:
        ctx.add("execution.num_instances", "warning", "num_instances", "num_instances only applies to the SLURM executor.", "Remove it, or run on SLURM.")
    if instances > 1 and ctx.deployment == "none":
        ctx.add("execution.num_instances", "error", "num_instances", "num_instances > 1 replicates a deployment, but deployment is none.", "Set num_instances to 1, or let NEL deploy the model.")
    if nodes % instances:
        ctx.add("execution.num_instances", "error", "num_instances", f"num_nodes {nodes} is not a multiple of num_instances {instances}: every instance needs the same number of nodes.", f"Use num_nodes {instances * max(1, nodes // instances)} or a num_instances that divides {nodes}.")
    if ctx.deployment in frameworks.FRAMEWORKS:
        _check_gpus_per_node(ctx, executor.gpus_per_node(execution, NEL_DEFAULT_GRES), nodes // instances if nodes % instances == 0 else 1)


_ENV_INTERPOLATION = re.compile(r"^\$\{oc\.env:(\w+)(?:,([^}]*))?\}$")


def _check_ssh_user(ctx: Context, execution: dict, hostname: str | None) -> None:
    """NEL logs in as `execution.username@execution.hostname` (the executor's login host; none for a run here), so
    username overrides the ssh config's User for that host (NEL's template: ${oc.env:USER}). A username other than the
    User the ssh config names (as OpenSSH resolves it, `ssh -G`) fails the launch while ssh_check and cluster_info,
    which log in as that User, succeed."""
    if not hostname or not hostname.strip() or is_unresolved(hostname) or "@" in hostname:
        return
    configured = execution.get("username", "${oc.env:USER}")  # NEL's default when the key is absent
    source = "set in the config"
    if isinstance(configured, str) and (match := _ENV_INTERPOLATION.match(configured.strip())):
        configured, source = os.environ.get(match.group(1), match.group(2)), f"{configured.strip()}, from ${match.group(1)}"
    if not isinstance(configured, str) or not configured or is_unresolved(configured):
        return  # unset env var or another interpolation: reported elsewhere, or known only at run time
    try:
        ssh_user = ssh.ssh_user(hostname.strip())
    except ToolError:
        return  # an unreadable ssh config: ssh_check says what is wrong with it
    # The local login name is also OpenSSH's default when the config names no User: then nothing says which is right.
    if ssh_user == configured or ssh_user == ssh.local_user():
        return
    ctx.add("execution.username", "error", "ssh_user_mismatch",
            f"execution.username is '{configured}' ({source}), but the ssh config names User {ssh_user} for Host {hostname}. "
            f"NEL logs in as {configured}@{hostname}, overriding the ssh config, and fails to connect, while ssh_check and "
            f"cluster_info log in as {ssh_user}.",
            f"Set execution.username: {ssh_user} (apply_cluster writes it), or change User for Host {hostname} in the ssh config if {configured} is right.")


NEL_DEFAULT_GRES = "gpu:8"  # NEL's SLURM executor asks for this without execution.gres


def _check_gpus_per_node(ctx: Context, gpus: int | None, nodes_per_instance: int) -> None:
    """The deployment's parallel sizes against the GPUs per node the executor places it on (None: not on nodes)."""
    deployment = ctx.section("deployment")
    tp = _int_at(deployment, "tensor_parallel_size", 8 if ctx.deployment in frameworks.FRAMEWORKS else 1)
    pp = _int_at(deployment, "pipeline_parallel_size", 1) or 1
    dp = _int_at(deployment, "data_parallel_size", 1) or 1
    if not gpus or not tp:
        return
    if tp > gpus:
        ctx.add("deployment.tensor_parallel_size", "error", "tp_exceeds_node", f"tensor_parallel_size {tp} exceeds the {gpus} GPUs per node (execution.gres).", f"Use tensor_parallel_size <= {gpus}; span nodes with pipeline_parallel_size instead.")
    elif tp * pp * dp > gpus * nodes_per_instance:
        ctx.add(
            "deployment.data_parallel_size",
            "error",
            "parallelism_exceeds_gpus",
            f"tensor {tp} x pipeline {pp} x data {dp} = {tp * pp * dp} GPUs per instance, but an instance has {nodes_per_instance} node(s) x {gpus} GPUs.",
            "Lower data_parallel_size / pipeline_parallel_size, or raise execution.num_nodes.",
        )


def _check_pre_cmd(ctx: Context) -> None:
    if os.environ.get("NEMO_EVALUATOR_TRUST_PRE_CMD") == "1":
        return
    places = [("evaluation.pre_cmd", ctx.section("evaluation").get("pre_cmd")), ("deployment.pre_cmd", ctx.section("deployment").get("pre_cmd"))]
    places += [(f"{path}.pre_cmd", task.get("pre_cmd")) for path, task in config_tasks(ctx.doc) if isinstance(task, dict)]
    for path, command in places:
        if isinstance(command, str) and command.strip():
            ctx.add(path, "error", "pre_cmd_untrusted", "NEL refuses to run a pre_cmd unless NEMO_EVALUATOR_TRUST_PRE_CMD=1 (the dry-run only warns).", "Read the command; if you trust it, export NEMO_EVALUATOR_TRUST_PRE_CMD=1. Otherwise remove pre_cmd.")


def _check_self_deployment_key(ctx: Context) -> None:
    if ctx.deployment in ("none", "nim"):
        return
    endpoint = ctx.section("target").get("api_endpoint")
    if isinstance(endpoint, dict) and endpoint.get("api_key_name"):
        return
    names = [str(task.get("name")) for _, task in config_tasks(ctx.doc) if isinstance(task, dict)]
    if any(entry.harness == "nemo_skills" for name in names for entry in catalogue.lookup(name)):
        ctx.add("target.api_endpoint.api_key_name", "error", "nemo_skills_api_key", "NeMo-Skills tasks send an API key even to a self-deployed server, and none is named: the run fails without one.", "Set target.api_endpoint.api_key_name: DUMMY_API_KEY (apply_checkpoint does) and export DUMMY_API_KEY=dummy.")



def _check_images(ctx: Context) -> None:
    """The serving image and any task container the config names must be pinned: `latest` moves between runs, so
    a baseline and a quantized run can silently use different servers."""
    places = [("deployment.image", ctx.section("deployment").get("image"))] if ctx.deployment != "none" else []
    places += [(f"{path}.container", task.get("container")) for path, task in config_tasks(ctx.doc) if isinstance(task, dict)]
    for path, image in places:
        inherited = ""
        if image is None and path == "deployment.image":  # not set here: NEL serves with its packaged default
            image = nelfacts.packaged_defaults(f"deployment/{ctx.deployment}").get("image")
            inherited = f" (NEL's default for {ctx.deployment}: the config sets no deployment.image)"
        if unpinned_image(image):
            ctx.problems.append(unpinned_image_problem(path, image, inherited))




# Names the interceptor docs print for the request/response logging limits; nemo-evaluator reads max_logged_*.
MISNAMED_LOGGING_KEYS = {"max_requests": "max_logged_requests", "max_responses": "max_logged_responses"}
MIN_PROMPT_TOKENS = 1024  # below this, a long prompt (GPQA, few-shot) plus the budget overflows the context


def _check_known_issues(ctx: Context) -> None:
    """The pitfalls ModelOpt's evaluation skill and NEL's docs list as known issues, as rules with a fix."""
    target = ctx.section("target").get("api_endpoint")
    if isinstance(target, dict) and "adapter_config" in target:
        ctx.add(
            "target.api_endpoint.adapter_config", "error", "adapter_config_ignored",
            "NEL builds each task's adapter from evaluation.nemo_evaluator_config (and the task's own); the top-level target.api_endpoint.adapter_config is never read.",
            "Move it to evaluation.nemo_evaluator_config.target.api_endpoint.adapter_config.",
        )
    if isinstance(target, dict) and "api_key" in target:
        ctx.add(
            "target.api_endpoint.api_key", "error", "api_key_removed",
            "NEL removed target.api_endpoint.api_key (a key in the config would be a secret on disk); it fails with 'Extra inputs are not permitted'.",
            "Delete api_key; export the key in an env var and set target.api_endpoint.api_key_name to that variable's NAME.",
        )
    adapters = [(path, value) for path, value in walk(ctx.doc) if path.endswith("api_endpoint.adapter_config") and isinstance(value, dict)]
    for path, adapter in adapters:
        if isinstance(adapter.get("interceptors"), list):
            ctx.add(
                f"{path}.interceptors", "warning", "interceptors_replace_defaults",
                "An explicit interceptors list replaces nemo-evaluator's whole default chain (caching, reasoning stripping, response stats...).",
                "Use the flat adapter_config fields instead (process_reasoning_traces, params_to_add, max_logged_requests, ...), or list every interceptor you need.",
            )
        for key in adapter:
            if key in MISNAMED_LOGGING_KEYS:
                ctx.add(f"{path}.{key}", "error", "logging_key_name", f"'{key}' is the docs' name; nemo-evaluator reads {MISNAMED_LOGGING_KEYS[key]} and ignores this.", f"Rename '{key}' to '{MISNAMED_LOGGING_KEYS[key]}'.")
            elif key not in nelfacts.adapter_keys():
                near = close(str(key), nelfacts.adapter_keys())
                ctx.add(f"{path}.{key}", "error" if near else "warning", "unknown_adapter_key", f"'{key}' is not an adapter_config field nemo-evaluator knows.", f"Rename it to '{near}'." if near else "Remove it.")
    for path, task in config_tasks(ctx.doc):
        name = str(task.get("name")) if isinstance(task, dict) else ""
        if any(entry.reads_tokenizer for entry in catalogue.lookup(name)) if name else False:
            params = [value_at(ctx.doc, f"{prefix}.config.params.extra.tokenizer") for prefix in ("evaluation.nemo_evaluator_config", f"{path}.nemo_evaluator_config")]
            if not any(value is not None for value in params):
                ctx.add(f"{path}", "error", "tokenizer_missing", f"'{name}' reads params.extra.tokenizer (its harness counts tokens or builds prompts with it), and none is set.", "Set evaluation.nemo_evaluator_config.config.params.extra.tokenizer to the model's HF handle (apply_checkpoint does when it can).")


def _check_endpoint_vs_chat_template(ctx: Context) -> None:
    """A checkpoint without a chat template (a base model, many exports) cannot answer a chat endpoint: the server
    refuses the request. NEL sends a task to its `endpoint_type`, else the first endpoint type the task supports."""
    if ctx.deployment not in frameworks.FRAMEWORKS:
        return
    report = ctx.checkpoint_report()
    if report is None or report.chat_template:
        return
    for path, task in config_tasks(ctx.doc):
        if not isinstance(task, dict) or not isinstance(task.get("name"), str):
            continue
        entries = catalogue.lookup(task["name"])
        supported = entries[0].endpoint_types if len(entries) == 1 else []
        endpoint = task.get("endpoint_type") or (supported[0] if supported else None)
        if endpoint != "chat":
            continue
        if "completions" in supported:
            fix = f"Set {path}.endpoint_type: completions (the task supports it), or add a chat template to the checkpoint."
        else:
            fix = "This task supports only the chat endpoint: remove it (base-model tasks: build_config model_type base), or add a chat template to the checkpoint."
        ctx.add(path, "error", "no_chat_template", f"'{task['name']}' goes to the chat endpoint, and {report.checkpoint} has no chat template: the server refuses every request.", fix)


def _check_task_budget(ctx: Context, task_path: str, task_name: str, budget: tuple[Any, str] | None, context: int | None, where: str,
                       recipes: dict[str, Recipe], seen: set[tuple[str, str]]) -> None:
    """max tokens vs the served context, and the context vs what the task's recipe says it needs."""
    if context and budget and isinstance(budget[0], int) and not isinstance(budget[0], bool) and (budget[1], "budget") not in seen:
        seen.add((budget[1], "budget"))
        fit = generation_budget(context)
        if budget[0] >= context:
            ctx.add(budget[1], "error", "budget_exceeds_context",
                    f"max tokens {budget[0]} >= the serving context {context} ({where}): the server refuses every request (prompt + max tokens must fit).",
                    f"Set it to {fit} (apply_checkpoint does), or raise the context if the model allows it.")
        elif context - budget[0] < MIN_PROMPT_TOKENS:
            fix = f"Use {fit}." if fit < budget[0] else f"The context itself is short: serve at least {budget[0] + MIN_PROMPT_TOKENS} tokens if the model allows it."
            ctx.add(budget[1], "warning", "budget_leaves_no_prompt_room",
                    f"max tokens {budget[0]} leaves {context - budget[0]} tokens of the {context}-token context ({where}) for the prompt; longer prompts are refused.",
                    fix)
    budget_value = budget[0] if budget and isinstance(budget[0], int) and not isinstance(budget[0], bool) else None
    found = task_context_problem(task_name, recipes.get(task_name), context, budget_value,
                                 frameworks.FRAMEWORK_INFO[ctx.deployment].context_flag)
    if found:
        ctx.add(task_path, *found)


def _check_generation(ctx: Context) -> None:
    """Budget vs serving context, sampling vs the checkpoint's generation_config.json, thinking vs the chat template."""
    if ctx.deployment not in frameworks.FRAMEWORKS:
        return
    report = ctx.checkpoint_report()
    context, where = serving_context(ctx.doc, report)
    recipes = recipes_by_task()
    seen: set[tuple[str, str]] = set()
    for task_path, task in config_tasks(ctx.doc):
        if not isinstance(task, dict):
            continue
        generation = task_generation(ctx.doc, task_path)
        _check_task_budget(ctx, task_path, str(task.get("name")), generation.get("max_new_tokens"), context, where, recipes, seen)
        if report is None:
            continue
        for key in ("temperature", "top_p", "top_k"):
            want = report.generation_defaults.get(key)
            have = generation.get(key)
            if want is None or have is None or not isinstance(have[0], (int, float)) or have[0] == want or (have[1], key) in seen:
                continue
            if have[1].startswith("evaluation.tasks["):  # a task's own sampling is the benchmark's choice (greedy RULER, ...)
                continue
            seen.add((have[1], key))
            ctx.add(have[1], "warning", "sampling_differs_from_checkpoint",
                    f"{key} {have[0]} differs from the checkpoint's generation_config.json ({want}); scores measured off the model's recommended sampling can be lower.",
                    f"Set {key} to {want} (apply_checkpoint does when the config still has NEL's template value), or keep it on purpose for both baseline and candidate.")
    if report is None:
        return
    thinking = thinking_setting(ctx.doc)
    if thinking is not None and not report.reasoning:
        ctx.add(thinking[1], "warning", "thinking_without_toggle",
                "The checkpoint's chat template has no thinking/reasoning toggle: this kwarg does nothing (or the template rejects it), and it differs from a run of a reasoning model.",
                "Remove it (apply_checkpoint does when it switches to this checkpoint).")
    options = dict(extra_args(ctx))
    stripped = any(value is True for path, value in walk(ctx.doc) if path.endswith("adapter_config.process_reasoning_traces"))
    if report.reasoning and (thinking is None or thinking[0] is not False) and "--reasoning-parser" not in options and not stripped:
        ctx.add("deployment.extra_args", "error", "reasoning_text_scored",
                "The model thinks (reasoning chat template) but nothing separates the reasoning from the answer: no --reasoning-parser and process_reasoning_traces is off, so the thinking text is scored.",
                "Add --reasoning-parser to extra_args (apply_checkpoint picks it), or set adapter_config.process_reasoning_traces: true.")
    quantization = options.get("--quantization")
    flags = report.deployment_flags.get(ctx.deployment)
    for note in flags.notes if flags else []:
        if note.startswith("error: "):  # the framework cannot load this format (or some of a mix's layers)
            key = "deployment.checkpoint_path" if (ctx.doc.get("deployment") or {}).get("checkpoint_path") else "deployment.hf_model_handle"
            ctx.add(key, "error", "checkpoint_not_servable", note.removeprefix("error: "),
                    f"Serve it with the framework or export the message names; {ctx.deployment} fails at load otherwise.")
    if quantization and flags and flags.quantization is None and report.quantization.method == "modelopt" and frameworks.quantization_flag_fits(quantization, report.quantization.method, report.quantization.quant_algo, report.quantization.format):
        ctx.add("deployment.extra_args", "warning", "quantization_flag_unneeded",
                f"--quantization {quantization} is not needed: {ctx.deployment} reads the checkpoint's ModelOpt config itself, and a stale flag breaks the next checkpoint.",
                "Remove --quantization (apply_checkpoint does).")


def validate_document(doc: Any, config_path: Path, overrides: list[str] | None = None, check_env: bool = True) -> list[Problem]:
    """Every problem in a parsed config (the rules behind validate_config)."""
    ctx = Context(doc=doc, config_path=config_path, deployment=deployment_type(doc), execution=execution_type(doc), check_env=check_env)
    recipes = recipes_by_task()
    check_missing(ctx)
    check_top_level(ctx)
    check_evaluation(ctx)
    check_tasks(ctx, recipes)
    check_env_vars(ctx)
    _check_deployment(ctx)
    _check_execution(ctx)
    _check_pre_cmd(ctx)
    _check_self_deployment_key(ctx)
    _check_images(ctx)
    _check_known_issues(ctx)
    _check_generation(ctx)
    _check_endpoint_vs_chat_template(ctx)
    check_overrides(ctx, overrides or [])
    return ctx.problems
