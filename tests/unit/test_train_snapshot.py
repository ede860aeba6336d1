"""Emergency snapshots (app/train/snapshot.py): written only on agreement, read only when newer and whole."""

from pathlib import Path
from types import SimpleNamespace

from app.train import checkpoint, snapshot

IDENTITY = {"model": "mlp", "dataset": "digits", "input_shape": [1, 28, 28], "num_classes": 10}


def _trainer(tmp_path: Path, answers: dict, step: int, rank: int = 0) -> SimpleNamespace:
    """What snapshot.write reads of a trainer after its roll call (no state is written in these cases)."""
    return SimpleNamespace(watch=SimpleNamespace(answers=answers), pos=SimpleNamespace(step=step), rank=rank)


def test_survivors_that_disagree_write_nothing_and_say_so(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, {0: {"completed": 24}, 2: {"completed": 25}}, step=24)
    assert snapshot.write(trainer) == "; no emergency snapshot: the ranks that answered had completed steps [24, 25]"
    assert snapshot.write(_trainer(tmp_path, {0: {"completed": 24}}, step=24, rank=2)) == ""  # rank 0 writes


def test_a_torn_snapshot_is_set_aside_with_one_line(tmp_path: Path, capsys) -> None:
    whole = checkpoint.encode({**IDENTITY, "step": 25})
    checkpoint.directory(tmp_path).mkdir(parents=True)
    snapshot.path_of(tmp_path).write_bytes(whole)
    state, path = snapshot.newer(tmp_path, 23, IDENTITY)
    assert state["step"] == 25 and path.endswith("emergency.pt")
    assert snapshot.newer(tmp_path, 25, IDENTITY) is None  # a checkpoint as new: the checkpoint wins

    snapshot.path_of(tmp_path).write_bytes(whole[: len(whole) // 2])
    assert snapshot.newer(tmp_path, 23, IDENTITY) is None
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith("train: emergency snapshot set aside (checkpoint ") and "is unreadable" in line
    assert line.endswith("; resuming from the last checkpoint")
    assert not snapshot.path_of(tmp_path).exists() and snapshot.path_of(tmp_path).with_suffix(".untrusted").exists()


def test_a_snapshot_of_another_run_is_set_aside(tmp_path: Path, capsys) -> None:
    checkpoint.directory(tmp_path).mkdir(parents=True)
    snapshot.path_of(tmp_path).write_bytes(checkpoint.encode({**IDENTITY, "model": "cnn", "step": 25}))
    assert snapshot.newer(tmp_path, -1, IDENTITY) is None
    assert "was made with model 'cnn'" in capsys.readouterr().out
