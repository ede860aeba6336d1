"""The Slurm mini-cluster's view of a spec (tooling beside the image builder, not part of the app package): its
compose project and node names, the environment that docker/slurm/compose.yaml reads, and the files that the
host renders once and the init service copies into /etc/slurm.

    make slurm-up NODES=2                   # python3 -m slurm.minicluster up: renders them here

The controller's host name is ``slurmctld``; each compute node is a service of the rendered
``nodes.yaml`` (extending compose.yaml's template ``node``) whose host name and container name are
its NodeName, ``<name>-slurm-node-<i>``: the engine's DNS resolves it, slurm.conf uses it, so
SLURM_JOB_NODELIST holds names that every node can reach, and what runs on a node (app check, the
doctor, torchrun) names its host as Slurm and ``docker ps`` do. Each node offers
nproc_per_node x cpus_per_rank CPUs; its memory is not scheduled (``CR_CPU``).
"""

import hashlib
import json
import os
from pathlib import Path

from app.errors import UsageError
from app.topology import compose
from app.topology.spec import ClusterSpec

COMPOSE_FILE = Path(__file__).with_name("compose.yaml")
NODES_FILE = "nodes.yaml"
"""The compute nodes as compose services, rendered beside slurm.conf (``nodes_file``)."""
CONTROLLER = "slurmctld"
"""Host name of the controller container (slurm.conf's SlurmctldHost)."""
REAL_MEMORY_MB = 1024
"""Each node's RealMemory: below what any container sees, so slurmd never drains a node for it."""
DEFAULT_PARTITION = "batch"
"""The mini-cluster's partition when the spec names none."""
SLURMD_TIMEOUT_S = 60
"""slurm.conf's SlurmdTimeout: seconds slurmctld waits for a silent slurmd before it marks the node DOWN and
fails what runs there (Slurm's own default: 300). A test that kills a node lowers it (make slurm-up
SLURMD_TIMEOUT=20) to be done sooner."""
MPI_PLUGINS = ("pmi2", "pmix", "none")
"""srun's MPI plugins in Debian bookworm's Slurm 22.05 (srun --mpi=list)."""


def project(spec: ClusterSpec) -> str:
    """The compose project of the spec's mini-cluster (apart from the compose cluster of the same name)."""
    return f"{spec.job.name}-slurm"


def node_names(spec: ClusterSpec) -> list[str]:
    """The compute nodes' names, as compose names their containers."""
    return [f"{project(spec)}-node-{i}" for i in range(1, spec.nodes.nodes + 1)]


def check(spec: ClusterSpec) -> None:
    """Raise UsageError for what the mini-cluster cannot be."""
    if spec.nodes.nodes > compose.MAX_NODES:
        raise UsageError(
            f"--nodes {spec.nodes.nodes}: the Slurm mini-cluster is for one machine; use at most "
            f"{compose.MAX_NODES} (each node is a container)"
        )
    if spec.nodes.hosts:
        raise UsageError("the Slurm mini-cluster names its own nodes: give --nodes, not --hosts")
    if spec.nodes.gpus_per_node:
        raise UsageError("the Slurm mini-cluster has no GPUs: drop --gpus-per-node (or set it to 0)")
    if spec.slurm.mpi not in MPI_PLUGINS:
        raise UsageError(f"--mpi {spec.slurm.mpi}: the mini-cluster's srun has {', '.join(MPI_PLUGINS)}")


def compose_env(spec: ClusterSpec, image: str, folder: Path, slurmd_timeout: int = SLURMD_TIMEOUT_S) -> dict[str, str]:
    """The variables docker/slurm/compose.yaml reads (the driver runs compose with them), for the files
    rendered into ``folder``.

    SLURM_CONF_DIGEST changes with slurm.conf, so that `up` with another shape recreates the
    daemons (they read slurm.conf once) and leaves a cluster of the same shape as it is.
    """
    check(spec)
    return {
        "COMPOSE_PROJECT_NAME": project(spec),
        "SLURM_IMAGE": image,
        "SLURM_FILES": os.fspath(Path(folder).resolve()),
        "SLURM_CONF_DIGEST": hashlib.sha256(slurm_conf(spec, slurmd_timeout).encode()).hexdigest()[:16],
        "STOP_GRACE": f"{compose.STOP_GRACE_S}s",
        "SHM_SIZE": compose.SHM_SIZE,
    }


def slurm_conf(spec: ClusterSpec, slurmd_timeout: int = SLURMD_TIMEOUT_S) -> str:
    """slurm.conf: one controller, the nodes sized for the spec, one partition; no accounting daemon."""
    check(spec)
    names = node_names(spec)
    cpus = spec.nodes.nproc_per_node * spec.slurm.cpus_per_rank
    nodes = f"{project(spec)}-node-[1-{len(names)}]" if len(names) > 1 else names[0]
    settings = {
        "ClusterName": spec.job.name,
        "SlurmctldHost": CONTROLLER,
        "SlurmUser": "slurm",
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        "StateSaveLocation": "/var/spool/slurmctld",
        "SlurmdSpoolDir": "/var/spool/slurmd",
        "SlurmctldPidFile": "/run/slurmctld.pid",
        "SlurmdPidFile": "/run/slurmd.pid",
        # Containers without systemd or cgroup delegation: processes tracked by /proc, no binding.
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "AccountingStorageType": "accounting_storage/none",
        "MpiDefault": spec.slurm.mpi,
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_CPU",
        # Node sizes as written here, whatever the container sees of the machine.
        "SlurmdParameters": "config_overrides",
        # Limits are the node's own (raising the submitter's would need CAP_SYS_RESOURCE).
        "PropagateResourceLimits": "NONE",
        "ReturnToService": "2",
        # sbatch refuses a job larger than the partition, rather than queueing it for ever.
        "EnforcePartLimits": "ALL",
        "SlurmdTimeout": str(slurmd_timeout),
        "InactiveLimit": "0",
        "KillWait": "10",
        # No slurmdbd, so no sacct: a finished job stays in `scontrol show job` for 10 minutes.
        "MinJobAge": "600",
        "MailProg": "/bin/true",
    }
    lines = [
        f"# slurm.conf of the Slurm mini-cluster {project(spec)}: rendered from the cluster spec by",
        "# docker/slurm/slurmconf.py (make slurm-up); edit the spec, not this.",
        *(f"{key}={value}" for key, value in settings.items()),
        f"NodeName={nodes} CPUs={cpus} RealMemory={REAL_MEMORY_MB} State=UNKNOWN",
        f"PartitionName={spec.slurm.partition or DEFAULT_PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


def nodes_file(spec: ClusterSpec) -> str:
    """The compute nodes as compose services (JSON, which compose reads as YAML): each extends the template
    ``node`` with its NodeName as host name and container name."""
    template = {"file": os.fspath(COMPOSE_FILE), "service": "node"}
    nodes = {
        name: {"extends": template, "scale": 1, "hostname": name, "container_name": name} for name in node_names(spec)
    }
    return (
        json.dumps(
            {"services": {name.removeprefix(f"{project(spec)}-"): node for name, node in nodes.items()}}, indent=2
        )
        + "\n"
    )


def cluster_files(spec: ClusterSpec, slurmd_timeout: int = SLURMD_TIMEOUT_S) -> dict[str, str]:
    """What the host renders: what the init service copies into /etc/slurm, and the nodes' compose file."""
    return {
        "slurm.conf": slurm_conf(spec, slurmd_timeout),
        "nodenames": "".join(f"{name}\n" for name in node_names(spec)),
        NODES_FILE: nodes_file(spec),
    }
