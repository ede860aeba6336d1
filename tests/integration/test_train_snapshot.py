"""At most one step lost: a rank that dies leaves the others to keep the step they all completed (an
emergency snapshot), and the job run again resumes from it, ending bit for bit where an uninterrupted
run ends (like every resume of this app)."""

from pathlib import Path

import pytest
import torch

from tests.integration.train_runs import final_params, metrics, run_ranks, synthetic, train

pytestmark = pytest.mark.integration

# 128 samples, batch 8 on 2 ranks: 8 steps per epoch, 16 in all; checkpoints every 5 steps.
COMMON = ["--train-samples", "128", "--test-samples", "32", "--epochs", "2", "--batch-size", "8"]
COMMON += ["--checkpoint-every", "5", "--keep-checkpoints", "10"]


def test_the_survivors_keep_the_last_step_and_the_job_resumes_from_it_exactly(tmp_path: Path) -> None:
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    train(2, synthetic(reference, *COMMON), tmp_path)

    # Rank 1 exits abruptly after step 7 (the checkpoint before it: step 5); rank 0's next all-reduce fails.
    worker = ["--crash-at-step", "7", "--crash-rank", "1", *synthetic(crashed, *COMMON)]
    first = run_ranks(2, worker, tmp_path, module="tests.integration.train_worker")
    assert [r.returncode for r in first] == [1, 17], first[0].stderr[-3000:]
    error = [line for line in first[0].stderr.splitlines() if "ClusterError: " in line]  # the worker: no app.cli
    assert error and "rank 1 on " in error[0] and "stopped answering" in error[0], first[0].stderr[-3000:]
    snapshot = crashed / "checkpoints" / "emergency.pt"
    assert error[0].endswith(f"; rank 0 kept step 7 in {snapshot}"), error[0]

    again = train(2, synthetic(crashed, *COMMON, "--resume", "auto"), tmp_path)
    assert f"train: resumed from step 7 (checkpoint {snapshot}), no steps lost" in again.stdout, again.stdout
    [resume] = [m for m in metrics(crashed) if m["event"] == "resume"]
    assert (resume["from_step"], resume["lost"]) == (7, 0), resume
    want, got = final_params(reference), final_params(crashed)
    for name in want:
        assert torch.equal(want[name], got[name]), name
