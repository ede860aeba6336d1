"""PowerSGD's state follows the parameters (app/train/powersgd.py): laid out again when DDP reorders a
bucket, kept by parameter in checkpoints, averaged over ranks when the world size changes."""

import torch
from torch import nn

from app.train.powersgd import PowerSGD

# The seed MLP's parameters: 0 = 1.weight (256 x 784), 1 = 1.bias, 2 = 3.weight (10 x 256), 3 = 3.bias.
MODEL = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
SIZES = [256 * 784, 256, 10 * 256, 10]
FORWARD, BACKWARD = (0, 1, 2, 3), (3, 2, 1, 0)  # DDP's first layout, and the one it rebuilds to
BUFFER = torch.zeros(sum(SIZES))


def _keeper(rank: int = 2) -> PowerSGD:
    return PowerSGD(MODEL.parameters(), rank=rank, warmup=2)


def _pieces(offset: float) -> dict[str, dict[int, torch.Tensor]]:
    """Distinct values for every parameter's error, P and Q (rank 2: P is n x 2, Q is m x 2)."""
    error = {i: torch.full((n,), offset + i) for i, n in enumerate(SIZES)}
    p = {0: torch.full((256 * 2,), offset + 10), 2: torch.full((10 * 2,), offset + 12)}
    q = {0: torch.full((784 * 2,), offset + 20), 2: torch.full((256 * 2,), offset + 22)}
    return {"error": error, "p": p, "q": q}


def _laid_out(keeper: PowerSGD, order: tuple[int, ...], pieces: dict) -> None:
    """Put ``pieces`` into bucket 0 as torch's hook would have left them for ``order``."""
    s = keeper.state
    s.error_dict[0] = torch.cat([pieces["error"][i] for i in order])
    matrices = [i for i in order if i in pieces["p"]]
    s.p_memory_dict[0] = torch.cat([pieces["p"][i] for i in matrices])
    s.q_memory_dict[0] = torch.cat([pieces["q"][i] for i in matrices])
    keeper._layout[0] = order


def test_only_the_matrices_are_compressed_in_bucket_order() -> None:
    keeper = _keeper()
    assert keeper._plan(FORWARD) == [(0, 512, 1568), (2, 20, 512)]
    assert keeper._plan(BACKWARD) == [(2, 20, 512), (0, 512, 1568)]


def test_a_reordered_bucket_gets_its_state_in_the_new_order() -> None:
    keeper, pieces = _keeper(), _pieces(0.0)
    _laid_out(keeper, FORWARD, pieces)
    keeper._relayout(0, BACKWARD, BUFFER)
    s = keeper.state
    assert torch.equal(s.error_dict[0], torch.cat([pieces["error"][i] for i in BACKWARD]))
    assert torch.equal(s.p_memory_dict[0], torch.cat([pieces["p"][2], pieces["p"][0]]))
    assert torch.equal(s.q_memory_dict[0], torch.cat([pieces["q"][2], pieces["q"][0]]))
    # Negative control: read in the old layout, the flat error would put 1.weight's numbers on 3.bias.
    assert not torch.equal(s.error_dict[0][:10], pieces["error"][0][:10]) and s.error_dict[0][0] == 3.0


def test_checkpointed_pieces_come_back_exactly_for_any_layout() -> None:
    saver, pieces = _keeper(), _pieces(0.0)
    _laid_out(saver, BACKWARD, pieces)
    saver.state.iter = 7
    saved = saver.state_dict()
    assert saved["iter"] == 7 and sorted(saved["error"]) == [0, 1, 2, 3]
    assert all(torch.equal(saved["error"][i], pieces["error"][i]) for i in range(4))

    resumed = _keeper()
    assert resumed.load_state_dict([saved], rank=0, world_size=1) == "restored at step 7 exactly"
    assert resumed.state.iter == 7 and resumed.state.error_dict == {}  # laid out on the bucket's first call
    resumed._relayout(0, FORWARD, BUFFER)
    assert torch.equal(resumed.state.error_dict[0], torch.cat([pieces["error"][i] for i in FORWARD]))
    assert torch.equal(resumed.state.q_memory_dict[0], torch.cat([pieces["q"][0], pieces["q"][2]]))
    assert resumed.state.rng.randint(1_000) == saver.state.rng.randint(1_000)


def test_another_world_size_starts_from_the_mean_error() -> None:
    parts = []
    for offset in (0.0, 100.0):
        keeper = _keeper()
        _laid_out(keeper, FORWARD, _pieces(offset))
        parts.append(keeper.state_dict())
    resumed = _keeper()
    assert "averaged over 2 saved ranks" in resumed.load_state_dict(parts, rank=0, world_size=1)
    resumed._relayout(0, FORWARD, BUFFER)
    assert torch.equal(resumed.state.error_dict[0], torch.cat([_pieces(50.0)["error"][i] for i in FORWARD]))


def test_another_rank_keeps_the_error_and_starts_q_afresh() -> None:
    saver = _keeper(rank=2)
    _laid_out(saver, FORWARD, _pieces(0.0))
    resumed = _keeper(rank=4)
    assert "Q and P start afresh" in resumed.load_state_dict([saver.state_dict()], rank=0, world_size=1)
    resumed._relayout(0, FORWARD, BUFFER)
    assert 0 in resumed.state.error_dict and resumed.state.q_memory_dict == {}
