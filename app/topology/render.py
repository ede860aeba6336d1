"""Launch files rendered from a cluster spec: hostfile, env file, torchrun and mpirun arguments, and
the command every rank runs. Used by the compose cluster, Ansible and ``python -m app topology``.

    python -m app topology --hosts node0:2,node1:2 --format hostfile   # node0 slots=2 ...
    python -m app topology --hosts node0:2,node1:2 --ifname eth0 --format env
    python -m app topology --hostfile hosts.txt --format torchrun --node-rank 1
    python -m app topology --hostfile hosts.txt --format mpirun
"""

import shlex

from app import contract
from app.errors import UsageError
from app.runtime import envvars
from app.topology.spec import ClusterSpec, Host

LAST_CALL_S = 2
"""Seconds an elastic rendezvous waits for more nodes once --min-nodes have joined (torch's default, 30,
would idle the survivors of a lost node that long at every restart)."""
KEEP_ALIVE_MISSED = 10
"""Heartbeats a node may miss before the rendezvous drops it (torch's keep_alive_max_attempt, whose default is 3): a
node's agent that a busy machine starves for a few seconds is not dropped from a round that is training (one that
is is taken back by a regroup, app/node/agent.py's DROPPED); a node that died is dropped within 10 s at the spec's
1 s heartbeat (torch's defaults: 15 s)."""


def env_vars(spec: ClusterSpec, hosts: tuple[Host, ...]) -> dict[str, str]:
    """The variables every process of the job needs, in the order they are written."""
    values = {
        envvars.MASTER_ADDR: spec.master(hosts),
        envvars.MASTER_PORT: str(spec.rendezvous.master_port),
        envvars.NNODES: str(len(hosts)),
        envvars.TORCHRUN.size: str(sum(h.slots for h in hosts)),
    }
    slots = {h.slots for h in hosts}
    if len(slots) == 1:
        values[envvars.NPROC_PER_NODE] = str(slots.pop())
    if spec.rendezvous.ifname:
        values |= dict.fromkeys(envvars.IFNAME_VARIABLES, spec.rendezvous.ifname)
    return values | envvars.FLIGHT_RECORDER


def render_env(spec: ClusterSpec, hosts: tuple[Host, ...]) -> str:
    """KEY=VALUE lines for docker --env-file, compose env_file and shell ``source``."""
    return "".join(f"{key}={value}\n" for key, value in env_vars(spec, hosts).items())


def render_hostfile(hosts: tuple[Host, ...]) -> str:
    """OpenMPI hostfile: one ``host slots=N`` line per host."""
    return "".join(f"{h.name} slots={h.slots}\n" for h in hosts)


def torchrun_args(spec: ClusterSpec, hosts: tuple[Host, ...], node_rank: int | None = None) -> list[str]:
    """torchrun's arguments: a static rendezvous when ``node_rank`` is known, else c10d on the master.

    c10d lets the agents restart their workers in a new rendezvous round (``max_restarts``); a
    static rendezvous fixes each node's rank (Ansible knows them from its inventory).
    """
    if len({h.slots for h in hosts}) != 1:
        raise UsageError(
            f"torchrun needs the same slots on every host, got {sorted({h.slots for h in hosts})}: "
            "use mpirun for uneven hosts or equalise the slots"
        )
    r = spec.rendezvous
    args = agent_args(spec, len(hosts), hosts[0].slots)
    if node_rank is None:
        return [*args, *c10d_args(spec, f"{spec.master(hosts)}:{r.master_port}", spec.job.name)]
    if spec.nodes.elastic:
        raise UsageError(
            f"--min-nodes {spec.nodes.min_nodes}: a static rendezvous (--node-rank) fixes every node's rank and "
            "cannot go on with fewer; leave --node-rank out (c10d) or drop --min-nodes"
        )
    if not 0 <= node_rank < len(hosts):
        raise UsageError(f"--node-rank {node_rank} must be in [0, {len(hosts)}) for {len(hosts)} hosts")
    static = [f"--node-rank={node_rank}", f"--master-addr={spec.master(hosts)}", f"--master-port={r.master_port}"]
    return [*args, *static, f"--rdzv-id={spec.job.name}"]  # the job's name: its metrics' job label


def agent_args(spec: ClusterSpec, nnodes: int | str, nproc_per_node: int) -> list[str]:
    """torchrun's shape: nodes (``MIN:MAX`` when the spec's min_nodes is below ``nnodes``), processes per
    node and how often the agents restart their workers."""
    restarts = spec.rendezvous.max_restarts
    low = spec.nodes.min_nodes or spec.nodes.nodes
    shape = f"{low}:{nnodes}" if isinstance(nnodes, int) and low < nnodes else nnodes
    return [f"--nnodes={shape}", f"--nproc-per-node={nproc_per_node}", f"--max-restarts={restarts}"]


def gate_args(spec: ClusterSpec) -> list[str]:
    """``python -m app node``'s gate flags that the spec sets, on every engine: its measuring time and its fraction,
    where they are not the gate's own defaults."""
    n = spec.nodes
    flags = [] if n.gate_seconds == contract.GATE_SECONDS else [f"--device-seconds={n.gate_seconds:g}"]
    return flags if n.gate_fail_below == contract.GATE_FAIL_BELOW else [*flags, f"--fail-below={n.gate_fail_below:g}"]


def node_args(spec: ClusterSpec) -> list[str]:
    """``python -m app node``'s own flags, on every engine (compose's and Ansible's node.args, Kubernetes' ConfigMap,
    Slurm's command): the gate's (``gate_args``) and its ``--retry-every`` (a node kept out at the start, or evicted,
    is judged again until it passes, and joins the job then); and the spec's straggler policy, which each node's
    agent applies to its own node where the job is elastic (``--min-nodes`` below ``--nodes``: a job of a fixed size
    cannot go on without a node)."""
    n = spec.nodes
    flags = [*gate_args(spec), f"--retry-every={contract.GATE_RETRY_S}"]
    if not (n.elastic and (policy := n.eviction)):
        return flags
    return [*flags, f"--evict-factor={policy.factor:g}", f"--evict-after={policy.after}"]


def c10d_args(spec: ClusterSpec, endpoint: str, run_id: str) -> list[str]:
    """torchrun's c10d rendezvous: the store at ``endpoint`` (host:port), one job's agents by ``run_id``."""
    return [
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}",
        "--rdzv-conf=" + ",".join(f"{key}={value}" for key, value in rdzv_conf(spec).items()),
    ]


def rdzv_conf(spec: ClusterSpec) -> dict[str, int]:
    """The c10d rendezvous settings (torchrun's --rdzv-conf, a PyTorchJob's rdzvConf): the join timeout, the
    heartbeat (a lost node is dropped after KEEP_ALIVE_MISSED of them) and, when elastic, the last call."""
    r = spec.rendezvous
    conf = {"join_timeout": r.join_timeout, "keep_alive_interval": r.keep_alive}
    conf["keep_alive_max_attempt"] = KEEP_ALIVE_MISSED
    return conf | ({"last_call_timeout": LAST_CALL_S} if spec.nodes.elastic else {})


def mpirun_args(spec: ClusterSpec, hosts: tuple[Host, ...], hostfile: str = "hostfile") -> list[str]:
    """mpirun's arguments: the hostfile, the process count and the variables every rank needs."""
    args = ["-np", str(sum(h.slots for h in hosts)), "--hostfile", hostfile]
    # OpenMPI gives each rank its rank and size; an exported WORLD_SIZE would read as a partial
    # torchrun environment (WORLD_SIZE without RANK), so only the rendezvous and interface travel.
    for key, value in env_vars(spec, hosts).items():
        if key not in (envvars.TORCHRUN.size, envvars.NNODES, envvars.NPROC_PER_NODE):
            args += ["-x", f"{key}={value}"]
    if spec.rendezvous.ifname:
        ifname = spec.rendezvous.ifname
        args += ["--mca", "btl_tcp_if_include", ifname, "--mca", "oob_tcp_if_include", ifname]
    return args


def job_argv(spec: ClusterSpec, script_dir: str = contract.JOB_DIR) -> list[str]:
    """What follows the launcher on every rank: ``-m app COMMAND`` or the user's script (in ``script_dir``)."""
    job = spec.job
    if job.script:
        return [f"{script_dir}/{job.script.rsplit('/', 1)[-1]}", *shlex.split(job.args)]
    return ["-m", "app", *shlex.split(job.command)]


def python_argv(spec: ClusterSpec, script_dir: str = contract.JOB_DIR, python: str = "python") -> list[str]:
    """The job as a plain process: ``python -m app COMMAND`` or ``python SCRIPT ARGS`` (mpirun, srun)."""
    return [python, *job_argv(spec, script_dir)]
