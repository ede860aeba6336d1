"""Where a training step's time goes, measured on the ranks of one group: compute, the gradient
all-reduce inside the step, and a bare all-reduce of the same bytes.

    timer = CommTimer(ctx.device)
    trainer = Trainer(cfg, ctx, data, reporter, wrap_comm_hook=timer.wrap)
    times = time_steps(trainer, timer, rounds=5)          # StepTimes, the slowest rank's medians
    bare = time_allreduce(ctx, [nbytes, ...], rounds=5)   # seconds of one all_reduce of each size

The method, each figure the median over rounds (a round is one epoch of ``Trainer.train_epoch``)
of its mean per step, then the slowest rank's:

- step: a synced epoch's time over its optimizer steps (loader, forward, backward with DDP's
  gradient all-reduce, optimizer), as ``app train`` runs them.
- compute: the same steps under DDP's ``no_sync()``: no gradient communication at all (each rank
  then steps on its own gradients; only the time counts). Synced and no_sync epochs alternate, so
  a busy machine slows both alike.
- comm: per step, the time from each gradient bucket's hook call to the completion of its future,
  summed over buckets (``CommTimer`` wraps the configured comm hook; ``none`` becomes DDP's
  all-reduce as a Python hook): the all-reduce as it runs inside the step, hidden behind backward
  or not; with PowerSGD it includes the compression's matrix products.
- exposed communication = step - compute: what the gradients' travel adds to a step.
- bare all-reduce: ``dist.all_reduce`` of S bytes on the group alone, repeated between barriers.

On GPUs the device is synchronised around each timed epoch and all-reduce batch, and the hook's
spans are CUDA events (its futures complete when the work is queued, not done).
"""

import functools
import statistics
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from app.platform.distributed import DistContext
from app.train import collective
from app.train.comm_hooks import Hook
from app.train.trainer import Trainer

BARE_REPEATS = 10
"""All-reduces per timed batch of the bare all-reduce."""


def gradient_bytes(model: nn.Module) -> int:
    """S: the bytes of one step's gradients (every trainable parameter, in its dtype)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class CommTimer:
    """Times the gradient buckets' communication: ``wrap`` the comm hook, ``take`` the spans so far."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._spans: list[tuple[int, object, object]] = []

    def _stamp(self) -> object:
        if self.device.type != "cuda":
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def wrap(self, hook: Hook) -> Hook:
        """``hook``, timed: the span from its call to its future's completion, per bucket."""

        @functools.wraps(hook)  # keeps the name: DDP's own checks (bf16) see the hook they know
        def timed(state, bucket):
            index, start = bucket.index(), self._stamp()

            def done(fut: torch.futures.Future) -> torch.Tensor:
                self._spans.append((index, start, self._stamp()))
                return fut.value()

            return hook(state, bucket).then(done)

        return timed

    def take(self) -> tuple[float, int]:
        """(seconds of all spans since the last take, buckets seen), and start afresh."""
        spans, self._spans = self._spans, []
        if self.device.type == "cuda":
            _synchronize(self.device)
            seconds = sum(start.elapsed_time(end) / 1000 for _, start, end in spans)  # type: ignore[attr-defined]
        else:
            seconds = sum(end - start for _, start, end in spans)  # type: ignore[operator]
        return seconds, len({index for index, _, _ in spans})


@dataclass(frozen=True)
class StepTimes:
    """Seconds per optimizer step on one group of ranks (the slowest rank's medians)."""

    step: float
    compute: float
    """The step without gradient communication (no_sync)."""
    comm: float
    """The gradient buckets' hook spans within a step."""
    buckets: int
    """Gradient buckets per step."""
    steps: int
    """Optimizer steps per timed round."""

    @property
    def exposed(self) -> float:
        """What communication adds to a step: step - compute (>= 0)."""
        return max(0.0, self.step - self.compute)


def _epoch(trainer: Trainer, sync: bool) -> tuple[float, int]:
    """One epoch, synced or under no_sync: (seconds, optimizer steps)."""
    _synchronize(trainer.ctx.device)
    start = time.perf_counter()
    with nullcontext() if sync else trainer.no_sync():
        stats = trainer.train_epoch()
    _synchronize(trainer.ctx.device)
    return time.perf_counter() - start, stats.steps


def warm_up(trainer: Trainer, synced_steps: int) -> None:
    """Synced epochs until ``synced_steps`` steps are done (DDP rebuilds its buckets; PowerSGD starts), one no_sync."""
    while trainer.pos.step < synced_steps:
        _epoch(trainer, sync=True)
    _epoch(trainer, sync=False)


def time_steps(trainer: Trainer, timer: CommTimer, rounds: int) -> StepTimes:
    """Alternate synced and no_sync epochs ``rounds`` times; the slowest rank's medians per step."""
    step, compute, comm, buckets = [], [], [], 0
    timer.take()
    for _ in range(rounds):
        seconds, steps = _epoch(trainer, sync=True)
        spans, buckets = timer.take()
        step.append(seconds / steps)
        comm.append(spans / steps)
        seconds, steps = _epoch(trainer, sync=False)
        compute.append(seconds / steps)
    mine = [statistics.median(step), statistics.median(compute), statistics.median(comm), buckets]
    slowest = collective.all_reduce(mine, trainer.ctx.device, "max", trainer.ctx.group)
    return StepTimes(*slowest[:3], buckets=int(slowest[3]), steps=steps)


def time_allreduce(ctx: DistContext, sizes: Sequence[int], rounds: int) -> dict[int, float]:
    """Seconds of one ``all_reduce`` of each size in bytes (float32) on the group: the slowest rank's medians."""
    found = {}
    for nbytes in sizes:
        tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=ctx.device)
        for _ in range(2):
            dist.all_reduce(tensor, group=ctx.group)
        per_round = []
        for _ in range(rounds):
            dist.barrier(group=ctx.group)
            _synchronize(ctx.device)
            start = time.perf_counter()
            for _ in range(BARE_REPEATS):
                dist.all_reduce(tensor, group=ctx.group)
            _synchronize(ctx.device)
            per_round.append((time.perf_counter() - start) / BARE_REPEATS)
        (found[nbytes],) = collective.all_reduce([statistics.median(per_round)], ctx.device, "max", ctx.group)
    return found
