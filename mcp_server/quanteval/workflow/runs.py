"""The run lifecycle: dry-run, canary, gated full run, status, logs, kill, resume, list.

Every NEL call runs in a child process (quanteval.engines.nel.nelexec) with a timeout, so NEL's
prints never reach the MCP stdout and a dead host never hangs a tool. Every dry-run,
canary and full run is recorded in the ledger with a hash of its composed config; the
hash ignores the canary's own limit override, so a canary and the full run of the same
config share it — that is what the full-run gate checks.

SLURM status is read from the cluster directly (one ssh call: the job chain file NEL's
auto-resume writes, `squeue -t all`, and `sacct`/`sacct -c` for purged jobs) because NEL
reports every ssh or sacct hiccup as FAILED; a walltime TIMEOUT with NEL's paired
restart job queued is reported as `resuming`, never as a failure.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import stat
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from quanteval import envvars, failures, ledger
from quanteval.clusters import remote
from quanteval.engines import engine_of
from quanteval.engines.nel import nelexec
from quanteval.engines.nel_next import nelnext, nextresults
from quanteval.failures import Diagnosis
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress
from quanteval.workflow import results

LIMIT_SAMPLES_OVERRIDE = "++evaluation.nemo_evaluator_config.config.params.limit_samples={}"
DRY_RUN_TIMEOUT_S = 180.0
LAUNCH_TIMEOUT_S = 600.0
QUERY_TIMEOUT_S = 120.0
SSH_TIMEOUT_S = 60.0
SCRIPT_HEAD_LINES = 40
MAX_SCRIPTS = 20
MAX_HITS = 100

ACTIVE = ("submitted", "pending", "running", "resuming")
FINISHED = ("succeeded", "failed", "killed")
RunKind = Literal["dry_run", "canary", "full_run"]

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD")
# Shell lines that carry secret values (NEL's `set -x` echoes its re-exports into the SLURM log).
SECRET_ASSIGNMENT = re.compile(r"((?:export\s+'?)\w+=|\w*(?:KEY|TOKEN|SECRET|PASSWORD)\w*=)(\"[^\"]*\"|'[^']*'|\S+)",
                               re.IGNORECASE)


# ---------------------------------------------------------------- shared helpers


def _secret_values(secrets_files: list[Path]) -> set[str]:
    """Values that must never appear in a result: known env vars that are set, and what NEL wrote to .secrets.env."""
    values = {value for name in envvars.set_env_var_names() if SECRET_NAME.search(name)
              and len(value := os.environ[name]) >= 4}
    for path in secrets_files:
        for line in path.read_text(errors="replace").splitlines():
            _, _, value = line.partition("=")
            value = value.strip().strip("'\"")
            if len(value) >= 4:
                values.add(value)
    return values


def _scrub(text: str, secrets: set[str]) -> str:
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, "***")
    return SECRET_ASSIGNMENT.sub(lambda match: f"{match.group(1)}***", text)


def _protect_secrets_files(root: Path) -> list[Path]:
    """chmod 600 every .secrets.env NEL left under root (it writes them 644 with real values)."""
    files = sorted(root.rglob(".secrets.env")) if root.is_dir() else []
    for path in files:
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    return files


def _config_file(config_path: str) -> str:
    path = Path(config_path).expanduser()
    if not path.is_file():
        raise ToolError(f"{config_path}: no such config file. Create one with build_config, or pass the right path.")
    return str(path.resolve())


def _nel(op: str, timeout: float, **args: object) -> dict:
    answer = nelexec.call(op, timeout, **args)
    if not answer.get("ok"):
        raise ToolError(f"NEL: {_scrub(answer.get('error', 'unknown error'), _secret_values([]))}")
    return answer


class _Unreachable(Exception):
    """The cluster could not be asked (ssh failed or slurmctld did not answer); nothing is known about the job."""


def _login(data: dict) -> str:
    """The cluster login NEL recorded for a job, as the cluster-access layer names it (user@alias)."""
    return f"{data['username']}@{data['hostname']}"


def _on_cluster(data: dict, command: str, timeout: float = SSH_TIMEOUT_S) -> str:
    """Run a command on a job's cluster login node over quanteval's pooled SSH connection; stdout comes back."""
    try:
        return remote.run_remote(_login(data), command, timeout=timeout).stdout
    except ToolError as exc:
        raise _Unreachable(f"ssh {data['hostname']} failed: {exc}") from None


# ---------------------------------------------------------------- config_hash


def config_hash(path: str, overrides: list[str] | None = None) -> str:
    """Hash of the config as NEL composes it (defaults + file + overrides), env values not resolved."""
    return _nel("hash", QUERY_TIMEOUT_S, config_path=_config_file(path), overrides=overrides or [])["config_hash"]


# ---------------------------------------------------------------- dry_run


class DryRunInput(StrictModel):
    config_path: str = Field(description="The NEL config file (.yaml).")
    overrides: list[str] = Field(default_factory=list, description=(
        "Overrides as for `nel run -o`; a new key needs '++'."))


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


# The commands that start servers and evaluation clients in NEL's scripts (SLURM and local executors).
LAUNCH_COMMAND = re.compile(r"^(srun|docker run|vllm serve|python3? -m sglang\.launch_server|trtllm-serve|nel eval run)\s")
BASE64_PAYLOAD = re.compile(r"[A-Za-z0-9+/]{100,}={0,2}")
SHOWN_PAYLOAD_CHARS = 1000
MAX_LAUNCH_COMMANDS, MAX_LAUNCH_CHARS = 6, 4000


def _shown_payload(match: re.Match) -> str:
    """A short base64 payload (the server command NEL encodes on SLURM) decoded; a long one (the eval config) by size."""
    try:
        decoded = base64.b64decode(match.group(), validate=True).decode()
    except ValueError:
        return match.group()
    if len(decoded) <= SHOWN_PAYLOAD_CHARS:
        return f"<base64 of: {decoded.strip()}>"
    return f"<base64, {len(match.group())} chars>"


def launch_commands(script: str, secrets: set[str]) -> list[str]:
    """The script's launch commands, each whole: shell continuation lines joined, a quoted `bash -c` body kept with its
    command, long base64 payloads (the encoded eval config) replaced by their size, secrets masked. Helper lines
    (hostname lookups with srun) are left out."""
    logical: list[str] = []
    pending = ""
    for line in script.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1].strip() + " "
            continue
        logical.append(pending + line.strip())
        pending = ""
    found = []
    lines = iter(logical)
    for command in lines:
        if not LAUNCH_COMMAND.match(command) or "hostname --ip-address" in command:
            continue
        while command.count("'") % 2:  # a quoted `bash -c '...'` body goes on over the next lines
            following = next(lines, None)
            if following is None:
                break
            command += "\n" + following
        command = _scrub(BASE64_PAYLOAD.sub(_shown_payload, command), secrets)
        found.append(command if len(command) <= MAX_LAUNCH_CHARS else command[:MAX_LAUNCH_CHARS] + " …")
    return found[:MAX_LAUNCH_COMMANDS]


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


def _split_printed_scripts(printed: str) -> list[tuple[str, str]]:
    """SLURM dry-run scripts exist only in NEL's printout: sections headed '=== Task N ==='."""
    sections = re.split(r"=+ Task (\d+) =+\n", printed)
    scripts = []
    for index, body in zip(sections[1::2], sections[2::2], strict=True):
        body = re.split(r"\n-+ Secrets \(redacted\)|\nTo submit jobs", body)[0].strip("\n")
        scripts.append((f"task{index}/run.sub", body + "\n"))
    return scripts


def dry_run(request: DryRunInput, progress: ProgressFn = no_progress) -> DryRunOutput:
    """Use after validate_config, before launch_canary: NEL's own dry-run: ok, the rendered scripts (secrets masked) and
    NEL's error.
    """
    config_path = _config_file(request.config_path)
    if _engine(config_path) == "nel-next":
        return _next_dry_run(config_path, request.overrides)
    progress(0, 2, "NEL dry-run (composes the config and renders the scripts, ~5 s)")
    answer = nelexec.call("run", DRY_RUN_TIMEOUT_S, config_path=config_path, overrides=request.overrides,
                          extra_overrides=[], tasks=[], dry_run=True)
    progress(1, 2, "collecting rendered scripts")
    invocation_id = answer.get("invocation_id")
    invocation_dir: Path | None = None
    protected: list[Path] = []
    scripts: list[tuple[str, Path | None, str]] = []
    if answer.get("ok") and answer.get("executor") == "local":
        candidates = sorted(Path(answer["output_dir"]).expanduser().absolute().glob(f"*-{invocation_id}"))
        invocation_dir = candidates[-1] if candidates else None
        if invocation_dir:
            protected = _protect_secrets_files(invocation_dir)
            for path in sorted([*invocation_dir.glob("*.sh"), *invocation_dir.glob("*/run.sh")]):
                scripts.append((str(path.relative_to(invocation_dir)), path, path.read_text(errors="replace")))
    elif answer.get("ok"):
        scripts = [(name, None, body) for name, body in _split_printed_scripts(answer.get("printed", ""))]
    secrets = _secret_values(protected)
    rendered = [RenderedScript(name=name, path=str(path) if path else None, size_bytes=len(body.encode()),
                               head=_scrub("\n".join(body.splitlines()[:SCRIPT_HEAD_LINES]), secrets).splitlines(),
                               launch_commands=launch_commands(body, secrets))
                for name, path, body in scripts[:MAX_SCRIPTS]]
    warnings = [NelWarning(task=w.get("task"), message=_scrub(w["message"], secrets)) for w in answer.get("warnings") or []]
    error = None if answer.get("ok") else _scrub(answer.get("error", ""), secrets)
    record = ledger.add("dry_run", status="passed" if answer.get("ok") else "failed", config_path=config_path,
                        config_hash=answer.get("config_hash"), invocation_id=invocation_id,
                        executor=answer.get("executor"), host=answer.get("host"),
                        details={"invocation_dir": str(invocation_dir) if invocation_dir else None, "error": error,
                                 "overrides": request.overrides}, message=error)
    progress(2, 2, "done")
    return DryRunOutput(ok=bool(answer.get("ok")), record_id=record.id, config_hash=answer.get("config_hash"),
                        executor=answer.get("executor"), invocation_id=invocation_id,
                        invocation_dir=str(invocation_dir) if invocation_dir else None, scripts=rendered, nel_warnings=warnings,
                        secrets_files_protected=[str(path) for path in protected], error=error)


# ---------------------------------------------------------------- launches


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


def _check_local_prerequisites(config_path: str) -> None:
    """Refuse a SLURM launch before NEL runs when this machine lacks ssh or rsync (NEL fails with a bare Errno 2)."""
    from quanteval.workflow import environment, nelconfig

    executor = nelconfig.execution_type(nelconfig.to_plain(nelconfig.load_config(config_path)))
    problem = environment.missing_binaries_message(executor) if executor == "slurm" else None
    if problem:
        raise ToolError(f"{config_path}: not launched. {problem} Then launch again (check_environment lists them).")


def _launch(kind: RunKind, config_path: str, overrides: list[str], extra_overrides: list[str], tasks: list[str],
            details: dict, progress: ProgressFn) -> tuple[ledger.Record, dict]:
    progress(1, 3, f"submitting the {kind.replace('_', ' ')} through NEL")
    answer = nelexec.call("run", LAUNCH_TIMEOUT_S, config_path=config_path, overrides=overrides,
                          extra_overrides=extra_overrides, tasks=tasks, dry_run=False)
    secrets = _secret_values([])
    if not answer.get("ok"):
        error = _scrub(answer.get("error", "unknown error"), secrets)
        ledger.add(kind, status="failed", config_path=config_path, config_hash=answer.get("config_hash"),
                   executor=answer.get("executor"), host=answer.get("host"),
                   details={**details, "error": error, "overrides": overrides}, message=f"launch failed: {error}")
        raise ToolError(f"NEL could not launch the {kind.replace('_', ' ')}: {error}")
    progress(2, 3, "recording the run")
    if answer["executor"] == "local":
        _protect_secrets_files(Path(answer["output_dir"]).expanduser().absolute())
    record = ledger.add(kind, status="submitted", config_path=config_path, config_hash=answer["config_hash"],
                        invocation_id=answer["invocation_id"], executor=answer["executor"], host=answer.get("host"),
                        details={**details, "overrides": overrides, "tasks": tasks or answer.get("tasks", [])},
                        message="submitted through NEL")
    if answer["executor"] == "slurm":
        _protect_remote_secrets(record)
    progress(3, 3, f"submitted as {answer['invocation_id']}")
    return record, answer


def _protect_remote_secrets(record: ledger.Record) -> None:
    """NEL rsyncs .secrets.env to the cluster mode 644; make them private there too."""
    try:
        for job in _jobs(record):
            data = job["data"]
            _on_cluster(data, f"chmod 600 {shlex.quote(data['remote_rundir_path'])}/.secrets.env 2>/dev/null; true")
    except (_Unreachable, ToolError) as exc:
        ledger.update(record.id, message=f"could not chmod the remote .secrets.env: {exc}")


class LaunchCanaryInput(StrictModel):
    config_path: str = Field(description="The NEL config (the full run uses the same).")
    limit_samples: int = Field(10, ge=1, le=100000, description="Samples per task.")
    tasks: list[str] = Field(default_factory=list, description=(
        "Only these tasks of the config; empty = all."))
    overrides: list[str] = Field(default_factory=list, description=(
        "Overrides as for `nel run -o` (new key: '++'); give launch_full_run the same ones."))
    repeats: int | None = Field(1, ge=1, le=1000, description=(
        "Repeats per sample where the config repeats (num_repeats, n_samples); null: the config's, as in the full run."))


REPEAT_OVERRIDE = "++{prefix}.nemo_evaluator_config.config.params.extra.{key}={value}"


def _repeat_overrides(config_path: str, repeats: int) -> tuple[list[str], list[str]]:
    """Overrides that run every repeated task `repeats` times, and a note per task changed.

    Repeats live in params.extra (num_repeats for NeMo-Skills, n_samples for simple-evals) of a task or of the
    evaluation-wide nemo_evaluator_config; a task's own value wins over the global one, so each is overridden where
    the config sets it, by list index (task names may hold dots, which NEL's task-name override sugar cannot take).
    """
    from quanteval.workflow import nelconfig

    evaluation = nelconfig.to_plain(nelconfig.load_config(config_path)).get("evaluation")
    evaluation = evaluation if isinstance(evaluation, dict) else {}
    task_list = evaluation.get("tasks") if isinstance(evaluation.get("tasks"), list) else []
    places = [("evaluation", "every task", evaluation)]
    places += [(f"evaluation.tasks.{index}", str(task.get("name")), task) for index, task in enumerate(task_list)
               if isinstance(task, dict)]
    overrides, notes = [], []
    for prefix, name, node in places:
        params = ((node.get("nemo_evaluator_config") or {}).get("config") or {}).get("params") or {}
        extra = params.get("extra") or {}
        for key in results.REPEAT_KEYS:
            value = extra.get(key)
            if isinstance(value, int) and value != repeats:
                overrides.append(REPEAT_OVERRIDE.format(prefix=prefix, key=key, value=repeats))
                notes.append(f"{name}: the canary runs {key}={repeats} (config: {value}); the full run uses {value}.")
    return overrides, notes


def launch_canary(request: LaunchCanaryInput, progress: ProgressFn = no_progress) -> LaunchOutput:
    """Use after a passing dry_run: launches a small canary (limit_samples per task) and returns its record_id at once;
    launch_full_run needs it to pass. Poll with wait_for_run.
    """
    config_path = _config_file(request.config_path)
    if _engine(config_path) == "nel-next":
        return _next_launch("canary", config_path, request.overrides, request.limit_samples, request.repeats, {}, progress)
    _check_local_prerequisites(config_path)
    progress(0, 3, "composing the config")
    repeat_overrides, notes = _repeat_overrides(config_path, request.repeats) if request.repeats else ([], [])
    record, answer = _launch("canary", config_path, request.overrides,
                             [LIMIT_SAMPLES_OVERRIDE.format(request.limit_samples), *repeat_overrides], request.tasks,
                             {"limit_samples": request.limit_samples, "repeats": request.repeats,
                              "canary_overrides": repeat_overrides}, progress)
    return LaunchOutput(record_id=record.id, kind="canary", invocation_id=record.invocation_id or "",
                        config_hash=answer["config_hash"], executor=answer["executor"], host=answer.get("host"),
                        status=record.status, notes=notes)


class LaunchFullRunInput(StrictModel):
    config_path: str = Field(description="The NEL config whose canary passed.")
    overrides: list[str] = Field(default_factory=list, description="The same overrides the canary was launched with.")
    tasks: list[str] = Field(default_factory=list, description="Only these tasks of the config; empty = all.")
    force: bool = Field(False, description=(
        "Skip the canary gate; only if the person asks. Needs reason."))
    reason: str | None = Field(None, description="Why the gate is skipped (with force; recorded).")


def _results_location(record: ledger.Record) -> str:
    """The invocation directory as validate_run takes it: a local path, or host:path for SLURM (from NEL's job records)."""
    if _is_next(record):  # results.next_run_dir reads a local run, or fetches a SLURM run's from the cluster
        return record.id
    data = _jobs(record)[0]["data"]
    if "remote_rundir_path" in data:
        return f"{data['hostname']}:{Path(data['remote_rundir_path']).parent}"
    return str(Path(data["output_dir"]).parent)


def _canary_verdict(canary: ledger.Record) -> tuple[bool, str]:
    """Did this finished canary pass? results.validate_run decides (scores present, errors and truncation low)."""
    try:
        report = results.validate_run(results.ValidateRunInput(run=_results_location(canary)))
    except ToolError as exc:
        return False, f"validate_run could not read it: {exc}"
    reasons = f" ({'; '.join(report.reasons[:3])})" if report.reasons else ""
    return report.verdict == "pass", f"validate_run verdict: {report.verdict}{reasons}"


def _gate(config_hash_value: str, tasks: list[str], progress: ProgressFn) -> str:
    """The passing canary that vouches for a full run of these tasks, or a ToolError saying why there is none."""
    canaries = ledger.find(kind="canary", config_hash=config_hash_value, limit=20)
    if not canaries:
        raise ToolError(
            f"Full run refused: no canary has run for this config (hash {config_hash_value}). Run launch_canary on "
            "the same config and overrides, wait until run_status says succeeded, then launch the full run.")
    problems = []
    for canary in canaries:
        if canary.status in ACTIVE and canary.invocation_id:
            progress(0.5, 3, f"refreshing canary {canary.id}")
            canary = _refresh(canary).record
        if canary.status != "succeeded":
            problems.append(f"{canary.id}: {canary.status}")
            continue
        untested = sorted(set(tasks) - set(canary.details.get("tasks", [])))
        if untested:
            problems.append(f"{canary.id}: did not run {', '.join(untested)}")
            continue
        passed, why = _canary_verdict(canary)
        ledger.update(canary.id, details={"validation": why, "validation_passed": passed}, message=f"gate check: {why}")
        if passed:
            return f"canary {canary.id} ({canary.invocation_id}) passed: {why}"
        problems.append(f"{canary.id}: {why}")
    raise ToolError(
        f"Full run refused: no canary of this config (hash {config_hash_value}) has passed ({'; '.join(problems[:5])}). "
        "Wait for a running canary (run_status), or read run_logs of the failed one, fix the config and launch a "
        "new canary. To override, call again with force=true and a reason.")


def launch_full_run(request: LaunchFullRunInput, progress: ProgressFn = no_progress) -> LaunchOutput:
    """Use after the canary passed: launches the full run of the same config (refused without a passing canary unless
    force). Returns its record_id at once.
    """
    config_path = _config_file(request.config_path)
    if request.force and not (request.reason and request.reason.strip()):
        raise ToolError("force: a full run without a passing canary needs a written reason. Pass reason='...'.")
    progress(0, 3, "checking the canary gate")
    next_engine = _engine(config_path) == "nel-next"
    if not next_engine:
        _check_local_prerequisites(config_path)
    if next_engine:
        composed = {"config_hash": nelnext.config_hash(config_path, request.overrides),
                    "tasks": nelnext.check_schema(config_path, request.overrides).get("benchmarks", [])}
    else:
        composed = _nel("hash", QUERY_TIMEOUT_S, config_path=config_path, overrides=request.overrides)
    if request.force:
        gate = f"forced: {request.reason.strip()}"
    else:
        gate = _gate(composed["config_hash"], request.tasks or composed["tasks"], progress)
    details = {"gate": gate, "forced": request.force, "reason": request.reason.strip() if request.force else None}
    if next_engine:
        return _next_launch("full_run", config_path, request.overrides, None, None, details, progress)
    record, answer = _launch("full_run", config_path, request.overrides, [], request.tasks, details, progress)
    return LaunchOutput(record_id=record.id, kind="full_run", invocation_id=record.invocation_id or "",
                        config_hash=answer["config_hash"], executor=answer["executor"], host=answer.get("host"),
                        status=record.status, gate=gate)


# ---------------------------------------------------------------- status


class RunRef(StrictModel):
    record_id: str = Field(description="The run's record_id or NEL invocation id.")


class JobStatus(BaseModel):
    job_id: str = Field(description="NEL job id (<invocation>.<task index>).")
    status: str = Field(description="pending, running, resuming, succeeded, failed, killed or unknown.")
    slurm_job_id: str | None = None
    current_slurm_job_id: str | None = Field(None, description="Latest job of NEL's auto-resume chain, when it moved on.")
    restart_job_id: str | None = Field(None, description="NEL's paired restart job waiting behind the current one.")
    slurm_state: str | None = None
    progress: int | None = Field(None, description="Requests completed so far, when NEL tracks it.")
    note: str | None = None


class RunStatusOutput(BaseModel):
    record_id: str
    kind: str
    invocation_id: str | None
    status: str = Field(description="submitted, pending, running, resuming, succeeded, failed, killed or unknown.")
    executor: str | None
    host: str | None
    reachable: bool = Field(description="False when the cluster could not be asked; status is then the last known one.")
    message: str | None
    jobs: list[JobStatus]
    history: list[ledger.Event] = Field(description="Status changes recorded in the ledger, oldest first (last 20).")


NEL_STATE = {"success": "succeeded", "failed": "failed", "killed": "killed", "pending": "pending",
             "running": "running"}


def _overall(job_states: list[str]) -> str:
    for state in ("running", "resuming", "pending"):
        if state in job_states:
            return state
    for state in ("failed", "killed", "unknown"):
        if state in job_states:
            return state
    return "succeeded" if job_states else "unknown"


def _jobs(record: ledger.Record) -> list[dict]:
    if not record.invocation_id:
        raise ToolError(f"{record.id}: this {record.kind} has no NEL invocation (its launch failed); nothing to ask.")
    jobs = _nel("jobs", QUERY_TIMEOUT_S, invocation_id=record.invocation_id)["jobs"]
    if not jobs:
        raise ToolError(f"{record.id}: NEL's execution database has no jobs for invocation {record.invocation_id} "
                        "(was NEMO_EVALUATOR_EXEC_DB_FILE changed?).")
    return jobs


def _slurm_state(state_field: str) -> str:
    return state_field.split()[0].rstrip("+") if state_field.strip() else "UNKNOWN"


def _slurm_job_statuses(jobs: list[dict]) -> list[JobStatus]:
    """Per cluster login: NEL's job chain files, `squeue -t all` for the user, then sacct for jobs the queue forgot."""
    by_login: dict[str, list[dict]] = {}
    for job in jobs:
        by_login.setdefault(_login(job["data"]), []).append(job)
    statuses = []
    for login, host_jobs in by_login.items():
        data = host_jobs[0]["data"]
        # NEL 0.2.6 lists a run's jobs in .slurm_job_id.list, nel-next in .nel_job_chain (data["chain_file"])
        chain_cmds = "; ".join(
            f"echo @@CHAIN {job['job_id']}; cat {shlex.quote(job['data']['remote_rundir_path'])}/"
            f"{job['data'].get('chain_file', '.slurm_job_id.list')} 2>/dev/null; echo" for job in host_jobs)
        chains: dict[str, list[str]] = {}
        current = None
        for line in _on_cluster(data, chain_cmds).splitlines():
            if line.startswith("@@CHAIN "):
                current = line.split()[1]
                chains[current] = []
            elif current and line.strip():
                chains[current].extend(line.split())
        # the newest of the chain and the recorded id: a resubmitted job is recorded before it writes the chain
        latest_ids = {job["job_id"]: max([*chains.get(job["job_id"], []), str(job["data"]["slurm_job_id"])],
                                         key=lambda i: int(i) if i.isdigit() else -1) for job in host_jobs}
        try:
            queue = {entry.job_id: entry for entry in remote.squeue(login, user=data["username"], all_states=True)}
            purged = [job_id for job_id in latest_ids.values() if job_id not in queue]
            if purged:
                _, finished, _ = remote.sacct(login, job_ids=purged)
                queue.update({entry.job_id: entry for entry in finished if entry.job_id in purged})
        except ToolError as exc:
            raise _Unreachable(f"ssh {data['hostname']}: {exc}") from None
        for job in host_jobs:
            original = str(job["data"]["slurm_job_id"])
            latest = latest_ids[job["job_id"]]
            state = _slurm_state(queue[latest].state if latest in queue else "")
            restart = _restart_job(latest, queue)
            status, note = _map_slurm(state, restart, latest != original, job["data"].get("retries_failed", False))
            statuses.append(JobStatus(job_id=job["job_id"], status=status, slurm_job_id=original,
                                      current_slurm_job_id=latest if latest != original else None,
                                      restart_job_id=restart, slurm_state=state, note=note))
    return statuses


def _restart_job(latest: str, queue: dict[str, remote.SlurmJob]) -> str | None:
    """NEL's paired restart job behind `latest`: it depends on it (afternotok:<latest>) while `latest` runs, and keeps
    the job name once SLURM has cleared the satisfied dependency and starts it."""
    latest_name = queue[latest].name if latest in queue else None
    for job_id, entry in queue.items():
        if entry.state not in ("PENDING", "CONFIGURING", "RUNNING") or not job_id.isdigit() or not latest.isdigit():
            continue
        if f":{latest}" in (entry.dependency or "") or (
                int(job_id) > int(latest) and latest_name and entry.name == latest_name):
            return job_id
    return None


def _map_slurm(state: str, restart_job: str | None, resumed: bool, retries_failed: bool = False) -> tuple[str, str | None]:
    """retries_failed: the chain's successor also reruns a FAILED job (nel-next's infra retries, cluster.max_retries),
    where NEL 0.2.6's restart job only continues after walltime."""
    if state == "FAILED" and retries_failed and restart_job:
        return "resuming", f"failed; nel-next's auto-resume job {restart_job} retries it (cluster.max_retries)"
    if state in ("RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED"):
        return "running", "resumed after walltime by NEL's restart job" if resumed else None
    if state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
        return ("resuming", "restart job queued after walltime") if resumed else ("pending", None)
    if state == "COMPLETED":
        return "succeeded", None
    if state in ("TIMEOUT", "PREEMPTED", "NODE_FAIL"):
        if restart_job:
            return "resuming", f"{state.lower()}; NEL's paired restart job {restart_job} continues the run"
        return "failed", f"{state.lower()} and no restart job queued (max_walltime reached?); resume_run restarts it"
    if state == "CANCELLED":
        return "killed", "cancelled (scancel or kill_run)"
    if state == "UNKNOWN":
        return "unknown", "SLURM no longer knows this job and accounting has no record of it"
    return "failed", f"SLURM state {state}"


class _Refreshed(BaseModel):
    record: ledger.Record
    jobs: list[JobStatus]
    reachable: bool
    message: str | None


def _refresh(record: ledger.Record) -> _Refreshed:
    """Ask NEL/SLURM for the current state and record a change in the ledger; an unreachable cluster changes nothing."""
    if not record.invocation_id:
        return _Refreshed(record=record, jobs=[], reachable=True, message=record.details.get("error"))
    if record.kind == "dry_run":
        return _Refreshed(record=record, jobs=[], reachable=True, message=record.details.get("error"))
    if _is_next(record):
        return _next_refresh(record)
    jobs = _jobs(record)
    try:
        if record.executor == "slurm":
            statuses = _slurm_job_statuses(jobs)
        else:
            answer = _nel("status", QUERY_TIMEOUT_S, invocation_id=record.invocation_id)
            statuses = [JobStatus(job_id=row["job_id"] or record.invocation_id,
                                  status=NEL_STATE.get(row["status"], "unknown"), progress=row.get("progress"),
                                  note=row.get("error")) for row in answer["jobs"]]
    except _Unreachable as exc:
        ledger.update(record.id, message=f"status poll failed: {exc}")
        return _Refreshed(record=ledger.get(record.id), jobs=[], reachable=False,
                          message=f"{exc}. Status unchanged ({record.status}); retry run_status later.")
    status = _overall([job.status for job in statuses])
    updated = ledger.update(record.id, status=status, details={"jobs": {job.job_id: job.status for job in statuses}})
    return _Refreshed(record=updated, jobs=statuses, reachable=True, message=None)


def _record(run: str) -> ledger.Record:
    record = ledger.get(run.strip())
    if record.kind not in ("dry_run", "canary", "full_run"):
        raise ToolError(f"{run} is a {record.kind}, not a run; use deployment_status for deployments.")
    return record


def run_status(request: RunRef, progress: ProgressFn = no_progress) -> RunStatusOutput:
    """Use to poll a canary or full run: each job's status, with the ledger's history."""
    progress(0, 1, "asking the executor")
    refreshed = _refresh(_record(request.record_id))
    record = refreshed.record
    progress(1, 1, record.status)
    return RunStatusOutput(record_id=record.id, kind=record.kind, invocation_id=record.invocation_id,
                           status=record.status, executor=record.executor, host=record.host,
                           reachable=refreshed.reachable, message=refreshed.message, jobs=refreshed.jobs,
                           history=ledger.events(record.id)[-20:])


class WaitForRunInput(StrictModel):
    record_id: str = Field(description="The run's record_id or NEL invocation id.")
    timeout_s: float = Field(300, ge=0, le=3600, description="Longest wait, in seconds.")


def wait_for_run(request: WaitForRunInput, progress: ProgressFn = no_progress) -> RunStatusOutput:
    """Use instead of polling run_status: answers as run_status does once the status changes or timeout_s passes."""
    status = run_status(RunRef(record_id=request.record_id))
    if status.status not in ACTIVE:
        return status
    # Local runs are cheap to look at; a SLURM poll is an SSH round trip and a squeue.
    interval = 10.0 if status.executor == "slurm" else 1.0
    started = time.monotonic()
    while (remaining := request.timeout_s - (time.monotonic() - started)) > 0:
        time.sleep(min(interval, remaining))
        now = run_status(RunRef(record_id=request.record_id))
        if now.status != status.status:
            return now
        progress(round(time.monotonic() - started), request.timeout_s, f"still {now.status}")
    return run_status(RunRef(record_id=request.record_id))


# ---------------------------------------------------------------- logs


class RunLogsInput(StrictModel):
    record_id: str = Field(description="The run's record_id or NEL invocation id.")
    lines: int = Field(50, ge=1, le=500, description="Last lines of each log file.")
    job: str | None = Field(None, description="Only this NEL job id (<invocation>.<index>).")


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


def _local_log_files(job: dict) -> list[Path]:
    task_dir = Path(job["data"]["output_dir"])
    return sorted(path for directory in (task_dir / "logs", task_dir.parent / "logs") if directory.is_dir()
                  for path in directory.iterdir() if path.is_file())


def _read_local_logs(job: dict, lines: int) -> tuple[list[tuple[str, list[str]]], list[tuple[str, int, str]]]:
    tails, hits = [], []
    for path in _local_log_files(job):
        content = path.read_text(errors="replace").splitlines()
        tails.append((str(path), content[-lines:]))
        hits.extend((str(path), number, text) for number, text in enumerate(content, 1) if failures.classify(text))
    return tails, hits


def _read_remote_logs(job: dict, lines: int) -> tuple[list[tuple[str, list[str]]], list[tuple[str, int, str]]]:
    logs = f"{job['data']['remote_rundir_path']}/logs"
    output = _on_cluster(job["data"], failures.grep_command(logs, MAX_HITS * 2, tail_lines=lines))
    tails, hits = failures.parse_grep(output, logs)
    return tails, [hit for hit in hits if failures.classify(hit[2])]


def run_logs(request: RunLogsInput, progress: ProgressFn = no_progress) -> RunLogsOutput:
    """Use when a run failed or to watch a canary: log tails, known failure lines (file:line) and, for a failed run, a
    diagnosis with its usual fix. Secrets masked.
    """
    record = _record(request.record_id)
    if _is_next(record):
        return _next_logs(record, request.lines)
    jobs = [job for job in _jobs(record) if request.job in (None, job["job_id"])]
    if not jobs:
        raise ToolError(f"job: {request.job} is not part of {record.invocation_id}. run_status lists its jobs.")
    tails: list[LogTail] = []
    hits: list[FailureHit] = []
    secrets = _secret_values([])
    for index, job in enumerate(jobs):
        progress(index, len(jobs), f"reading logs of {job['job_id']}")
        try:
            reader = _read_remote_logs if job["executor"] == "slurm" else _read_local_logs
            job_tails, job_hits = reader(job, request.lines)
        except _Unreachable as exc:
            raise ToolError(f"{record.host}: {exc}. Check the host with ssh_check and retry.") from None
        tails.extend(LogTail(job_id=job["job_id"], file=file,
                             lines=[line[:failures.MAX_LINE_CHARS] for line in _scrub("\n".join(lines), secrets).splitlines()])
                     for file, lines in job_tails)
        hits.extend(FailureHit(failure_class=failures.classify(text) or "exception", file=file, line=number,
                               text=_scrub(text.strip(), secrets)[:failures.MAX_LINE_CHARS]) for file, number, text in job_hits)
    classes = [name for name in failures.FAILURE_ADVICE if any(hit.failure_class == name for hit in hits)]
    diagnosis = None
    if record.status in ACTIVE:  # the diagnosis is for a run that has failed: ask whether it has
        record = _refresh(record).record
    if record.status == "failed":
        last = [line for tail in tails for line in tail.lines]
        diagnosis = failures.diagnose([(hit.file, hit.line, hit.text) for hit in hits], last)
    return RunLogsOutput(record_id=record.id, invocation_id=record.invocation_id, tails=tails,
                         failures=hits[:MAX_HITS], failures_truncated=len(hits) > MAX_HITS, failure_classes=classes,
                         diagnosis=diagnosis)


# ---------------------------------------------------------------- kill / resume


class KillRunOutput(BaseModel):
    record_id: str
    status: str
    jobs: list[JobStatus] = Field(description="What NEL did per job: killed, or why it could not.")


def kill_run(request: RunRef, progress: ProgressFn = no_progress) -> KillRunOutput:
    """Use when a run is wrong or stuck: stops it through NEL (with its restart job) and records it as killed."""
    record = _record(request.record_id)
    if record.kind == "dry_run":
        raise ToolError(f"{record.id} is a dry-run; nothing runs. list_runs kind=canary or full_run shows runs.")
    if _is_next(record):
        return _next_kill(record)
    progress(0, 2, "killing through NEL")
    answer = _nel("kill", QUERY_TIMEOUT_S, invocation_id=record.invocation_id or "")
    results = [JobStatus(job_id=row["job_id"] or "", status="killed" if row["status"] == "killed" else "unknown",
                         note=row.get("error")) for row in answer["jobs"]]
    if record.executor == "slurm":
        # NEL cancels the first SLURM job only; once auto-resume moved on, the chain's current job and its
        # restart job are what runs, so those are cancelled as well.
        progress(1, 2, "cancelling the rest of the auto-resume chain")
        jobs = _jobs(record)
        data_by_job = {job["job_id"]: job["data"] for job in jobs}
        try:
            for job in _slurm_job_statuses(jobs):
                leftovers = [job_id for job_id in (job.current_slurm_job_id, job.restart_job_id) if job_id]
                if leftovers and job.status in ACTIVE:
                    try:
                        remote.scancel(_login(data_by_job[job.job_id]), leftovers)
                    except ToolError as exc:
                        raise _Unreachable(str(exc)) from None
        except _Unreachable as exc:
            ledger.update(record.id, message=f"kill: could not check the restart chain: {exc}")
    refreshed = _refresh(ledger.get(record.id))
    status = refreshed.record.status
    if any(job.status == "killed" for job in results) and (status in ACTIVE or not refreshed.reachable):
        # scancel / docker stop was accepted; the executor may still be winding the job down.
        status = ledger.update(record.id, status="killed", message="kill_run").status
    elif status in ACTIVE or not refreshed.reachable:
        errors = "; ".join(f"{job.job_id}: {job.note}" for job in results if job.note) or "no job was killed"
        raise ToolError(f"kill_run: NEL could not stop {record.invocation_id} ({errors}). It is still {status}; "
                        "check the host with ssh_check and retry.")
    progress(2, 2, status)
    return KillRunOutput(record_id=record.id, status=status, jobs=results)


class ResumeRunOutput(BaseModel):
    record_id: str
    invocation_id: str
    status: str


def resume_run(request: RunRef, progress: ProgressFn = no_progress) -> ResumeRunOutput:
    """Use after a kill or a transient failure: re-runs the run's scripts under the same invocation id (config edits need a
    new canary).
    """
    record = _record(request.record_id)
    if record.kind == "dry_run" or not record.invocation_id:
        raise ToolError(f"{record.id} never ran (a dry-run or a failed launch); use launch_canary instead.")
    if _is_next(record):
        return _next_resume(record)
    progress(0, 1, "resuming through NEL")
    answer = _nel("resume", LAUNCH_TIMEOUT_S, invocation_id=record.invocation_id)
    updated = ledger.update(record.id, status="submitted", message="resumed through NEL")
    progress(1, 1, "resumed")
    return ResumeRunOutput(record_id=updated.id, invocation_id=answer["invocation_id"], status=updated.status)


# ---------------------------------------------------------------- list_runs


class ListRunsInput(StrictModel):
    kind: RunKind | None = Field(None, description="Only this kind.")
    status: str | None = Field(None, description="Only this status, e.g. running, failed.")
    offset: int = Field(0, ge=0, description="Records to skip (newest first).")
    limit: int = Field(20, ge=1, le=100, description="Page size.")


class RunSummary(BaseModel):
    record_id: str
    kind: str
    status: str
    invocation_id: str | None
    config_path: str | None
    config_hash: str | None
    executor: str | None
    host: str | None
    created_at: float
    updated_at: float
    note: str | None = Field(description="The failure message, or the reason a full run was forced.")


class ListRunsOutput(BaseModel):
    total: int = Field(description="Records matching the filters.")
    offset: int
    next_offset: int | None = Field(description="Offset of the next page; null at the end.")
    runs: list[RunSummary]


def list_runs(request: ListRunsInput) -> ListRunsOutput:
    """Use to find a record_id: dry-runs, canaries, full runs and eval servers, newest first, by kind and status.
    Paginated.
    """
    kinds: list[ledger.RecordKind] = [request.kind] if request.kind else ["dry_run", "canary", "full_run"]
    page = ledger.find(kinds=kinds, status=request.status, limit=request.limit, offset=request.offset)
    total = ledger.count(kinds=kinds, status=request.status)
    next_offset = request.offset + len(page) if request.offset + len(page) < total else None
    return ListRunsOutput(total=total, offset=request.offset, next_offset=next_offset, runs=[
        RunSummary(record_id=record.id, kind=record.kind, status=record.status, invocation_id=record.invocation_id,
                   config_path=record.config_path, config_hash=record.config_hash, executor=record.executor,
                   host=record.host, created_at=record.created_at, updated_at=record.updated_at,
                   note=record.details.get("error") or (record.details.get("gate") if record.kind == "full_run" else None))
        for record in page])


# ---------------------------------------------------------------- the nel-next engine
#
# The same tools, for configs with services/benchmarks/cluster/output (quanteval.engines). A nel-next run is a
# `nel eval run` child on this machine; its record keeps engine "nel-next", run_dir, pid and the overrides.


def _engine(config_path: str) -> str:
    from quanteval.workflow import nelconfig

    return engine_of(nelconfig.to_plain(nelconfig.load_config(config_path)))


def _is_next(record: ledger.Record) -> bool:
    return record.details.get("engine") == "nel-next"


def _next_dry_run(config_path: str, overrides: list[str]) -> DryRunOutput:
    """nel-next has nothing to render for the local cluster: its own schema check is the dry-run."""
    checked = nelnext.check_schema(config_path, overrides)
    error = None
    if not checked["ok"]:
        error = "; ".join(f"{p['path'] or '(config)'}: {p['message']}" for p in checked["problems"][:5])
    command = [str(nelnext.nel_binary()), "eval", "run", config_path, *[x for o in overrides for x in ("-O", o)]]
    record = ledger.add("dry_run", status="failed" if error else "passed", config_path=config_path,
                        config_hash=nelnext.config_hash(config_path, overrides), executor=checked.get("cluster"),
                        details={"engine": "nel-next", "error": error, "overrides": overrides}, message=error)
    text = shlex.join(command)
    scripts = [RenderedScript(name="nel eval run", path=None, size_bytes=len(text), head=[text])]
    if error is None and checked.get("cluster") == "slurm":
        rendered, error = nelnext.render_sbatch(config_path, overrides)
        secrets = _secret_values([])
        scripts += [RenderedScript(name=path.name, path=str(path), size_bytes=len(body.encode()),
                                   head=_scrub("\n".join(body.splitlines()[:SCRIPT_HEAD_LINES]), secrets).splitlines(),
                                   launch_commands=launch_commands(body, secrets)) for path, body in rendered[:MAX_SCRIPTS]]
        if error:
            ledger.update(record.id, status="failed", details={"error": error}, message=error)
    return DryRunOutput(ok=error is None, record_id=record.id, config_hash=record.config_hash, executor=checked.get("cluster"),
                        invocation_id=None, invocation_dir=None, scripts=scripts, secrets_files_protected=[], error=error)


def _next_run_dir(config_path: str, overrides: list[str], kind: str) -> Path:
    checked = nelnext.check_schema(config_path, overrides)
    if not checked["ok"]:
        first = checked["problems"][0]
        raise ToolError(f"nel-next rejects the config: {first['path'] or '(config)'}: {first['message']}. Run validate_config.")
    base = Path(checked["output_dir"])
    if checked["cluster"] != "slurm":  # a SLURM output.dir is a path on the cluster, taken as written
        base = base.expanduser() if base.expanduser().is_absolute() else Path(config_path).parent / base.expanduser()
    return base / f"{kind.replace('_', '-')}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid() % 10000:04d}"


def _next_model_facts(config_path: str) -> dict:
    """The checkpoint and served facts behind the config's model service, recorded with the run: compare_results
    checks from them that baseline and candidate are one model family served alike."""
    from quanteval.workflow import nelconfig, nextconfig, validation

    try:
        _, service = nextconfig.model_service(nelconfig.load_config(config_path), config_path)
    except ToolError:
        return {}
    directory, served = validation.service_model(service)
    return {"checkpoint": directory, "served": served or {}}


def _next_launch(kind: RunKind, config_path: str, overrides: list[str], max_problems: int | None, repeats: int | None,
                 details: dict, progress: ProgressFn) -> LaunchOutput:
    progress(1, 3, f"starting the nel-next {kind.replace('_', ' ')}")
    extra: list[str] = []
    notes: list[str] = []
    if max_problems is not None:
        count = len(nelnext.check_schema(config_path, overrides).get("benchmarks") or [])
        extra = nelnext.canary_overrides(count, max_problems, repeats)
        notes.append(f"The canary runs max_problems={max_problems}" + (f" and repeats={repeats}" if repeats else "")
                     + " per benchmark; the full run uses the config's.")
    run_dir = _next_run_dir(config_path, overrides, kind)
    if nelnext.check_schema(config_path, overrides)["cluster"] == "slurm":  # each run in its own directory on the cluster
        extra.append(f"output.dir={run_dir.as_posix()}")
    if not details.get("checkpoint"):
        details = {**details, **_next_model_facts(config_path)}
    record = nelnext.launch(kind, config_path, [*overrides, *extra], run_dir,
                            {**details, "canary_overrides": extra, "limit_samples": max_problems, "repeats": repeats})
    record = ledger.update(record.id, details={"overrides": overrides, "run_overrides": [*overrides, *extra]})
    if record.executor != "slurm":
        progress(3, 3, f"running in {run_dir}")
    if record.executor == "slurm":
        progress(3, 3, f"submitted to {record.host}: SLURM job {', '.join(j['job_id'] for j in record.details['slurm_jobs'])}")
    return LaunchOutput(record_id=record.id, kind=kind, invocation_id=record.invocation_id or "", config_hash=record.config_hash or "",
                        executor=record.executor or "local", host=record.host, status=record.status, gate=details.get("gate"),
                        notes=notes)


def _next_slurm_jobs(record: ledger.Record) -> list[dict]:
    """A nel-next SLURM record's jobs in the shape the SLURM status code reads (as NEL 0.2.6's execution DB has them)."""
    return [{"job_id": f"shard {index}" if len(record.details["slurm_jobs"]) > 1 else "nel eval run",
             "data": {"hostname": job["hostname"], "username": job["username"] or remote.ssh_user(job["hostname"]),
                      "remote_rundir_path": job["remote_dir"], "slurm_job_id": job["job_id"], "chain_file": nelnext.CHAIN_FILE,
                      "retries_failed": True}}
            for index, job in enumerate(record.details["slurm_jobs"])]


def _next_slurm_failures(jobs: list[dict]) -> dict[str, str]:
    """Benchmarks nel-next recorded as failed on the cluster (each benchmark's checkpoint.json): a job can end
    COMPLETED with one failed, as `nel eval run` can exit 0 with one."""
    failed: dict[str, str] = {}
    for job in jobs:
        text = _on_cluster(job["data"], f"for f in {shlex.quote(job['data']['remote_rundir_path'])}/*/checkpoint.json; "
                                        'do [ -f "$f" ] && { cat "$f"; echo; echo @@END; }; done')
        for chunk in text.split("@@END"):
            try:
                failed.update({str(k): str(v)[:300] for k, v in (json.loads(chunk).get("failed_benchmarks") or {}).items()})
            except (json.JSONDecodeError, AttributeError):
                continue
    return failed


def _next_slurm_refresh(record: ledger.Record) -> _Refreshed:
    jobs = _next_slurm_jobs(record)
    try:
        statuses = _slurm_job_statuses(jobs)
        failed = _next_slurm_failures(jobs) if all(job.status == "succeeded" for job in statuses) else {}
    except _Unreachable as exc:
        ledger.update(record.id, message=f"status poll failed: {exc}")
        return _Refreshed(record=ledger.get(record.id), jobs=[], reachable=False,
                          message=f"{exc}. Status unchanged ({record.status}); retry run_status later.")
    message = None
    if failed:
        message = "; ".join(f"{name}: {error}" for name, error in failed.items())[:500]
        statuses = [job.model_copy(update={"status": "failed", "note": f"nel-next failed {', '.join(failed)}"}) for job in statuses]
    status = _overall([job.status for job in statuses])
    updated = ledger.update(record.id, status=status, details={"jobs": {job.job_id: job.status for job in statuses},
                                                               "error": message},
                            message=message if message and record.status != status else None)
    return _Refreshed(record=updated, jobs=statuses, reachable=True, message=message)


def _next_refresh(record: ledger.Record) -> _Refreshed:
    if record.status in ("killed", "cancelled"):
        return _Refreshed(record=record, jobs=[], reachable=True, message=record.details.get("error"))
    if record.executor == "slurm":
        return _next_slurm_refresh(record)
    code = nelnext.exit_code(record.details)
    benchmarks = list(record.details.get("tasks") or [])
    if code is None:
        jobs = [JobStatus(job_id=name, status="running") for name in benchmarks]
        return _Refreshed(record=ledger.update(record.id, status="running"), jobs=jobs, reachable=True, message=None)
    outcome = nextresults.run_outcome(Path(record.details["run_dir"]))
    jobs = []
    for name in benchmarks:
        if name in outcome.failed:
            jobs.append(JobStatus(job_id=name, status="failed", note=outcome.failed[name][:300]))
        elif name in outcome.completed:
            jobs.append(JobStatus(job_id=name, status="succeeded"))
        else:
            jobs.append(JobStatus(job_id=name, status="failed", note=f"nel eval run ended (exit {code}) without finishing it"))
    # Never trust the exit code alone: nel eval run has exited 0 with a failed benchmark.
    status = "succeeded" if code == 0 and jobs and all(job.status == "succeeded" for job in jobs) else "failed"
    message = None
    if status == "failed":
        reasons = [f"{job.job_id}: {job.note}" for job in jobs if job.note] or [f"nel eval run exited {code}"]
        message = "; ".join(reasons)[:500]
    updated = ledger.update(record.id, status=status, details={"exit_code": code, "error": message},
                            message=message if record.status != status else None)
    return _Refreshed(record=updated, jobs=jobs, reachable=True, message=message)


def _next_slurm_log(record: ledger.Record, lines: int) -> tuple[str, list[str]]:
    """The SLURM job logs of each shard on the cluster, up to its last four jobs (nel-next's logs/slurm-ID.log, the
    eval's output tee'd in)."""
    content: list[str] = []
    where = ""
    for job in _next_slurm_jobs(record):
        logs = f"{shlex.quote(job['data']['remote_rundir_path'])}/logs"
        where = f"{job['data']['hostname']}:{job['data']['remote_rundir_path']}/logs"
        # every job of the chain, oldest first: a retry's fresh log alone hides why the first one failed
        text = _on_cluster(job["data"], f"for f in $(ls -tr {logs}/slurm-*.log 2>/dev/null | tail -4); "
                                        f'do echo "==> $f <=="; tail -n {max(lines, 200)} "$f"; done')
        content += text.splitlines()
    return where, content


def _next_logs(record: ledger.Record, lines: int) -> RunLogsOutput:
    if record.executor == "slurm":
        try:
            path, content = _next_slurm_log(record, lines)
        except _Unreachable as exc:
            raise ToolError(f"run_logs: {exc}; retry when the cluster answers.") from None
    else:
        path = record.details["log_path"]
        content = Path(path).read_text(errors="replace").splitlines() if Path(path).is_file() else []
    secrets = _secret_values([])
    hits = [FailureHit(failure_class=failures.classify(text) or "exception", file=path, line=number,
                       text=_scrub(text.strip(), secrets)[:failures.MAX_LINE_CHARS])
            for number, text in enumerate(content, 1) if failures.classify(text)]
    tail = [line[:failures.MAX_LINE_CHARS] for line in _scrub("\n".join(content[-lines:]), secrets).splitlines()]
    record = _next_refresh(record).record if record.status in ACTIVE else record
    diagnosis = None
    if record.status == "failed":
        error = record.details.get("error")
        last = ([error] if error else []) + tail
        diagnosis = failures.diagnose([(hit.file, hit.line, hit.text) for hit in hits], last)
    classes = [name for name in failures.FAILURE_ADVICE if any(hit.failure_class == name for hit in hits)]
    return RunLogsOutput(record_id=record.id, invocation_id=record.invocation_id,
                         tails=[LogTail(job_id="nel eval run", file=path, lines=tail)], failures=hits[:MAX_HITS],
                         failures_truncated=len(hits) > MAX_HITS, failure_classes=classes, diagnosis=diagnosis)


def _next_slurm_kill(record: ledger.Record) -> KillRunOutput:
    """scancel every job of the run's chains and the auto-resume successors queued behind them (afternotok)."""
    for job in _next_slurm_jobs(record):
        data = job["data"]
        chain = f"{shlex.quote(data['remote_rundir_path'])}/{nelnext.CHAIN_FILE}"
        ids = f"$( (cat {chain} 2>/dev/null; echo {data['slurm_job_id']}) | sort -u)"
        successors = f"$(squeue -h -u {shlex.quote(data['username'])} -o '%i %E' | grep -E \"afternotok:($(echo {ids} | tr ' ' '|'))\" | cut -d' ' -f1)"
        try:
            _on_cluster(data, f"scancel {ids} {successors}")
        except _Unreachable as exc:
            raise ToolError(f"kill_run: {exc}; nothing was cancelled, retry.") from None
    updated = ledger.update(record.id, status="killed", message="kill_run: scancel of the job chain")
    return KillRunOutput(record_id=record.id, status=updated.status,
                         jobs=[JobStatus(job_id=job["job_id"], status="killed") for job in _next_slurm_jobs(record)])


def _next_kill(record: ledger.Record) -> KillRunOutput:
    if record.executor == "slurm":
        return _next_slurm_kill(record)
    stopped, how = nelnext.stop(record.details)
    if not stopped:
        raise ToolError(f"kill_run: {record.id} did not stop ({how}); retry, or kill process group {record.details['pgid']}.")
    updated = ledger.update(record.id, status="killed", message=f"kill_run: {how}")
    return KillRunOutput(record_id=record.id, status=updated.status,
                         jobs=[JobStatus(job_id=name, status="killed") for name in record.details.get("tasks") or []])


def _next_resume(record: ledger.Record) -> ResumeRunOutput:
    if record.executor == "slurm":
        if _next_refresh(record).record.status in ACTIVE:
            raise ToolError(f"{record.id} is still queued or running; resume_run is for a killed or failed run.")
        jobs = [nelnext.resubmit(job) for job in record.details["slurm_jobs"]]
        updated = ledger.update(record.id, status="submitted", details={"slurm_jobs": jobs, "error": None},
                                message=f"resumed: nel eval resume, SLURM job {', '.join(j['job_id'] for j in jobs)}")
        return ResumeRunOutput(record_id=updated.id, invocation_id=updated.invocation_id or "", status=updated.status)
    if nelnext.exit_code(record.details) is None:
        raise ToolError(f"{record.id} is still running; resume_run is for a killed or failed run.")
    overrides = record.details.get("run_overrides") or record.details.get("overrides") or []
    started = nelnext.start(record.config_path or "", overrides, Path(record.details["run_dir"]), resume=True)
    updated = ledger.update(record.id, status="running", details={**started, "exit_code": None, "error": None},
                            message="resumed: nel eval run --resume")
    return ResumeRunOutput(record_id=updated.id, invocation_id=updated.invocation_id or "", status=updated.status)
