"""TensorBoard scalars of a run, written by global rank 0 into ``OUT/tensorboard/``.

Per epoch, at the optimizer step where it ended (one x-axis for every chart):
``loss/train`` (mean over all ranks' samples), ``loss/test``, ``accuracy/test``,
``speed/samples_per_s``, ``speed/step_ms`` and ``optimizer/lr``; and every ``--tensorboard-every``
optimizer steps ``loss/train_step`` (rank 0's loss of the step's last micro-batch; kept on the device
and read LOSS_BATCH at a time, at the latest at the epoch's end: reading a GPU's loss waits for the
GPU, and one wait per LOSS_BATCH points costs a tenth of one per point). A resumed run
purges what an interrupted attempt wrote after the step it resumes from, so every curve stays one
line. Written through ``torch.utils.tensorboard.SummaryWriter`` when the ``tensorboard`` package is
installed (``pip install 'ddp-cluster[tensorboard]'``); without it the run goes on without them.

    tensorboard --logdir runs/digits --host 127.0.0.1      # or: make tensorboard RUN=runs/digits
"""

from pathlib import Path

import torch

SUBDIR = "tensorboard"
EPOCH_TAGS = {
    "train_loss": "loss/train",
    "test_loss": "loss/test",
    "test_accuracy": "accuracy/test",
    "samples_per_s": "speed/samples_per_s",
    "step_ms": "speed/step_ms",
    "lr": "optimizer/lr",
}
"""Tag of each epoch record's field."""
STEP_LOSS_TAG = "loss/train_step"
LOSS_BATCH = 10
"""Step losses read from the device together (one wait for the device per batch of them)."""
NOT_INSTALLED = "off (the tensorboard package is not installed: pip install tensorboard)"


def folder(out: Path) -> Path:
    """Where a run's event files go."""
    return Path(out) / SUBDIR


class Scalars:
    """An open TensorBoard event file of one run (or of one resumed attempt, from ``first_step`` on)."""

    def __init__(self, out: Path, first_step: int, writer_class: type) -> None:
        self.folder = folder(out)
        self._writer = writer_class(log_dir=str(self.folder), purge_step=first_step or None, flush_secs=10)
        self._losses: list[tuple[int, torch.Tensor]] = []

    def epoch(self, record: dict) -> None:
        """The scalars of one epoch record (as in metrics.jsonl), flushed so that a live TensorBoard sees them."""
        self._write_losses()
        for key, tag in EPOCH_TAGS.items():
            if key in record:
                self._writer.add_scalar(tag, record[key], record["step"])
        self._writer.flush()

    def step_loss(self, step: int, loss: torch.Tensor) -> None:
        """The loss of optimizer step ``step`` (a detached scalar tensor, read later with others)."""
        self._losses.append((step, loss))
        if len(self._losses) >= LOSS_BATCH:
            self._write_losses()

    def _write_losses(self) -> None:
        if not self._losses:
            return
        values = torch.stack([loss.float() for _, loss in self._losses]).tolist()  # one wait for the device
        for (step, _), value in zip(self._losses, values, strict=True):
            self._writer.add_scalar(STEP_LOSS_TAG, value, step)
        self._losses = []

    def close(self) -> None:
        self._write_losses()
        self._writer.close()


def open_scalars(out: Path, first_step: int) -> Scalars | None:
    """Scalars for the run in ``out``, or None when the tensorboard package is not installed."""
    try:
        import tensorboard  # noqa: F401  (the package itself; torch.utils.tensorboard needs it)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return Scalars(out, first_step, SummaryWriter)
