"""app/progress.py: rank 0's record of the last step, and the resume line that the cluster runner reads."""

import pytest

from app import progress
from app.progress import Recorder, Resumed


def test_each_record_replaces_the_last_and_survives_without_close(tmp_path):
    recorder = Recorder(tmp_path)
    assert progress.reached(tmp_path) is None  # nothing recorded yet: no file
    for step in (1, 2, 1000, 7):
        recorder.record(step)
    assert progress.reached(tmp_path) == 7  # a shorter number leaves no digits of a longer one behind
    assert progress.path_of(tmp_path).stat().st_size == 20
    recorder.close()
    Recorder(tmp_path).record(8)  # a new attempt overwrites in place
    assert progress.reached(tmp_path) == 8


@pytest.mark.parametrize("content", [b"", b"garbage\n", b"\xff\xfe", b"-3\n"])
def test_an_unreadable_record_is_no_record(tmp_path, content):
    progress.path_of(tmp_path).write_bytes(content)
    assert progress.reached(tmp_path) is None


def test_a_snapshot_beyond_rank_0s_record_is_the_step_reached():
    """rank 0's node killed mid-step: the survivors' emergency snapshot holds step 26, rank 0 recorded 25."""
    resumed = Resumed(26, "/results/f/checkpoints/emergency.pt", 25)
    assert (resumed.reached, resumed.lost) == (26, 0)
    assert resumed.record()["reached"] == 26 and resumed.line().endswith(", no steps lost")
    assert Resumed(26, None, None).reached is None


@pytest.mark.parametrize(
    ("resumed", "line"),
    [
        (
            Resumed(160, "/r/checkpoints/step-00000160.pt", 172),
            "train: resumed from step 160 (checkpoint /r/checkpoints/step-00000160.pt), 12 steps lost "
            "(the failed attempt reached step 172)",
        ),
        (
            Resumed(5, "/r/c/step-00000005.pt", 6),
            "train: resumed from step 5 (checkpoint /r/c/step-00000005.pt), 1 step lost "
            "(the failed attempt reached step 6)",
        ),
        (
            Resumed(5, "/r/c (x)/step-00000005.pt", 5),
            "train: resumed from step 5 (checkpoint /r/c (x)/step-00000005.pt), no steps lost",
        ),
        (Resumed(5, "/r/step-00000005.pt", None), "train: resumed from step 5 (checkpoint /r/step-00000005.pt)"),
        (
            Resumed(0, None, 9),
            "train: started again from step 0 (no checkpoint yet), 9 steps lost (the failed attempt reached step 9)",
        ),
    ],
)
def test_the_resume_line_reads_back(resumed, line):
    assert resumed.line() == line
    assert resumed.record()["lost"] == resumed.lost
