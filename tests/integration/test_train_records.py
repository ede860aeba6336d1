"""Records of a resumed run (issue 25): each epoch's line and metrics.jsonl record exactly once, whatever step
a fault strikes at, and the resume record's restart count that of the job.

A fault at an epoch's last step used to lose that epoch's record: the position had moved on to the next
epoch before the record's collectives (its sums, the evaluation) ran, so the state a survivor kept there, or a
checkpoint due at that step, resumed past it.
"""

import json

import pytest

from tests.integration.train_runs import metrics, run_ranks, synthetic, train, train_torchrun_restarting

pytestmark = pytest.mark.integration

# 96 samples, batch 8 on 2 ranks: 6 steps an epoch, 18 in all.
EPOCHS = 3
SIZES = ["--train-samples", "96", "--test-samples", "16", "--batch-size", "8"]
SHAPE = [*SIZES, "--epochs", str(EPOCHS)]


@pytest.mark.parametrize(
    ("crash_ranks", "step", "every"),
    [
        ([1], 6, "0"),  # the epoch's last step; rank 0 survives into the record's collectives and keeps step 6
        ([0, 1], 6, "3"),  # the epoch's last step, checkpointed: both die before the record
        ([1], 7, "0"),  # the step after the record: the epoch's record must not come twice
    ],
    ids=["last-step-snapshot", "last-step-checkpoint", "after-the-record"],
)
def test_every_epoch_has_one_record_and_one_line_when_a_rank_dies_at_an_epochs_edge(
    tmp_path, crash_ranks, step, every
) -> None:
    out = tmp_path / "out"
    crash = ["--crash-at-step", str(step), *(f"--crash-rank={r}" for r in crash_ranks)]
    args = [*synthetic(out, *SHAPE, "--checkpoint-every", every, "--resume", "auto", "--no-quiet"), *crash]
    done = train_torchrun_restarting(2, args, max_restarts=1)
    assert done.returncode == 0, done.stderr[-3000:]
    [resume] = [m for m in metrics(out) if m["event"] == "resume"]
    assert resume["from_step"] in (step - 1, step), resume  # it did fail and resume where the fault struck
    epochs = [m for m in metrics(out) if m["event"] == "epoch"]
    assert [m["epoch"] for m in epochs] == list(range(EPOCHS)), epochs
    assert [m["train_samples"] for m in epochs] == [96] * EPOCHS, epochs  # the whole epoch, the resumed part too
    lines = [line for line in done.stdout.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in lines] == [f"{e}/{EPOCHS}" for e in range(1, EPOCHS + 1)], done.stdout


def test_epoch_means_the_same_in_checkpoint_and_epoch_records(tmp_path) -> None:
    """0-based everywhere: a checkpoint's ``epoch`` and ``batch`` are its position (the epoch it is in, the next
    batch of it), and the checkpoint after an epoch's record is at batch 0 of the next."""
    out = tmp_path / "out"
    train(2, synthetic(out, *SHAPE, "--checkpoint-every", "3"), tmp_path)
    records = [m for m in metrics(out) if m["event"] in ("epoch", "checkpoint")]
    seen = [(m["event"], m["epoch"], m.get("batch"), m["step"]) for m in records]
    assert seen[:5] == [
        ("checkpoint", 0, 3, 3),
        ("checkpoint", 0, 6, 6),
        ("epoch", 0, None, 6),
        ("checkpoint", 1, 0, 6),
        ("checkpoint", 1, 3, 9),
    ], seen


def test_the_resume_record_counts_the_jobs_restarts_not_rank_0s_agent(tmp_path) -> None:
    """After a head kill rank 0 runs under a new torchrun agent (restart count 0) while the others' agent counts
    1: the record says 1, as the cluster's ``restart 1`` line does. Rank 1 alone carries the count here."""
    out = tmp_path / "out"
    train(2, synthetic(out, *SIZES, "--epochs", "1"), tmp_path)
    args = ["train", *synthetic(out, *SHAPE, "--resume", "auto")]
    results = run_ranks(2, args, tmp_path, env_of=lambda rank: {"TORCHELASTIC_RESTART_COUNT": str(rank)})
    assert [r.returncode for r in results] == [0, 0], results[1].stderr[-3000:]
    [resume] = [m for m in metrics(out) if m["event"] == "resume"]
    assert resume["restart_count"] == 1, json.dumps(resume)
