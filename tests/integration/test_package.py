"""``app cluster`` and ``app topology`` from a pip install of the project, run outside the checkout:
the repository's compose.yaml comes with the package (data-files), found without the repository.

Builds the wheel, installs it with --no-deps into a fresh venv without torch (the topology and the
cluster runner need none) and runs the commands from a folder that holds no checkout.
Run: ``.venv/bin/python -m pytest tests/integration/test_package.py`` (about 30 s).
"""

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def _run(cmd: list, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd)}  # no PYTHONPATH: only what was installed
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv (no torch) that holds the project's wheel; the wheel built from ROOT."""
    where = tmp_path_factory.mktemp("package")
    source, wheels = where / "source", where / "wheels"  # a copy: setuptools' build/ in the checkout could be stale
    shutil.copytree(ROOT / "app", source / "app", ignore=shutil.ignore_patterns("__pycache__"))
    (source / "docker").mkdir()
    for name in ("pyproject.toml", "README.md", "compose.yaml", "docker/versions.env"):  # as docker/Dockerfile's build
        shutil.copy(ROOT / name, source / name)
    wheel_cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    built = subprocess.run([*wheel_cmd, str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr
    venv.create(where / "venv", with_pip=False)
    python = where / "venv" / "bin" / "python"
    wheel = next(wheels.glob("ddp_cluster-*.whl"))
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return python


def test_the_installed_package_runs_cluster_and_topology_outside_the_checkout(installed, tmp_path):
    assert _run([installed, "-c", "import torch"], tmp_path).returncode != 0, "the venv must hold no torch"
    helped = _run([installed, "-m", "app", "cluster", "up", "--help"], tmp_path)
    assert helped.returncode == 0 and "--nodes" in helped.stdout, helped.stderr
    env_file = _run([installed, "-m", "app", "topology", "--nodes", "3", "--format", "compose"], tmp_path)
    assert env_file.returncode == 0 and "IMAGE='ddp-cluster:cpu'" in env_file.stdout, env_file.stderr
    gpu = ("--gpus-per-node", "8", "--nproc-per-node", "8", "--format", "image")  # versions.env: package data
    assert _run([installed, "-m", "app", "topology", *gpu], tmp_path).stdout == "ddp-cluster:cuda\n"
    where = _run([installed, "-m", "app", "topology", "--format", "compose-path"], tmp_path)
    compose_file = Path(where.stdout.strip())
    assert compose_file.is_file() and ROOT not in compose_file.parents, where  # the installed copy
    assert compose_file.read_text() == (ROOT / "compose.yaml").read_text()  # the same file, not a copy kept apart
    rendered = _run([installed, "-m", "app", "topology", "--format", "compose-files", "--output-dir", "x"], tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    assert str(compose_file) in (tmp_path / "x" / "nodes.yaml").read_text()  # the workers extend the installed file
