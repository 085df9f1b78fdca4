"""Why a run failed, from its logs: the one table of failure classes that run_logs and validate_run share.

Logs of NEL jobs mix real error lines with the job script's own echo: NEL's run.sub runs under
`set -x`, so every command and assignment appears as `+ TIMEOUT=3600`, `+ srun --container-image ...`.
Those echoes say what the script was going to do, not what went wrong, so they are never classified.
What is left is matched against the classes below, most specific first; a failed run whose logs match
none is "unclassified" and comes with its last meaningful lines.

Each pattern is also valid POSIX ERE (GNU grep -E), because logs on a cluster are grepped there.
"""

from __future__ import annotations

import re
import shlex

from pydantic import BaseModel, Field

# (class, pattern, what to do). Ordered most specific first: a line gets the first class that matches.
FAILURE_CLASSES: list[tuple[str, str, str]] = [
    ("container", r"unrecognized option '?--container|pyxis|enroot|manifest unknown|failed to pull|"
                  r"image.{0,40}not found|container.{0,40}(error|fail|not found)",
     "The node cannot run NEL's containers: SLURM needs the pyxis plugin (srun --container-image) and enroot, "
     "and the image must be pullable (check_registry_credentials)."),
    ("command_not_found", r"(nel|nemo-evaluator|eval-factory|python3?|vllm|ns): (command )?not found",
     "The job's shell has no such program on its PATH. nel-next on SLURM runs `nel eval run` bare on the node unless "
     "cluster.eval_image is set (pyxis): give the job nel-next's venv on the PATH (cluster.sbatch_extra_flags "
     "export: ALL,PATH=<venv>/bin:...) or an eval_image."),
    ("sbatch_rejected", r"sbatch: error|Batch job submission failed|invalid partition|Invalid account|"
                        r"Requested node configuration is not available|Requested time limit is invalid|"
                        r"QOSMaxWallDurationPerJobLimit|AssocMaxJobsLimit|invalid (generic resource|gres)",
     "SLURM refused the job: compare execution.partition / gres / walltime / account with cluster_info "
     "(apply_cluster fills them from the cluster)."),
    ("oom", r"out of memory|OutOfMemoryError|oom[-_ ]kill|\bOOM\b|Not enough memory",
     "Out of memory: more GPUs (tensor_parallel_size), a shorter context, or a lower memory fraction."),
    ("missing_credentials", r"unauthori[sz]ed|forbidden|\b401\b|\b403\b|authentication failed|invalid api[ _-]?key|"
                            r"gated repo|HF_TOKEN|api[ _-]?key.{0,40}(not set|missing|required)",
     "A token or key is missing or wrong (HF_TOKEN for gated datasets, the judge's API key, DUMMY_API_KEY for "
     "NeMo-Skills against a self-deployed server): export it where NEL runs and name it in env_vars."),
    ("missing_dataset", r"DatasetNotFoundError|dataset.{0,60}(not found|does not exist|missing)|"
                        r"No such file or directory.{0,80}(\.jsonl|/data)|prepare_data",
     "The benchmark's data is not there: NeMo-Skills tasks need `ns prepare_data` (or network access to download)."),
    ("sandbox", r"sandbox.{0,80}(error|fail|exception|refused)", "The code-execution sandbox failed."),
    ("judge", r"judge.{0,80}(error|fail|exception)", "The LLM judge failed: check its endpoint and API key."),
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
    ("traceback", r"Traceback \(most recent call last\)", "A Python exception: see the lines after the traceback."),
    ("exception", r"\b[A-Za-z]+(Error|Exception):|\berror:", "An error line: see the log around it."),
]
FAILURE_ADVICE = {name: advice for name, _, advice in FAILURE_CLASSES}
COMPILED = [(name, re.compile(pattern, re.IGNORECASE)) for name, pattern, _ in FAILURE_CLASSES]
ANY_FAILURE_ERE = "|".join(f"({pattern})" for _, pattern, _ in FAILURE_CLASSES)
UNCLASSIFIED = "unclassified"
LAST_LINES = 8
MAX_LINE_CHARS = 400  # a log line as tools show it (NEL scripts echo base64 configs thousands of characters long)

# `set -x` echoes (`+ cmd`, `++ cmd`) and bare shell assignments/exports: the script, not its outcome.
_SCRIPT_ECHO = re.compile(r"^\s*(\++ |(export\s+)?[A-Za-z_][A-Za-z0-9_]*=\S*$)")


def is_script_echo(line: str) -> bool:
    return bool(_SCRIPT_ECHO.match(line))


def classify(line: str) -> str | None:
    """The failure class of one log line (most specific first), or None; script echoes are never a failure."""
    if is_script_echo(line):
        return None
    return next((name for name, pattern in COMPILED if pattern.search(line)), None)


def meaningful(lines: list[str]) -> list[str]:
    """Lines worth showing a person: not empty, not a script echo."""
    return [line.strip()[:MAX_LINE_CHARS] for line in lines if line.strip() and not is_script_echo(line)]


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
    return Diagnosis(failure_class=name, line=text.strip()[:MAX_LINE_CHARS], file=file, line_number=number,
                     advice=FAILURE_ADVICE[name])


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
