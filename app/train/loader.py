"""Batches for one rank: DistributedSampler's order, resumable at any batch of an epoch.

``memory`` (default) indexes whole batches from the in-memory tensors (no per-sample collation);
``dataloader`` is torch's DataLoader over a TensorDataset with the same indices as its sampler,
worker processes and pinned memory on GPU. Both give the same samples in the same order.

The order is DistributedSampler's: one shuffle of the whole set per epoch (its generator, seeded
with seed + epoch, whatever the world size), padded with its first samples, dealt out round robin
(rank r takes positions r, r + W, ...). Here the padding fills the last *global* batch (per-rank
batch x ranks x accumulation) rather than the last round of W: then optimizer step s of an epoch
takes exactly positions [s G, (s + 1) G) of the shuffle, on any number of ranks that keeps the
global batch G (4 ranks x 64 or 2 ranks x 64 x accum 2), and every micro-batch is full. With a
global batch of W this is DistributedSampler's own output.
"""

import itertools
import math
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from app.train.data import Split

Batch = tuple[torch.Tensor, torch.Tensor]


def epoch_order(n: int, seed: int, epoch: int, global_batch: int = 1) -> torch.Tensor:
    """The epoch's shuffle of ``n`` samples (DistributedSampler's), padded to a multiple of ``global_batch``."""
    sampler = DistributedSampler(range(n), num_replicas=1, rank=0, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    order = torch.tensor(list(sampler), dtype=torch.int64)
    total = math.ceil(n / global_batch) * global_batch
    return order.repeat(math.ceil(total / n))[:total]


def rank_indices(n: int, rank: int, world: int, seed: int, epoch: int, global_batch: int | None = None) -> torch.Tensor:
    """The sample indices ``rank`` takes in ``epoch``, in order (``global_batch`` defaults to ``world``:
    DistributedSampler's own)."""
    return epoch_order(n, seed, epoch, global_batch or world)[rank::world]


def eval_indices(n: int, rank: int, world: int) -> torch.Tensor:
    """This rank's share of an evaluation set: every sample on exactly one rank, no padding."""
    return torch.arange(n, dtype=torch.int64)[rank::world]


class TrainLoader:
    """The training batches of one rank, epoch by epoch."""

    def __init__(
        self,
        split: Split,
        rank: int,
        world: int,
        batch_size: int,
        seed: int,
        device: torch.device,
        kind: str = "memory",
        workers: int = 0,
        accum_steps: int = 1,
    ) -> None:
        self.rank, self.world, self.batch_size, self.seed = rank, world, batch_size, seed
        self.device, self.kind, self.workers = device, kind, workers
        self.split = split if kind == "dataloader" else Split(split.x.to(device), split.y.to(device))
        self.global_batch = batch_size * world * accum_steps
        """Samples per optimizer step; the epoch is padded to a whole number of them."""
        self.samples_per_rank = math.ceil(len(split) / self.global_batch) * self.global_batch // world

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return math.ceil(self.samples_per_rank / self.batch_size)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The batches of ``epoch`` from batch number ``start`` on."""
        if self.kind == "dataloader":
            return itertools.islice(self._dataloader(epoch), start, None)
        return self._memory(epoch, start)

    def order(self, epoch: int) -> torch.Tensor:
        """This rank's sample indices in ``epoch``."""
        return rank_indices(len(self.split), self.rank, self.world, self.seed, epoch, self.global_batch)

    def _memory(self, epoch: int, start: int) -> Iterator[Batch]:
        order = self.order(epoch).to(self.device)
        for i in range(start, len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield self.split.x.index_select(0, idx), self.split.y.index_select(0, idx)

    def _dataloader(self, epoch: int) -> Iterator[Batch]:
        dataset = TensorDataset(self.split.x, self.split.y)
        pin = self.device.type == "cuda"
        sampler = self.order(epoch).tolist()
        loader = DataLoader(
            dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.workers, pin_memory=pin
        )
        for x, y in loader:
            yield x.to(self.device, non_blocking=pin), y.to(self.device, non_blocking=pin)


def eval_batches(split: Split, rank: int, world: int, batch_size: int, device: torch.device) -> Iterator[Batch]:
    """This rank's evaluation batches (see ``eval_indices``)."""
    idx = eval_indices(len(split), rank, world)
    for chunk in idx.split(batch_size):
        yield split.x[chunk].to(device), split.y[chunk].to(device)
