"""The nel-next engine (NeMo Evaluator >= 0.3): configs, schema validation and the run lifecycle.

nel-next needs Python >= 3.12 and has its own pins, so it lives in its own venv (scripts/setup-nel-next builds
`.venv-nel-next`) and quanteval drives its `nel` CLI in child processes: `nel eval run CONFIG -o DIR` in a session
of its own, its output in DIR/quanteval-run.log and its exit code in DIR/quanteval-exit-code (a shell wrapper writes
it, so any later process can read it). What a run produced is read from DIR by quanteval.engines.nel_next.nextresults.

Facts this module relies on (nemo-evaluator 0.3.0, measured here):
- a config is `services` / `benchmarks` / `cluster` / `output` (pydantic EvalConfig, extra keys forbidden);
  `nel eval run` takes `-O a.b=v` overrides (list items by index: `benchmarks.0.max_problems=10`);
- the local executor writes DIR/checkpoint.json with `completed_benchmarks` and `failed_benchmarks` (benchmark
  name -> error), DIR/<benchmark>/eval-*.json and results.jsonl per benchmark;
- the exit code is not to be trusted alone ("Completed 0 benchmark(s). 1 failed" has exited 0): a run succeeded
  only when every configured benchmark is completed and none failed (nextresults.run_outcome).
- `cluster.type: slurm` with a `hostname`: `nel eval run --submit` writes the sbatch script (bare `nel eval run` on
  the node, or its eval_image through pyxis), copies it with scp into a timestamped directory under output.dir on
  the cluster, submits it with `ssh HOST sbatch`, prints "SLURM job submitted: ID" per shard and keeps each job's
  metadata (hostname, username, remote_dir) in $XDG_DATA_HOME/nel/jobs/ID/slurm_job.json. The job appends its own
  id, and that of each auto-resume successor (afternotok), to remote_dir/.nel_job_chain. With `cluster.shards: N`
  it submits one job per shard, each with remote_dir .../shard_<i>; `nel eval merge DIR` merges DIR/shard_*/ into
  DIR/<benchmark>/ (fetch_results copies them back and runs it, as a user would).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from quanteval import envvars, ledger, paths, redact, warm_python
from quanteval.clusters import executor as executors
from quanteval.clusters import ssh
from quanteval.clusters.executor import ClusterJob, LocalJob
from quanteval.configfile import MISSING
from quanteval.engines.base import Reading
from quanteval.engines.nel_next import clustertypes, nel_cli, servers, skillnames
from quanteval.localproc import missing_programs, require_writable_dir
from quanteval.models import ToolError

LOG_NAME = "quanteval-run.log"
EXIT_CODE_NAME = "quanteval-exit-code"
LOCAL_JOB = "nel eval run"  # a local run's one job, as run_status and kill_run name it
CHECK_TIMEOUT_S = 120.0
SUBMIT_TIMEOUT_S = 180.0
SUBMITTED = re.compile(r"SLURM job submitted: (\d+)")
CHAIN_FILE = ".nel_job_chain"
# What a run's verdict is read from on the cluster (not trajectories, logs or caches: those can be large). The
# inference log holds each answer's finish reason and token counts: without it a cluster run's truncation and output
# length were "unverified" where the same run here had them (its responses are results.jsonl's again: twice the bytes).
RESULT_FILES = ["checkpoint.json", "nel_run.json", "eval-*.json", "results.jsonl", "inference_log.jsonl",
                "runtime_stats.json", "nel_eval.sbatch"]
MAX_PROBLEMS_OVERRIDE = "benchmarks.{index}.max_problems={value}"
REPEATS_OVERRIDE = "benchmarks.{index}.repeats={value}"


# ---------------------------------------------------------------- where nel-next lives


def venv() -> Path:
    return envvars.engine_venv("QUANTEVAL_NEL_NEXT_VENV", ".venv-nel-next")


def nel_binary() -> Path:
    """The nel-next CLI, or a ToolError that says how to get it."""
    binary = venv() / "bin" / "nel"
    if not os.access(binary, os.X_OK):
        raise ToolError(f"nel-next is not installed at {venv()}: run `{envvars.setup_command('setup-nel-next', 'QUANTEVAL_NEL_NEXT_VENV')}` (it builds "
                        f"{venv()} with Python 3.12), or set QUANTEVAL_NEL_NEXT_VENV (in the MCP server's environment) to "
                        "the absolute path of a venv with nemo-evaluator>=0.3.")
    return binary


def nel_command() -> list[str]:
    """How quanteval starts a local `nel`: its CLI with each adapter proxy on a port of its own (nel_cli.py says
    why; `-P`: the script's folder, quanteval's modules, stays off the child's import path)."""
    nel_binary()
    return [str(venv() / "bin" / "python"), "-P", str(Path(__file__).with_name("nel_cli.py"))]


def data_home() -> Path:
    """nel-next's XDG data home (its run store and SLURM job metadata), kept with quanteval's own state."""
    return envvars.state_dir() / "nel-next-data"


# nel-next evaluates only one shard of each benchmark when these are set (engine/sharding.shard_from_env), and says so
# nowhere but in the bundle: a run quanteval starts here is the whole benchmark, even when quanteval itself runs inside
# a SLURM array job. Shards are `cluster.shards` on SLURM, where nel-next sets them in each job's script.
SHARD_VARIABLES = ("NEL_SHARD_IDX", "NEL_TOTAL_SHARDS", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT")


def child_env() -> dict[str, str]:
    # The child is another Python: our venv's variables must not leak into it, nor a shard of someone else's.
    dropped = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", *SHARD_VARIABLES)
    env = {key: value for key, value in os.environ.items() if key not in dropped}
    env.setdefault("NEMO_EVALUATOR_TELEMETRY_LEVEL", "0")
    env["XDG_DATA_HOME"] = str(data_home())
    return env


def run_script(python: Path, script: str, *args: str, preload: str | None = None) -> subprocess.CompletedProcess[str]:
    """A Python script run by another venv's interpreter (nel-next's, NeMo-Skills'): it answers on its last stdout line.
    With `preload`, from this process's second ask on, in a child forked from a warm process that imported it once
    (quanteval/warm_python.py)."""
    if preload is not None:
        return warm_python.run(str(python), preload, script, list(args), child_env(), CHECK_TIMEOUT_S, cold_first=True)
    return subprocess.run([str(python), "-c", script, *args], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S,
                          stdin=subprocess.DEVNULL, env=child_env(), check=False)


def last_json(stdout: str) -> Any:
    """The JSON answer a script printed last; None when it printed nothing."""
    lines = stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else None


# ---------------------------------------------------------------- configs


def benchmark_item(name: str) -> dict[str, Any]:
    """A `benchmarks` list item that runs `name` against the config's `model` service with the simple solver."""
    return {"name": name, "solver": {"type": "simple", "service": "model"}}


def config_document(*, benchmarks: list[str], protocol: str, output_dir: str, execution: str) -> dict[str, Any]:
    """A nel-next config for an existing OpenAI-compatible endpoint (`type: api`), one simple solver per benchmark.

    `???` marks what only the deployment, the checkpoint or the person can tell (list_missing_values finds them).
    """
    return {
        "services": {"model": {"type": "api", "url": MISSING, "protocol": protocol, "model": MISSING,
                               "generation": {"max_tokens": MISSING, "temperature": 0.0}}},
        "benchmarks": [{**benchmark_item(name), "repeats": 1} for name in benchmarks],
        "cluster": cluster.cluster_section() if (cluster := clustertypes.of(execution)) else {"type": execution},
        "output": {"dir": output_dir, "timestamped": False},
    }


def endpoint_url(base_or_chat_url: str, protocol: str) -> str:
    """The URL nel-next posts to for this protocol, from a server's base or chat-completions URL."""
    base = base_or_chat_url.rstrip("/")
    for suffix in ("/chat/completions", "/completions", "/responses"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return f"{base}/{'chat/completions' if protocol == 'chat_completions' else 'completions'}"


# What the schema check imports (~0.6 CPU-s a child): a warm process imports it once and forks the later checks from it.
_SCHEMA_PRELOAD = """
from pydantic import ValidationError
from nemo_evaluator.cli.eval import _apply_override
from nemo_evaluator.config import parse_eval_config
from nemo_evaluator.config.compose import _prune_nulls, compose_config
from nemo_evaluator.config.eval_config import _expand_env, _resolve_playbooks
from nemo_evaluator.config.output import OutputConfig
"""
_SCHEMA_CHECK = _SCHEMA_PRELOAD + r"""
import copy, json, sys
import pathlib, nemo_evaluator
path, overrides = sys.argv[1], json.loads(sys.argv[2])
problems = []
# the YAML files composing reads besides the config and nel-next's own (defaults: fragments, _base_, playbook:)
files_read, package, read_text = [], pathlib.Path(nemo_evaluator.__file__).parent.resolve(), pathlib.Path.read_text
def recording_read_text(self, *args, **kwargs):
    resolved = self.resolve()
    if resolved != pathlib.Path(path).resolve() and not resolved.is_relative_to(package) and str(resolved) not in files_read:
        files_read.append(str(resolved))
    return read_text(self, *args, **kwargs)
pathlib.Path.read_text = recording_read_text
expanded = None  # what nel-next reads before its schema check: composed, overridden, playbooks merged, ${VAR} expanded
try:
    raw = compose_config(path)
    for override in overrides:
        _apply_override(raw, override)
    _prune_nulls(raw)
    expanded = _expand_env(_resolve_playbooks(copy.deepcopy(raw)))
    if isinstance(expanded.get("output", {}), dict):
        expanded.setdefault("output", {}).setdefault("dir", OutputConfig.model_fields["dir"].default)
    config = parse_eval_config(raw)
    out = {"ok": True, "benchmarks": [b.name for b in config.benchmarks], "cluster": config.cluster.type,
           "output_dir": config.output.dir, "resolved": config.model_dump(mode="json")}
except ValidationError as exc:
    def where(loc):
        # pydantic puts a discriminated union's tag into loc (services.model.api.x): drop it, users write no such key
        kept = [str(p) for i, p in enumerate(loc) if not (i and str(loc[i - 1]) in parents and p in tags)]
        return ".".join(kept)
    tags = {"api", "vllm", "sglang", "nim", "docker_model", "dynamo", "simple", "local", "slurm", "docker", "gym", "nat"}
    parents = set(raw.get("services") or {}) | {"solver", "cluster"}
    out = {"ok": False, "problems": [{"path": where(e["loc"]), "message": e["msg"]} for e in exc.errors()], "resolved": expanded}
except Exception as exc:
    out = {"ok": False, "problems": [{"path": "", "message": f"{type(exc).__name__}: {exc}"}]}
out["files_read"] = files_read
print(json.dumps(out, default=str))
"""


@dataclasses.dataclass(frozen=True)
class NextReading(Reading):
    """nel-next's reading (check_schema): `resolved` is the schema-checked config where `ok`, else as read before the
    schema check (composed, overridden, ${VAR} expanded) where only that failed; `files_read`: defaults, playbooks."""
    ok: bool = False
    problems: list[dict[str, str]] = dataclasses.field(default_factory=list)  # each {"path", "message"}, where not ok
    benchmarks: list[str] = dataclasses.field(default_factory=list)
    cluster: str | None = None  # its cluster type
    output_dir: str | None = None


# check_schema answers by (path, size, mtime, overrides): a launch asks several times and each ask is a ~1 s child.
# An answer is kept with the files it composed in as they were: an edit to a defaults fragment is read afresh.
_SCHEMA_CACHE: dict[tuple[str, int, int, tuple[str, ...]], tuple[NextReading, tuple[tuple[str, int, int], ...]]] = {}


def check_schema(config_path: str, overrides: list[str] | None = None) -> NextReading:
    """nel-next's own reading of the config: its composer, override parser and pydantic EvalConfig (the oracle)."""
    try:
        stat = Path(config_path).stat()
        key = (str(Path(config_path).resolve()), stat.st_size, stat.st_mtime_ns, tuple(overrides or []))
    except OSError:
        key = None
    kept = _SCHEMA_CACHE.get(key) if key is not None else None
    if kept is not None and kept[0].stats() == kept[1]:
        return copy.deepcopy(kept[0])
    answer = _ask_schema(config_path, overrides)
    if key is not None:
        if len(_SCHEMA_CACHE) > 64:
            _SCHEMA_CACHE.clear()
        _SCHEMA_CACHE[key] = (copy.deepcopy(answer), answer.stats())
    return answer


def _ask_schema(config_path: str, overrides: list[str] | None) -> NextReading:
    python = venv() / "bin" / "python"
    nel_binary()
    try:
        done = run_script(python, _SCHEMA_CHECK, config_path, json.dumps(overrides or []), preload=_SCHEMA_PRELOAD)
    except subprocess.TimeoutExpired:
        raise ToolError(f"nel-next did not read {config_path} within {CHECK_TIMEOUT_S:.0f} s.") from None
    answer = last_json(done.stdout) if done.returncode == 0 else None
    if answer is None:
        raise ToolError(f"nel-next could not be asked about {config_path}: {redact.scrub(done.stderr.strip() or 'no output')[-400:]}")
    return NextReading(**answer)


def config_hash(config_path: str, overrides: list[str]) -> str:
    """What the canary gate compares: the config text and the overrides that change what is evaluated."""
    text = Path(config_path).read_bytes()
    kept = sorted(o for o in overrides if ".max_problems=" not in o and ".repeats=" not in o and not o.startswith("output."))
    return "sha256:" + hashlib.sha256(text + json.dumps(kept).encode()).hexdigest()[:16]


def canary_overrides(benchmark_count: int, max_problems: int, repeats: int | None) -> list[str]:
    overrides = [MAX_PROBLEMS_OVERRIDE.format(index=i, value=max_problems) for i in range(benchmark_count)]
    if repeats:
        overrides += [REPEATS_OVERRIDE.format(index=i, value=repeats) for i in range(benchmark_count)]
    return overrides


# ---------------------------------------------------------------- the run lifecycle


def start(config_path: str, overrides: list[str], run_dir: Path, resume: bool = False,
          config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Start `nel eval run` on this machine (LocalExecutor: a session of its own); the details a ledger record keeps.
    `config` (as the run reads it) has its managed servers prepared (servers.py); a resumed run keeps its own."""
    require_writable_dir(run_dir, "output.dir", "Choose a writable directory (set_config_value key output.dir).")
    if config is not None:
        servers.prepare(config, run_dir, venv() / "bin" / "python")
    argv = [*nel_command(), "eval", "run", config_path, "-o", str(run_dir)]
    argv += [item for override in overrides for item in ("-O", override)]
    argv += ["--resume"] if resume else []
    job = executors.LOCAL.start(LOCAL_JOB, argv, run_dir, servers.path_env(child_env(), run_dir), log_name=LOG_NAME,
                                exit_name=EXIT_CODE_NAME)
    return {"engine": "nel-next", "pid": job.pgid, "pgid": job.pgid, "run_dir": str(run_dir), "argv": argv,
            "log_path": job.log_path, "started_at": time.time()}


def jobs(details: dict[str, Any]) -> list[ClusterJob] | list[LocalJob]:
    """A run's jobs as its executor finds them again: one SLURM job per shard (with nel-next's job chain, which also
    retries a failed job), or the local `nel eval run`."""
    return cluster_jobs(details) if details.get("slurm_jobs") else [local_job(details)]


def cluster_jobs(details: dict[str, Any]) -> list[ClusterJob]:
    submitted = details["slurm_jobs"]
    return [ClusterJob(job_id=f"shard {index}" if len(submitted) > 1 else LOCAL_JOB, hostname=job["hostname"],
                       username=job["username"] or ssh.ssh_user(job["hostname"]), remote_dir=job["remote_dir"],
                       slurm_job_id=str(job["job_id"]), chain_file=CHAIN_FILE, retries_failed=True,
                       done_file=job.get("done_file"))
            for index, job in enumerate(submitted)]


def local_job(details: dict[str, Any]) -> LocalJob:
    """A local run's `nel eval run` as LocalExecutor finds it again, from its record's details."""
    run_dir = Path(details["run_dir"])
    return LocalJob(job_id=LOCAL_JOB, pgid=details["pgid"], directory=str(run_dir), exit_file=str(run_dir / EXIT_CODE_NAME),
                    log_path=details.get("log_path") or str(run_dir / LOG_NAME))


RUN_FACTS_NAME = "quanteval-run.json"
def run_facts(config: dict[str, Any], details: dict[str, Any], harness: dict[str, str] | None = None) -> dict[str, Any]:
    """What compare_results checks for comparability: the config as nel-next read it (secrets redacted), the
    checkpoint, what the server reported serving, how quanteval served it and, for a run on this machine, the harness
    that graded it beyond nel-next itself (its bundle records its own version). nel-next keeps none of this."""
    return {"config": redact.redact_config(config), "checkpoint": details.get("checkpoint"),
            "served": details.get("served") or {}, "serving": details.get("serving"), "harness": harness or {}}


def local_harness(config: dict[str, Any]) -> dict[str, str]:
    """NeMo-Skills in nel-next's venv here, for a config with skills:// benchmarks: its version, and its commit where
    pip recorded one (installed from git) or the folder it was installed from. A change of NeMo-Skills changes the
    prompts and the grading of every skills:// benchmark."""
    if not any(str(b.get("name", "")).startswith("skills://") for b in config.get("benchmarks") or []):
        return {}
    for info in sorted(venv().glob("lib/python*/site-packages/nemo_skills-*.dist-info")):
        version = info.name.removeprefix("nemo_skills-").removesuffix(".dist-info")
        try:
            origin = json.loads((info / "direct_url.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            origin = {}
        commit = (origin.get("vcs_info") or {}).get("commit_id") or Path(str(origin.get("url") or "")).name
        return {"nemo-skills": f"{version} ({commit})" if commit else version}
    return {"nemo-skills": "not installed"}


def write_run_facts(run_dir: Path, facts: dict[str, Any]) -> None:
    paths.write_file(run_dir / RUN_FACTS_NAME, json.dumps(facts, indent=1))


def read_run_facts(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / RUN_FACTS_NAME
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


def launch_blocker(checked: NextReading) -> str | None:
    """What this machine lacks to start a run of the (schema-checked) config: told before anything is recorded."""
    if not checked.ok or checked.resolved is None:
        first = checked.problems[0]
        return f"nel-next rejects the config: {first['path'] or '(config)'}: {first['message']}. Run validate_config."
    for name in skillnames.skills_names(checked.resolved.get("benchmarks") or []).values():
        if problem := skillnames.name_problem(name):
            return problem  # nel-next would import it as NeMo-Skills' dataset module
    if unstartable := servers.problems(checked.resolved):
        name, found = next(iter(unstartable.items()))
        return f"services.{name}: {found.problem} {found.fix}"
    cluster = clustertypes.of(checked.cluster)
    return missing_programs(f"nel-next's {cluster.name} launch", cluster.binaries) if cluster else None


def with_overrides(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """A copy of a composed config with the overrides quanteval adds to a launch (a canary's max_problems and repeats,
    a SLURM run's output.dir) applied as nel-next's `-O` applies them (cli/eval._apply_override: dotted keys, list
    items by index, ints, floats, booleans and null parsed): what the run records as its config without a second
    schema child for values nel-next's schema check has already seen the kind of."""
    config = copy.deepcopy(config)
    for override in overrides:
        key, _, text = override.partition("=")
        value: Any = text
        if text in ("null", "Null", "NULL", "~"):
            value = None
        elif text.lower() in ("true", "false"):
            value = text.lower() == "true"
        else:
            for parse in (int, float):
                try:
                    value = parse(text)
                    break
                except ValueError:
                    continue
        *parents, last = key.strip().split(".")
        node: Any = config
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return config


def launch(record: ledger.Record, config_path: str, overrides: list[str], extra: list[str], checked: NextReading,
           cluster: clustertypes.ClusterType, run_dir: Path, details: dict[str, Any]) -> ledger.Record:
    """Start the run of the checked config (the user's `overrides`, then quanteval's `extra`) on its cluster type's
    row and record it in `record` (written before the start), in one ledger write."""
    run_overrides = [*overrides, *extra]
    config = with_overrides(checked.resolved or {}, extra)
    details = {**details, "overrides": overrides, "run_overrides": run_overrides}
    if cluster.submits:
        return submit(record, config_path, run_overrides, config, {**details, "tasks": checked.benchmarks})
    started = start(config_path, run_overrides, run_dir, config=config)
    try:
        write_run_facts(run_dir, run_facts(config, details, local_harness(config)))
        return ledger.update(record.id, status="running", config_hash=config_hash(config_path, overrides),
                             invocation_id=f"nel-next:{run_dir}", executor="local",
                             details={**details, **started, "tasks": checked.benchmarks},
                             message=f"started: {shlex.join(started['argv'])}")
    except BaseException:
        executors.LOCAL.cancel([local_job(started)], grace_s=5)  # a run its record does not name would run unwatched
        raise


def benchmark_file(name: str) -> str | None:
    """The Python file a benchmark name makes nel-next import (`path/file.py` or `path/file.py:bench`, as its
    environments.registry._resolve_file_bench reads a name), or None for a built-in, skills://, lm-eval:// ... name."""
    file_path = name
    if ":" in name and not name.startswith(("http://", "https://")):
        candidate = name.rsplit(":", 1)[0]
        if candidate.endswith(".py"):
            file_path = candidate
    return file_path if file_path.endswith(".py") else None


SKILLS_BENCHMARK_MAP = "NEMO_SKILLS_EXTRA_BENCHMARK_MAP"  # NeMo-Skills' own variable: NAME -> a benchmark folder of one's own
NODE_ENV_FILES = (SKILLS_BENCHMARK_MAP,)  # variables of the job's export that name a file the node reads


def job_exports(cluster: dict[str, Any] | None) -> dict[str, str]:
    """The variables a SLURM job's `--export` (cluster.sbatch_extra_flags.export, e.g. "ALL,PATH=...,NAME=VALUE")
    names, with their values ("" for a name given bare)."""
    export = str(((cluster or {}).get("sbatch_extra_flags") or {}).get("export") or "")
    return {name.strip(): value for name, _, value in (part.partition("=") for part in export.split(",")) if name.strip()}


def files_read_on_node(config: dict[str, Any], config_dir: Path) -> list[str]:
    """What a SLURM job of this (composed) config reads by path on the node: BYOB benchmark files, instruction
    templates (a bare name is one of nel-next's built-ins) and the files the job's export names (a NeMo-Skills
    benchmark map). Relative paths as nel-next resolves them, against the directory it is started in."""
    paths: list[str] = []
    for bench in config.get("benchmarks") or []:
        if not isinstance(bench, dict):
            continue
        paths += [file] if (file := benchmark_file(str(bench.get("name") or ""))) else []
        template = str(bench.get("instruction_template") or "")
        paths += [template] if "/" in template else []
    paths += [value for name, value in job_exports(config.get("cluster")).items() if name in NODE_ENV_FILES and value]
    return list(dict.fromkeys(str(config_dir / Path(path).expanduser()) for path in paths))


def node_files_blocker(checked: NextReading, config_path: str) -> str | None:
    """For a SLURM config: the files its job reads by path that the cluster's login host does not have (the nodes see
    its shared file systems), asked over ssh before anything is recorded or submitted."""
    cluster, config = clustertypes.of(checked.cluster), checked.resolved or {}
    host = cluster.executor.login_host(config.get("cluster") or {}) if cluster else None
    if not host:
        return None
    paths = files_read_on_node(config, Path(config_path).resolve().parent)
    if not paths:
        return None
    command = "for f in " + " ".join(shlex.quote(p) for p in paths) + '; do test -e "$f" || printf "%s\\n" "$f"; done'
    missing = [line for line in ssh.run_remote(str(host), command, timeout=CHECK_TIMEOUT_S).stdout.splitlines() if line.strip()]
    if not missing:
        return None
    return (f"the SLURM job reads {len(missing)} file(s) by path on the node that {host} does not have: "
            f"{', '.join(missing[:5])}. Nothing was submitted. Copy them to the cluster at the same path "
            f"(scp FILE {host}:FILE), or point the config at the cluster's copies.")


def submit(record: ledger.Record, config_path: str, overrides: list[str], config: dict[str, Any], details: dict[str, Any]) -> ledger.Record:
    """`nel eval run --submit` of `config` (as the run reads it) to its SLURM cluster (`overrides`: all the run's,
    quanteval's included); records each shard's job and where it runs (`details` with the run's tasks)."""
    kind = record.kind
    if not (config.get("cluster") or {}).get("hostname"):
        raise ToolError("cluster.hostname: nel-next submits over ssh to the login host it names; set it (the ssh config "
                        "alias, as for ssh_check), or run on this machine with cluster.type local.")
    argv = [*nel_command(), "eval", "run", str(Path(config_path).resolve()), "--submit"]
    argv += [item for override in overrides for item in ("-O", override)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S, stdin=subprocess.DEVNULL,
                              cwd=Path(config_path).resolve().parent, env=child_env(), check=False)
    except subprocess.TimeoutExpired:
        raise ToolError(f"nel-next did not finish submitting within {SUBMIT_TIMEOUT_S:.0f} s (ssh to the login host "
                        "hanging?); check it with ssh_check.") from None
    job_ids = SUBMITTED.findall(done.stdout)
    if done.returncode != 0 or not job_ids:
        said = [line for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()][-4:]
        raise ToolError(f"nel-next did not submit the {kind.replace('_', ' ')}: {redact.scrub(' | '.join(said))[-800:]}")
    holds = nel_cli.WAIT_VARIABLE in job_exports(config.get("cluster")) and len(job_ids) == 1
    jobs = []
    for job_id in job_ids:
        meta = json.loads((data_home() / "nel" / "jobs" / job_id / "slurm_job.json").read_text())
        jobs.append({"job_id": job_id, "hostname": meta["hostname"], "username": meta.get("username") or None,
                     "remote_dir": meta["remote_dir"], **({"done_file": nel_cli.DONE_FILE} if holds else {})})
    results_dir = data_home() / "results" / f"{jobs[0]['hostname']}-{job_ids[0]}"
    facts = run_facts(config, details)
    return ledger.update(record.id, status="submitted", config_hash=config_hash(config_path, overrides),
                         invocation_id=f"nel-next:slurm:{job_ids[0]}", executor="slurm", host=jobs[0]["hostname"],
                         details={**details, "engine": "nel-next",
                                  "slurm_jobs": jobs, "argv": argv, "results_dir": str(results_dir), "run_facts": facts},
                         message=f"submitted to {jobs[0]['hostname']}: SLURM job {', '.join(job_ids)}")


def without_hold(config: dict[str, Any]) -> list[str]:
    """The override that takes nel_cli's hold out of a SLURM job's export (a full run submitted as a job of its own
    has no next run to serve on for); none where the config sets no hold."""
    exports = job_exports(config.get("cluster"))
    if nel_cli.WAIT_VARIABLE not in exports:
        return []
    kept = ",".join(name if value == "" else f"{name}={value}" for name, value in exports.items()
                    if name != nel_cli.WAIT_VARIABLE)
    return [f"cluster.sbatch_extra_flags.export={kept}"]


def _held_job(held: ledger.Record) -> dict[str, Any] | None:
    """The one SLURM job of the run `held` where it serves on once the run is done (nel_cli's hold), else None."""
    submitted = held.details.get("slurm_jobs") or []
    return submitted[0] if len(submitted) == 1 and submitted[0].get("done_file") else None


def _tell(job: dict[str, Any], word: str, before: str = "") -> bool:
    """Claim the held job (nel_cli.CLAIM_DIR: a job that gave up waiting made it itself, and must not be told after it
    left), then give it `word`, in one ssh round trip after the shell text `before`: whether the job was told."""
    held_dir = job["remote_dir"].rstrip("/")
    claim, next_file = (shlex.quote(f"{held_dir}/{name}") for name in (nel_cli.CLAIM_DIR, nel_cli.NEXT_FILE))
    command = (f"{before}mkdir {claim} 2>/dev/null && printf %s {shlex.quote(word)} > {next_file}.tmp && "
               f"mv {next_file}.tmp {next_file} && echo told")
    return ssh.run_remote(job["hostname"], command, timeout=CHECK_TIMEOUT_S).stdout.split()[-1:] == ["told"]


def continue_in_job(record: ledger.Record, held: ledger.Record, config_path: str, overrides: list[str],
                    config: dict[str, Any], details: dict[str, Any]) -> ledger.Record | None:
    """The run inside the SLURM job of the run `held` (a canary whose job serves on once it is done, nel_cli's hold):
    its configs (nel-next's own, as `--submit` would write them) put in the run's directory on the cluster, then the
    job told to evaluate them against its server: one ssh round trip. None, with nothing started, where that job
    no longer waits (it gave up, ended, or is not one that holds)."""
    job = _held_job(held)
    if job is None:
        return None
    remote_dir = str(config.get("output", {}).get("dir") or "")
    rendered, error = render_sbatch(config_path, overrides)
    if error or not rendered or not remote_dir.startswith("/"):
        raise ToolError(f"nel-next did not write the {record.kind.replace('_', ' ')}'s configs: {error or 'no output.dir'}")
    staged = rendered[0][0].parent
    try:
        sidecars = {path.name: path.read_text() for path in sorted(staged.glob("config_*.yaml"))}
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    # the script nel-next would have submitted: the run's directory laid out as a submitted run's (nextresults reads
    # it so), saying where the run went instead
    script_path, script = rendered[0]
    shebang, _, body = script.partition("\n")
    sidecars[script_path.name] = (f"{shebang}\n# quanteval: not submitted; this run ran in SLURM job {job['job_id']} "
                                  f"({held.kind.replace('_', ' ')} {held.id}), against that job's server\n{body}")
    writes = "".join(f"cat > {shlex.quote(f'{remote_dir}/{name}')} <<'{END_OF_CONFIG}'\n{text.rstrip()}\n{END_OF_CONFIG}\n"
                     for name, text in sidecars.items())
    if not _tell(job, remote_dir, before=f"mkdir -p {shlex.quote(remote_dir)} && {writes}"):
        return None
    jobs = [{key: value for key, value in job.items() if key != "done_file"} | {"remote_dir": remote_dir}]
    results_dir = data_home() / "results" / f"{job['hostname']}-{job['job_id']}-{record.id}"
    return ledger.update(record.id, status="running", config_hash=config_hash(config_path, overrides),
                         invocation_id=f"nel-next:slurm:{job['job_id']}", executor="slurm", host=job["hostname"],
                         details={**details, "engine": "nel-next", "slurm_jobs": jobs, "in_job_of": held.id,
                                  "results_dir": str(results_dir), "run_facts": run_facts(config, details)},
                         message=f"running in SLURM job {job['job_id']} on {job['hostname']}, after {held.id}, "
                                 "against its server")


END_OF_CONFIG = "QUANTEVAL_CONFIG_END"


def release_hold(held: ledger.Record) -> bool:
    """Tell the job that serves on after the run `held` (nel_cli's hold) that no next run comes: it ends now, its report
    written. False where it waits for nothing (no hold, or already told, or it gave up), or the cluster did not answer."""
    job = _held_job(held)
    if job is None:
        return False
    try:
        return _tell(job, "")
    except ToolError:
        return False


def fetch_results(executor: executors.Executor, details: dict[str, Any]) -> Path:
    """The run's results where this process can read them: a local run's own directory; a SLURM run's, copied from
    the cluster into its local mirror (details['results_dir']) afresh.

    nel-next 0.3.0 on SLURM runs each benchmark as a sub-run: RUN/<benchmark key>/checkpoint.json and
    RUN/<benchmark key>/<benchmark>/eval-*.json. With shards, each job writes RUN/shard_<i>/ so, and the last shard
    to finish merges them into RUN/<benchmark>/ (nel-next's own merge, on the node). The small files are copied
    (bundles, per-problem results, checkpoints; not logs or trajectories); where the shards are there but no merged
    bundle is (the merging job died), nel-next's `nel eval merge` is run here on the copy, as a user would."""
    from quanteval.engines.nel_next import nextresults

    run_jobs = jobs(details)
    first = run_jobs[0].directory.rstrip("/")
    sharded = len(run_jobs) > 1 or first.rsplit("/", 1)[-1].startswith("shard_")
    top = first.rsplit("/", 1)[0] if sharded else first
    local = executor.fetch(run_jobs[0], Path(details.get("results_dir") or top), tuple(RESULT_FILES), directory=top)
    if sharded:
        for job in run_jobs:  # a shard whose job never started has no directory: it counts as unfinished
            (local / job.directory.rstrip("/").rsplit("/", 1)[-1]).mkdir(exist_ok=True)
        if not nextresults.bundles(local) and any(local.glob("shard_*/**/results.jsonl")):
            done = subprocess.run([*nel_command(), "eval", "merge", str(local)], capture_output=True, text=True,
                                  timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL, env=child_env(), check=False)
            if done.returncode != 0:
                said = [line for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()][-3:]
                raise ToolError(f"nel eval merge of {local} failed: {redact.scrub(' | '.join(said))[-600:]}")
    if "run_facts" in details:  # a submitted run's facts live in its record: nel-next writes none on the node
        paths.write_file(local / RUN_FACTS_NAME, json.dumps(details["run_facts"] or {}, indent=1))
    return local


def resume(config_path: str, details: dict[str, Any]) -> tuple[str, dict[str, Any], str]:
    """Resume an ended run where it ran, as nel-next resumes it: (status, details to record, what was done).
    `nel eval resume` for each submitted SLURM job, `nel eval run --resume` of a local one in its run directory."""
    if details.get("slurm_jobs"):
        jobs = [resubmit(job) for job in details["slurm_jobs"]]
        return "submitted", {"slurm_jobs": jobs}, f"resumed: nel eval resume, SLURM job {', '.join(j['job_id'] for j in jobs)}"
    overrides = details.get("run_overrides") or details.get("overrides") or []
    return "running", start(config_path, overrides, Path(details["run_dir"]), resume=True), "resumed: nel eval run --resume"


def resubmit(job: dict[str, Any]) -> dict[str, Any]:
    """`nel eval resume` for one submitted job (its retry counters reset, its sbatch script submitted again)."""
    argv = [*nel_command(), "eval", "resume", "--job-id", job["job_id"], "--host", job["hostname"]]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S, stdin=subprocess.DEVNULL,
                              env=child_env(), check=False)
    except subprocess.TimeoutExpired:
        raise ToolError(f"nel eval resume did not answer within {SUBMIT_TIMEOUT_S:.0f} s; check the host with ssh_check.") from None
    found = re.search(r"Resubmitted: .*?(\d+)", done.stdout)
    if done.returncode != 0 or not found:
        said = [line for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()][-3:]
        raise ToolError(f"nel eval resume did not resubmit job {job['job_id']}: {redact.scrub(' | '.join(said))[-600:]}")
    return {**job, "job_id": found.group(1)}


def render_sbatch(config_path: str, overrides: list[str]) -> tuple[list[tuple[Path, str]], str | None]:
    """nel-next's own `--dry-run` for a SLURM config: the sbatch scripts it would submit (path, text), or its error."""
    argv = [*nel_command(), "eval", "run", str(Path(config_path).resolve()), "--dry-run"]
    argv += [item for override in overrides for item in ("-O", override)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S, stdin=subprocess.DEVNULL,
                              cwd=Path(config_path).resolve().parent, env=child_env(), check=False)
    except subprocess.TimeoutExpired:
        return [], f"nel eval run --dry-run did not answer within {CHECK_TIMEOUT_S:.0f} s"
    paths = [Path(line.split(":", 1)[1].strip()) for line in done.stdout.splitlines() if line.startswith("Generated:")]
    if done.returncode != 0 or not paths:
        said = [line for line in (done.stderr + "\n" + done.stdout).splitlines() if line.strip()][-3:]
        return [], f"nel eval run --dry-run failed: {redact.scrub(' | '.join(said))[-600:]}"
    return [(path, path.read_text(errors="replace")) for path in paths if path.is_file()], None
