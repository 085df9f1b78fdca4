"""Local prerequisites of NEL's executors, named before NEL runs: a SLURM launch on a machine without rsync failed with a
bare "[Errno 2] No such file or directory: 'rsync'". check_environment names every local binary the executor runs
with its Debian package, and launch_canary / launch_full_run refuse before NEL runs. PATH is pointed at a directory
that holds the needed binaries except the one under test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from tiers import REPO, requires

from quanteval import ledger
from quanteval.engines import launchplan
from quanteval.engines.nel.runs import check_launchable
from quanteval.models import ToolError
from quanteval.workflow import runs
from quanteval.workflow.environment import CheckEnvironmentInput, check_environment

# What NEL 0.2.6 runs here, per executor (executors/slurm: ssh + rsync; executors/local: docker + bash).
NEEDED = ("ssh", "rsync", "docker", "bash")


def bin_dir(tmp_path: Path, leave_out: set[str]) -> Path:
    """A PATH directory with symlinks to the real binaries this machine has, except those left out."""
    directory = tmp_path / "bin"
    directory.mkdir()
    for name in NEEDED:
        real = shutil.which(name)
        if real and name not in leave_out:
            (directory / name).symlink_to(real)
    return directory


def slurm_config(tmp_path: Path) -> Path:
    doc = {
        "defaults": [{"execution": "slurm/default"}, {"deployment": "none"}, "_self_"],
        "execution": {"hostname": "login.example", "username": "tester", "account": "acct",
                      "output_dir": "/lustre/tester/nel-results"},
        "target": {"api_endpoint": {"model_id": "m", "url": "http://127.0.0.1:9/v1/chat/completions"}},
        "evaluation": {"tasks": [{"name": "ns_gpqa"}]},
    }
    path = tmp_path / "slurm.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_check_environment_names_missing_rsync_with_its_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not shutil.which("ssh"):
        pytest.skip("needs ssh on this machine to keep it on the test PATH")
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path, {"rsync"})))
    report = check_environment(CheckEnvironmentInput(probe_gpus=False, executor="slurm"))
    found = {item.binary: item for item in report.executor_binaries}
    assert set(found) == {"ssh", "rsync"}
    assert all(item.executor == "slurm" for item in found.values())
    assert found["rsync"].path is None and found["rsync"].debian_package == "rsync"
    assert found["ssh"].path is not None and found["ssh"].debian_package == "openssh-client"
    [note] = [note for note in report.notes if "rsync" in note]
    assert "not on PATH" in note and "apt-get install rsync" in note and "ssh" in note


def test_check_environment_local_executor_needs_docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path, {"docker"})))
    report = check_environment(CheckEnvironmentInput(probe_gpus=False, executor="local"))
    found = {item.binary: item for item in report.executor_binaries}
    assert set(found) == {"docker", "bash"}
    assert found["docker"].path is None and found["docker"].debian_package == "docker.io"
    assert any("docker is not on PATH" in note and "apt-get install docker.io" in note for note in report.notes)


def test_check_environment_without_executor_checks_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path, {"ssh", "rsync"})))
    report = check_environment(CheckEnvironmentInput(probe_gpus=False))
    assert {(item.executor, item.binary) for item in report.executor_binaries} == {
        ("slurm", "ssh"), ("slurm", "rsync"), ("local", "docker"), ("local", "bash")}
    [note] = [note for note in report.notes if "slurm executor" in note]
    assert "ssh, rsync are not on PATH" in note and "openssh-client rsync" in note


def test_slurm_canary_and_full_run_refuse_without_rsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = slurm_config(tmp_path)
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path, {"rsync"})))
    with pytest.raises(ToolError) as canary:
        runs.launch_canary(runs.LaunchCanaryInput(config_path=str(config)))
    message = str(canary.value)
    assert "not launched" in message and "rsync" in message and "apt-get install rsync" in message
    assert "Errno" not in message
    with pytest.raises(ToolError, match="apt-get install rsync"):
        runs.launch_full_run(runs.LaunchFullRunInput(config_path=str(config), force=True, reason="test"))
    assert ledger.find(limit=10) == []  # refused before NEL: nothing launched, nothing recorded


def test_slurm_launch_refuses_without_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path, {"ssh"})))
    with pytest.raises(ToolError, match="apt-get install openssh-client"):
        runs.launch_canary(runs.LaunchCanaryInput(config_path=str(slurm_config(tmp_path))))


def test_prerequisite_check_passes_with_ssh_and_rsync_and_ignores_local_configs(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    if not (shutil.which("ssh") and shutil.which("rsync")):
        pytest.skip("needs ssh and rsync on this machine")
    config = slurm_config(tmp_path)
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path, set())))
    check_launchable(launchplan.plan(config))  # no error
    local = tmp_path / "local.yaml"
    local.write_text(config.read_text().replace("slurm/default", "local"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    check_launchable(launchplan.plan(local))  # the local executor's docker check stays with NEL's launch


@pytest.mark.slow
@requires("nel-next")
def test_docker_is_what_nels_local_executor_runs_not_what_a_local_run_takes(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A nel-next run here starts on a machine without docker (nel-next runs its benchmarks in-process), while NEL
    0.2.6's local launch, whose executor runs every task in Docker, is refused naming it."""
    from test_faults import _nel_next_config
    from test_runs import write_config

    from quanteval.clusters import executor as executors
    from quanteval.engines.nel_next import nelnext

    config = _nel_next_config(tmp_path)
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path, {"docker"})))
    started = runs.launch_canary(runs.LaunchCanaryInput(config_path=config, limit_samples=2))
    try:
        assert started.executor == "local" and started.status == "running"
    finally:
        executors.LOCAL.cancel([nelnext.local_job(ledger.get(started.record_id).details)], grace_s=5)
    with pytest.raises(ToolError, match="Docker"):
        runs.launch_canary(runs.LaunchCanaryInput(config_path=str(write_config(tmp_path))))


# ---------------------------------------------------------------- where a model can be served


def _check_environment_over_mcp() -> dict:
    import anyio
    from mcp import Client

    from quanteval.faces.server import build_server

    async def go():
        async with Client(build_server()) as client:
            return await client.call_tool("check_environment", {"probe_gpus": True})

    result = anyio.run(go)
    assert not result.is_error, result.content
    return result.structured_content


def test_check_environment_says_vllm_serves_on_this_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluate_quantization serves on this CPU with the vLLM scripts/setup built: check_environment must say so, with
    its version, instead of `vllm: null` and "deployments must run on a cluster"."""
    from quanteval.serving.frameworks import vllm_venv, vllm_venv_version

    monkeypatch.delenv("QUANTEVAL_VLLM_LAUNCHER", raising=False)
    if not vllm_venv_version():
        pytest.skip(f"no vLLM venv at {vllm_venv()} (scripts/setup builds it)")
    report = _check_environment_over_mcp()
    serving = {option["where"]: option for option in report["serving"]}
    assert set(serving) == {"vllm", "gpu", "docker", "slurm", "endpoint"}
    assert serving["vllm"]["available"] and str(vllm_venv()) in serving["vllm"]["detail"]
    assert vllm_venv_version() in serving["vllm"]["detail"] and "0.32" in serving["vllm"]["detail"]
    assert report["packages"]["vllm"] == vllm_venv_version()
    assert not any("must run on a cluster" in note for note in report["notes"])
    [summary] = [note for note in report["notes"] if note.startswith("Can serve here:")]
    assert "vllm" in summary
    # the other options say what is true here, each with the fix when it is not there
    assert serving["docker"]["available"] == report["docker_daemon"]
    assert serving["gpu"]["available"] == bool(report["gpus"])
    assert serving["slurm"]["available"] == bool(shutil.which("sbatch") or report["ssh_hosts"])
    assert all(option["how_to_get"] for option in serving.values() if not option["available"])


def test_check_environment_gives_the_shipped_benchmarks_by_absolute_path() -> None:
    """An assistant over MCP found `examples/benchmarks/tiny_add.py` in the skill, relative, where every tool wants an
    absolute path, and had to guess the checkout: check_environment gives the shipped ones as they are on disk."""
    from tiers import REPO

    report = _check_environment_over_mcp()
    examples = report["example_benchmarks"]
    assert report["quanteval_cli"] and Path(report["quanteval_cli"]).name == "quanteval"  # what CI runs
    assert str(REPO / "examples" / "benchmarks" / "tiny_add.py") in examples
    assert str(REPO / "examples" / "benchmarks" / "skills" / "benchmark_map.json") in examples
    assert all(Path(path).is_absolute() and Path(path).is_file() for path in examples)


def test_check_environment_without_the_vllm_venv_says_how_to_get_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTEVAL_VLLM_VENV", str(tmp_path / "nowhere"))
    monkeypatch.delenv("QUANTEVAL_VLLM_LAUNCHER", raising=False)
    monkeypatch.setenv("PATH", str(bin_dir(tmp_path, set())))  # no `vllm` on PATH either
    report = _check_environment_over_mcp()
    [vllm] = [option for option in report["serving"] if option["where"] == "vllm"]
    assert not vllm["available"] and str(tmp_path / "nowhere") in vllm["detail"]
    assert "scripts/setup" in vllm["how_to_get"] and "QUANTEVAL_VLLM_VENV" in vllm["how_to_get"]
    # a command the client can run from wherever it is: the checkout's script by its absolute path, the server's venv
    assert f"QUANTEVAL_VLLM_VENV={tmp_path / 'nowhere'} bash {REPO / 'scripts' / 'setup-vllm'}" in vllm["how_to_get"]
    assert report["packages"]["vllm"] is None
    assert any(note.startswith("No vLLM on this machine") and "scripts/setup" in note for note in report["notes"])
    [summary] = [note for note in report["notes"] if note.startswith("Can serve here:")]
    assert "vllm" not in summary


def test_a_deployment_recorded_ready_is_listed_as_an_endpoint() -> None:
    record = ledger.add("deployment", status="ready", executor="local",
                        details={"endpoint_url": "http://127.0.0.1:8123/v1/chat/completions"})
    report = _check_environment_over_mcp()
    [endpoint] = [option for option in report["serving"] if option["where"] == "endpoint"]
    assert endpoint["available"] and record.id in endpoint["detail"] and "127.0.0.1:8123" in endpoint["detail"]
