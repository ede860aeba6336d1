"""What the build asks of the host: its errors, commands, root, apt, and the docker CLI.

PYTHONPATH=docker python3 -c 'from imagebuild.host import Docker; print(Docker().answers())'
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository (the build context of the workload image)."""


class BuildError(Exception):
    """The build cannot go on: one line on stderr naming the problem and the fix, exit status 1."""


def say(step: str, message: str) -> None:
    """One progress line of a step, e.g. 'image: built ...'."""
    print(f"{step}: {message}", flush=True)


def run(cmd: list[str], timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess:
    """CMD with its output captured as text; never raises on a non-zero exit; a missing program or
    a timeout reads as exit status 127 or 124."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    except FileNotFoundError as error:
        return subprocess.CompletedProcess(cmd, 127, "", str(error))
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout} s")


def is_root() -> bool:
    return os.geteuid() == 0


def is_debian_family(os_release: Path = Path("/etc/os-release")) -> bool:
    """Debian, Ubuntu and their derivatives (ID or ID_LIKE), where apt installs what is missing."""
    try:
        lines = os_release.read_text().splitlines()
    except OSError:
        return False
    ids = " ".join(line.split("=", 1)[1] for line in lines if line.startswith(("ID=", "ID_LIKE=")))
    return "debian" in ids or "ubuntu" in ids


def apt_install(packages: list[str], missing: str) -> None:
    """Install PACKAGES with apt (as root, or with sudo); MISSING says what they bring, for the error."""
    if not is_debian_family():
        raise BuildError(f"{missing} is missing and this is not a Debian-family system; install it, then rerun")
    prefix = [] if is_root() else ["sudo"] if shutil.which("sudo") else None
    if prefix is None:
        raise BuildError(f"{missing} is missing and installing {' '.join(packages)} needs root; rerun as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        proc = run([*prefix, *cmd], timeout=900, env=env)
        if proc.returncode != 0:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:]
            raise BuildError(f"'{' '.join(cmd)}' failed: {' '.join(last)}")


def megabytes(size: int) -> str:
    return f"{size / 1e6:.0f} MB"


class Docker:
    """The docker CLI, as the build uses it (tests put a stand-in with the same methods in its place)."""

    def answers(self) -> bool:
        return run(["docker", "info"], timeout=60).returncode == 0

    def present(self, image: str) -> bool:
        return run(["docker", "image", "inspect", image], timeout=60).returncode == 0

    def pulled(self, image: str, seconds: float) -> bool:
        """Pull IMAGE; a registry that does not answer costs at most SECONDS."""
        return run(["docker", "pull", "-q", image], timeout=seconds).returncode == 0

    def inspect(self, image: str, template: str) -> str:
        """IMAGE's field by Go TEMPLATE; empty when the image is missing."""
        proc = run(["docker", "image", "inspect", "--format", template, image], timeout=60)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    def label(self, image: str, key: str) -> str:
        return self.inspect(image, f'{{{{index .Config.Labels "{key}"}}}}')

    def build(self, args: list[str], log: Path | None = None) -> bool:
        """docker build ARGS; its output goes to LOG (else nowhere). True when it built."""
        with open(log or os.devnull, "w") as out:
            return subprocess.run(["docker", "build", *args], stdout=out, stderr=subprocess.STDOUT).returncode == 0

    def remove(self, image: str) -> None:
        """Remove IMAGE unless a container uses it."""
        run(["docker", "rmi", image], timeout=120)


def tail(path: Path, lines: int = 15) -> None:
    """The last LINES of a log, on stderr (above the one-line error that names the log)."""
    text = path.read_text(errors="replace").splitlines()[-lines:]
    print("\n".join(text), file=sys.stderr)
