"""Bad checkpoints on real ranks: one line, exit 2 on every rank, quickly, and nothing overwritten."""

import pytest

from tests.integration.launchers import run_single
from tests.integration.train_runs import CHECKPOINTED, run_ranks, synthetic, train

pytestmark = pytest.mark.integration

QUICK = ["--train-samples", "64", "--test-samples", "16", "--max-steps", "2", "--batch-size", "16"]


def _one_line_errors(results, message: str) -> None:
    for rank, done in enumerate(results):
        assert done.returncode == 2, f"rank {rank}: {done.returncode} {done.stderr[-2000:]}"
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], done.stderr[-2000:]


def test_corrupt_checkpoint_stops_every_rank_and_is_kept(tmp_path) -> None:
    out = tmp_path / "run"
    latest = out / "checkpoints" / "step-00000007.pt"
    latest.parent.mkdir(parents=True)
    latest.write_bytes(b"PK\x03\x04 truncated by a full disk")
    results = run_ranks(2, ["train", *synthetic(out, *QUICK), "--resume", "auto"], tmp_path, timeout=120)
    _one_line_errors(results, f"checkpoint {latest} is unreadable")
    assert latest.read_bytes() == b"PK\x03\x04 truncated by a full disk"
    assert sorted(p.name for p in latest.parent.iterdir()) == ["step-00000007.pt"]


def test_resume_auto_skips_a_torn_newest_checkpoint_with_one_line_and_resumes_from_the_one_before(tmp_path) -> None:
    """Two ranks trained 16 steps with a checkpoint every 5 (5, 10, 15, 16); the newest torn by a full disk: --resume
    auto says so in one line, resumes from step 15 and finishes; the torn file is not what it resumed from."""
    out = tmp_path / "run"
    train(2, synthetic(out, *CHECKPOINTED), tmp_path)
    torn = out / "checkpoints" / "step-00000016.pt"
    torn.write_bytes(torn.read_bytes()[:200])
    (out / "summary.json").unlink()  # the job is to run again from its checkpoints (not a finished run's rerun)
    done = train(2, synthetic(out, *CHECKPOINTED, "--resume", "auto"), tmp_path)
    said = [line for line in done.stdout.splitlines() if line.startswith("train: skipped")]
    assert said == [f"train: skipped checkpoint {torn} is unreadable ({said[0].split(' unreadable (')[1]}"], said
    assert said[0].endswith("; the one before it is taken") and "resumed from step 15" in done.stdout, done.stdout


def test_checkpoint_of_another_model_is_refused(tmp_path) -> None:
    out = tmp_path / "run"
    train(1, synthetic(out, *QUICK), tmp_path)
    before = {p.name: p.read_bytes() for p in (out / "checkpoints").iterdir()}
    done = run_single(["train", *synthetic(out, *QUICK), "--model", "cnn", "--resume", "auto"], timeout=120)
    _one_line_errors([done], "was made with model 'mlp', this run has 'cnn'")
    assert {p.name: p.read_bytes() for p in (out / "checkpoints").iterdir()} == before
