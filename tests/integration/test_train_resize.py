"""Fewer ranks at the same global batch: a run checkpointed on 4 ranks that goes on on 2 (accumulation
2) and back on 4 ends where an uninterrupted 4-rank run does, but for the order of float sums; a run
of another global batch ends far away (the control)."""

from pathlib import Path

import pytest
import torch

from tests.integration.train_runs import final_params, metrics, summary, synthetic, train

pytestmark = pytest.mark.integration

# 256 samples, batch 8: 4 ranks x 8 = 32 per step, 8 steps per epoch, 16 in all. Resized mid-epoch at
# step 5 (4 -> 2 ranks, accum 2) and at step 11 (2 -> 4, accum 1).
SMALL = ["--train-samples", "256", "--test-samples", "64", "--epochs", "2", "--batch-size", "8"]
TOLERANCE = 1e-6
"""Largest parameter difference allowed against the uninterrupted run (measured: 1.1e-8; the control: 1.3e-2)."""


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def test_shrink_and_grow_keeps_the_global_batch_and_the_parameters(tmp_path: Path) -> None:
    reference, resized, control = tmp_path / "reference", tmp_path / "resized", tmp_path / "control"
    train(4, synthetic(reference, *SMALL), tmp_path)
    train(4, synthetic(resized, *SMALL, "--max-steps", "5"), tmp_path)
    shrunk = train(2, synthetic(resized, *SMALL, "--max-steps", "11", "--resume", "auto"), tmp_path)
    grown = train(4, synthetic(resized, *SMALL, "--resume", "auto"), tmp_path)
    train(2, synthetic(control, *SMALL), tmp_path)  # 2 x 8 = 16 a step: another global batch

    assert "train: resize: 4 -> 2 ranks at step 5 (" in shrunk.stdout
    assert "global batch 32 kept as per-rank batch 8 x 2 ranks x accum 2" in shrunk.stdout
    assert "train: resize: 2 -> 4 ranks at step 11 (" in grown.stdout
    records = [m for m in metrics(resized) if m["event"] == "resize"]
    assert [(r["from"], r["to"], r["step"], r["accum_to"]) for r in records] == [(4, 2, 5, 2), (2, 4, 11, 1)]
    assert all("checkpoint was taken on" in r["why"] for r in records)
    starts = [m for m in metrics(resized) if m["event"] == "start"]
    assert [(s["world_size"], s["accum_steps"], s["global_batch"]) for s in starts] == [
        (4, 1, 32),
        (2, 2, 32),
        (4, 1, 32),
    ]
    assert summary(resized)["step"] == summary(reference)["step"] == 16

    want = final_params(reference)
    drift = _max_difference(want, final_params(resized))
    other = _max_difference(want, final_params(control))
    print(f"resize: max |difference| {drift:.3g} (tolerance {TOLERANCE:g}); control {other:.3g}")
    assert drift <= TOLERANCE
    assert other > 1000 * TOLERANCE  # the control: another global batch ends far away
