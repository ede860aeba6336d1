"""The environment-variable contract: the names each launcher sets, and the defaults of what it may
leave out. Launcher detection (``launcher.py``, the one module that reads the environment) and the
renderers of launch files (``topology``: env files, torchrun/mpirun arguments, sbatch scripts,
Kubernetes manifests) share these names, so that what one writes the other reads.

    torchrun --nproc-per-node 2 -m app check        # sets RANK, WORLD_SIZE, LOCAL_RANK, ...
    mpirun -np 2 -x MASTER_ADDR=a -x MASTER_PORT=29500 python -m app check   # OMPI_COMM_WORLD_*
    srun -N 2 --ntasks-per-node 2 python -m app check                       # SLURM_PROCID, ...
"""

from dataclasses import dataclass

from app import contract
from app.errors import UsageError

MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
PORT_MIN, PORT_MAX = 1024, 65535
"""Rendezvous ports: every process of a job runs as an unprivileged user, which cannot bind below 1024."""

IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
"""The network interface that gloo and NCCL use, when set."""

FLIGHT_RECORDER = {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
"""torch's flight recorder, on for every rank the project launches: the last 2000 collectives of each rank
(gloo's too: torch's CPU recorder), and NCCL's dump of them when a collective times out."""
FR_BUFFER_SIZE = "TORCH_FR_BUFFER_SIZE"
FR_DUMP_FILE = "TORCH_FR_DUMP_TEMP_FILE"
"""Where the flight recorder's dumps go: this prefix + the rank (default: the run's OUT/flight/fr-rank)."""

SURVIVORS_STORE = "DDP_CLUSTER_SURVIVORS_STORE"
"""``host:port`` of a store that outlives every node of the job (app node sets it to its c10d rendezvous
store): where the ranks still alive hold their roll call when rank 0's store is gone with its node."""

STORE_PER_ROUND = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""torch's elastic agent with a store per rendezvous round (app node sets it for its agent): a node that comes back
(a restarted container, an evicted node healed) joins a later round, and torch's shared agent store hands a joining
node the bootstrap address of the first round only, which the new node cannot read (it waits until the join
timeout; on Slurm the other agents then failed waiting 60 s for its role_info)."""

NODE_RANGE = "DDP_CLUSTER_NODE_RANGE"
"""``MIN:MAX``: torchrun's --nnodes as app node gave it to its agent, for its ranks. A round of an elastic job (MIN
below MAX) may hold fewer nodes than the engine names (Slurm's SLURM_STEP_NUM_NODES still counts a node that died),
one node alone too: no world of one. Unset: the ranks know no range."""

OMP_NUM_THREADS = "OMP_NUM_THREADS"
"""The threads of a process's CPU operators (torchrun sets 1 for each rank of a node of several)."""

NNODES = "NNODES"
NPROC_PER_NODE = "NPROC_PER_NODE"
"""Written by the env file of a cluster (hosts and processes per host); no launcher reads them."""

TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
"""Set by torchrun's agent: its store serves the rendezvous (join it, do not serve one)."""
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
"""How many times torchrun's agent has restarted the workers of this job."""
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"
"""torchrun's --max-restarts."""
TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
"""'True' when the agent hosts the store that its workers join as clients."""
TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
"""Where torchrun's agent reads a failed worker's error (JSON) for the root cause of its ChildFailedError report."""

SLURM_JOB_NODELIST = ("SLURM_JOB_NODELIST", "SLURM_NODELIST")
"""The job's hosts, compressed (``node[01-04]``); the first one serves the rendezvous under Slurm."""
SLURM_JOB_ID = "SLURM_JOB_ID"
PET_NNODES = "PET_NNODES"
"""torchrun's --nnodes as Kubeflow Trainer's torch plugin sets it in every trainer pod (torchrun reads
PET_<OPTION> for each option; its workers inherit it)."""
PET_RDZV_ID = "PET_RDZV_ID"
"""torchrun's --rdzv-id as a variable: a TrainJob's (static rendezvous) names its job by it, so that the node's
metrics carry the job's name (``app node`` labels them with the rendezvous id)."""
NODE_COUNTS = ("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", NNODES, PET_NNODES)
"""Where the environment names the job's node count apart from the ranks (first set wins): Slurm's step,
then its allocation, then NNODES of a cluster env file, then Kubeflow Trainer's PET_NNODES. A job of
one node under them is a world of one."""
SLURM_TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
"""Tasks on each node, compressed (``4(x2)`` or ``4,3``); SLURM_NTASKS_PER_NODE when given instead."""
SLURM_PORT_BASE, SLURM_PORT_SPAN = 20000, 10000
"""Under Slurm without MASTER_PORT, the port is SLURM_PORT_BASE + job id % SLURM_PORT_SPAN, the
same on every node of a job and different for jobs that share a node."""


@dataclass(frozen=True)
class RankVariables:
    """The names under which one launcher gives a process its place in the job."""

    launcher: str
    """The launcher's name, as messages show it."""
    rank: str
    """Global rank."""
    size: str
    """World size."""
    local_rank: str
    """Rank on this node."""
    local_size: str
    """Processes on this node."""
    node_rank: str | None = None
    """Index of this node, where the launcher gives one."""


TORCHRUN = RankVariables("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
OPENMPI = RankVariables(
    "openmpi",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)
MPICH = RankVariables("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
SLURM = RankVariables("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID")
SINGLE = RankVariables("single", "", "", "", "")
LAUNCHERS = (TORCHRUN, OPENMPI, MPICH, SLURM)
"""In precedence order: a launcher nested in another (torchrun under srun) is described by the innermost."""


def check_port(port: int, name: str = MASTER_PORT) -> int:
    """``port`` when it is a rendezvous port this project can use, else a UsageError naming ``name``."""
    if not PORT_MIN <= port <= PORT_MAX:
        raise UsageError(
            f"{name}={port} must be in {PORT_MIN}-{PORT_MAX}: the job's processes run unprivileged "
            f"and cannot bind lower ports; the default is {contract.RENDEZVOUS_PORT}"
        )
    return port


EVENTS_FILE = "DDP_CLUSTER_EVENTS_FILE"
"""The job's events file (``app.events``): where every node agent and rank appends what happened to the job, as
facts; the cluster runner reads them. Unset: no events are written."""
