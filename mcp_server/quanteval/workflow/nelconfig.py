"""The config tools: build a config, read/set/delete one value, list what is still missing, apply a checkpoint.

One engine-neutral body each: the file layer is quanteval/configfile.py, and what a config of each engine holds is
that engine's (engines/<engine>/config.py), asked through `engines.for_config(doc)` or `engines.by_name(name)`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from quanteval import configfile, engines, envvars
from quanteval.configfile import MISSING, as_round_trip, delete_path, get_path, missing_value_paths, set_path, to_plain
from quanteval.engines import EngineName, load_config
from quanteval.engines.base import ApplyCheckpointInput, ApplyCheckpointOutput
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress
from quanteval.paths import new_file_folder
from quanteval.serving.frameworks import Execution
from quanteval.serving.frameworks import NelDeployment as Deployment

ModelType = Literal["base", "chat_reasoning"]
Export = Literal["none", "mlflow", "wandb"]


# ---------------------------------------------------------------------------
# build_config

class BuildConfigInput(StrictModel):
    engine: EngineName = Field("nel", description=(
        "'nel' (NEL 0.2.6, containers) or 'nel-next' (BYOB .py, skills://NAME, built-ins)."))
    execution: Execution = Field(description="'local' (Docker here) or 'slurm' (a cluster over SSH).")
    deployment: Deployment = Field(
        description="The model server the run starts (NEL 0.2.6's deployment, nel-next's service); 'none': an existing endpoint."
    )
    model_type: ModelType = Field(description="Chat or reasoning model (chat endpoint) or base model (completions).")
    benchmarks: list[str] = Field(
        min_length=1,
        description="nel bundles (general_knowledge, coding, core_reasoning, ...) or nel-next benchmarks (BYOB .py, "
                    "skills://NAME, built-in).",
    )
    export: Export = Field("none", description="Automatic export after the run.")
    config_path: str | None = Field(
        None,
        description="New .yaml file to write (must not exist).",
    )

    @model_validator(mode="after")
    def _engine_takes_these_choices(self) -> BuildConfigInput:
        if problem := engines.by_name(self.engine).config.build_problem(self.deployment, self.model_type, self.benchmarks):
            raise ValueError(problem)
        return self


class BuildConfigOutput(BaseModel):
    config_path: str = Field(description="The config file that was written.")
    tasks: list[str] = Field(description="Task names in evaluation.tasks.")
    missing_values: list[str] = Field(description="Dotted paths still set to ??? — fill them with set_config_value or apply_checkpoint.")


def _output_path(request: BuildConfigInput) -> Path:
    if request.config_path and Path(request.config_path).suffix in (".yaml", ".yml"):
        path = Path(request.config_path).expanduser()
        if path.exists():
            raise ToolError(f"{path}: already exists; build_config never overwrites a file. Choose another output path, or edit this one with set_config_value.")
        new_file_folder(path, "config_path")
        return path
    directory = Path(request.config_path).expanduser() if request.config_path else Path.cwd()
    if directory.exists() and not directory.is_dir():
        raise ToolError(f"{directory}: exists and is not a directory. Give a *.yaml path or a directory as output.")
    directory.mkdir(parents=True, exist_ok=True)
    stem = engines.by_name(request.engine).config.config_stem(request.execution, request.deployment, request.model_type, request.benchmarks)
    candidate, counter = directory / f"{stem}.yaml", 1
    while candidate.exists():  # like NEL: a numbered sibling, never an overwrite
        candidate, counter = directory / f"{stem}_{counter}.yaml", counter + 1
    return candidate


def build_config(request: BuildConfigInput, values: dict[str, Any] | None = None) -> BuildConfigOutput:
    """Use when there is no config yet: writes a new evaluation config, NEL 0.2.6 or nel-next (never overwrites). Then fill its missing_values
    (apply_checkpoint, set_config_value) and validate_config.
    """
    path = _output_path(request)
    doc, tasks = engines.by_name(request.engine).config.skeleton(request.execution, request.deployment, request.model_type,
                                                          request.benchmarks, request.export, path.parent)
    for key, value in (values or {}).items():  # a caller's dotted keys (evaluate's endpoint), set before the one write
        set_path(doc, key, as_round_trip(value))
    try:
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(configfile.dump_config(doc))
    except FileExistsError:
        raise ToolError(f"{path}: already exists; build_config never overwrites a file. Choose another output path.") from None
    return BuildConfigOutput(config_path=str(path.resolve()), tasks=tasks, missing_values=missing_value_paths(doc))


# ---------------------------------------------------------------------------
# get / set / delete

_CONFIG_FIELD = "The config file (.yaml)."
_KEY_FIELD = "Dotted key; tasks by name or index, e.g. evaluation.tasks[ns_gpqa].nemo_evaluator_config.config.params.temperature."


class GetConfigValueInput(StrictModel):
    config_path: str = Field(description=_CONFIG_FIELD)
    key: str = Field(description=_KEY_FIELD)


class GetConfigValueOutput(BaseModel):
    key: str
    value: Any = Field(description="The value as JSON (mappings and lists included).")
    missing: bool = Field(description="True when the value is ??? (must still be filled in).")


def get_config_value(request: GetConfigValueInput) -> GetConfigValueOutput:
    """Use to read a config before changing it: one value or section by dotted key."""
    value = get_path(load_config(request.config_path), request.key)
    return GetConfigValueOutput(key=request.key, value=to_plain(value), missing=value == MISSING)


class SetConfigValueInput(StrictModel):
    config_path: str = Field(description=_CONFIG_FIELD)
    key: str = Field(description="Dotted key, as in get_config_value; missing parents are created.")
    value: Any = Field(
        None,
        description="New value as JSON (objects become mappings). Give value or yaml_value.",
    )
    yaml_value: str | None = Field(
        None,
        description="New value as YAML text instead, e.g. '[a, b]' or '{limit_samples: 10}'.",
    )

    @model_validator(mode="after")
    def _one_value(self) -> SetConfigValueInput:
        if self.yaml_value is not None and "value" in self.model_fields_set:
            raise ValueError("give either value or yaml_value, not both")
        return self


class ConfigEditOutput(BaseModel):
    config_path: str
    key: str
    changed: bool = Field(description="False when the file already held this value.")
    diff: str = Field(description="Unified diff of the file (empty when unchanged).")


def set_config_value(request: SetConfigValueInput) -> ConfigEditOutput:
    """Use to fill a ??? or change a setting: sets one dotted key, keeping comments and order; atomic, returns a diff.
    """
    value = configfile.parse_yaml_value(request.yaml_value) if request.yaml_value is not None else as_round_trip(request.value)
    diff = engines.edit_config(request.config_path, lambda doc: set_path(doc, request.key, value))
    return ConfigEditOutput(config_path=request.config_path, key=request.key, changed=bool(diff), diff=diff)


class DeleteConfigValueInput(StrictModel):
    config_path: str = Field(description=_CONFIG_FIELD)
    key: str = Field(description="Dotted key, as in get_config_value; evaluation.tasks[ns_gpqa] removes that task.")


def delete_config_value(request: DeleteConfigValueInput) -> ConfigEditOutput:
    """Use to drop a task or a stray key: removes one dotted key or list entry; returns a diff."""
    diff = engines.edit_config(request.config_path, lambda doc: delete_path(doc, request.key))
    return ConfigEditOutput(config_path=request.config_path, key=request.key, changed=bool(diff), diff=diff)


# ---------------------------------------------------------------------------
# list_missing_values


class ListMissingValuesInput(StrictModel):
    config_path: str = Field(description=_CONFIG_FIELD)


class UnsetEnvVar(BaseModel):
    name: str = Field(description="Environment variable name (never its value).")
    paths: list[str] = Field(description="Config paths that refer to it, or 'recipe:<name>' when a task recipe needs it.")
    note: str | None = Field(None, description="What the variable is for (from env.example / quanteval's list of known variables).")


class ListMissingValuesOutput(BaseModel):
    config_path: str
    missing_values: list[str] = Field(description="Every dotted path still set to ??? (NEL itself stops at the first).")
    unset_env_vars: list[UnsetEnvVar] = Field(description="Variables the config or its tasks' recipes need that are unset here.")
    complete: bool = Field(description="True when nothing above is left.")


def list_missing_values(request: ListMissingValuesInput) -> ListMissingValuesOutput:
    """Use after build_config/apply_checkpoint: what a config still needs (??? values, unset env vars), names only.
    """
    doc = load_config(request.config_path)
    needed = engines.for_config(doc).config.env_var_needs(doc)
    unset = [
        UnsetEnvVar(name=name, paths=list(dict.fromkeys(paths)), note=envvars.KNOWN_ENV_VARS.get(name))
        for name, paths in needed.items()
        if not os.environ.get(name)
    ]
    missing = missing_value_paths(doc)
    return ListMissingValuesOutput(config_path=request.config_path, missing_values=missing, unset_env_vars=unset, complete=not missing and not unset)


# ---------------------------------------------------------------------------
# apply_checkpoint


def apply_checkpoint(request: ApplyCheckpointInput, progress: ProgressFn = no_progress) -> ApplyCheckpointOutput:
    """Use after add_tasks, and whenever the checkpoint changes: sets what the config takes from it (model, TP, server
    flags, token budget, sampling, thinking, tokenizer).
    """
    return engines.for_config(load_config(request.config_path)).config.apply_checkpoint(request, progress)
