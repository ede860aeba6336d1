"""DDP proof 3: a job that dies after step s and is restarted by torchrun ends exactly where an
uninterrupted one does (model, optimizer, sampler position and RNG all come back); and what it
resumes from is the checkpoint's content: a checkpoint whose weights or RNG states are changed
ends elsewhere (a run that silently trained from step 0 again would end where the reference did)."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.integration.train_runs import (
    CHECKPOINTED,
    final_params,
    metrics,
    run_ranks,
    same_final_params,
    summary,
    synthetic,
    train,
    train_torchrun_restarting,
    uninterrupted,
)
from tests.integration.train_worker import CRASH_EXIT_CODE

pytestmark = pytest.mark.integration

# 128 samples, batch 8 on 2 ranks: 8 steps per epoch, 16 in all; checkpoints at 5, 8, 10, 15, 16.
COMMON = CHECKPOINTED


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted COMMON run on 2 hand-started ranks: the end a crashed run must reach, and a finished job
    to run again (a test that runs it again works on a copy)."""
    return uninterrupted(tmp_path_factory.mktemp("reference"))


def _steps(out: Path) -> list[int]:
    return [int(p.stem.split("-")[1]) for p in sorted((out / "checkpoints").glob("step-*.pt"))]


def test_killed_job_resumes_to_the_same_parameters(tmp_path, reference: Path) -> None:
    crashed = tmp_path / "crashed"

    # Both ranks die abruptly after step 7 on the first attempt (no survivor keeps the step: see
    # test_train_snapshot.py); torchrun restarts them, and they continue from the latest checkpoint
    # (step 5, in the middle of epoch 0).
    crash = ["--crash-at-step", "7", "--crash-rank", "0", "--crash-rank", "1"]
    done = train_torchrun_restarting(2, [*synthetic(crashed, *COMMON), "--resume", "auto", *crash], max_restarts=1)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"exitcode: {CRASH_EXIT_CODE}" in done.stderr or "exitcode: 1" in done.stderr  # torchrun saw a failure

    # The first attempt stopped after its step-5 checkpoint without finishing; the second resumed.
    events = [(m["event"], m.get("step")) for m in metrics(crashed) if m["event"] in ("start", "checkpoint", "end")]
    assert events[:3] == [("start", None), ("checkpoint", 5), ("start", None)] and events[-1] == ("end", 16)
    assert [e for e, _ in events].count("end") == 1
    starts = [m for m in metrics(crashed) if m["event"] == "start"]
    assert len(starts) == 2 and starts[0]["resumed_from"] is None
    assert starts[1]["resumed_from"].endswith("step-00000005.pt")
    assert starts[1]["position"] == {"epoch": 0, "batch": 5, "step": 5}
    assert summary(crashed)["resumed_from"].endswith("step-00000005.pt")
    # Rank 0 recorded step 7 (the crash came after it), so the restart knows it redoes steps 6 and 7.
    resumes = [m for m in metrics(crashed) if m["event"] == "resume"]
    assert [(m["from_step"], m["reached"], m["lost"]) for m in resumes] == [(5, 7, 2)], resumes
    assert resumes[0]["checkpoint"].endswith("step-00000005.pt") and resumes[0]["restart_count"] == 1
    line = f"train: resumed from step 5 (checkpoint {resumes[0]['checkpoint']}), 2 steps lost"
    assert f"{line} (the failed attempt reached step 7)" in done.stdout.splitlines(), done.stdout[-2000:]
    assert _steps(crashed) == _steps(reference) == [5, 8, 10, 15, 16]

    same_final_params(reference, crashed)
    assert summary(crashed)["test_accuracy"] == summary(reference)["test_accuracy"]


def test_resume_is_exact_with_four_ranks(tmp_path) -> None:
    """With more than two ranks the order of a gradient sum matters for rounding; the resumed run must sum in
    the uninterrupted run's order (DDP's bucket layout), or it drifts by ~1e-8 within a few steps."""
    reference, crashed = tmp_path / "reference", tmp_path / "crashed"
    small = ["--train-samples", "256", "--test-samples", "32", "--epochs", "1", "--batch-size", "8"]
    train(4, synthetic(reference, *small), tmp_path)
    done = train_torchrun_restarting(
        4,
        [*synthetic(crashed, *small, "--checkpoint-every", "3"), "--resume", "auto", "--crash-at-step", "5"]
        + [f"--crash-rank={rank}" for rank in range(4)],  # every rank: resumed from the checkpoint of step 3
        max_restarts=1,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary(crashed)["resumed_from"].endswith("step-00000003.pt")
    want, got = final_params(reference), final_params(crashed)
    assert all(torch.equal(want[name], got[name]) for name in want), {
        name: float((want[name] - got[name]).abs().max()) for name in want
    }


def test_a_finished_job_run_again_says_so_and_keeps_its_summary(tmp_path, reference: Path) -> None:
    """``make cluster-up`` twice: the second run has nothing to train; it must not overwrite the first's figures."""
    out = tmp_path / "out"
    shutil.copytree(reference, out)  # the first run: COMMON, finished
    args = synthetic(out, *COMMON)
    first = (out / "summary.json").read_text()
    assert json.loads(first)["samples_per_s"] > 0
    again = train(2, [*args, "--resume", "auto"], tmp_path)
    assert (out / "summary.json").read_text() == first
    accuracy = json.loads(first)["test_accuracy"]
    assert again.stdout.splitlines() == [
        f"train: nothing left to do: {out} finished at step 16 (2 epochs; test accuracy {accuracy:.4f}); its "
        "summary.json is kept: give more --epochs or --max-steps to train on, or another --out to start afresh"
    ], again.stdout
    more = train(2, [*args, "--resume", "auto", "--epochs", "3"], tmp_path)
    assert "nothing left to do" not in more.stdout  # the negative control: with more to do, it trains
    assert json.loads((out / "summary.json").read_text())["step"] == 24


DROPOUT = ["--dropout", "0.3"]
"""The test worker's dropout: the global RNG draws a mask every step, so the RNG state is part of where a run is."""


def _train_with_dropout(out: Path, tmp: Path, *extra: str) -> None:
    """The CHECKPOINTED run, through the test worker with dropout, on 2 hand-started ranks."""
    args = [*synthetic(out, *CHECKPOINTED), *DROPOUT, *extra]
    for rank, done in enumerate(run_ranks(2, args, tmp, module="tests.integration.train_worker")):
        assert done.returncode == 0, f"rank {rank}: {done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def with_dropout(tmp_path_factory) -> Path:
    """An uninterrupted CHECKPOINTED run with dropout (checkpoints at 5, 8, 10, 15, 16)."""
    folder = tmp_path_factory.mktemp("dropout")
    _train_with_dropout(folder / "reference", folder)
    return folder / "reference"


def _resume_from_step_5(reference: Path, tmp_path: Path, change=None) -> Path:
    """A run that resumes, to the end, from the reference's step-5 checkpoint (copied, or as ``change`` makes it)."""
    out = tmp_path / "resumed"
    (out / "checkpoints").mkdir(parents=True)
    name = "step-00000005.pt"
    if change is None:
        shutil.copy(reference / "checkpoints" / name, out / "checkpoints" / name)
    else:
        state = torch.load(reference / "checkpoints" / name, map_location="cpu", weights_only=True)
        torch.save(change(state), out / "checkpoints" / name)
    _train_with_dropout(out, tmp_path, "--resume", "auto")
    assert summary(out)["resumed_from"].endswith(name)
    return out


def _differ(a: dict, b: dict) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


def test_a_run_with_dropout_resumes_exactly_with_its_rng_states(tmp_path, with_dropout: Path) -> None:
    same_final_params(with_dropout, _resume_from_step_5(with_dropout, tmp_path))


def test_resuming_with_other_rng_states_ends_elsewhere(tmp_path, with_dropout: Path) -> None:
    # The control of the test above: the same checkpoint with every rank's RNG state replaced (another seed's)
    # draws other dropout masks from step 6 on, so the RNG state restored is what made that run exact.
    other = torch.Generator().manual_seed(12345).get_state()

    def reseeded(state: dict) -> dict:
        return {**state, "rng": [{**rng, "cpu": other} for rng in state["rng"]]}

    resumed = _resume_from_step_5(with_dropout, tmp_path, reseeded)
    assert _differ(final_params(with_dropout), final_params(resumed)), "other RNG states, the same parameters"


def test_a_resumed_run_continues_from_the_checkpoints_weights(tmp_path, with_dropout: Path) -> None:
    # The step-5 checkpoint's weights changed a little: a run that resumes from them ends elsewhere; one that
    # ignored the checkpoint and trained from step 0 again would end with the reference's parameters.
    def tampered(state: dict) -> dict:
        return {**state, "model_state": {k: v + 0.01 for k, v in state["model_state"].items()}}

    resumed = _resume_from_step_5(with_dropout, tmp_path, tampered)
    assert _differ(final_params(with_dropout), final_params(resumed)), "the checkpoint's weights were not used"
    assert summary(resumed)["step"] == 16 and summary(resumed)["params_identical"]
