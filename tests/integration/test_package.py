"""A pip install of the project, run outside the checkout: the light install (no extra) holds no torch and runs
the host side (``app cluster``, ``app topology``); the repository's compose.yaml comes with the package
(data-files), found without the repository; what an extra adds is one line naming it and its pip command.

Builds the wheel, installs it with ``pip install --no-index``: its own requirements must need no index (torch
is the [node] extra's), then adds the [cluster] extra with the command its error line names, offline: pip finds
the Docker SDK and what it needs in build/wheelhouse/cluster-extra (``make venv`` downloads them; no test reaches
the package index). Every command runs from a folder that holds no checkout.
Run: ``.venv/bin/python -m pytest tests/integration/test_package.py`` (about 15 s).
"""

import json
import re
import shlex
import shutil
import socketserver
import subprocess
import sys
import threading
import venv
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from tests.deps import missing

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_EXTRA_WHEELS = ROOT / "build" / "wheelhouse" / "cluster-extra"
"""The Makefile's CLUSTER_EXTRA_WHEELS: where ``make venv`` puts the [cluster] extra's wheels."""

pytestmark = pytest.mark.integration


def _run(cmd: list, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(cwd), **env}  # no PYTHONPATH: only what was installed
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv that holds the project's wheel, installed as a pip user would (no extra)."""
    where = tmp_path_factory.mktemp("package")
    source, wheels = where / "source", where / "wheels"  # a copy: setuptools' build/ in the checkout could be stale
    shutil.copytree(ROOT / "app", source / "app", ignore=shutil.ignore_patterns("__pycache__"))
    (source / "docker").mkdir()
    for name in ("pyproject.toml", "README.md", "compose.yaml", "docker/versions.env"):  # as docker/Dockerfile's build
        shutil.copy(ROOT / name, source / name)
    wheel_cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels)]
    built = subprocess.run([*wheel_cmd, str(source)], capture_output=True, text=True, timeout=300, check=False)
    assert built.returncode == 0, built.stderr
    venv.create(where / "venv", with_pip=True)  # the pip that the error lines name
    python = where / "venv" / "bin" / "python"
    wheel = next(wheels.glob("ddp_cluster-*.whl"))
    # No index: the light install's requirements must all be there already (none: torch is the [node] extra's).
    done = _run([python, "-m", "pip", "install", "--no-index", "-q", wheel], where)
    assert done.returncode == 0, done.stderr
    return python


def _one_line(proc: subprocess.CompletedProcess) -> str:
    """The command's only output: one error line on standard error, no traceback, nothing on standard output."""
    assert proc.returncode == 2 and not proc.stdout and "Traceback" not in proc.stderr, proc
    (line,) = proc.stderr.splitlines()
    return line


def test_the_light_install_runs_the_host_side_without_torch(installed, tmp_path):
    for package in ("torch", "numpy"):
        assert _run([installed, "-c", f"import {package}"], tmp_path).returncode != 0, f"the venv holds {package}"
    helped = _run([installed, "-m", "app", "cluster", "up", "--help"], tmp_path)
    assert helped.returncode == 0 and "--nodes" in helped.stdout, helped.stderr
    example = re.search(r"```toml\n(.*?)```", (ROOT / "docs" / "engines.md").read_text(), re.S)[1]  # the docs' spec
    (tmp_path / "lab.toml").write_text(example)
    batch = _run([installed, "-m", "app", "topology", "--spec", "lab.toml", "--format", "sbatch"], tmp_path)
    assert batch.returncode == 0 and "#SBATCH --job-name=lab\n#SBATCH --nodes=3\n" in batch.stdout, batch.stderr
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
    node_line = _one_line(_run([installed, "-m", "app", "train", "--help"], tmp_path))  # the node side: an extra
    assert node_line == (
        "error: python -m app train needs torch, which this Python lacks (the [node] extra): "
        f"{shlex.quote(str(installed))} -m pip install 'ddp-cluster[node]'"
    )


class _Engine(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """A Docker engine that holds no container: the Engine API's version and an empty container list."""

    daemon_threads = True
    asked: list[str]


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.asked.append(self.path)
        body = json.dumps({"ApiVersion": "1.44", "Version": "26.1.5"} if self.path == "/version" else []).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:  # a unix socket's client has no address to log
        pass


def test_the_cluster_extra_is_one_line_whose_command_adds_it_then_status_says_there_is_no_cluster(installed, tmp_path):
    for action in ("up", "status", "down"):
        line = _one_line(_run([installed, "-m", "app", "cluster", action], tmp_path))
        assert line == (
            "error: the Docker SDK for Python is missing (the [cluster] extra): "
            f"{shlex.quote(str(installed))} -m pip install 'ddp-cluster[cluster]' [exit 2]"
        ), line
    assert not (tmp_path / "build").exists(), "the cluster's files were rendered although it cannot start"
    if not any(CLUSTER_EXTRA_WHEELS.glob("docker-*.whl")):
        missing(f"no Docker SDK wheel in {CLUSTER_EXTRA_WHEELS}: make venv downloads it")
    command = line.split(" extra): ", 1)[1].removesuffix(" [exit 2]")  # the error line's own, offline
    added = _run(["bash", "-c", command], tmp_path, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(CLUSTER_EXTRA_WHEELS))
    assert added.returncode == 0, added.stderr
    with _Engine(str(tmp_path / "engine.sock"), _Answer) as engine:
        engine.asked = []
        threading.Thread(target=engine.serve_forever, daemon=True).start()
        status = _run(
            [installed, "-m", "app", "cluster", "status"], tmp_path, DOCKER_HOST=f"unix://{engine.server_address}"
        )
        engine.shutdown()
    assert any(path.startswith("/v1.44/containers/json") for path in engine.asked), engine.asked  # it asked the engine
    assert _one_line(status).startswith("error: no cluster named ddp-cluster here (no "), status.stderr
