"""At most one step lost: a rank that dies leaves the others to keep the step they all completed (an
emergency snapshot); a rank its launcher stops (SIGTERM) keeps the step it is at; the job run again
resumes from it, ending bit for bit where an uninterrupted run ends (like every resume of this app)."""

import signal
import subprocess
import time
from pathlib import Path

import pytest

from app import progress
from app.train import checkpoint
from app.train.stop import STATUS, STOP_GRACE_S
from tests.integration.launchers import PYTHON, _clean_env
from tests.integration.train_runs import (
    CHECKPOINTED,
    metrics,
    run_ranks,
    same_final_params,
    summary,
    synthetic,
    train,
    train_torchrun_restarting,
    uninterrupted,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run every test's final parameters are compared with."""
    return uninterrupted(tmp_path_factory.mktemp("reference"))


def test_the_survivors_keep_the_last_step_and_the_job_resumes_from_it_exactly(tmp_path: Path, reference: Path) -> None:
    crashed = tmp_path / "crashed"

    # Rank 1 exits abruptly after step 7 (the checkpoint before it: step 5); rank 0's next all-reduce fails.
    worker = ["--crash-at-step", "7", "--crash-rank", "1", *synthetic(crashed, *CHECKPOINTED)]
    first = run_ranks(2, worker, tmp_path, module="tests.integration.train_worker")
    assert [r.returncode for r in first] == [1, 17], first[0].stderr[-3000:]
    error = [line for line in first[0].stderr.splitlines() if "ClusterError: " in line]  # the worker: no app.cli
    assert error and "rank 1 on " in error[0] and "stopped answering" in error[0], first[0].stderr[-3000:]
    snapshot = crashed / "checkpoints" / "emergency.pt"
    assert error[0].endswith(f"; rank 0 kept step 7 in {snapshot}"), error[0]

    resumes_exactly(crashed, reference, tmp_path, 7)
    [resume] = [m for m in metrics(crashed) if m["event"] == "resume"]
    assert (resume["from_step"], resume["lost"]) == (7, 0), resume


def resumes_exactly(crashed: Path, reference: Path, tmp_path: Path, step: int) -> None:
    """The job run again resumes from the snapshot of ``step``, loses nothing and ends as ``reference``; finished,
    it leaves no snapshot beside its final checkpoint, which loads."""
    snapshot = crashed / "checkpoints" / "emergency.pt"
    again = train(2, synthetic(crashed, *CHECKPOINTED, "--resume", "auto"), tmp_path)
    assert f"train: resumed from step {step} (checkpoint {snapshot}), no steps lost" in again.stdout, again.stdout
    same_final_params(reference, crashed)
    end = summary(crashed)["step"]
    assert not snapshot.exists(), sorted(p.name for p in snapshot.parent.iterdir())
    assert checkpoint.load(checkpoint.path_for(crashed, end))["step"] == end
    [removed] = [m for m in metrics(crashed) if m["event"] == "snapshot_removed"]
    assert (removed["step"], removed["checkpoint_step"]) == (step, end), removed


def test_a_process_killed_under_torchrun_loses_no_step(tmp_path: Path, reference: Path) -> None:
    """torchrun's agent stops the killed rank's sibling with SIGTERM while its all-reduce fails: it still
    keeps the step (before, SIGTERM ended it inside the roll call and the restart took the checkpoint of 5)."""
    crashed = tmp_path / "crashed"
    flags = ["--crash-at-step", "7", "--crash-rank", "1", *synthetic(crashed, *CHECKPOINTED, "--resume", "auto")]
    done = train_torchrun_restarting(2, flags, max_restarts=1)
    assert done.returncode == 0, done.stderr[-3000:]
    snapshot = crashed / "checkpoints" / "emergency.pt"
    assert f"train: resumed from step 7 (checkpoint {snapshot}), no steps lost" in done.stdout, done.stdout[-3000:]
    same_final_params(reference, crashed)


def test_ranks_stopped_by_sigterm_keep_their_step_and_the_job_resumes_from_it_exactly(
    tmp_path: Path, reference: Path
) -> None:
    stopped = tmp_path / "stopped"
    # Both ranks get SIGTERM during step 6's hooks (as torchrun's agents stop every worker for a new round):
    # they stop at the next step boundary, step 7; rank 0 keeps it, rank 1 goes without a word.
    worker = ["--term-at-step", "6", "--term-rank", "0", "--term-rank", "1", *synthetic(stopped, *CHECKPOINTED)]
    first = run_ranks(2, worker, tmp_path, module="tests.integration.train_worker")
    assert [r.returncode for r in first] == [STATUS, STATUS], first[0].stderr[-3000:] + first[1].stderr[-3000:]
    snapshot = stopped / "checkpoints" / "emergency.pt"
    said = first[0].stderr.strip().splitlines()
    assert said[-1] == f"train: stopped by SIGTERM after step 7; rank 0 kept step 7 in {snapshot}", said
    assert "stopped by SIGTERM" not in first[1].stderr, first[1].stderr[-3000:]
    resumes_exactly(stopped, reference, tmp_path, 7)


def test_one_rank_stopped_is_named_by_the_other_which_keeps_the_step(tmp_path: Path, reference: Path) -> None:
    stopped = tmp_path / "stopped"
    worker = ["--term-at-step", "6", "--term-rank", "1", *synthetic(stopped, *CHECKPOINTED)]
    first = run_ranks(2, worker, tmp_path, module="tests.integration.train_worker")
    assert [r.returncode for r in first] == [1, STATUS], first[0].stderr[-3000:]
    error = [line for line in first[0].stderr.splitlines() if "ClusterError: " in line]  # the worker: no app.cli
    assert error and "; rank 1 on " in error[0] and "stopped: their launcher ended them (SIGTERM)" in error[0], error
    assert error[0].endswith(f"; rank 0 kept step 7 in {stopped / 'checkpoints' / 'emergency.pt'}"), error[0]
    resumes_exactly(stopped, reference, tmp_path, 7)


def test_sigterm_inside_a_hung_collective_ends_the_rank_within_the_grace_not_the_timeout(tmp_path: Path) -> None:
    """Rank 1 hangs after step 3; rank 0 waits in step 4's all-reduce (--timeout 300) and gets SIGTERM there:
    no Python runs until the collective returns, so the watcher ends it STOP_GRACE_S later, as SIGTERM would."""
    out, rdzv = tmp_path / "hung", tmp_path / "rdzv"
    procs = []
    for rank in (0, 1):
        env = _clean_env({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"})
        cmd = [PYTHON, "-m", "tests.integration.train_worker", "--hang-at-step", "3", "--hang-rank", "1",
               *synthetic(out, *CHECKPOINTED, "--timeout", "300"), "--init-method", f"file://{rdzv}"]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        while (progress.reached(out) or 0) < 3:
            assert procs[0].poll() is None, procs[0].communicate()[1][-3000:]
            time.sleep(0.2)
        time.sleep(1)  # rank 0 is inside step 4's all-reduce, waiting for rank 1
        procs[0].send_signal(signal.SIGTERM)
        _, err = procs[0].communicate(timeout=STOP_GRACE_S + 30)  # well before the 300 s collective timeout
        assert procs[0].returncode == STATUS, err[-3000:]
        assert "train: stopped by SIGTERM inside a collective" in err and "no emergency snapshot" in err, err[-3000:]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
