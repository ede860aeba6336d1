"""Render a cluster's hostfile, env file and launcher arguments: one implementation for compose,
the Makefile and Ansible. Needs no torch.

    python -m app topology --hosts node0:2,node1:2 --format hostfile
    python -m app topology --hosts node0:2,node1:2 --master-port 29500 --ifname eth0 --format env
    python -m app topology --hostfile hosts.txt --format torchrun --node-rank 1
    python -m app topology --hostfile hosts.txt --format mpirun --output mpirun.args

Hosts come from ``--hosts NAME:SLOTS,...`` (like ``mpirun -H``) or an OpenMPI hostfile (``NAME
slots=N`` per line, ``#`` comments). MASTER_ADDR is the first host unless ``--master-addr`` says
otherwise. ``--format torchrun`` gives a static rendezvous with ``--node-rank``, else a c10d one.
"""

import argparse
import json
import re
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from app.atomic import atomic_write_text
from app.errors import UsageError
from app.platform import envvars

FORMATS = ("hostfile", "env", "torchrun", "mpirun", "json")
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-_]*[A-Za-z0-9])?$|^[0-9a-fA-F:]+$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:\-^,]+$")


@dataclass(frozen=True)
class Host:
    """One machine and the number of processes it runs."""

    name: str
    """Host name or address that every other host can reach."""
    slots: int
    """Processes on this host (GPUs on a GPU node)."""

    def __post_init__(self) -> None:
        if not _HOSTNAME.match(self.name):
            raise UsageError(f"host name {self.name!r} is not a valid host name or address")
        if self.slots < 1:
            raise UsageError(f"host {self.name} has slots={self.slots}: give it at least 1 slot")


@dataclass(frozen=True)
class Topology:
    """Hosts plus the rendezvous that joins them."""

    hosts: tuple[Host, ...]
    """The hosts, node rank order (the first one serves the rendezvous by default)."""
    master_port: int = envvars.DEFAULT_MASTER_PORT
    """Rendezvous port on the master host."""
    master_addr: str | None = None
    """Rendezvous host; None means the first host."""
    ifname: str | None = None
    """Network interface for gloo and NCCL traffic (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)."""
    rdzv_id: str = "ddp-cluster"
    """Job id of the c10d rendezvous."""

    def __post_init__(self) -> None:
        if not self.hosts:
            raise UsageError("no hosts given: use --hosts node0:2,node1:2 or --hostfile FILE")
        names = [h.name for h in self.hosts]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise UsageError(f"host {duplicates[0]} is listed twice: list each host once with its total slots")
        envvars.check_port(self.master_port, "--master-port")
        if self.ifname is not None and not _IFNAME.match(self.ifname):
            raise UsageError(f"--ifname {self.ifname!r} is not an interface name like eth0")

    @property
    def master(self) -> str:
        """The host that serves the rendezvous."""
        return self.master_addr or self.hosts[0].name

    @property
    def world_size(self) -> int:
        """Processes in the whole job."""
        return sum(h.slots for h in self.hosts)

    @property
    def nproc_per_node(self) -> int:
        """Processes per node; torchrun needs the same number on every node."""
        counts = {h.slots for h in self.hosts}
        if len(counts) != 1:
            raise UsageError(
                f"torchrun needs the same slots on every host, got {sorted(counts)}: "
                "use mpirun for uneven hosts or equalise the slots"
            )
        return counts.pop()


def parse_hosts(spec: str) -> tuple[Host, ...]:
    """Parse ``node0:2,node1:2`` (a host without ``:N`` has one slot)."""
    hosts = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, slots = item.rpartition(":") if item.count(":") == 1 else (item, "", "1")
        if sep and not slots.isdigit():
            raise UsageError(f"--hosts item {item!r} must look like node0:2 (NAME:SLOTS)")
        hosts.append(Host(name if sep else item, int(slots)))
    return tuple(hosts)


def parse_hostfile(text: str, source: str = "hostfile") -> tuple[Host, ...]:
    """Parse an OpenMPI hostfile: ``NAME [slots=N]`` per line, ``#`` starts a comment."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *options = line.split()
        slots = 1
        for option in options:
            key, _, value = option.partition("=")
            if key in ("slots", "max_slots", "max-slots") and value.isdigit():
                slots = int(value) if key == "slots" else slots
            else:
                raise UsageError(f"{source} line {number}: {raw.strip()!r} must look like 'node0 slots=2'")
        hosts.append(Host(name, slots))
    return tuple(hosts)


def render_hostfile(topo: Topology) -> str:
    """OpenMPI hostfile: one ``host slots=N`` line per host."""
    return "".join(f"{h.name} slots={h.slots}\n" for h in topo.hosts)


def env_vars(topo: Topology) -> dict[str, str]:
    """The variables every process of the job needs, in the order they are written."""
    values = {
        "MASTER_ADDR": topo.master,
        "MASTER_PORT": str(topo.master_port),
        "NNODES": str(len(topo.hosts)),
        "WORLD_SIZE": str(topo.world_size),
    }
    slots = {h.slots for h in topo.hosts}
    if len(slots) == 1:
        values["NPROC_PER_NODE"] = str(slots.pop())
    if topo.ifname:
        values |= {"GLOO_SOCKET_IFNAME": topo.ifname, "NCCL_SOCKET_IFNAME": topo.ifname}
    return values


def render_env(topo: Topology) -> str:
    """KEY=VALUE lines for docker --env-file, compose env_file and shell ``source``."""
    return "".join(f"{key}={value}\n" for key, value in env_vars(topo).items())


def torchrun_args(topo: Topology, node_rank: int | None = None) -> list[str]:
    """torchrun's arguments: static rendezvous when node_rank is known, else c10d."""
    args = [f"--nnodes={len(topo.hosts)}", f"--nproc-per-node={topo.nproc_per_node}"]
    if node_rank is None:
        return [
            *args,
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={topo.master}:{topo.master_port}",
            f"--rdzv-id={topo.rdzv_id}",
        ]
    if not 0 <= node_rank < len(topo.hosts):
        raise UsageError(f"--node-rank {node_rank} must be in [0, {len(topo.hosts)}) for {len(topo.hosts)} hosts")
    return [*args, f"--node-rank={node_rank}", f"--master-addr={topo.master}", f"--master-port={topo.master_port}"]


def mpirun_args(topo: Topology, hostfile: str = "hostfile") -> list[str]:
    """mpirun's arguments: the hostfile, the process count and the variables every rank needs."""
    args = ["-np", str(topo.world_size), "--hostfile", hostfile]
    # OpenMPI gives each rank its rank and size; an exported WORLD_SIZE would read as a partial
    # torchrun environment (WORLD_SIZE without RANK), so only the rendezvous and interface travel.
    for key, value in env_vars(topo).items():
        if key not in ("WORLD_SIZE", "NNODES", "NPROC_PER_NODE"):
            args += ["-x", f"{key}={value}"]
    if topo.ifname:
        args += ["--mca", "btl_tcp_if_include", topo.ifname, "--mca", "oob_tcp_if_include", topo.ifname]
    return args


def render(topo: Topology, fmt: str, node_rank: int | None = None, hostfile: str = "hostfile") -> str:
    """The text of one format."""
    if fmt == "hostfile":
        return render_hostfile(topo)
    if fmt == "env":
        return render_env(topo)
    if fmt == "torchrun":
        return shlex.join(torchrun_args(topo, node_rank)) + "\n"
    if fmt == "mpirun":
        return shlex.join(mpirun_args(topo, hostfile)) + "\n"
    if fmt == "json":
        return (
            json.dumps(
                {**asdict(topo), "master": topo.master, "world_size": topo.world_size, "env": env_vars(topo)}, indent=2
            )
            + "\n"
        )
    raise UsageError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app topology``."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--hosts", help="NAME:SLOTS,... e.g. node0:2,node1:2")
    source.add_argument("--hostfile", type=Path, help="OpenMPI hostfile: 'NAME slots=N' per line")
    parser.add_argument("--master-addr", default=None, help="rendezvous host (default: the first host)")
    parser.add_argument(
        "--master-port", type=int, default=envvars.DEFAULT_MASTER_PORT, help="rendezvous port (default 29500)"
    )
    parser.add_argument("--ifname", default=None, help="network interface for gloo/NCCL, e.g. eth0")
    parser.add_argument("--format", choices=FORMATS, default="env", help="what to render (default: env)")
    parser.add_argument("--node-rank", type=int, default=None, help="torchrun: this node's rank (static rendezvous)")
    parser.add_argument("--mpirun-hostfile", default="hostfile", help="mpirun: hostfile path to refer to")
    parser.add_argument("--output", type=Path, default=None, help="write here atomically instead of stdout")


def topology_from_args(args: argparse.Namespace) -> Topology:
    """The Topology that the command's flags describe."""
    if args.hostfile is not None:
        try:
            hosts = parse_hostfile(args.hostfile.read_text(), str(args.hostfile))
        except OSError as error:
            raise UsageError(f"cannot read --hostfile {args.hostfile}: {error.strerror}") from None
    else:
        hosts = parse_hosts(args.hosts)
    return Topology(hosts, args.master_port, args.master_addr, args.ifname)


def run(args: argparse.Namespace) -> int:
    """Render the requested format to stdout or --output."""
    text = render(topology_from_args(args), args.format, args.node_rank, args.mpirun_hostfile)
    if args.output is None:
        sys.stdout.write(text)
    else:
        atomic_write_text(args.output, text)
    return 0
