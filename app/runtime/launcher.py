"""Who am I in this job? The ONE place that reads the launcher's environment.

Every launcher describes a process with its own variables; ``detect`` turns them into one frozen,
validated ``ProcessInfo``. Precedence, first match wins (a launcher nested in another, like
torchrun started by srun, is described by the innermost one):

1. torchrun / torch.distributed.run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
   MASTER_ADDR, MASTER_PORT. A hand-written RANK/WORLD_SIZE environment also works: LOCAL_RANK
   then defaults to RANK and LOCAL_WORLD_SIZE to WORLD_SIZE (one node).
2. OpenMPI mpirun: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE; MASTER_ADDR and MASTER_PORT
   passed with ``-x``.
3. MPICH / Intel MPI (hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS. srun's own
   PMI plugins (``srun --mpi=pmi2``) set PMI_RANK and PMI_SIZE too, but never MPI_LOCALRANKID:
   PMI_RANK beside SLURM_PROCID without MPI_LOCALRANKID is srun's, described as Slurm below.
4. Slurm srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID; the master is MASTER_ADDR
   or else the first host of SLURM_JOB_NODELIST; the port MASTER_PORT or else 20000 + job id % 10000.
5. None of these: a single process (world size 1).

The variable names and defaults are ``envvars``' (shared with the renderers of launch files).
MASTER_PORT defaults to contract.RENDEZVOUS_PORT (torchrun's default) where a launcher gives none. The node rank of
the MPI launchers is rank // local world size (their default by-slot mapping). Besides the rank,
``detect`` captures everything else the job will ever read from its environment (torchrun's
restart count and agent store, the interface chosen for gloo/NCCL, the host name): other modules
never read ``os.environ``, they receive these values.

    python -m app check                                   # single process
    torchrun --nproc-per-node 2 -m app check              # torchrun
    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python -m app check
    srun -N 2 --ntasks-per-node 4 python -m app check     # Slurm
"""

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from app import contract, evict
from app.errors import UsageError
from app.runtime import envvars, hostlist
from app.runtime.envvars import RankVariables


class Launcher(StrEnum):
    """The program that started this process."""

    TORCHRUN = "torchrun"
    OPENMPI = "openmpi"
    MPICH = "mpich"
    SLURM = "slurm"
    SINGLE = "single"

    @property
    def variables(self) -> RankVariables:
        """The names under which this launcher sets rank and sizes."""
        return {v.launcher: v for v in (*envvars.LAUNCHERS, envvars.SINGLE)}[self.value]


@dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the job, validated on construction, and what its launcher told it."""

    rank: int
    """Global rank, in [0, world_size)."""
    local_rank: int
    """Rank on this node; also the index of the GPU this process binds."""
    world_size: int
    """Number of processes in the job."""
    local_world_size: int
    """Number of processes on this node."""
    node_rank: int
    """Index of this node in the job."""
    master_addr: str | None
    """Host of rank 0's rendezvous store; None for a single process or a file rendezvous."""
    master_port: int
    """Port of the rendezvous store."""
    launcher: Launcher
    """Which launcher's variables described this process."""
    restart_count: int = field(default=0, compare=False)
    """How many times torchrun's agent has restarted this job's workers (0 under other launchers)."""
    torchelastic: bool = field(default=False, compare=False)
    """torchrun's agent serves the rendezvous store: join it rather than serving one."""
    agent_store: bool = field(default=False, compare=False)
    """The agent hosts the store that its workers join as clients (TORCHELASTIC_USE_AGENT_STORE)."""
    ifname: str | None = field(default=None, compare=False)
    """The interface chosen for gloo/NCCL in the environment (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)."""
    host: str = field(default="", compare=False)
    """This machine's host name, as the other nodes know it."""
    named_nodes: int = field(default=0, compare=False)
    """Nodes the environment names apart from the ranks (Slurm's node count, NNODES); 0 when it names none."""
    named_nodes_by: str = field(default="", compare=False)
    """The variable that named them, as ``SLURM_STEP_NUM_NODES=2``."""
    survivors_store: tuple[str, int] | None = field(default=None, compare=False)
    """(host, port) of a store that outlives every node of the job (DDP_CLUSTER_SURVIVORS_STORE: app node's
    rendezvous store); None when the launcher names none."""
    eviction: evict.Policy | None = field(default=None, compare=False)
    """The straggler policy that app node handed this rank whole (``hand_eviction``): its ranks evict their own node
    by it; None: nothing is evicted from here."""
    node_range: tuple[int, int] | None = field(default=None, compare=False)
    """(MIN, MAX): the nodes of the job as app node's torchrun was given them (--nnodes, DDP_CLUSTER_NODE_RANGE); None
    when the launcher names none."""

    def __post_init__(self) -> None:
        names = self.launcher.variables
        where = f" ({self.launcher.value})"
        if self.world_size < 1:
            raise UsageError(f"world size {_named(names.size, self.world_size)} must be >= 1{where}")
        if not 0 <= self.rank < self.world_size:
            raise UsageError(
                f"rank {_named(names.rank, self.rank)} must be in [0, world size "
                f"{_named(names.size, self.world_size)}){where}: the launcher gave this process a rank "
                "outside the job; check how it was started"
            )
        if not 1 <= self.local_world_size <= self.world_size:
            raise UsageError(
                f"local world size {_named(names.local_size, self.local_world_size)} must be in [1, world size "
                f"{_named(names.size, self.world_size)}]{where}"
            )
        if not 0 <= self.local_rank < self.local_world_size:
            raise UsageError(
                f"local rank {_named(names.local_rank, self.local_rank)} must be in [0, local world size "
                f"{_named(names.local_size, self.local_world_size)}){where}"
            )
        if not 0 <= self.node_rank < self.world_size:
            raise UsageError(
                f"node rank {_named(names.node_rank, self.node_rank)} must be in [0, world size "
                f"{_named(names.size, self.world_size)}){where}: each node holds at least one rank"
            )
        envvars.check_port(self.master_port)

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the process that prints and saves."""
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        """Number of nodes, assuming the same number of processes on each."""
        return max(1, self.world_size // self.local_world_size)

    @property
    def spans_nodes(self) -> bool:
        """True when other nodes hold some of this job's ranks (exact, also with uneven nodes)."""
        return self.local_world_size < self.world_size

    @property
    def elastic(self) -> bool:
        """The job may go on with fewer nodes than it started with (app node's --nnodes MIN:MAX, MIN below MAX)."""
        return self.node_range is not None and self.node_range[0] < self.node_range[1]


@dataclass(frozen=True)
class Identity:
    """Who this process is, read without validation: a bad environment still gets its log file and error line."""

    rank: str | None
    """The rank as the first launcher's variable gives it; None without a launcher."""
    host: str
    """This machine's host name."""
    error_file: str | None = None
    """Where torchrun's agent reads this worker's error for its report (TORCHELASTIC_ERROR_FILE)."""

    @property
    def number(self) -> int | None:
        """The rank as a number; None without a launcher or when its variable is not one."""
        return int(self.rank) if (self.rank or "").isdigit() else None


def identity(env: Mapping[str, str] | None = None) -> Identity:
    """This process's rank (unvalidated) and host, for naming its log file and its error line."""
    env = os.environ if env is None else env
    raw = next((env[v.rank].strip() for v in envvars.LAUNCHERS if env.get(v.rank, "").strip()), None)
    return Identity(raw, socket.gethostname(), env.get(envvars.TORCHELASTIC_ERROR_FILE) or None)


def _named(variable: str | None, value: int) -> str:
    """``value`` with the variable it came from, e.g. ``3 (RANK=3)``."""
    return f"{value} ({variable}={value})" if variable else str(value)


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise UsageError(f"{name} is not set: the launcher must set it, or unset the other rank variables")
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not an integer: fix or unset it") from None


def _size(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    """A process count: an integer >= 1."""
    value = _int(env, name, default)
    if value < 1:
        raise UsageError(f"{name}={value} is not a process count: it must be >= 1 (world size)")
    return value


def _require_pair(env: Mapping[str, str], names: RankVariables) -> None:
    rank_var, size_var = names.rank, names.size
    if (rank_var in env) != (size_var in env):
        present, missing = (rank_var, size_var) if rank_var in env else (size_var, rank_var)
        raise UsageError(f"{present} is set but {missing} is not: set both or neither")


def _master(env: Mapping[str, str], default_addr: str | None, default_port: int) -> tuple[str | None, int]:
    addr = env.get(envvars.MASTER_ADDR, "").strip() or default_addr
    return addr, _int(env, envvars.MASTER_PORT, default_port)


def _from_torchrun(env: Mapping[str, str]) -> dict:
    v = envvars.TORCHRUN
    rank, world = _int(env, v.rank), _size(env, v.size)
    local_world = _size(env, v.local_size, world)
    return {
        "rank": rank,
        "local_rank": _int(env, v.local_rank, rank),
        "world_size": world,
        "local_world_size": local_world,
        "node_rank": _int(env, v.node_rank, rank // local_world),
        "launcher": Launcher.TORCHRUN,
        "restart_count": _int(env, envvars.TORCHELASTIC_RESTART_COUNT, 0),
        "torchelastic": envvars.TORCHELASTIC_RUN_ID in env,
        "agent_store": env.get(envvars.TORCHELASTIC_USE_AGENT_STORE) == "True",
        "survivors_store": _survivors_store(env),
        "eviction": _handed_eviction,
        "node_range": _node_range(env),
    }


def _survivors_store(env: Mapping[str, str]) -> tuple[str, int] | None:
    """DDP_CLUSTER_SURVIVORS_STORE as (host, port); None when unset."""
    value = env.get(envvars.SURVIVORS_STORE, "").strip()
    if not value:
        return None
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(f"{envvars.SURVIVORS_STORE}={value!r} must be HOST:PORT (app node sets it): unset it")
    return host, int(port)


def _node_range(env: Mapping[str, str]) -> tuple[int, int] | None:
    """DDP_CLUSTER_NODE_RANGE as (MIN, MAX); None when unset."""
    value = env.get(envvars.NODE_RANGE, "").strip()
    if not value:
        return None
    least, _, most = value.partition(":")
    if not (least.isdigit() and most.isdigit() and 1 <= int(least) <= int(most)):
        raise UsageError(
            f"{envvars.NODE_RANGE}={value!r} must be MIN:MAX with 1 <= MIN <= MAX (app node sets it from --nnodes): "
            "unset it"
        )
    return int(least), int(most)


def _from_mpi(env: Mapping[str, str], v: RankVariables, launcher: Launcher) -> dict:
    rank, world = _int(env, v.rank), _size(env, v.size)
    local_world = _size(env, v.local_size, 1)
    return {
        "rank": rank,
        "local_rank": _int(env, v.local_rank, 0),
        "world_size": world,
        "local_world_size": local_world,
        "node_rank": rank // local_world,
        "launcher": launcher,
    }


def _slurm_local_world(env: Mapping[str, str]) -> int:
    if envvars.SLURM.local_size in env:
        return _size(env, envvars.SLURM.local_size)
    per_node = env.get(envvars.SLURM_TASKS_PER_NODE, "1")  # e.g. "4(x2)" or "4,3"
    first = per_node.split(",")[0].split("(")[0]
    if not first.isdigit() or int(first) < 1:
        raise UsageError(f"{envvars.SLURM_TASKS_PER_NODE}={per_node!r} is not a Slurm task count like '4(x2)'")
    return int(first)


def _slurm_master(env: Mapping[str, str]) -> tuple[str | None, int]:
    nodelist = next((env[name] for name in envvars.SLURM_JOB_NODELIST if env.get(name)), None)
    first_host = hostlist.expand(nodelist)[0] if nodelist else None
    job_port = envvars.SLURM_PORT_BASE + _int(env, envvars.SLURM_JOB_ID, 0) % envvars.SLURM_PORT_SPAN
    return _master(env, first_host, job_port)


def _from_slurm(env: Mapping[str, str]) -> dict:
    v = envvars.SLURM
    rank, world = _int(env, v.rank), _size(env, v.size)
    local_world = min(_slurm_local_world(env), world)
    return {
        "rank": rank,
        "local_rank": _int(env, v.local_rank, 0),
        "world_size": world,
        "local_world_size": local_world,
        "node_rank": _int(env, v.node_rank, rank // local_world),
        "launcher": Launcher.SLURM,
    }


def _from_single(_env: Mapping[str, str]) -> dict:
    return {"rank": 0, "local_rank": 0, "world_size": 1, "local_world_size": 1, "node_rank": 0}


def _srun_pmi(env: Mapping[str, str]) -> bool:
    """PMI_RANK comes from srun's PMI plugin (srun --mpi=pmi2), not from an MPI launcher (hydra)."""
    return envvars.SLURM.rank in env and envvars.MPICH.local_rank not in env


def _ranks(env: Mapping[str, str]) -> dict:
    """The rank fields from the first launcher whose variables are set."""
    for names in envvars.LAUNCHERS:
        _require_pair(env, names)
    if envvars.TORCHRUN.rank in env:
        return _from_torchrun(env)
    if envvars.OPENMPI.rank in env:
        return _from_mpi(env, envvars.OPENMPI, Launcher.OPENMPI)
    if envvars.MPICH.rank in env and not _srun_pmi(env):
        return _from_mpi(env, envvars.MPICH, Launcher.MPICH)
    if envvars.SLURM.rank in env:
        return _from_slurm(env)
    return {**_from_single(env), "launcher": Launcher.SINGLE}


_MASTER_HINTS = {
    Launcher.OPENMPI: "add -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<port> to mpirun",
    Launcher.MPICH: "add -genv MASTER_ADDR <host of rank 0> -genv MASTER_PORT <port> to mpiexec",
}
"""How to give MASTER_ADDR to the ranks of each launcher that does not set it itself."""


def _named_nodes(env: Mapping[str, str]) -> tuple[int, str]:
    """The job's node count as the environment names it apart from the ranks, and the variable; (0, '') if none."""
    for name in envvars.NODE_COUNTS:
        raw = env.get(name, "").strip()
        if raw.isdigit() and int(raw) >= 1:
            return int(raw), f"{name}={raw}"
    return 0, ""


@dataclass(frozen=True)
class Node:
    """This machine as a node's agent sees it before torchrun starts any rank."""

    host: str
    """This machine's host name."""
    ifname: str | None
    """The interface set for gloo and NCCL (GLOO_SOCKET_IFNAME...), if any."""


def this_node(env: Mapping[str, str] | None = None) -> Node:
    """This node, read without rank variables: a node's environment may hold the job's WORLD_SIZE (Ansible's
    env file) while RANK comes only with torchrun's workers, so ``detect`` does not apply before them."""
    env = os.environ if env is None else env
    return Node(socket.gethostname(), next((env[name] for name in envvars.IFNAME_VARIABLES if env.get(name)), None))


def cpu_threads(env: Mapping[str, str] | None = None) -> int | None:
    """The threads OMP_NUM_THREADS gives this process's CPU operators; None when it is unset or not a positive
    number (torch's default then). A process forked from one that imported torch must set them itself: OpenMP
    read the variable when the parent loaded it."""
    env = os.environ if env is None else env
    value = env.get(envvars.OMP_NUM_THREADS, "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def detect(env: Mapping[str, str] | None = None, *, need_master: bool = True) -> ProcessInfo:
    """Describe this process from the environment (``os.environ`` by default).

    need_master: with several processes, a MASTER_ADDR is required (False when the caller gives
    its own rendezvous, such as a shared file).
    """
    env = os.environ if env is None else env
    fields = _ranks(env)
    if fields["launcher"] is Launcher.SLURM:
        addr, port = _slurm_master(env)
    else:
        addr, port = _master(env, None, contract.RENDEZVOUS_PORT)
    ifname = this_node(env).ifname
    nodes, nodes_by = _named_nodes(env)
    info = ProcessInfo(
        **fields,
        master_addr=addr,
        master_port=port,
        ifname=ifname,
        host=socket.gethostname(),
        named_nodes=nodes,
        named_nodes_by=nodes_by,
    )
    if need_master and info.world_size > 1 and not info.master_addr:
        slurm = info.launcher is Launcher.SLURM
        unset = "neither MASTER_ADDR nor SLURM_JOB_NODELIST is" if slurm else "MASTER_ADDR is not"
        hint = _MASTER_HINTS.get(info.launcher, "export MASTER_ADDR=<host of rank 0>")
        raise UsageError(
            f"{info.launcher.value} started {info.world_size} processes ({info.launcher.variables.size}="
            f"{info.world_size}) but {unset} set: {hint} or pass --init-method file:///shared/dir/rendezvous"
        )
    return info


def events_file(env: Mapping[str, str] | None = None) -> str | None:
    """The job's events file (``app.events``), or None where the job keeps none."""
    env = os.environ if env is None else env
    return env.get(envvars.EVENTS_FILE) or None


def environment() -> dict[str, str]:
    """A copy of this process's environment (app node: what its fork server started with)."""
    return dict(os.environ)


def set_environment(values: Mapping[str, str]) -> None:
    """Set ``values`` in this process's environment (a forked rank: what its agent set after the fork server
    started, as a new process would have inherited it)."""
    os.environ.update(values)


def export_survivors_store(endpoint: str) -> None:
    """Name the survivors' store, ``host:port``, to this process and the ranks it starts
    (``ProcessInfo.survivors_store``)."""
    os.environ[envvars.SURVIVORS_STORE] = endpoint


def export_store_per_round() -> None:
    """A store per rendezvous round for torch's agent in this process (``envvars.STORE_PER_ROUND``)."""
    os.environ.update(envvars.STORE_PER_ROUND)


def hand_eviction(policy: evict.Policy | None) -> None:
    """This rank's straggler policy, as app node built it (a forked rank: from its ``agent.Job``): ``detect`` gives
    it in ``ProcessInfo.eviction``."""
    global _handed_eviction
    _handed_eviction = policy


_handed_eviction: evict.Policy | None = None
"""The policy ``hand_eviction`` was given in this process."""


def export_node_range(least: int, most: int) -> None:
    """Tell the ranks this process starts how many nodes their job may have (``ProcessInfo.node_range``)."""
    os.environ[envvars.NODE_RANGE] = f"{least}:{most}"


def export_socket_ifname(ifname: str) -> None:
    """Make gloo and NCCL use interface ``ifname`` (before the process group starts)."""
    for name in envvars.IFNAME_VARIABLES:
        os.environ[name] = ifname


def record_collectives(folder: Path) -> Path:
    """Turn torch's flight recorder on (before the process group starts) unless the launcher did; the
    prefix of its dump files: TORCH_FR_DUMP_TEMP_FILE as set, else ``folder``/fr-rank."""
    os.environ.setdefault(envvars.FR_BUFFER_SIZE, envvars.FLIGHT_RECORDER[envvars.FR_BUFFER_SIZE])
    return Path(os.environ.setdefault(envvars.FR_DUMP_FILE, str(folder.absolute() / "fr-rank")))
