"""DDP proof 4, 5 and 6 on CPU: the MLP learns digits to >= 95% on 2 ranks, in fp32 and bf16,
with identical parameters on every rank and output from rank 0 alone."""

import pytest

from tests.integration.train_runs import metrics, run_ranks, summary

pytestmark = pytest.mark.integration


def test_mlp_on_digits_reaches_95_percent_on_two_ranks(tmp_path) -> None:
    out = tmp_path / "run"
    results = run_ranks(
        2, ["train", "--dataset", "digits", "--model", "mlp", "--epochs", "12", "--out", str(out)], tmp_path
    )
    assert [r.returncode for r in results] == [0, 0], results[0].stderr[-3000:] + results[1].stderr[-3000:]
    s = summary(out)
    assert s["test_accuracy"] >= 0.95, s
    assert s["test_samples"] == 360 and s["world_size"] == 2 and s["step"] == 12 * 12
    assert s["params_identical"] is True and s["param_spread"] == 0.0

    rank0, rank1 = results[0].stdout, results[1].stdout
    assert "per-rank batch 64 x 2 ranks x accum 1 = global batch 128, fp32 (auto: cpu), gloo on cpu" in rank0
    assert s["precision"] == "fp32" and s["cuda_graphs"] is False  # the defaults (auto) on a CPU
    assert s["steady_samples_per_s"] > 0 and f"(steady {s['steady_samples_per_s']:.0f} after the first" in rank0
    assert rank0.count("\nepoch ") == 12 and rank0.count("done: ") == 1
    assert "params identical on all ranks" in rank0
    assert rank1 == ""  # output on rank 0 only
    epochs = [m for m in metrics(out) if m["event"] == "epoch"]
    assert [m["epoch"] for m in epochs] == list(range(12))
    assert all(m["samples_per_s"] > 0 and m["step_ms"] > 0 for m in epochs)


def test_bf16_autocast_trains_on_cpu(tmp_path) -> None:
    out = tmp_path / "bf16"
    results = run_ranks(2, ["train", "--precision", "bf16", "--epochs", "4", "--out", str(out), "--quiet"], tmp_path)
    assert [r.returncode for r in results] == [0, 0], results[0].stderr[-3000:]
    s = summary(out)
    assert s["precision"] == "bf16" and s["params_identical"] is True
    assert s["auto"] == {"cuda_graphs": "cpu has no CUDA graphs"}  # a precision by name has no reason
    assert s["test_accuracy"] >= 0.9, s


def test_cnn_with_batchnorm_dataloader_and_accumulation(tmp_path) -> None:
    out = tmp_path / "cnn"
    args = ["train", "--model", "cnn", "--loader", "dataloader", "--accum-steps", "2", "--batch-size", "32"]
    results = run_ranks(2, [*args, "--epochs", "4", "--out", str(out), "--quiet"], tmp_path)
    assert [r.returncode for r in results] == [0, 0], results[0].stderr[-3000:]
    s = summary(out)
    assert s["model"] == "cnn" and s["global_batch"] == 128 and s["static_graph"] is False
    assert s["params_identical"] is True and s["test_accuracy"] >= 0.9, s
