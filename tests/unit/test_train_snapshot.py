"""Emergency snapshots (app/train/snapshot.py): the newest completed step kept, read only when newer and whole."""

from pathlib import Path
from types import SimpleNamespace

import torch

from app.train import checkpoint, snapshot

IDENTITY = {"model": "mlp", "dataset": "digits", "input_shape": [1, 28, 28], "num_classes": 10}


def _trainer(tmp_path: Path, answers: dict, step: int, rank: int = 0) -> SimpleNamespace:
    """What snapshot.write reads of a trainer after its roll call (no state is written in these cases)."""
    return SimpleNamespace(watch=SimpleNamespace(answers=answers), pos=SimpleNamespace(step=step), rank=rank)


def test_of_survivors_a_step_apart_the_lowest_rank_that_completed_the_newest_keeps_it(tmp_path: Path) -> None:
    """A peer lost inside a ring all-reduce: rank 2 got the whole sum (step 25 done), rank 0 did not (24)."""
    answers = {0: {"completed": 24}, 2: {"completed": 25}, 3: {"completed": 25}}
    assert snapshot.write(_trainer(tmp_path, answers, step=24, rank=0)) == ""  # the older step is not kept
    assert snapshot.write(_trainer(tmp_path, answers, step=25, rank=3)) == ""  # rank 2 keeps it
    writer = _trainer(tmp_path, answers, step=25, rank=2)
    writer.comm = SimpleNamespace(powersgd=None, name="none")
    writer.ctx = SimpleNamespace(device=torch.device("cpu"))
    writer.cfg = SimpleNamespace(output=SimpleNamespace(out=tmp_path))
    writer.world = 4
    writer.epoch_sums = lambda: [12.5, 40, 5, 0.5]
    writer._state = lambda rng, comm, sums: {**IDENTITY, "step": 25, "rng": rng, "comm_hook": comm, "epoch_sums": sums}
    target = snapshot.path_of(tmp_path)
    assert snapshot.write(writer) == f"; rank 2 kept step 25 in {target}"
    kept = torch.load(target, weights_only=True)
    assert kept["step"] == 25 and kept["snapshot"] == {"agreed_by": [2, 3], "world_size": 4}
    assert kept["epoch_sums"] == [[12.5, 40, 5, 0.5]]  # the writer's sums of the epoch so far


def test_with_no_answers_nothing_is_written(tmp_path: Path) -> None:
    assert snapshot.write(_trainer(tmp_path, {}, step=24)) == ""
    assert not snapshot.path_of(tmp_path).exists()


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


def _finished(tmp_path: Path, final_step: int, snapshot_step: int) -> None:
    """A folder whose job finished at ``final_step`` (its checkpoint written) beside a snapshot of ``snapshot_step``."""
    checkpoint.save(tmp_path, {**IDENTITY, "step": final_step}, final_step, keep=3)
    snapshot.path_of(tmp_path).write_bytes(checkpoint.encode({**IDENTITY, "step": snapshot_step}))


def test_a_finished_job_removes_the_snapshot_its_final_checkpoint_supersedes(tmp_path: Path) -> None:
    _finished(tmp_path, final_step=16, snapshot_step=7)
    assert snapshot.retire(tmp_path, 16) == 7
    assert not snapshot.path_of(tmp_path).exists()
    assert checkpoint.load(checkpoint.path_for(tmp_path, 16))["step"] == 16
    assert snapshot.retire(tmp_path, 16) is None  # nothing left to remove


def test_a_snapshot_stays_unless_the_final_checkpoint_reads_back_whole_and_is_newer(tmp_path: Path) -> None:
    _finished(tmp_path, final_step=16, snapshot_step=20)  # newer than the end (another --max-steps): kept
    assert snapshot.retire(tmp_path, 16) is None and snapshot.path_of(tmp_path).exists()

    snapshot.path_of(tmp_path).write_bytes(checkpoint.encode({**IDENTITY, "step": 7}))
    assert snapshot.retire(tmp_path, 17) is None and snapshot.path_of(tmp_path).exists()  # no checkpoint of 17

    final = checkpoint.path_for(tmp_path, 16)
    final.write_bytes(final.read_bytes()[:40])  # torn: the snapshot may still be all there is
    assert snapshot.retire(tmp_path, 16) is None and snapshot.path_of(tmp_path).exists()
