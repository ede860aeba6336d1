"""The host-filled wheelhouse of one flavour, for an offline image build (pip install --no-index).

    PYTHONPATH=docker python3 -m imagebuild wheelhouse --out build/wheelhouse/cpu --torch 'torch==X+cpu'

Downloads, for the image's Python (PYTHON_VERSION, manylinux) rather than the host's: the pins
of docker/requirements.txt, the torch requirement given, their dependencies (resolved, so that
conflicting pins fail here), and into OUT/tools the build tools (docker/build-requirements.txt
and the app's build backend). torch comes from local wheels when pip's configured find-links
have it (offline machines), else from --torch-index (else pip's index). Writes
OUT/requirements.txt, the list the image installs (with its left-out lines), last; does nothing
when its inputs are unchanged. The image step fills it in the background (start/stop below).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

from .host import ROOT, BuildError, megabytes, run, say

PINS = ROOT / "docker" / "requirements.txt"
TOOLS = ROOT / "docker" / "build-requirements.txt"
# pip warns once per package about configured index folders that lack it: noise.
NOISE = "is ignored: it is neither a file nor a directory"


@dataclass(frozen=True)
class Request:
    """One wheelhouse: where, which torch, for which interpreter, downloaded with which pip."""

    out: Path
    torch: str
    torch_index: str
    pip_python: Path
    python_version: str
    arch: str

    def flags(self) -> list[str]:
        """This request as the flags of `python -m imagebuild wheelhouse` (the background fill)."""
        return [item for f in fields(self) for item in ("--" + f.name.replace("_", "-"), str(getattr(self, f.name)))]


def flavour_before_base(flavour: str, base_mode: str) -> str | None:
    """The wheelhouse an image needs, where known before its base: the cuda flavour on the local
    base is the stand-in with CPU torch, so cuda with BASE=auto waits for the base."""
    if flavour == "cpu" or base_mode == "local":
        return "cpu"
    return "cuda" if base_mode == "upstream" else None


def flavour_for_base(flavour: str, base_image: str, local_base: str) -> str:
    return "cuda" if flavour == "cuda" and base_image != local_base else "cpu"


def build_requires() -> list[str]:
    import tomllib  # 3.11+, checked by __main__ before this runs

    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["build-system"]["requires"])


def inputs_digest(request: Request, backend: list[str]) -> str:
    """Everything the download depends on: an unchanged digest leaves the wheelhouse as it is."""
    parts = [request.torch, request.python_version, request.arch, *backend, PINS.read_text(), TOOLS.read_text()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def up_to_date(out: Path, digest: str) -> bool:
    stamp = out / ".inputs"
    return (out / "requirements.txt").is_file() and stamp.is_file() and stamp.read_text().strip() == digest


def target(request: Request) -> list[str]:
    """pip download's flags for the image's interpreter; manylinux_2_28 covers Debian 12 and Ubuntu 22.04."""
    arch = request.arch
    platforms = [f"manylinux_2_28_{arch}", f"manylinux_2_17_{arch}", f"manylinux2014_{arch}"]
    abi = "cp" + request.python_version.replace(".", "")
    flags = ["--only-binary=:all:", "--python-version", request.python_version, "--implementation", "cp"]
    return [*flags, *(f for p in platforms for f in ("--platform", p)), "--abi", abi, "--abi", "none", "--abi", "abi3"]


def download(request: Request, dest: Path, *args: str, quiet: bool = False) -> bool:
    pip = [str(request.pip_python), "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    cmd = [*pip, "--retries", "2", "--timeout", "30", "--dest", str(dest), *target(request), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if not quiet:
        print("".join(line for line in (proc.stdout + proc.stderr).splitlines(True) if NOISE not in line), end="")
    return proc.returncode == 0


def fill(request: Request) -> None:
    out = request.out
    backend = build_requires()
    digest = inputs_digest(request, backend)
    if up_to_date(out, digest):
        say("wheelhouse", f"{out} is up to date")
        return
    if run([str(request.pip_python), "-m", "pip", "--version"], timeout=120).returncode != 0:
        raise BuildError(f"'{request.pip_python} -m pip' does not run; pass --pip-python with a Python that has pip")
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    say("wheelhouse", f"{request.torch} into {out}")
    # Offline first: pip's configured find-links (for example a local torch wheel).
    if not download(request, out, "--no-deps", "--no-index", request.torch, quiet=True):
        index = ["--index-url", request.torch_index] if request.torch_index else []
        if not download(request, out, "--no-deps", *index, request.torch):
            raise BuildError(
                f"could not download {request.torch}; give --torch-index, or put its wheel in a pip find-links folder"
            )
    say("wheelhouse", "pinned requirements and their dependencies")
    if not download(request, out, "--find-links", str(out), "-r", str(PINS), request.torch):
        raise BuildError("pip download failed; check the pins in docker/requirements.txt")
    shutil.rmtree(out / "tools", ignore_errors=True)  # holds exactly one pip wheel
    if not download(request, out / "tools", "-r", str(TOOLS), *backend):
        raise BuildError("pip download of the build tools failed; check docker/build-requirements.txt")
    write_list(request, out, digest)
    wheels = list(out.rglob("*.whl"))
    size = megabytes(sum(p.stat().st_size for p in out.rglob("*") if p.is_file()))
    say("wheelhouse", f"{len(wheels)} wheels, {size} in {time.monotonic() - start:.0f} s")


def write_list(request: Request, out: Path, digest: str) -> None:
    """OUT/requirements.txt, the list the image installs and leaves out; written last: present means complete."""
    lines = PINS.read_text().splitlines()
    pins = [line for line in lines if line.strip() and not line.lstrip().startswith("#")]
    left_out = [line for line in lines if line.startswith("# left-out:")]
    header = "# generated by python -m imagebuild wheelhouse; installed with pip --no-index (docker/install-venv.sh)"
    (out / "requirements.tmp").write_text("\n".join([header, *pins, request.torch, *left_out]) + "\n")
    (out / "requirements.tmp").replace(out / "requirements.txt")
    (out / ".inputs").write_text(digest + "\n")


def start(request: Request) -> subprocess.Popen:
    """Fill REQUEST's wheelhouse in the background, in a process group of its own (stop() ends it all)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "imagebuild", "wheelhouse", *request.flags()]
    return subprocess.Popen(cmd, env=env, start_new_session=True)


def wait(proc: subprocess.Popen, out: Path) -> float:
    """Seconds spent waiting for the background fill; an error when it failed."""
    begin = time.monotonic()
    if proc.wait() != 0:
        raise BuildError(f"the wheelhouse {out} could not be filled (see above)")
    return time.monotonic() - begin


def stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
