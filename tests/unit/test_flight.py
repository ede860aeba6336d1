"""What the flight-recorder dumps of a real hang say, read by torch's own analysis (app/train/flight.py).

The dumps in golden/flight/ are those of tests/integration/test_train_health.py's hang under torch
2.11 (3 gloo ranks; rank 1 slept inside step 7's hook; frames left out), as JSON: each test writes
them back as the pickles torch writes.
"""

import json
import pickle
import shutil
from pathlib import Path

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


def test_dumps_of_a_backend_the_analysis_refuses_are_read_under_nccls_name_and_named_back(tmp_path) -> None:
    # torch < 2.13 refuses gloo's dumps so ("name formatting error? gloo != 'nccl' or 'xccl'"); every torch refuses
    # a name it does not know, which puts this test on the same path on any torch.
    line = flight.read(_dumps(tmp_path, backend="mybackend"), 3, HOSTS, wait_s=0)
    assert line is not None and line.startswith("flight recorder: mybackend:all_reduce #17 (sequence number)"), line
    assert "was never joined by rank 1 on node1" in line
