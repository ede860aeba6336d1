"""What rank 0 shows and keeps: a progress bar on a terminal, one line per epoch, metrics.jsonl,
summary.json and TensorBoard scalars (``scalars``).

Every other rank gets a Reporter that does nothing, so the trainer never asks who prints. The bar
is tqdm's, drawn only when stdout is a terminal: a log file or a pipe gets the lines alone, with
no carriage returns or escape codes.
"""

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Self, TextIO

import torch
from tqdm import tqdm

from app import events, progress
from app.atomic import atomic_write_text
from app.train import scalars
from app.train.config import OutputConfig

if TYPE_CHECKING:
    from app.train.resize import Resize
    from app.train.trainer import Trainer

LOSS_INTERVAL_S = 0.5
"""How often the bar reads the loss (reading it waits for the device)."""


def exchanges(out: Path) -> list[dict]:
    """The exchanges of step times in ``out``/metrics.jsonl (its ``ranks`` records, in order): none when it is
    missing or a line does not read."""
    try:
        lines = (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        with contextlib.suppress(ValueError):
            if (record := json.loads(line)).get("event") == "ranks":
                found.append(record)
    return found


class EpochBar:
    """tqdm's bar over the micro-batches of one epoch, with the loss; does nothing when ``stream`` is None."""

    def __init__(self, stream: TextIO | None, label: str, done: int, total: int) -> None:
        self._bar = tqdm(
            total=total, initial=done, desc=label, unit="batch", file=stream, leave=False, disable=stream is None
        )
        self._loss_due = 0.0

    def advance(self, loss: torch.Tensor) -> None:
        """One more micro-batch done; ``loss`` is its (detached) loss."""
        if self._bar.disable:
            return
        now = time.monotonic()
        if now >= self._loss_due:
            self._loss_due = now + LOSS_INTERVAL_S
            self._bar.set_postfix_str(f"loss {loss.item():.4f}", refresh=False)
        self._bar.update()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()  # leave=False: the bar's line is cleared for the epoch's summary line


class Reporter:
    """Output of global rank 0 (``enabled``); silent elsewhere. Close it (or use ``with``) to flush TensorBoard."""

    def __init__(
        self,
        out: Path,
        enabled: bool,
        quiet: bool = False,
        stream: TextIO | None = None,
        tensorboard: bool = False,
        tensorboard_every: int = 0,
    ) -> None:
        self.out, self.enabled, self.quiet = Path(out), enabled, quiet
        self.stream = stream or sys.stdout
        self.tty = enabled and not quiet and self.stream.isatty()
        self.tensorboard, self.tensorboard_every = enabled and tensorboard, tensorboard_every
        self.scalars: scalars.Scalars | None = None
        self._metrics: TextIO | None = None
        """OUT/metrics.jsonl, open from the first record to ``close``."""

    @classmethod
    def of(cls, cfg: OutputConfig, enabled: bool) -> "Reporter":
        """The reporter that ``cfg`` asks for, on rank 0 (``enabled``) or any other rank."""
        return cls(cfg.out, enabled, cfg.quiet, tensorboard=cfg.tensorboard, tensorboard_every=cfg.tensorboard_every)

    def _print(self, line: str) -> None:
        if self.enabled and not self.quiet:
            print(line, file=self.stream, flush=True)

    def _append(self, record: dict) -> None:
        """One line of metrics.jsonl: the file stays open (line-buffered: each record is one write, seen at once)."""
        if not self.enabled:
            return
        if self._metrics is None:
            self.out.mkdir(parents=True, exist_ok=True)
            self._metrics = open(self.out / "metrics.jsonl", "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        self._metrics.write(json.dumps(record) + "\n")

    def event(self, kind: str, **fields) -> None:
        """A record in metrics.jsonl, such as a resume or a checkpoint (and in the job's events, for those that
        the host reads: ``events.TRAINING_FACTS``)."""
        self._append({"event": kind, "time": round(time.time(), 3), **fields})
        if self.enabled and kind in events.TRAINING_FACTS:
            events.write(kind, 0, **fields)

    def start(self, fields: dict, banner: str, step: int) -> None:
        """A run begins (or resumes at optimizer step ``step``): its record, its banner, its TensorBoard file."""
        board = None
        if self.tensorboard:
            self.scalars = scalars.open_scalars(self.out, step)
            board = str(self.scalars.folder) if self.scalars else scalars.NOT_INSTALLED
        self.event("start", **fields, tensorboard=board)
        self._print(banner)
        if board:
            self._print(f"tensorboard: {board}")

    def resumed(self, resumed: progress.Resumed, restart_count: int) -> None:
        """The run starts again after an earlier attempt: where from, and the steps that attempt's failure lost
        (printed even with --quiet: ``python -m app cluster`` reports each restart from this line)."""
        self.event("resume", **resumed.record(), restart_count=restart_count)
        if self.enabled:
            fields = {"from_step": resumed.step, "checkpoint": resumed.checkpoint, "reached": resumed.reached}
            events.write(events.RESUMED, 0, **fields)
            print(resumed.line(), file=self.stream, flush=True)

    def resize(self, change: "Resize", batch_size: int) -> None:
        """The run continues on another number of ranks: one line (even with --quiet) and a ``resize`` record."""
        self.event("resize", **change.record())
        if self.enabled:
            print(change.line(batch_size), file=self.stream, flush=True)

    def ranks(self, record: dict, line: str | None) -> None:
        """An exchange of step times: its record in metrics.jsonl; the straggler's line, if any, on the console."""
        self.event("ranks", **record)
        if line:
            self._print(line)

    def bar(self, epoch: int, epochs: int, done: int, total: int) -> EpochBar:
        """The progress bar of ``epoch`` from micro-batch ``done`` of ``total`` (terminals only)."""
        return EpochBar(self.stream if self.tty else None, f"epoch {epoch + 1}/{epochs}", done, total)

    def after_step(self, trainer: "Trainer", step: int) -> None:
        """A step hook: rank 0's training loss into TensorBoard every ``tensorboard_every`` optimizer steps."""
        if self.scalars is not None and self.tensorboard_every and step % self.tensorboard_every == 0:
            self.scalars.step_loss(step, trainer.last_loss)

    def epoch(self, record: dict) -> None:
        """One summary line per epoch, its record in metrics.jsonl, and its TensorBoard scalars."""
        self._append({"event": "epoch", **record})
        self._print(format_epoch(record))
        if self.scalars is not None:
            self.scalars.epoch(record)

    def finish(self, summary: dict) -> None:
        """Write summary.json atomically and print its one-line form (even with --quiet)."""
        self.close()
        if not self.enabled:
            return
        atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2) + "\n")
        self.event("end", **{k: summary[k] for k in ("step", "test_accuracy", "params_identical")})
        print(format_summary(summary), file=self.stream, flush=True)

    def close(self) -> None:
        """Flush and close the TensorBoard file and metrics.jsonl, if open."""
        if self.scalars is not None:
            self.scalars.close()
            self.scalars = None
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def format_epoch(r: dict) -> str:
    return (
        f"epoch {r['epoch'] + 1}/{r['epochs']}  train loss {r['train_loss']:.4f}  "
        f"test loss {r['test_loss']:.4f}  acc {100 * r['test_accuracy']:.2f}% "
        f"({r['test_correct']}/{r['test_samples']})  {r['samples_per_s']:.0f} samples/s  "
        f"step {r['step_ms']:.2f} ms{format_mfu(r)}"
    )


def format_mfu(r: dict) -> str:
    """``  12.3 TFLOP/s per GPU, MFU 1.2% of 989 (data sheet (H100))`` when ``r`` has them (CUDA), else ''."""
    if "mfu" not in r:
        return ""
    return (
        f"  {_figure(r['tflops_per_gpu'])} TFLOP/s per GPU, MFU {_figure(100 * r['mfu'])}% of "
        f"{r['peak_tflops']:.0f} ({r['peak_source']})"
    )


def _figure(value: float) -> str:
    """One decimal, or two significant digits below 1 (the seed's MLP makes 0.047 TFLOP/s on an H200, not 0.0)."""
    return f"{value:.1f}" if value >= 1 else f"{value:.2g}"


def format_summary(s: dict) -> str:
    same = "identical on all ranks" if s["params_identical"] else f"DIFFER across ranks (max {s['param_spread']:g})"
    steady = s.get("steady_samples_per_s")
    rate = f"{s['samples_per_s']:.0f} samples/s" + (f" (steady {steady:.0f} after the first epoch)" if steady else "")
    epochs = f"{s['epochs_completed']} epoch" + ("" if s["epochs_completed"] == 1 else "s")
    return (
        f"done: {s['step']} steps, {epochs}, test acc {100 * s['test_accuracy']:.2f}%, "
        f"{rate}{format_mfu(s)}, params {same}; summary in {s['summary_path']}"
    )
