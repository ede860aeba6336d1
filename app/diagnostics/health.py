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
SECONDS = 2.0
"""Default time to measure one device (app check's --device-seconds, app gate's)."""


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


def measure(device: torch.device, seconds: float = SECONDS) -> DeviceHealth:
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


# --- app check's device-health section ----------------------------------------------------------


def figure(metric: str, value: float, device: str) -> str:
    """``212 TFLOP/s`` (GFLOP/s on a CPU) or ``1.2 GB/s copy``."""
    if metric == "copy_gbps":
        return f"{value:.1f} GB/s copy"
    unit, scale = ("TFLOP/s", 1e12) if device.startswith("cuda") else ("GFLOP/s", 1e9)
    return f"{value / scale:.1f} {unit}"


def _named(slow: Slow, ranks: list[dict]) -> dict:
    rank = ranks[slow.rank]
    return {
        "rank": rank["rank"],
        "host": rank["host"],
        "device": rank["device"],
        "metric": slow.metric,
        "value": slow.value,
        "median": slow.median,
    }


def section(ranks: list[dict], k: float, fail_below: float | None) -> dict:
    """The report's ``device_health`` from every rank's ``health`` (asdict of DeviceHealth), in rank order."""
    figures = [DeviceHealth(**r["health"]) for r in ranks]
    verdict = judge(figures, k, fail_below)
    first = figures[0]
    return {
        "dtype": first.dtype,
        "matmul_size": first.matmul_size,
        "copy_bytes": first.copy_bytes,
        "k": k,
        "fail_below": fail_below,
        "median_flops": verdict.rules["flops"].median,
        "median_copy_gbps": verdict.rules["copy_gbps"].median,
        "threshold_flops": verdict.rules["flops"].threshold,
        "threshold_copy_gbps": verdict.rules["copy_gbps"].threshold,
        "slow": [_named(s, ranks) for s in verdict.slow],
        "below_fail": [_named(s, ranks) for s in verdict.below_fail],
    }


def describe_slow(entry: dict) -> str:
    """``rank 3 on node1 (cuda:1): 212.0 TFLOP/s against a median of 690.0``."""
    value = figure(entry["metric"], entry["value"], entry["device"])
    median = figure(entry["metric"], entry["median"], entry["device"]).split(" ")[0]
    return f"rank {entry['rank']} on {entry['host']} ({entry['device']}): {value} against a median of {median}"


def format_lines(report: dict) -> list[str]:
    """The verdict lines under app check's rank table."""
    part = report["device_health"]
    n = report["world_size"]
    head = (
        f"device health: {part['matmul_size']}x{part['matmul_size']} {part['dtype']} matrix products, "
        f"copies of {part['copy_bytes'] >> 20} MiB"
    )
    if part["threshold_flops"] is None:
        return [head, f"verdict: {n} rank(s): the outlier rule needs {MIN_RANKS} or more (--fail-below judges fewer)"]
    if not part["slow"]:
        return [head, "verdict: no slow device"]
    return [head, *(f"slow: {describe_slow(entry)}" for entry in part["slow"])]


def failures(report: dict) -> list[dict]:
    """check's failures for the ranks below --fail-below (one per metric)."""
    part = report["device_health"]
    found = []
    for metric in METRICS:
        below = [entry for entry in part["below_fail"] if entry["metric"] == metric]
        if below:
            detail = "; ".join(f"{describe_slow(e)}, below {part['fail_below']:g} x the median" for e in below)
            found.append({"operation": "device_health", "ranks": [e["rank"] for e in below], "detail": detail})
    return found
