"""nel-next's own managed `vllm` service on this machine, over MCP (`mcp.Client` in-process), as an assistant drives it:
build_config (nel-next, local, vllm) → apply_checkpoint → validate_config → dry_run → launch_canary → wait_for_run →
launch_full_run, with the real vLLM (CPU build) started by nel-next itself and the real nel-next evaluating.

nemo-evaluator 0.3.0 starts that server as `python -m vllm.entrypoints.openai.api_server` from its PATH, where this
machine's python has no vLLM (the project's is in .venv-vllm), without the served name its requests use, and keeps its
output only once it is healthy (engines/nel_next/server_launch.py). A config validate_config calls valid launches; one
whose server cannot start is refused there with the fix; a server that dies leaves its output in the run's logs/, and
run_logs shows its last lines and says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import anyio
from mcp import Client
from processes import own_state_dir, running_with
from tiers import BENCH, CHECKPOINTS, VLLM_PYTHON, own_lane, requires

from quanteval.faces.server import build_server

BF16 = CHECKPOINTS / "tiny-add-bf16"
FULL_RUN_PROBLEMS = 40  # the full run's max_problems: enough to be more than the canary's 10, quick on a CPU


def _calls(steps):
    """Run `steps(call)` in one in-process MCP session; `call(tool, arguments)` gives the structured result, or the
    error text of a tool error."""
    async def go():
        async with Client(build_server()) as client:
            async def call(name: str, arguments: dict) -> dict | str:
                result = await client.call_tool(name, arguments)
                if result.is_error:
                    return " ".join(getattr(part, "text", "") for part in result.content)
                return result.structured_content

            return await steps(call)

    return anyio.run(go)


async def _configured(call, tmp_path: Path, extra_args: list[str] | None = None) -> str:
    config = str(tmp_path / "eval.yaml")
    built = await call("build_config", {"engine": "nel-next", "execution": "local", "deployment": "vllm",
                                        "model_type": "chat_reasoning", "benchmarks": [str(BENCH)], "config_path": config})
    assert isinstance(built, dict), built
    applied = await call("apply_checkpoint", {"config_path": config, "checkpoint": str(BF16)})
    assert isinstance(applied, dict) and applied["missing_values"] == [], applied
    if extra_args:
        current = await call("get_config_value", {"config_path": config, "key": "services.model.extra_args"})
        changed = await call("set_config_value", {"config_path": config, "key": "services.model.extra_args",
                                                  "value": [*current["value"], *extra_args]})
        assert isinstance(changed, dict), changed
    return config


def _vllm_of_this_test() -> list[str]:
    return running_with("vllm.entrypoints.openai.api_server", str(BF16), state_dir=own_state_dir())


@requires("nel-next")  # its schema check; no vLLM: the fast tier
def test_validate_config_refuses_a_local_vllm_service_whose_python_has_no_vllm_and_says_how_to_get_it(tmp_path, monkeypatch):
    bare = tmp_path / "venv-without-vllm"  # a real venv, as a user's QUANTEVAL_VLLM_VENV might name one
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    monkeypatch.setenv("QUANTEVAL_VLLM_VENV", str(bare))
    monkeypatch.setenv("PATH", f"{bare / 'bin'}{os.pathsep}{os.environ['PATH']}")  # its python first, as nel-next finds it

    async def steps(call):
        config = await _configured(call, tmp_path)
        return (await call("validate_config", {"config_path": config}),
                await call("launch_canary", {"config_path": config}))

    validated, launched = _calls(steps)
    assert validated["valid"] is False, validated
    problem = next(p for p in validated["problems"] if p["rule"] == "server_framework_missing")
    assert problem["key"] == "services.model.type"
    assert str(bare / "bin" / "python") in problem["message"] and str(bare) in problem["message"]
    assert "QUANTEVAL_VLLM_VENV" in problem["fix"] and "scripts/setup-vllm" in problem["fix"]
    script = Path(__file__).resolve().parent.parent / "scripts" / "setup-vllm"
    assert f"`QUANTEVAL_VLLM_VENV={bare} bash {script}`" in problem["fix"]  # absolute, runnable from anywhere
    # the launch is refused the same way, before anything is recorded or started
    assert isinstance(launched, str) and "has no vllm" in launched and str(bare) in launched, launched
    assert not list(tmp_path.glob("results/*"))


class TestWithTheRealVllm:
    pytestmark = [*requires("vllm", "nel-next"), own_lane("vllm-nel-next-managed")]

    def test_the_step_by_step_path_runs_its_canary_and_full_run_with_nel_nexts_own_vllm(self, tmp_path):
        started = time.monotonic()

        async def steps(call):
            config = await _configured(call, tmp_path)
            limited = await call("set_config_value", {"config_path": config, "key": "benchmarks[0].max_problems",
                                                      "value": FULL_RUN_PROBLEMS})
            assert isinstance(limited, dict), limited
            validated = await call("validate_config", {"config_path": config})
            assert validated["valid"], validated
            dry = await call("dry_run", {"config_path": config})
            assert dry["ok"], dry
            canary = await call("launch_canary", {"config_path": config})
            assert isinstance(canary, dict), canary
            canary_done = await call("wait_for_run", {"record_id": canary["record_id"], "timeout_s": 900})
            canary_logs = await call("run_logs", {"record_id": canary["record_id"], "lines": 20})
            full = await call("launch_full_run", {"config_path": config})
            assert isinstance(full, dict), full
            full_done = await call("wait_for_run", {"record_id": full["record_id"], "timeout_s": 900})
            scores = await call("extract_scores", {"run": full["invocation_id"].removeprefix("nel-next:")})
            return canary_done, canary_logs, full, full_done, scores

        canary_done, canary_logs, full, full_done, scores = _calls(steps)
        print(f"canary and full run over MCP with nel-next's managed vLLM: {time.monotonic() - started:.0f} s")
        assert canary_done["status"] == "succeeded", canary_done
        assert full_done["status"] == "succeeded", full_done
        # the server's own output is kept with the run, from its first line (the Python with vLLM) to its requests
        run_dir = Path(full["invocation_id"].removeprefix("nel-next:"))
        server_log = (run_dir / "logs" / "quanteval-server-vllm.log").read_text()
        assert server_log.startswith(f"$ {VLLM_PYTHON} -m vllm.entrypoints.openai.api_server ")  # the project's vLLM
        assert "--served-model-name tiny-add-bf16" in server_log.splitlines()[0]
        assert "POST /v1/chat/completions HTTP/1.1\" 200" in server_log
        assert any(tail["job_id"].startswith("model server") and tail["lines"] for tail in canary_logs["tails"])
        rows = [json.loads(line) for line in next(run_dir.rglob("results.jsonl")).read_text().splitlines()]
        assert len(rows) == FULL_RUN_PROBLEMS and sum(row["reward"] for row in rows) >= FULL_RUN_PROBLEMS * 0.8
        assert scores["tasks"], scores
        assert not _vllm_of_this_test()

    def test_run_logs_of_a_managed_server_that_fails_shows_its_last_lines_and_why(self, tmp_path):
        async def steps(call):
            config = await _configured(call, tmp_path, extra_args=["--no-such-flag"])
            assert (await call("validate_config", {"config_path": config}))["valid"]
            canary = await call("launch_canary", {"config_path": config})
            done = await call("wait_for_run", {"record_id": canary["record_id"], "timeout_s": 600})
            return done, await call("run_logs", {"record_id": canary["record_id"], "lines": 20})

        done, logs = _calls(steps)
        assert done["status"] == "failed", done
        server = next(tail for tail in logs["tails"] if tail["job_id"].startswith("model server"))
        assert server["file"].endswith("logs/quanteval-server-vllm.log")
        assert any("unrecognized arguments: --no-such-flag" in line for line in server["lines"]), server
        diagnosis = logs["diagnosis"]
        assert diagnosis["failure_class"] == "server_args" and diagnosis["file"] == server["file"], diagnosis
        assert "--no-such-flag" in diagnosis["line"] and "extra arguments" in diagnosis["advice"]
        assert not _vllm_of_this_test()
