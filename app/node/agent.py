"""A node's torchrun agent in this process, every rank a fork of one preloaded interpreter: the launch of
``python -m app node`` (app/node/command.py, which runs each rank; the image's ddp-node on every engine).

    python -m app node --records runs/gate -- --standalone --nproc-per-node 2 -m app train --out runs/x
    python -m app node -- --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=store:29500 /job/train.py

torchrun starts each rank as a new interpreter (``python -u -m app train ...``) that imports torch
again: 1.7-2.2 s of CPU per rank in the image on 2 cores, and 1.4-1.9 s more for ``torch._dynamo``,
which torch's optimizer imports when it is built. An elastic job starts every rank of every node
again at each restart round, so each recovery paid that once per rank, on the cores the new ranks
share. Here torch's elastic agent runs in this process as torchrun runs it (torchrun's own parser,
``config_from_args`` and ``elastic_launch``: the rendezvous, restarts, the ranks' environment and the
failure report are torch's), with a function entrypoint (as torchrun's ``--run-path``) and torch's
``forkserver`` start method: one server per node, started before anything else, imports the preload
once, and each rank of each round is a fork of it, running within milliseconds.

Forking needs a server that never touched a GPU: importing the preload asks CUDA nothing (tested), and
CUDA starts in each rank. ``--no-python`` (a program, not Python) and ``fork=False`` run as torchrun
runs them: a new process per rank.
"""

import argparse
import contextlib
import functools
import multiprocessing
import multiprocessing.forkserver
import signal
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NoReturn

from app import contract, evict
from app.errors import UsageError
from app.node import torch_elastic
from app.runtime import launcher

START_METHOD = "forkserver"
"""torch's start method of the ranks: forks of one server that imported the preload."""


@dataclass(frozen=True)
class Server:
    """This process's fork server, started."""

    environment: dict[str, str]
    """The environment it started with: its forks have it, not what this process set since."""


def start_forkserver(preload: Iterable[str]) -> Server:
    """Start this process's fork server now; it imports the modules ``preload`` names (one missing is skipped)
    while this process goes on. Call it before torch is imported here: the two imports then share the cores."""
    multiprocessing.set_forkserver_preload(list(preload))
    multiprocessing.forkserver.ensure_running()
    return Server(launcher.environment())


def _refuse(message: str) -> NoReturn:
    raise UsageError(f"torchrun's arguments: {message} (see 'torchrun --help')")


def parse(words: Sequence[str]) -> argparse.Namespace:
    """torchrun's arguments, read by torchrun's own parser (a bad one: UsageError), with the defaults its
    ``run`` fills in (``--standalone``: c10d on a free local port)."""
    parser = torch_elastic.torchrun_parser()
    parser.prog = "torchrun"
    parser.error = _refuse  # type: ignore[method-assign]
    args = parser.parse_args(list(words))
    try:
        _, most = torch_elastic.nnodes_range(args.nnodes)
    except (RuntimeError, ValueError) as error:
        _refuse(f"--nnodes {args.nnodes}: {error}")
    local_only = args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None and most == 1
    if args.standalone or local_only:
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = contract.RENDEZVOUS_PORT
    return args


@dataclass(frozen=True)
class Job:
    """What every rank runs, as torchrun was given it: ``-m MODULE`` or a script, and its arguments."""

    target: str
    module: bool
    args: tuple[str, ...]
    environment: tuple[tuple[str, str], ...] = ()
    """What this process set in its environment after its fork server started (torchrun's OMP_NUM_THREADS, the
    survivors' store): a new process per rank would inherit it; a fork sets it first."""
    eviction: evict.Policy | None = None
    """The straggler policy by which the rank evicts its own node (app node's, handed on whole)."""

    def words(self) -> list[str]:
        return ["-m", self.target, *self.args] if self.module else [self.target, *self.args]


@dataclass
class Launch:
    """torch's launch configuration and what its agent starts on each rank."""

    config: Any
    """torch.distributed.launcher.api.LaunchConfig."""
    entrypoint: Callable | str
    args: tuple


def prepare(
    args: argparse.Namespace,
    entrypoint: Callable[[Job], None] | None,
    server: Server | None,
    eviction: evict.Policy | None = None,
) -> Launch:
    """The launch of parsed torchrun ``args``: each rank runs ``entrypoint(job)`` in a fork of ``server``, given the
    straggler policy ``eviction``; None (or ``--no-python``): torchrun's own launch, a new process per rank, which
    no policy reaches (UsageError when one is given)."""
    try:
        config, cmd, cmd_args = torch_elastic.launch_config(args)
    except (AssertionError, ValueError) as error:  # torchrun's checks of its values
        _refuse(str(error) or type(error).__name__)
    if entrypoint is None or server is None or args.no_python:
        if eviction is not None:
            raise UsageError(
                "--evict-factor needs app node's forked ranks, which run the straggler policy: leave out --no-fork "
                "and --no-python, or give --evict-factor 0"
            )
        return Launch(config, cmd, tuple(cmd_args))
    config.start_method = START_METHOD
    rest = cmd_args[cmd_args.index(args.training_script) + 1 :]  # after the script: --local-rank when asked
    since = tuple(sorted(kv for kv in launcher.environment().items() if server.environment.get(kv[0]) != kv[1]))
    return Launch(config, entrypoint, (Job(args.training_script, bool(args.module), tuple(rest), since, eviction),))


def launch(run: Launch, evicting: bool = False) -> dict:
    """Run torch's elastic agent until the job ends: each local rank's return value (ChildFailedError when a
    rank failed past the restarts, or when ``EventAgent`` stopped restarting; a rendezvous error when the nodes
    never met)."""
    from torch.distributed.launcher import api

    torch_elastic.install(event_agent(evicting))
    return api.elastic_launch(run.config, run.entrypoint)(*run.args)


FIRST_ROUND_SHARE = 0.5
"""Of the join timeout: how long the job's first rendezvous round waits for all its nodes once --min-nodes have
joined, and, at most, a round after a regroup for the nodes it awaits (``regroup_round``; other rounds: the
rendering's short last call, so that survivors do not idle)."""
ROUND_TRIES = 3
"""Rendezvous rounds a node joins in a row whose rank 0 never gives the round's address (``NO_RANK_0``)."""
NO_RANK_0 = (
    "node: rank 0 of the rendezvous round this node joined gave no address within the store's read timeout (its node "
    "was dropped for missed heartbeats once the round was complete): this node joins the next round"
)
"""The line of a node whose round lost its rank 0: a node that stalls past the heartbeats' limit (a container
starved on a loaded machine) after the round completed is dropped by the others, and leaves them waiting for the
address that rank 0 alone writes; torch's agent would end the job (``DistStoreError ... MASTER_ADDR``)."""
DROPPED = (
    "node: the other nodes dropped this node from the rendezvous round it trains in (its heartbeats stopped for "
    "longer than they allow): its ranks stop at a step they keep and it joins the next round with the others"
)
"""The line of a node dropped from the round its ranks train in: a node whose agent stalled past the heartbeats'
limit (a container starved on a loaded machine) while its ranks went on. torch's agent would go on training in a
round the others no longer count it in, and the next node to join would open a round of its own: two jobs, one
checkpoint. The node regroups at once instead (``events.REGROUP``), as for a node that waits to join."""
PREDECESSOR_MISSED = 2
"""Heartbeats that the node of the job's round at this node's address must have missed for a new agent here to take
its place (``torch_elastic.take_over``): two, as a live agent writes one every interval."""
TOOK_OVER = (
    "node: this node's agent before this one (rendezvous node {node}) stopped its heartbeats: this agent takes its "
    "place, so that the next round does not wait until the rendezvous drops it"
)
"""The line of a node's new agent that took its predecessor's place (a container started again)."""
SETTLE_S = 1.0
"""Seconds the agent waits after a rank's failure before it takes the attempt's failures (every rank's that ended)."""


def event_agent(evicting: bool = False) -> type:
    """torch's LocalElasticAgent, which also writes each failed attempt's facts to the job's events file
    (``app.events``) and stops restarting a failure that no restart can cure. ``evicting``: this node gave its
    ranks a straggler policy, so their statuses ``evict.LEFT`` and ``evict.PEER_LEFT`` are an eviction's (without
    one they are the script's own, a failure like any other: a script that exits 5 is not restarted forever).

    torch's agent monitors its ranks (``monitored``, app/node/torch_elastic.py's hook); healthy ranks of a node that
    the others dropped from the round (``DROPPED``) are restarted, not counted. An attempt that failed is a
    ``RunResult`` whose ``failures`` are torchelastic's ``ProcessFailure`` (exit status or signal, and the rank's
    error file). Each one becomes a WORKER_FAILED record. Restarts stop (no attempt is left, so torch's agent ends
    the job with its ChildFailedError, and a GAVE_UP record says why) when a rank ended with status 2 (bad input,
    the same at every attempt) or when a rank failed exactly as in the attempt before: the same exit status and the
    same error (its peers' errors, which name ports and steps, may differ; a SIGKILL in either attempt, the
    engine's or the OOM killer's: not the script's doing, restarted).
    """
    from torch.distributed.elastic.agent.server.api import WorkerState

    from app import events

    class EventAgent(torch_elastic.agent_class()):
        _before: frozenset | None = None
        """The failure of the attempt before: (rank, exit status, error) of each rank that failed."""
        _met: bool = False
        """This agent's first rendezvous round is over."""
        _regrouping: bool = False
        """This agent stopped its ranks for a node that waits to join: its next round waits for that node and the
        others of its round (``regroup_round``), not the short last call that a loaded machine's joiner can miss (the
        round then forms without it, and it waits again: a second regroup)."""
        _round: frozenset = frozenset()
        """The nodes of this agent's rendezvous round (torch's node descriptors), once it is complete."""

        def join(self, join_round: Callable[[], None], handler: Any) -> None:
            if not self._met and (node := torch_elastic.take_over(handler, PREDECESSOR_MISSED)) is not None:
                print(TOOK_OVER.format(node=node), flush=True)
            for tries_left in reversed(range(ROUND_TRIES)):
                try:
                    with self._round_rule(handler):
                        join_round()
                    break
                except Exception as error:
                    if not tries_left or not torch_elastic.lost_rank_0(error):
                        raise
                    print(NO_RANK_0, flush=True)  # torch's next_rendezvous leaves the round first: the next one
            self._met, self._regrouping, self._round = True, False, round_nodes(handler)

        def _round_rule(self, handler: Any) -> contextlib.AbstractContextManager:
            """How this agent's next round waits for nodes: the job's first round as ``first_round``, a round after
            a regroup as ``regroup_round``, any other with the handler's own last call."""
            if not self._met:
                return first_round(handler)
            if self._regrouping:
                return regroup_round(handler, self._round)
            return contextlib.nullcontext()

        def monitored(self, result: Any, again: Callable[[], Any], spec: Any) -> Any:
            if result.state == WorkerState.HEALTHY and torch_elastic.dropped(spec.rdzv_handler):
                print(DROPPED, flush=True)
                events.write(events.REGROUP, why="this node was dropped from its round (missed heartbeats)")
                self.restarts_left += 1  # torch's restart of an unhealthy group takes it: not counted
                result.state = WorkerState.UNHEALTHY
                return result
            if result.state != WorkerState.FAILED:
                return result
            attempt = spec.max_restarts - self.restarts_left  # the first rank's exit, written at once (the runner
            codes = {failure.exitcode for failure in result.failures.values()}  # names the first one it reads)
            if evicting and evict.LEFT in codes:  # its node was evicted: it leaves the round (left open)
                leave_round(spec.rdzv_handler)
                raise evicted_error()("this node was evicted from the job", signal.SIGTERM)
            self._write(result.failures, attempt)
            time.sleep(SETTLE_S)  # let the others' failures land too: a rank that raised often exits just
            later = again()  # after the peers it cut off
            if later.state == WorkerState.FAILED:
                self._write({r: f for r, f in later.failures.items() if r not in result.failures}, attempt)
                result.failures = {**later.failures, **result.failures}
            if self._no_failure(result.failures, spec.rdzv_handler):
                self.restarts_left += 1  # torch's restart takes it: this one is not counted
            else:
                self._judge(result.failures, attempt)
            return result

        def restarting(self, healthy: bool) -> None:
            if healthy:  # torch's agent saw a node waiting to join: no failure
                self._regroup()

        def _regroup(self) -> None:
            """Say that this agent stops its ranks for a node waiting to join (``events.REGROUP``); its next round
            waits for that node."""
            events.write(events.REGROUP, why="a node waits to join")
            self._regrouping = True

        def _no_failure(self, failures: dict, handler: Any) -> bool:
            """The ranks failed because the job's nodes changed, not for a failure to count: an evicted node left
            (every rank says ``evict.PEER_LEFT``), or a node new to this round waits to join, for which another
            node's agent already stopped its ranks (torch restarts for a waiting node without counting, but this
            agent saw its ranks fail first). A node of this very round that waits is a peer whose agent restarted
            after the same failure: counted (it was not, when that peer came back before this agent looked)."""
            if evicting and {failure.exitcode for failure in failures.values()} == {evict.PEER_LEFT}:
                return True
            try:
                waiting = handler.num_nodes_waiting() > 0
            except Exception:  # the store is gone (a RendezvousError, a DistError): a failure, counted
                return False
            if not waiting or not newcomers(handler, self._round):
                return False
            self._regroup()
            return True

        def _write(self, failures: dict, attempt: int) -> None:
            for rank, failure in sorted(failures.items()):
                events.write(events.WORKER_FAILED, rank, local_rank=failure.local_rank, exitcode=failure.exitcode,
                             message=error_of(failure), attempt=attempt)  # fmt: skip

        def _judge(self, failures: dict, attempt: int) -> None:
            seen = {(rank, failure.exitcode, error_of(failure)) for rank, failure in failures.items()}
            bad = next(((r, m) for r, code, m in sorted(seen) if code == 2), None)
            signalled = any(code == -signal.SIGKILL for _, code, _ in seen)  # SIGTERM: the agent's own stop
            again = {(r, code, m) for r, code, m in seen & (self._before or frozenset()) if m}
            self._before = None if signalled else frozenset(seen)
            if bad or (again and not signalled):
                rank, message = bad or min((r, m) for r, _, m in again)
                reason = events.BAD_INPUT if bad else events.REPEATED
                events.write(events.GAVE_UP, rank, reason=reason, message=message, attempts=attempt + 1)
                self.restarts_left = 0  # torch's agent ends the job: this attempt was the last

    return EventAgent


_left_rounds: list = []
"""The rendezvous handlers of the rounds this node left when it was evicted: kept, so that a store this process
hosts (c10d's, on the node named by --rdzv-endpoint) goes on serving the others."""


@functools.cache
def evicted_error() -> type:
    """The exception of an agent whose node was evicted: torch's SignalException, after which torch's agent stops
    its ranks and does not close the rendezvous (the others go on without this node, which may join again)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    class Evicted(SignalException):
        pass

    return Evicted


def leave_round(handler: Any) -> None:
    """Take this node out of the rendezvous round it is in, as the others' agents do before their next round, and
    stop its heartbeats: the others' next round starts without it at once (a node that died is dropped only after
    its missed heartbeats). The rendezvous stays open; the handler is kept (``_left_rounds``)."""
    _left_rounds.append(handler)
    torch_elastic.leave(handler)


def first_round(handler: Any) -> contextlib.AbstractContextManager:
    """While entered, an elastic c10d rendezvous (fewer --min-nodes than nodes) waits for all its nodes for
    ``FIRST_ROUND_SHARE`` of its join timeout once --min-nodes have joined, not the rendering's short last call (torch
    completes a round before its last call only when --nnodes MAX have joined). The agent enters it for the job's
    first round, and for a round after a regroup within ``regroup_round``, which completes that round as soon as the
    nodes it awaits have joined.

    A job starts with every node that comes up: nodes that start a few seconds apart on a loaded machine all
    make the first round, and the job's global batch is that of all its nodes (a job that started on fewer
    could not grow to them at the same global batch). A node that never comes is waited for that long, then the
    job starts with the others. A node that starts later joins a running job: the others are all there, the
    round completes at once.
    """

    def longest(least: int, most: int, join: timedelta, short: timedelta) -> timedelta:
        return short if least == most else max(short, join * FIRST_ROUND_SHARE)

    return torch_elastic.last_call(handler, longest)


@dataclass
class Awaited:
    """The nodes that a round after a regroup waits for, and the newest heartbeat of each seen so far."""

    nodes: frozenset
    """torch's node descriptors."""
    since: datetime
    """When the wait began: the heartbeat counted for a node of ``nodes`` whose heartbeat no read has shown."""
    seen: dict = field(default_factory=dict)
    """Node -> the newest heartbeat of it that a read showed."""

    def see(self, read: torch_elastic.RoundRead) -> None:
        """Remember the heartbeats of ``nodes`` that ``read`` shows, where newer than those seen before."""
        for node in self.nodes & read.heartbeats.keys():
            self.seen[node] = max(self.seen.get(node, read.heartbeats[node]), read.heartbeats[node])

    def dead(self, read: torch_elastic.RoundRead) -> frozenset:
        """The nodes whose newest heartbeat seen (``since`` for one never seen) is older than ``read.dead_after`` at
        ``read``'s time: those that torch's rendezvous took, or would take, for dead. Absence from ``read`` is no
        death: a live node that left the round it completed is out of the state until it joins again moments later."""
        return frozenset(n for n in self.nodes if read.now - self.seen.get(n, self.since) > read.dead_after)

    def ready(self, read: torch_elastic.RoundRead) -> bool:
        """After remembering ``read`` (``see``): every node of ``nodes`` not ``dead`` is a participant of its round."""
        self.see(read)
        return self.nodes - self.dead(read) <= read.participants


@contextlib.contextmanager
def regroup_round(handler: Any, last_round: frozenset) -> Iterator[None]:
    """While entered, a c10d rendezvous round waits as the first round does (``first_round``) but completes as soon
    as this node and every node it awaits have joined (with --min-nodes at least): the nodes of ``last_round`` (this
    agent's round before the regroup) and those that wait to join (``newcomers``), less those known dead
    (``Awaited``). In a job short of --nnodes MAX (a node died for good), torch's round would wait for more nodes
    until its last call. Others: ``first_round`` alone."""
    read = torch_elastic.last_read(handler)
    early: contextlib.AbstractContextManager = contextlib.nullcontext()
    if read is not None:
        awaited = Awaited(last_round | newcomers(handler, last_round), since=read.now)
        awaited.see(read)
        early = torch_elastic.complete_early(handler, awaited.ready)
    with first_round(handler), early:
        yield


def round_nodes(handler: Any) -> frozenset:
    """The nodes of the handler's rendezvous round as its state last read (c10d's handler); others: none known."""
    state = torch_elastic.round_state(handler)
    return state[0] if state is not None else frozenset()


def newcomers(handler: Any, round_nodes: frozenset) -> frozenset:
    """The nodes that wait to join (as ``num_nodes_waiting`` last read them) and were not in ``round_nodes``: new to
    the job, or started again (a new agent); not a peer whose agent restarted its ranks after this round failed.
    Unknown (a handler without c10d's state): every waiting node."""
    state = torch_elastic.round_state(handler)
    return frozenset({"unknown"}) if state is None else state[1] - round_nodes


def error_of(failure: Any) -> str:
    """The error a failed rank wrote to torchelastic's error file (its one line, or its exception); "" when it
    wrote none (killed, or a script that raised outside ``record``)."""
    if torch_elastic.wrote_no_error_file(failure):
        return ""
    message = failure.message  # the file's "message": a string, or {"message": ..., "extraInfo": ...}
    return str(message.get("message", "") if isinstance(message, dict) else message).strip()
