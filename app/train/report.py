"""What rank 0 shows and keeps: a progress bar on a terminal, one line per epoch, metrics.jsonl, summary.json.

Every other rank gets a Reporter that does nothing, so the trainer never asks who prints.
"""

import json
import sys
import time
from pathlib import Path
from typing import TextIO

from app.atomic import atomic_write_text

BAR_WIDTH = 24


class Reporter:
    """Output of global rank 0 (``enabled``); silent elsewhere."""

    def __init__(self, out: Path, enabled: bool, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.out, self.enabled, self.quiet = Path(out), enabled, quiet
        self.stream = stream or sys.stdout
        self.tty = enabled and not quiet and self.stream.isatty()
        self._last_bar = 0.0

    def _print(self, line: str) -> None:
        if self.enabled and not self.quiet:
            if self.tty:
                self.stream.write("\r\033[K")
            print(line, file=self.stream, flush=True)

    def _append(self, record: dict) -> None:
        if self.enabled:
            self.out.mkdir(parents=True, exist_ok=True)
            with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")

    def line(self, text: str) -> None:
        """A line for the user (not kept)."""
        self._print(text)

    def event(self, kind: str, **fields) -> None:
        """A record in metrics.jsonl, such as a resume or a checkpoint."""
        self._append({"event": kind, "time": round(time.time(), 3), **fields})

    def progress(self, epoch: int, epochs: int, done: int, total: int, loss: float | None) -> None:
        """Redraw the progress bar (terminals only, at most 10 times a second)."""
        now = time.monotonic()
        if not self.tty or (now - self._last_bar < 0.1 and done < total):
            return
        self._last_bar = now
        filled = BAR_WIDTH * done // max(total, 1)
        loss_text = f" loss {loss:.4f}" if loss is not None else ""
        self.stream.write(
            f"\r\033[Kepoch {epoch + 1}/{epochs} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total}{loss_text}"
        )
        self.stream.flush()

    def epoch(self, record: dict) -> None:
        """One summary line per epoch, and its record in metrics.jsonl."""
        self._append({"event": "epoch", **record})
        self._print(format_epoch(record))

    def finish(self, summary: dict) -> None:
        """Write summary.json atomically and print its one-line form (even with --quiet)."""
        if not self.enabled:
            return
        atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2) + "\n")
        self._append({"event": "end", **{k: summary[k] for k in ("step", "test_accuracy", "params_identical")}})
        if self.tty:
            self.stream.write("\r\033[K")
        print(format_summary(summary), file=self.stream, flush=True)


def format_epoch(r: dict) -> str:
    return (
        f"epoch {r['epoch'] + 1}/{r['epochs']}  train loss {r['train_loss']:.4f}  "
        f"test loss {r['test_loss']:.4f}  acc {100 * r['test_accuracy']:.2f}% "
        f"({r['test_correct']}/{r['test_samples']})  {r['samples_per_s']:.0f} samples/s  "
        f"step {r['step_ms']:.2f} ms"
    )


def format_summary(s: dict) -> str:
    same = "identical on all ranks" if s["params_identical"] else f"DIFFER across ranks (max {s['param_spread']:g})"
    return (
        f"done: {s['step']} steps, {s['epochs_completed']} epochs, test acc {100 * s['test_accuracy']:.2f}%, "
        f"{s['samples_per_s']:.0f} samples/s, params {same}; summary in {s['summary_path']}"
    )
