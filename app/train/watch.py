"""Straggler and hang reports: the ranks compare their step times every few steps, and a collective that
fails names the ranks that stopped answering.

    python -m app train --exchange-every 20 --straggler-percent 50   # the defaults
    torchrun ... -m app train --timeout 60                            # a collective that waits 60 s fails

Step times. Each rank times a window of optimizer steps: its wall time, the time it waited for
batches (data) and the time it waited for the gradient all-reduce (from its last gradient being
ready to the end of backward: waiting for the others). Its busy time is the wall time less that
wait: in synchronous DDP every rank's step takes as long as the slowest rank's, so the straggler is
not the rank with the longest steps but the one the others wait for, the one busy longest.
Checkpoint writes count as neither. Every --exchange-every steps one all_gather of five numbers per
rank shares the windows; rank 0 writes a ``ranks`` record to metrics.jsonl naming the slowest rank
and its host, and prints one line when the same rank is busy more than --straggler-percent longer
than the median rank at 5 exchanges in a row (STRAGGLER_EXCHANGES; again only when another rank
becomes the straggler): a line that would name another rank each time is noise. The
same exchange carries rank 0's time since its last checkpoint, so every rank agrees when
--checkpoint-every-seconds is due.

Hangs. A collective that times out (--timeout) or loses a peer raises on the ranks that are still
alive (a DistError, or a RuntimeError from gloo inside DDP's backward: ``collective_failed`` tells).
Each writes its rank, host and step under a key of the process group's store (rank 0's TCPStore:
it outlives a broken gloo group; when it is gone with rank 0's node, the survivors' store that app
node names, its rendezvous store), waits up to REPORT_GRACE_S for the others' keys, and fails with
one line (folded here) naming the collective and the ranks, and their hosts, that did not answer:

    error: rank 0 on head: rank 3 on worker-b stopped answering: the gradient all-reduce of step 63 failed
    (Timed out waiting 20000ms for recv operation to complete); 3 of 4 ranks answer (all had reached step 60
    at the last exchange) [exit 1; log /results/x/logs/train-rank0.log]

A rank that was itself stopped (docker pause, SIGSTOP) for longer than --timeout says so instead, and
names no one (the others gave up waiting for it: app/train/frozen.py measures the gap):

    error: rank 2 on worker: this rank was stopped for 42 s (longer than --timeout 20 s; docker pause or
    SIGSTOP): the gradient all-reduce of step 63 failed (Connection closed by peer); the others gave up
    waiting for it
"""

import json
import re
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from itertools import groupby

import torch
import torch.distributed as dist
from torch import nn

from app import events, evict
from app.errors import ClusterError, first_line
from app.runtime.distributed import DistContext, store_client
from app.train import frozen, stalls, sync
from app.train.config import HealthConfig

REPORT_GRACE_S = 3.0
"""Seconds a rank whose collective timed out waits for the others' word in the store before naming the silent ones."""
LOST_PEER_GRACE_S = 0.5
"""The same wait when a peer's connection was lost (closed, reset): the ranks still alive fail at once then,
all but those left waiting on a rank that is itself in the roll call (they fail when it exits)."""
NOT_YET = "not answered yet, on a node that answers (it may be waiting on this rank)"
"""What a rank's line says of the silent ranks on a node that answers, when other ranks' whole node is gone."""
_ALIVE = "ddp-cluster/alive/{}"
"""The store key under which a rank says it is still alive after a failed collective."""
_LOST_PEER = re.compile(r"Connection (closed|reset)|Broken pipe")
"""What gloo says when a peer's process is gone (its sockets closed by its kernel)."""
_TRANSPORT = re.compile(r"third_party/gloo|NCCL|[Tt]imed out|Connection (closed|reset|refused)|Broken pipe")
"""What gloo's and NCCL's errors say when a peer is gone or too slow (DDP raises them as RuntimeError)."""
STOPPED_WITHIN = 2.0
"""A rank that was stopped for longer than --timeout less than this many timeouts ago says so (``Watch.stopped``):
its next collective fails within about one timeout of its thaw."""
GRADIENTS = "gradient all-reduce"
EXCHANGE = "exchange of step times"
CHECKPOINT = "checkpoint"
STRAGGLER_EXCHANGES = 5
"""Exchanges in a row at which one rank must be the straggler before its line is printed."""
EVALUATION = "evaluation"


@dataclass
class Window:
    """One rank's times since the last exchange (or the start of the epoch), in seconds."""

    start: float
    steps: int = 0
    data: float = 0.0
    """Waiting for batches."""
    wait: float = 0.0
    """Waiting for the gradient all-reduce."""
    idle: float = 0.0
    """Neither training nor waiting: writing checkpoints."""


def ranks_text(ranks: list[int]) -> str:
    """``rank 3``, ``ranks 2-3``, ``ranks 0, 2, 5-7``."""
    runs = [[r for _, r in group] for _, group in groupby(enumerate(sorted(ranks)), lambda p: p[1] - p[0])]
    parts = [str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs]
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def analyse(rows: list[list[float]], hosts: list[str], step: int, percent: float) -> tuple[dict, str | None]:
    """The ``ranks`` record of an exchange, and the console line when the slowest rank is a straggler.

    rows: per rank, (steps, seconds less idle, data seconds, wait seconds, seconds since checkpoint, seconds its
    collective threads waited for a CPU: ``stalls.CommStall``).
    """
    busy, data, wait, stall = [], [], [], []
    for steps, seconds, data_s, wait_s, _, stall_s in rows:
        n = max(steps, 1.0)
        busy.append(1000 * max(seconds - wait_s, 0.0) / n)
        data.append(1000 * data_s / n)
        wait.append(1000 * wait_s / n)
        stall.append(1000 * stall_s / n)
    slowest = max(range(len(rows)), key=busy.__getitem__)
    median = statistics.median(busy)
    over = 100 * (busy[slowest] / median - 1) if median > 0 else 0.0
    step_ms = 1000 * rows[0][1] / max(rows[0][0], 1.0)
    record = {
        "step": step,
        "steps": int(rows[0][0]),
        "step_ms": round(step_ms, 3),
        "slowest_rank": slowest,
        "slowest_host": hosts[slowest],
        "slowest_busy_ms": round(busy[slowest], 3),
        "median_busy_ms": round(median, 3),
        "over_median_percent": round(over, 1),
        "busy_ms": [round(b, 3) for b in busy],
        "data_ms": [round(d, 3) for d in data],
        "wait_ms": [round(w, 3) for w in wait],
        "stall_ms": [round(x, 3) for x in stall],
        "hosts": hosts,
    }
    if over <= percent:
        return record, None
    compute = busy[slowest] - data[slowest]
    line = (
        f"train: rank {slowest} on {hosts[slowest]} is the slowest (a straggler): busy {busy[slowest]:.1f} ms per "
        f"step, {over:.0f}% above the median {median:.1f} ms (data {data[slowest]:.1f} ms, compute {compute:.1f} ms; "
        f"steps take {step_ms:.1f} ms)"
    )
    return record, line


def lost_peer(error: BaseException) -> bool:
    """True when a collective failed because a peer's connection was lost (the peer died), not a timeout."""
    return bool(_LOST_PEER.search(str(error)))


def collective_failed(error: BaseException) -> bool:
    """True when ``error`` is a collective that timed out or lost a peer (not a bug of the training code)."""
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and bool(_TRANSPORT.search(str(error)))


class StragglerNamer:
    """When to name a straggler on the console: the same rank over the threshold at STRAGGLER_EXCHANGES
    exchanges in a row, and once until another rank takes its place or none is over. One slow window is
    noise, and so is a rank slowest at two: on a busy machine an undisturbed run named a different rank
    each time, 5 times in one run."""

    def __init__(self, needed: int = STRAGGLER_EXCHANGES) -> None:
        self.needed = needed
        self.candidate: int | None = None
        self.streak = 0
        """Exchanges in a row at which ``candidate`` was the straggler."""
        self.named: int | None = None

    def name(self, straggler: int | None) -> bool:
        """``straggler``: this exchange's slowest rank when it is over the threshold, else None."""
        self.streak = self.streak + 1 if straggler is not None and straggler == self.candidate else 1
        self.candidate = straggler
        if straggler is None:
            self.named = None
        if self.streak < self.needed or straggler is None or straggler == self.named:
            return False
        self.named = straggler
        return True


class Leave(Exception):
    """This rank's node was evicted at an exchange of step times (app node's policy): its ranks leave the job at
    this step, with status ``evict.LEFT``."""

    def __init__(self, eviction: evict.Eviction) -> None:
        super().__init__(eviction.node)
        self.eviction = eviction


class Watch:
    """One rank's step times, exchanged every ``cfg.exchange_every`` steps, and its account of a failed collective."""

    def __init__(self, cfg: HealthConfig, ctx: DistContext, model: nn.Module) -> None:
        self.cfg, self.ctx = cfg, ctx
        self.rank, self.world = ctx.proc.rank, ctx.proc.world_size
        self.hosts: list[str] = sync.gather(ctx.proc.host, ctx.group)
        """Every rank's host, in rank order (gathered once, when the trainer starts)."""
        self.window = Window(time.perf_counter())
        self.stall = stalls.CommStall()
        """This rank's collective threads' waits for a CPU since the window began (exchanged as ``stall_ms``)."""
        self._doing: tuple[str, int] = ("start", 0)
        self.since = time.monotonic()
        """When this rank began what it is ``doing`` (the flight recorder's watcher reads it)."""
        self.exchanged_at = 0
        """The step of the last exchange: every rank had reached it."""
        self.peers_lost = False
        """``explain`` found ranks that stopped answering (the job's events say so: ``app.events.PEERS_LOST``)."""
        self.peers_stopped = False
        """``explain`` found every rank answering and some stopped by their launcher (``app.events.PEERS_STOPPED``)."""
        self.answers: dict[int, dict] = {}
        """After a failed collective: what each rank that answered the roll call said (``explain``)."""
        self._where = ""
        """Where that was, when not rank 0's store (for the line)."""
        self._namer = StragglerNamer()
        self._pace = ctx.proc.eviction.watch() if ctx.proc.eviction else None
        """app node's straggler policy, run on every rank alike (each has the whole table): ``pace``."""
        self._recalled = 0.0
        """The job's best pace on these nodes before this round, as rank 0 recalled it (``recall``), told to every
        rank with the last exchange."""
        self.left: evict.Eviction | None = None
        """Another node evicted at an exchange: its ranks are gone at the next collective (``pace``)."""
        self.clock = frozen.Clock()
        """The gaps in this process's time: whether it was itself stopped (``stopped``)."""
        self._grad_ready = 0.0
        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._on_gradient)

    @property
    def doing(self) -> tuple[str, int]:
        """The collective this rank is in (or was in last), and the optimizer step it belongs to."""
        return self._doing

    @doing.setter
    def doing(self, stage: tuple[str, int]) -> None:
        self._doing, self.since = stage, time.monotonic()

    def stage(self) -> tuple[str, float]:
        """``('the gradient all-reduce of step 7', since)``: what this rank does, and since when."""
        what, step = self._doing
        return f"the {what} of step {step}", self.since

    # --- timing (called by the trainer) ----------------------------------------------------------

    def _on_gradient(self, _param: torch.Tensor) -> None:
        self._grad_ready = time.perf_counter()

    def backward_done(self) -> None:
        """Backward returned: the time since the last gradient was ready was spent waiting for the others."""
        self.window.wait += time.perf_counter() - self._grad_ready

    def new_window(self) -> None:
        """Start timing afresh (an epoch begins: evaluation and its collectives are not steps)."""
        self.window = Window(time.perf_counter())
        self.stall.since_last()

    def due(self, step: int) -> bool:
        return bool(self.cfg.exchange_every) and step % self.cfg.exchange_every == 0

    def exchange(self, step: int, since_checkpoint: float) -> tuple[dict, str | None, float]:
        """Share the window (a collective): the ``ranks`` record, the straggler line or None, rank 0's seconds
        since its last checkpoint (the same on every rank)."""
        w = self.window
        seconds = time.perf_counter() - w.start - w.idle
        recalled = self._pace.best_for(self.hosts) if self._pace and self.rank == 0 else 0.0  # rank 0's, for all
        times = [w.steps, seconds, w.data, w.wait, since_checkpoint, self.stall.since_last(), recalled]
        mine = torch.tensor(times, dtype=torch.float64, device=self.ctx.device)  # NCCL reduces GPU tensors only
        self.doing = (EXCHANGE, step)
        if self.world > 1:
            rows = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(rows, mine, group=self.ctx.group)
        else:
            rows = [mine]
        self.exchanged_at = step
        self.window = Window(time.perf_counter())  # (the stall's count restarted with its read above)
        table = torch.stack(rows).tolist()  # one read of the device
        record, line = analyse([row[:6] for row in table], self.hosts, step, self.cfg.straggler_percent)
        if not self._namer.name(record["slowest_rank"] if line else None):
            line = None
        self._recalled = table[0][6]
        return record, line, float(table[0][4])

    def recall(self, records: list[dict]) -> None:
        """Rank 0: the job's earlier exchanges (its metrics.jsonl), from which the straggler policy learns the job's
        best pace on each set of nodes; every rank gets rank 0's with each exchange (``best_ms``)."""
        if self._pace is not None:
            self._pace.recall(records)

    def pace(self, record: dict) -> None:
        """Apply app node's straggler policy to an exchange's record (with the job's world size, global batch and
        accumulation): Leave when this rank's node is evicted; another node's eviction is remembered (``left``) and
        rank 0 writes it to the job's events; rank 0 says once why a straggler cannot be evicted."""
        if self._pace is None:
            return
        found = self._pace.feed(record | {"time": time.time(), "best_ms": self._recalled})
        if isinstance(found, str):
            if self.rank == 0:
                print(found, flush=True)
            return
        if found is None:
            return
        if self.rank == 0:
            events.write(events.EVICTED, self.rank, evicted=found.node, step=record["step"], **found.fields())
        if found.node == self.ctx.proc.host:
            raise Leave(found)
        self.left = found

    # --- a failed collective ---------------------------------------------------------------------

    def stopped(self, error: BaseException, timeout_s: float) -> str | None:
        """The line of a rank that was itself stopped (frozen) for longer than ``timeout_s`` shortly before its
        collective failed: the others gave up waiting for it, so it names none of them (and holds no roll call:
        ``answers`` stays empty, so it writes no snapshot); None when it was not."""
        gap = self.clock.longest_gap(STOPPED_WITHIN * timeout_s + REPORT_GRACE_S)
        if gap <= timeout_s:
            return None
        what, step = self.doing
        return (
            f"this rank was stopped for {gap:.0f} s (longer than --timeout {timeout_s:g} s; docker pause or SIGSTOP): "
            f"the {what} of step {step} failed ({first_line(error)[:160]}); the others gave up waiting for it"
        )

    def explain(self, error: BaseException, completed: int = -1) -> str:
        """Why the job cannot go on, in one line: which ranks (and hosts) stopped answering.

        completed: the last optimizer step this rank completed, told to the others with its roll call
        (``answers`` then holds what every rank that answered said: its host, step and completed step).
        The roll call waits REPORT_GRACE_S, or LOST_PEER_GRACE_S when a peer's connection was lost.
        """
        what, step = self.doing
        failed = f"the {what} of step {step} failed ({first_line(error, 160)})"
        lost = lost_peer(error)
        answered = self._roll_call(completed, LOST_PEER_GRACE_S if lost else REPORT_GRACE_S)
        if answered is None:  # no roll call could be held: who stopped cannot be told from here (rank 0 may be fine)
            self.peers_lost = True
            nor = "" if self.ctx.proc.survivors_store is None else ", nor the survivors' store"
            return f"{failed}; no store answers (rank 0's on {self.hosts[0]}{nor}): which ranks stopped cannot be told"
        silent = [r for r in range(self.world) if r not in answered]
        stopped = [r for r in answered if self.answers[r].get("stopped")]
        silent, waiting = self._waiting_on_this_rank(silent, answered, bool(stopped)) if lost else (silent, [])
        unsure = f"; {NOT_YET}: {self._on_hosts(waiting)}" if waiting else ""
        self.peers_lost = bool(silent)
        self.peers_stopped = not silent and bool(stopped)
        if not silent and stopped:
            return f"{failed}; {self._on_hosts(stopped)} stopped: their launcher ended them (SIGTERM){unsure}"
        if not silent:
            return f"{failed}; every rank still answers: a rank too slow for --timeout, or the network"
        return (
            f"{self._on_hosts(silent)} stopped answering: {failed}; {len(answered)} of {self.world} ranks answer"
            f"{self._where} (all had reached step {self.exchanged_at} at the last exchange){unsure}"
        )

    def _waiting_on_this_rank(
        self, silent: list[int], answered: set[int], launcher_stopped: bool
    ) -> tuple[list[int], list[int]]:
        """After a lost peer: the silent ranks split into those on nodes of which no rank answers (gone with their
        node) and those on nodes that answer, which may only wait on a rank that holds the roll call (this one: a
        rank left waiting on a living peer fails when that peer leaves its collective, after the roll call). The
        same when ranks that answered say their launcher stopped them (``launcher_stopped``: the job is being
        stopped, one node a little before another): the peer lost was one of them. Where
        no node is gone and no launcher stopped a rank (a rank's own process ended), every silent rank is named."""
        answering = {self.hosts[r] for r in answered}
        gone = [r for r in silent if self.hosts[r] not in answering]
        return (gone, [r for r in silent if r not in gone]) if gone or launcher_stopped else (silent, [])

    def _on_hosts(self, ranks: list[int]) -> str:
        """``rank 0 on head and ranks 2-3 on worker``."""
        hosts = dict.fromkeys(self.hosts[r] for r in sorted(ranks))
        return " and ".join(f"{ranks_text([r for r in ranks if self.hosts[r] == host])} on {host}" for host in hosts)

    def announce(self, completed: int, stopped: bool = False) -> dict | None:
        """Say in the roll call's store that this rank is alive, at which step and which step it completed, and
        whether its launcher stopped it (what the roll call reads); what was said, or None when no store answers."""
        said = {"host": self.ctx.proc.host, "step": self.doing[1], "completed": completed, "stopped": stopped}
        return said if any(_say(store, self.rank, said) for store in self._stores()) else None

    def _stores(self) -> Iterator[dist.Store]:
        """Where a roll call can be held: the process group's store (rank 0's), then, when that is gone with rank 0's
        node, the survivors' store that the launcher named (app node's rendezvous store), under a prefix of this
        round (its rank 0's address: the same on every rank of the round, new in each)."""
        yield dist.distributed_c10d._get_default_store()
        where = self.ctx.proc.survivors_store
        if where is None:
            return
        try:
            store = store_client(*where, REPORT_GRACE_S)
        except ClusterError:
            return
        yield dist.PrefixStore(f"ddp-cluster/round/{self.ctx.proc.master_addr}:{self.ctx.proc.master_port}", store)

    def _roll_call(self, completed: int, grace_s: float) -> set[int] | None:
        """The ranks that say they are alive within ``grace_s``, in the first store that holds the whole roll call
        (``answers``: what each said); None when none does."""
        said = {"host": self.ctx.proc.host, "step": self.doing[1], "completed": completed, "stopped": False}
        for fallback, store in enumerate(self._stores()):
            answers = _say(store, self.rank, said) and _listen(store, self.rank, said, self.world, grace_s)
            if answers:
                self.answers, self._where = answers, " in the rendezvous store (rank 0's is gone)" if fallback else ""
                return set(answers)
        return None


def _say(store: dist.Store, rank: int, said: dict) -> bool:
    """Write ``said`` under this rank's key of the roll call; False when the store does not take it."""
    try:
        store.set_timeout(timedelta(seconds=REPORT_GRACE_S))
        store.set(_ALIVE.format(rank), json.dumps(said))
    except (RuntimeError, ValueError):  # DistError is a RuntimeError: the store's host is gone
        return False
    return True


def _listen(store: dist.Store, rank: int, said: dict, world: int, grace_s: float) -> dict[int, dict] | None:
    """What every rank said in ``store`` within ``grace_s`` (this rank's ``said`` included); None when the store
    fails meanwhile."""
    answers = {rank: said}
    deadline = time.monotonic() + grace_s
    while len(answers) < world and time.monotonic() < deadline:
        try:
            for r in range(world):
                if r not in answers and store.check([_ALIVE.format(r)]):
                    answers[r] = json.loads(store.get(_ALIVE.format(r)))
        except (RuntimeError, ValueError):
            return None
        time.sleep(0.1)
    return answers
