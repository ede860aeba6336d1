"""Batches: DistributedSampler's order, resumable, the same from memory and from a DataLoader;
evaluation shards count every sample exactly once."""

import pytest
import torch

from app.train.data import Split
from app.train.loader import TrainLoader, eval_batches, eval_indices, rank_indices

CPU = torch.device("cpu")


def _split(n: int) -> Split:
    return Split(torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1), torch.arange(n))


def test_ranks_cover_every_sample_and_match_one_process_order() -> None:
    one = rank_indices(12, 0, 1, seed=3, epoch=2)
    two = [rank_indices(12, r, 2, seed=3, epoch=2) for r in range(2)]
    assert sorted(torch.cat(two).tolist()) == list(range(12))
    assert torch.equal(torch.stack(two, dim=1).flatten(), one)  # interleaved = the one-process order
    assert not torch.equal(one, rank_indices(12, 0, 1, seed=3, epoch=3))  # set_epoch reshuffles


@pytest.mark.parametrize("n, world", [(33, 2), (10, 3), (2, 4)])
def test_eval_shards_count_each_sample_once(n: int, world: int) -> None:
    shards = [eval_indices(n, r, world) for r in range(world)]
    assert sorted(torch.cat(shards).tolist()) == list(range(n))
    seen = [y for r in range(world) for _, y in eval_batches(_split(n), r, world, 4, CPU)]
    assert sum(len(y) for y in seen) == n


def test_memory_and_dataloader_give_the_same_batches() -> None:
    split = _split(21)
    for rank in range(2):
        mem = TrainLoader(split, rank, 2, batch_size=4, seed=0, device=CPU)
        dl = TrainLoader(split, rank, 2, batch_size=4, seed=0, device=CPU, kind="dataloader")
        assert len(mem) == len(dl) == 3  # 11 samples per rank (padded) in batches of 4
        for (xa, ya), (xb, yb) in zip(mem.epoch(1), dl.epoch(1), strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.parametrize("kind", ["memory", "dataloader"])
def test_resume_position_skips_the_batches_already_done(kind: str) -> None:
    loader = TrainLoader(_split(40), 1, 2, batch_size=3, seed=5, device=CPU, kind=kind)
    full = [y.tolist() for _, y in loader.epoch(4)]
    assert [y.tolist() for _, y in loader.epoch(4, start=2)] == full[2:]


@pytest.mark.parametrize("kind", ["memory", "dataloader"])
def test_channels_last_batches_hold_the_same_samples(kind: str) -> None:
    # What a conv model gets on CUDA (models.memory_format), here on the CPU: same values, NHWC layout.
    split = Split(torch.randn(20, 3, 4, 5), torch.arange(20))
    plain = TrainLoader(split, 0, 2, batch_size=4, seed=1, device=CPU, kind=kind)
    nhwc = TrainLoader(split, 0, 2, batch_size=4, seed=1, device=CPU, kind=kind, memory_format=torch.channels_last)
    for (xa, ya), (xb, yb) in zip(plain.epoch(0), nhwc.epoch(0), strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert xb.is_contiguous(memory_format=torch.channels_last) and not xa.is_contiguous(
            memory_format=torch.channels_last
        )
