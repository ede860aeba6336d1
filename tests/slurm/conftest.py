"""Fixtures of the Slurm tests: one mini-cluster with real daemons (slurmctld, 2 x slurmd, munge)
for the session, and one of 3 nodes for the test that kills one, driven through the Makefile's slurm-*
targets as a user drives it.

The images are `make test`'s prerequisites (image-cpu, slurm-image); IMAGE_NAME, SLURM_IMAGE
and BASE in the environment pick others, as they do for make (checkouts side by side:
IMAGE_NAME=ddp-cluster-me BASE=local pytest -m slurm tests/slurm).
"""

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from bench import gate_figures

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT = 600
UP_TIMEOUT = 900


def make_command(*args: str) -> list[str]:
    """`make --no-print-directory ARGS` with the container tests' gate knobs (a test's own, given after them, win)."""
    return ["make", "--no-print-directory", *gate_figures.QUICK_MAKE, *args]


def make(*args: str, timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess:
    """`make --no-print-directory ARGS` in the repository root; never raises on failure."""
    return subprocess.run(make_command(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def explain(proc: subprocess.CompletedProcess) -> str:
    """The tail of a command's output, for assertion messages."""
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=False)


@dataclass
class SlurmCluster:
    """The session's mini-cluster: its spec name (CLUSTER) and the host folder of its /results."""

    name: str
    results: Path

    @property
    def project(self) -> str:
        return f"{self.name}-slurm"

    def make_command(self, target: str, *args: str) -> list[str]:
        return make_command(target, f"CLUSTER={self.name}", f"RESULTS={self.results}", *args)

    def make(self, target: str, *args: str, timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess:
        return make(target, f"CLUSTER={self.name}", f"RESULTS={self.results}", *args, timeout=timeout)

    def node(self, i: int) -> str:
        """Node ``i``'s name (1-based): its container's, its host's and Slurm's NodeName."""
        return f"{self.project}-node-{i}"

    def controller(self, *cmd: str) -> subprocess.CompletedProcess:
        """``cmd`` in the controller, as the job user, as a login node runs it (its /results is every node's)."""
        return docker("exec", "--user", "app", f"{self.project}-slurmctld-1", *cmd)

    def job(self, launcher: str, job: str, *args: str) -> subprocess.CompletedProcess:
        """`make slurm-job` with this batch style and app command: sbatch, wait, report."""
        return self.make("slurm-job", f"LAUNCHER={launcher}", f"JOB={job}", *args)

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        kinds = (["ps", "-aq"], ["network", "ls", "-q"], ["volume", "ls", "-q"])
        return [found for kind in kinds for found in docker(*kind, "--filter", label).stdout.split()]


@contextlib.contextmanager
def mini_cluster(cluster: SlurmCluster, *shape: str) -> Iterator[SlurmCluster]:
    """``cluster`` up in ``shape`` (make slurm-up's knobs) while entered; removed afterwards, leaving nothing."""
    if shutil.which("docker") is None or docker("info").returncode != 0:
        pytest.fail("no Docker engine answers: run `make engine` (or `make test`, which does)")
    proc = cluster.make("slurm-up", *shape, timeout=UP_TIMEOUT)
    try:
        assert proc.returncode == 0, f"make slurm-up failed\n{explain(proc)}"
        yield cluster
    finally:
        down = cluster.make("slurm-down", timeout=300)
        assert down.returncode == 0 and not cluster.leftovers(), f"slurm-down left things\n{explain(down)}"


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A 2-node mini-cluster (2 CPUs each) for the session."""
    cluster = SlurmCluster(f"slt{os.getpid()}", tmp_path_factory.mktemp("slurm") / "results")
    with mini_cluster(cluster, "NODES=2", "NPROC_PER_NODE=2"):
        yield cluster


DOWN_AFTER_S = 20
"""SlurmdTimeout of the 3-node mini-cluster (the rig's default: 60): a killed node is DOWN that long after it fell
silent, and a few seconds more (slurmctld's next look)."""


@pytest.fixture
def three_nodes(tmp_path: Path) -> Iterator[SlurmCluster]:
    """A 3-node mini-cluster of 1 CPU each, for a test that kills one of its nodes."""
    cluster = SlurmCluster(f"slk{os.getpid()}", tmp_path / "results")
    with mini_cluster(cluster, "NODES=3", "NPROC_PER_NODE=1", f"SLURMD_TIMEOUT={DOWN_AFTER_S}"):
        yield cluster
