"""The Docker engine as the cluster runner sees it: objects from the Engine API through the Docker SDK for Python.

    python -m app cluster up      # make cluster-up runs it with build/tools-venv's python, which has the SDK
    pip install 'ddp-cluster[cluster]'   # the SDK for a pip install of the app (the [cluster] extra)

Containers, their states, limits, output and the engine's events come back as objects, not as text that
``docker inspect`` or ``docker events`` printed; compose stays the CLI it is (``job.Run.compose``). The
SDK is imported on first use, so ``--help`` runs without it, and a missing SDK or engine is one line. Each
thread takes its own client (``client()``): an SDK client is a requests session, not made for threads.
"""

from __future__ import annotations

import contextlib
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from app.errors import UsageError, install_extra

REQUEST_TIMEOUT_S = 120
"""The longest one request to the engine may take (a stream that follows has none)."""
EXTRA = "cluster"
"""pyproject.toml's extra that holds the Docker SDK for Python (docker/versions.env pins it for build/tools-venv)."""


def sdk() -> Any:
    """The Docker SDK for Python; one line naming the extra and the command that install it when it is missing."""
    try:  # (a from-import: without the SDK, the repository's docker/ folder imports as an empty namespace)
        from docker import from_env  # noqa: F401
    except ImportError:
        missing = f"the Docker SDK for Python is missing (the [{EXTRA}] extra)"
        raise UsageError(f"{missing}: {install_extra(EXTRA)}") from None
    import docker

    return docker


def client(timeout: float = REQUEST_TIMEOUT_S) -> Any:
    """A client of the engine that DOCKER_HOST (else the local socket) names; one line when the SDK is missing or
    the engine does not answer."""
    docker = sdk()
    try:
        return docker.from_env(timeout=int(timeout))
    except docker.errors.DockerException as error:
        raise UsageError(f"the Docker engine does not answer ({_reason(error)}): start it with `make engine`") from None


def _reason(error: BaseException) -> str:
    """What the connection to the engine met, in the system's words (``Connection refused``, ``No such file or
    directory``: the first OSError among the SDK's nested errors), else the last part of the SDK's message."""
    queue, seen = [error], set()
    while queue:
        found = queue.pop(0)
        if isinstance(found, OSError) and found.strerror:
            return found.strerror
        seen.add(id(found))
        nested = (found.__cause__, found.__context__, getattr(found, "reason", None), *found.args)
        queue += [e for e in nested if isinstance(e, BaseException) and id(e) not in seen]
    return str(error).rsplit(": ", 1)[-1].strip("()'\" ") or type(error).__name__


def _errors() -> tuple[type[Exception], ...]:
    """What a request to the engine may raise (the API's errors, a connection lost or timed out); nothing without
    the SDK, so that ``client()``'s line about it is what the caller sees."""
    try:
        from docker.errors import DockerException
        from requests.exceptions import RequestException
    except ImportError:
        return ()
    return (DockerException, RequestException)


def inspect(name: str) -> dict | None:
    """The container's Engine API record (``State``, ``HostConfig``...), None when there is none."""
    try:
        return client().api.inspect_container(name)
    except _errors():
        return None


def has_image(reference: str) -> bool:
    """The engine holds the image."""
    try:
        client().images.get(reference)
        return True
    except _errors():
        return False


def running(name: str) -> bool:
    """The container runs, or Docker is restarting it."""
    state = (inspect(name) or {}).get("State", {})
    return bool(state.get("Running") or state.get("Restarting"))


def start(name: str) -> bool:
    """Start the container; False when the engine refused."""
    try:
        client().api.start(name)
        return True
    except _errors():
        return False


def stop(name: str, timeout: float) -> bool:
    """Stop the container (``docker stop``: TERM, then KILL after ``timeout`` seconds); False when the engine
    refused."""
    try:
        client(timeout=timeout + 60).api.stop(name, timeout=int(timeout))
        return True
    except _errors():
        return False


def wait(names: list[str], timeout: float) -> None:
    """Wait, at most ``timeout`` seconds in all, until every container of ``names`` has stopped."""
    deadline = time.monotonic() + timeout
    engine = client()
    for name in names:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        with contextlib.suppress(*_errors()):
            engine.api.wait(name, timeout=left)


def project_objects(project: str) -> list[tuple[str, str]]:
    """(kind, name) of every container, network and volume that carries the compose label of ``project``."""
    filters = {"label": f"com.docker.compose.project={project}"}
    engine = client()
    found = [("container", name) for name in _listed(engine, filters)]
    found += [("network", n.name) for n in engine.networks.list(filters=filters)]
    return found + [("volume", v.name) for v in engine.volumes.list(filters=filters)]


def project_containers(project: str) -> dict[str, str]:
    """Every container of compose project ``project`` and the engine's state of it (running, exited, ...), by name."""
    filters = {"label": f"com.docker.compose.project={project}"}
    return dict(sorted(_listed(client(), filters).items()))


def _listed(engine, filters: dict) -> dict[str, str]:
    """The state (running, exited, ...) of every container that ``filters`` match, by name, from one request: the
    engine's list, with nothing read per container (a container removed in between made that read fail)."""
    return {c["Names"][0].lstrip("/"): c["State"] for c in engine.api.containers(all=True, filters=filters)}


def copy_out(name: str, folder: str, destination: Path) -> bool:
    """Copy what ``folder`` of the container holds into ``destination`` (as ``docker cp NAME:FOLDER/. DEST``);
    False when the container or the folder is missing."""
    try:
        chunks, _ = client(timeout=300).api.get_archive(name, folder)
        with tempfile.TemporaryFile() as archive:
            for chunk in chunks:
                archive.write(chunk)
            archive.seek(0)
            with tarfile.open(fileobj=archive) as tar:
                members = []
                for member in tar.getmembers():
                    _, _, inside = member.name.partition("/")  # the archive holds FOLDER's own name first
                    if inside:
                        member.name = inside
                        members.append(member)
                tar.extractall(destination, members=members, filter="data")
        return True
    except (*_errors(), tarfile.TarError, OSError):
        return False


def lines(name: str, since: float, stop: threading.Event, follow: bool, stderr: bool = False) -> Iterator[str]:
    """The container's standard output (and standard error with ``stderr``) from ``since``, one line at a time,
    each after its time stamp (``2026-11-27T10:00:00.123456789Z line``); one that follows ends when the container
    stops or once ``stop`` is set, so that no reader outlives the job."""
    try:
        stream = client().api.logs(name, stdout=True, stderr=stderr, stream=True, follow=follow, timestamps=True,
                                   since=round(since, 3))  # fmt: skip
    except _errors():
        return
    yield from _split(_closed_by(stop, stream) if follow else _read(stream))


def container_events(project: str, since: float, stop: threading.Event, actions: tuple[str, ...]) -> Iterator[dict]:
    """The engine's events of ``project``'s containers from ``since`` whose action is one of ``actions`` (``kill``,
    ``die``), as the Engine API gives them, until ``stop`` is set."""
    filters = {"label": f"com.docker.compose.project={project}", "type": "container", "event": list(actions)}
    try:
        stream = client().events(since=f"{since:.3f}", filters=filters, decode=True)
    except _errors():
        return
    yield from _closed_by(stop, stream)


def _closed_by(stop: threading.Event, stream: Any) -> Iterator[Any]:
    """The items of an SDK stream, the stream closed once ``stop`` is set (a blocked read then ends)."""
    done = threading.Event()

    def close() -> None:
        while not done.is_set():
            if stop.wait(0.5):
                with contextlib.suppress(Exception):
                    stream.close()
                return

    threading.Thread(target=close, daemon=True).start()
    try:
        with contextlib.suppress(*_errors()):
            yield from stream
    finally:
        done.set()
        with contextlib.suppress(Exception):
            stream.close()


def _read(stream: Any) -> Iterator[Any]:
    """The items of an SDK stream that ends by itself; the stream closed after."""
    try:
        with contextlib.suppress(*_errors()):
            yield from stream
    finally:
        with contextlib.suppress(Exception):
            stream.close()


def _split(chunks: Iterator[bytes]) -> Iterator[str]:
    """Lines out of the chunks of a log stream (a chunk holds what one write wrote: part of a line, or several)."""
    rest = b""
    for chunk in chunks:
        *whole, rest = (rest + chunk).split(b"\n")
        for line in whole:
            yield line.decode(errors="replace")
    if rest:
        yield rest.decode(errors="replace")
