"""The step logic of one process, in-process (world size 1): accumulation groups, stop and resume."""

import torch

from app.cli import main


def _train(out, *args: str) -> int:
    flags = ["--dataset", "synthetic", "--train-samples", "40", "--test-samples", "8", "--optimizer", "sgd"]
    return main(["train", *flags, "--lr", "0.05", "--out", str(out), "--quiet", *args])


def _weights(out) -> dict:
    newest = sorted((out / "checkpoints").glob("step-*.pt"))[-1]
    return torch.load(newest, weights_only=True)["model_state"]


def test_partial_accumulation_group_at_epoch_end_equals_the_short_last_batch(tmp_path) -> None:
    # 40 samples: 5 micro-batches of 8 -> groups of 2, 2 and 1; the same as batches of 16, 16 and 8.
    assert _train(tmp_path / "accum", "--batch-size", "8", "--accum-steps", "2", "--epochs", "2") == 0
    assert _train(tmp_path / "big", "--batch-size", "16", "--epochs", "2") == 0
    a, b = _weights(tmp_path / "accum"), _weights(tmp_path / "big")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-7)
    assert sorted(p.name for p in (tmp_path / "accum" / "checkpoints").iterdir())[-1] == "step-00000006.pt"


def test_max_steps_stops_mid_epoch_and_a_resume_finishes_the_same(tmp_path) -> None:
    assert _train(tmp_path / "full", "--batch-size", "8", "--epochs", "2") == 0
    assert _train(tmp_path / "part", "--batch-size", "8", "--epochs", "2", "--max-steps", "3") == 0
    assert (tmp_path / "part" / "checkpoints" / "step-00000003.pt").exists()
    assert _train(tmp_path / "part", "--batch-size", "8", "--epochs", "2", "--resume", "auto") == 0
    a, b = _weights(tmp_path / "full"), _weights(tmp_path / "part")
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_mid_epoch_checkpoint_needs_the_same_batch_size(tmp_path, capsys) -> None:
    assert _train(tmp_path, "--batch-size", "8", "--max-steps", "2") == 0
    capsys.readouterr()
    assert _train(tmp_path, "--batch-size", "16", "--resume", "auto") == 2
    assert "taken mid-epoch" in capsys.readouterr().err


def test_finished_run_resumed_again_trains_no_more(tmp_path, capsys) -> None:
    assert _train(tmp_path, "--batch-size", "8", "--epochs", "1") == 0
    before = _weights(tmp_path)
    assert _train(tmp_path, "--batch-size", "8", "--epochs", "1", "--resume", "auto") == 0
    assert "done: 5 steps, 1 epoch," in capsys.readouterr().out
    assert all(torch.equal(before[k], v) for k, v in _weights(tmp_path).items())
