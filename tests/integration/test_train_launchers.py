"""`app train` runs unchanged under mpirun and a Slurm-style launch (torchrun: the other proofs)."""

import pytest

from tests.integration.launchers import run_mpirun, run_slurm_style
from tests.integration.train_runs import summary, synthetic

pytestmark = pytest.mark.integration

QUICK = ["--train-samples", "256", "--test-samples", "32", "--epochs", "1"]


def test_mpirun(tmp_path) -> None:
    out = tmp_path / "mpi"
    done = run_mpirun(2, ["train", *synthetic(out, *QUICK)], tmp_path / "rdzv")
    assert done.returncode == 0, done.stderr[-3000:]
    s = summary(out)
    assert (s["launcher"], s["world_size"], s["step"], s["params_identical"]) == ("openmpi", 2, 2, True)


def test_slurm_style(tmp_path) -> None:
    out = tmp_path / "slurm"
    results = run_slurm_style(2, ["train", *synthetic(out, *QUICK)], tmp_path / "rdzv")
    assert [r.returncode for r in results] == [0, 0], results[0].stderr[-3000:]
    s = summary(out)
    assert (s["launcher"], s["world_size"], s["step"], s["params_identical"]) == ("slurm", 2, 2, True)
