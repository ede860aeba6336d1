"""What the flight-recorder dumps of a real hang say, read by torch's own analysis (app/train/flight.py).

The dumps in golden/flight/ are those of tests/integration/test_train_health.py's hang under torch
2.11 (3 gloo ranks; rank 1 slept inside step 7's hook; frames left out), as JSON: each test writes
them back as the pickles torch writes.
"""

import json
import pickle
import shutil
from pathlib import Path

import pytest

from app.train import flight

GOLDEN = Path(__file__).parent / "golden" / "flight"
HOSTS = ["node0", "node1", "node2"]


def _dumps(folder: Path, backend: str = "gloo") -> Path:
    """The three ranks' dumps and rank 1's stack in ``folder``, the entries named for ``backend``."""
    for rank in range(3):
        dump = json.loads((GOLDEN / f"fr-rank{rank}.json").read_text())
        for entry in dump["entries"]:
            entry["process_group"] = tuple(entry["process_group"])
            entry["profiling_name"] = entry["profiling_name"].replace("gloo:", f"{backend}:")
        (folder / f"fr-rank{rank}").write_bytes(pickle.dumps(dump))
    shutil.copy(GOLDEN / "stack-1.json", folder)
    return folder / "fr-rank"


def test_the_dumps_name_the_collective_the_silent_rank_never_joined_and_its_line(tmp_path) -> None:
    line = flight.read(_dumps(tmp_path), 3, HOSTS, wait_s=0)
    assert line == (
        "flight recorder: gloo:all_reduce #17 (sequence number) of group 0:default_pg was never joined by "
        f"rank 1 on node1 at tests/rigs/faults/fault_job.py:97 in hook; dumps in {tmp_path}"
    )


def test_a_frame_inside_the_checkout_is_named_from_its_root_and_one_outside_in_full() -> None:
    """The recorded dump's fault job was tests/rigs/faults/fault_job.py; it is docker/bench/fault_job.py now."""
    assert flight._short("/work/ddp-cluster/docker/bench/fault_job.py") == "docker/bench/fault_job.py"
    assert flight._short("/work/ddp-cluster/app/train/trainer.py") == "app/train/trainer.py"
    assert flight._short("/job/fault_job.py") == "/job/fault_job.py"  # a --script in a node: its folder at /job


def test_dumps_of_a_backend_the_analysis_refuses_are_read_under_nccls_name_and_named_back(tmp_path) -> None:
    # torch < 2.13 refuses gloo's dumps so ("name formatting error? gloo != 'nccl' or 'xccl'"); every torch refuses
    # a name it does not know, which puts this test on the same path on any torch.
    line = flight.read(_dumps(tmp_path, backend="mybackend"), 3, HOSTS, wait_s=0)
    assert line is not None and line.startswith("flight recorder: mybackend:all_reduce #17 (sequence number)"), line
    assert "was never joined by rank 1 on node1" in line


def test_the_analysis_prints_with_tabulate_and_its_words_and_the_line_go_to_analysis_txt(tmp_path) -> None:
    """The analysis reads tabulate (a dependency of the app, in the image too): without it, it says only that
    tabulate is missing; analysis.txt holds what it said about the collective and, last, the line."""
    from torch.distributed.flight_recorder.components import builder

    assert builder.tabulate.__module__ == "tabulate", "tabulate is not installed: pip install -e ."
    line = flight.read(_dumps(tmp_path), 3, HOSTS, wait_s=0)
    said = (tmp_path / flight.ANALYSIS).read_text()
    assert "tabulate is not installed" not in said
    assert "Not all ranks joining collective, sequence number: 17" in said and "missing ranks: {1}" in said, said
    assert said.splitlines()[-1] == line


@pytest.mark.parametrize("silent", [[1], [1, 2]])
def test_ranks_that_wrote_no_dump_are_named_in_the_flight_recorders_part(tmp_path, silent) -> None:
    """A paused or stopped rank writes no dump: torch's analysis cannot place it, and the line says which
    ranks are missing rather than nothing (issue 25: a paused worker's line had no flight-recorder part)."""
    prefix = _dumps(tmp_path)
    for rank in silent:
        (tmp_path / f"fr-rank{rank}").unlink()
    line = flight.read(prefix, 3, HOSTS, wait_s=0)
    named = " and ".join(f"rank {r} on node{r}" for r in silent)
    assert line == (
        f"flight recorder: no dump from {named} (a stopped or paused process writes none), so torch's analysis "
        f"cannot place them; the other ranks' dumps in {tmp_path}"
    )
    assert (tmp_path / flight.ANALYSIS).read_text().splitlines()[-1] == line


def test_no_line_without_any_dump(tmp_path) -> None:
    assert flight.read(tmp_path / "fr-rank", 3, HOSTS, wait_s=0) is None
    assert not (tmp_path / flight.ANALYSIS).exists()


def test_a_recorder_on_disk_means_its_ranks_stack_is_there_too(tmp_path, monkeypatch) -> None:
    """The reader waits for the recorders only: a rank's stack written after its recorder was, under load, not
    there yet when rank 0 read it (``no stack dump`` in place of the line the hung rank was at)."""
    prefix = tmp_path / "flight" / "fr-rank"

    def recorder(**_: object) -> bytes:
        assert flight.stack_path(prefix, 1).exists(), "the recorder was written before the stack"
        return b"recorder"

    monkeypatch.setattr(flight, "_dump_fr_trace", recorder)
    flight.Recorder(prefix, 1, 1.0, lambda: ("forward", 0.0)).dump("forward")
    assert Path(f"{prefix}1").read_bytes() == b"recorder"
    assert json.loads(flight.stack_path(prefix, 1).read_text())["doing"] == "forward"
