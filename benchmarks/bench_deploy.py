"""What the deployment tools cost, against what a user would otherwise run.

    .venv/bin/python benchmarks/bench_deploy.py

Prints, with the stand-in server (tests/standins/fake_inference_server.py) as the launcher:
  - plan_deployment with SGLang's and vLLM's own argument parsers: the first check of a process (it starts the warm
    process, quanteval/warm_python.py) and the next ones, versus without a check and versus the import every check
    paid before (`python -c "import sglang.srt.server_args"`, vLLM's engine arguments in its venv);
  - `quanteval call plan_deployment` (vLLM) in a new process, as each `quanteval evaluate` plans: with an empty cache,
    and after another process's check was kept (quanteval/kept.py), as a ratio;
  - launch -> ready as deployment_status(wait_s) sees it, versus the server's own load time;
  - one deployment_status probe (process, /health, /v1/models, a chat completion, log scan) versus
    the same three requests with curl, as a user would check by hand;
  - stop_deployment on a server that exits on SIGTERM, and on one that ignores it (grace_s=1, SIGKILL).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_seconds  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standins" / "fake_inference_server.py"
CHECKPOINT = REPO / "examples" / "checkpoints" / "qwen3-tiny-nvfp4"
LOAD_S = 2.0

os.environ["QUANTEVAL_STATE_DIR"] = tempfile.mkdtemp(prefix="bench-deploy-")
os.environ.pop("QUANTEVAL_LEDGER", None)

from quanteval.localproc import free_port  # noqa: E402 - the state dir must be set first
from quanteval.serving.deploy import (  # noqa: E402 - the state dir must be set first
    DeploymentStatusInput,
    LaunchDeploymentInput,
    PlanDeploymentInput,
    StopDeploymentInput,
    deployment_status,
    launch_deployment,
    plan_deployment,
    stop_deployment,
    vllm_venv,
)


def launch(*fake: str) -> object:
    os.environ["QUANTEVAL_SGLANG_LAUNCHER"] = shlex.join([sys.executable, str(STANDIN), *fake])
    plan = plan_deployment(PlanDeploymentInput(checkpoint=str(CHECKPOINT), port=free_port(), check_args=False))
    return launch_deployment(LaunchDeploymentInput(plan=plan))


def plan_in_a_new_process(cache: Path) -> float:
    arguments = f'{{"checkpoint": "{REPO / "examples" / "checkpoints" / "tiny-add-bf16"}", "framework": "vllm", "port": {free_port()}}}'
    started = time.perf_counter()
    subprocess.run([str(REPO / ".venv" / "bin" / "quanteval"), "call", "plan_deployment", "--json", arguments],
                   env={**os.environ, "QUANTEVAL_CACHE_DIR": str(cache)}, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-deploy-cache-") as scratch:
        empty = median_seconds(lambda: plan_in_a_new_process(Path(tempfile.mkdtemp(dir=scratch))), repeats=3)
        plan_in_a_new_process(Path(scratch) / "kept")
        kept = median_seconds(lambda: plan_in_a_new_process(Path(scratch) / "kept"), repeats=3)
        print(f"plan_deployment vllm, new process : {empty:7.3f} s with an empty cache, {kept:.3f} s with the check "
              f"another process kept (ratio {kept / empty:.2f}x)")
    for framework, importing in (("sglang", [sys.executable, "-c", "import sglang.srt.server_args"]),
                                 ("vllm", [str(vllm_venv() / "bin" / "python"), "-c", "import vllm.engine.arg_utils"])):
        plan = PlanDeploymentInput(checkpoint=str(CHECKPOINT), framework=framework)
        started = time.perf_counter()
        plan_deployment(plan)  # the first check of a process starts its warm process (the framework's import)
        first = time.perf_counter() - started
        warm = median_seconds(lambda plan=plan: plan_deployment(plan))
        unchecked = median_seconds(lambda plan=plan: plan_deployment(plan.model_copy(update={"check_args": False})))
        floor = median_seconds(lambda importing=importing: subprocess.run(importing, check=True, capture_output=True))
        print(f"plan_deployment {framework:6}, first check : {first:7.3f} s   (the bare import a cold check paid: {floor:.3f} s)")
        print(f"plan_deployment {framework:6}, next checks : {warm:7.3f} s   (x{warm / floor:.2f} of that import; "
              f"no check {unchecked:.3f} s)")

    result = launch("--fake-load-s", str(LOAD_S))
    started = time.perf_counter()
    status = deployment_status(DeploymentStatusInput(record_id=result.record_id, wait_s=30))
    assert status.status == "ready", status.message
    print(f"launch -> ready seen by status       : {time.perf_counter() - started:7.3f} s   (server load time {LOAD_S} s)")

    probe = median_seconds(lambda: deployment_status(DeploymentStatusInput(record_id=result.record_id)), repeats=5)
    base = f"http://127.0.0.1:{result.port}"
    body = '{"model": "qwen3-tiny-nvfp4", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}'
    curl = median_seconds(lambda: [subprocess.run(cmd, capture_output=True, check=True) for cmd in (
        ["curl", "-s", f"{base}/health"], ["curl", "-s", f"{base}/v1/models"],
        ["curl", "-s", "-H", "Content-Type: application/json", "-d", body, f"{base}/v1/chat/completions"],
    )], repeats=5)
    print(f"deployment_status, one probe         : {probe:7.3f} s   (3 curls by hand {curl:.3f} s, ratio {probe / curl:.2f}x)")

    started = time.perf_counter()
    stopped = stop_deployment(StopDeploymentInput(record_id=result.record_id))
    print(f"stop_deployment (SIGTERM)            : {time.perf_counter() - started:7.3f} s   ({stopped.how})")

    stubborn = launch("--fake-load-s", "0.2", "--fake-ignore-sigterm", "--fake-workers", "2")
    deployment_status(DeploymentStatusInput(record_id=stubborn.record_id, wait_s=30))
    started = time.perf_counter()
    stopped = stop_deployment(StopDeploymentInput(record_id=stubborn.record_id, grace_s=1))
    print(f"stop_deployment (ignores SIGTERM)    : {time.perf_counter() - started:7.3f} s   ({stopped.how})")


if __name__ == "__main__":
    main()
