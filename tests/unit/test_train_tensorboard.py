"""TensorBoard scalars of a real (one-process) run, read back with TensorBoard's own reader."""

import json
import sys
import time

import pytest

from app.cli import main
from app.train import scalars

EventAccumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator", reason="tensorboard is not installed: run make venv"
).EventAccumulator

# 64 samples in batches of 8: 8 optimizer steps per epoch, 24 in 3 epochs; the step loss every 5.
EPOCH_STEPS, STEP_LOSS_STEPS = [8, 16, 24], [5, 10, 15, 20]


def _train(out, *args: str) -> int:
    flags = ["--dataset", "synthetic", "--train-samples", "64", "--test-samples", "16", "--batch-size", "8"]
    return main(["train", *flags, "--epochs", "3", "--tensorboard-every", "5", "--out", str(out), "--quiet", *args])


def _scalars(out) -> dict[str, list[int]]:
    board = EventAccumulator(str(out / "tensorboard"))
    board.Reload()
    return {tag: [event.step for event in board.Scalars(tag)] for tag in board.Tags()["scalars"]}


def _start(out) -> dict:
    return next(r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r["event"] == "start")


def test_epoch_scalars_and_the_step_loss(tmp_path) -> None:
    assert _train(tmp_path) == 0
    steps = _scalars(tmp_path)
    assert steps == {**{tag: EPOCH_STEPS for tag in scalars.EPOCH_TAGS.values()}, "loss/train_step": STEP_LOSS_STEPS}
    board = EventAccumulator(str(tmp_path / "tensorboard"))
    board.Reload()
    epochs = [
        r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if r["event"] == "epoch"
    ]
    assert [e.value for e in board.Scalars("accuracy/test")] == pytest.approx([r["test_accuracy"] for r in epochs])
    assert _start(tmp_path)["tensorboard"] == str(tmp_path / "tensorboard")


def test_a_resumed_run_continues_the_same_curves(tmp_path) -> None:
    # Stopped at step 11 (mid-epoch 2, whose partial record lands at step 11), then resumed: the
    # resumed attempt purges from step 11 on, so the curves are those of an uninterrupted run.
    resumed, whole = tmp_path / "resumed", tmp_path / "whole"
    assert _train(resumed, "--max-steps", "11") == 0
    assert _scalars(resumed)["loss/train"] == [8, 11]
    # TensorBoard reads event files in name order, and a name begins with its creation time in whole
    # seconds: start the second attempt in a later second, as any real restart does.
    time.sleep(1.01 - time.time() % 1)
    assert _train(resumed, "--resume", "auto") == 0
    assert _train(whole) == 0
    assert _scalars(resumed) == _scalars(whole)


def test_off_without_the_package_and_said_so(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` now fails, as when not installed
    assert _train(tmp_path, "--no-quiet", "--epochs", "1") == 0
    assert not (tmp_path / "tensorboard").exists()
    assert _start(tmp_path)["tensorboard"] == scalars.NOT_INSTALLED
    assert f"tensorboard: {scalars.NOT_INSTALLED}\n" in capsys.readouterr().out


def test_no_tensorboard_flag_writes_none(tmp_path) -> None:
    assert _train(tmp_path, "--no-tensorboard") == 0
    assert not (tmp_path / "tensorboard").exists() and _start(tmp_path)["tensorboard"] is None
