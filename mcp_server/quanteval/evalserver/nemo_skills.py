"""The eval server's `nemo-skills` backend: one `ns eval` per benchmark (per shard) against the trainer's router.

What the real NeMo-Skills (467b057, as 8b18f39 before it, run with `executor: none`) needs and does, learned by
running it:
- `ns` starts `python -m nemo_skills...` children by name: its venv's bin goes first on PATH;
- it needs a cluster config; without one given, the server writes an `executor: none` one;
- it exits 0 even when its generation or summarize step failed: metrics.json is the only proof of success;
- `name` means greedy decoding, `name:N` N seeded samples (NeMo-Skills then defaults T=0.7, top_p=0.95;
  the request's own values, passed after, win).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from quanteval import envvars, forkserver, paths
from quanteval.engines.nemo_skills_source import NEMO_SKILLS_UPSTREAM
from quanteval.evalserver.backend import (
    BenchmarkSpec,
    EvalRequest,
    RunCommands,
    ServerSettings,
    ShardCommand,
    generation_value,
    tail_lines,
)
from quanteval.models import ToolError

INSTALL_HINT = (
    "NeMo-Skills (`ns`) is not installed here; it is not on PyPI. Build its venv with "
    f"`{envvars.setup_command('setup-nemo-skills', 'QUANTEVAL_NS_VENV')}` "
    f"(from QUANTEVAL_NEMO_SKILLS_SRC if set, else {NEMO_SKILLS_UPSTREAM}), or run the server inside a NeMo-Skills "
    "container, and pass --ns-command with the path of its `ns` executable."
)
LOCAL_CLUSTER = "quanteval-local"
# NeMo-Skills server types whose client sends top_k (in the request's extra body, as SGLang and vLLM take it);
# its `openai` type refuses any top_k other than -1 deep inside generation.
TOP_K_SERVER_TYPES = ("sglang", "vllm")


def ns_path(settings: ServerSettings) -> str | None:
    return shutil.which(settings.ns_command)


@functools.lru_cache(maxsize=8)
def _ns_version(path: str, mtime_ns: int) -> str | None:
    """NeMo-Skills' version as the Python behind this `ns` sees it (ns has no --version)."""
    python = forkserver.script_python(path)
    if python is None:
        return None
    try:
        out = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('nemo_skills'))"],
                             capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def readiness(settings: ServerSettings) -> dict[str, Any]:
    path = ns_path(settings)
    status: dict[str, Any] = {"command": settings.ns_command, "backend_ready": bool(path), "server_type": settings.server_type}
    if not path:
        status["hint"] = INSTALL_HINT
        return status
    status["ns_path"] = path
    status["ns_version"] = _ns_version(path, Path(path).stat().st_mtime_ns)
    if status["ns_version"] is None:
        status["backend_ready"] = False
        status["hint"] = f"{path} is not a NeMo-Skills `ns` whose Python can report nemo_skills' version. {INSTALL_HINT}"
    return status


def refuse(settings: ServerSettings, request: EvalRequest) -> str | None:
    """What `ns eval` would fail on after minutes, said now (a 400): a benchmark NeMo-Skills does not know or whose
    data is not prepared, and top_k sent to an `openai` server type."""
    return _benchmark_refusal(settings, request) or _top_k_refusal(settings, request)


# Graders NeMo-Skills 467b057 runs from its container's layout (evaluation/evaluator/<type>.py: `cd DIR && python -m
# ...`): on a host without DIR the benchmark generates every answer and then fails.
CONTAINER_GRADERS = {"ifbench": "/opt/benchmarks/IFBench", "if": "/opt/benchmarks/google-research",
                     "bfcl": "/opt/gorilla/berkeley-function-call-leaderboard"}

# NeMo-Skills resolves a benchmark as `ns eval` does (467b057's dataset.utils.get_dataset_module: built-in, the extra
# benchmark map, then --data_dir) and reads DIR/NAME/<EVAL_SPLIT or test>.jsonl: the package's folder (where
# `ns prepare_data` writes), the mapped folder, or --data_dir. Prints {name: null | why}.
_BENCHMARK_PROBE = r"""
import difflib, json, re, sys
from pathlib import Path
from nemo_skills.dataset import utils
names, data_dir, graders = json.loads(sys.argv[1]), sys.argv[2] or None, json.loads(sys.argv[3])
home = Path(utils.__file__).parent
known = sorted({p.name for p in home.iterdir() if (p / "__init__.py").is_file()} | set(utils.get_extra_benchmark_map()))
out = {}
for name in names:
    try:
        module = utils.get_dataset_module(name, data_dir=data_dir)[0]
    except Exception:
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        out[name] = f"NeMo-Skills has no benchmark '{name}'" + (f" (close: {', '.join(close)})" if close else "")
        continue
    eval_type = re.search(r"\+\+eval_type=(\S+)", getattr(module, "GENERATION_ARGS", "") or "")
    grader = graders.get(eval_type.group(1)) if eval_type else None
    if grader and not Path(grader).is_dir():
        out[name] = (f"NeMo-Skills grades '{name}' with the code its container has at {grader}, which this machine "
                     "lacks: run the eval server inside the NeMo-Skills container, or give it a --cluster config whose "
                     "jobs run there")
        continue
    split = getattr(module, "EVAL_SPLIT", "test")
    folder = Path(data_dir) / name if data_dir else Path(module.__file__).parent
    data = folder / f"{split}.jsonl"
    out[name] = None if data.is_file() else (
        f"'{name}' has no prepared data: {data} is missing; run `ns prepare_data {name}"
        + (f" --data_dir {data_dir}" if data_dir else "") + "` where the server runs (it may download)")
print(json.dumps(out))
"""


def _benchmark_refusal(settings: ServerSettings, request: EvalRequest) -> str | None:
    """Unknown or unprepared benchmarks, asked of the NeMo-Skills behind `ns` (about 0.5 s). Only for the server's own
    `executor: none` cluster: on a cluster config of the user's, the data lies where its jobs run. None when the
    question cannot be asked (no `ns`, not a Python script): `ns eval` then says what is wrong."""
    path = ns_path(settings)
    python = forkserver.script_python(path) if path and not settings.cluster else None
    if python is None:
        return None
    names = sorted({bench.name for bench in request.benchmarks})
    try:
        done = subprocess.run([python, "-c", _BENCHMARK_PROBE, json.dumps(names), settings.data_dir or "",
                               json.dumps(CONTAINER_GRADERS)],
                              capture_output=True, text=True, timeout=60, env={**os.environ, **ns_env(settings)},
                              check=False)
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    problems = [why for name in names if isinstance(why := found.get(name), str)]
    return "; ".join(problems) or None


def _top_k_refusal(settings: ServerSettings, request: EvalRequest) -> str | None:
    """top_k cannot reach an `openai` server type: say so now (400), not after minutes of generation (502)."""
    if settings.server_type in TOP_K_SERVER_TYPES:
        return None
    for bench in request.benchmarks:
        top_k = generation_value(bench, request.defaults, "top_k")
        if top_k is not None and top_k not in (-1, 0):
            return (f"{bench.name}: top_k={top_k} cannot be sent with NeMo-Skills server type "
                    f"'{settings.server_type}' (its OpenAI client refuses top_k); start the server with "
                    f"--server-type sglang (slime's router) or vllm, or send top_k -1")
    return None


def cluster_args(settings: ServerSettings) -> list[str]:
    """`--cluster/--config_dir` as given, else an `executor: none` config the server writes for itself."""
    if settings.cluster:
        return ["--cluster", settings.cluster] + (["--config_dir", settings.config_dir] if settings.config_dir else [])
    config_dir = settings.root / "ns-cluster"
    config = config_dir / f"{LOCAL_CLUSTER}.yaml"
    if not config.exists():
        # `containers` is required by NeMo-Skills even with executor none (values unused)
        paths.write_file(config, "executor: none\ncontainers:\n  nemo-skills: none\n  sandbox: none\n")
    return ["--cluster", LOCAL_CLUSTER, "--config_dir", str(config_dir)]


# `ns eval`'s driver spends ~7 of its ~10 CPU-s importing NeMo-Skills' pipeline (nemo_run, litellm, torch) before it
# starts the generation: the eval server imports it once and forks each `ns eval` from there (ShardCommand.preload).
# The pipeline imports its steps' modules too: each `python -m nemo_skills.inference.generate` (~9 CPU-s cold, mostly
# imports) and `python -m nemo_skills.pipeline.summarize_results` (~4) runs forked from the same import (forkserver.py's
# attach). The summary's main runs NeMo-Skills' typer app, which, with every pipeline command imported, dispatches on
# a command name (cold it holds that one command alone): its own name goes first.
NS_PRELOAD = "import nemo_skills.pipeline.cli\n"
NS_ATTACH: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "nemo_skills.inference.generate": (), "nemo_skills.pipeline.summarize_results": ("summarize_results",)})


def ns_env(settings: ServerSettings) -> dict[str, str]:
    path = ns_path(settings)
    env = {"NEMO_SKILLS_DISABLE_UNCOMMITTED_CHANGES_CHECK": "1", "DUMMY_API_KEY": "EMPTY"}
    if path:  # ns runs `python -m nemo_skills...` by name: its own Python must come first
        env["PATH"] = f"{Path(path).resolve().parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return env


def commands(settings: ServerSettings, request: EvalRequest, bench: BenchmarkSpec, bench_dir: Path,
             expname: str) -> list[ShardCommand]:
    """`ns eval` for one benchmark; with shards > 1 one process per chunk (NeMo-Skills' --num_chunks/--chunk_ids).

    The command line is the one NeMo-Skills documents for a model served elsewhere
    (`--server_type T --server_address URL/v1 --model NAME`); its pipeline turns these into
    `++server.server_type/base_url/model`, which slime's reference skills_server.py also passes by hand
    (with `++server.server_type=openai` after `--server_type`, so the last one wins): passing both is
    redundant and, with the override, silently drops top_k support.
    """
    repeats = generation_value(bench, request.defaults, "n_samples_per_eval_prompt")
    overrides = {
        "inference.temperature": generation_value(bench, request.defaults, "temperature"),
        "inference.top_p": generation_value(bench, request.defaults, "top_p"),
        "inference.top_k": generation_value(bench, request.defaults, "top_k"),
        "inference.tokens_to_generate": generation_value(bench, request.defaults, "max_response_len"),
        "max_samples": bench.max_problems,
    }
    shards = bench.shards or 1
    result = []
    for index in range(shards):
        out = bench_dir if shards == 1 else bench_dir / f"shard-{index}"
        argv = [
            settings.ns_command, "eval",
            "--output_dir", str(out),
            # like slime's reference: `name:N` whenever N is given (`name:1` is one seeded sample, `name` is greedy)
            "--benchmarks", bench.name if repeats is None else f"{bench.name}:{repeats}",
            "--server_type", settings.server_type,
            "--server_address", f"{request.router_url}/v1",
            "--model", settings.model_name,
            "--expname", expname if shards == 1 else f"{expname}-shard{index}",
            *cluster_args(settings),
        ]
        if settings.data_dir:
            argv += ["--data_dir", settings.data_dir]
        if shards > 1:
            argv += ["--num_chunks", str(shards), "--chunk_ids", str(index)]
        argv += [f"++{key}={value}" for key, value in overrides.items() if value is not None]
        argv += ["++server.api_key_env_var=DUMMY_API_KEY", f"++max_concurrent_requests={settings.max_concurrent_requests}"]
        # with executor none a --data_dir is read relative to the working directory (./<basename>/...):
        # run from its parent so that lands on the data dir itself
        cwd = Path(settings.data_dir).parent if settings.data_dir else out
        result.append(ShardCommand(argv, ns_env(settings), out, out / "eval.log", cwd=cwd, preload=NS_PRELOAD,
                                   attach=NS_ATTACH))
    return result


def _metrics_file(bench: BenchmarkSpec, output_dir: Path) -> dict[str, Any]:
    path = output_dir / "eval-results" / bench.name / "metrics.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ToolError(f"`ns eval` exited 0 but wrote no {path}: its generation or summarize step failed "
                        "(NeMo-Skills does not fail the command for that); see the log") from None
    except json.JSONDecodeError as exc:
        raise ToolError(f"{path}: malformed JSON ({exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get(bench.name, data), dict):
        raise ToolError(f"{path}: expected an object keyed by benchmark")
    return data.get(bench.name, data)


def merge_chunks(bench: BenchmarkSpec, bench_dir: Path, shard_dirs: list[Path]) -> Path:
    """Concatenate the shards' evaluated chunk files in chunk order, as NeMo-Skills' merge_chunks does."""
    first = shard_dirs[0] / "eval-results" / bench.name
    merged_dir = bench_dir / "eval-results" / bench.name
    merged_dir.mkdir(parents=True, exist_ok=True)
    chunk_files = sorted(first.glob("output*_chunk_0.jsonl"))
    if not chunk_files:
        raise ToolError(f"no output*_chunk_0.jsonl under {first}: shard 0 generated nothing; see its log")
    for chunk0 in chunk_files:
        base = chunk0.name.removesuffix("_chunk_0.jsonl")
        with (merged_dir / f"{base}.jsonl").open("wb") as merged:
            for index, shard in enumerate(shard_dirs):
                part = shard / "eval-results" / bench.name / f"{base}_chunk_{index}.jsonl"
                if not part.exists():
                    raise ToolError(f"{part} is missing: shard {index} did not finish; see {shard / 'eval.log'}")
                merged.write(part.read_bytes())
    return merged_dir


def metrics(settings: ServerSettings, bench: BenchmarkSpec, bench_dir: Path,
            commands: list[ShardCommand], run: RunCommands) -> dict[str, Any]:
    if len(commands) == 1:
        return _metrics_file(bench, commands[0].output_dir)
    # Shards: merge the evaluated chunks and let NeMo-Skills' own summarize compute the metrics of the
    # whole benchmark (a weighted mean of shard metrics would be wrong for e.g. majority@k or std-devs).
    merge_chunks(bench, bench_dir, [c.output_dir for c in commands])
    log_path = bench_dir / "summarize.log"
    # the same command line `ns eval`'s own summarize step runs (no --cluster: with one of executor none,
    # summarize_results tries to download the results from that "cluster" and fails), run as the job's shards were
    argv = [settings.ns_command, "summarize_results", str(bench_dir / "eval-results"), "--benchmarks", bench.name,
            "--save_metrics_path", str(bench_dir / "eval-results" / bench.name / "metrics.json")]
    (code,) = run([ShardCommand(argv, ns_env(settings), bench_dir, log_path, cwd=commands[0].cwd, preload=NS_PRELOAD)])
    if code != 0:
        tail = "\n".join(tail_lines(log_path, 5))
        said = "timed out" if code is None else f"exited with {code}"
        raise ToolError(f"`ns summarize_results` of the merged shards {said}: {tail}")
    return _metrics_file(bench, bench_dir)
