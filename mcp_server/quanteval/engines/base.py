"""What every evaluation engine provides, over neutral types the workflow tools speak.

An engine is one package under engines/ (engines/nel: NEL 0.2.6, engines/nel_next: nel-next) holding everything
specific to it: its config's shape and rules, how a run is rendered, launched, watched, stopped and resumed, and how
its results are read. The workflow tools hold one engine-neutral body each and ask `engines.for_config(doc)` or
`engines.for_record(record)` which engine they talk to, then speak to the role they need (config, run, placement;
evaluation where the engine has it); the name an engine goes by is its line in engines.ENGINES, kept in the ledger
record of each run, and never compared as a string in the tools.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, Field
from ruamel.yaml.comments import CommentedMap

from quanteval import configfile, failures, ledger, paths
from quanteval.clusters.executor import JobStatus
from quanteval.failures import Diagnosis
from quanteval.models import ProgressFn, StrictModel, ToolError
from quanteval.serving.frameworks import FRAMEWORKS, NEL_NEXT_SERVICES, one_of

RunKind = Literal[ledger.kinds("run")]  # type: ignore[valid-type]

ACTIVE = ("submitted", "pending", "running", "resuming")
FINISHED = ("succeeded", "failed", "killed")
SCRIPT_HEAD_LINES = 40
MAX_SCRIPTS = 20
MAX_HITS = 100


# ---------------------------------------------------------------- neutral types: what a tool returns


@dataclass(frozen=True)
class Reading:
    """An engine's own reading of a config with overrides, as the engine will run it (its read_launch), in the part
    every engine has: what the launch checks (engines/commands.py) and a kept plan's freshness (launchplan.py) read."""
    resolved: dict[str, Any] | None = None  # composed, overridden, interpolated; None where the engine could not read it
    raw: dict[str, Any] | None = None  # the same before the engine's own interpolation (NEL 0.2.6); None: as resolved
    files_read: list[str] = field(default_factory=list)  # the other files composed in, or that would be if written

    def stats(self) -> tuple[tuple[str, int, int], ...]:
        """file_stats of files_read: a reading older than one of them is not what runs now."""
        return paths.file_stats(self.files_read)


@dataclass(frozen=True)
class LaunchPlan:
    """A launch's config, read once (engines/launchplan.py makes it): what confinement, the launch check, compose and
    launch all work from."""
    config_path: str  # absolute
    overrides: tuple[str, ...]
    doc: dict[str, Any]  # the file as parsed (plain); never mutated
    engine: Engine
    reading: Reading = field(default_factory=Reading)  # each engine's own kind of it (NelReading, NextReading)
    read_stats: tuple[tuple[str, int, int], ...] = ()  # those files as they were when read: an edit reads afresh

    @property
    def override_list(self) -> list[str]:
        return list(self.overrides)


class RenderedScript(BaseModel):
    name: str = Field(description="Script name relative to the invocation directory, e.g. 'gpqa.0/run.sh'.")
    path: str | None = Field(description="Where it lies on disk (null for SLURM, whose scripts NEL renders in a temp dir).")
    size_bytes: int
    head: list[str] = Field(description=f"The first {SCRIPT_HEAD_LINES} lines, secret values masked.")
    launch_commands: list[str] = Field(default_factory=list, description=(
        "Every server and client launch in the script in full (srun, docker run, the server command), continuation "
        "lines joined, secret values masked, base64 payloads shown by size."))


class NelWarning(BaseModel):
    task: str | None = Field(description="The task NEL warned about (its parameter check), or null for the run as a whole.")
    message: str


class DryRunOutput(BaseModel):
    ok: bool = Field(description="NEL accepted the config and rendered every script.")
    record_id: str = Field(description="Ledger record of this dry-run.")
    config_hash: str | None
    executor: str | None
    invocation_id: str | None
    invocation_dir: str | None = Field(description="Local directory NEL rendered into (local executor).")
    scripts: list[RenderedScript]
    nel_warnings: list[NelWarning] = Field(default_factory=list, description=(
        "What NEL warned about while composing and rendering (parameters a task's command never reads, pre_cmd, ...): "
        "review each; validate_config does not repeat NEL's own checks."))
    secrets_files_protected: list[str] = Field(
        description=".secrets.env files NEL wrote with real values, now mode 600. Their values are never returned.")
    error: str | None = Field(description="NEL's error message when ok is false (no traceback).")


class LaunchOutput(BaseModel):
    record_id: str = Field(description="Ledger record id; run_status, run_logs, kill_run and resume_run take it.")
    kind: RunKind
    invocation_id: str = Field(description="NEL's invocation id (also accepted by `nel status`).")
    config_hash: str
    executor: str
    host: str | None
    status: str
    gate: str | None = Field(None, description="Why a full run was allowed: the canary that passed, or the forced reason.")
    notes: list[str] = Field(default_factory=list, description="What the canary runs differently from the full run (repeats).")


class LogTail(BaseModel):
    job_id: str
    file: str
    lines: list[str]


class FailureHit(BaseModel):
    failure_class: str = Field(description=f"One of: {', '.join(failures.FAILURE_ADVICE)}.")
    file: str
    line: int
    text: str


class RunLogsOutput(BaseModel):
    record_id: str
    invocation_id: str | None
    tails: list[LogTail]
    failures: list[FailureHit] = Field(description="Lines matching a known failure class anywhere in the logs, with file:line "
                                       "(the job script's own `+ ...` echoes are not failures).")
    failures_truncated: bool
    failure_classes: list[str] = Field(description="The distinct failure classes found, most specific first.")
    diagnosis: Diagnosis | None = Field(description=(
        "For a failed run: the most specific failure with its line and the usual fix, or 'unclassified' with the last "
        "meaningful log lines. Null while the run has not failed."))


class KillRunOutput(BaseModel):
    record_id: str
    status: str
    jobs: list[JobStatus] = Field(description="What NEL did per job: killed, or why it could not.")


class ResumeRunOutput(BaseModel):
    record_id: str
    invocation_id: str
    status: str


class Refreshed(BaseModel):
    """A run's state as its executor reports it now, already recorded in the ledger."""
    record: ledger.Record
    jobs: list[JobStatus]
    reachable: bool = Field(description="False when the cluster could not be asked; the record keeps its last status.")
    message: str | None
    progress: str | None = None  # an evaluation (start_evaluation): its last progress line
    result: dict[str, Any] | None = None  # an evaluation that succeeded: evaluate_quantization's answer


class Composed(BaseModel):
    """A config as its engine composes it for a launch: the hash canaries and full runs share, and its tasks."""
    config_hash: str
    tasks: list[str]


class CanarySpec(BaseModel):
    """What makes a launch a canary: a few problems per task, and fewer repeats (None: the config's)."""
    limit: int
    repeats: int | None


def overall_status(job_states: list[str]) -> str:
    """One status for a run from its jobs': anything still moving wins, then the worst ending."""
    for state in ("running", "resuming", "pending"):
        if state in job_states:
            return state
    for state in ("failed", "killed", "unknown"):
        if state in job_states:
            return state
    return "succeeded" if job_states else "unknown"


# ---------------------------------------------------------------- neutral types: config files


Severity = Literal["error", "warning"]


class Problem(BaseModel):
    """One finding of validate_config: the key, how bad, which rule, and the fix."""
    key: str = Field(description="Dotted path of the offending key (tasks by name), or the override / flag concerned.")
    severity: Severity = Field(description="error: NEL or the server will fail or silently do the wrong thing; warning: worth a look.")
    rule: str = Field(description="Short rule id, e.g. missing_value, unknown_key, unknown_task, wrong_framework_flag.")
    message: str
    fix: str = Field(description="What to change, concretely.")


class ApplyCheckpointInput(StrictModel):
    config_path: str = Field(description=f"Config deploying with {one_of(FRAMEWORKS)} (nel-next: one {one_of([*NEL_NEXT_SERVICES, 'api'])} service).")
    checkpoint: str = Field(description="Checkpoint directory, or HF handle (org/name) in the local cache.")
    served_model_name: str | None = Field(None, description="Default: the HF handle or checkpoint folder name.")
    tensor_parallel_size: int | None = Field(
        None, ge=1, description="GPUs per replica. Default: smallest fit on H100."
    )
    cluster_checkpoint_path: str | None = Field(
        None,
        description="Checkpoint path where the job runs, if not this copy's.",
    )


class ApplyCheckpointOutput(BaseModel):
    config_path: str
    changes: list[str] = Field(description="One line per key written or removed, with why: `key: old -> new (why)`.")
    diff: str = Field(description="Unified diff of the config file.")
    missing_values: list[str] = Field(description="Paths still set to ??? afterwards.")
    notes: list[str] = Field(description="Checkpoint warnings, framework notes and the defaults taken from the checkpoint, each once.")


# The deployment's parallelism: GPUs a model server takes = their product (NEL 0.2.6's deployment keys).
PARALLEL_KEYS = ("tensor_parallel_size", "data_parallel_size", "pipeline_parallel_size")


def config_check(owns: Callable[[Any], bool]) -> configfile.Check:
    """A configfile.Check that refuses YAML `owns` does not accept, so config tools never read or rewrite other files."""
    def check(doc: CommentedMap, path: Path) -> None:
        if path.suffix not in (".yaml", ".yml") or (doc and not owns(doc)):
            raise ToolError(
                f"{path}: not an evaluation config (a .yaml/.yml file with NEL 0.2.6 sections execution:, deployment:, "
                "evaluation: or nel-next sections services:, benchmarks:, cluster:). Create one with build_config."
            )
    return check


_HOST_REF = re.compile(r"^host:([A-Za-z_][A-Za-z0-9_]*)$")
_OC_ENV_REF = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(,[^}]*)?\}")


def env_references(doc: Any) -> list[tuple[str, str]]:
    """(path, variable name) for every `host:VAR` value and every `${oc.env:VAR}` without a default, anywhere in a
    config: what a run reads from the host's environment, in either engine's config."""
    references = []
    for path, value in configfile.walk(doc):
        if not isinstance(value, str):
            continue
        host = _HOST_REF.match(value.strip())
        if host:
            references.append((path, host.group(1)))
        references += [(path, match.group(1)) for match in _OC_ENV_REF.finditer(value) if not match.group(2)]
    return references


def unpinned_image(image: Any) -> bool:
    """A container image that names no fixed build: tagged `latest`, or with neither tag nor digest (Docker reads it
    as `latest`). A digest (@sha256:...), a local image file (.sqsh) or an unresolved value is not flagged."""
    if not isinstance(image, str) or not image.strip() or image == configfile.MISSING or "${" in image:
        return False
    image = image.strip()
    if "@" in image or image.startswith(("/", "./", "../", "~")) or image.endswith(".sqsh"):
        return False
    name = image.rsplit("/", 1)[-1]  # a registry port (host:5000/...) is not a tag
    return ":" not in name or name.split(":", 1)[1] in ("", "latest")


def unpinned_image_problem(path: str, image: str, inherited: str = "") -> Problem:
    repository = image.strip().removesuffix(":").removesuffix(":latest")
    return Problem(key=path, severity="warning", rule="unpinned_image", message=(
        f"'{image}'{inherited} is not pinned (tag latest or no tag): it can change between the baseline and the quantized "
        "run, which then compare different builds."),
        fix=f"Pin it: {repository}:<version> (the tag the model card recommends) or {repository}@sha256:<digest>.")


def referenced_env_vars(doc: Any) -> dict[str, list[str]]:
    """Environment variables a config reads from the host, with the keys that read each: its `host:` and `${oc.env:}`
    references (env_references), which read the same in every engine's config."""
    needed: dict[str, list[str]] = {}
    for path, name in env_references(doc):
        needed.setdefault(name, []).append(path)
    return needed


# ---------------------------------------------------------------- the interface: one role per kind of caller
#
# An engine is an Engine (engines/<engine>/engine.py) whose roles are modules that define or import the role's members
# (a function takes what a method takes after self). No role has defaults: a module states each member, so what an
# engine does is read in its own package. tests/test_engines.py checks every registered engine's roles, parameters too.


class ConfigRole(Protocol):
    """What the config tools ask (build_config, validate_config, apply_checkpoint, add_tasks, the command checks)."""

    # Keys whose string values the engine writes unquoted into the shell script it runs (fnmatch on dotted keys):
    # shell syntax there runs as a command (engines/commands.py).
    shell_spliced: tuple[str, ...]
    # Keys holding the arguments of a model server the engine starts as a process of this machine (not in a container):
    # a flag there that imports Python (--trust-remote-code) runs code here, as a command does (engines/commands.py).
    host_server_args: tuple[str, ...]

    def owns(self, doc: Any) -> bool:
        """Is this parsed config written for this engine (by its sections)?"""

    def build_problem(self, deployment: str, model_type: str, benchmarks: list[str]) -> str | None:
        """Why build_config cannot write this engine's config from these choices, or None."""

    def config_stem(self, execution: str, deployment: str, model_type: str, benchmarks: list[str]) -> str:
        """The file name (no suffix) build_config gives a new config of this engine."""

    def skeleton(self, execution: str, deployment: str, model_type: str, benchmarks: list[str], export: str,
                 directory: Path) -> tuple[CommentedMap, list[str]]:
        """A new config (its ??? values still to fill) and the tasks it runs; `directory` is where it is written."""

    def apply_checkpoint(self, request: ApplyCheckpointInput, progress: ProgressFn) -> ApplyCheckpointOutput:
        """Write into the config what it takes from the checkpoint (model, TP, server flags, budget, sampling, ...)."""

    def validate(self, doc: dict[str, Any], config_path: Path, overrides: list[str], check_env: bool) -> list[Problem]:
        """Every problem in a parsed config: the engine's schema and rules, and the chain rules on top."""

    def env_var_needs(self, doc: Any) -> dict[str, list[str]]:
        """Environment variables the config (or its tasks' recipes) reads from the host, with the keys that read each
        (referenced_env_vars: its `host:` and `${oc.env:}` references)."""

    def execution_type(self, doc: Any) -> str:
        """Where the config runs: local or slurm (or another executor the engine knows)."""

    def deployment_type(self, doc: Any) -> str:
        """The model server the engine starts (vllm, sglang, ...), or none for an existing endpoint."""

    def command_presets(self, doc: Any) -> dict[str, str]:
        """The engine's own command values for this config (key -> value), not named as the user's commands."""

    def config_tasks(self, doc: Any) -> list[tuple[str, Any]]:
        """(dotted path, entry) for each task in the config's own task list (NEL 0.2.6: evaluation.tasks, which
        convert_config reads); none where the engine keeps no such list."""

    def task_keys(self, doc: CommentedMap, clear: bool) -> set[str]:
        """add_tasks: the catalogue tasks (qualified NEL names) the config evaluates; with clear, its tasks are removed
        first (add_tasks' replace) and none are."""

    def add_task(self, doc: CommentedMap, qualified_name: str, fragment: dict[str, Any], repeats: int | None) -> str:
        """add_tasks: one catalogue task (its qualified NEL name, and its recipe's or NEL's default evaluation.tasks
        item) appended to the config's own list in this engine's form; returns the name written. ToolError (why) where
        the engine has no form of it."""


class RunRole(Protocol):
    """What the run tools ask (dry_run, launch_canary / launch_full_run, run_status, run_logs, kill_run, resume_run,
    wait_for_run) and confinement (`quanteval-mcp --root`, workflow/confine.py)."""

    # The programs the engine runs on this machine for a run on each executor (by its name) besides itself, where a
    # launch without one fails with a bare Errno 2: check_environment lists NEL 0.2.6's.
    local_programs: dict[str, tuple[str, ...]]

    def read_launch(self, config_path: str, overrides: list[str]) -> Reading:
        """The engine's own reading of a config with overrides, made once per launch and kept in its LaunchPlan
        (engines/launchplan.py) for the steps below."""

    def dry_run(self, plan: LaunchPlan, progress: ProgressFn) -> DryRunOutput:
        """Render the config as a launch would, record the dry-run, launch nothing."""

    def compose(self, plan: LaunchPlan) -> Composed:
        """The config's hash and tasks as the engine composes them (what the canary gate matches on)."""

    def check_launchable(self, plan: LaunchPlan) -> None:
        """Refuse, before anything starts, a launch this machine cannot make (a missing binary, a rejected schema)."""

    def launch(self, record: ledger.Record, plan: LaunchPlan, tasks: list[str], canary: CanarySpec | None, details: dict,
               progress: ProgressFn) -> LaunchOutput:
        """Start the canary (with `canary`) or full run the workflow has just recorded (`record`, status launching)
        and record in it what started or why nothing did; returns at once."""

    def refresh(self, record: ledger.Record) -> Refreshed:
        """Ask the executor for the run's state and record a change."""

    def logs(self, record: ledger.Record, lines: int, job_id: str | None, progress: ProgressFn) -> RunLogsOutput:
        """Each log's tail (only job_id's, where given), failure lines, and for a failed run a diagnosis."""

    def kill(self, record: ledger.Record, progress: ProgressFn) -> KillRunOutput:
        """Stop every job of the run (auto-resume successors too) and record it killed."""

    def resume(self, record: ledger.Record, progress: ProgressFn) -> ResumeRunOutput:
        """Start a killed or failed run again where it stopped."""

    def poll_interval_s(self, record: ledger.Record) -> float:
        """How often wait_for_run looks: a local run is cheap to ask, a cluster costs an ssh round trip."""

    def results_location(self, record: ledger.Record) -> str:
        """Where validate_run and the result tools find the run's results (a path, host:path, or the record id, which
        the engine's results reader reads, fetching the run from a cluster)."""

    def launch_paths(self, plan: LaunchPlan) -> list[tuple[str, Path]]:
        """(key, absolute path) for every local path a run of the plan's config on this machine writes,
        mounts, loads or runs, read as the engine reads the config (its composition, overrides and interpolation); a
        ToolError where a path cannot be resolved; none for a run elsewhere. `quanteval-mcp --root` confines them."""

    def record_paths(self, record: ledger.Record, resuming: bool) -> list[tuple[str, Path]]:
        """(what, absolute path) for every local file or directory the run tools read or run for this record (its
        config, run directory, logs; with `resuming`, all that resume_run starts again); none for a run elsewhere."""


class PlacementRole(Protocol):
    """What apply_cluster asks: it reads and writes NEL 0.2.6's execution/deployment keys, the neutral form."""

    # The config's own keys are the placement view's (NEL 0.2.6's execution/deployment keys): engines.placement_form.
    native: bool
    # apply_cluster writes a host passed to it into the config (the engine submits to the host its config names).
    writes_host: bool

    def view(self, doc: Any) -> Any:
        """The config seen as NEL 0.2.6's `execution` (SLURM cluster) and `deployment` (server, parallelism) keys."""

    def defaults(self, doc: Any) -> dict[str, Any]:
        """What a placement view's unset keys stand for (deployment.tensor_parallel_size and the other parallel
        sizes, execution.walltime), by dotted key: the parallel sizes are asked of the engine whose keys the view uses
        (engines.placement_form), the walltime of the config's own engine (its scheduler default)."""

    def key(self, key: str) -> str:
        """Where this engine's config keeps a placement key written in NEL 0.2.6's form (execution.partition, ...)."""

    def edits(self, values: dict[str, Any]) -> dict[str, Any]:
        """The keys and values apply_cluster writes into this engine's config for a placement's `values`."""


class Evaluation(Protocol):
    """The capability evaluate_quantization (workflow/evaluate.py) and get_task_recipe's nel_next form need: evaluating
    a served model in one call. Optional: the registry picks the engine that has it (engines.evaluating)."""

    def task_form(self, qualified_name: str, repeats: int = 1) -> tuple[dict[str, Any] | None, str]:
        """The entry this engine's config holds for a catalogue task (its qualified NEL name) with a recipe's repeats,
        or None; and what it scores, or why there is none."""

    def benchmark_sizes(self, benchmarks: list[str]) -> dict[str, int]:
        """Problems per benchmark where the engine can count them before anything is served (evaluate_quantization
        says up front what they can decide); the others are left out."""

    def evaluation_problems(self, benchmarks: list[str]) -> list[Problem]:
        """What stops a run of these benchmarks (as build_config takes them) before anything is served; a ToolError
        where the engine cannot run here at all."""

    def benchmark_names(self, benchmarks: list[str]) -> list[str] | None:
        """The names a run of these benchmarks (as build_config takes them) reports its results by (what
        reference_scores are keyed by); None where the engine cannot tell before it runs them."""

    def served_facts(self, url: str) -> dict[str, Any] | None:
        """What the server behind an endpoint says it serves (its /v1/models entry: id, root, max_model_len), as the
        engine's run facts keep it; None when it does not answer."""

    def endpoint_values(self, url: str, protocol: str, model: str | None, max_tokens: int, output_dir: str,
                        benchmarks: int, max_problems: int | None, repeats: int = 1,
                        sampling: dict[str, float] | None = None) -> dict[str, Any]:
        """The keys and values set_config_value writes into a config built for an existing endpoint (build_config's
        deployment none) to evaluate the model served there: its URL for the protocol (chat_completions or
        completions), its name, the generation budget, where runs write, and a problem limit for each of the config's
        `benchmarks` (max_problems None: all), the samples per problem (`repeats`) and the sampling (temperature,
        top_p: those given; the others stay the config's)."""

    def serve_in_job(self, values: dict[str, Any], model_path: str, served_model_name: str, port: int,
                     command: list[str], startup_timeout_s: float, placement: dict[str, Any]) -> dict[str, Any]:
        """endpoint_values' keys turned into a config whose run serves the model itself inside its own cluster job
        (evaluate_quantization on SLURM): the server's `command` (argv) at `port` on the job's node, with the job's
        `placement` (hostname, account, walltime, partition, gres, path: the PATH the job gets)."""

    def failed_benchmarks(self, run_dir: Path) -> dict[str, str]:
        """The benchmarks the engine itself recorded as failed in a run's directory, with its error for each."""

    def read_run_facts(self, run_dir: Path) -> dict[str, Any] | None:
        """What quanteval recorded beside a run (the config as read, checkpoint, what was served and how), or None."""

    def write_run_facts(self, run_dir: Path, facts: dict[str, Any]) -> None:
        """Record these facts beside the run (in place of any there), where compare_results and validate_run read them."""

    def responses(self, run_dir: Path, limit: int) -> list[dict[str, Any]]:
        """A run's first answers (problem_idx, expected, response: at most 300 characters), at most `limit` in all."""


@dataclass(frozen=True)
class Engine:
    """One evaluation engine, declared in engines/<engine>/engine.py and listed in engines/__init__.py's ENGINES."""
    name: str  # its line's name in ENGINES, kept in each run's record
    config: ConfigRole
    run: RunRole
    placement: PlacementRole
    evaluation: Evaluation | None = None  # only an engine that evaluates a served model in one call has it
