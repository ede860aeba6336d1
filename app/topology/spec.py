"""The cluster spec: the one place that defines a cluster's shape, its rendezvous and its job, with
their defaults and their validation. Every engine's launch files are rendered from it (``render``,
``python -m app topology``): compose, hostfiles, torchrun and mpirun arguments, Ansible, Slurm
batch scripts and Kubernetes manifests. Needs no torch.

    python -m app topology --format json                          # the defaults, as data
    python -m app topology --spec cluster.toml --nodes 4 --format compose
    python -m app topology --hosts node0:8,node1:8 --format hostfile

A spec file is TOML with one table per section (``[nodes]``, ``[rendezvous]``, ``[job]``,
``[slurm]``, ``[kubernetes]``) holding fields of the same names as below. Precedence: command-line
flags > the spec file > these defaults. Hosts given by name (``--hosts``/``--hostfile``, or
``hosts`` in the file) set ``nodes`` and ``nproc_per_node`` unless those are given too.
"""

import re
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from app import batch, contract, evict
from app.errors import UsageError
from app.flags import flag
from app.runtime import envvars

_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-_]*[A-Za-z0-9])?$|^[0-9a-fA-F:]+$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:\-^,]+$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_PATTERN = re.compile(r"^[^\s'\"\\]+$")
LAUNCHERS = ("torchrun", "mpirun", "srun")
ENGINES = {
    "compose": "the compose mini-cluster (make cluster-*)",
    "ansible": "Ansible-provisioned nodes (ansible/deploy.yml)",
    "slurm": "Slurm batch jobs (--format sbatch, make slurm-*)",
    "kubernetes": "Kubernetes manifests (--format k8s, pytorchjob, trainjob, trainingruntime)",
    "files": "hostfile, env file, torchrun and mpirun arguments (--format hostfile|env|torchrun|mpirun)",
}
"""Where a spec is used, by the names its fields' ``used_by`` metadata gives."""


NODE_AGENTS = ("compose", "ansible", "slurm", "kubernetes")
"""The engines whose nodes run ``app node`` (its gate and agent) with the flags the spec renders (render.node_args)."""


def used_by(*engines: str) -> dict:
    """Field metadata: the engines that use this field (``all``: every one)."""
    unknown = set(engines) - {"all", *ENGINES}
    assert not unknown, f"unknown engines {unknown}"
    return {"engines": tuple(ENGINES) if engines == ("all",) else engines}


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

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def parse_hosts(spec: str) -> tuple[Host, ...]:
    """Parse ``node0:2,node1:2`` (a host without ``:N`` has one slot)."""
    hosts = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, slots = item.rpartition(":") if item.count(":") == 1 else (item, "", "1")
        if sep and not slots.isdigit():
            raise UsageError(f"--hosts item {item!r} must look like node0:2 (NAME:SLOTS)")
        hosts.append(Host(name if sep else item, int(slots)))
    return tuple(hosts)


def parse_hostfile(text: str, source: str = "hostfile", note: Callable[[str], None] | None = None) -> tuple[Host, ...]:
    """Parse an OpenMPI hostfile: ``NAME [slots=N]`` per line, ``#`` starts a comment. A line without
    ``slots=`` means one slot, as in ``--hosts`` (OpenMPI itself counts the node's cores): ``note`` is
    told so, once per such line."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, *options = line.split()
        slots = None
        for option in options:
            key, _, value = option.partition("=")
            if key in ("slots", "max_slots", "max-slots") and value.isdigit():
                slots = int(value) if key == "slots" else slots
            else:
                raise UsageError(f"{source} line {number}: {raw.strip()!r} must look like 'node0 slots=2'")
        if slots is None and note is not None:
            note(f"{source} line {number}: {name} has no slots=N: 1 slot (OpenMPI would count its cores)")
        hosts.append(Host(name, 1 if slots is None else slots))
    if not hosts:
        raise UsageError(f"{source} names no host (empty, or only comments): write one 'NAME slots=N' line per node")
    return tuple(hosts)


def _positive(flag_name: str, value: int) -> None:
    if value < 1:
        raise UsageError(f"{flag_name} {value} must be >= 1")


@dataclass(frozen=True)
class Nodes:
    """The cluster's shape: its nodes and the processes on each."""

    nodes: int = field(default=2, metadata=used_by("all"))
    """Nodes in the job: containers (compose), machines (Ansible, Slurm -N) or pods (Kubernetes)."""
    min_nodes: int | None = field(default=None, metadata=flag(show="--nodes") | used_by("all"))
    """Fewest nodes the job goes on with (torchrun --nnodes MIN:MAX): a node lost past its restarts or kept out
    by its health gate leaves the others training at the same global batch; default: --nodes (all or none)."""
    nproc_per_node: int = field(default=2, metadata=used_by("all"))
    """Processes per node, one per GPU on GPU nodes."""
    gpus_per_node: int = field(default=0, metadata=used_by("compose", "slurm", "kubernetes"))
    """GPUs of each node that the job uses (0: CPU nodes and gloo; else NCCL, one process per GPU)."""
    hosts: tuple[Host, ...] = field(
        default=(),
        metadata=flag(parse=parse_hosts, show="named by the engine", metavar="NAME:SLOTS,...")
        | used_by("ansible", "files"),
    )
    """The nodes by name and slots, in node rank order (Ansible, hostfiles); empty: each engine names them."""
    evict_factor: float = field(default=evict.FACTOR, metadata=used_by("compose", "slurm", "kubernetes"))
    """A straggler's eviction: a node whose ranks are busy per step this many times what the other nodes' would be
    without it (their median rank's, grown by their share of its work: 1.5 of 3 nodes), the median of the last
    2 x --evict-after - 1 exchanges of step times, or busy and waiting for a CPU that many times while the job's
    step is longer than the others alone would take (its best x their share), leaves the running job (while it has
    more than --min-nodes nodes), which goes on at the same global batch; its gate takes it back once it passes.
    0: never."""
    evict_after: int = field(default=evict.AFTER, metadata=used_by("compose", "slurm", "kubernetes"))
    """Exchanges of step times (every --exchange-every steps of app train) at which a node must be that slow, of
    the last 2 x this - 1 (so that their median is), before its eviction."""
    gate_seconds: float = field(default=contract.GATE_SECONDS, metadata=used_by(*NODE_AGENTS))
    """Seconds each node's health gate measures each of its devices, at the node's first start and at every
    return (app gate --device-seconds): longer reads steadier, shorter lets a node in sooner."""
    gate_fail_below: float = field(default=contract.GATE_FAIL_BELOW, metadata=used_by(*NODE_AGENTS))
    """The health gate keeps a node out when a device figure is below this fraction of the job's figures at its
    start (app gate --fail-below): lower admits slower nodes."""

    @property
    def eviction(self) -> evict.Policy | None:
        """The job's straggler policy (None: --evict-factor 0), which every node's agent is given (render.node_args)."""
        return evict.Policy.of(self.evict_factor, self.evict_after, self.min_nodes)

    def __post_init__(self) -> None:
        _positive("--nodes", self.nodes)
        _positive("--nproc-per-node", self.nproc_per_node)
        if self.min_nodes is None:
            object.__setattr__(self, "min_nodes", self.nodes)
        elif not 1 <= self.min_nodes <= self.nodes:
            raise UsageError(
                f"--min-nodes {self.min_nodes} must be between 1 and --nodes {self.nodes}: the fewest nodes the "
                f"job goes on with (--min-nodes {self.nodes}: all or none)"
            )
        _ = self.eviction  # its values checked where the policy is built
        if not self.gate_seconds > 0:
            raise UsageError(f"--gate-seconds {self.gate_seconds:g} must be a positive number of seconds, e.g. 1")
        contract.check_gate_fail_below(self.gate_fail_below, "--gate-fail-below")
        if self.gpus_per_node < 0:
            raise UsageError(f"--gpus-per-node {self.gpus_per_node} must be >= 0 (0: CPU nodes)")
        if self.gpus_per_node and self.nproc_per_node > self.gpus_per_node:
            raise UsageError(
                f"--nproc-per-node {self.nproc_per_node} exceeds --gpus-per-node {self.gpus_per_node}: "
                "NCCL runs one process per GPU; lower --nproc-per-node"
            )
        names = [h.name for h in self.hosts]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise UsageError(f"host {twice[0]} is listed twice: list each host once with its total slots")
        if self.hosts and len(self.hosts) != self.nodes:
            raise UsageError(
                f"--nodes {self.nodes} but {len(self.hosts)} host(s) are named ({', '.join(names)}): "
                "give the hosts alone, their number follows"
            )
        if self.hosts and not self.uneven and self.hosts[0].slots != self.nproc_per_node:
            raise UsageError(
                f"--nproc-per-node {self.nproc_per_node} but the hosts have {self.hosts[0].slots} slots each: "
                "give the hosts alone, their slots follow"
            )

    @property
    def elastic(self) -> bool:
        """True when the job may go on with fewer nodes than it started with."""
        return (self.min_nodes or self.nodes) < self.nodes

    @property
    def nnodes(self) -> str:
        """torchrun's --nnodes: ``2``, or ``MIN:MAX`` for an elastic job."""
        return f"{self.min_nodes}:{self.nodes}" if self.elastic else str(self.nodes)

    @property
    def uneven(self) -> bool:
        """True when named hosts have different slots (mpirun can run them; torchrun cannot)."""
        return len({h.slots for h in self.hosts}) > 1


@dataclass(frozen=True)
class Rendezvous:
    """Where and how the nodes meet."""

    master_addr: str | None = field(default=None, metadata=used_by("files", "ansible"))
    """Host that serves the rendezvous (default: the first node)."""
    master_port: int = field(default=contract.RENDEZVOUS_PORT, metadata=used_by("all"))
    """Rendezvous port on the master; only the cluster's hosts need to reach it (Slurm: left at this default,
    each job takes 20000 + its job id % 10000, so jobs that share a node never collide)."""
    ifname: str | None = field(default=None, metadata=used_by("all"))
    """Network interface for gloo and NCCL (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME); default: the one
    that routes to the master."""
    join_timeout: int = field(default=120, metadata=used_by("compose", "slurm", "kubernetes"))
    """Seconds a node waits at the rendezvous for the others before the job fails."""
    keep_alive: int = field(default=1, metadata=used_by("compose", "slurm", "kubernetes"))
    """Seconds between each node's heartbeats in the c10d rendezvous; a node silent for 10 of them (lost) leaves the
    round, so the others form the next one without waiting for it (torch's own defaults take 15 s)."""
    max_restarts: int = field(default=3, metadata=used_by("compose", "slurm", "kubernetes"))
    """Times torchrun restarts every worker after one fails (each restart is a new rendezvous round;
    the job resumes from its last checkpoint); 0: fail at once."""

    def __post_init__(self) -> None:
        if self.master_addr is not None and not _HOSTNAME.match(self.master_addr):
            raise UsageError(f"--master-addr {self.master_addr!r} is not a valid host name or address")
        envvars.check_port(self.master_port, "--master-port")
        if self.ifname is not None and not _IFNAME.match(self.ifname):
            raise UsageError(f"--ifname {self.ifname!r} is not an interface name like eth0")
        _positive("--join-timeout", self.join_timeout)
        _positive("--keep-alive", self.keep_alive)
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts {self.max_restarts} must be >= 0 (0: no restarts)")


@dataclass(frozen=True)
class Job:
    """What runs on every node."""

    name: str = field(default="ddp-cluster", metadata=used_by("compose", "ansible", "slurm", "kubernetes"))
    """The job's name: compose project, Slurm job name, Kubernetes object names, Ansible's containers
    and results folder, and rendezvous id (lowercase letters, digits and -, at most 40)."""
    command: str = field(
        default=f"train --dataset digits --out {contract.RESULTS_DIR}/digits --resume auto", metadata=used_by("all")
    )
    """The app command every rank runs (python -m app COMMAND)."""
    script: str | None = field(default=None, metadata=used_by("compose", "slurm", "kubernetes"))
    """A user's torchrun script to run unchanged instead of the app command (compose mounts its folder at
    /job; --format trainjob ships the file in a ConfigMap mounted there)."""
    args: str = field(default="", metadata=used_by("compose", "slurm", "kubernetes"))
    """Arguments of --script."""
    launcher: str = field(default="torchrun", metadata=used_by("compose", "ansible", "slurm"))
    """torchrun (one agent per node), mpirun (OpenMPI over SSH from the first node) or srun (Slurm,
    one task per rank)."""
    image: str | None = field(
        default=None,
        metadata=flag(show=f"IMAGE_NAME:{contract.CUDA} with --gpus-per-node > 0, else IMAGE_NAME:{contract.CPU}")
        | used_by("compose", "ansible", "kubernetes"),
    )
    """The workload image (compose, Ansible, Kubernetes); default: the flavour the nodes need, cuda on GPU nodes
    (IMAGE_NAME of docker/versions.env)."""
    time_limit: int = field(default=1200, metadata=used_by("compose", "ansible", "slurm", "kubernetes"))
    """Seconds the job may run before it is stopped (compose, Ansible, Slurm --time, Kubernetes
    activeDeadlineSeconds)."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise UsageError(
                f"--name {self.name!r} must be lowercase letters, digits and '-', at most 40, "
                "starting and ending with a letter or digit (it names containers, jobs and pods)"
            )
        if self.launcher not in LAUNCHERS:
            raise UsageError(f"--launcher {self.launcher!r} is not one of {', '.join(LAUNCHERS)}")
        if not self.script and not self.command.strip():
            raise UsageError("--command is empty: give an app command such as 'check', or --script")
        if self.args and not self.script:
            raise UsageError("--args are the arguments of --script: give --script too, or put them in --command")
        _positive("--time-limit", self.time_limit)
        if self.image is not None and not _PATTERN.match(self.image):
            raise UsageError(
                f"--image {self.image!r} must be an image reference without spaces or quotes, like "
                f"{contract.image(0)} or registry.example.org:5000/ml/{contract.image(8)}"
            )


@dataclass(frozen=True)
class Slurm:
    """Slurm batch jobs (``--format sbatch``)."""

    partition: str | None = field(default=None, metadata=used_by("slurm"))
    """Partition to submit to (default: the cluster's default partition)."""
    account: str | None = field(default=None, metadata=used_by("slurm"))
    """Account the job is charged to (sbatch --account; default: the user's default account)."""
    requeue: bool = field(default=True, metadata=used_by("slurm"))
    """Requeue the job when it is preempted or a node fails; it resumes from its last checkpoint."""
    exclusive: bool = field(default=False, metadata=used_by("slurm"))
    """Take the job's nodes whole (sbatch --exclusive), sharing them with no other job."""
    cpus_per_rank: int = field(default=1, metadata=used_by("slurm"))
    """CPUs each rank gets (--cpus-per-task; a torchrun agent gets its node's share) and its OMP_NUM_THREADS."""
    python: str = field(default="python3", metadata=used_by("slurm"))
    """The Python on the nodes that has torch and this app, e.g. /shared/venv/bin/python (it runs torchrun too)."""
    mpi: str = field(default="pmi2", metadata=used_by("slurm"))
    """srun's MPI plugin for --launcher srun (srun --mpi=list shows a cluster's; none: plain tasks)."""
    output_pattern: str = field(default="%x-%j.out", metadata=used_by("slurm"))
    """File of the job's output (sbatch --output: %x is the job name, %j its id)."""
    error_pattern: str | None = field(default=None, metadata=used_by("slurm"))
    """File of the job's error output (sbatch --error; default: with its output)."""

    def __post_init__(self) -> None:
        for flag_name, value in (("--partition", self.partition), ("--account", self.account)):
            if value is not None and not _SLURM_NAME.match(value):
                raise UsageError(
                    f"{flag_name} {value!r} is not a Slurm name: use letters, digits, '_', '.' and '-' "
                    "(sinfo and sacctmgr list them)"
                )
        for flag_name, value in (("--output-pattern", self.output_pattern), ("--error-pattern", self.error_pattern)):
            if value is not None and not _PATTERN.match(value):
                raise UsageError(
                    f"{flag_name} {value!r} must be a file name pattern without spaces, like %x-%j.out "
                    "(%x: job name, %j: job id)"
                )
        _positive("--cpus-per-rank", self.cpus_per_rank)
        if not _PATTERN.match(self.python):
            raise UsageError(
                f"--python {self.python!r} must be one path to a Python on the nodes, without spaces, "
                "e.g. /shared/venv/bin/python"
            )
        if not _SLURM_NAME.match(self.mpi):
            raise UsageError(f"--mpi {self.mpi!r} must be an srun MPI plugin such as pmi2 or none (srun --mpi=list)")


_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_DNS_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_QUANTITY = re.compile(r"^(\d+(?:\.\d*)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")
_SCALE = {"n": "1e-9", "u": "1e-6", "m": "1e-3", "": "1", "k": "1e3", "M": "1e6", "G": "1e9", "T": "1e12", "P": "1e15"}
_SCALE |= {"E": "1e18"} | {f"{p}i": str(1024 ** (n + 1)) for n, p in enumerate("KMGTPE")}


def quantity(flag_name: str, text: str) -> Decimal:
    """The value of a Kubernetes quantity (``2``, ``500m``, ``4Gi``, ``1e3``), or a UsageError naming the flag."""
    match = _QUANTITY.match(text)
    if not match:
        raise UsageError(f"{flag_name} {text!r} is not a Kubernetes quantity like 2, 500m, 1.5 or 4Gi")
    number, suffix = Decimal(match.group(1)), match.group(2) or ""
    if suffix in _SCALE:
        return number * Decimal(_SCALE[suffix])
    return number.scaleb(int(suffix[1:]))  # 1e3, 5E-1


@dataclass(frozen=True)
class Kubernetes:
    """Kubernetes manifests (``--format k8s``, ``pytorchjob``, ``trainjob``, ``trainingruntime``)."""

    namespace: str = field(default="default", metadata=used_by("kubernetes"))
    """Namespace of every object."""
    results_claim: str = field(default="ddp-results", metadata=used_by("kubernetes"))
    """PersistentVolumeClaim mounted at /results (checkpoints, metrics, summaries); ReadWriteMany when
    the pods may land on several machines."""
    cluster_domain: str = field(default="cluster.local", metadata=used_by("kubernetes"))
    """The cluster's DNS domain (kubelet --cluster-domain): pod 0's full name in it is the c10d endpoint."""
    cpu_request: str = field(default="2", metadata=used_by("kubernetes"))
    """CPUs each pod requests (a quantity: 2, 500m); about one per process on CPU nodes."""
    cpu_limit: str = field(default="2", metadata=used_by("kubernetes"))
    """CPUs each pod may use (>= the request; equal to it, with memory equal too, the pods are Guaranteed)."""
    memory_request: str = field(default="4Gi", metadata=used_by("kubernetes"))
    """Memory each pod requests (a quantity: 4Gi, 512Mi)."""
    memory_limit: str = field(default="4Gi", metadata=used_by("kubernetes"))
    """Memory each pod may use before it is OOM-killed (>= the request; /dev/shm counts against it)."""
    shm_size: str = field(default="1Gi", metadata=used_by("kubernetes"))
    """Size of each pod's memory-backed /dev/shm (DataLoader workers, NCCL); at most the memory limit."""
    training_runtime: str = field(default="ddp-cluster-torch", metadata=used_by("kubernetes"))
    """The ClusterTrainingRuntime that a TrainJob runs on (Kubeflow Trainer v2): ours, from --format
    trainingruntime, or Kubeflow's torch-distributed."""
    prometheus_pods: str = field(default="app.kubernetes.io/name=prometheus", metadata=used_by("kubernetes"))
    """Labels (KEY=VALUE,...) of the Prometheus pods, in any namespace, that the NetworkPolicy admits to the nodes'
    metrics port (the Prometheus Operator's and the Helm chart's pods carry the default)."""

    def __post_init__(self) -> None:
        if not _DNS_LABEL.match(self.namespace):
            raise UsageError(
                f"--namespace {self.namespace!r} must be a DNS label: lowercase letters, digits and '-', at most 63"
            )
        names = {"--results-claim": self.results_claim, "--cluster-domain": self.cluster_domain}
        for flag_name, value in (names | {"--training-runtime": self.training_runtime}).items():
            if len(value) > 253 or not _DNS_NAME.match(value):
                raise UsageError(f"{flag_name} {value!r} must be a DNS name: lowercase letters, digits, '-' and '.'")
        self.prometheus_labels()
        cpu = self._pair("cpu", self.cpu_request, self.cpu_limit)
        memory = self._pair("memory", self.memory_request, self.memory_limit)
        if cpu[0] < Decimal("0.001"):
            raise UsageError(f"--cpu-request {self.cpu_request} is below 1m (0.001 CPU): give at least 1m")
        if memory[0] < 2**20:
            raise UsageError(f"--memory-request {self.memory_request} is under 1Mi (bytes): give a unit, e.g. 4Gi")
        if quantity("--shm-size", self.shm_size) > memory[1]:
            raise UsageError(
                f"--shm-size {self.shm_size} exceeds --memory-limit {self.memory_limit}: /dev/shm is memory "
                "and counts against the limit; lower --shm-size or raise --memory-limit"
            )

    def prometheus_labels(self) -> dict[str, str]:
        """``prometheus_pods`` as a label selector's matchLabels (a UsageError naming the flag if it is not one)."""
        pairs = [pair.partition("=") for pair in self.prometheus_pods.split(",")]
        if not all(_LABEL_KEY.match(key) and sep and _LABEL_VALUE.match(value) for key, sep, value in pairs):
            raise UsageError(
                f"--prometheus-pods {self.prometheus_pods!r} must be KEY=VALUE labels joined by commas, "
                "e.g. app.kubernetes.io/name=prometheus"
            )
        return {key: value for key, _, value in pairs}

    @staticmethod
    def _pair(resource: str, request: str, limit: str) -> tuple[Decimal, Decimal]:
        """A resource's request and limit, checked: the API server refuses a limit below the request."""
        low, high = quantity(f"--{resource}-request", request), quantity(f"--{resource}-limit", limit)
        if high < low:
            raise UsageError(
                f"--{resource}-limit {limit} is below --{resource}-request {request}: "
                f"raise --{resource}-limit or lower the request"
            )
        return low, high


SECTIONS = {"nodes": Nodes, "rendezvous": Rendezvous, "job": Job, "slurm": Slurm, "kubernetes": Kubernetes}
"""The spec's sections by their name in a spec file."""


@dataclass(frozen=True)
class ClusterSpec:
    """One cluster and its job, in every engine's terms."""

    nodes: Nodes = field(default_factory=Nodes)
    rendezvous: Rendezvous = field(default_factory=Rendezvous)
    job: Job = field(default_factory=Job)
    slurm: Slurm = field(default_factory=Slurm)
    kubernetes: Kubernetes = field(default_factory=Kubernetes)

    def __post_init__(self) -> None:
        if self.job.image is None:  # the nodes' flavour: every engine's rendering of a GPU spec names the cuda image
            object.__setattr__(self, "job", replace(self.job, image=contract.image(self.nodes.gpus_per_node)))
        if self.nodes.elastic and self.job.launcher != "torchrun":
            raise UsageError(
                f"--min-nodes {self.nodes.min_nodes} needs --launcher torchrun (its --nnodes MIN:MAX): "
                f"{self.job.launcher} starts a fixed world; drop --min-nodes or use torchrun"
            )
        if self.nodes.elastic and not self.job.script:  # every world the job may shrink to keeps its batch
            batch.check_shrink(self.job.command, self.nodes.nodes, self.nodes.min_nodes, self.nodes.nproc_per_node)
        if self.job.launcher == "torchrun" and self.nodes.uneven:
            slots = sorted({h.slots for h in self.nodes.hosts})
            raise UsageError(
                f"torchrun needs the same slots on every host, got {slots}: "
                "use --launcher mpirun for uneven hosts or equalise the slots"
            )

    @property
    def world_size(self) -> int:
        """Processes in the whole job."""
        if self.nodes.hosts:
            return sum(h.slots for h in self.nodes.hosts)
        return self.nodes.nodes * self.nodes.nproc_per_node

    def master(self, hosts: tuple[Host, ...]) -> str:
        """The host that serves the rendezvous: --master-addr, else the first of ``hosts``."""
        return self.rendezvous.master_addr or hosts[0].name

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """The spec as plain data, one table per section (hosts as NAME:SLOTS strings)."""
        data = asdict(self)
        data["nodes"]["hosts"] = ",".join(map(str, self.nodes.hosts))
        return data


def _unknown(where: str, given: set[str], known: list[str]) -> None:
    extra = sorted(given - set(known))
    if extra:
        raise UsageError(f"{where}: unknown key {extra[0]!r}: the keys are {', '.join(known)}")


def read_file(path: Path) -> dict[str, dict[str, Any]]:
    """A spec file's tables, checked for unknown sections and keys."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as error:
        raise UsageError(f"cannot read --spec {path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"--spec {path} is not valid TOML ({error}): see README.md, 'The cluster spec'") from None
    return check_tables(data, f"--spec {path}")


def check_tables(data: Any, where: str) -> dict[str, dict[str, Any]]:
    """``data`` when it is a spec's tables (known sections of known keys), else a UsageError naming ``where``."""
    if not isinstance(data, dict):
        raise UsageError(f'{where} must be tables of keys like {{"job": {{"command": "check"}}}}, got {data!r}')
    _unknown(where, set(data), list(SECTIONS))
    for name, table in data.items():
        if not isinstance(table, dict):
            raise UsageError(f"{where}: [{name}] must be a table of keys, got {table!r}")
        _unknown(f"{where} [{name}]", set(table), [f.name for f in fields(SECTIONS[name])])
    return data


def build(tables: dict[str, dict[str, Any]]) -> ClusterSpec:
    """The spec from per-section values (a spec file's and the flags' merged); missing values default.

    Hosts given by name set ``nodes`` and ``nproc_per_node`` (their count and their slots) unless
    those are given too, in which case they must agree.
    """
    values = {name: dict(tables.get(name, {})) for name in SECTIONS}
    shape = values["nodes"]
    if isinstance(shape.get("hosts"), list):  # a spec file's hosts = ["a:2", "b:2"]
        shape["hosts"] = ",".join(map(str, shape["hosts"]))
    if isinstance(shape.get("hosts"), str):
        shape["hosts"] = parse_hosts(shape["hosts"])
    hosts = shape.get("hosts") or ()
    if hosts:
        shape.setdefault("nodes", len(hosts))
        shape.setdefault("nproc_per_node", max(h.slots for h in hosts))
    for name, cls in SECTIONS.items():
        _check_types(name, cls, values[name])
    return ClusterSpec(**{name: cls(**values[name]) for name, cls in SECTIONS.items()})


_KINDS = {
    int: "a whole number",
    float: "a number",
    str: "a string",
    bool: "true or false",
    tuple: "a list of NAME:SLOTS",
}


def _check_types(section: str, cls: type, values: dict[str, Any]) -> None:
    """A one-line error for a spec value of the wrong kind (a spec file can hold anything)."""
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        kind = typing.get_origin(hints[key]) or hints[key]
        if kind in (typing.Union, types.UnionType):
            if value is None:
                continue
            kind = next(a for a in typing.get_args(hints[key]) if a is not type(None))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = values[key] = float(value)  # TOML's 3 for 3.0
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise UsageError(
                f"spec key {section}.{key} = {value!r} must be {_KINDS.get(kind, kind.__name__)} "
                f"(flag {'--' + key.replace('_', '-')})"
            )


def with_hosts(spec: ClusterSpec, hosts: tuple[Host, ...]) -> ClusterSpec:
    """``spec`` on these named hosts (their number and slots replace nodes and nproc_per_node)."""
    kept = spec.nodes.min_nodes if spec.nodes.elastic else None  # all or none stays all or none
    slots = max(h.slots for h in hosts)
    shape = replace(spec.nodes, nodes=len(hosts), min_nodes=kept, nproc_per_node=slots, hosts=hosts)
    return replace(spec, nodes=shape)
