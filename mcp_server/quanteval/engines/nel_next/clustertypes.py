"""What nel-next does differently on each `cluster.type` it runs on, in one table.

nel-next's cluster types are its own vocabulary (local, docker, slurm). Each one quanteval launches maps to one of
quanteval's executors (clusters/executor.py), which then watches the jobs; what differs is nel-next's own behaviour
there: how it starts a run (`nel eval run` here as a LocalExecutor job, or `nel eval run --submit`, whose sbatch jobs
the SLURM executor adopts), what the launch runs on this machine, the cluster section build_config writes, and what its
job template does to a config's values. The engine's config rules and run code read this table instead of comparing
cluster types; a cluster type quanteval does not launch (docker) has no row.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from quanteval.clusters import executor as executors
from quanteval.configfile import MISSING
from quanteval.models import ToolError


@dataclass(frozen=True)
class ClusterType:
    name: str
    # nel-next submits the run's jobs itself (`nel eval run --submit`) and quanteval's executor adopts them; otherwise
    # quanteval starts `nel eval run` as a local job with its own output directory (`-o`)
    submits: bool
    # what nel-next's launch runs on this machine besides itself (a bare Errno 2 without them)
    binaries: tuple[str, ...] = ()
    # the cluster section build_config writes: what only the cluster can tell left ??? (apply_cluster asks it)
    section: dict[str, Any] = field(default_factory=dict)
    # nel-next's job template appends the protocol's path to an api service's url (0.3.0's slurm_gen:
    # ${URL}/chat/completions), where its local runs strip it
    appends_protocol_path: bool = False
    # the job runs with the environment its sbatch --export names (cluster.sbatch_extra_flags.export), not this
    # process's
    exported_environment: bool = False
    # the cluster section takes NEL 0.2.6's placement keys (convert_config maps execution.hostname, partition, ...)
    takes_placement: bool = False
    # nel-next starts the config's managed servers (vllm, sglang services) on this machine, as `python -m MODULE` from
    # the PATH of `nel eval run` (servers.py); on SLURM its job starts them on the node
    starts_servers_here: bool = False

    @property
    def executor(self) -> executors.Executor:
        """quanteval's executor of the same name, which watches the run's jobs and knows where its files lie."""
        return executors.for_name(self.name)

    def cluster_section(self) -> dict[str, Any]:
        return {"type": self.name, **copy.deepcopy(self.section)}


LOCAL = ClusterType("local", submits=False, starts_servers_here=True)
SLURM = ClusterType("slurm", submits=True, binaries=("ssh", "scp"), appends_protocol_path=True,
                    exported_environment=True, takes_placement=True,
                    # the login host, the account, one node pool (partition, nodes); its walltime default (04:00:00)
                    # stays until asked
                    section={"hostname": MISSING, "account": MISSING,
                             "node_pools": {"default": {"partition": MISSING, "nodes": 1}}})
CLUSTER_TYPES: dict[str, ClusterType] = {cluster.name: cluster for cluster in (LOCAL, SLURM)}


def of(cluster: Any) -> ClusterType | None:
    """The row for a config's `cluster` (its section, or its type's name); None for a type quanteval does not launch."""
    name = cluster.get("type") if isinstance(cluster, dict) else cluster
    return CLUSTER_TYPES.get(str(name or LOCAL.name))


def refusal(name: Any) -> str:
    return (f"cluster.type: {name!r} runs of nel-next are not launched by quanteval yet; use cluster.type "
            f"{' or '.join(CLUSTER_TYPES)}.")


def launched(cluster: Any) -> ClusterType:
    """The row a launch goes by, or a ToolError (refusal) for a cluster type quanteval does not launch."""
    if (row := of(cluster)) is None:
        raise ToolError(refusal(cluster.get("type") if isinstance(cluster, dict) else cluster))
    return row
