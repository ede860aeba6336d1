"""Write or remove a file so that readers see the old content or the new, never half of it."""

import os
import tempfile
from pathlib import Path

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once, at import (one thread): the mode a plain open() would give, not mkstemp's 0600
FILE_MODE = 0o666 & ~_UMASK


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to a temp file beside ``path``, fsync it, rename it over ``path``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sync_folder(target.parent)
    return target


def atomic_remove(path: str | os.PathLike) -> None:
    """Remove ``path`` (one unlink: readers see the file whole or not at all) and make its absence durable."""
    target = Path(path)
    target.unlink()
    _sync_folder(target.parent)


def _sync_folder(folder: Path) -> None:
    """fsync ``folder``: an entry renamed into it or removed from it stays so after a crash."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Text version of atomic_write_bytes (UTF-8)."""
    return atomic_write_bytes(path, text.encode("utf-8"))
