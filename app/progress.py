"""How far a run got: the last optimizer step, kept by rank 0 in OUT/progress, and the line that a
resumed run prints about what a failure cost. Stdlib only: ``python -m app cluster`` (host side,
no torch) builds the same line from the run's ``resumed`` event (``app.events``), never by reading it.

    recorder = Recorder(out)          # rank 0; opens OUT/progress on the first step, keeps it open
    recorder.record(step)             # after every optimizer step: one pwrite, no fsync
    reached(out)                      # the step the previous attempt reached (None: no record)

Why it is cheap and why it survives: one ``pwrite`` of a fixed-width line at offset 0 of a file
that stays open is a single system call (a microsecond or two, ``python -m app bench`` shows no
difference); without fsync the step sits in the kernel's page cache, which outlives a killed
process and a killed container (their results volume is the host's file system). Only a crash
of the machine itself can lose it, and then ``reached`` reports nothing rather than a wrong step.

A resumed run prints (and writes to metrics.jsonl as a ``resume`` event):

    train: resumed from step 160 (checkpoint .../step-00000160.pt), 12 steps lost (the failed attempt reached step 172)
"""

import os
from dataclasses import dataclass
from pathlib import Path

FILE = "progress"
"""The file under OUT."""
_WIDTH = 20
"""Bytes of the record: the step right-aligned, then a newline (a fixed width: each write replaces the last)."""


def path_of(out: Path) -> Path:
    return Path(out) / FILE


class Recorder:
    """Rank 0's record of the last optimizer step reached; ``close`` it at the end."""

    def __init__(self, out: Path) -> None:
        self.path = path_of(out)
        self._fd: int | None = None

    def record(self, step: int) -> None:
        """Step ``step`` is done (the first call opens the file: OUT exists by then)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        os.pwrite(self._fd, b"%*d\n" % (_WIDTH - 1, step), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def reached(out: Path) -> int | None:
    """The last step recorded in ``out`` (by the previous attempt, read before this one records), or None."""
    try:
        text = path_of(out).read_bytes()[:_WIDTH].decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class Resumed:
    """Where a run starts again, and what the previous attempt had done beyond it."""

    step: int
    """The optimizer step it continues from (0: from the start)."""
    checkpoint: str | None
    """The checkpoint it continues from (None: no checkpoint yet, it starts over)."""
    reached: int | None
    """The last step the previous attempt completed (None: unknown); at least ``step`` once known."""

    def __post_init__(self) -> None:
        # rank 0's record lags when its node died mid-step: the survivors' snapshot holds a step it did not record
        if self.reached is not None and self.reached < self.step:
            object.__setattr__(self, "reached", self.step)

    @property
    def lost(self) -> int | None:
        """Optimizer steps done by the previous attempt that this one does again."""
        return None if self.reached is None else max(self.reached - self.step, 0)

    def line(self) -> str:
        start = (
            f"resumed from step {self.step} (checkpoint {self.checkpoint})"
            if self.checkpoint
            else f"started again from step {self.step} (no checkpoint yet)"
        )
        if not self.lost:
            return f"train: {start}" + (", no steps lost" if self.lost == 0 else "")
        plural = "s" if self.lost != 1 else ""
        return f"train: {start}, {self.lost} step{plural} lost (the failed attempt reached step {self.reached})"

    def record(self) -> dict:
        """Its fields for metrics.jsonl."""
        return {"from_step": self.step, "checkpoint": self.checkpoint, "reached": self.reached, "lost": self.lost}
