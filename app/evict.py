"""A straggler's eviction from a running job: which node leaves, decided from rank 0's exchanges of step times
(``events.EXCHANGE``, every --exchange-every steps of app train), the facts the cluster runner reads.

    python -m app cluster up --nodes 3 --nproc-per-node 1 --min-nodes 2 --command 'train --accum-steps 2 ...'
    python -m app cluster up ... --evict-factor 4 --evict-after 5      # a stricter policy; --evict-factor 0: never

A node is a straggler when every one of its ranks is busy per step (computing and loading, not waiting for the
others) at least ``--evict-factor`` times as long as the median rank of the other nodes, at ``--evict-after`` of the
last 2 x ``--evict-after`` - 1 exchanges. The runner then stops its container (``runner``): the others lose it at a
step, keep that step in their snapshot and go on at the same global batch (app/train/resize.py), while its gate
measures it again every few seconds and lets it back in once it passes. Nothing is evicted while the job has
``--min-nodes`` nodes or fewer, nor when the global batch would not divide among the ranks left (the resize would
refuse it); a node evicted again soon after its return waits longer each time before its gate judges it
(``backoff``), so a node that flaps cannot hold the job in rendezvous rounds.

Where no runner watches the job (torchrun alone, Slurm, Kubernetes), each node's agent evicts its own node
(app/node/command.py, ``--evict-factor``, which the renderings pass where the job is elastic): every rank gets the
whole table at each exchange, so every rank runs this same ``Watch`` and reaches the same verdict at the same
step. The straggler's ranks then leave with status ``LEFT`` and its agent leaves the rendezvous round without
closing it; the others' next collective fails, they keep that step and their agents start a round without it
(status ``PEER_LEFT``: a restart that torchrun's --max-restarts does not count).

    python -m app node --evict-factor 3 --evict-after 3 -- --nnodes 2:3 --rdzv-backend c10d ... -m app train
"""

import statistics
from dataclasses import dataclass, field

from app.batch import keeps
from app.errors import UsageError

FACTOR = 3.0
"""The policy's default factor (the spec's --evict-factor): an undisturbed run's nodes read 3x or more at one
exchange at most twice, never twice within 5 (docs/faults.md)."""
AFTER = 3
"""The policy's default --evict-after."""
LEFT = 4
"""Exit status of a rank whose own node was evicted (its agent, app node, leaves the rendezvous round)."""
PEER_LEFT = 5
"""Exit status of a rank whose collective failed because an evicted node left: its step is kept, and its agent's
restart is not counted against --max-restarts."""

BACKOFF_S = 30.0
"""Seconds a node evicted again within RECENT_S of its return waits before its gate; doubled at each repeat."""
RECENT_S = 300.0
"""A return that recent makes the next eviction a repeat (its wait doubles); later, the count starts afresh."""


def check(factor: float, after: int) -> None:
    """The policy's values are valid (UsageError: one line that names the flag)."""
    if factor and factor <= 1:
        raise UsageError(
            f"--evict-factor {factor:g} must be above 1 (a node that many times the median rank's busy time per step "
            "is evicted), or 0: never evict"
        )
    if after < 1:
        raise UsageError(f"--evict-after {after} must be >= 1")


@dataclass(frozen=True)
class Policy:
    """A node agent's policy, told to its ranks (``launcher.export_eviction``): ``FACTOR:AFTER:MIN_NODES``."""

    factor: float
    after: int
    min_nodes: int

    def text(self) -> str:
        return f"{self.factor:g}:{self.after}:{self.min_nodes}"

    @classmethod
    def parse(cls, text: str) -> "Policy":
        """The policy of ``text`` (ValueError when it is not ``FACTOR:AFTER:MIN_NODES``)."""
        factor, after, min_nodes = text.split(":")
        policy = cls(float(factor), int(after), int(min_nodes))
        if policy.factor <= 1 or policy.after < 1 or policy.min_nodes < 1:
            raise ValueError(text)
        return policy

    def watch(self) -> "Watch":
        return Watch(self.factor, self.after, self.min_nodes, who="train")


@dataclass(frozen=True)
class Eviction:
    """A straggler to take out of the job, and the job it leaves behind."""

    node: str
    factor: float
    """Its fastest rank's busy time per step over the other nodes' median rank's: the median over its slow
    exchanges."""
    exchanges: int
    """Exchanges at which it was that slow, of the last ``window``."""
    window: int
    window_s: float
    """From the first of those exchanges to the last."""
    nodes_left: int
    ranks_left: int
    global_batch: int
    accum_left: int

    def line(self, backoff_s: float, who: str = "cluster") -> str:
        """``cluster: node X evicted: busy 4.1x the median for 3 exchanges (60 s); the job goes on with ...``."""
        wait = f"; it waits {backoff_s:g} s (evicted again soon after its return)" if backoff_s else ""
        return (
            f"{who}: node {self.node} evicted: busy {self.factor:.1f}x the others' median at {self.exchanges} of "
            f"the last {self.window} exchanges ({self.window_s:.0f} s); the job goes on with {self.nodes_left} nodes, "
            f"global batch {self.global_batch} (accum {self.accum_left}){wait}; its gate takes it back once it passes"
        )


@dataclass
class Watch:
    """The exchanges of one job, fed in order; says when a node is to be evicted."""

    factor: float
    after: int
    min_nodes: int
    seen: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Node -> its last ``window`` exchanges: (time, factor)."""
    refused: set[str] = field(default_factory=set)
    """Nodes already said to be stragglers that cannot be evicted (said once)."""
    who: str = "cluster"
    """Who says its lines: the cluster runner, or each node's ranks (``train``)."""

    @property
    def window(self) -> int:
        """Exchanges a node is judged over: ``after`` slow ones among the last 2 ``after`` - 1 (a CPU throttle shows
        in busy time at most exchanges, not at all: at the others every rank waits for the all-reduce alike)."""
        return 2 * self.after - 1

    def feed(self, record: dict) -> Eviction | str | None:
        """The eviction this exchange calls for; or the line of a straggler that cannot be evicted (once); None."""
        hosts, busy = record.get("hosts") or [], record.get("busy_ms") or []
        if not self.factor or len(hosts) != len(busy) or not busy:
            return None
        by_node: dict[str, list[float]] = {}
        for host, ms in zip(hosts, busy, strict=True):
            by_node.setdefault(host, []).append(ms)
        if len(by_node) <= self.min_nodes or min(busy) <= 0:
            self.seen.clear()
            return None
        at = float(record.get("time") or 0.0)
        for node, ms in by_node.items():  # every rank of it that slow
            self.seen[node] = [*self.seen.get(node, []), (at, min(ms) / _others(hosts, busy, node))][-self.window :]
        slow = {node: [(t, f) for t, f in self.seen[node] if f >= self.factor] for node in by_node}
        due = [node for node in by_node if len(slow[node]) >= self.after]
        if not due:
            return None
        node = max(due, key=lambda n: statistics.median(f for _, f in slow[n]))  # one at a time: the slowest
        times, factor = [t for t, _ in slow[node]], statistics.median(f for _, f in slow[node])
        del self.seen[node]
        ranks_left = len(hosts) - len(by_node[node])
        world, global_batch = int(record.get("world_size") or len(hosts)), int(record.get("global_batch") or 0)
        accum = int(record.get("accum_steps") or 1)
        per_rank = global_batch // (world * accum) if global_batch and world else 0
        if not per_rank or not keeps(global_batch, per_rank, ranks_left):
            if node in self.refused:
                return None
            self.refused.add(node)
            return (
                f"{self.who}: node {node} is a straggler (busy {factor:.1f}x the others' median at {len(times)} of the "
                f"last {self.window} exchanges) but is not evicted: the global batch {global_batch} does not divide "
                f"among the {ranks_left} ranks left (per-rank batch {per_rank}); pick a global batch that does "
                "(--accum-steps)"
            )
        return Eviction(node, factor, len(times), self.window, times[-1] - times[0], len(by_node) - 1, ranks_left,
                        global_batch, global_batch // (per_rank * ranks_left))  # fmt: skip


def _others(hosts: list[str], busy: list[float], node: str) -> float:
    """The median busy time per step of the ranks on the other nodes."""
    return statistics.median(ms for host, ms in zip(hosts, busy, strict=True) if host != node)


def backoff(now: float, returned_at: float | None, last_wait: float) -> float:
    """Seconds a node evicted at ``now`` waits before its gate judges it: none the first time, nor when it returned
    (after its last eviction) more than RECENT_S ago; else BACKOFF_S, or twice its last wait."""
    if returned_at is None or now - returned_at > RECENT_S:
        return 0.0
    return max(BACKOFF_S, 2 * last_wait)
