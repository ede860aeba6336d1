"""The compose mini-cluster's view of a spec: the env file compose.yaml reads, and the files its
init service writes into the cluster volume. compose.yaml itself holds no defaults and no checks.

    python -m app topology --nodes 3 --format compose --output build/cluster/ddp-cluster.env
    docker compose --env-file build/cluster/ddp-cluster.env up --attach head --exit-code-from head
    python -m app topology --spec-json "$CLUSTER_SPEC" --format compose-files --output-dir /cluster  # init

Containers are ``head`` (rank 0's node: it serves the c10d rendezvous) and ``<name>-worker-<i>``
(torchrun), or ``<name>-mpi-worker-<i>`` (the mpi profile: sshd on each, mpirun from a launcher).
"""

import json
import os
import shlex
import stat
from pathlib import Path

from app.errors import UsageError
from app.topology import render
from app.topology.spec import ClusterSpec, Host

MAX_NODES = 16
"""The mini-cluster runs on one machine: each node is a container."""
HEAD = "head"
"""Host name of the head container: rank 0's node, the c10d endpoint."""
SCRIPT_MOUNT = "/job"
"""Where a user's script folder is mounted read-only in every container."""


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


def torchrun_hosts(spec: ClusterSpec) -> tuple[Host, ...]:
    """The torchrun nodes: the head, then the workers as compose names them."""
    n, p = spec.nodes.nodes, spec.nodes.nproc_per_node
    return (Host(HEAD, p), *(Host(f"{spec.job.name}-worker-{i}", p) for i in range(1, n)))


def mpi_hosts(spec: ClusterSpec) -> tuple[Host, ...]:
    """The mpi profile's nodes (sshd containers) as compose names them."""
    return tuple(
        Host(f"{spec.job.name}-mpi-worker-{i}", spec.nodes.nproc_per_node) for i in range(1, 1 + spec.nodes.nodes)
    )


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
    argv = (
        render.python_argv(spec, SCRIPT_MOUNT) if spec.job.launcher == "mpirun" else render.job_argv(spec, SCRIPT_MOUNT)
    )
    return shlex.join(argv)


def _quoted(value: str) -> str:
    """A value for compose's env file, taken literally (single quotes) unless it holds one."""
    if "'" not in value:
        return f"'{value}'"
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$")
    return f'"{escaped}"'


def env_file(spec: ClusterSpec, default_script_dir: Path) -> str:
    """The variables compose.yaml reads (docker compose --env-file)."""
    check(spec)
    folder = script_dir(spec) or default_script_dir
    values = {
        "COMPOSE_PROJECT_NAME": spec.job.name,
        "IMAGE": spec.job.image,
        "NODES": spec.nodes.nodes,
        "WORKERS": spec.nodes.nodes - 1,
        # docker's own restarts of a crashed worker, bounded like torchrun's (on-failure alone never stops:
        # a worker whose head is gone for good would come back for ever).
        "WORKER_RESTART": f"on-failure:{spec.rendezvous.max_restarts}" if spec.rendezvous.max_restarts else "no",
        "GPUS_PER_NODE": spec.nodes.gpus_per_node,
        "LAUNCHER": spec.job.launcher,
        "TIME_LIMIT": spec.job.time_limit,
        "SCRIPT_DIR": os.fspath(folder),
        "JOB_COMMAND": shlex.join(render.job_argv(spec, SCRIPT_MOUNT)),
        "MPI_COMMAND": shlex.join(render.python_argv(spec, SCRIPT_MOUNT)),
        "CLUSTER_SPEC": json.dumps(spec.as_dict(), separators=(",", ":")),
    }
    return "".join(f"{key}={_quoted(str(value))}\n" for key, value in values.items())


def cluster_files(spec: ClusterSpec) -> dict[str, str]:
    """What the init service writes into the cluster volume, by file name."""
    check(spec)
    nodes, mpi = torchrun_hosts(spec), mpi_hosts(spec)
    return {
        "torchrun.args": " ".join(render.torchrun_args(spec, nodes)) + "\n",
        "cluster.env": render.render_env(spec, nodes),
        "hostfile": render.render_hostfile(mpi),
        "mpirun.args": " ".join(render.mpirun_args(spec, mpi, "/cluster/hostfile")) + "\n",
    }
