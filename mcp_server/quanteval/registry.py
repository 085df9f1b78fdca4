"""The one list of tools. The MCP server, the CLI and the tests are all generated from it.

A tool is a plain function in its domain module:

    def inspect_checkpoint(request: InspectCheckpointInput, progress: ProgressFn = no_progress) -> CheckpointReport:
        \"\"\"What it does. When to use it.\"\"\"

One pydantic input model, one pydantic output model, the docstring as description,
and an optional `progress` keyword for work that takes more than a second or two.
Registering it here with truthful annotations is all it takes to appear everywhere.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ValidationError

from quanteval import checkpoint, compare, deploy, environment, evalserver, nelconfig, remote, results, runs, tasks, validation
from quanteval.models import ProgressFn, ToolError, no_progress


@dataclass(frozen=True)
class ToolSpec:
    fn: Callable[..., BaseModel]
    read_only: bool
    destructive: bool = False
    idempotent: bool = False
    open_world: bool = False  # talks to something outside this machine's files (hosts, servers, registries)

    @property
    def name(self) -> str:
        return self.fn.__name__

    @cached_property
    def _hints(self) -> dict[str, Any]:
        return typing.get_type_hints(self.fn)

    @property
    def input_model(self) -> type[BaseModel]:
        first_param = next(iter(inspect.signature(self.fn).parameters))
        return self._hints[first_param]

    @property
    def output_model(self) -> type[BaseModel]:
        return self._hints["return"]

    @property
    def description(self) -> str:
        return inspect.getdoc(self.fn) or ""

    @property
    def wants_progress(self) -> bool:
        return "progress" in inspect.signature(self.fn).parameters

    def __hash__(self) -> int:
        return hash(self.name)


def _tools(*specs: ToolSpec) -> dict[str, ToolSpec]:
    by_name: dict[str, ToolSpec] = {}
    for spec in specs:
        if spec.name in by_name:
            raise RuntimeError(f"tool {spec.name} registered twice")
        by_name[spec.name] = spec
    return by_name


TOOLS: dict[str, ToolSpec] = _tools(
    ToolSpec(environment.check_environment, read_only=True, idempotent=True),
    ToolSpec(checkpoint.inspect_checkpoint, read_only=True, idempotent=True),
    ToolSpec(nelconfig.build_config, read_only=False),
    ToolSpec(nelconfig.get_config_value, read_only=True, idempotent=True),
    ToolSpec(nelconfig.set_config_value, read_only=False, destructive=True, idempotent=True),
    ToolSpec(nelconfig.delete_config_value, read_only=False, destructive=True),
    ToolSpec(nelconfig.list_missing_values, read_only=True, idempotent=True),
    ToolSpec(nelconfig.apply_checkpoint, read_only=False, destructive=True, idempotent=True),
    ToolSpec(validation.validate_config, read_only=True, idempotent=True),
    ToolSpec(tasks.list_tasks, read_only=True, idempotent=True),
    ToolSpec(tasks.get_task_recipe, read_only=True, idempotent=True),
    ToolSpec(tasks.add_tasks, read_only=False, idempotent=True),
    ToolSpec(evalserver.start_eval_server, read_only=False),
    ToolSpec(evalserver.eval_server_status, read_only=True, idempotent=True),
    ToolSpec(evalserver.stop_eval_server, read_only=False, destructive=True, idempotent=True),
    ToolSpec(runs.dry_run, read_only=False),
    ToolSpec(runs.launch_canary, read_only=False, open_world=True),
    ToolSpec(runs.launch_full_run, read_only=False, open_world=True),
    ToolSpec(runs.run_status, read_only=False, idempotent=True, open_world=True),
    ToolSpec(runs.run_logs, read_only=True, idempotent=True, open_world=True),
    ToolSpec(runs.kill_run, read_only=False, destructive=True, idempotent=True, open_world=True),
    ToolSpec(runs.resume_run, read_only=False, open_world=True),
    ToolSpec(runs.list_runs, read_only=True, idempotent=True),
    ToolSpec(remote.ssh_check, read_only=False, idempotent=True, open_world=True),  # writes known_hosts only when trusted
    ToolSpec(remote.slurm_queue, read_only=True, idempotent=True, open_world=True),
    ToolSpec(remote.remote_grep, read_only=True, idempotent=True, open_world=True),
    ToolSpec(remote.check_registry_credentials, read_only=True, idempotent=True, open_world=True),
    ToolSpec(results.validate_run, read_only=True, idempotent=True, open_world=True),
    ToolSpec(results.extract_scores, read_only=True, idempotent=True, open_world=True),
    ToolSpec(compare.compare_results, read_only=False, open_world=True),
    ToolSpec(deploy.plan_deployment, read_only=True, idempotent=True),
    ToolSpec(deploy.launch_deployment, read_only=False, open_world=True),
    ToolSpec(deploy.deployment_status, read_only=False, idempotent=True, open_world=True),
    ToolSpec(deploy.stop_deployment, read_only=False, destructive=True, idempotent=True, open_world=True),
)


def get_tool(name: str) -> ToolSpec:
    try:
        return TOOLS[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, TOOLS, n=3)
        hint = f" Did you mean: {', '.join(close)}?" if close else " Run `quanteval tools` to list them."
        raise ToolError(f"Unknown tool '{name}'.{hint}") from None


class ArgumentsError(ToolError):
    """The arguments do not match the tool's input schema (a usage error)."""


def parse_arguments(spec: ToolSpec, arguments: dict[str, Any]) -> BaseModel:
    try:
        return spec.input_model.model_validate(arguments)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}" for err in exc.errors()
        )
        raise ArgumentsError(f"Invalid arguments for {spec.name}: {problems}") from None


def call_tool(spec: ToolSpec, request: BaseModel, progress: ProgressFn = no_progress) -> BaseModel:
    """Run one tool on already-validated input."""
    if spec.wants_progress:
        return spec.fn(request, progress=progress)
    return spec.fn(request)
