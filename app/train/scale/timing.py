"""Where a training step's time goes, measured on the ranks of one group: compute, the gradient
all-reduce inside the step, and a bare all-reduce of the same bytes.

    timer = CommTimer(ctx.device)
    clock = StepClock(Trainer(cfg, ctx, data, reporter, wrap_comm_hook=timer.wrap), timer)
    clock.warm_up(synced_steps=3)
    for _ in range(5):
        clock.round()                                      # (alternating with other clocks' rounds)
    times = clock.result()                                 # StepTimes: the slowest rank's medians
    bare = time_allreduce(ctx, [nbytes, ...], rounds=5)    # seconds of one all_reduce of each size

The method, each figure the median over rounds (a round is one epoch of ``Trainer.train_epoch``)
of its mean per step, the slowest rank's:

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

from app.diagnostics.collectives import synchronize
from app.runtime.distributed import DistContext
from app.train import sync
from app.train.comm_hooks import Hook
from app.train.trainer import Trainer

BARE_REPEATS = 10
"""All-reduces per timed batch of the bare all-reduce."""


def gradient_bytes(model: nn.Module) -> int:
    """S: the bytes of one step's gradients (every trainable parameter, in its dtype)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


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
            synchronize(self.device)
            seconds = sum(start.elapsed_time(end) / 1000 for _, start, end in spans)  # type: ignore[attr-defined]
        else:
            seconds = sum(end - start for _, start, end in spans)  # type: ignore[operator]
        return seconds, len({index for index, _, _ in spans})


@dataclass(frozen=True)
class StepTimes:
    """Seconds per optimizer step on one group of ranks (the slowest rank's, medians over rounds)."""

    step: float
    compute: float
    """The step without gradient communication (no_sync)."""
    comm: float
    """The gradient buckets' hook spans within a step."""
    buckets: int
    """Gradient buckets per step."""
    steps: int
    """Optimizer steps per timed round."""
    rounds: list[float]
    """The step time of each round (the slowest rank's), in order: for ratios between runs of the same round."""


def _epoch(trainer: Trainer, sync: bool) -> tuple[float, int]:
    """One epoch, synced or under no_sync: (seconds, optimizer steps)."""
    synchronize(trainer.ctx.device)
    start = time.perf_counter()
    with nullcontext() if sync else trainer.no_sync():
        stats = trainer.train_epoch()
    synchronize(trainer.ctx.device)
    return time.perf_counter() - start, stats.steps


class StepClock:
    """Times a Trainer round by round (a synced epoch, then one under no_sync); ``result``: the figures.

    Several clocks take their rounds in turn (``app scale`` alternates world sizes and variants),
    so that a busy machine slows them alike.
    """

    def __init__(self, trainer: Trainer, timer: CommTimer) -> None:
        self.trainer, self.timer = trainer, timer
        self._step: list[float] = []
        self._compute: list[float] = []
        self._comm: list[float] = []
        self._buckets = self._steps = 0

    def warm_up(self, synced_steps: int) -> None:
        """Synced epochs until ``synced_steps`` steps are done (DDP rebuilds buckets, PowerSGD starts), one no_sync."""
        while self.trainer.pos.step < synced_steps:
            _epoch(self.trainer, sync=True)
        _epoch(self.trainer, sync=False)
        self.timer.take()

    def round(self) -> None:
        """One timed round."""
        seconds, self._steps = _epoch(self.trainer, sync=True)
        spans, self._buckets = self.timer.take()
        self._step.append(seconds / self._steps)
        self._comm.append(spans / self._steps)
        seconds, steps = _epoch(self.trainer, sync=False)
        self._compute.append(seconds / steps)

    def result(self) -> StepTimes:
        """The slowest rank's figures (a collective on the trainer's group)."""
        mine = [*self._step, statistics.median(self._compute), statistics.median(self._comm), self._buckets]
        slowest = sync.all_reduce(mine, self.trainer.ctx.device, "max", self.trainer.ctx.group)
        n = len(self._step)
        per_round = slowest[:n]
        return StepTimes(
            step=statistics.median(per_round),
            compute=slowest[n],
            comm=slowest[n + 1],
            buckets=int(slowest[n + 2]),
            steps=self._steps,
            rounds=per_round,
        )


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
            synchronize(ctx.device)
            start = time.perf_counter()
            for _ in range(BARE_REPEATS):
                dist.all_reduce(tensor, group=ctx.group)
            synchronize(ctx.device)
            per_round.append((time.perf_counter() - start) / BARE_REPEATS)
        (found[nbytes],) = sync.all_reduce([statistics.median(per_round)], ctx.device, "max", ctx.group)
    return found
