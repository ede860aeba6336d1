"""DDP proof 1 and 5: 2 ranks x batch b == 1 process x batch 2b on the same samples; ranks agree."""

import pytest
import torch

from tests.integration.train_runs import assert_params_close, final_params, run_ranks, summary, synthetic, train
from tests.integration.train_worker import NUDGE

pytestmark = pytest.mark.integration

# 96 samples: 6 steps of 16 per epoch either way, so the two runs see the same batches.
# SGD, as in the accumulation proof: Adam would magnify float rounding in near-zero gradients.
COMMON = ["--train-samples", "96", "--test-samples", "33", "--epochs", "2", "--optimizer", "sgd", "--lr", "0.05"]


def test_two_ranks_equal_one_process_with_twice_the_batch(tmp_path) -> None:
    two, one, control = tmp_path / "two", tmp_path / "one", tmp_path / "control"
    train(2, [*synthetic(two, *COMMON), "--batch-size", "8"], tmp_path)
    train(1, [*synthetic(one, *COMMON), "--batch-size", "16"], tmp_path)
    assert_params_close(final_params(two), final_params(one), rtol=1e-5, atol=1e-7)
    s = summary(two)
    assert s["step"] == 12 and s["world_size"] == 2 and s["global_batch"] == 16
    assert s["params_identical"] and s["param_spread"] == 0.0
    # Every test sample counted once: 33 is odd, so a padded sampler would report 34.
    assert s["test_samples"] == 33 == summary(one)["test_samples"]
    assert s["test_accuracy"] == pytest.approx(summary(one)["test_accuracy"])

    # The comparison can fail: one process with batch 8 takes other steps.
    train(1, [*synthetic(control, *COMMON), "--batch-size", "8"], tmp_path)
    different = final_params(control)
    assert any(not torch.allclose(different[k], final_params(one)[k], rtol=1e-3) for k in different)


def test_a_rank_whose_parameters_differ_shows_in_param_spread(tmp_path) -> None:
    # The other side of every params_identical: after the last step (6), rank 1's first weight is NUDGE off
    # rank 0's; the spread the ranks compute from their real tensors must say so.
    out = tmp_path / "nudged"
    one_epoch = ["--train-samples", "96", "--test-samples", "33", "--epochs", "1", "--batch-size", "8"]
    args = [*synthetic(out, *one_epoch), "--nudge-at-step", "6"]
    for rank, done in enumerate(run_ranks(2, args, tmp_path, module="tests.integration.train_worker")):
        assert done.returncode == 0, f"rank {rank}: {done.stderr[-3000:]}"
    s = summary(out)
    assert s["step"] == 6 and s["world_size"] == 2, s
    assert s["params_identical"] is False and s["param_spread"] == pytest.approx(NUDGE, abs=1e-6), s
