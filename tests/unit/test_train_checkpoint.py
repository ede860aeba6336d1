"""Checkpoint files: atomic, newest kept, loaded with weights_only, never silently overwritten."""

import pytest
import torch

from app.atomic import atomic_write_text
from app.errors import ClusterError, UsageError
from app.train import checkpoint


def _state(step: int) -> dict:
    return {"model": "mlp", "model_state": {"w": torch.full((2,), float(step))}, "step": step}


def test_save_load_round_trip_and_pruning(tmp_path) -> None:
    for step in (3, 10, 12, 20):
        checkpoint.save(tmp_path, _state(step), step, keep=2)
    assert [p.name for p in checkpoint.existing(tmp_path)] == ["step-00000012.pt", "step-00000020.pt"]
    loaded = checkpoint.load(checkpoint.path_for(tmp_path, 20))
    assert loaded["format"] == checkpoint.FORMAT and torch.equal(loaded["model_state"]["w"], torch.full((2,), 20.0))
    assert not list((tmp_path / "checkpoints").glob(".*.tmp"))  # no temp files left behind


def test_resolve_resume(tmp_path) -> None:
    assert checkpoint.resolve_resume(tmp_path, "auto") is None
    assert checkpoint.resolve_resume(tmp_path, "none") is None
    for step in (5, 9):
        checkpoint.save(tmp_path, _state(step), step, keep=5)
    (tmp_path / "checkpoints" / ".step-00000011.pt.abc.tmp").write_bytes(b"half")  # an interrupted write
    latest = checkpoint.path_for(tmp_path, 9)
    assert checkpoint.resolve_resume(tmp_path, "auto") == latest
    assert checkpoint.resolve_resume(tmp_path, str(latest)) == latest
    with pytest.raises(UsageError, match="already holds checkpoints"):
        checkpoint.resolve_resume(tmp_path, "none")
    with pytest.raises(UsageError, match="would overwrite newer ones"):
        checkpoint.resolve_resume(tmp_path, str(checkpoint.path_for(tmp_path, 5)))


def test_corrupt_and_foreign_files_are_usage_errors(tmp_path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"\x00garbage")
    with pytest.raises(UsageError, match="is unreadable"):
        checkpoint.load(bad)
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(UsageError, match="not a ddp-cluster checkpoint"):
        checkpoint.load(foreign)


def test_weights_only_refuses_pickled_code(tmp_path) -> None:
    evil = tmp_path / "evil.pt"
    torch.save({"format": checkpoint.FORMAT, "payload": _Payload()}, evil)
    with pytest.raises(UsageError, match="is unreadable"):
        checkpoint.load(evil)


class _Payload:
    """An arbitrary object: weights_only=True must refuse to unpickle it."""


def test_identity_mismatch_names_the_flag(tmp_path) -> None:
    saved = {"model": "mlp", "input_shape": [1, 28, 28]}
    checkpoint.check_identity(tmp_path, saved, {"model": "mlp", "input_shape": [1, 28, 28]})
    with pytest.raises(UsageError, match="made with model 'mlp', this run has 'cnn': pass the same --model"):
        checkpoint.check_identity(tmp_path, saved, {"model": "cnn"})


def test_unwritable_out_is_a_usage_error_and_a_failed_save_a_cluster_error(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(UsageError, match="cannot write to --out"):
        checkpoint.ensure_writable(blocker / "run")
    checkpoint.ensure_writable(tmp_path / "run")
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []  # the probe file is gone
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "checkpoints").write_text("a file where the folder goes")
    with pytest.raises(ClusterError, match="could not write checkpoint"):
        checkpoint.save(tmp_path / "taken", _state(1), 1, keep=1)


def test_resuming_on_a_disk_without_room_for_one_more_checkpoint_fails_before_training(tmp_path, monkeypatch) -> None:
    latest = checkpoint.save(tmp_path, _state(7), 7, keep=3)
    size = latest.stat().st_size
    usage = checkpoint.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda _: usage._replace(free=size - 1))
    with pytest.raises(ClusterError, match=r"cannot resume in .*: 0\.0 MiB free, .*\(No space left on device\)"):
        checkpoint.ensure_space(tmp_path, latest)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda _: usage._replace(free=size))
    checkpoint.ensure_space(tmp_path, latest)  # room for exactly one more: go on


def test_written_files_get_the_mode_a_plain_open_gives(tmp_path) -> None:
    """Not mkstemp's 0600: results copied out of a container, or shared, stay readable."""
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    written = atomic_write_text(tmp_path / "summary.json", "{}")
    assert written.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777


def test_resume_auto_skips_a_newest_checkpoint_that_does_not_load_with_one_line_and_takes_the_one_before(tmp_path):
    for step in (10, 20, 30):
        checkpoint.save(tmp_path, _state(step), step, keep=5)
    newest = checkpoint.path_for(tmp_path, 30)
    newest.write_bytes(newest.read_bytes()[:100])  # torn: a crash, a disk that filled
    path, state, skipped = checkpoint.newest_that_loads(tmp_path)
    assert (path, state["step"]) == (checkpoint.path_for(tmp_path, 20), 20)
    [line] = skipped
    assert line.startswith(f"train: skipped checkpoint {newest} is unreadable (") and line.endswith(
        "; the one before it is taken"
    ), line
    for step in (10, 20):
        checkpoint.path_for(tmp_path, step).write_bytes(b"not a checkpoint")
    with pytest.raises(UsageError, match=r"^no checkpoint in .* loads \(checkpoint .*step-00000030.pt is unreadable"):
        checkpoint.newest_that_loads(tmp_path)
    assert checkpoint.newest_that_loads(tmp_path / "fresh") is None
