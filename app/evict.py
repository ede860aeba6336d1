"""A straggler's eviction from a running job: which node leaves, decided from rank 0's exchanges of step times
(``events.EXCHANGE``, every --exchange-every steps of app train), which every rank gets whole.

    python -m app cluster up --nodes 3 --nproc-per-node 1 --min-nodes 2 --command 'train --accum-steps 2 ...'
    python -m app cluster up ... --evict-factor 3 --evict-after 5      # a stricter policy; --evict-factor 0: never

A node is evicted when the job would run faster without it by a margin. At each exchange its ranks' time per step is
set against what the ranks of the other nodes would take without it: their median rank's, grown by their share of
its work (N/(N-1) with N equal nodes: 1.5 of 3 nodes). The step is set by the slowest node, so that ratio is about
what its leaving would shorten the step by. The node's time is its fastest rank's, read two ways: its busy time
(computing and loading, not waiting for the others), and its busy time plus the time its collective threads waited
for a CPU (``stall_ms``, app/train/stalls.py; 0 where an exchange has none): a CPU quota that runs out inside the
all-reduce shows there, not in busy time, for every rank waits in the all-reduce alike. The node is evicted when the
median of its ratio over the last 2 x ``--evict-after`` - 1 exchanges is ``--evict-factor`` or more
(``--evict-after`` of them at least that high), read by busy time alone (its own work, which the others wait for at
every step), or by busy time and waits for a CPU while the job's step (the median over the same exchanges) is its
share or more times the job's best (the lowest such median since these nodes began): slower than the others alone
would be. A median over several exchanges, so that a loaded machine's spike is no verdict; and waits for a CPU count
only where the job's step shows them, for a rank's threads may wait while it would wait for the others anyway (a
healthy head beside two busy loops read 2.0-2.3x at 6 exchanges in a row, its median of 7 2.2x, while the job's step
was 1.2x its best: tests/unit/golden/evict/README.md). A node slow by its waits alone from the job's first exchanges
has no faster pace to be set against: its gate, which measures it before it joins, is what keeps it out. Its ranks
then leave: the others lose it at a step, keep that step in their snapshot and go on at the same global batch
(app/train/resize.py), while its agent's gate measures it again every few seconds and lets it back in once it
passes. Nothing is evicted while the job has ``--min-nodes`` nodes or fewer, nor when the global batch would
not divide among the ranks left (the resize would refuse it); a node evicted again soon after its return waits
longer each time before its gate judges it (``backoff``), so a node that flaps cannot hold the job in rendezvous
rounds.

On every engine (compose, torchrun alone, Slurm, Kubernetes) each node's agent evicts its own node
(app/node/command.py, ``--evict-factor``, which every rendering passes where the job is elastic; the ``Policy`` is
built there once and handed whole to each rank): every rank gets the whole table at each exchange, so every rank
runs this same ``Watch`` and reaches the same verdict at the same step; rank 0 writes it to the job's events
(``evicted``), which the compose runner says. The straggler's ranks then leave with status ``LEFT`` and its agent
leaves the rendezvous round without closing it; the others' next collective fails, they keep that step and their
agents start a round without it (status ``PEER_LEFT``: a restart that torchrun's --max-restarts does not count).

    python -m app node --evict-factor 2 --evict-after 4 -- --nnodes 2:3 --rdzv-backend c10d ... -m app train
"""

import statistics
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields

from app.batch import keeps
from app.errors import UsageError

FACTOR = 2.0
"""The policy's default factor (the spec's --evict-factor): the job's step would be about half as long without the
node. Replayed over the recordings of tests/unit/golden/evict (3 nodes x 1 rank, quiet, beside busy loops and beside
make test), no healthy node's median of 7 reads 1.8 or more by busy time (1.77 at most), nor by busy time and waits
for a CPU but a head beside busy loops (2.16, the job's step then 1.22x its best); a worker held at a tenth of a CPU
reads 2.2-3.7 when it is evicted, one at a sixth or a quarter that cost the job more than a third of its samples/s
2.0-2.4 (the job's step 2.4-3.1x its best)."""
AFTER = 4
"""The policy's default --evict-after: the median of the last 7 (2 x 4 - 1) exchanges."""
LEFT = 4
"""Exit status of a rank whose own node was evicted (its agent, app node, leaves the rendezvous round)."""
PEER_LEFT = 5
"""Exit status of a rank whose collective failed because an evicted node left: its step is kept, and its agent's
restart is not counted against --max-restarts."""

BACKOFF_S = 30.0
"""Seconds a node evicted again within RECENT_S of its return waits before its gate; doubled at each repeat."""
RECENT_S = 300.0
"""A return that recent makes the next eviction a repeat (its wait doubles); later, the count starts afresh."""


@dataclass(frozen=True)
class Policy:
    """A job's straggler policy, built once from the spec's values (``ClusterSpec.nodes.eviction``, or app node's
    flags) and handed on whole: from app node to each rank it forks (``agent.Job.eviction``), which evicts its own
    node by it (``watch()``). Its values are checked here, the one place (UsageError: one line naming the flag)."""

    factor: float
    after: int
    min_nodes: int

    def __post_init__(self) -> None:
        if self.factor <= 1:
            raise UsageError(
                f"--evict-factor {self.factor:g} must be above 1 (a node busy that many times the others' share of its "
                "work per step, which its leaving would shorten the step by, is evicted; or busy and waiting for a "
                "CPU, where the job's step shows it), or 0: never evict"
            )
        if self.after < 1:
            raise UsageError(f"--evict-after {self.after} must be >= 1")
        if self.min_nodes < 1:
            raise UsageError(f"--min-nodes {self.min_nodes} must be >= 1 (the fewest nodes the job goes on with)")

    @classmethod
    def of(cls, factor: float, after: int, min_nodes: int) -> "Policy | None":
        """The policy of these values; None for ``factor`` 0 (never evict)."""
        return cls(factor, after, min_nodes) if factor else None

    def watch(self) -> "Watch":
        return Watch(self.factor, self.after, self.min_nodes, who="train")


@dataclass(frozen=True)
class Eviction:
    """A straggler to take out of the job, and the job it leaves behind."""

    node: str
    factor: float
    """Its fastest rank's time per step over the other nodes' median rank's grown by ``share`` (what they would take
    without it): busy time alone, or busy time and waits for a CPU when ``slower`` is set; the median over the last
    ``window`` exchanges."""
    exchanges: int
    """Exchanges at which it read ``least`` or more, of the last ``window``."""
    window: int
    window_s: float
    """From the first of the ``window`` exchanges to the last."""
    share: float
    """The others' work without it over their work with it: all ranks over the ranks left (1.5 of 3 nodes)."""
    least: float
    """The policy's factor (--evict-factor)."""
    nodes_left: int
    ranks_left: int
    global_batch: int
    accum_left: int
    slower: float = 0.0
    """The job's step over its best (the median of the last ``window`` exchanges over the lowest such median since
    these nodes began), when its waits for a CPU decided: ``share`` or more; 0 when its busy time alone did."""

    def fields(self) -> dict:
        """Its figures in the job's ``evicted`` event (app/events.py; its node is the record's ``evicted``)."""
        return {k: round(v, 2) if k in ("factor", "slower") else v for k, v in asdict(self).items() if k != "node"}

    @classmethod
    def of(cls, record: dict) -> "Eviction":
        """The eviction an ``evicted`` event records (``fields``), as the ranks decided it."""
        figures = {f.name: record[f.name] for f in dataclass_fields(cls) if f.name != "node" and f.name in record}
        return cls(str(record["evicted"]), **figures)

    def line(self, backoff_s: float, who: str = "cluster") -> str:
        """``cluster: node X evicted: busy 4.1x the others' share without it ...; the job goes on with ...``."""
        wait = f"; it waits {backoff_s:g} s (evicted again soon after its return)" if backoff_s else ""
        return (
            f"{who}: node {self.node} evicted: {judged(self)}; the job goes on with {self.nodes_left} nodes, "
            f"global batch {self.global_batch} (accum {self.accum_left}){wait}; its gate takes it back once it passes"
        )


def judged(e: "Eviction") -> str:
    """The figures the rule used: ``busy 4.1x the others' share without it (their median x 1.5), the median of the
    last 7 exchanges (5 at 2x or more, 12 s)``; where its waits for a CPU decided, ``busy and waiting for a CPU
    2.4x ... (4 at 2x or more, 2 s), the job's step 2.4x its best (the others alone: 1.5x)``."""
    what = "busy and waiting for a CPU" if e.slower else "busy"
    paid = f", the job's step {e.slower:.1f}x its best (the others alone: {e.share:.3g}x)" if e.slower else ""
    return (
        f"{what} {e.factor:.1f}x the others' share without it (their median x {e.share:.3g}), the median of the last "
        f"{e.window} exchanges ({e.exchanges} at {e.least:g}x or more, {e.window_s:.0f} s){paid}"
    )


@dataclass
class Watch:
    """The exchanges of one job, fed in order; says when a node is to be evicted."""

    factor: float
    after: int
    min_nodes: int
    seen: dict[str, list[tuple[float, float, float]]] = field(default_factory=dict)
    """Node -> its last ``window`` exchanges: (time, its busy time over the others' share without it, its busy time
    and waits for a CPU over theirs)."""
    refused: set[str] = field(default_factory=set)
    """Nodes already said to be stragglers that cannot be evicted (said once)."""
    who: str = "cluster"
    """Who says its lines: the cluster runner, or each node's ranks (``train``)."""
    members: tuple[str, ...] = ()
    """The hosts of the last exchange, one per rank: the job whose steps ``steps`` are."""
    steps: list[float] = field(default_factory=list)
    """The job's step time (ms) at its last ``window`` exchanges."""
    bests: dict[tuple[str, ...], float] = field(default_factory=dict)
    """The job's best pace on each set of nodes (their sorted hosts, one per rank): the lowest median of ``window``
    step times in a row on them, in this process or recalled (``recall``, an exchange's ``best_ms``)."""

    @property
    def best(self) -> float:
        """The job's best pace on the nodes of the last exchange (0: none known yet)."""
        return self.bests.get(tuple(sorted(self.members)), 0.0)

    def best_for(self, hosts: list[str]) -> float:
        """The job's best pace on the nodes of ``hosts`` (one per rank) known here (0: none)."""
        return self.bests.get(tuple(sorted(hosts)), 0.0)

    def recall(self, records: list[dict]) -> None:
        """Learn the job's best paces from its earlier exchanges (rank 0's metrics.jsonl ``ranks`` records: the rounds
        before this process), judging nothing: a node that comes back still slow is set against the pace the job
        had on the same nodes before."""
        for record in records:
            if record.get("hosts"):
                self._members(record["hosts"])
                self._paced(_step_ms(record))
        self.members, self.steps = (), []

    @property
    def window(self) -> int:
        """Exchanges a node is judged over, by their median: 2 ``after`` - 1, so that ``after`` of them at the factor
        or more put the median there (a CPU throttle's cost does not show at every exchange)."""
        return 2 * self.after - 1

    def feed(self, record: dict) -> Eviction | str | None:
        """The eviction this exchange calls for; or the line of a straggler that cannot be evicted (once); None."""
        hosts, busy = record.get("hosts") or [], record.get("busy_ms") or []
        if not self.factor or len(hosts) != len(busy) or not busy:
            return None
        stall = record.get("stall_ms") or []
        cost = [b + s for b, s in zip(busy, stall, strict=True)] if len(stall) == len(busy) else list(busy)
        by_node: dict[str, list[int]] = {}
        for rank, host in enumerate(hosts):
            by_node.setdefault(host, []).append(rank)
        self._members(hosts)
        if record.get("best_ms"):  # the best pace rank 0 recalled for these nodes (its earlier rounds)
            key = tuple(sorted(hosts))
            self.bests[key] = min(self.bests.get(key) or record["best_ms"], record["best_ms"])
        if len(by_node) <= self.min_nodes or min(busy) <= 0:
            self.seen.clear()
            return None
        at = float(record.get("time") or 0.0)
        self._paced(_step_ms(record))
        for node, ranks in by_node.items():  # every rank of it that slow: its fastest one
            share = len(hosts) / (len(hosts) - len(ranks))
            ratios = (min(busy[r] for r in ranks) / (_others(hosts, busy, node) * share),
                      min(cost[r] for r in ranks) / (_others(hosts, cost, node) * share))  # fmt: skip
            self.seen[node] = [*self.seen.get(node, []), (at, *ratios)][-self.window :]
        verdicts = {node: v for node in by_node if (v := self._verdict(node, len(hosts), len(by_node[node])))}
        if not verdicts:
            return None
        node = max(verdicts, key=lambda n: verdicts[n][0])  # one at a time: the slowest
        factor, slow, slower = verdicts[node]
        times = [t for t, _, _ in self.seen.pop(node)]
        ranks_left = len(hosts) - len(by_node[node])
        world, global_batch = int(record.get("world_size") or len(hosts)), int(record.get("global_batch") or 0)
        accum = int(record.get("accum_steps") or 1)
        per_rank = global_batch // (world * accum) if global_batch and world else 0
        share = len(hosts) / ranks_left
        eviction = Eviction(node, factor, slow, len(times), times[-1] - times[0], share, self.factor,
                            len(by_node) - 1, ranks_left, global_batch, global_batch // (per_rank * ranks_left) if
                            per_rank else 0, slower)  # fmt: skip
        if not per_rank or not keeps(global_batch, per_rank, ranks_left):
            if node in self.refused:
                return None
            self.refused.add(node)
            return (
                f"{self.who}: node {node} is a straggler ({judged(eviction)}) but is not evicted: the global batch "
                f"{global_batch} does not divide among the {ranks_left} ranks left (per-rank batch {per_rank}); pick "
                "a global batch that does (--accum-steps)"
            )
        return eviction

    def _members(self, hosts: list[str]) -> None:
        """Another set of ranks: the window of step times starts afresh (each set keeps its best)."""
        if tuple(hosts) != self.members:
            self.members, self.steps = tuple(hosts), []

    def _paced(self, step_ms: float) -> None:
        """The job's step time at this exchange joins its window (none known: nothing)."""
        if step_ms <= 0:
            return
        self.steps = [*self.steps, step_ms][-self.window :]
        if len(self.steps) == self.window:
            now, key = statistics.median(self.steps), tuple(sorted(self.members))
            self.bests[key] = min(self.bests.get(key) or now, now)

    def _verdict(self, node: str, ranks: int, its_ranks: int) -> tuple[float, int, float] | None:
        """(factor, exchanges at the factor or more, the job's step over its best or 0) when ``node`` is due: the
        median of its window at the factor or more, busy time alone, or busy time and waits for a CPU when the job's
        step is its share x its best or more (the others alone would be faster)."""
        judged_over = self.seen[node]
        for column in (1, 2):
            slow = sum(ratios[column] >= self.factor for ratios in judged_over)
            if slow < self.after:
                continue
            factor = statistics.median(ratios[column] for ratios in judged_over)
            if column == 1:
                return factor, slow, 0.0
            slower = statistics.median(self.steps) / self.best if self.best else 0.0
            if slower >= ranks / (ranks - its_ranks):
                return factor, slow, slower
        return None


def _step_ms(record: dict) -> float:
    """The job's step time (ms) of an exchange: its ``step_ms``, else from its samples/s; 0 when neither is there."""
    if record.get("step_ms"):
        return float(record["step_ms"])
    rate, global_batch = record.get("samples_per_s") or 0.0, record.get("global_batch") or 0
    return 1000 * global_batch / rate if rate > 0 else 0.0


def _others(hosts: list[str], times: list[float], node: str) -> float:
    """The median time per step of the ranks on the other nodes."""
    return statistics.median(ms for host, ms in zip(hosts, times, strict=True) if host != node)


def backoff(now: float, returned_at: float | None, last_wait: float) -> float:
    """Seconds a node evicted at ``now`` waits before its gate judges it: none the first time, nor when it returned
    (after its last eviction) more than RECENT_S ago; else BACKOFF_S, or twice its last wait."""
    if returned_at is None or now - returned_at > RECENT_S:
        return 0.0
    return max(BACKOFF_S, 2 * last_wait)
