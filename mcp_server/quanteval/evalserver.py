"""The eval server for training loops: NeMo-Skills benchmarks behind slime's eval-delegate API.

A trainer serves its model behind an OpenAI-compatible router and POSTs the benchmarks to run:

    GET  /health                 {"status": "ok", "backend": ..., "backend_ready": bool, ...}
    POST /evaluate               slime's payload; blocks; slime's response shape plus a flat `metrics` map
    POST /jobs                   same payload; answers {"job_id", "state"} at once
    GET  /jobs/<id>              state, runs and metrics of one job

Unlike a one-lock Flask server, evaluations of different rollouts run concurrently up to
`max_concurrent_jobs` and queue beyond it; a benchmark that fails reports its last log lines
and leaves the server and the job's other benchmarks alone.

Two backends build the command for one benchmark:
- `nemo-skills`: `ns eval` against `<router_url>/v1` (server type openai), metrics from
  `eval-results/<bench>/metrics.json`;
- `nel`: a `deployment: none` NEL config pointing at the router, the benchmark mapped to NEL's
  `nemo_skills.ns_*` task, run with `nel run --config`, scores from NEL's `results.yml`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from quanteval import ledger
from quanteval.envvars import state_dir
from quanteval.localproc import group_members, port_free, stop_group
from quanteval.models import StrictModel, ToolError

log = logging.getLogger("quanteval.evalserver")

Backend = Literal["nemo-skills", "nel"]
LOG_TAIL_LINES = 40
NEMO_SKILLS_INSTALL_HINT = (
    "NeMo-Skills (`ns`) is not installed here; it is not on PyPI. Install it from source "
    "(pip install git+https://github.com/NVIDIA-NeMo/Skills) or run the server inside a NeMo-Skills "
    "container, or pass --ns-command with the path of an `ns` executable."
)

# --------------------------------------------------------------------------------------------
# The payload (slime's eval-delegate API)
# --------------------------------------------------------------------------------------------


class BenchmarkSpec(BaseModel):
    """One benchmark of a delegate request; unset generation params fall back to `defaults`."""

    model_config = ConfigDict(extra="ignore")  # slime may send dataset fields this server does not use

    name: str
    n_samples_per_eval_prompt: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = None
    max_response_len: int | None = Field(None, ge=1)
    shards: int | None = Field(None, ge=1, le=64, description="Split this benchmark across N workers.")

    @field_validator("name")
    @classmethod
    def _plain_name(cls, name: str) -> str:
        name = name.strip()
        if not name:
            raise ValueError("benchmark name must not be empty")
        if ":" in name:
            raise ValueError(f"benchmark name '{name}' must not contain ':' (repeats go in n_samples_per_eval_prompt)")
        if "/" in name or any(c.isspace() for c in name) or name.startswith((".", "-")):
            raise ValueError(f"benchmark name '{name}' must be a plain name (no '/', spaces or leading '.'/'-')")
        return name


class EvalRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    rollout_id: int
    router_url: str
    defaults: dict[str, Any] = Field(default_factory=dict)
    benchmarks: list[BenchmarkSpec] = Field(min_length=1)

    @field_validator("router_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"router_url '{url}' must be an http(s) URL such as http://127.0.0.1:30000")
        return url.rstrip("/")


def generation_value(bench: BenchmarkSpec, defaults: dict[str, Any], key: str) -> Any:
    value = getattr(bench, key)
    return defaults.get(key) if value is None else value


def payload_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'payload'}: {err['msg']}" for err in exc.errors())


# --------------------------------------------------------------------------------------------
# Backends: the command for one benchmark, and where its metrics land
# --------------------------------------------------------------------------------------------


@dataclass
class ServerSettings:
    output_root: Path
    backend: Backend = "nemo-skills"
    max_concurrent_requests: int = 512
    max_concurrent_jobs: int = 2
    model_name: str = "slime-openai-model"
    ns_command: str = "ns"
    nel_command: str = "nel"
    cluster: str | None = None
    config_dir: str | None = None
    nel_execution: Literal["local", "slurm"] = "local"
    job_timeout_s: float = 6 * 3600
    results_wait_s: float = 600  # NEL's executors return at submission; results.yml comes later


@dataclass
class ShardCommand:
    argv: list[str]
    env: dict[str, str]
    output_dir: Path
    log_path: Path


def _shard_env(index: int, total: int) -> dict[str, str]:
    return {"NEL_SHARD_IDX": str(index), "NEL_TOTAL_SHARDS": str(total)} if total > 1 else {}


def nemo_skills_commands(
    settings: ServerSettings, request: EvalRequest, bench: BenchmarkSpec, bench_dir: Path, expname: str
) -> list[ShardCommand]:
    """`ns eval` for one benchmark; with shards > 1, one process per chunk (NeMo-Skills' num_chunks/chunk_id)."""
    repeats = generation_value(bench, request.defaults, "n_samples_per_eval_prompt") or 1
    overrides = {
        "inference.temperature": generation_value(bench, request.defaults, "temperature"),
        "inference.top_p": generation_value(bench, request.defaults, "top_p"),
        "inference.top_k": generation_value(bench, request.defaults, "top_k"),
        "inference.tokens_to_generate": generation_value(bench, request.defaults, "max_response_len"),
    }
    shards = bench.shards or 1
    commands = []
    for index in range(shards):
        out = bench_dir if shards == 1 else bench_dir / f"shard-{index}"
        argv = [
            settings.ns_command, "eval",
            "--output_dir", str(out),
            "--benchmarks", f"{bench.name}:{repeats}" if repeats > 1 else bench.name,
            "--server_type", "openai",
            "--server_address", f"{request.router_url}/v1",
            "--model", settings.model_name,
            "--expname", expname if shards == 1 else f"{expname}-shard{index}",
        ]
        if settings.cluster:
            argv += ["--cluster", settings.cluster]
        if settings.config_dir:
            argv += ["--config_dir", settings.config_dir]
        argv += [f"++{key}={value}" for key, value in overrides.items() if value is not None]
        argv += ["++server.api_key_env_var=DUMMY_API_KEY", f"++max_concurrent_requests={settings.max_concurrent_requests}"]
        if shards > 1:
            argv += [f"++num_chunks={shards}", f"++chunk_id={index}"]
        commands.append(ShardCommand(argv, {"DUMMY_API_KEY": "EMPTY", **_shard_env(index, shards)}, out, out / "eval.log"))
    return commands


def nemo_skills_metrics(bench: BenchmarkSpec, output_dir: Path) -> dict[str, Any]:
    path = output_dir / "eval-results" / bench.name / "metrics.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ToolError(f"{path} was not written: the benchmark produced no metrics") from None
    except json.JSONDecodeError as exc:
        raise ToolError(f"{path}: malformed JSON ({exc.msg})") from None
    return data.get(bench.name, data) if isinstance(data, dict) else {}


def nel_task_for(benchmark: str) -> str:
    """Map a NeMo-Skills benchmark name (aime25) to NEL's task (ns_aime2025) through NEL's packaged task list."""
    mapping = nemo_skills_task_map()
    if benchmark in mapping:
        return mapping[benchmark]
    if benchmark in mapping.values():  # already a NEL task name
        return benchmark
    import difflib

    close = difflib.get_close_matches(benchmark, list(mapping) + list(mapping.values()), n=3)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise ToolError(f"benchmark '{benchmark}' has no NEL nemo_skills task.{hint}")


_task_map: dict[str, str] | None = None


def nemo_skills_task_map() -> dict[str, str]:
    """NeMo-Skills benchmark name -> NEL task name, read from NEL's packaged task list once per process."""
    global _task_map
    if _task_map is None:
        from importlib.resources import files

        text = files("nemo_evaluator_launcher").joinpath("resources/all_tasks_irs.yaml").read_text(encoding="utf-8")
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        tasks = yaml.load(text, Loader=loader).get("tasks", [])
        _task_map = {}
        for task in tasks:
            if task.get("harness") != "nemo_skills":
                continue
            native = ((task.get("defaults") or {}).get("config") or {}).get("params", {}).get("task")
            if native and native not in _task_map:
                _task_map[native] = task["name"]
    return _task_map


def nel_config(settings: ServerSettings, request: EvalRequest, bench: BenchmarkSpec, out: Path) -> dict[str, Any]:
    """A `deployment: none` NEL config that evaluates the router's model on one nemo_skills task."""
    params: dict[str, Any] = {"parallelism": settings.max_concurrent_requests}
    extra: dict[str, Any] = {}
    repeats = generation_value(bench, request.defaults, "n_samples_per_eval_prompt")
    if repeats and repeats > 1:
        extra["num_repeats"] = repeats
    for key, nel_key in (("temperature", "temperature"), ("top_p", "top_p"), ("max_response_len", "max_new_tokens")):
        value = generation_value(bench, request.defaults, key)
        if value is not None:
            params[nel_key] = value
    top_k = generation_value(bench, request.defaults, "top_k")
    if top_k is not None:
        extra["args"] = f"++inference.top_k={top_k}"
    if extra:
        params["extra"] = extra
    return {
        "defaults": [{"execution": settings.nel_execution}, {"deployment": "none"}, "_self_"],
        "execution": {"output_dir": str(out)},
        "target": {
            "api_endpoint": {
                "url": f"{request.router_url}/v1/chat/completions",
                "model_id": settings.model_name,
                "api_key_name": "DUMMY_API_KEY",
            }
        },
        "evaluation": {"tasks": [{"name": nel_task_for(bench.name), "nemo_evaluator_config": {"config": {"params": params}}}]},
    }


def nel_commands(
    settings: ServerSettings, request: EvalRequest, bench: BenchmarkSpec, bench_dir: Path, expname: str
) -> list[ShardCommand]:
    shards = bench.shards or 1
    commands = []
    for index in range(shards):
        out = bench_dir if shards == 1 else bench_dir / f"shard-{index}"
        out.mkdir(parents=True, exist_ok=True)
        config = nel_config(settings, request, bench, out)
        if shards > 1:  # the shard convention reaches the eval container through the task's env_vars
            config["evaluation"]["tasks"][0]["env_vars"] = _shard_env(index, shards)
        config_path = out / "nel_config.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        argv = [settings.nel_command, "run", "--config", str(config_path)]
        env = {"DUMMY_API_KEY": "EMPTY", "NEMO_EVALUATOR_TELEMETRY_LEVEL": "0", **_shard_env(index, shards)}
        commands.append(ShardCommand(argv, env, out, out / "eval.log"))
    return commands


def nel_metrics(bench: BenchmarkSpec, output_dir: Path, wait_s: float) -> dict[str, Any]:
    """Scores from NEL's results.yml (results.tasks.<task>.metrics.<metric>.scores.<score>.value)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = sorted(output_dir.glob("**/artifacts/results.yml"))
        if found or time.monotonic() >= deadline:
            break
        time.sleep(2)
    if not found:
        raise ToolError(f"no results.yml under {output_dir} within {wait_s:.0f} s of NEL returning")
    metrics: dict[str, Any] = {}
    for path in found:
        results = (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("results", {})
        for section in ("tasks", "groups"):
            for task in (results.get(section) or {}).values():
                for metric_name, metric in (task.get("metrics") or {}).items():
                    for score_name, score in (metric.get("scores") or {}).items():
                        metrics.setdefault(metric_name, {})[score_name] = score.get("value")
                        count = (score.get("stats") or {}).get("count")
                        if count is not None:
                            metrics[metric_name]["num_entries"] = count
    return metrics


def merge_shard_metrics(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """Combine per-shard metrics: `num_entries` adds up, every other number is a num_entries-weighted mean."""
    if len(shards) == 1:
        return shards[0]

    def merge(parts: list[Any], weights: list[float]) -> Any:
        if all(isinstance(p, dict) for p in parts):
            local = [p.get("num_entries", w) if isinstance(p.get("num_entries"), (int, float)) else w
                     for p, w in zip(parts, weights, strict=True)]
            keys = [k for k in parts[0] if all(k in p for p in parts)]
            merged = {}
            for key in keys:
                values = [p[key] for p in parts]
                if key == "num_entries" and all(isinstance(v, (int, float)) for v in values):
                    merged[key] = sum(values)
                else:
                    merged[key] = merge(values, local)
            return merged
        if all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in parts):
            total = sum(weights)
            return sum(p * w for p, w in zip(parts, weights, strict=True)) / total if total else sum(parts) / len(parts)
        return parts[0]

    return merge(shards, [1.0] * len(shards))


def flatten_metrics(raw: dict[str, Any]) -> dict[str, float]:
    """`{bench: {"pass@1": {"accuracy": 70}}}` -> `{"bench/pass@1/accuracy": 70.0}`: numbers only."""
    flat: dict[str, float] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}/{key}" if prefix else str(key), inner)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[prefix] = float(value)

    walk("", raw)
    return flat


# --------------------------------------------------------------------------------------------
# Jobs: concurrency, queueing and failure isolation
# --------------------------------------------------------------------------------------------

JobState = Literal["queued", "running", "succeeded", "failed"]


@dataclass
class Job:
    id: str
    request: EvalRequest
    output_dir: Path
    state: JobState = "queued"
    runs: list[dict[str, Any]] = field(default_factory=list)
    raw_metrics: dict[str, Any] = field(default_factory=dict)
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    ledger_id: str | None = None

    def response(self) -> dict[str, Any]:
        commands = [run["command"] for run in self.runs]
        logs = [run["log_path"] for run in self.runs]
        errors = [f"{run['benchmark']}: {run['error']}" for run in self.runs if run.get("error")]
        return {
            "job_id": self.id,
            "state": self.state,
            "rollout_id": self.request.rollout_id,
            "command": "\n".join(commands) if commands else None,
            "output_dir": str(self.output_dir),
            "log_path": logs[-1] if logs else None,
            "raw_metrics": self.raw_metrics,
            "metrics": flatten_metrics(self.raw_metrics),
            "runs": self.runs,
            "errors": errors,
        }


def tail_lines(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 64_000) -> list[str]:
    """The last lines of a log, reading at most max_bytes from its end."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]


class EvalService:
    """Runs jobs: at most max_concurrent_jobs at once, the rest wait in order."""

    def __init__(self, settings: ServerSettings):
        self.settings = settings
        settings.output_root.mkdir(parents=True, exist_ok=True)
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(settings.max_concurrent_jobs)
        self._pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="eval-job")
        self._processes: set[subprocess.Popen] = set()

    # -- readiness ------------------------------------------------------------------------
    def backend_status(self) -> dict[str, Any]:
        command = self.settings.ns_command if self.settings.backend == "nemo-skills" else self.settings.nel_command
        found = shutil.which(command)
        status: dict[str, Any] = {"backend": self.settings.backend, "backend_ready": bool(found), "command": command}
        if not found:
            status["hint"] = NEMO_SKILLS_INSTALL_HINT if self.settings.backend == "nemo-skills" else (
                f"`{command}` not found: pip install nemo-evaluator-launcher==0.2.6 or pass --nel-command")
        return status

    def counts(self) -> dict[str, int]:
        with self._lock:
            states = [job.state for job in self._jobs.values()]
        return {state: states.count(state) for state in ("queued", "running", "succeeded", "failed")}

    # -- jobs -----------------------------------------------------------------------------
    def submit(self, request: EvalRequest) -> Job:
        job_id = uuid.uuid4().hex[:16]
        out = self.settings.output_root / f"{int(time.time())}-rollout-{request.rollout_id}-{job_id[:6]}"
        job = Job(id=job_id, request=request, output_dir=out)
        try:
            job.ledger_id = ledger.add(
                "eval_job", status="queued", invocation_id=job_id, executor=self.settings.backend,
                details={"rollout_id": request.rollout_id, "benchmarks": [b.name for b in request.benchmarks],
                         "output_dir": str(out)},
            ).id
        except ToolError as exc:  # the ledger is a record, not a precondition for evaluating
            log.warning("ledger unavailable: %s", exc)
        with self._lock:
            self._jobs[job_id] = job
        self._pool.submit(self._run_job, job)
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def _set_state(self, job: Job, state: JobState) -> None:
        job.state = state
        if job.ledger_id:
            try:
                ledger.update(job.ledger_id, status=state,
                              details={"metrics": flatten_metrics(job.raw_metrics)} if state != "running" else None)
            except ToolError as exc:
                log.warning("ledger update failed: %s", exc)

    def _run_job(self, job: Job) -> None:
        with self._slots:
            self._set_state(job, "running")
            try:
                job.output_dir.mkdir(parents=True, exist_ok=True)
                for bench in job.request.benchmarks:
                    run = self._run_benchmark(job, bench)
                    job.runs.append(run)
                failed = any(run["status"] == "failed" for run in job.runs)
            except Exception as exc:  # a bug in this server must not leave a job hanging forever
                log.exception("job %s crashed", job.id)
                job.runs.append({"benchmark": "*", "status": "failed", "error": f"internal error: {type(exc).__name__}",
                                 "command": "", "log_path": None, "output_dir": str(job.output_dir)})
                failed = True
            job.finished_at = time.time()
            self._set_state(job, "failed" if failed else "succeeded")
            job.done.set()

    def _commands(self, job: Job, bench: BenchmarkSpec, bench_dir: Path) -> list[ShardCommand]:
        expname = f"rollout-{job.request.rollout_id}-{bench.name}"
        if self.settings.backend == "nemo-skills":
            return nemo_skills_commands(self.settings, job.request, bench, bench_dir, expname)
        return nel_commands(self.settings, job.request, bench, bench_dir, expname)

    def _run_benchmark(self, job: Job, bench: BenchmarkSpec) -> dict[str, Any]:
        bench_dir = job.output_dir / bench.name
        bench_dir.mkdir(parents=True, exist_ok=True)
        run: dict[str, Any] = {"benchmark": bench.name, "output_dir": str(bench_dir), "status": "running"}
        started = time.monotonic()
        try:
            commands = self._commands(job, bench, bench_dir)
        except ToolError as exc:
            return {**run, "status": "failed", "error": str(exc), "command": "", "log_path": None}
        run["command"] = "\n".join(shlex.join(c.argv) for c in commands)
        run["log_path"] = str(commands[0].log_path)
        if len(commands) > 1:
            run["shards"] = len(commands)
        exit_codes = self._run_parallel(commands)
        run["duration_s"] = round(time.monotonic() - started, 3)
        for command, code in zip(commands, exit_codes, strict=True):
            if code != 0:
                reason = "timed out" if code is None else f"exited with code {code}"
                return {**run, "status": "failed", "log_path": str(command.log_path),
                        "error": f"`{command.argv[0]} {command.argv[1]}` {reason}; see {command.log_path}",
                        "log_tail": tail_lines(command.log_path)}
        try:
            if self.settings.backend == "nemo-skills":
                parts = [nemo_skills_metrics(bench, c.output_dir) for c in commands]
            else:
                parts = [nel_metrics(bench, c.output_dir, self.settings.results_wait_s) for c in commands]
        except ToolError as exc:
            return {**run, "status": "failed", "error": str(exc), "log_tail": tail_lines(commands[0].log_path)}
        job.raw_metrics[bench.name] = merge_shard_metrics(parts)
        return {**run, "status": "succeeded"}

    def _run_parallel(self, commands: list[ShardCommand]) -> list[int | None]:
        """Start every shard, wait for all; None marks one killed at the job timeout."""
        procs = []
        for command in commands:
            command.output_dir.mkdir(parents=True, exist_ok=True)
            with command.log_path.open("wb") as log_file:
                try:
                    proc = subprocess.Popen(
                        command.argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                        env={**os.environ, **command.env}, start_new_session=True,
                    )
                except OSError as exc:
                    log_file.write(f"cannot start {command.argv[0]}: {exc.strerror}\n".encode())
                    procs.append(None)
                    continue
            with self._lock:
                self._processes.add(proc)
            procs.append(proc)
        deadline = time.monotonic() + self.settings.job_timeout_s
        codes: list[int | None] = []
        for proc in procs:
            if proc is None:
                codes.append(127)
                continue
            try:
                codes.append(proc.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                codes.append(None)
            with self._lock:
                self._processes.discard(proc)
        return codes

    def shutdown(self) -> None:
        with self._lock:
            procs = list(self._processes)
        for proc in procs:
            _kill_group(proc)
        self._pool.shutdown(wait=False, cancel_futures=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------

MAX_BODY_BYTES = 1_000_000


def make_handler(service: EvalService) -> type[BaseHTTPRequestHandler]:  # noqa: C901
    class Handler(BaseHTTPRequestHandler):
        server_version = "quanteval-eval/1"

        def log_message(self, fmt: str, *args: Any) -> None:  # to logging (stderr), not stdout
            log.info("%s %s", self.address_string(), fmt % args)

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _payload(self) -> EvalRequest | None:
            length = int(self.headers.get("Content-Length") or 0)
            if length <= 0 or length > MAX_BODY_BYTES:
                self._send(400, {"error": f"a JSON body of 1..{MAX_BODY_BYTES} bytes is required"})
                return None
            try:
                raw = json.loads(self.rfile.read(length))
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                self._send(400, {"error": f"body is not valid JSON: {exc}"})
                return None
            if not isinstance(raw, dict):
                self._send(400, {"error": "body must be a JSON object"})
                return None
            try:
                return EvalRequest.model_validate(raw)
            except ValidationError as exc:
                self._send(400, {"error": payload_errors(exc)})
                return None

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, {"status": "ok", **service.backend_status(), "jobs": service.counts()})
            elif self.path.startswith("/jobs/"):
                job = service.get(self.path.removeprefix("/jobs/"))
                if job is None:
                    self._send(404, {"error": "no such job"})
                else:
                    self._send(200, job.response())
            else:
                self._send(404, {"error": f"no route GET {self.path}"})

        def do_POST(self) -> None:
            if self.path not in ("/evaluate", "/jobs"):
                self._send(404, {"error": f"no route POST {self.path}"})
                return
            request = self._payload()
            if request is None:
                return
            job = service.submit(request)
            if self.path == "/jobs":
                self._send(202, {"job_id": job.id, "state": job.state})
                return
            job.done.wait()
            body = job.response()
            succeeded = [run for run in job.runs if run["status"] == "succeeded"]
            # Some benchmarks failing still returns the others' metrics; nothing to report at all is a 502.
            self._send(200 if succeeded else 502, body if succeeded else {**body, "error": "; ".join(body["errors"])})

    return Handler


def serve(settings: ServerSettings, host: str = "127.0.0.1", port: int = 9050,
          ready: threading.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT; running evaluations are stopped with the server."""
    service = EvalService(settings)
    httpd = ThreadingHTTPServer((host, port), make_handler(service))
    httpd.daemon_threads = True

    def stop(*_: Any) -> None:
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
    log.warning("eval server on http://%s:%d (backend %s, output %s)", host, httpd.server_port,
                settings.backend, settings.output_root)
    if ready:
        ready.set()
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        service.shutdown()
        httpd.server_close()


# --------------------------------------------------------------------------------------------
# Tools: start, query and stop an eval server from an assistant
# --------------------------------------------------------------------------------------------


class StartEvalServerInput(StrictModel):
    port: int = Field(9050, ge=1, le=65535, description="TCP port on 127.0.0.1; the call fails if it is taken.")
    output_root: str | None = Field(None, description="Where evaluations write; default <state dir>/eval-server/<port>.")
    backend: Backend = Field("nemo-skills", description="nemo-skills runs `ns eval`; nel runs NEL nemo_skills tasks.")
    max_concurrent_requests: int = Field(512, ge=1, description="Concurrent requests each benchmark sends to the router.")
    max_concurrent_jobs: int = Field(2, ge=1, le=32, description="Evaluations (rollouts) that run at once; more queue.")
    model_name: str = Field("slime-openai-model", description="Model name sent to the router's OpenAI API.")
    ns_command: str = Field("ns", description="The NeMo-Skills `ns` executable (name on PATH or path).")
    nel_command: str = Field("nel", description="The `nel` executable for the nel backend.")


class EvalServerInfo(BaseModel):
    record_id: str = Field(description="Ledger id; pass it to eval_server_status / stop_eval_server.")
    url: str
    pid: int
    log_path: str
    output_root: str
    backend: str
    status: str = Field(description="running, stopped or exited")
    health: dict[str, Any] | None = Field(None, description="The server's /health answer when it is up.")


class EvalServerIdInput(StrictModel):
    record_id: str = Field(description="The record_id start_eval_server returned.")


def _health(url: str, timeout: float = 2.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, OSError, json.JSONDecodeError):
        return None


def _running(pid: int) -> bool:
    """Whether the server's process group still has live members; reaps the leader if it was our child."""
    with contextlib.suppress(ChildProcessError):  # not our child (started by another process): nothing to reap
        os.waitpid(pid, os.WNOHANG)
    return bool(group_members(pid))


def start_eval_server(request: StartEvalServerInput) -> EvalServerInfo:
    """Use when an RL training loop should delegate periodic evaluations: starts the eval server (slime's eval-
    delegate API) on 127.0.0.1 in the background and waits for /health.
    """
    if not port_free(request.port):
        raise ToolError(f"port {request.port} on 127.0.0.1 is in use; pick another port")
    output_root = Path(request.output_root or state_dir() / "eval-server" / str(request.port)).expanduser()
    output_root.mkdir(parents=True, exist_ok=True)
    log_path = output_root / "server.log"
    argv = [
        sys.executable, "-m", "quanteval.cli", "serve-eval", "--host", "127.0.0.1", "--port", str(request.port),
        "--output-root", str(output_root), "--backend", request.backend,
        "--max-concurrent-requests", str(request.max_concurrent_requests),
        "--max-concurrent-jobs", str(request.max_concurrent_jobs), "--model-name", request.model_name,
        "--ns-command", request.ns_command, "--nel-command", request.nel_command,
    ]
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    url = f"http://127.0.0.1:{request.port}"
    deadline = time.monotonic() + 30
    health = None
    while time.monotonic() < deadline and health is None:
        if proc.poll() is not None:
            tail = "\n".join(tail_lines(log_path, 10))
            raise ToolError(f"the eval server exited with code {proc.returncode} at start; {log_path} ends with:\n{tail}")
        time.sleep(0.2)
        health = _health(url, timeout=1)
    if health is None:
        _kill_group(proc)
        raise ToolError(f"the eval server did not answer {url}/health within 30 s; see {log_path}")
    record = ledger.add(
        "eval_server", status="running", executor=request.backend, host="127.0.0.1",
        details={"pid": proc.pid, "url": url, "log_path": str(log_path), "output_root": str(output_root)},
    )
    return EvalServerInfo(record_id=record.id, url=url, pid=proc.pid, log_path=str(log_path),
                          output_root=str(output_root), backend=request.backend, status="running", health=health)


def _server_record(record_id: str) -> ledger.Record:
    record = ledger.get(record_id)
    if record.kind != "eval_server":
        raise ToolError(f"'{record_id}' is a {record.kind} record, not an eval server")
    return record


def _info(record: ledger.Record, state: str, health: dict[str, Any] | None) -> EvalServerInfo:
    d = record.details
    return EvalServerInfo(record_id=record.id, url=d["url"], pid=d["pid"], log_path=d["log_path"],
                          output_root=d["output_root"], backend=record.executor or "", status=state, health=health)


def eval_server_status(request: EvalServerIdInput) -> EvalServerInfo:
    """Use to check an eval server from start_eval_server: running or not, and its /health answer (backend
    readiness, queued/running/finished counts).
    """
    record = _server_record(request.record_id)
    if record.status == "stopped":
        return _info(record, "stopped", None)
    alive = _running(record.details["pid"])
    health = _health(record.details["url"]) if alive else None
    state = "running" if alive else "exited"
    if state != record.status:
        record = ledger.update(record.id, status=state)
    return _info(record, state, health)


def stop_eval_server(request: EvalServerIdInput) -> EvalServerInfo:
    """Use when the training run no longer needs evaluations: stops an eval server and its running evaluations
    (SIGTERM, then SIGKILL after 10 s).
    """
    record = _server_record(request.record_id)
    stop_group(record.details["pid"], grace_s=10, on_wait=lambda: _running(record.details["pid"]))
    record = ledger.update(record.id, status="stopped", message="stopped by stop_eval_server")
    return _info(record, "stopped", None)
