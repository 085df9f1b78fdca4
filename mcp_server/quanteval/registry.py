"""The one list of tools. The MCP server, the CLI and the tests are all generated from it.

A tool is a plain function in its domain module:

    def inspect_checkpoint(request: InspectCheckpointInput, progress: ProgressFn = no_progress) -> CheckpointReport:
        \"\"\"What it does. When to use it.\"\"\"

One pydantic input model, one pydantic output model, the docstring as description,
and an optional `progress` keyword for work that takes more than a second or two.
Registering it here with truthful annotations is all it takes to appear everywhere.
"""

from __future__ import annotations

import errno
import inspect
import json
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ValidationError

from quanteval import paths
from quanteval.models import ProgressFn, ToolError, no_progress
from quanteval.toolsets import TOOLSETS


@dataclass(frozen=True)
class ToolSpec:
    # "folder.module.function" inside the quanteval package, imported on first use: the CLI running one tool
    # and the MCP server answering tools/list from its cache import only what they need.
    fn: Callable[..., BaseModel] | str
    toolset: str  # a name in toolsets.TOOLSETS, declared here so that moving the function does not move the tool
    read_only: bool
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False  # talks to something outside this machine's files (hosts, servers, registries)

    @property
    def name(self) -> str:
        return self.fn.rsplit(".", 1)[-1] if isinstance(self.fn, str) else self.fn.__name__

    @property
    def module(self) -> str:
        return self.fn.rsplit(".", 1)[0] if isinstance(self.fn, str) else self.fn.__module__.rsplit(".", 1)[-1]

    @cached_property
    def function(self) -> Callable[..., BaseModel]:
        if not isinstance(self.fn, str):
            return self.fn
        import importlib

        return getattr(importlib.import_module(f"quanteval.{self.module}"), self.name)

    @cached_property
    def _hints(self) -> dict[str, Any]:
        return typing.get_type_hints(self.function)

    @property
    def input_model(self) -> type[BaseModel]:
        first_param = next(iter(inspect.signature(self.function).parameters))
        return self._hints[first_param]

    @property
    def output_model(self) -> type[BaseModel]:
        return self._hints["return"]

    @property
    def description(self) -> str:
        return inspect.getdoc(self.function) or ""

    @property
    def wants_progress(self) -> bool:
        return "progress" in inspect.signature(self.function).parameters

    def __hash__(self) -> int:
        return hash(self.name)


def _tools(*specs: ToolSpec) -> dict[str, ToolSpec]:
    by_name: dict[str, ToolSpec] = {}
    for spec in specs:
        if spec.name in by_name:
            raise RuntimeError(f"tool {spec.name} registered twice")
        if spec.toolset not in TOOLSETS:
            raise RuntimeError(f"tool {spec.name}: toolset {spec.toolset!r} is not declared in toolsets.TOOLSETS")
        by_name[spec.name] = spec
    return by_name


TOOLS: dict[str, ToolSpec] = _tools(
    ToolSpec("workflow.environment.check_environment", "setup", read_only=True, idempotent=True),
    ToolSpec("serving.checkpoint.inspect_checkpoint", "setup", read_only=True, idempotent=True),
    # Changes only which tools this server lists (mcpapp.py does it): nothing outside it.
    ToolSpec("faces.toolsetting.enable_toolsets", "setup", read_only=True, idempotent=True),
    ToolSpec("workflow.nelconfig.build_config", "config", read_only=False),
    ToolSpec("workflow.nelconfig.get_config_value", "config", read_only=True, idempotent=True),
    ToolSpec("workflow.nelconfig.set_config_value", "config", read_only=False, destructive=True, idempotent=True),
    ToolSpec("workflow.nelconfig.delete_config_value", "config", read_only=False, destructive=True),
    ToolSpec("workflow.nelconfig.list_missing_values", "config", read_only=True, idempotent=True),
    ToolSpec("workflow.nelconfig.apply_checkpoint", "config", read_only=False, destructive=True, idempotent=True),
    ToolSpec("workflow.convert.convert_config", "config", read_only=False),
    ToolSpec("workflow.validation.validate_config", "config", read_only=True, idempotent=True),
    ToolSpec("workflow.tasks.list_tasks", "config", read_only=True, idempotent=True),
    ToolSpec("workflow.tasks.get_task_recipe", "config", read_only=True, idempotent=True),
    ToolSpec("workflow.tasks.add_tasks", "config", read_only=False, idempotent=True),
    ToolSpec("faces.evalserver.start_eval_server", "evalserver", read_only=False),
    ToolSpec("faces.evalserver.eval_server_status", "evalserver", read_only=True, idempotent=True),
    ToolSpec("faces.evalserver.stop_eval_server", "evalserver", read_only=False, destructive=True, idempotent=True),
    ToolSpec("workflow.runs.dry_run", "runs", read_only=False),
    ToolSpec("workflow.runs.launch_canary", "runs", read_only=False, open_world=True),
    ToolSpec("workflow.runs.launch_full_run", "runs", read_only=False, open_world=True),
    # Polling reads, as the user sees it (it may refresh the ledger's record of the run): read-only.
    ToolSpec("workflow.runs.run_status", "runs", read_only=True, idempotent=True, open_world=True),
    ToolSpec("workflow.runs.wait_for_run", "runs", read_only=True, idempotent=True, open_world=True),
    ToolSpec("workflow.runs.run_logs", "runs", read_only=True, idempotent=True, open_world=True),
    ToolSpec("workflow.runs.kill_run", "runs", read_only=False, destructive=True, idempotent=True, open_world=True),
    ToolSpec("workflow.runs.resume_run", "runs", read_only=False, open_world=True),
    ToolSpec("workflow.runs.list_runs", "runs", read_only=True, idempotent=True),
    ToolSpec("clusters.tools.ssh_check", "cluster", read_only=False, idempotent=True, open_world=True),  # writes known_hosts only when trusted
    ToolSpec("clusters.tools.slurm_queue", "cluster", read_only=True, idempotent=True, open_world=True),
    ToolSpec("clusters.tools.remote_grep", "cluster", read_only=True, idempotent=True, open_world=True),
    ToolSpec("clusters.tools.check_registry_credentials", "cluster", read_only=True, idempotent=True, open_world=True),
    ToolSpec("clusters.tools.cluster_info", "cluster", read_only=True, idempotent=True, open_world=True),
    ToolSpec("workflow.placement.apply_cluster", "cluster", read_only=False, destructive=True, idempotent=True, open_world=True),
    ToolSpec("workflow.results.validate_run", "results", read_only=True, idempotent=True, open_world=True),
    ToolSpec("workflow.results.extract_scores", "results", read_only=True, idempotent=True, open_world=True),
    ToolSpec("workflow.compare.compare_results", "results", read_only=False, open_world=True),
    ToolSpec("workflow.gate.gate_results", "results", read_only=True, idempotent=True),  # writes only the report asked for with output_dir
    ToolSpec("serving.deploy.plan_deployment", "deploy", read_only=True, idempotent=True),
    ToolSpec("serving.deploy.launch_deployment", "deploy", read_only=False, open_world=True),
    ToolSpec("serving.deploy.deployment_status", "deploy", read_only=True, idempotent=True, open_world=True),
    ToolSpec("serving.deploy.stop_deployment", "deploy", read_only=False, destructive=True, idempotent=True, open_world=True),
    ToolSpec("workflow.evaluate.evaluate_quantization", "results", read_only=False, open_world=True),
    ToolSpec("workflow.evaluate.start_evaluation", "results", read_only=False, open_world=True),
)


MAX_RESULT_BYTES = 80_000  # ~20k tokens: the most one answer may put in a model's context


def select(toolsets: list[str] | None = None, read_only: bool = False) -> dict[str, ToolSpec]:
    """The tools a server offers: only these toolsets (None: all), only read-only tools if asked."""
    unknown = sorted(set(toolsets or ()) - set(TOOLSETS))
    if unknown:
        raise ToolError(f"Unknown toolset(s) {', '.join(unknown)}; choose from {', '.join(TOOLSETS)}.")
    return {
        name: spec
        for name, spec in TOOLS.items()
        if (toolsets is None or spec.toolset in toolsets) and (spec.read_only or not read_only)
    }


def get_tool(name: str, tools: dict[str, ToolSpec] = TOOLS) -> ToolSpec:
    try:
        return tools[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, tools, n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else " Run `quanteval tools` to list them."
        raise ToolError(f"Unknown tool '{name}'.{hint}") from None


class ArgumentsError(ToolError):
    """The arguments do not match the tool's input schema (a usage error)."""


def _check_keys(spec: ToolSpec, arguments: dict[str, Any]) -> None:
    """Name an unknown key and the closest valid one (MCP SDKs drop unknown keys silently otherwise)."""
    import difflib

    valid = list(spec.input_model.model_fields)
    for key in arguments:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ArgumentsError(f"{spec.name}: unknown argument '{key}'.{hint} Valid arguments: {', '.join(valid) or 'none'}.")
    for key, value in arguments.items():
        if isinstance(value, str) and "\0" in value:
            raise ArgumentsError(f"{spec.name}: argument '{key}' contains a NUL byte.")


def parse_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> BaseModel:
    """Validate the arguments exactly as given (absent keys stay absent, so "was it given" checks work)."""
    _check_keys(spec, arguments)
    try:
        return spec.input_model.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}" for err in exc.errors()
        )
        raise ArgumentsError(f"Invalid arguments for {spec.name}: {problems}") from None


# A file system refusal is the person's to fix (a read-only mount, another user's directory, a full disk), not a bug.
FILE_SYSTEM_REFUSALS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT})


def call_tool(spec: ToolSpec, request: BaseModel, progress: ProgressFn = no_progress) -> BaseModel:
    """Run one tool on already-validated input."""
    try:
        if spec.wants_progress:
            return spec.function(request, progress=progress)
        return spec.function(request)
    except OSError as exc:
        if exc.errno not in FILE_SYSTEM_REFUSALS or not exc.filename:
            raise
        raise ToolError(f"{spec.name}: {exc.filename}: {exc.strerror}. Use a directory this user can write (or free "
                        "space / fix its permissions) and call again.") from None


def run(spec: ToolSpec, arguments: dict[str, Any], progress: ProgressFn = no_progress, policy: paths.Policy = paths.ANY_PATH) -> BaseModel:
    """Validate the arguments, check their paths, run the tool.

    The CLI and the MCP server both call this, so a failure reads the same on either face.
    Raises ArgumentsError (bad usage) or ToolError (a failure the person can act on).
    """
    request = parse_arguments(spec, arguments)
    paths.check_arguments(spec.name, arguments, policy)
    return call_tool(spec, request, progress)


def result_json(spec: ToolSpec, result: BaseModel) -> tuple[dict[str, Any], str]:
    """The result as JSON data and as compact text, refused past MAX_RESULT_BYTES."""
    data = result.model_dump(mode="json")
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    size = len(text.encode())
    if size > MAX_RESULT_BYTES:
        raise ToolError(
            f"{spec.name}: answer truncated: it is {size} bytes, over the {MAX_RESULT_BYTES}-byte limit. "
            "Narrow the request: a deeper key, fewer lines, a smaller limit or one task."
        )
    return data, text


def internal_error(spec_name: str, exc: BaseException) -> str:
    """What a client learns about a bug: its type, never its message or traceback (they may hold secrets)."""
    return f"{spec_name}: internal error ({type(exc).__name__}); the server log has details (QUANTEVAL_DEBUG=1 on the CLI)."
