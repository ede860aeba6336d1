"""The global batch kept on a resume on another number of ranks (app/train/resize.py): the accumulation,
the mid-epoch position, and a world that cannot keep it (one line)."""

import pytest

from app.errors import ClusterError
from app.train.config import StepsConfig, TrainConfig
from app.train.resize import keep_global_batch


def _state(world: int, accum: int, batch: int = 64, position: int = 6) -> dict:
    return {"world_size": world, "batch_size": batch, "accum_steps": accum, "batch": position, "step": 40}


def _cfg(batch: int = 64, accum: int = 1) -> TrainConfig:
    return TrainConfig(steps=StepsConfig(batch_size=batch, accum_steps=accum))


def test_fewer_ranks_accumulate_more_and_continue_at_the_same_step() -> None:
    cfg, state, change = keep_global_batch(_cfg(), _state(4, 1), world=2, nodes=1)
    assert cfg.steps.accum_steps == 2 and (state["batch"], state["world_size"], state["accum_steps"]) == (12, 2, 2)
    assert change is not None and change.record()["from"] == 4 and change.record()["to"] == 2
    assert change.line(64).startswith("train: resize: 4 -> 2 ranks at step 40 (the job restarted on 1 node(s)")
    assert change.line(64).endswith("global batch 256 kept as per-rank batch 64 x 2 ranks x accum 2")
    grown, state, change = keep_global_batch(_cfg(), _state(2, 2, position=12), world=4, nodes=2)
    assert grown.steps.accum_steps == 1 and state["batch"] == 6 and change and change.accum_now == 1


def test_the_same_world_keeps_the_checkpoints_accumulation_without_a_line() -> None:
    cfg, _, change = keep_global_batch(_cfg(), _state(2, 2), world=2, nodes=1)  # a restart while still shrunk
    assert cfg.steps.accum_steps == 2 and change is None
    same = _cfg()
    assert keep_global_batch(same, _state(4, 1), world=4, nodes=2)[0] is same


def test_a_new_batch_size_sets_a_new_global_batch() -> None:
    cfg = _cfg(batch=32)
    assert keep_global_batch(cfg, _state(4, 1), world=2, nodes=1) == (cfg, _state(4, 1), None)


def test_a_world_that_cannot_keep_the_global_batch_is_one_line() -> None:
    with pytest.raises(ClusterError) as caught:
        keep_global_batch(_cfg(), _state(2, 1), world=3, nodes=3)
    assert str(caught.value) == (
        "cannot keep the global batch 128 on 3 ranks of per-rank batch 64 (128 is not a multiple of 192): "
        "run on 1, 2 ranks, or start a new run (--out) with another --batch-size"
    )
