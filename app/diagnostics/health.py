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

The time goes in rounds (up to SAMPLES, 5 at the default 2 s): each round one sample of the product
and one of the copy, each sample running until it spans at least 0.2 s (``seconds`` / 2 / rounds),
longer than the 100 ms period of the kernel's CPU quota, so a container limited with ``docker update
--cpus`` shows its share rather than a burst. A figure is the median of its rounds. ``app check``
starts every sample on every rank at once (its barrier), so the nodes' samples share the same moments
of the machine's load.

Two verdicts. Nodes as nodes (``judge_nodes``, 2 or more hosts), round by round: a node's figure in a
round is its ranks' sum on CPUs (they share its cores), their geometric median on GPUs; its factor is
how many times that round's fastest node reads it, and a node is slow when its factor in the median
round is NODE_FACTOR (2) or more, on either figure (the check then fails); the line says in how many
rounds (why 2: NODE_FACTOR). An outlier rule over ranks cannot name a node whose ranks are half of all
(2 nodes x 2 ranks: the rule's median falls between the slow and the fast). Ranks (``judge``): the
outlier rule of ``app links`` (app/diagnostics/outliers.py) over each figure: with 3 or more ranks, a
rank below median / s^k is named (on CPUs also only below median / CPU_RANK_FLOOR: ranks share the
cores); ``fail_below`` names the ranks below that fraction of the median. GPUs (``below_peak``): a rank
below 1/PEAK_FLOOR of its GPU's data-sheet bf16 peak (app/runtime/devices.py's table) fails the check
whatever the others read (an H200 reads about 0.68 of its 989 TFLOP/s).
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
NODE_FACTOR = 2.0
"""A node is slow when the fastest node reads this many times its figure or more in the median round (equal nodes
measured together read at most 1.69x apart on a 2-core machine beside 0-4 busy loops, a node held to a third of its
speed 2.27x or more: docs/measuring.md)."""
CPU_RANK_FLOOR = 3.0
"""On CPUs the rule over ranks names a rank only below median / this too (ranks share the cores)."""
PEAK_FLOOR = 3.0
"""A GPU below 1/this of its data sheet's bf16 peak fails the check (an H200 reads about 0.68 of it)."""


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
    flops_rounds: tuple[float, ...] = ()
    """The product's rate in each round (the figure is their median)."""
    copy_gbps_rounds: tuple[float, ...] = ()
    """The copy's rate in each round."""

    @classmethod
    def of(cls, fields: dict) -> "DeviceHealth":
        """From its ``asdict``, as JSON gives it back (the rounds as lists, or none in older records)."""
        rounds = {k: tuple(fields.get(k) or ()) for k in ("flops_rounds", "copy_gbps_rounds")}
        return cls(**(fields | rounds))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _calls_per_check(step: Callable[[], object], device: torch.device, sample_s: float) -> int:
    """Warm ``step`` with one untimed call, time a second: the calls between two looks at the clock (a tenth of
    a sample, so a sample overruns its time by a tenth at most)."""
    step()
    synchronize(device)
    start = time.perf_counter()
    step()
    synchronize(device)
    once = max(time.perf_counter() - start, 1e-9)
    return max(1, round(sample_s / 10 / once))


def sample(step: Callable[[], object], work: float, device: torch.device, sample_s: float, calls: int) -> float:
    """``work`` per second of ``step``, over calls until they span ``sample_s``.

    The sample runs until it spans its time, not a count of calls guessed from one call: under a CPU quota the
    calibration call can be the throttled one, and the few calls it implied then fitted in one quota period (a rank
    at 0.1 CPU read 170 GFLOP/s, twice a free node)."""
    start, done, elapsed = time.perf_counter(), 0, 0.0
    while elapsed < sample_s:
        for _ in range(calls):
            step()
        synchronize(device)
        done += calls
        elapsed = time.perf_counter() - start
    return work * done / elapsed


def rate(step: Callable[[], object], work: float, device: torch.device, budget_s: float) -> float:
    """``work`` per second of ``step``: the median over samples that share ``budget_s`` (each at least
    MIN_SAMPLE_S), after one untimed call."""
    sample_s = max(budget_s / SAMPLES, MIN_SAMPLE_S)
    calls = _calls_per_check(step, device, sample_s)
    rates, deadline = [], time.perf_counter() + budget_s
    while len(rates) < SAMPLES and (len(rates) < 1 or time.perf_counter() < deadline):
        rates.append(sample(step, work, device, sample_s, calls))
    return statistics.median(rates)


def _product(device: torch.device) -> tuple[Callable[[], object], float, int]:
    """(step, FLOP per step, n): an n x n matrix product on ``device``."""
    n = MATMUL_SIZE.get(device.type, MATMUL_SIZE["cpu"])
    a = torch.randn(n, n, device=device).to(matmul_dtype(device))
    b = torch.randn(n, n, device=device).to(matmul_dtype(device))
    out = torch.empty_like(a)
    return lambda: torch.mm(a, b, out=out), 2.0 * n**3, n


def _copy(device: torch.device, nbytes: int) -> Callable[[], object]:
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def memcpy_gbps(device: torch.device, nbytes: int, budget_s: float) -> float:
    """Bytes copied per second (GB/s) by a torch copy of ``nbytes`` on ``device``."""
    return rate(_copy(device, nbytes), nbytes, device, budget_s) / 1e9


def rounds_for(seconds: float) -> int:
    """Rounds of ``measure`` in ``seconds``: SAMPLES, fewer where two samples of MIN_SAMPLE_S do not fit."""
    return max(1, min(SAMPLES, int(seconds / (2 * MIN_SAMPLE_S))))


def measure(
    device: torch.device, seconds: float = SECONDS, together: Callable[[], object] | None = None
) -> DeviceHealth:
    """Measure ``device`` in about ``seconds``: rounds of one sample of the product and one of the copy.

    ``together`` (app check's barrier) starts each sample on every rank at once: every node's samples then share
    the same moments of the machine's load, and the node verdict compares nodes round by round (on a busy
    2-core machine samples taken at different moments put equal nodes 3.5x apart on copy speed)."""
    start = time.perf_counter()
    rounds = rounds_for(seconds)
    sample_s = max(seconds / 2 / rounds, MIN_SAMPLE_S)
    product, flop, n = _product(device)
    nbytes = COPY_BYTES.get(device.type, COPY_BYTES["cpu"])
    copy = _copy(device, nbytes)
    steps = [(product, flop, []), (copy, nbytes / 1e9, [])]
    calls = [_calls_per_check(step, device, sample_s) for step, _, _ in steps]
    for _ in range(rounds):
        for (step, work, found), every in zip(steps, calls, strict=True):
            if together is not None:
                together()
            found.append(sample(step, work, device, sample_s, every))
    flops, gbps = steps[0][2], steps[1][2]
    return DeviceHealth(
        device=str(device),
        dtype=str(matmul_dtype(device)).removeprefix("torch."),
        matmul_size=n,
        flops=statistics.median(flops),
        copy_bytes=nbytes,
        copy_gbps=statistics.median(gbps),
        seconds=time.perf_counter() - start,
        flops_rounds=tuple(flops),
        copy_gbps_rounds=tuple(gbps),
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
    ``floor``, below median / floor: CPU_RANK_FLOOR for CPU ranks, which share cores and read their noise)."""
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
    """One node's figure against the fastest node's, round by round."""

    host: str
    ranks: list[int]
    """Its ranks (indices of the figures judged)."""
    metric: str
    value: float
    """The median over rounds of the node's figure (``node_figure`` of its ranks' in that round)."""
    fastest_host: str
    fastest: float
    """The fastest node's figure (the highest ``value``)."""
    factor: float
    """The median over rounds of how many times that round's fastest node reads this node's figure."""
    rounds: int
    """Rounds compared (1 where the ranks' figures carry no rounds)."""
    slow_rounds: int
    """Rounds in which the factor was NODE_FACTOR or more."""

    @property
    def slow(self) -> bool:
        """NODE_FACTOR or more in the median round: in most rounds, measured at the same moments."""
        return self.factor >= NODE_FACTOR


def _rounds(figures: list[DeviceHealth], metric: str) -> list[list[float]]:
    """Each rank's figure round by round; one round (the figures) where a rank has none or they differ in count."""
    every = [list(getattr(f, f"{metric}_rounds")) for f in figures]
    if every and every[0] and all(len(r) == len(every[0]) for r in every):
        return every
    return [[getattr(f, metric)] for f in figures]


def node_figure(values: list[float], device: str) -> float:
    """A node's figure from its ranks' in one round: on CPUs their sum (the ranks share the node's cores: a node
    of 2 ranks reads half a node of 1 per rank), on GPUs their geometric median (a device per rank)."""
    if device == "cpu":
        return sum(values)
    return outliers.judge_values(values, 1.0, False).median


def judge_nodes(figures: list[DeviceHealth], hosts: list[str]) -> list[NodeFigure]:
    """Each node's figures against the fastest node's, round by round, the slowest first (empty with fewer
    than 2 nodes). A round's node figure is ``node_figure`` of its ranks' figures in that round."""
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    if len(by_host) < 2:
        return []
    found = []
    for metric in METRICS:
        ranks = _rounds(figures, metric)
        count = len(ranks[0])
        node = {  # host -> its figure in each round
            h: [node_figure([ranks[r][i] for r in rs], figures[rs[0]].device) for i in range(count)]
            for h, rs in by_host.items()
        }
        best = [max(v[i] for v in node.values()) for i in range(count)]
        values = {h: statistics.median(v) for h, v in node.items()}
        fastest = max(values, key=values.__getitem__)
        for h, v in node.items():
            factors = [b / max(x, 1e-12) for b, x in zip(best, v, strict=True)]
            slow_rounds = sum(f >= NODE_FACTOR for f in factors)
            found.append(
                NodeFigure(h, by_host[h], metric, values[h], fastest, values[fastest], statistics.median(factors),
                           count, slow_rounds)
            )  # fmt: skip
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
        "rounds": node.rounds,
        "slow_rounds": node.slow_rounds,
    }


def below_peak(ranks: list[dict]) -> list[dict]:
    """GPU ranks whose bf16 matrix throughput is below 1/PEAK_FLOOR of their GPU's data-sheet peak
    (app/runtime/devices.py's table; an H200 reads about 0.68 of it), whatever the other ranks read."""
    found = []
    for r in ranks:
        peak = table_peak(r.get("device_name", "")) if r["device"].startswith("cuda") else None
        if peak is not None and r["health"]["flops"] * PEAK_FLOOR < peak.tflops * 1e12:
            named = {"rank": r["rank"], "host": r["host"], "device": r["device"], "value": r["health"]["flops"]}
            found.append(named | {"peak": peak.tflops * 1e12, "source": peak.source})
    return found


def section(ranks: list[dict], k: float, fail_below: float | None) -> dict:
    """The report's ``device_health`` from every rank's ``health`` (asdict of DeviceHealth), in rank order."""
    figures = [DeviceHealth.of(r["health"]) for r in ranks]
    first = figures[0]
    verdict = judge(figures, k, fail_below, floor=1.0 if first.device.startswith("cuda") else CPU_RANK_FLOOR)
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
    """``ddp-cluster-worker-1 (ranks 2, 3): 12.0 GFLOP/s against ddp-cluster-head-1's 82.0, 6.8x below it in the
    median round``."""
    value = figure(entry["metric"], entry["value"], entry["device"])
    fastest = figure(entry["metric"], entry["fastest"], entry["device"]).split(" ")[0]
    ranks = ("rank " if len(entry["ranks"]) == 1 else "ranks ") + ", ".join(map(str, entry["ranks"]))
    return (
        f"{entry['host']} ({ranks}): {value} against {entry['fastest_host']}'s {fastest}, "
        f"{entry['factor']:.1f}x below it in the median round"
    )


def describe_peak(entry: dict) -> str:
    """``rank 3 on node1 (cuda:1): 212.0 TFLOP/s, below a third of the data sheet (H200)'s bf16 peak of 989.4``."""
    value, peak = figure("flops", entry["value"], entry["device"]), entry["peak"] / 1e12
    return (
        f"rank {entry['rank']} on {entry['host']} ({entry['device']}): {value}, below 1/{PEAK_FLOOR:g} of the "
        f"{entry['source']}'s bf16 peak of {peak:.1f}"
    )


def node_lines(part: dict) -> list[str]:
    """The nodes' verdict: each slow node and how sure (in how many rounds), or the slowest and how far it is
    from being named."""
    factor = f"{part['node_factor']:g}x"
    lines = []
    for e in part["slow_nodes"]:
        sure = "sure" if e["slow_rounds"] == e["rounds"] else "likely"
        lines.append(f"slow node: {describe_node(e)}: {sure}, {factor} or more in {e['slow_rounds']} of {e['rounds']} "
                     "round(s) measured at the same moments")  # fmt: skip
    slowest = part["slowest_node"]
    if lines or slowest is None:
        return lines
    return [f"verdict: no slow node (the slowest: {describe_node(slowest)}; a node is named at {factor} or more in "
            "most rounds)"]  # fmt: skip


def flagged(part: dict) -> bool:
    """A device named by a rule that fails the check: a slow node, a GPU below its data sheet, a rank below
    --fail-below."""
    return bool(part["slow_nodes"] or part["below_peak"] or part["below_fail"])


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
    if not part["slow"]:  # the rule over ranks named none: "no slow device" only where no other rule named one
        return [head, *nodes] if flagged(part) else [head, *nodes, "verdict: no slow device"]
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
