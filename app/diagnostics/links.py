"""Bandwidth and latency between every pair of nodes, and the verdict: which node or link is slow.

    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0:29500 -m app links
    mpirun -np 4 -H a:1,b:1,c:1,d:1 -x MASTER_ADDR=a -x MASTER_PORT=29500 python -m app links --json links.json
    srun -N 4 --ntasks-per-node 1 python -m app links --plot links.png --fail-below 0.5
    make cluster-links                        # the compose mini-cluster: 3 containers x 1 rank

One rank per node takes part: the lowest rank of each host name (the others wait in the group
until the end, so --timeout must cover the whole run). Nodes meet in a round-robin schedule of
disjoint pairs (the circle method): N-1 rounds for an even number of nodes, N rounds for an odd
number, where each round one node has a bye. In each round both directions of each pair are
measured, one after the other, all pairs of the round at once:

  latency     half the round trip of an 8-byte ping-pong that the sender starts (us)
  bandwidth   --bytes sent and acknowledged (GB/s, 1e9 bytes)

The whole schedule runs --iters times; each time every link makes 4 ping-pongs, --warmup untimed
transfers (a connection idle since the last visit starts slowly) and one timed transfer, and the
best of each counts: other traffic only slows a transfer down, and spread over the run it cannot
spoil all of a link's samples.

Rank 0 prints the N x N tables (rows: sender, columns: receiver, names: host names) and the verdict,
by the outlier rule of app/diagnostics/outliers.py over all links' bandwidth: a link is slow when
its bandwidth is below median / s^k, with s = max(exp(1.4826 x MAD of ln bandwidth), 1.25) (median:
the geometric one; MAD: median absolute deviation; --k, default 3): with k = 3 about half the
median, or lower where the links are noisy. A node is named when its links in one direction are slow
as a group (it sends or receives slowly): their geometric mean is below the median of the links that
do not touch it / s^(k / sqrt(m)), m its links in that direction (a mean of m links has 1/sqrt(m) of
one link's noise; fewer than m such links judge nothing), and each of them below that median /
s^(k/2): with 3 nodes below 0.62 of the others, with 4 below 0.68 (each link below 0.72), so a node
at half speed is named in every run where its single links straddle the one-link threshold (median
and s here are those of the links that do not touch the node). Nodes are named slowest group first,
and the links a named node explains judge nothing else: a slow sender's links do not count against
their receivers. A link is named when it is slow and no named node explains it. The rule needs 3 or
more nodes (with 2 only --fail-below judges) and holds while fewer than half the links are slow;
with 3 nodes one noisy link besides a slow node can hide it, so use 4 or more where you can.

--fail-below FRACTION: exit status 1 when any link's bandwidth is below FRACTION x the median
(the error line names them); without it the verdict is reported and the exit status is 0.

JSON (--json PATH; rank 0 writes it; keys are stable, new keys may be added):
  schema             "ddp-cluster/links/1"
  nodes              host names, in rank order of their first rank (the matrices' order)
  ranks              the global rank that measured for each node
  backend, launcher  gloo or nccl; torchrun, openmpi, mpich, slurm or single
  bytes, iters, warmup, k, fail_below   the flags (fail_below null when not given)
  rounds             the schedule: per round, its pairs [a, b] of node indices (both directions run)
  bandwidth_gbps     N x N, [sender][receiver], null on the diagonal
  latency_us         N x N, likewise
  median_gbps, mad_log, spread, threshold_gbps   the rule's figures: median, MAD of ln bandwidth, s
                     and median / s^k (spread and threshold null with fewer than 3 nodes)
  slow_nodes         [{"node", "direction": "send" | "receive" | "both"}]
  slow_links         [{"src", "dst", "gbps"}]: slow links that no named node explains
  below_fail         [{"src", "dst", "gbps"}]: links below fail_below x median
  ok                 false when below_fail is not empty
"""

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from app import plots
from app.atomic import atomic_write_text
from app.diagnostics import outliers
from app.diagnostics.collectives import format_size, size_parser, synchronize
from app.diagnostics.outliers import DEFAULT_K
from app.errors import ClusterError, UsageError, first_line
from app.flags import flag
from app.runtime.distributed import (
    DistContext,
    add_command_arguments,
    command_process,
    process_group,
    report_inside,
    subgroup,
)

SCHEMA = "ddp-cluster/links/1"
LATENCY_BYTES = 8
PINGS_PER_VISIT = 4
"""Ping-pongs per link at each of its --iters visits; the best of all counts."""


@dataclass(frozen=True)
class LinksConfig:
    """Links: what the test sends, how it judges, where it reports."""

    nbytes: int = field(
        default=16 << 20, metadata=flag(parse=size_parser("--bytes"), option="--bytes", show="16 MiB", metavar="SIZE")
    )
    """Bytes per transfer."""
    iters: int = 5
    """Timed transfers per link; the best counts."""
    warmup: int = 1
    """Untimed transfers before each timed one."""
    k: float = DEFAULT_K
    """A link is slow below median / s^k, s: the spread of the links (the rule below says how)."""
    fail_below: float | None = field(default=None, metadata=flag(metavar="FRACTION"))
    """Exit status 1 when a link is below FRACTION x median."""
    json: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Also write the report as JSON (keys: see below)."""
    plot: str | None = field(default=None, metadata=flag(metavar="PATH.png", parse=plots.png_path))
    """Also draw the bandwidth matrix as a heatmap (PNG)."""

    def __post_init__(self) -> None:
        if self.nbytes < 1:
            raise UsageError(f"--bytes {self.nbytes} must be >= 1")
        if self.warmup < 0 or self.iters < 1:
            raise UsageError(f"--warmup {self.warmup} must be >= 0 and --iters {self.iters} >= 1")
        outliers.check_k(self.k)
        outliers.check_fraction(self.fail_below)


# --- the schedule and the verdict (pure) -------------------------------------------------------


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs that meet every pair of ``n`` nodes once (circle method).

    n even: n-1 rounds of n/2 pairs; n odd: n rounds of (n-1)/2 pairs, one node idle (a bye) each.
    """
    slots = list(range(n)) + ([None] if n % 2 else [])
    m = len(slots)
    rounds = []
    for _ in range(m - 1):
        pairs = [(slots[i], slots[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        slots = [slots[0], slots[-1], *slots[1:-1]]
    return rounds


def directed(rounds: list[list[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
    """The phases that run: each round's pairs a->b, then the same pairs b->a."""
    phases = []
    for pairs in rounds:
        phases += [pairs, [(b, a) for a, b in pairs]]
    return phases


@dataclass(frozen=True)
class Verdict:
    """What the outlier rule found in a bandwidth matrix."""

    median: float
    """Geometric median of the links' bandwidth."""
    mad_log: float
    """Median absolute deviation of ln bandwidth."""
    spread: float | None
    """s: max(exp(1.4826 x mad_log), 1.25); None with fewer than 3 nodes."""
    threshold: float | None
    """median / s^k: below it a link is slow."""
    slow_nodes: list[tuple[int, str]]
    """(node, "send" | "receive" | "both")."""
    slow_links: list[tuple[int, int]]
    """Slow links that no slow node explains."""


def off_diagonal(matrix: list[list[float | None]]) -> dict[tuple[int, int], float]:
    """{(sender, receiver): value} for every link."""
    return {(i, j): v for i, row in enumerate(matrix) for j, v in enumerate(row) if i != j and v is not None}


def judge(matrix: list[list[float | None]], k: float) -> Verdict:
    """Apply the outlier rule (see the module docstring) to a bandwidth matrix."""
    links = off_diagonal(matrix)
    n = len(matrix)
    rule = outliers.judge_values(list(links.values()), k, judged=n >= 3)
    if rule.threshold is None:
        return Verdict(rule.median, rule.mad_log, None, None, [], [])
    named: dict[int, str] = {}

    def explained(src: int, dst: int) -> bool:
        return named.get(src) in ("send", "both") or named.get(dst) in ("receive", "both")

    while (worst := _slowest_group(links, named, explained, k, rule.is_slow)) is not None:
        node, direction = worst
        named[node] = "both" if named.get(node, direction) != direction else direction
    nodes = sorted(named.items())
    slow_links = sorted(link for link, v in links.items() if rule.is_slow(v) and not explained(*link))
    return Verdict(rule.median, rule.mad_log, rule.spread, rule.threshold, nodes, slow_links)


def _slowest_group(links: dict, named: dict[int, str], explained, k: float, is_slow) -> tuple[int, str] | None:
    """The node and direction whose links, not yet explained by a named node, are slowest as a group
    (None: no group is slow); the links that a named node explains judge nothing else. A named node's other
    direction is named too only when each of its links is slow by the whole matrix's rule (``is_slow``): once a
    node's slow direction is explained, few figures are left to judge its other one against (two on 3 nodes), and
    the rule's least spread on two figures took 1.6x for slow (a loaded run's links into a node throttled on send)."""
    candidates = []
    for node in sorted({a for a, _ in links}):
        others = [v for (a, b), v in links.items() if node not in (a, b) and not explained(a, b)]
        for direction, end in (("send", 0), ("receive", 1)):
            if named.get(node) in (direction, "both"):
                continue
            group = [v for link, v in links.items() if link[end] == node and not explained(*link)]
            if named.get(node) and not all(is_slow(v) for v in group):
                continue
            if len(group) >= 2 and outliers.slow_as_a_group(group, others, k):
                candidates.append((statistics.fmean(math.log(max(v, 1e-12)) for v in group), node, direction))
    return min(candidates)[1:] if candidates else None


def below(matrix: list[list[float | None]], median: float, fraction: float | None) -> list[tuple[int, int]]:
    """Links whose bandwidth is below ``fraction`` x ``median`` (none without a fraction)."""
    if fraction is None:
        return []
    return sorted(link for link, v in off_diagonal(matrix).items() if v < fraction * median)


# --- the measurement --------------------------------------------------------------------------


def leaders(hosts: list[str]) -> list[int]:
    """The first rank of each host name, in rank order: one rank per node takes part."""
    return [hosts.index(host) for host in dict.fromkeys(hosts)]


class _Link:
    """Transfers between this node's rank and a peer's rank, inside the leaders' group."""

    def __init__(self, ctx: DistContext, cfg: LinksConfig, group) -> None:
        self.cfg, self.device, self.group = cfg, ctx.device, group
        self.data = torch.zeros(max(1, cfg.nbytes), dtype=torch.uint8, device=ctx.device)
        self.small = torch.zeros(LATENCY_BYTES, dtype=torch.uint8, device=ctx.device)

    def _send(self, tensor: torch.Tensor, peer: int) -> None:
        dist.send(tensor, dst=peer, group=self.group)

    def _recv(self, tensor: torch.Tensor, peer: int) -> None:
        dist.recv(tensor, src=peer, group=self.group)

    def _round_trip(self, payload: torch.Tensor, peer: int, sender: bool) -> float:
        """Sender: send ``payload``, wait for the 8-byte answer; seconds. Receiver: the other half."""
        start = time.perf_counter()
        if sender:
            self._send(payload, peer)
            self._recv(self.small, peer)
        else:
            self._recv(payload, peer)
            self._send(self.small, peer)
        synchronize(self.device)
        return time.perf_counter() - start

    def sample(self, peer: int, sender: bool, warmup: int) -> tuple[float, float]:
        """One visit of the link: (best ping round trip, one transfer), seconds, after ``warmup`` transfers."""
        ping = min(self._round_trip(self.small, peer, sender) for _ in range(PINGS_PER_VISIT))
        for _ in range(warmup):
            self._round_trip(self.data, peer, sender)
        return ping, self._round_trip(self.data, peer, sender)


def measure_links(ctx: DistContext, cfg: LinksConfig, nodes: list[int], rounds) -> dict[tuple[int, int], tuple]:
    """This rank's share: {(sender node, receiver node): (GB/s, latency us)} for the links it sent on.

    The whole schedule runs --iters times, one transfer per link each time, so a link's samples
    are spread over the run and a burst of other traffic cannot spoil all of them.
    """
    group = subgroup(nodes)  # every rank must call it, also those not in the group
    if ctx.proc.rank not in nodes:
        return {}
    me = nodes.index(ctx.proc.rank)
    link = _Link(ctx, cfg, group)
    samples: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for _ in range(cfg.iters):
        for pairs in directed(rounds):
            for src, dst in (pair for pair in pairs if me in pair):
                sender = me == src
                sample = link.sample(nodes[dst] if sender else nodes[src], sender, cfg.warmup)
                if sender:
                    samples.setdefault((src, dst), []).append(sample)
            dist.barrier(group=group)
    return {
        pair: (cfg.nbytes / min(t for _, t in got) / 1e9, min(p for p, _ in got) / 2 * 1e6)
        for pair, got in samples.items()
    }


def _gather(ctx: DistContext, local: dict) -> list[dict]:
    every: list = [None] * ctx.proc.world_size
    dist.all_gather_object(every, local)
    return every


def build_report(ctx: DistContext, cfg: LinksConfig) -> dict:
    """Measure every link; rank 0's return value is the whole report."""
    hosts = _gather(ctx, ctx.proc.host)
    nodes = leaders(hosts)
    names = [hosts[r] for r in nodes]
    if len(nodes) < 2:
        raise UsageError(
            f"links needs 2 or more nodes, but all {ctx.proc.world_size} rank(s) run on {names[0]}: "
            "start one rank (or more) on each node; for one node use 'app comm'"
        )
    rounds = round_robin(len(nodes))
    try:
        local = measure_links(ctx, cfg, nodes, rounds)
        found: dict = {}
        for share in _gather(ctx, local):
            found.update(share)
    except (RuntimeError, ValueError) as error:
        ctx.mark_broken("a link transfer failed")
        raise ClusterError(f"links: rank {ctx.proc.rank} lost a peer: {first_line(error)}") from None
    n = len(nodes)
    bandwidth = [[found[(i, j)][0] if i != j else None for j in range(n)] for i in range(n)]
    latency = [[found[(i, j)][1] if i != j else None for j in range(n)] for i in range(n)]
    verdict = judge(bandwidth, cfg.k)
    failing = below(bandwidth, verdict.median, cfg.fail_below)
    return {
        "schema": SCHEMA,
        "nodes": names,
        "ranks": nodes,
        "backend": ctx.backend,
        "launcher": ctx.proc.launcher.value,
        "bytes": cfg.nbytes,
        "iters": cfg.iters,
        "warmup": cfg.warmup,
        "k": cfg.k,
        "fail_below": cfg.fail_below,
        "rounds": [[list(pair) for pair in pairs] for pairs in rounds],
        "bandwidth_gbps": bandwidth,
        "latency_us": latency,
        "median_gbps": verdict.median,
        "mad_log": verdict.mad_log,
        "spread": verdict.spread,
        "threshold_gbps": verdict.threshold,
        "slow_nodes": [{"node": names[i], "direction": d} for i, d in verdict.slow_nodes],
        "slow_links": [_link(names, bandwidth, src, dst) for src, dst in verdict.slow_links],
        "below_fail": [_link(names, bandwidth, src, dst) for src, dst in failing],
        "ok": not failing,
    }


def _link(names: list[str], bandwidth, src: int, dst: int) -> dict:
    return {"src": names[src], "dst": names[dst], "gbps": bandwidth[src][dst]}


# --- output ------------------------------------------------------------------------------------


def format_matrix(title: str, names: list[str], matrix, fmt: str) -> str:
    """An N x N table, rows: sender, columns: receiver."""
    corner = "sender \\ receiver"
    first = max(len(corner), *(len(name) for name in names))
    width = max(9, *(len(name) for name in names))
    lines = [title, f"{corner:<{first}}" + "".join(f"  {name:>{width}}" for name in names)]
    for name, row in zip(names, matrix, strict=True):
        cells = "".join(f"  {'-' if v is None else format(v, fmt):>{width}}" for v in row)
        lines.append(f"{name:<{first}}{cells}")
    return "\n".join(lines)


def format_verdict(report: dict) -> list[str]:
    """The rule with its figures, and what it names."""
    n = len(report["nodes"])
    if report["threshold_gbps"] is None:
        return [f"verdict: {n} nodes: the outlier rule needs 3 or more (use --fail-below to judge 2)"]
    rule = outliers.Rule(report["median_gbps"], report["mad_log"], report["spread"], report["threshold_gbps"])
    lines = [f"rule: a link is slow below {outliers.formula(rule, report['k'], 'GB/s')}"]
    named = [f"node {s['node']} ({_direction(s['direction'])})" for s in report["slow_nodes"]]
    named += [f"link {s['src']} -> {s['dst']} ({s['gbps']:.3f} GB/s)" for s in report["slow_links"]]
    lines.append(f"verdict: slow: {'; '.join(named)}" if named else "verdict: no slow node or link")
    return lines


def _direction(direction: str) -> str:
    return {
        "send": "sends slowly: its links from it are slow together",
        "receive": "receives slowly: its links to it are slow together",
    }.get(direction, "its links from and to it are slow together")


def format_report(report: dict) -> str:
    """Everything rank 0 prints."""
    names = report["nodes"]
    n = len(names)
    schedule = f"{n - 1} rounds" if n % 2 == 0 else f"{n} rounds, one node idle (a bye) in each: odd N"
    lines = [
        f"ddp-cluster links: {n} nodes ({', '.join(names)}), one rank each, backend {report['backend']}, "
        f"launcher {report['launcher']}",
        f"schedule: round-robin, {schedule}; both directions per pair; {format_size(report['bytes'])} transfers, "
        f"best of {report['iters']} visits, {report['warmup']} warm-up transfer(s) before each",
        "",
        format_matrix("bandwidth (GB/s)", names, report["bandwidth_gbps"], ".3f"),
        "",
        format_matrix("latency (us, half round trip)", names, report["latency_us"], ".1f"),
        "",
        *format_verdict(report),
    ]
    return "\n".join(lines)


def plot(path: str, report: dict) -> None:
    """The bandwidth matrix as a heatmap."""
    plots.heatmap(
        path,
        report["bandwidth_gbps"],
        report["nodes"],
        unit="bandwidth (GB/s)",
        title=f"app links: {format_size(report['bytes'])} transfers, best of {report['iters']}",
    )


# --- command line ------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app links``."""
    add_command_arguments(parser, LinksConfig)


def _publish(report: dict, cfg: LinksConfig) -> None:
    """Rank 0's report, --json and --plot."""
    print(format_report(report), flush=True)
    if cfg.json:
        atomic_write_text(cfg.json, json.dumps(report, indent=2) + "\n")
    if cfg.plot:
        plot(cfg.plot, report)


def run(args: argparse.Namespace) -> int:
    """Measure on this rank; rank 0 prints, writes --json/--plot, and fails below --fail-below."""
    cfg, dist_cfg, proc = command_process(LinksConfig, args)
    with process_group(proc, dist_cfg) as ctx:
        report = build_report(ctx, cfg)
        published = report_inside(lambda: _publish(report, cfg), proc.is_main)
    published()
    if not proc.is_main:
        return 0 if report["ok"] else 1
    if not report["ok"]:
        slow = ", ".join(f"{s['src']} -> {s['dst']} {s['gbps']:.3f} GB/s" for s in report["below_fail"])
        raise ClusterError(f"links: below {report['fail_below']:g} x median {report['median_gbps']:.3f} GB/s: {slow}")
    return 0
