"""Device health: one device's matrix throughput and memory-copy bandwidth, in bounded time, and
the verdict over the ranks of a job (which rank's device is slow).

    from app.diagnostics import health
    mine = health.measure(torch.device("cuda", 0))           # DeviceHealth: flops, copy_gbps, ...
    verdict = health.judge([mine, ...], k=3, fail_below=0.5)  # every rank's, in rank order

What is measured (the same on every launcher, one device per rank, all ranks at once):

  matrix throughput   n x n matrix products (2 n^3 floating-point operations each): bf16 with
                      n = 8192 on a GPU, fp32 with n = 512 on a CPU (torch's intra-op threads)
  copy bandwidth      a torch copy of 256 MiB on a GPU, 64 MiB on a CPU: bytes copied / time,
                      as app comm's memcpy ceiling

Each figure is the median of the rates of several samples of about a fifth of its time budget
(``seconds`` / 2 each), after one untimed call; a sample spans at least 0.2 s, longer than the
100 ms period of the kernel's CPU quota, so a container limited with ``docker update --cpus``
shows its share rather than a burst. The verdict applies the outlier rule of ``app links``
(app/diagnostics/outliers.py) to each figure over the ranks: with 3 or more ranks, a rank below
median / s^k is named; ``fail_below`` names the ranks below that fraction of the median.
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from app.diagnostics import outliers

MIB = 1 << 20
MATMUL_SIZE = {"cuda": 8192, "cpu": 512}
"""n of the n x n matrix product, by device type."""
COPY_BYTES = {"cuda": 256 * MIB, "cpu": 64 * MIB}
"""Bytes of each copy, by device type."""
SAMPLES = 5
"""Timed samples per figure; the figure is their median."""
MIN_SAMPLE_S = 0.2
"""Shortest sample: longer than the CFS quota period (100 ms) that docker --cpus enforces."""
MIN_RANKS = 3
"""The outlier rule judges 3 or more ranks (fewer: only fail_below)."""


def matmul_dtype(device: torch.device) -> torch.dtype:
    """bf16 on a GPU (its tensor cores), fp32 on a CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


@dataclass(frozen=True)
class DeviceHealth:
    """One device's figures."""

    device: str
    """The device measured, e.g. cuda:0 or cpu."""
    dtype: str
    """The matrix product's element type: bfloat16 or float32."""
    matmul_size: int
    """n of the n x n product."""
    flops: float
    """Floating-point operations per second of the product (FLOP/s)."""
    copy_bytes: int
    """Bytes of each copy."""
    copy_gbps: float
    """Bytes copied per second / 1e9."""
    seconds: float
    """How long the measurement took."""

    @property
    def unit(self) -> tuple[str, float]:
        """(unit, divisor) for showing ``flops``: TFLOP/s on a GPU, GFLOP/s on a CPU."""
        return ("TFLOP/s", 1e12) if self.device.startswith("cuda") else ("GFLOP/s", 1e9)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rate(step: Callable[[], object], work: float, device: torch.device, budget_s: float) -> float:
    """``work`` per second of ``step``: the median over samples that share ``budget_s``, after one untimed call."""
    step()
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    once = max(time.perf_counter() - start, 1e-9)
    sample_s = max(budget_s / SAMPLES, MIN_SAMPLE_S)
    calls = max(1, round(sample_s / once))
    rates, deadline = [], time.perf_counter() + budget_s
    while len(rates) < SAMPLES and (len(rates) < 1 or time.perf_counter() < deadline):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        synchronize(device)
        rates.append(work * calls / (time.perf_counter() - start))
    return statistics.median(rates)


def matmul_flops(device: torch.device, budget_s: float, n: int | None = None) -> tuple[float, int]:
    """(FLOP/s, n) of n x n matrix products on ``device``."""
    n = n or MATMUL_SIZE.get(device.type, MATMUL_SIZE["cpu"])
    a = torch.randn(n, n, device=device).to(matmul_dtype(device))
    b = torch.randn(n, n, device=device).to(matmul_dtype(device))
    out = torch.empty_like(a)
    return rate(lambda: torch.mm(a, b, out=out), 2.0 * n**3, device, budget_s), n


def memcpy_gbps(device: torch.device, nbytes: int, budget_s: float) -> float:
    """Bytes copied per second (GB/s) by a torch copy of ``nbytes`` on ``device``."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return rate(lambda: dst.copy_(src), nbytes, device, budget_s) / 1e9


def measure(device: torch.device, seconds: float = 2.0) -> DeviceHealth:
    """Measure ``device`` in about ``seconds`` (half for the product, half for the copy)."""
    start = time.perf_counter()
    flops, n = matmul_flops(device, seconds / 2)
    nbytes = COPY_BYTES.get(device.type, COPY_BYTES["cpu"])
    gbps = memcpy_gbps(device, nbytes, seconds / 2)
    return DeviceHealth(
        device=str(device),
        dtype=str(matmul_dtype(device)).removeprefix("torch."),
        matmul_size=n,
        flops=flops,
        copy_bytes=nbytes,
        copy_gbps=gbps,
        seconds=time.perf_counter() - start,
    )


@dataclass(frozen=True)
class Slow:
    """One rank's figure that the verdict names."""

    rank: int
    metric: str
    """flops or copy_gbps."""
    value: float
    median: float


@dataclass(frozen=True)
class Verdict:
    """The rule over every rank's figures."""

    rules: dict[str, outliers.Rule]
    """Per metric (flops, copy_gbps): the rule's median, spread and threshold."""
    slow: list[Slow] = field(default_factory=list)
    """Ranks below the rule's threshold (3 or more ranks)."""
    below_fail: list[Slow] = field(default_factory=list)
    """Ranks below fail_below x the median."""


METRICS = ("flops", "copy_gbps")


def judge(figures: list[DeviceHealth], k: float = outliers.DEFAULT_K, fail_below: float | None = None) -> Verdict:
    """Name the ranks (indices of ``figures``) whose matrix throughput or copy bandwidth is an outlier."""
    rules, slow, failing = {}, [], []
    for metric in METRICS:
        values = [getattr(f, metric) for f in figures]
        rule = outliers.judge_values(values, k, judged=len(values) >= MIN_RANKS)
        rules[metric] = rule
        slow += [Slow(r, metric, v, rule.median) for r, v in enumerate(values) if rule.is_slow(v)]
        if fail_below is not None:
            failing += [Slow(r, metric, v, rule.median) for r, v in enumerate(values) if v < fail_below * rule.median]
    return Verdict(rules, slow, failing)
