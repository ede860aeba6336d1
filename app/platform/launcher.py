"""Who am I in this job? The ONE place that reads the launcher's environment.

Every launcher describes a process with its own variables; ``detect`` turns them into one frozen,
validated ``ProcessInfo``. Precedence, first match wins (a launcher nested in another, like
torchrun started by srun, is described by the innermost one):

1. torchrun / torch.distributed.run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
   MASTER_ADDR, MASTER_PORT. A hand-written RANK/WORLD_SIZE environment also works: LOCAL_RANK
   then defaults to RANK and LOCAL_WORLD_SIZE to WORLD_SIZE (one node).
2. OpenMPI mpirun: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE; MASTER_ADDR and MASTER_PORT
   passed with ``-x``.
3. MPICH / Intel MPI (hydra): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS.
4. Slurm srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID; the master is MASTER_ADDR
   or else the first host of SLURM_JOB_NODELIST; the port MASTER_PORT or else 20000 + job id % 10000.
5. None of these: a single process (world size 1).

MASTER_PORT defaults to 29500 (torchrun's default) where a launcher gives none. The node rank of
the MPI launchers is rank // local world size (their default by-slot mapping). Other modules never
read ``os.environ``: they receive these values.

    python -m app check                                   # single process
    torchrun --nproc-per-node 2 -m app check              # torchrun
    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python -m app check
    srun -N 2 --ntasks-per-node 4 python -m app check     # Slurm
"""

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from app.errors import UsageError
from app.platform import hostlist

DEFAULT_MASTER_PORT = 29500
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class Launcher(StrEnum):
    """The program that started this process."""

    TORCHRUN = "torchrun"
    OPENMPI = "openmpi"
    MPICH = "mpich"
    SLURM = "slurm"
    SINGLE = "single"


@dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the job, validated on construction."""

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

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise UsageError(f"world size must be >= 1, got {self.world_size} ({self.launcher.value})")
        if not 0 <= self.rank < self.world_size:
            raise UsageError(
                f"rank {self.rank} must be in [0, world size {self.world_size}) ({self.launcher.value}): "
                "check the launcher's rank and size variables"
            )
        if not 1 <= self.local_world_size <= self.world_size:
            raise UsageError(
                f"local world size {self.local_world_size} must be in [1, world size {self.world_size}]"
                f" ({self.launcher.value})"
            )
        if not 0 <= self.local_rank < self.local_world_size:
            raise UsageError(
                f"local rank {self.local_rank} must be in [0, local world size {self.local_world_size})"
                f" ({self.launcher.value})"
            )
        if not 0 <= self.node_rank < self.world_size:
            raise UsageError(f"node rank {self.node_rank} must be in [0, {self.world_size})")
        if not 0 < self.master_port < 65536:
            raise UsageError(f"MASTER_PORT={self.master_port} must be in 1..65535")

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the process that prints and saves."""
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        """Number of nodes, assuming the same number of processes on each."""
        return max(1, self.world_size // self.local_world_size)


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


def _require_pair(env: Mapping[str, str], rank_var: str, size_var: str) -> None:
    if (rank_var in env) != (size_var in env):
        present, missing = (rank_var, size_var) if rank_var in env else (size_var, rank_var)
        raise UsageError(f"{present} is set but {missing} is not: set both or neither")


def _master(env: Mapping[str, str], default_addr: str | None, default_port: int) -> tuple[str | None, int]:
    addr = env.get("MASTER_ADDR", "").strip() or default_addr
    return addr, _int(env, "MASTER_PORT", default_port)


def _from_torchrun(env: Mapping[str, str]) -> ProcessInfo:
    rank, world = _int(env, "RANK"), _size(env, "WORLD_SIZE")
    local_world = _size(env, "LOCAL_WORLD_SIZE", world)
    local_rank = _int(env, "LOCAL_RANK", rank)
    addr, port = _master(env, None, DEFAULT_MASTER_PORT)
    node = _int(env, "GROUP_RANK", rank // local_world)
    return ProcessInfo(rank, local_rank, world, local_world, node, addr, port, Launcher.TORCHRUN)


def _from_mpi(env: Mapping[str, str], names: tuple[str, str, str, str], launcher: Launcher) -> ProcessInfo:
    rank_var, size_var, local_rank_var, local_size_var = names
    rank, world = _int(env, rank_var), _size(env, size_var)
    local_rank, local_world = _int(env, local_rank_var, 0), _size(env, local_size_var, 1)
    addr, port = _master(env, None, DEFAULT_MASTER_PORT)
    return ProcessInfo(rank, local_rank, world, local_world, rank // local_world, addr, port, launcher)


def _slurm_local_world(env: Mapping[str, str]) -> int:
    if "SLURM_NTASKS_PER_NODE" in env:
        return _size(env, "SLURM_NTASKS_PER_NODE")
    per_node = env.get("SLURM_TASKS_PER_NODE", "1")  # e.g. "4(x2)" or "4,3"
    first = per_node.split(",")[0].split("(")[0]
    if not first.isdigit() or int(first) < 1:
        raise UsageError(f"SLURM_TASKS_PER_NODE={per_node!r} is not a Slurm task count like '4(x2)'")
    return int(first)


def _from_slurm(env: Mapping[str, str]) -> ProcessInfo:
    rank, world = _int(env, "SLURM_PROCID"), _size(env, "SLURM_NTASKS")
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    first_host = hostlist.expand(nodelist)[0] if nodelist else None
    job_port = 20000 + _int(env, "SLURM_JOB_ID", 0) % 10000
    addr, port = _master(env, first_host, job_port)
    local_world = min(_slurm_local_world(env), world)
    local_rank = _int(env, "SLURM_LOCALID", 0)
    node = _int(env, "SLURM_NODEID", rank // local_world)
    return ProcessInfo(rank, local_rank, world, local_world, node, addr, port, Launcher.SLURM)


def _from_single(env: Mapping[str, str]) -> ProcessInfo:
    addr, port = _master(env, None, DEFAULT_MASTER_PORT)
    return ProcessInfo(0, 0, 1, 1, 0, addr, port, Launcher.SINGLE)


def detect(env: Mapping[str, str] | None = None, *, need_master: bool = True) -> ProcessInfo:
    """Describe this process from the environment (``os.environ`` by default).

    need_master: with several processes, a MASTER_ADDR is required (False when the caller gives
    its own rendezvous, such as a shared file).
    """
    env = os.environ if env is None else env
    _require_pair(env, "RANK", "WORLD_SIZE")
    _require_pair(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")
    _require_pair(env, "PMI_RANK", "PMI_SIZE")
    _require_pair(env, "SLURM_PROCID", "SLURM_NTASKS")
    if "RANK" in env:
        info = _from_torchrun(env)
    elif "OMPI_COMM_WORLD_RANK" in env:
        names = (
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        )
        info = _from_mpi(env, names, Launcher.OPENMPI)
    elif "PMI_RANK" in env:
        info = _from_mpi(env, ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"), Launcher.MPICH)
    elif "SLURM_PROCID" in env:
        info = _from_slurm(env)
    else:
        info = _from_single(env)
    if need_master and info.world_size > 1 and not info.master_addr:
        raise UsageError(
            f"{info.launcher.value} started {info.world_size} processes but MASTER_ADDR is not set: "
            "export it (mpirun: -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=29500) "
            "or pass --init-method file:///shared/dir/rendezvous"
        )
    return info


def uses_torchrun_store(info: ProcessInfo, env: Mapping[str, str] | None = None) -> bool:
    """True when torchrun's agent already serves the rendezvous store (join it with env://)."""
    env = os.environ if env is None else env
    return info.launcher is Launcher.TORCHRUN and "TORCHELASTIC_RUN_ID" in env


def torchrun_agent_store(env: Mapping[str, str] | None = None) -> bool:
    """True when torchrun's agent hosts the store that its workers join as clients."""
    env = os.environ if env is None else env
    return env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def socket_ifname(env: Mapping[str, str] | None = None) -> str | None:
    """The network interface chosen with GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME, if any."""
    env = os.environ if env is None else env
    return next((env[name] for name in IFNAME_VARIABLES if env.get(name)), None)


def export_socket_ifname(ifname: str) -> None:
    """Make gloo and NCCL use interface ``ifname`` (before the process group starts)."""
    for name in IFNAME_VARIABLES:
        os.environ[name] = ifname


def restart_count(env: Mapping[str, str] | None = None) -> int:
    """How many times torchrun has restarted this job (TORCHELASTIC_RESTART_COUNT), 0 otherwise."""
    env = os.environ if env is None else env
    return _int(env, "TORCHELASTIC_RESTART_COUNT", 0)


def hostname() -> str:
    """This machine's host name, as the other nodes know it."""
    return socket.gethostname()
