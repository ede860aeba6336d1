"""Fixtures for the container tests: images built offline, one compose project per test.

Every test here needs a Docker engine with compose v2 (`make engine` sets one up) and the images
that `make test-images` builds from the local debootstrap base (BASE=local), so no registry is
needed; make test builds them before pytest starts. Images are tagged ddp-cluster-test:* so the
tests never replace a user's ddp-cluster:* images.
"""

import json
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from bench import gate_figures
from bench.drive import explain

ROOT = Path(__file__).resolve().parents[2]
# DDP_TEST_IMAGE_NAME: another name, so that several checkouts can test on one engine side by side.
IMAGE_NAME = os.environ.get("DDP_TEST_IMAGE_NAME", "ddp-cluster-test")
JOB_TIMEOUT = 600


def run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """Run CMD in the repository root, capturing text output; never raises on failure."""
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)


def make(*args: str, timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess:
    """`make --no-print-directory ARGS` with the test image and the offline base."""
    images = [f"IMAGE_NAME={IMAGE_NAME}", f"MONITOR_IMAGE={IMAGE_NAME}-prometheus:bookworm"]
    quick = gate_figures.QUICK_MAKE  # before ARGS: a test's own GATE_SECONDS= comes last and wins
    return run(["make", "--no-print-directory", "BASE=local", *images, *quick, *args], timeout)


def project_leftovers(project: str) -> list[str]:
    """Containers, networks and volumes that still carry PROJECT's compose label."""
    label = f"label=com.docker.compose.project={project}"
    found = []
    for kind in (["ps", "-aq"], ["network", "ls", "-q"], ["volume", "ls", "-q"]):
        found += run(["docker", *kind, "--filter", label], 60).stdout.split()
    return found


@pytest.fixture(scope="session")
def engine() -> None:
    """A Docker engine that answers, with compose v2; fails (not skips) without one."""
    if shutil.which("docker") is None:
        pytest.fail("docker is not installed: run `make engine` (or `make test`, which does)")
    for cmd in (["docker", "info"], ["docker", "compose", "version"]):
        proc = run(cmd, 60)
        if proc.returncode != 0:
            pytest.fail(f"`{' '.join(cmd)}` failed: run `make engine`\n{explain(proc)}")


def built(image: str, target: str = "test-images") -> str:
    """``image``, which ``make TARGET`` builds before the tests (make test does, before pytest starts: no build
    beside the timed tests); fails with one line where it is missing."""
    if run(["docker", "image", "inspect", image], 60).returncode != 0:
        pytest.fail(f"image {image} is missing: build it with `make {target}` (make test does)", pytrace=False)
    return image


@pytest.fixture(scope="session")
def cpu_image(engine) -> str:
    return built(f"{IMAGE_NAME}:cpu")


@pytest.fixture(scope="session")
def cuda_image(engine) -> str:
    return built(f"{IMAGE_NAME}:cuda")


@dataclass
class Cluster:
    """A compose project of its own, driven through the Makefile's cluster targets."""

    project: str
    results: Path
    image: str

    def make(self, target: str, *args: str, timeout: float = JOB_TIMEOUT) -> subprocess.CompletedProcess:
        return make(target, f"CLUSTER={self.project}", f"RESULTS={self.results}", *args, timeout=timeout)

    def json(self, relpath: str) -> dict:
        return json.loads((self.results / relpath).read_text())

    def volume_files(self, folder: str) -> list[str]:
        """Names in FOLDER of the cluster's results volume, read by a throwaway container."""
        volume = f"{self.project}_results:/results:ro"
        mount = ["-v", volume, "--entrypoint", "ls"]
        cmd = ["docker", "run", "--rm", "--network", "none", *mount, self.image, f"/results/{folder}"]
        proc = run(cmd, 120)
        assert proc.returncode == 0, explain(proc)
        return proc.stdout.split()


@pytest.fixture
def cluster(cpu_image, tmp_path) -> Cluster:
    """A unique compose project; torn down afterwards even when the test failed."""
    c = Cluster(project=f"ddpt-{uuid.uuid4().hex[:8]}", results=tmp_path / "results", image=cpu_image)
    yield c
    if project_leftovers(c.project):
        c.make("cluster-down", timeout=180)
