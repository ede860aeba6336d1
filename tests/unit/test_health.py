"""Device health: the figures of one device, and the verdict that names a slow rank (the outlier rule of app links)."""

import pytest
import torch

from app.diagnostics import health, outliers
from app.diagnostics.health import DeviceHealth
from app.errors import UsageError


def _figures(flops: list[float], copy: list[float] | None = None) -> list[DeviceHealth]:
    copy = copy or [5.0] * len(flops)
    pairs = enumerate(zip(flops, copy, strict=True))
    return [DeviceHealth(f"cuda:{i}", "bfloat16", 8192, f, 1 << 28, c, 2.0) for i, (f, c) in pairs]


def test_measure_on_cpu_gives_positive_figures_in_bounded_calls() -> None:
    found = health.measure(torch.device("cpu"), seconds=0.4)
    assert found.device == "cpu" and found.dtype == "float32" and found.matmul_size == health.MATMUL_SIZE["cpu"]
    assert found.flops > 0 and found.copy_gbps > 0
    assert health.figure("flops", found.flops, found.device).endswith(" GFLOP/s")
    assert health.figure("flops", 212e12, "cuda:1") == "212.0 TFLOP/s"


def test_rate_is_work_over_time_and_stops_after_its_samples() -> None:
    calls = []
    assert health.rate(lambda: calls.append(1), 10.0, torch.device("cpu"), 0.01) > 0
    # 2 untimed-or-calibration calls, then at most SAMPLES samples of one or more calls each.
    assert len(calls) >= 3


def test_a_slow_device_is_named_and_only_it() -> None:
    verdict = health.judge(_figures([690e12, 700e12, 680e12, 212e12]))
    assert [(s.rank, s.metric) for s in verdict.slow] == [(3, "flops")]
    assert verdict.slow[0].median == pytest.approx((690e12 * 685e12) ** 0.5, rel=0.01)  # geometric median


def test_a_slow_copy_is_named_too() -> None:
    verdict = health.judge(_figures([700e12] * 3, copy=[2000.0, 2100.0, 400.0]))
    assert [(s.rank, s.metric) for s in verdict.slow] == [(2, "copy_gbps")]


def test_noise_names_none() -> None:
    # +-25% apart, as busy CPU containers are: nothing is half the median.
    assert health.judge(_figures([3.1e9, 2.4e9, 3.0e9, 2.6e9])).slow == []


def test_two_ranks_are_judged_by_fail_below_only() -> None:
    verdict = health.judge(_figures([700e12, 100e12]), fail_below=0.5)
    assert verdict.slow == [] and verdict.rules["flops"].threshold is None
    assert [(s.rank, s.metric) for s in verdict.below_fail] == [(1, "flops")]


def test_fail_below_is_a_fraction() -> None:
    verdict = health.judge(_figures([700e12, 690e12, 500e12]), fail_below=0.8)
    assert [s.rank for s in verdict.below_fail] == [2]
    assert health.judge(_figures([700e12, 690e12, 500e12]), fail_below=0.5).below_fail == []
    with pytest.raises(UsageError, match="must be a fraction of the median in \\(0, 1\\]"):
        outliers.check_fraction(2.0)
