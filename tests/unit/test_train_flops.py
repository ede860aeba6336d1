"""TFLOP/s and MFU: FLOPs counted by torch's flop counter, the GPU's bf16 peak from its name, the lines shown."""

import pytest
import torch

from app.train import flops, models, precision
from app.train.report import format_epoch, format_mfu

CPU = torch.device("cpu")
FP32 = precision.make("fp32", CPU)


def test_mlp_training_flops_are_the_matrix_products_of_forward_and_backward() -> None:
    torch.manual_seed(0)
    model, b = models.mlp(), 16
    x, y = torch.randn(b, 1, 28, 28), torch.randint(0, 10, (b,))
    # Forward: 2*b*784*256 + 2*b*256*10. Backward: both weight gradients (the same again) and the
    # hidden layer's input gradient (2*b*256*10); the input image needs no gradient.
    expected = 2 * b * 784 * 256 * 2 + 2 * b * 256 * 10 * 3
    assert flops.per_sample(model, x, y, FP32) == expected / b
    assert all(p.grad is None for p in model.parameters())  # counted on a copy: the model is untouched


def test_counting_leaves_batchnorm_statistics_alone() -> None:
    model = models.cnn(1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cnn = flops.per_sample(model, torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,)), FP32)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert cnn > 0 and cnn != flops.per_sample(models.mlp(), torch.randn(4, 1, 28, 28), torch.zeros(4).long(), FP32)


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H100 PCIe", 756.5),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.4),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L40S", 362.05),
        ("NVIDIA L4", 121.0),
    ],
)
def test_known_gpus_have_their_data_sheet_peak(name: str, tflops: float) -> None:
    peak = flops.table_peak(name)
    assert peak is not None and peak.tflops == tflops and peak.source.startswith("data sheet")


def test_an_unknown_gpu_has_no_table_peak() -> None:
    assert flops.table_peak("Tesla T4") is None  # its peak is then measured (flops.measured_peak, on the GPU)


def test_mfu_is_achieved_over_peak_and_shown_only_when_measured() -> None:
    tflops = flops.achieved(per_sample_flops=3e9, samples=10_000, seconds=0.1)
    assert tflops == pytest.approx(300.0)
    record = flops.describe(tflops, flops.Peak(1000.0, "data sheet (H100)"))
    assert record["mfu"] == pytest.approx(0.3)
    epoch = {
        "epoch": 0, "epochs": 1, "train_loss": 1.0, "test_loss": 1.0, "test_accuracy": 0.5,
        "test_correct": 1, "test_samples": 2, "samples_per_s": 10.0, "step_ms": 1.0,
    }  # fmt: skip
    assert format_mfu(epoch) == "" and "MFU" not in format_epoch(epoch)  # CPU: no GPU peak, no MFU
    assert format_epoch({**epoch, **record}).endswith("300.0 TFLOP/s per GPU, MFU 30.0% of 1000 (data sheet (H100))")


def test_a_small_models_figures_keep_two_significant_digits() -> None:
    # The seed's MLP on an H200 (measured): 39,100 samples/s of 1.2 MFLOP each, against 989 TFLOP/s.
    record = flops.describe(flops.achieved(1.2e6, 39_100, 1.0), flops.Peak(989.4, "data sheet (H200)"))
    assert format_mfu(record) == "  0.047 TFLOP/s per GPU, MFU 0.0047% of 989 (data sheet (H200))"
