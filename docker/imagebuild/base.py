"""The base image of the workload: upstream (pulled) or the local one (debootstrap), by BASE.

    PYTHONPATH=docker python3 -m imagebuild base [--local-base TAG]    # make base

auto: the upstream base when present or pullable, else the local one; upstream or local force
one. The local base stands in for python:X-slim: Debian (LOCAL_BASE_SUITE, minbase) with python3
and venv, apt reading the mirror over plain http; where no registry is reachable it is also the
stand-in base of the cuda flavour (no CUDA libraries: CI builds that flavour with a CPU torch).
Its root file system comes from docker/build-base.sh (debootstrap, trims, docker import); this
module checks what that needs first (root, the engine, debootstrap: installed with apt).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable

from .host import ROOT, BuildError, Docker, apt_install, is_root, megabytes, say

MODES = ("auto", "upstream", "local")
PULL_SECONDS = {"upstream": 900, "auto": 300}
"""How long a pull may take before the registry counts as unreachable (auto gives up sooner)."""


def choose(mode: str, upstream: str, local: str, available: Callable[[str, float], bool]) -> str:
    """The base to build from; AVAILABLE(image, seconds) says whether it is present or pulled in time."""
    if mode == "local":
        return local
    if available(upstream, PULL_SECONDS[mode]):
        return upstream
    if mode == "upstream":
        raise BuildError(f"cannot pull {upstream} (no registry reachable?); build offline with BASE=local")
    say("image", f"{upstream} cannot be pulled: using the local base (BASE=local)")
    return local


def present_or_pulled(docker: Docker) -> Callable[[str, float], bool]:
    return lambda image, seconds: docker.present(image) or docker.pulled(image, seconds)


def ensure_local(tag: str, suite: str, mirror: str, docker: Docker) -> bool:
    """The local base TAG, built when missing; True when it was."""
    if docker.present(tag):
        return False
    build_local(tag, suite, mirror, docker)
    return True


def build_local(tag: str, suite: str, mirror: str, docker: Docker) -> None:
    if not is_root():
        raise BuildError(f"the local base {tag} needs root (debootstrap); rerun as root or build with BASE=upstream")
    if not docker.answers():
        raise BuildError("no Docker engine answers; run 'make engine' first")
    if shutil.which("debootstrap") is None:
        apt_install(["debootstrap"], "debootstrap (or build with BASE=upstream)")
    start = time.monotonic()
    say("base", f"debootstrap {suite} into {tag}")
    script = [str(ROOT / "docker" / "build-base.sh"), tag, suite, *([mirror] if mirror else [])]
    if subprocess.run(script, check=False).returncode != 0:
        raise BuildError(f"the local base {tag} could not be built (see above)")
    size = megabytes(int(docker.inspect(tag, "{{.Size}}") or 0))
    say("base", f"imported {tag} ({size}) in {time.monotonic() - start:.0f} s")
