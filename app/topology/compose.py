"""The compose mini-cluster's view of a spec: every file it needs, rendered once on the host (by
``python -m app cluster up``, or by hand): the env file and the nodes file that compose reads, and the
launch files that every node reads from a read-only mount at /cluster. compose.yaml (the repository's
root) holds no defaults and no checks; the package ships that same file (``COMPOSE_FILE``).

    python -m app topology --nodes 3 --format compose-files --output-dir build/cluster/ddp-cluster
    python -m app topology --format compose-path            # where compose.yaml is
    python -m app topology --nodes 3 --format compose       # the env file alone (stdout)

Every node's host name is its container's name, as ``docker ps`` and the runner show it:
``<name>-head-1`` and ``<name>-worker-<i>`` (torchrun nodes, all alike: the head is only the first),
or ``<name>-mpi-worker-<i>`` and ``<name>-launcher-1`` (the mpi profile: sshd on each worker,
mpirun from the launcher). torchrun's c10d rendezvous lives on a container of its own,
``<name>-rendezvous-1`` (a TCP store, ``ddp-rendezvous``): no node's loss takes it down. c10d
numbers the nodes by sorting their addresses, so ``rank_order`` is the one statement of which node
holds which ranks.
"""

import dataclasses
import json
import os
import shlex
import stat
from pathlib import Path

from app import contract
from app.errors import UsageError
from app.runtime import envvars
from app.topology import prometheus, render
from app.topology.spec import ClusterSpec, Host

COMPOSE_FILE = contract.shipped(contract.COMPOSE_FILE)
"""The compose file of the mini-cluster: the repository's, or the installed package's copy of it."""
GPU_TEMPLATE = "gpu-"
"""The prefix of compose.yaml's node templates when the spec has --gpus-per-node > 0 (gpu-worker)."""
MAX_NODES = 16
"""The mini-cluster runs on one machine: each node is a container."""
HEAD = "head"
"""The service of the first torchrun node (rank 0's while it is in the job)."""
RENDEZVOUS = "rendezvous"
"""The service of the c10d rendezvous store (torchrun's --rdzv-endpoint): its loss alone ends the job."""
PROMETHEUS = "prometheus"
"""The monitor profile's Prometheus (no node of the job)."""
WORKER, MPI_WORKER, LAUNCHER = "worker", "mpi-worker", "launcher"
"""The other services: torchrun's workers, the mpi profile's sshd nodes and its mpirun launcher."""
STOP_GRACE_S = 10
"""Seconds a container has to stop before it is killed (compose's stop_grace_period, the runner's stops)."""
SHM_SIZE, GPU_SHM_SIZE = "1gb", "8gb"
"""Each node's /dev/shm: gloo and DataLoader workers; with GPUs, NCCL's shared-memory transport."""
OMP_THREADS = 1
"""OMP_NUM_THREADS of every rank: the containers share the machine's cores."""
NODE_FILES, NO_SCRIPT = "node", "job"
"""Folders of the rendered files: what every node reads at /cluster (read-only); /job without --script."""
MONITOR, MONITOR_CONFIG = "monitor", "prometheus.yml"
"""The monitor profile's Prometheus: the folder of its rendered configuration, and the file."""
SCRAPE_INTERVAL_S = 2
"""How often the monitor profile's Prometheus scrapes each node: a digits epoch lasts a few seconds."""
EVENTS, EVENTS_MOUNT, EVENTS_NAME = "events", contract.EVENTS_DIR, contract.EVENTS_NAME
"""The job's events (``app.events``): the folder beside the rendered files, where every container mounts it, and
the file's name in it."""
SSH = "ssh"
"""The folder of the nodes' /cluster where the mpi profile mounts this cluster's SSH keys (the compose volume ssh)."""


def events_file(folder: Path) -> Path:
    """The events file of the cluster rendered into ``folder``, on the host."""
    return Path(folder) / EVENTS / EVENTS_NAME


def check(spec: ClusterSpec) -> None:
    """Raise UsageError for what the mini-cluster cannot run."""
    if spec.nodes.nodes > MAX_NODES:
        raise UsageError(
            f"--nodes {spec.nodes.nodes}: the mini-cluster is for one machine; use at most {MAX_NODES} "
            "(each node is a container)"
        )
    if spec.nodes.hosts:
        raise UsageError("the compose cluster names its own nodes: give --nodes, not --hosts")
    if spec.job.launcher == "srun":
        raise UsageError("--launcher srun is Slurm's: the compose cluster runs torchrun or mpirun")


def container(spec: ClusterSpec, service: str, index: int = 1) -> str:
    """A node's container name, which is also its host name: ``ddp-cluster-worker-1``."""
    return f"{spec.job.name}-{service}-{index}"


def torchrun_hosts(spec: ClusterSpec) -> tuple[Host, ...]:
    """The torchrun nodes: the head, then the workers."""
    n, p = spec.nodes.nodes, spec.nodes.nproc_per_node
    return tuple(Host(container(spec, HEAD if i == 0 else WORKER, i or 1), p) for i in range(n))


def mpi_hosts(spec: ClusterSpec) -> tuple[Host, ...]:
    """The mpi profile's nodes (sshd containers), in mpirun's rank order (the hostfile's)."""
    p = spec.nodes.nproc_per_node
    return tuple(Host(container(spec, MPI_WORKER, i), p) for i in range(1, 1 + spec.nodes.nodes))


def rank_order(spec: ClusterSpec) -> list[str]:
    """The torchrun nodes in the order c10d numbers them (it sorts their addresses, which are their names):
    node ``i`` of this list holds global ranks ``i * nproc_per_node`` onwards. The head's name sorts first."""
    order = sorted(h.name for h in torchrun_hosts(spec))
    assert order[0] == container(spec, HEAD), order  # 'head' < 'worker': rank 0 is on the head
    return order


def node_ranks(spec: ClusterSpec, name: str) -> list[int]:
    """The global ranks of the node (container) ``name``; [] for a container that is no torchrun node."""
    order, p = rank_order(spec), spec.nodes.nproc_per_node
    if name not in order:
        return []
    node = order.index(name)
    return list(range(node * p, node * p + p))


def node_services(spec: ClusterSpec) -> list[str]:
    """The services of the job's nodes, one container each: the torchrun nodes (head first), or mpirun's workers."""
    workers = worker_services(spec)
    return workers if spec.job.launcher == "mpirun" else [HEAD, *workers]


def worker_services(spec: ClusterSpec, launcher: str | None = None) -> list[str]:
    """The services of the nodes other than rank 0's (the job's launcher, or ``launcher``): one per container."""
    if (launcher or spec.job.launcher) == "mpirun":
        return [f"{MPI_WORKER}-{i}" for i in range(1, 1 + spec.nodes.nodes)]
    return [f"{WORKER}-{i}" for i in range(1, spec.nodes.nodes)]


def script_dir(spec: ClusterSpec) -> Path | None:
    """The folder of the user's script, checked: it is mounted read-only for an unprivileged user."""
    if not spec.job.script:
        return None
    script = Path(spec.job.script)
    if not script.is_file():
        raise UsageError(f"--script {script}: no such file")
    if not script.stat().st_mode & stat.S_IROTH:
        raise UsageError(
            f"--script {script} must be world-readable: the containers run as an unprivileged user (chmod o+r)"
        )
    return script.resolve().parent


def job_line(spec: ClusterSpec) -> str:
    """The job as the node's command line shows it (after torchrun, or the mpirun launcher's)."""
    by_launcher = render.python_argv if spec.job.launcher == "mpirun" else render.job_argv
    argv = by_launcher(spec, contract.JOB_DIR)
    return shlex.join(argv)


def _quoted(value: str) -> str:
    """A value for compose's env file, taken literally (single quotes) unless it holds one."""
    if "'" not in value:
        return f"'{value}'"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$")
    return f'"{escaped}"'


@dataclasses.dataclass(frozen=True)
class Monitor:
    """The monitor profile's Prometheus (``make cluster-up MONITOR=1``): its image and its UI's port on the host's
    loopback."""

    image: str = dataclasses.field(default_factory=lambda: contract.versions()["MONITOR_IMAGE"])
    port: int = contract.MONITOR_PORT


def env_file(spec: ClusterSpec, folder: Path, monitor: Monitor | None = None) -> str:
    """The variables compose.yaml reads (docker compose --env-file), for the files rendered into ``folder``."""
    check(spec)
    folder, monitor = Path(folder).resolve(), monitor or Monitor()
    values = {
        "COMPOSE_PROJECT_NAME": spec.job.name,
        "IMAGE": spec.job.image,
        # docker's own restarts of a crashed worker, bounded like torchrun's (on-failure alone never stops:
        # a worker whose head is gone for good would come back for ever).
        "WORKER_RESTART": f"on-failure:{spec.rendezvous.max_restarts}" if spec.rendezvous.max_restarts else "no",
        "GPUS_PER_NODE": spec.nodes.gpus_per_node,
        "SHM_SIZE": GPU_SHM_SIZE if spec.nodes.gpus_per_node else SHM_SIZE,
        "OMP_NUM_THREADS": OMP_THREADS,
        "STOP_GRACE": f"{STOP_GRACE_S}s",
        "SCRIPT_DIR": os.fspath(script_dir(spec) or folder / NO_SCRIPT),
        "NODE_FILES": os.fspath(folder / NODE_FILES),
        "EVENTS_DIR": os.fspath(folder / EVENTS),
        "EVENTS_FILE": f"{EVENTS_MOUNT}/{EVENTS_NAME}",
        # where each node sees them (app/contract.py: the paths every engine shares)
        "CLUSTER_MOUNT": contract.CLUSTER_DIR,
        "SSH_MOUNT": f"{contract.CLUSTER_DIR}/{SSH}",
        "RESULTS_MOUNT": contract.RESULTS_DIR,
        "JOB_MOUNT": contract.JOB_DIR,
        "EVENTS_MOUNT": EVENTS_MOUNT,
        "MONITOR_IMAGE": monitor.image,
        "MONITOR_PORT": monitor.port,
        "MONITOR_FILES": os.fspath(folder / MONITOR),
    }
    return "".join(f"{key}={_quoted(str(value))}\n" for key, value in values.items())


def nodes_file(spec: ClusterSpec) -> str:
    """The nodes of this spec as compose services (JSON, which compose reads as YAML): each one's host and
    container name, and its command: torchrun's per-node flag and the job, the launcher's mpirun job, or the
    rendezvous store's port."""
    check(spec)
    prefix = GPU_TEMPLATE if spec.nodes.gpus_per_node else ""
    job = render.job_argv(spec, contract.JOB_DIR)

    def node(name: str, template: str = "", **settings) -> dict:
        replica = (
            {"extends": {"file": os.fspath(COMPOSE_FILE), "service": prefix + template}, "scale": 1} if template else {}
        )
        return {**replica, "hostname": name, "container_name": name, **settings}

    def torchrun_node(host: Host) -> dict:  # every torchrun node alike, the head included (it is only the first)
        return node(host.name, WORKER, command=[f"--local-addr={host.name}", *job])  # its c10d address: rank_order

    mpi = worker_services(spec, "mpirun")
    torchrun = zip([HEAD, *worker_services(spec, "torchrun")], torchrun_hosts(spec), strict=True)
    port = str(spec.rendezvous.master_port)
    services = {
        RENDEZVOUS: node(container(spec, RENDEZVOUS), command=[port]),
        **{name: torchrun_node(h) for name, h in torchrun},
        **{name: node(h.name, MPI_WORKER) for name, h in zip(mpi, mpi_hosts(spec), strict=True)},
        LAUNCHER: node(
            container(spec, LAUNCHER),
            command=render.python_argv(spec, contract.JOB_DIR),
            depends_on={name: {"condition": "service_healthy"} for name in mpi},
        ),
    }
    return json.dumps({"services": services}, indent=2) + "\n"


def node_files(spec: ClusterSpec) -> dict[str, str]:
    """What every node reads from its read-only /cluster mount, by file name (ssh/: the mpi profile's keys)."""
    check(spec)
    nodes, mpi = torchrun_hosts(spec), mpi_hosts(spec)
    store = dataclasses.replace(spec.rendezvous, master_addr=container(spec, RENDEZVOUS))  # every node a client
    torchrun = dataclasses.replace(spec, rendezvous=store)
    return {
        "torchrun.args": " ".join(render.torchrun_args(torchrun, nodes)) + "\n",
        contract.NODE_ARGS: " ".join(render.node_args(spec)) + "\n",
        "cluster.env": render.render_env(torchrun, nodes),
        "hostfile": render.render_hostfile(mpi),
        "mpirun.args": " ".join([*render.mpirun_args(spec, mpi, f"{contract.CLUSTER_DIR}/hostfile"), *_events_to(mpi)])
        + "\n",
        f"{SSH}/README": "The mpi profile mounts this cluster's SSH keys here (the compose volume ssh).\n",
    }


def _events_to(hosts: tuple) -> list[str]:
    """mpirun's ``-x`` of the events file (``app.events``) for the mpi profile's ranks (compose gives it to the
    torchrun nodes; mpirun's ranks see only what it exports)."""
    return ["-x", f"{envvars.EVENTS_FILE}={EVENTS_MOUNT}/{EVENTS_NAME}"] if hosts else []


def prometheus_config(spec: ClusterSpec) -> str:
    """The monitor profile's prometheus.yml: the job's scrape entry (``prometheus.scrape_entry``) over every torchrun
    node; mpirun's nodes run no agent and serve none."""
    nodes = () if spec.job.launcher == "mpirun" else tuple(sorted(torchrun_hosts(spec), key=lambda h: h.name))
    interval = f"{SCRAPE_INTERVAL_S}s"
    config = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [prometheus.scrape_entry(spec, nodes)],
    }
    return json.dumps(config, indent=2) + "\n"


def cluster_files(spec: ClusterSpec, folder: Path, monitor: Monitor | None = None) -> dict[str, str]:
    """Every file of the compose cluster, by its path under ``folder`` (where they are to be written)."""
    return {
        "compose.env": env_file(spec, folder, monitor),
        f"{MONITOR}/{MONITOR_CONFIG}": prometheus_config(spec),
        "nodes.yaml": nodes_file(spec),
        **{f"{NODE_FILES}/{name}": text for name, text in node_files(spec).items()},
        f"{NO_SCRIPT}/README": f"No --script was given: this folder is mounted at {contract.JOB_DIR} in place of a "
        "script's folder.\n",
        f"{EVENTS}/README": f"The job's events ({EVENTS_NAME}, app/events.py), at {EVENTS_MOUNT} in every node.\n",
    }


def compose_args(spec: ClusterSpec, folder: Path) -> list[str]:
    """``docker compose``'s project flags for the files rendered into ``folder``."""
    files = [COMPOSE_FILE, Path(folder) / "nodes.yaml"]
    env = ["--env-file", os.fspath(Path(folder) / "compose.env")]  # (the project's folder is compose.yaml's)
    return ["-p", spec.job.name, *env, *(arg for f in files for arg in ("-f", os.fspath(f)))]
