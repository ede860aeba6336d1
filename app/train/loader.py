"""Batches for one rank: DistributedSampler order, resumable at any batch of an epoch.

``memory`` (default) keeps the whole split on the rank's device (on a GPU: copied there once, so a
step makes no host-to-device copy) and indexes whole batches from it (no per-sample collation);
``dataloader`` is torch's DataLoader over a TensorDataset with the same DistributedSampler, worker
processes and pinned memory on GPU. Both give the same samples in the same order, in the memory
format the model asks for (``channels_last`` for conv models on CUDA: ``models.memory_format``).
"""

import itertools
import math
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from app.train.data import Split

Batch = tuple[torch.Tensor, torch.Tensor]


def rank_indices(n: int, rank: int, world: int, seed: int, epoch: int) -> torch.Tensor:
    """The sample indices DistributedSampler gives ``rank`` in ``epoch`` (shuffled, padded to even)."""
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    return torch.tensor(list(sampler), dtype=torch.int64)


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
        memory_format: torch.memory_format = torch.contiguous_format,
    ) -> None:
        self.rank, self.world, self.batch_size, self.seed = rank, world, batch_size, seed
        self.device, self.kind, self.workers, self.memory_format = device, kind, workers, memory_format
        self.split = split if kind == "dataloader" else on_device(split, device, memory_format)
        self.samples_per_rank = math.ceil(len(split) / world)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return math.ceil(self.samples_per_rank / self.batch_size)

    def epoch(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """The batches of ``epoch`` from batch number ``start`` on."""
        if self.kind == "dataloader":
            return itertools.islice(self._dataloader(epoch), start, None)
        return self._memory(epoch, start)

    def _memory(self, epoch: int, start: int) -> Iterator[Batch]:
        order = rank_indices(len(self.split), self.rank, self.world, self.seed, epoch).to(self.device)
        for i in range(start, len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            yield self._take(self.split.x, idx), self.split.y.index_select(0, idx)

    def _take(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """Rows ``idx`` of ``x``: index_select (fastest; its result is contiguous) or, for channels_last,
        advanced indexing (keeps the format: no conversion copy per batch)."""
        return x.index_select(0, idx) if self.memory_format == torch.contiguous_format else x[idx]

    def _dataloader(self, epoch: int) -> Iterator[Batch]:
        dataset = TensorDataset(self.split.x, self.split.y)
        sampler = DistributedSampler(dataset, num_replicas=self.world, rank=self.rank, shuffle=True, seed=self.seed)
        sampler.set_epoch(epoch)
        pin = self.device.type == "cuda"
        loader = DataLoader(
            dataset, batch_size=self.batch_size, sampler=sampler, num_workers=self.workers, pin_memory=pin
        )
        for x, y in loader:
            x = x.to(self.device, non_blocking=pin, memory_format=self.memory_format)
            yield x, y.to(self.device, non_blocking=pin)


def on_device(
    split: Split, device: torch.device, memory_format: torch.memory_format = torch.contiguous_format
) -> Split:
    """``split`` copied once to ``device``, images in ``memory_format`` (4-d images only; others stay as they are)."""
    x = split.x.to(device)
    if x.dim() == 4:
        x = x.contiguous(memory_format=memory_format)
    return Split(x, split.y.to(device))


def eval_batches(split: Split, rank: int, world: int, batch_size: int, device: torch.device) -> Iterator[Batch]:
    """This rank's evaluation batches (see ``eval_indices``); ``split`` may already be on ``device``."""
    idx = eval_indices(len(split), rank, world).to(split.x.device)
    for chunk in idx.split(batch_size):
        yield split.x[chunk].to(device), split.y[chunk].to(device)
