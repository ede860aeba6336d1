"""The contract every engine shares: the facts that compose, Ansible, Slurm, Kubernetes, the image and the
app itself must agree on, each written once here (ports, the paths inside the image, the image's name
and which flavour of it a node runs). Names and versions of the images are read from
``docker/versions.env``, the one file that Make, the image build and Python read. Needs no torch.

    python -m app topology --gpus-per-node 8 --nproc-per-node 8 --format flavour   # cuda
    python -m app topology --format image                                          # ddp-cluster:cpu
    python -c 'from app import contract; print(contract.image(8))'                 # ddp-cluster:cuda
"""

import re
import sys
from functools import cache
from pathlib import Path

from app.errors import UsageError

RENDEZVOUS_PORT = 29500
"""The rendezvous port (MASTER_PORT, torchrun's --master-port default and the Kubeflow torch plugin's
PET_MASTER_PORT): used wherever a launcher or a spec gives none."""
C10D_PORT = 29400
"""torchrun's port of a c10d --rdzv-endpoint given without one."""
METRICS_PORT = 9473
"""Where every node of a job serves its Prometheus metrics (app/metrics.py: ``app node --serve-metrics``), on the
cluster network only (9400 is DCGM exporter's, 9100 node exporter's)."""
MONITOR_PORT = 9090
"""The host's loopback port of the mini-cluster's Prometheus UI (make cluster-up MONITOR=1: Prometheus's own)."""
METRICS_PATH = "/metrics"
"""The path of those metrics (prometheus-client's server answers any path; scrapes name this one)."""

JOB_DIR = "/job"
"""In the image: where a user's script folder is mounted read-only (compose, Kubernetes)."""
CLUSTER_DIR = "/cluster"
"""In the image: the cluster's rendered files (torchrun.args, mpirun.args, hostfile, cluster.env, ssh/)."""
GATE_SECONDS = 1.0
"""The health gate's time measuring each device (app gate --device-seconds, the spec's nodes.gate_seconds): half app
check's (it is on the path of every node's start and rejoin; a figure that falls short is measured once more before
it counts)."""
GATE_FAIL_BELOW = 0.5
"""The health gate keeps a node out when a device figure is below this fraction of the job's at its start (app gate
--fail-below, the spec's nodes.gate_fail_below)."""


def check_gate_fail_below(fraction: float, flag_name: str) -> None:
    """UsageError unless ``fraction`` (GATE_FAIL_BELOW's kind, given as ``flag_name``) is in (0, 1]."""
    if not 0 < fraction <= 1:
        example = f"{GATE_FAIL_BELOW:g}"
        raise UsageError(f"{flag_name} {fraction:g} must be a fraction of the job's figures in (0, 1], e.g. {example}")


GATE_RETRY_S = 10
"""Seconds between a kept-out node's gate judgements: every engine's node agent's --retry-every (render.node_args)."""
NODE_ARGS = "node.args"
"""In CLUSTER_DIR: flags of ``python -m app node`` that docker/bin/ddp-node gives it before torchrun's arguments
(``render.node_args``: the gate's on every engine; the straggler policy in Kubernetes' ConfigMap and on Ansible)."""
RESULTS_DIR = "/results"
"""In the image: where a job writes its results (checkpoints, metrics, summaries), brought back by each engine."""
EVENTS_DIR = "/events"
"""In the image: the folder of the job's events file (app/events.py), a host folder that the runner reads."""
EVENTS_NAME = "events.jsonl"
"""The events file's name, in EVENTS_DIR (compose) or in a folder of the node's own (the other engines)."""

PATHS = {"job": JOB_DIR, "cluster": CLUSTER_DIR, "results": RESULTS_DIR, "events": EVENTS_DIR}
"""The in-image paths by name, as ``app topology --format json`` gives them to engines outside Python (Ansible)."""
APP_UID = 1000
"""In the image: the user ``app`` (docker/Dockerfile, ARG APP_UID) and its group, that every process runs as."""
APP_HOME = "/home/app"
"""In the image: the home of ``app`` (its caches)."""

CPU, CUDA = "cpu", "cuda"
FLAVOURS = (CPU, CUDA)
"""The workload image's flavours, its tags: IMAGE_NAME:cpu and IMAGE_NAME:cuda."""

VERSIONS_FILE = "docker/versions.env"
"""The file of the images' names, bases and pins (an installed package's share/ddp-cluster/versions.env)."""
COMPOSE_FILE = "compose.yaml"
"""The compose mini-cluster's file (an installed package's share/ddp-cluster/compose.yaml)."""
_LINE = re.compile(r"([A-Z][A-Z0-9_]*)=([^\s'\"$`\\]+)")


def flavour(gpus_per_node: int) -> str:
    """The image flavour of a node with this many GPUs: cuda when it has any, else cpu."""
    return CUDA if gpus_per_node > 0 else CPU


def image(gpus_per_node: int) -> str:
    """The workload image of a node with this many GPUs: ``ddp-cluster:cuda`` or ``ddp-cluster:cpu``."""
    return f"{versions()['IMAGE_NAME']}:{flavour(gpus_per_node)}"


def shipped(relative: str) -> Path:
    """A file of the repository that pip installs as share/ddp-cluster/<its name> (pyproject's data-files):
    this checkout's, else the installed copy."""
    checkout = Path(__file__).resolve().parents[1] / relative
    return checkout if checkout.is_file() else Path(sys.prefix, "share", "ddp-cluster", Path(relative).name)


@cache
def versions() -> dict[str, str]:
    """Every KEY=VALUE of docker/versions.env (comments and blank lines aside): this checkout's, else the installed
    copy."""
    path = shipped(VERSIONS_FILE)
    if not path.is_file():
        raise UsageError(
            f"{VERSIONS_FILE} not found (neither in a checkout nor at {path}): reinstall the package "
            "(pip install .) or give the image with --image"
        )
    return read_versions(path)


def read_versions(path: Path) -> dict[str, str]:
    """Every KEY=VALUE of a versions file: the one reader of docker/versions.env (the image builder's, and the
    Makefile's through ``python -m imagebuild versions``); a line of another shape is a UsageError naming it."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise UsageError(f"{path}:{number}: '{line}' is not KEY=VALUE (no quotes, spaces or $); fix that line")
        values[match[1]] = match[2]
    return values
