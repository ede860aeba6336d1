"""Cheaper gradient communication on real gloo ranks: each --comm-hook still learns digits with identical
parameters everywhere, PowerSGD's state survives a crash and a resume exactly, and what cannot run
here says so in one line."""

from pathlib import Path

import pytest
import torch

from tests.integration.test_train_resume import COMMON as RESUME
from tests.integration.train_runs import (
    final_params,
    metrics,
    run_ranks,
    summary,
    synthetic,
    train,
    train_torchrun_restarting,
)
from tests.integration.train_worker import CRASH_EXIT_CODE

pytestmark = pytest.mark.integration

# The crash-and-resume run of test_train_resume (16 steps, checkpoints at 5, 8, 10, 15, 16) with PowerSGD,
# which compresses from step 3 on (2 warm-up steps of plain all-reduce).
POWERSGD = [*RESUME, "--comm-hook", "powersgd", "--powersgd-warmup", "2"]
CPU_ONLY_TORCH = torch.version.cuda is None and torch.version.hip is None


def _ok(results) -> None:
    for rank, done in enumerate(results):
        assert done.returncode == 0, f"rank {rank}: {done.stderr[-3000:]}"


def _assert_same(want: dict, got: dict) -> None:
    for name in want:
        assert torch.equal(want[name], got[name]), name


@pytest.mark.parametrize("hook", ["fp16", "powersgd"])
def test_each_hook_learns_digits_on_two_ranks(tmp_path, hook: str) -> None:
    out = tmp_path / hook
    results = run_ranks(2, ["train", "--epochs", "12", "--comm-hook", hook, "--out", str(out), "--quiet"], tmp_path)
    _ok(results)
    s = summary(out)
    assert s["comm_hook"] == hook and s["world_size"] == 2
    assert s["test_accuracy"] >= 0.95, s
    assert s["params_identical"] is True and s["param_spread"] == 0.0


def test_fp16_gradients_take_other_steps_than_fp32(tmp_path) -> None:
    # The hook is really in the loop: rounding the gradients to float16 changes the weights a little.
    fp32, fp16 = tmp_path / "fp32", tmp_path / "fp16"
    quick = ["--train-samples", "128", "--test-samples", "16", "--epochs", "1", "--batch-size", "16"]
    train(2, synthetic(fp32, *quick), tmp_path)
    train(2, synthetic(fp16, *quick, "--comm-hook", "fp16"), tmp_path)
    a, b = final_params(fp32), final_params(fp16)
    assert any(not torch.equal(a[k], b[k]) for k in a)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-2)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted PowerSGD run (16 steps, checkpoints at 5, 8, 10, 15, 16)."""
    folder = tmp_path_factory.mktemp("powersgd")
    train(2, synthetic(folder / "reference", *POWERSGD), folder)
    return folder / "reference"


def test_powersgd_state_is_checkpointed_and_a_crashed_run_resumes_exactly(tmp_path, reference: Path) -> None:
    crashed = tmp_path / "crashed"

    saved = torch.load(reference / "checkpoints" / "step-00000005.pt", map_location="cpu", weights_only=True)
    parts = saved["comm_hook"]
    assert len(parts) == 2 and all(p["name"] == "powersgd" and p["iter"] == 5 for p in parts)
    assert set(parts[0]) == {"name", "rank", "iter", "error", "p", "q", "rng"}
    # By parameter (1.weight, 1.bias, 3.weight, 3.bias): the error of every one, P and Q of the matrices.
    assert sorted(parts[0]["error"]) == [0, 1, 2, 3] and sorted(parts[0]["q"]) == sorted(parts[0]["p"]) == [0, 2]
    assert parts[0]["q"][0].shape == (784 * 2,) and parts[0]["p"][0].shape == (256 * 2,)
    assert not torch.equal(parts[0]["error"][0], parts[1]["error"][0])  # error feedback is each rank's own

    # Rank 1 dies after step 7; torchrun restarts both ranks, which resume from step 5.
    done = train_torchrun_restarting(
        2,
        [*synthetic(crashed, *POWERSGD), "--resume", "auto", "--crash-at-step", "7", "--crash-rank", "1"],
        max_restarts=1,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"exitcode: {CRASH_EXIT_CODE}" in done.stderr or "exitcode: 1" in done.stderr
    restored = [m for m in metrics(crashed) if m["event"] == "comm_hook"]
    assert restored and restored[0]["state"] == "restored at step 5 exactly", restored
    assert summary(crashed)["resumed_from"].endswith("step-00000005.pt")
    _assert_same(final_params(reference), final_params(crashed))


def test_resuming_without_the_powersgd_state_ends_elsewhere(tmp_path, reference: Path) -> None:
    # Negative control: the same step-5 checkpoint, its PowerSGD state removed, resumed to the end.
    control = tmp_path / "control"
    (control / "checkpoints").mkdir(parents=True)
    state = torch.load(reference / "checkpoints" / "step-00000005.pt", map_location="cpu", weights_only=True)
    torch.save({**state, "comm_hook": []}, control / "checkpoints" / "step-00000005.pt")
    train(2, [*synthetic(control, *POWERSGD), "--resume", "auto"], tmp_path)
    want, got = final_params(reference), final_params(control)
    assert any(not torch.equal(want[k], got[k]) for k in want)


@pytest.mark.skipif(not CPU_ONLY_TORCH, reason="a CUDA build of torch accepts bf16 compression")
def test_bf16_on_a_cpu_only_torch_is_one_line(tmp_path) -> None:
    results = run_ranks(2, ["train", *synthetic(tmp_path / "bf16", "--comm-hook", "bf16")], tmp_path, timeout=120)
    for rank, done in enumerate(results):
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, f"rank {rank}: {done.stderr[-2000:]}"
        assert "--comm-hook bf16" in lines[0] and "use --comm-hook fp16" in lines[0]


def test_powersgd_with_two_buckets_on_gloo_is_one_line(tmp_path) -> None:
    args = ["train", *synthetic(tmp_path / "p", "--comm-hook", "powersgd", "--bucket-cap-mb", "0.01")]
    results = run_ranks(2, args, tmp_path, timeout=120)
    for rank, done in enumerate(results):
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, f"rank {rank}: {done.stderr[-2000:]}"
        assert "needs the gradients in one bucket" in lines[0] and "--bucket-cap-mb 0.78" in lines[0]
