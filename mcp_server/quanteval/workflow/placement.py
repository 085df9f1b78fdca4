"""Where a NEL SLURM config runs: partition, GPUs per node and walltime checked against what the cluster offers.

NEL's SLURM defaults (`partition: batch`, `gres: gpu:8`, `walltime: 01:00:00`) fit some clusters and fail at
sbatch on others. `plan_placement` compares a config with the cluster as `slurm.describe_cluster` read it
(partitions, GPUs per node and type, time limits, accounts) and says what to write; `apply_cluster` asks the
cluster over SSH and writes it. GPUs per node are the model's: tensor x data x pipeline parallel size of the
deployment (spread over execution.num_nodes), not a blanket 8. It also warns when the partition's GPUs cannot
run the checkpoint's format as it will ship (NVFP4 on Hopper serves through Marlin, weight-only).
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, Field

from quanteval import configfile, engines
from quanteval.clusters import executor as executors
from quanteval.clusters import slurm, ssh
from quanteval.engines.base import PARALLEL_KEYS
from quanteval.models import ProgressFn, StrictModel, ToolError, no_progress


class Placement(BaseModel):
    partition: str | None = Field(description="The partition the config should use (null: none fits).")
    gpu_model: str | None = Field(description="GPU model of that partition (H100, B200, ...), when known.")
    gpus_per_node: int = Field(description="GPUs per node the deployment needs: TP x DP x PP / num_nodes (0 without a deployment).")
    values: dict[str, Any] = Field(description="Config keys to write and their values (execution.partition, execution.gres, ...).")
    warnings: list[str] = Field(description="What will fail or mislead on this cluster, with the fix.")
    notes: list[str]


def _value(doc: Any, key: str, default: Any = None) -> Any:
    return configfile.to_plain(configfile.get_path(doc, key)) if configfile.has_path(doc, key) else default


def _framework(doc: Any) -> str:
    """The placement view's model server (vllm, sglang, ... or none), read as NEL 0.2.6 reads its deployment keys."""
    return engines.placement_form().config.deployment_type(doc)


def gpus_needed(doc: Any) -> tuple[int, list[str]]:
    """GPUs per node the config's deployment needs, and notes on where the numbers came from (a size left unset is
    NEL 0.2.6's packaged default for the deployment type: engines.placement_form)."""
    framework = _framework(doc)
    if framework == "none":
        return 0, []
    defaults = engines.placement_form().placement.defaults(doc)
    notes = []
    sizes = []
    for key in PARALLEL_KEYS:
        value = _value(doc, f"deployment.{key}")
        if value is None and f"deployment.{key}" in defaults:
            value = defaults[f"deployment.{key}"]
            if key == "tensor_parallel_size":
                notes.append(f"deployment.tensor_parallel_size is not set: NEL's {framework} default is {value} "
                             "(apply_checkpoint sets the smallest fit for the checkpoint).")
        sizes.append(_positive(value))
    return math.ceil(math.prod(sizes) / _positive(_value(doc, "execution.num_nodes", 1))), notes


def _positive(value: Any) -> int:
    """A size as the config holds it (16 or '16'); 1 when unset or not a positive whole number (an interpolation)."""
    text = str(value).strip()
    return int(text) if text.isdigit() and int(text) > 0 else 1


def _format_warnings(report: Any, framework: str, gpu: str | None, partition: str,
                     better: slurm.PartitionInfo | None) -> list[str]:
    """The checkpoint's format on the partition's GPU, as `framework` serves it (facts from quanteval.serving.frameworks)."""
    from quanteval.serving import frameworks
    from quanteval.serving.quantformat import algo_label, framework_verdict

    if report is None or framework not in frameworks.FRAMEWORKS or not report.quantization.detected:
        return []
    quant = report.quantization
    label = algo_label(quant)
    facts = frameworks.support(framework, quant.format)
    if gpu not in frameworks.GPUS:
        if facts.native_capability and not facts.rejected:
            return [f"{label} needs compute capability >= {facts.native_capability / 10:.1f} for its native kernels, and the "
                    f"GPU type of partition {partition} is not known (no typed GRES or feature): check it."]
        return []
    elsewhere = ""
    if better is not None:
        now = "" if better.usable_nodes else " (no usable node right now)"
        elsewhere = f" Partition {better.name} has {better.gpu_model} GPUs{now}: use it to measure the format as it ships."
    findings = framework_verdict(framework, quant, gpu).findings
    return [f"{message} (partition {partition}){elsewhere if not _native(report, gpu, framework) else ''}"
            for _, message in findings]


def _native(report: Any, gpu: str | None, framework: str) -> bool:
    """Whether this GPU runs the checkpoint's format with the framework's own kernels (as it will ship)."""
    from quanteval.serving import frameworks

    if report is None or gpu not in frameworks.GPUS or framework not in frameworks.FRAMEWORKS:
        return True
    native = frameworks.support(framework, report.quantization.format).native_capability
    return native is None or frameworks.GPUS[gpu].capability >= native


def _choose_partition(doc: Any, info: slurm.ClusterInfo, partition: str | None, needed: int, report: Any,
                      warnings: list[str]) -> str | None:
    """The asked partition, else the config's when it exists, else the first that is up with enough GPUs per node,
    preferring GPUs that run the format as it ships, then the cluster's default partition."""
    by_name = {p.name: p for p in info.partitions}
    current = _value(doc, "execution.partition")
    if partition is not None and partition not in by_name:
        raise ToolError(f"partition: '{partition}' does not exist on {info.host}. Partitions: {', '.join(by_name) or 'none'}.")
    if partition is not None:
        return partition
    if isinstance(current, str) and current in by_name:
        return current
    fits = [p for p in info.partitions if p.state == "UP" and p.usable_nodes and p.gpus_per_node >= needed]
    framework = _framework(doc)
    fits.sort(key=lambda p: (not _native(report, p.gpu_model, framework), not p.default, p.name))
    chosen = fits[0].name if fits else None
    if isinstance(current, str) and current != configfile.MISSING:
        warnings.append(f"execution.partition '{current}' does not exist on {info.host} (sbatch would refuse the job)"
                        + (f"; using {chosen}." if chosen else "."))
    return chosen


def _walltime(doc: Any, chosen: slurm.PartitionInfo, walltime: str | None, values: dict[str, Any],
              notes: list[str], default: str | None) -> None:
    """The asked walltime (or the config's, or its engine's default), capped at the partition's limit, written
    explicitly."""
    wanted = walltime or _value(doc, "execution.walltime") or default
    try:
        wanted_s = slurm.slurm_seconds(str(wanted)) if wanted is not None else None
    except ValueError:
        raise ToolError(f"walltime: '{wanted}' is not a SLURM time. Use HH:MM:SS or D-HH:MM:SS.") from None
    if chosen.max_time_s is not None and (wanted_s is None or wanted_s > chosen.max_time_s):
        values["execution.walltime"] = slurm.slurm_time(chosen.max_time_s)
        notes.append(f"execution.walltime capped at partition {chosen.name}'s limit {chosen.max_time}; the engine's "
                     "auto-resume continues a run past it (up to execution.max_walltime).")
    elif wanted_s is not None:  # written even when it is the default: the config says what sbatch will be asked
        values["execution.walltime"] = slurm.slurm_time(wanted_s)


def _account(doc: Any, info: slurm.ClusterInfo, chosen: slurm.PartitionInfo, values: dict[str, Any],
             warnings: list[str]) -> None:
    """Fill the account when exactly one is visible; warn when the config's is not the user's or not allowed here."""
    account = _value(doc, "execution.account")
    if info.accounts is not None:
        if account in (None, configfile.MISSING) and len(info.accounts) == 1:
            values["execution.account"] = info.accounts[0]
        elif isinstance(account, str) and account != configfile.MISSING and account not in info.accounts:
            warnings.append(f"execution.account '{account}' is not one of your accounts on {info.host}: "
                            f"{', '.join(info.accounts) or 'none'}.")
    if chosen.allowed_accounts and isinstance(account, str) and account not in chosen.allowed_accounts:
        warnings.append(f"Partition {chosen.name} only accepts accounts {', '.join(chosen.allowed_accounts)}, "
                        f"not '{account}'.")


def _in_keys_of(engine: engines.Engine, text: str) -> str:
    """A placement note or warning (written in NEL 0.2.6's execution keys) in the keys of the config's engine."""
    return re.sub(r"\bexecution\.[a-z_]+\b", lambda key: engine.placement.key(key.group(0)), text)


def plan_placement(doc: Any, info: slurm.ClusterInfo, partition: str | None = None, report: Any = None,
                   walltime: str | None = None, default_walltime: str | None = None) -> Placement:
    """What a SLURM config should say for this cluster: partition, GPUs per node, walltime (and account when only
    one is visible), with warnings. `report` is the checkpoint's inspect_checkpoint report, for the format check;
    `default_walltime` what the config's engine runs for when none is set (PlacementRole.defaults)."""
    needed, notes = gpus_needed(doc)
    warnings: list[str] = []
    partition = _choose_partition(doc, info, partition, needed, report, warnings)
    if partition is None:
        warnings.append(f"No partition on {info.host} is up with a usable node of {needed} GPUs: lower "
                        "deployment.tensor_parallel_size, or ask the admins. Partitions: "
                        + ", ".join(f"{p.name} ({p.gpus_per_node} x {p.gpu_model or 'GPU'})" for p in info.partitions))
        return Placement(partition=None, gpu_model=None, gpus_per_node=needed, values={}, warnings=warnings, notes=notes)

    chosen = next(p for p in info.partitions if p.name == partition)
    values: dict[str, Any] = {"execution.partition": partition}
    if chosen.state != "UP":
        warnings.append(f"Partition {partition} is {chosen.state}: jobs wait until the admins bring it up.")
    elif not chosen.usable_nodes:
        warnings.append(f"Partition {partition} has no usable node right now (all down or drained): jobs will pend.")
    if needed > chosen.gpus_per_node:
        warnings.append(f"The deployment needs {needed} GPUs per node (TP x DP x PP / num_nodes); partition {partition} "
                        f"has {chosen.gpus_per_node}. Lower deployment.tensor_parallel_size / data_parallel_size, "
                        "raise execution.num_nodes, or choose another partition.")
    # NEL writes `#SBATCH --gpus-per-node` from execution.gpus_per_node and `--gres` from execution.gres.
    if _value(doc, "execution.gpus_per_node") is not None:
        values["execution.gpus_per_node"] = needed or None
    else:
        values["execution.gres"] = f"gpu:{needed}" if needed else None
    if not needed:
        notes.append("No deployment in this config (deployment: none): the evaluation job asks for no GPUs.")
    _walltime(doc, chosen, walltime, values, notes, default_walltime)
    _account(doc, info, chosen, values, warnings)
    if report is not None:
        better = next((p for p in info.partitions if p.state == "UP" and p.gpus_per_node >= needed
                       and p.gpu_model and _native(report, p.gpu_model, _framework(doc)) and p.name != partition), None)
        warnings += _format_warnings(report, _framework(doc), chosen.gpu_model, partition, better)
    elif _framework(doc) != "none":
        notes.append("The checkpoint was not inspected here, so its format was not checked against the GPUs: pass "
                     "checkpoint (a local copy or an HF handle).")
    return Placement(partition=partition, gpu_model=chosen.gpu_model, gpus_per_node=needed, values=values,
                     warnings=warnings, notes=notes)


class ApplyClusterInput(StrictModel):
    config_path: str = Field(description="The config (.yaml); its execution must be slurm.")
    host: str | None = Field(None, description="SLURM login host (ssh alias). Default: the config's execution.hostname.")
    partition: str | None = Field(None, pattern=r"^[\w.-]+$", description=(
        "Default: the config's if it exists, else one that is up with enough GPUs."))
    checkpoint: str | None = Field(None, description=(
        "Checkpoint whose format is checked against the GPUs. Default: the config's."))
    walltime: str | None = Field(None, pattern=r"^[\d:-]+$", description=(
        "[D-]HH:MM:SS. Default: the config's, capped at the partition's limit."))


class ApplyClusterOutput(BaseModel):
    config_path: str
    host: str
    placement: Placement
    changes: list[str] = Field(description="One line per key written: key: old -> new.")
    diff: str = Field(description="Unified diff of the config file (empty when nothing changed).")
    partition_info: slurm.PartitionInfo | None = Field(description="What the cluster says about the chosen partition.")
    query_s: float = Field(description="Seconds the cluster took to answer.")


def _checkpoint_report(doc: Any, checkpoint: str | None) -> tuple[Any, str | None]:
    from quanteval.serving.checkpoint import InspectCheckpointInput, inspect_checkpoint

    candidate = checkpoint or _value(doc, "deployment.hf_model_handle") or _value(doc, "deployment.checkpoint_path")
    if not isinstance(candidate, str) or candidate == configfile.MISSING:
        return None, None
    try:
        return inspect_checkpoint(InspectCheckpointInput(checkpoint=candidate)), None
    except ToolError as exc:
        if checkpoint:
            raise
        return None, f"{candidate} is not readable here ({str(exc)[:120]}), so its format was not checked: pass checkpoint."


def apply_cluster(request: ApplyClusterInput, progress: ProgressFn = no_progress) -> ApplyClusterOutput:
    """Use after apply_checkpoint for a SLURM config: asks the cluster, writes partition, gres, walltime, user and a lone
    account; warns if its GPUs cannot run the checkpoint's format.
    """

    written = engines.load_config(request.config_path)
    engine = engines.for_config(written)
    doc = engine.placement.view(written)
    execution = engine.config.execution_type(written)
    if not executors.for_name(execution).on_cluster:  # nothing a cluster must be asked for (a run here)
        raise ToolError(f"{request.config_path}: execution is '{execution}', not slurm ({engine.placement.key('execution.type')}); "
                        f"apply_cluster fits SLURM configs. Build one with build_config engine='{engine.name}' "
                        "execution='slurm'.")
    host = request.host or _value(doc, "execution.hostname")
    if not isinstance(host, str) or host in ("", configfile.MISSING):
        key = engine.placement.key("execution.hostname")
        raise ToolError(f"{request.config_path}: {key} is not set. Pass host, or set {key} "
                        "to the login node's alias in ~/.ssh/config.")
    progress(0, 3, f"asking {host} for its partitions")
    info = slurm.describe_cluster(host)
    progress(1, 3, "checking the checkpoint's format")
    report, problem = _checkpoint_report(doc, request.checkpoint)
    placement = plan_placement(doc, info, request.partition, report, request.walltime,
                               engine.placement.defaults(doc).get("execution.walltime"))
    if problem:
        placement.notes.append(problem)
    # what the placement says, in the config's own keys (nel-next: cluster.walltime, not execution.walltime)
    placement.notes = [_in_keys_of(engine, note) for note in placement.notes]
    placement.warnings = [_in_keys_of(engine, warning) for warning in placement.warnings]
    if request.host and engine.placement.writes_host:
        placement.values["execution.hostname"] = host
    if host != ssh.LOCAL:
        # NEL logs in as `execution.username@execution.hostname`, which overrides the ssh config's User (NEL's
        # template says ${oc.env:USER}); write the user OpenSSH resolves for the host, the one just logged in as.
        placement.values["execution.username"] = ssh.ssh_user(host)
    progress(2, 3, "writing the config")
    changes: list[str] = []

    def mutate(target: Any) -> None:
        changes.clear()
        for key, value in engine.placement.edits(placement.values).items():
            old = _value(target, key)
            if old != value or not configfile.has_path(target, key):
                configfile.set_path(target, key, value)
                changes.append(f"{key}: {old!r} -> {value!r}")

    diff = engines.edit_config(request.config_path, mutate) if placement.values else ""
    progress(3, 3, "done")
    chosen = next((p for p in info.partitions if p.name == placement.partition), None)
    return ApplyClusterOutput(config_path=request.config_path, host=host, placement=placement, changes=changes,
                              diff=diff, partition_info=chosen, query_s=info.query_s)
