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
(``seconds`` / 2 each), after one untimed call; a sample runs until it spans at least 0.2 s, longer
than the 100 ms period of the kernel's CPU quota, so a container limited with ``docker update
--cpus`` shows its share rather than a burst.

Two verdicts. Nodes as nodes (``judge_nodes``, 2 or more hosts): a node's figure is the geometric
median of its ranks'; a node is slow when the fastest node's figure is NODE_FACTOR (3) times its own
or more, on either figure, and the check then fails. Noise between equal nodes reached 2.2x on a
shared 2-core machine (CPU nodes measuring at once), a node at a third of its speed crosses 3x. An
outlier rule over ranks cannot name a node whose ranks are half of all (2 nodes x 2 ranks: the
rule's median falls between the slow and the fast). Ranks (``judge``): the outlier rule of ``app
links`` (app/diagnostics/outliers.py) over each figure: with 3 or more ranks, a rank below
median / s^k is named (on CPUs also only below median / NODE_FACTOR: ranks share the cores);
``fail_below`` names the ranks below that fraction of the median. GPUs (``below_peak``): a rank below a
third of its GPU's data-sheet bf16 peak (app/runtime/devices.py's table) fails the check whatever the
others read (an H200 reads about 0.68 of its 989 TFLOP/s).
"""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from app.diagnostics import outliers
from app.runtime.devices import table_peak

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
NODE_FACTOR = 3.0
"""A node is slow when the fastest node reads this many times its figure or more (noise between equal CPU nodes
on a shared 2-core machine reached 2.2x; a node at a third of its speed crosses it)."""


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
    """``work`` per second of ``step``: the median over samples that share ``budget_s``, after one untimed call.

    Each sample runs until it spans the sample time (at least MIN_SAMPLE_S), not a count of calls guessed from
    one call: under a CPU quota the calibration call can be the throttled one, and five samples of the few
    calls it implied then fitted in one quota period (a rank at 0.1 CPU read 170 GFLOP/s, twice a free node)."""
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
        start, done, elapsed = time.perf_counter(), 0, 0.0
        while elapsed < sample_s:
            for _ in range(calls):
                step()
            synchronize(device)
            done += calls
            elapsed = time.perf_counter() - start
        rates.append(work * done / elapsed)
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


def judge(
    figures: list[DeviceHealth], k: float = outliers.DEFAULT_K, fail_below: float | None = None, floor: float = 1.0
) -> Verdict:
    """Name the ranks (indices of ``figures``) whose matrix throughput or copy bandwidth is an outlier (and, with
    ``floor``, below median / floor: NODE_FACTOR for CPU ranks, which share cores and read their noise)."""
    rules, slow, failing = {}, [], []
    for metric in METRICS:
        values = [getattr(f, metric) for f in figures]
        rule = outliers.judge_values(values, k, judged=len(values) >= MIN_RANKS)
        rules[metric] = rule
        slow += [
            Slow(r, metric, v, rule.median) for r, v in enumerate(values) if rule.is_slow(v) and v * floor < rule.median
        ]
        if fail_below is not None:
            failing += [Slow(r, metric, v, rule.median) for r, v in enumerate(values) if v < fail_below * rule.median]
    return Verdict(rules, slow, failing)


@dataclass(frozen=True)
class NodeFigure:
    """One node's figure against the fastest node's."""

    host: str
    ranks: list[int]
    """Its ranks (indices of the figures judged)."""
    metric: str
    value: float
    """The geometric median of its ranks' figures."""
    fastest_host: str
    fastest: float
    """The fastest node's figure."""

    @property
    def factor(self) -> float:
        """How many times the fastest node reads this node's figure."""
        return self.fastest / max(self.value, 1e-12)

    @property
    def slow(self) -> bool:
        return self.factor >= NODE_FACTOR


def judge_nodes(figures: list[DeviceHealth], hosts: list[str]) -> list[NodeFigure]:
    """Each node's figures against the fastest node's, the slowest first (empty with fewer than 2 nodes)."""
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    if len(by_host) < 2:
        return []
    found = []
    for metric in METRICS:
        values = {
            h: outliers.judge_values([getattr(figures[r], metric) for r in rs], 1.0, False).median
            for h, rs in by_host.items()
        }
        fastest = max(values, key=values.__getitem__)
        found += [NodeFigure(h, by_host[h], metric, v, fastest, values[fastest]) for h, v in values.items()]
    return sorted(found, key=lambda n: -n.factor)


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


def _node(node: NodeFigure, ranks: list[dict]) -> dict:
    return {
        "host": node.host,
        "ranks": [ranks[r]["rank"] for r in node.ranks],
        "device": ranks[node.ranks[0]]["device"],
        "metric": node.metric,
        "value": node.value,
        "fastest_host": node.fastest_host,
        "fastest": node.fastest,
        "factor": node.factor,
    }


def below_peak(ranks: list[dict]) -> list[dict]:
    """GPU ranks whose bf16 matrix throughput is below 1/NODE_FACTOR of their GPU's data-sheet peak
    (app/runtime/devices.py's table; an H200 reads about 0.68 of it), whatever the other ranks read."""
    found = []
    for r in ranks:
        peak = table_peak(r.get("device_name", "")) if r["device"].startswith("cuda") else None
        if peak is not None and r["health"]["flops"] * NODE_FACTOR < peak.tflops * 1e12:
            named = {"rank": r["rank"], "host": r["host"], "device": r["device"], "value": r["health"]["flops"]}
            found.append(named | {"peak": peak.tflops * 1e12, "source": peak.source})
    return found


def section(ranks: list[dict], k: float, fail_below: float | None) -> dict:
    """The report's ``device_health`` from every rank's ``health`` (asdict of DeviceHealth), in rank order."""
    figures = [DeviceHealth(**r["health"]) for r in ranks]
    first = figures[0]
    verdict = judge(figures, k, fail_below, floor=1.0 if first.device.startswith("cuda") else NODE_FACTOR)
    nodes = judge_nodes(figures, [r["host"] for r in ranks])
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
        "node_factor": NODE_FACTOR,
        "slow_nodes": [_node(n, ranks) for n in nodes if n.slow],
        "slowest_node": _node(nodes[0], ranks) if nodes else None,
        "below_peak": below_peak(ranks),
    }


def describe_slow(entry: dict) -> str:
    """``rank 3 on node1 (cuda:1): 212.0 TFLOP/s against a median of 690.0``."""
    value = figure(entry["metric"], entry["value"], entry["device"])
    median = figure(entry["metric"], entry["median"], entry["device"]).split(" ")[0]
    return f"rank {entry['rank']} on {entry['host']} ({entry['device']}): {value} against a median of {median}"


def describe_node(entry: dict) -> str:
    """``ddp-cluster-worker-1 (ranks 2, 3): 12.0 GFLOP/s, 6.8x below ddp-cluster-head-1's 82.0``."""
    value = figure(entry["metric"], entry["value"], entry["device"])
    fastest = figure(entry["metric"], entry["fastest"], entry["device"]).split(" ")[0]
    ranks = ("rank " if len(entry["ranks"]) == 1 else "ranks ") + ", ".join(map(str, entry["ranks"]))
    return f"{entry['host']} ({ranks}): {value}, {entry['factor']:.1f}x below {entry['fastest_host']}'s {fastest}"


def describe_peak(entry: dict) -> str:
    """``rank 3 on node1 (cuda:1): 212.0 TFLOP/s, below a third of the data sheet (H200)'s bf16 peak of 989.4``."""
    value, peak = figure("flops", entry["value"], entry["device"]), entry["peak"] / 1e12
    return (
        f"rank {entry['rank']} on {entry['host']} ({entry['device']}): {value}, below 1/{NODE_FACTOR:g} of the "
        f"{entry['source']}'s bf16 peak of {peak:.1f}"
    )


def node_lines(part: dict) -> list[str]:
    """The nodes' verdict: each slow node, or the slowest and how far it is from being named."""
    factor = f"{part['node_factor']:g}x"
    if part["slow_nodes"]:
        return [
            f"slow node: {describe_node(e)}: sure, beyond the {factor} that noise between equal nodes stays under"
            for e in part["slow_nodes"]
        ]
    slowest = part["slowest_node"]
    if slowest is None:
        return []
    return [f"verdict: no slow node (the slowest: {describe_node(slowest)}; a node is named at {factor} or more)"]


def format_lines(report: dict) -> list[str]:
    """The verdict lines under app check's rank table."""
    part = report["device_health"]
    n = report["world_size"]
    head = (
        f"device health: {part['matmul_size']}x{part['matmul_size']} {part['dtype']} matrix products, "
        f"copies of {part['copy_bytes'] >> 20} MiB"
    )
    nodes = node_lines(part) + [f"slow: {describe_peak(e)}" for e in part["below_peak"]]
    if part["threshold_flops"] is None:
        return [
            head,
            *nodes,
            f"verdict: {n} rank(s): the outlier rule needs {MIN_RANKS} or more (--fail-below judges fewer)",
        ]
    if not part["slow"]:
        return [head, *nodes, "verdict: no slow device"]
    return [head, *nodes, *(f"slow: {describe_slow(entry)}" for entry in part["slow"])]


def failures(report: dict) -> list[dict]:
    """check's failures: each slow node, and the ranks below --fail-below (one per metric)."""
    part = report["device_health"]
    found = [
        {"operation": "device_health", "ranks": e["ranks"], "detail": f"slow node {describe_node(e)}"}
        for e in part["slow_nodes"]
    ]
    found += [
        {"operation": "device_health", "ranks": [e["rank"]], "detail": describe_peak(e)} for e in part["below_peak"]
    ]
    for metric in METRICS:
        below = [entry for entry in part["below_fail"] if entry["metric"] == metric]
        if below:
            detail = "; ".join(f"{describe_slow(e)}, below {part['fail_below']:g} x the median" for e in below)
            found.append({"operation": "device_health", "ranks": [e["rank"] for e in below], "detail": detail})
    return found
