"""Checkpoint files: written atomically by global rank 0, read back with ``weights_only=True``.

Layout: ``OUT/checkpoints/step-00000120.pt``; the highest step is the latest. A checkpoint holds
the model, optimizer and GradScaler states, the epoch, the batch within it and the optimizer step
(the sampler position), each rank's RNG state, and the identity of the run (model, dataset, sample
shape, classes) that a resume must match. Nothing here overwrites another run's checkpoints: a
new run refuses an out folder that already has some unless it resumes from the latest.
"""

import errno
import io
import os
import re
import shutil
from pathlib import Path

import torch

from app import events
from app.atomic import atomic_write_bytes
from app.errors import ClusterError, UsageError, clip, first_line

FORMAT = 1
"""Version of the checkpoint layout; bumped when the keys change."""
SUBDIR = "checkpoints"
_NAME = re.compile(r"^step-(\d{8})\.pt$")


def directory(out: Path) -> Path:
    return Path(out) / SUBDIR


def path_for(out: Path, step: int) -> Path:
    return directory(out) / f"step-{step:08d}.pt"


def existing(out: Path) -> list[Path]:
    """Checkpoints in ``out``, oldest first (temp files of interrupted writes are ignored)."""
    folder = directory(out)
    if not folder.is_dir():
        return []
    found = [(int(m[1]), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def resolve_resume(out: Path, resume: str) -> Path | None:
    """The checkpoint to resume from (None: start fresh), refusing to overwrite another run."""
    found = existing(out)
    if resume == "none":
        if found:
            raise UsageError(
                f"{directory(out)} already holds checkpoints (latest {found[-1].name}): "
                "pass --resume auto to continue that run, or choose another --out"
            )
        return None
    if resume == "auto":
        return found[-1] if found else None
    chosen = Path(resume)
    if found and chosen.resolve() != found[-1].resolve():
        raise UsageError(
            f"--resume {resume} is not the latest checkpoint in {directory(out)} ({found[-1].name}); "
            "resuming from it would overwrite newer ones: choose another --out"
        )
    return chosen


def newest_that_loads(out: Path) -> tuple[Path, dict, list[str]] | None:
    """``--resume auto``: the newest checkpoint in ``out`` that loads, its state, and one line for each newer one
    that does not (torn by a crash, a disk that filled), which is skipped; None when there is none at all."""
    skipped = []
    for path in reversed(existing(out)):
        try:
            return path, load(path), skipped
        except UsageError as error:
            skipped.append(f"train: skipped {error}".split(": move it away")[0] + "; the one before it is taken")
    if skipped:
        raise UsageError(f"no checkpoint in {directory(out)} loads ({skipped[0].removeprefix('train: skipped ')}); "
                         "move them away or choose another --out")  # fmt: skip
    return None


def ensure_writable(out: Path) -> None:
    """Create ``out``/checkpoints and prove a file can be written there (UsageError if not)."""
    try:
        directory(out).mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(directory(out) / ".write-test", b"")
        (directory(out) / ".write-test").unlink()
    except OSError as error:
        raise UsageError(f"cannot write to --out {out} ({error.strerror or error}): choose a writable folder") from None


def ensure_space(out: Path, latest: Path) -> None:
    """Refuse to resume when ``out`` has no room for one more checkpoint the size of ``latest``.

    A job restarted into a full disk would train up to its next checkpoint and fail there again,
    each time losing that work; it fails here at once instead, before training.
    """
    try:
        need, free = latest.stat().st_size, shutil.disk_usage(directory(out)).free
    except OSError:
        return  # load() reports a missing checkpoint
    if free < need:
        raise ClusterError(
            f"cannot resume in {out}: {free / 2**20:.1f} MiB free, a checkpoint takes {need / 2**20:.1f} MiB "
            f"({os.strerror(errno.ENOSPC)}): free some space and run the job again; {latest.name} is intact",
            reason=events.NO_SPACE,
        )


def encode(state: dict) -> bytes:
    """A checkpoint file's bytes: ``state`` with the format's version."""
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, **state}, buffer)
    return buffer.getvalue()


def save(out: Path, state: dict, step: int, keep: int) -> Path:
    """Write ``state`` as step ``step`` (temp file, fsync, rename), then keep only the ``keep`` newest."""
    try:
        target = atomic_write_bytes(path_for(out, step), encode(state))
    except OSError as error:
        raise ClusterError(
            f"could not write checkpoint {path_for(out, step)} ({error.strerror or error}): "
            "free some space or choose another --out; the earlier checkpoints are intact",
            reason=events.NO_SPACE if error.errno in (errno.ENOSPC, errno.EDQUOT) else "",
        ) from None
    for old in existing(out)[:-keep]:
        old.unlink(missing_ok=True)
    return target


def load(path: Path) -> dict:
    """Read a checkpoint (tensors only, no code); a corrupt or foreign file is a UsageError."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a truncated or foreign file
        reason = clip(first_line(error).split(". ")[0], 160)
        raise UsageError(
            f"checkpoint {path} is unreadable ({reason}): move it away (--resume auto skips it and takes the one "
            "before it) or choose another --out"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UsageError(
            f"checkpoint {path} is not a ddp-cluster checkpoint of format {FORMAT}: "
            "choose another --out or --resume file"
        )
    return state


def check_identity(path: Path, saved: dict, wanted: dict) -> None:
    """Raise UsageError when the checkpoint was made by a different kind of run."""
    for key, value in wanted.items():
        have = saved.get(key)
        if have != value:
            raise UsageError(
                f"checkpoint {path} was made with {key} {have!r}, this run has {value!r}: "
                f"pass the same --{key.replace('_', '-')} or choose another --out"
            )
