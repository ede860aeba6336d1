"""DDP proof 2: K micro-steps under no_sync == one step on the K-times batch; the all-reduce is skipped."""

import json

import pytest

from tests.integration.train_runs import assert_params_close, final_params, run_ranks, synthetic

pytestmark = pytest.mark.integration

# 128 samples on 2 ranks: 64 per rank = 16 micro-batches of 4 = 4 batches of 16 per epoch.
# SGD: Adam divides by sqrt(v), which turns float rounding in a near-zero gradient into a
# visible step; the DDP arithmetic under test is the same for every optimizer.
COMMON = ["--train-samples", "128", "--test-samples", "16", "--epochs", "2", "--optimizer", "sgd", "--lr", "0.05"]
STEPS = 8


def _worker(tmp_path, name: str, *flags: str) -> list[dict]:
    out, counts = tmp_path / name, tmp_path / f"{name}-counts"
    results = run_ranks(
        2,
        [*synthetic(out, *COMMON, *flags), "--counts", str(counts)],
        tmp_path,
        module="tests.integration.train_worker",
    )
    for rank, done in enumerate(results):
        assert done.returncode == 0, f"rank {rank}: {done.stderr[-3000:]}"
    return [json.loads((counts / f"rank-{r}.json").read_text()) for r in range(2)]


def test_accumulation_equals_big_batch_and_skips_allreduce(tmp_path) -> None:
    accumulated = _worker(tmp_path, "accum", "--batch-size", "4", "--accum-steps", "4")
    big = _worker(tmp_path, "big", "--batch-size", "16")
    assert_params_close(final_params(tmp_path / "accum"), final_params(tmp_path / "big"), rtol=1e-5, atol=1e-7)
    for rank in range(2):
        assert accumulated[rank]["step"] == big[rank]["step"] == STEPS
        # One bucket (the MLP's 0.8 MB of gradients) all-reduced once per optimizer step:
        # 8 calls, not the 32 that 32 micro-batches would make without no_sync.
        assert big[rank]["allreduces"] == STEPS
        assert accumulated[rank]["allreduces"] == STEPS
