"""What the eval server and its benchmark backends share: slime's payload, the server's settings, the backend
interface and the shard commands a backend returns.

jobs (the job queue) picks a backend from its registry; the backends (nemo_skills, nel) import only this module, so
neither side imports the other.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from quanteval import redact
from quanteval.models import StrictModel
from quanteval.serving.frameworks import Execution

BackendName = Literal["nemo-skills", "nel"]
LOG_TAIL_LINES = 40



# --------------------------------------------------------------------------------------------
# The payload (slime's eval-delegate API)
# --------------------------------------------------------------------------------------------


MAX_TEMPERATURE = 100.0  # far above any sampling setting in use (0-2); beyond it a value is a mistake
SAMPLING_KEYS = ("n_samples_per_eval_prompt", "temperature", "top_p", "top_k", "max_response_len")


class BenchmarkSpec(BaseModel):
    """One benchmark of a delegate request; unset generation params fall back to `defaults`."""

    model_config = ConfigDict(extra="ignore")  # slime may send dataset fields this server does not use

    name: str
    n_samples_per_eval_prompt: int | None = Field(None, ge=1)
    # finite and bounded: NaN or 1e308 would reach `ns` and the router as they are
    temperature: float | None = Field(None, ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1, le=2**31 - 1)  # -1: off (vLLM, SGLang)
    max_response_len: int | None = Field(None, ge=1, le=2**31 - 1)
    max_problems: int | None = Field(None, ge=1, description="Evaluate only the first N problems (quick checks).")
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

    @field_validator("defaults")
    @classmethod
    def _sampling_defaults(cls, defaults: dict[str, Any]) -> dict[str, Any]:
        """The generation defaults a benchmark falls back to, held to the benchmark fields' own limits."""
        given = {key: defaults[key] for key in SAMPLING_KEYS if key in defaults}
        try:
            BenchmarkSpec.model_validate({"name": "defaults", **given})
        except ValidationError as exc:
            raise ValueError(payload_errors(exc)) from None
        return defaults

    @field_validator("router_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"router_url '{url}' must be an http(s) URL such as http://127.0.0.1:30000")
        return url.rstrip("/")

    def idempotency_key(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return f"rollout-{self.rollout_id}-{hashlib.sha256(canonical.encode()).hexdigest()[:16]}"


def generation_value(bench: BenchmarkSpec, defaults: dict[str, Any], key: str) -> Any:
    value = getattr(bench, key)
    return defaults.get(key) if value is None else value


def payload_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'payload'}: {err['msg']}" for err in exc.errors())


# --------------------------------------------------------------------------------------------
# Settings and the backend interface
# --------------------------------------------------------------------------------------------


DEFAULT_PORT = 9050
TOKEN_ENV_DEFAULT = "QUANTEVAL_EVAL_TOKEN"
# start_eval_server over MCP (workflow/confine.py): the token comes from a variable set for quanteval, never from
# any other (HOME, PATH, HF_TOKEN ...).
TOKEN_ENV_PATTERN = r"^QUANTEVAL_[A-Z0-9_]*TOKEN$"
# The shortest bearer token the eval server accepts beyond loopback: it guards a server that runs commands.
MIN_TOKEN_CHARS = 16
MIN_TOKEN_DISTINCT = 5  # a random hex secret of 16 characters has fewer in 2 of a million draws; `abab...` has 2


def token_refusal(token: str, token_env: str, *, loopback: bool) -> str | None:
    """Why the eval server must not serve with this token (None: it may). Beyond loopback it needs one of at least
    MIN_TOKEN_CHARS characters; on loopback none is needed, but one that is set is held to the same length."""
    fix = (f"Set {token_env} to a random secret of at least {MIN_TOKEN_CHARS} characters (e.g. `openssl rand -hex 16`) "
           "and send it as `Authorization: Bearer ...` (slime: the eval config's `headers`), or bind 127.0.0.1.")
    if not token:
        return None if loopback else (
            f"beyond loopback the eval server (which runs commands on this machine) requires a shared token. {fix}")
    if len(token) < MIN_TOKEN_CHARS:
        return f"the token in {token_env} has {len(token)} characters, fewer than {MIN_TOKEN_CHARS}. {fix}"
    if len(set(token)) < MIN_TOKEN_DISTINCT:
        return (f"the token in {token_env} uses {len(set(token))} distinct characters (fewer than {MIN_TOKEN_DISTINCT}): "
                f"a repeated letter or pattern is guessed first. {fix}")
    return None


class ServerSettings(StrictModel):
    """Every serve-eval option, in one place: the CLI's flags and start_eval_server's arguments are made from it."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    bind_host: str = Field("127.0.0.1", description="Address to bind (CLI: --host). Beyond loopback (0.0.0.0, a "
                           "container's address) the server requires a bearer token from the env var token_env names; "
                           "over MCP only if quanteval-mcp runs with --allow-open-eval-server.")
    port: int = Field(DEFAULT_PORT, ge=1, le=65535, description="TCP port.")
    output_root: Path | None = Field(None, description="Where evaluations write; start_eval_server defaults it to "
                                     "<state dir>/eval-server/<port>.")
    backend: BackendName = Field("nemo-skills", description="nemo-skills runs `ns eval`; nel runs NEL 0.2.6's nemo_skills tasks.")
    max_concurrent_requests: int = Field(512, ge=1, description="Concurrent requests each benchmark sends to the router.")
    max_concurrent_jobs: int = Field(2, ge=1, le=32, description="Evaluations (rollouts) that run at once; more queue.")
    model_name: str = Field("slime-openai-model", description="Model name sent to the router's OpenAI API.")
    ns_command: str = Field("ns", description="The NeMo-Skills `ns` executable (name on PATH or path); over MCP with "
                            "--root: `ns` or a path inside the root (nel_command likewise) unless --allow-open-eval-server.")
    cluster: str | None = Field(None, description="NeMo-Skills cluster config name (`ns eval --cluster`); default: an "
                                "`executor: none` config the server writes under output_root.")
    config_dir: str | None = Field(None, description="Directory of NeMo-Skills cluster configs (`--config_dir`).")
    data_dir: str | None = Field(None, description="NeMo-Skills data dir (`--data_dir`); default: the installed "
                                 "package's nemo_skills/dataset, where `ns prepare_data` writes.")
    server_type: Literal["sglang", "vllm", "openai"] = Field(
        "sglang", description="NeMo-Skills server type for the router: sglang/vllm send top_k, openai cannot "
        "(a top_k then gets a 400).")
    nel_command: str = Field("nel", description="The `nel` executable for the nel backend.")
    nel_execution: Execution = Field("local", description="NEL 0.2.6's executor for the nel backend.")
    job_timeout_s: float = Field(6 * 3600, gt=0, description="Seconds before a benchmark's processes are killed.")
    results_wait_s: float = Field(600, ge=0, description="nel backend: seconds to wait for results.yml after NEL 0.2.6 returns.")
    orphan_grace_s: float = Field(600, ge=0, description="A POST /evaluate job that no client waits for any more is "
                                  "cancelled after this many seconds (POST /jobs jobs never are).")
    allow_partial: bool = Field(False, description="Answer 200 when some benchmarks failed and others succeeded "
                                "(default: 502, with the good benchmarks' metrics still in the body).")
    idle_timeout_s: float = Field(30, gt=0, le=3600, description="A connection silent this many seconds, or not done "
                                  "sending its request body within them, is closed.")
    token_env: str = Field(TOKEN_ENV_DEFAULT, description="Env var holding the bearer token clients must send "
                           "(Authorization: Bearer ...); required when bind_host is not loopback. Over MCP it must be "
                           f"named QUANTEVAL_...TOKEN and hold at least {MIN_TOKEN_CHARS} characters.")

    @staticmethod
    def cli_flag(field: str) -> str:
        """The serve-eval flag of a field: `--host` for bind_host (as slime's reference server spells it)."""
        return "--host" if field == "bind_host" else "--" + field.replace("_", "-")

    @property
    def root(self) -> Path:
        assert self.output_root is not None, "output_root is set before the service starts"
        return self.output_root


@dataclass
class ShardCommand:
    argv: list[str]
    env: dict[str, str]
    output_dir: Path
    log_path: Path
    cwd: Path | None = None
    # What argv[0], a Python console script, imports before anything else: the eval server imports it once in a warm
    # Python (quanteval/forkserver.py) and forks each such command from it. None: a process of its own.
    preload: str | None = None
    # The modules the preload imported that the command's own `python -m` children may run forked from it (attach), each
    # with the arguments to put first: only those that then run as they would cold.
    attach: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


# Runs commands as the job's own (warm where they can be, stopped with the job): their exit codes, None where killed at
# the job's timeout.
RunCommands = Callable[[list[ShardCommand]], list[int | None]]


class Backend(Protocol):
    def readiness(self, settings: ServerSettings) -> dict[str, Any]: ...

    def refuse(self, settings: ServerSettings, request: EvalRequest) -> str | None: ...

    def commands(self, settings: ServerSettings, request: EvalRequest, bench: BenchmarkSpec, bench_dir: Path,
                 expname: str) -> list[ShardCommand]: ...

    def metrics(self, settings: ServerSettings, bench: BenchmarkSpec, bench_dir: Path,
                commands: list[ShardCommand], run: RunCommands) -> dict[str, Any]: ...



def tail_lines(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = 64_000) -> list[str]:
    """The last lines of a log as tools show them (secrets masked, lines capped), reading at most max_bytes from its end."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read()
    except OSError:
        return []
    return redact.shown_lines(data.decode("utf-8", errors="replace").splitlines()[-lines:])
