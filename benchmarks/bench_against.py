"""The same commands on this checkout and on another commit, in turn, as ratios: did a change make them slower?

    .venv/bin/python benchmarks/bench_against.py --before COMMIT [--repeats 5] [--evaluate]

Checks the commit out into a temporary git worktree (sharing this checkout's venvs), then runs each command on both
checkouts in turn, before and after alternating (B A B A …) so that a machine's drift falls on both, and prints each
side's median wall seconds and the ratio after/before (above 1: slower now). Every run is a fresh process with its own
state directory, as a user's first call of the day is:
  - startup: `quanteval-mcp` until it answers initialize and tools/list (what an MCP client waits for);
  - validate: `quanteval call validate_config` on a nel-next config (nel-next's schema child included) and on a
    NEL 0.2.6 config;
  - dry_run: `quanteval call dry_run` on the nel-next config (the launch path's reading of the config);
  - gate: `quanteval gate` on two nel-next runs of 5 benchmarks (bench_gate's layout, one real `nel eval run`);
  - evaluate (with --evaluate; minutes a side): `quanteval evaluate` of the embedded model against its W8A8 copy on
    the real vLLM, once a side.
Prints numbers; asserts only that both sides answered alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
VENVS = (".venv", ".venv-vllm", ".venv-nel-next", ".venv-nemo-skills")
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_startup import _answer, _send  # noqa: E402
from next_runs import make_run, real_nel_run, write_policy  # noqa: E402
from tiers import BENCH  # noqa: E402


def worktree(commit: str, where: Path) -> Path:
    """The package of `commit`, checked out beside the venvs it shares with this checkout."""
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-f", str(where), commit], check=True,
                   capture_output=True)
    for venv in VENVS:
        if (REPO / venv).exists():
            (where / venv).symlink_to(REPO / venv)
    return where


def side_env(checkout: Path, scratch: Path) -> dict[str, str]:
    state = Path(tempfile.mkdtemp(dir=scratch, prefix="state-"))
    return dict(os.environ, PYTHONPATH=str(checkout / "mcp_server"), QUANTEVAL_STATE_DIR=str(state),
                NEMO_EVALUATOR_TELEMETRY_LEVEL="0")


def timed(argv: list[str], env: dict[str, str], stdin: str | None = None) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, check=False)
    return time.perf_counter() - started, done.stdout


def mcp_start(env: dict[str, str]) -> tuple[float, str]:
    """quanteval-mcp from spawn to its tools/list answer."""
    started = time.perf_counter()
    proc = subprocess.Popen([str(BIN / "quanteval-mcp")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, env=env)
    _send(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}})
    _answer(proc, 1)
    _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    _send(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    tools = len(_answer(proc, 2)["result"]["tools"])
    seconds = time.perf_counter() - started
    proc.stdin.close()  # type: ignore[union-attr]
    proc.wait(timeout=30)
    return seconds, str(tools)


def call(tool: str, arguments: dict) -> Callable[[dict[str, str]], tuple[float, str]]:
    argv = [str(BIN / "quanteval"), "call", tool, "--json", json.dumps(arguments)]

    def run(env: dict[str, str]) -> tuple[float, str]:
        seconds, out = timed(argv, env)
        answer = json.loads(out) if out.strip() else {}
        return seconds, json.dumps({key: answer.get(key) for key in ("valid", "ok", "verdict") if key in answer})
    return run


def verdicts(out: str) -> str:
    """What must be the same on both sides: a JSON answer's verdict and its gate's (paths and times may differ)."""
    try:
        answer = json.loads(out)
    except ValueError:
        return "no JSON answer"
    gate = answer.get("gate") if isinstance(answer.get("gate"), dict) else {}
    return json.dumps({"verdict": answer.get("verdict"), **({"gate": gate.get("verdict")} if gate else {})})


def command(argv: list[str]) -> Callable[[dict[str, str]], tuple[float, str]]:
    def run(env: dict[str, str]) -> tuple[float, str]:
        seconds, out = timed(argv, env)
        return seconds, verdicts(out)
    return run


def evaluate(scratch: Path) -> Callable[[dict[str, str]], tuple[float, str]]:
    """The README's question for one variant, into a fresh output directory each time (a reused one would resume)."""
    checkpoints = REPO / "examples" / "checkpoints"

    def run(env: dict[str, str]) -> tuple[float, str]:
        output = tempfile.mkdtemp(dir=scratch, prefix="evaluate-")
        seconds, out = timed([str(BIN / "quanteval"), "evaluate", str(checkpoints / "tiny-add-bf16"),
                              str(checkpoints / "tiny-add-w8a8"), "--benchmarks", str(REPO / "examples" / "benchmarks" / "tiny_add.py"),
                              "--max-drop", "1.5", "--output-dir", output, "--json"], env)
        return seconds, verdicts(out)
    return run


def configs(scratch: Path) -> tuple[str, str]:
    """A filled nel-next config (an api service, the tiny_add benchmark) and a NEL 0.2.6 config, made by build_config."""
    env = side_env(REPO, scratch)
    def quanteval(tool: str, arguments: dict) -> dict:
        done = subprocess.run([str(BIN / "quanteval"), "call", tool, "--json", json.dumps(arguments)], capture_output=True,
                              text=True, env=env, check=True)
        return json.loads(done.stdout)
    nel_next = quanteval("build_config", {"engine": "nel-next", "execution": "local", "deployment": "none",
                                           "model_type": "chat_reasoning", "benchmarks": [str(BENCH)],
                                           "config_path": str(scratch / "next.yaml")})["config_path"]
    for key, value in (("services.model.url", "http://127.0.0.1:9/v1"), ("services.model.model", "tiny-add"),
                       ("services.model.generation.max_tokens", 16)):
        quanteval("set_config_value", {"config_path": nel_next, "key": key, "value": value})
    nel = quanteval("build_config", {"engine": "nel", "execution": "local", "deployment": "none",
                                     "model_type": "chat_reasoning", "benchmarks": ["core_reasoning"],
                                     "config_path": str(scratch / "nel.yaml")})["config_path"]
    return nel_next, nel


def gate_runs(scratch: Path) -> list[str]:
    template = real_nel_run(scratch / "template", 200)
    names = [f"bench{i}" for i in range(5)]
    base = {name: [float(i % 5 != 0) for i in range(200)] for name in names}
    cand = {name: list(rewards) for name, rewards in base.items()}
    cand[names[0]][1:7] = [0.0] * 6  # three points lost on a critical benchmark
    policy = write_policy(scratch / "policy.yaml", "version: 1\ndefaults: {max_drop: 0.015}\nbenchmarks:\n" + "".join(
        f"  {name}: {{tier: critical, metric: pass@1}}\n" for name in names))
    return [str(make_run(template, scratch / "base", base)), str(make_run(template, scratch / "cand", cand)), "--policy",
            str(policy), "--json"]


def compare(name: str, run: Callable[[dict[str, str]], tuple[float, str]], checkouts: dict[str, Path], scratch: Path,
            repeats: int) -> None:
    times: dict[str, list[float]] = {side: [] for side in checkouts}
    answers: dict[str, set[str]] = {side: set() for side in checkouts}
    for _ in range(repeats):
        for side, checkout in checkouts.items():
            seconds, answer = run(side_env(checkout, scratch))
            times[side].append(seconds)
            answers[side].add(answer)
    before, after = (statistics.median(times[side]) for side in ("before", "after"))
    same = f"both {' '.join(sorted(answers['after']))}" if answers["before"] == answers["after"] else f"ANSWERS DIFFER: {answers}"
    print(f"  {name:<26} before {before:7.2f} s   after {after:7.2f} s   after/before {after / before:5.2f}   ({same})",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the commit to compare against (e.g. the one before a change)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--evaluate", action="store_true", help="also time `quanteval evaluate` once a side (minutes)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-against-"))
    before = worktree(args.before, scratch / "before")
    try:
        checkouts = {"before": before, "after": REPO}
        commits = {side: subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True, check=True).stdout.strip() for side, path in checkouts.items()}
        dirty = " (+ uncommitted changes)" if subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", "HEAD"]).returncode else ""
        print(f"before {commits['before']}, after {commits['after']}{dirty}; median of {args.repeats} a side, in turn")
        nel_next, nel = configs(scratch)
        compare("startup (MCP tools/list)", mcp_start, checkouts, scratch, args.repeats)
        compare("validate_config nel-next", call("validate_config", {"config_path": nel_next}), checkouts, scratch, args.repeats)
        compare("validate_config NEL 0.2.6", call("validate_config", {"config_path": nel}), checkouts, scratch, args.repeats)
        compare("dry_run nel-next", call("dry_run", {"config_path": nel_next}), checkouts, scratch, args.repeats)
        compare("gate (CLI)", command([str(BIN / "quanteval"), "gate", *gate_runs(scratch)]), checkouts, scratch,
                args.repeats)
        if args.evaluate:
            compare("evaluate (tiny-add, W8A8)", evaluate(scratch), checkouts, scratch, 1)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], check=False,
                       capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
