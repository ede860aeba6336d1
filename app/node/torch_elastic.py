"""torch's private elastic names, in one place: the only module of app that touches them.

    python -m app node -- --nnodes=2:3 --rdzv-backend=c10d --rdzv-endpoint=store:29500 -m app train   # served here

torch gives its elastic agent no hooks and its c10d rendezvous handler no reader of its state. app node's agent
(app/node/agent.py) learns of each rendezvous round, each attempt of its ranks and each restart through ``Agent``,
whose overrides of torch's private methods call public ones of its own (``join``, ``monitored``, ``restarting``),
and it reads and changes the handler through the functions below. ``PRIVATE`` lists every private or undocumented
name they use; ``missing`` says which of them a torch lacks or has re-signed, and ``app node`` refuses such a torch
in one line before it starts anything. tests/unit/test_torch_elastic.py checks each name on the torch installed
(``make test`` runs it on .venv's torch and on .venv-tv's); pyproject.toml's node extra states the releases that is.
"""

import contextlib
import functools
import importlib
import inspect
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from app.errors import UsageError

AGENT = "torch.distributed.elastic.agent.server.local_elastic_agent"
DYNAMIC = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"


@dataclass(frozen=True)
class Private:
    """A private or undocumented name of torch that this module uses."""

    module: str
    name: str
    """Its dotted path inside ``module``."""
    parameters: tuple[str, ...] | None = None
    """A callable's leading parameters, by name (any others must have defaults); None: not called here."""
    on_instance: bool = False
    """Set on each instance (by its __init__), not on the class: checked on real ones by the tests only."""

    def __str__(self) -> str:
        called = f"({', '.join(self.parameters)})" if self.parameters is not None else ""
        return f"{self.module}.{self.name}{called}"


PRIVATE = (
    Private("torch.distributed.launcher.api", "LocalElasticAgent"),  # the agent class elastic_launch builds: swapped
    Private(AGENT, "LocalElasticAgent._rendezvous", ("self", "worker_group")),
    Private(AGENT, "LocalElasticAgent._monitor_workers", ("self", "worker_group")),
    Private(AGENT, "LocalElasticAgent._restart_workers", ("self", "worker_group")),
    Private(AGENT, "LocalElasticAgent._remaining_restarts", on_instance=True),
    Private(DYNAMIC, "DynamicRendezvousHandler._settings", on_instance=True),
    Private(DYNAMIC, "DynamicRendezvousHandler._state_holder", on_instance=True),
    Private(DYNAMIC, "DynamicRendezvousHandler._this_node", on_instance=True),
    Private(DYNAMIC, "DynamicRendezvousHandler._op_executor", on_instance=True),
    Private(DYNAMIC, "DynamicRendezvousHandler._stop_heartbeats", ("self",)),
    Private(DYNAMIC, "DynamicRendezvousHandler._get_deadline", ("self", "timeout")),
    Private(DYNAMIC, "_BackendRendezvousStateHolder.sync", ("self",)),
    Private(DYNAMIC, "_DistributedRendezvousOpExecutor._node", on_instance=True),
    Private(DYNAMIC, "_NodeDesc.addr", on_instance=True),
    Private(DYNAMIC, "_DistributedRendezvousOpExecutor.run", ("self", "state_handler", "deadline")),
    Private(DYNAMIC, "_RendezvousExitOp", ()),
    Private(DYNAMIC, "_RendezvousJoinOp"),  # told apart from the executor's other operations
    Private(DYNAMIC, "_Action.MARK_RENDEZVOUS_COMPLETE"),
    Private(DYNAMIC, "_RendezvousContext.node", on_instance=True),
    Private(DYNAMIC, "_RendezvousContext.state", on_instance=True),
    Private(DYNAMIC, "_RendezvousContext.settings", on_instance=True),
    Private(DYNAMIC, "_RendezvousState.participants", on_instance=True),
    Private(DYNAMIC, "_RendezvousState.wait_list", on_instance=True),
    Private(DYNAMIC, "_RendezvousState.last_heartbeats", on_instance=True),
    Private(DYNAMIC, "_RendezvousState.complete", on_instance=True),
    Private(DYNAMIC, "_RendezvousState.closed", on_instance=True),
    Private(DYNAMIC, "RendezvousTimeout._set_timeouts", ("self", "timeouts")),
    Private("torch.distributed.elastic.rendezvous.api", "RendezvousStoreInfo.MASTER_ADDR_KEY"),
    Private("torch.distributed.elastic.multiprocessing.errors", "_NOT_AVAILABLE"),
    Private("torch.distributed.run", "get_args_parser", ()),  # torchrun's own parser and its reading of it
    Private("torch.distributed.run", "parse_min_max_nnodes", ("nnodes",)),
    Private("torch.distributed.run", "config_from_args", ("args",)),
)


def problem(name: Private) -> str | None:
    """What is wrong with ``name`` on the torch installed (missing, or re-signed); None when it is as used here."""
    try:
        found: Any = importlib.import_module(name.module)
        for part in name.name.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return f"{name} is missing"
    if name.parameters is None:
        return None
    try:
        given = list(inspect.signature(found).parameters.values())
    except (TypeError, ValueError):
        return f"{name} is not callable as used here"
    leading = [p.name for p in given[: len(name.parameters)]]
    required = [p.name for p in given[len(name.parameters) :] if p.default is p.empty and p.kind in _REQUIRED_KINDS]
    if leading != list(name.parameters) or required:
        return f"{name} takes ({', '.join(p.name for p in given)}) now"
    return None


_REQUIRED_KINDS = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                   inspect.Parameter.KEYWORD_ONLY)  # fmt: skip


def missing() -> list[str]:
    """What the torch installed lacks of ``PRIVATE`` (the names checked on classes and modules), one line each."""
    return [said for name in PRIVATE if not name.on_instance and (said := problem(name))]


def refuse_unproven() -> None:
    """UsageError when the torch installed lacks a name of ``PRIVATE`` or has re-signed it: one line that names it."""
    if found := missing():
        import torch

        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise UsageError(
            f"torch {torch.__version__} is not one that app node's agent works with: {found[0]}{more}; install a "
            "torch that the node extra of pyproject.toml allows (app/node/torch_elastic.py lists what it uses)"
        )


@functools.cache
def agent_class() -> type:
    """torch's LocalElasticAgent, with a public hook for each private method app node's agent needs to see:
    ``join(join_round, handler)`` around each rendezvous round, ``monitored(result, again, spec)`` after each look
    at the ranks (``again`` looks once more), ``restarting(healthy)`` before the ranks are started again (healthy:
    torch's agent restarts them for a node that waits to join, not for a failure)."""
    from torch.distributed.elastic.agent.server.api import WorkerState
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    class Agent(LocalElasticAgent):
        def join(self, join_round: Callable[[], None], handler: Any) -> None:
            join_round()

        def monitored(self, result: Any, again: Callable[[], Any], spec: Any) -> Any:
            return result

        def restarting(self, healthy: bool) -> None:
            pass

        @property
        def restarts_left(self) -> int:
            return self._remaining_restarts

        @restarts_left.setter
        def restarts_left(self, value: int) -> None:
            self._remaining_restarts = value

        def _rendezvous(self, worker_group):  # (torch's signature)
            self.join(
                functools.partial(LocalElasticAgent._rendezvous, self, worker_group), worker_group.spec.rdzv_handler
            )

        def _monitor_workers(self, worker_group):  # (torch's signature)
            again = functools.partial(LocalElasticAgent._monitor_workers, self, worker_group)
            return self.monitored(again(), again, worker_group.spec)

        def _restart_workers(self, worker_group):  # (torch's signature)
            self.restarting(worker_group.state == WorkerState.HEALTHY)
            LocalElasticAgent._restart_workers(self, worker_group)

    return Agent


def install(agent: type) -> None:
    """Make ``agent`` the class that torch's ``elastic_launch`` builds, in this process."""
    from torch.distributed.launcher import api

    api.LocalElasticAgent = agent


def leave(handler: Any) -> None:
    """Take this node out of its c10d rendezvous round, as torch's agent does before its next round, and stop its
    heartbeats (other handlers: nothing to do). A store that is gone: the others drop it by its heartbeats."""
    from torch.distributed.elastic.rendezvous import RendezvousError
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic

    if not isinstance(handler, dynamic.DynamicRendezvousHandler):
        return
    handler._stop_heartbeats()
    with contextlib.suppress(RendezvousError):
        handler._op_executor.run(dynamic._RendezvousExitOp(), handler._get_deadline(handler._settings.timeout.close))


@contextlib.contextmanager
def last_call(handler: Any, longest: Callable[[int, int, timedelta, timedelta], timedelta]) -> Iterator[None]:
    """While entered, the c10d handler's last call (how long a round waits for more nodes once its least have
    joined) is ``longest(min_nodes, max_nodes, join timeout, last call)``; others: as they are. torch sets the
    last call on the handler's settings only."""
    settings = getattr(handler, "_settings", None)
    if settings is None:
        yield
        return
    timeout = settings.timeout
    short = timeout.last_call
    timeout._set_timeouts(last_call=longest(settings.min_nodes, settings.max_nodes, timeout.join, short))
    try:
        yield
    finally:
        timeout._set_timeouts(last_call=short)


def round_state(handler: Any) -> tuple[frozenset, frozenset] | None:
    """The nodes of the handler's rendezvous round and those waiting to join, as its state last read them (c10d's
    handler, torch's node descriptors); None for others."""
    holder = getattr(handler, "_state_holder", None)
    if holder is None:
        return None
    return frozenset(holder.state.participants), frozenset(holder.state.wait_list)


@dataclass(frozen=True)
class RoundRead:
    """One read of a c10d rendezvous state, as a handler that joins its round sees it."""

    participants: frozenset
    """The nodes of the round (torch's node descriptors)."""
    heartbeats: dict
    """Each node's last heartbeat (an aware UTC datetime) that the state holds: not a node that left, nor one whose
    heartbeat the reader's state holder found older than ``dead_after`` (it took that one out of the state)."""
    dead_after: timedelta
    """The age of a node's last heartbeat at which the rendezvous takes the node for dead (keep_alive_interval x
    keep_alive_max_attempt)."""
    now: datetime
    """When it was read (aware UTC, as the heartbeats)."""


def _read(state: Any, settings: Any) -> RoundRead:
    """``state`` (torch's _RendezvousState) read now, under ``settings`` (its RendezvousSettings)."""
    dead_after = settings.keep_alive_interval * settings.keep_alive_max_attempt
    return RoundRead(frozenset(state.participants), dict(state.last_heartbeats), dead_after, datetime.now(UTC))


def last_read(handler: Any) -> RoundRead | None:
    """The c10d handler's rendezvous state as it last read it; None for other handlers."""
    holder, settings = getattr(handler, "_state_holder", None), getattr(handler, "_settings", None)
    return None if holder is None or settings is None else _read(holder.state, settings)


def complete_when(ready: Callable[[RoundRead], bool], join: Callable[[Any, float], Any]) -> Callable[[Any, float], Any]:
    """A c10d join operation (torch's ``join(context, deadline) -> action``) that asks ``ready`` at every read of
    the state (so it may remember each read) and marks the round complete at the first read where ``ready`` holds,
    this node is a participant, the round is neither complete nor closed, it has --min-nodes participants and the
    join's deadline has not passed; at any other read, ``join`` decides (torch's: at its last call, or at max nodes)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _Action

    def joined(ctx: Any, deadline: float) -> Any:
        state, settings = ctx.state, ctx.settings
        wanted = ready(_read(state, settings))
        open_round = not state.complete and not state.closed and time.monotonic() <= deadline
        if wanted and open_round and ctx.node in state.participants and len(state.participants) >= settings.min_nodes:
            return _Action.MARK_RENDEZVOUS_COMPLETE
        return join(ctx, deadline)

    return joined


@contextlib.contextmanager
def complete_early(handler: Any, ready: Callable[[RoundRead], bool]) -> Iterator[None]:
    """While entered, each join of a round by the c10d handler is ``complete_when(ready, torch's join)``; other
    handlers: as they are. torch's handler runs every operation through its op executor's ``run``, which is
    wrapped on that instance while entered (its other operations pass as they came)."""
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousJoinOp

    executor = getattr(handler, "_op_executor", None)
    if executor is None:
        yield
        return
    run, own = executor.run, vars(executor).get("run")  # own: set on the instance before (None: the class's)

    def wrapped(state_handler: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(state_handler, _RendezvousJoinOp):
            state_handler = complete_when(ready, state_handler)
        return run(state_handler, *args, **kwargs)

    executor.run = wrapped
    try:
        yield
    finally:
        if own is None:
            del executor.run
        else:
            executor.run = own


def take_over(handler: Any, missed: int, poll_s: float = 0.2) -> Any | None:
    """Make this new agent the node of the job's complete c10d round that had this node's address and whose heartbeats
    stopped (``missed`` of them): its own agent before it, died with its container and started again (torch names a
    node by address, pid and a counter, and a container's new agent may get another pid). torch's next round would
    wait for that node until its heartbeats had been missed for as long as the rendezvous allows (10 s at the spec's
    heartbeat); in its name, this agent's next round leaves the old round (torch's exit operation) and starts at once.
    A node at this address whose heartbeat moves on meanwhile is alive (two agents given one address): left alone.
    The node taken over, or None (no such node, another handler, or a store that does not answer: torch's join then
    decides). Waits at most ``missed`` heartbeats, for a fresh one to age."""
    holder, this, executor = (getattr(handler, name, None) for name in ("_state_holder", "_this_node", "_op_executor"))
    if holder is None or this is None or executor is None:
        return None
    stale_after = handler._settings.keep_alive_interval * missed
    deadline, first_seen = time.monotonic() + stale_after.total_seconds() + poll_s, None
    while time.monotonic() <= deadline:
        try:
            holder.sync()
        except Exception:  # a RendezvousError, a DistError: the store does not answer (yet)
            return None
        read = _read(holder.state, handler._settings)
        beats = {n: read.heartbeats[n] for n in read.participants
                 if n.addr == this.addr and n != this and n in read.heartbeats}  # fmt: skip
        if not holder.state.complete or not beats:
            return None
        node = max(beats, key=beats.__getitem__)  # the newest of them (one that died before it is dropped by torch)
        if first_seen is not None and beats[node] != first_seen:
            return None
        if read.now - beats[node] > stale_after:
            handler._this_node = executor._node = node
            return node
        first_seen = beats[node]
        time.sleep(poll_s)
    return None


def dropped(handler: Any) -> bool:
    """This node is not a participant of the c10d round its handler's state last read (that torch's agent reads at
    each look at healthy ranks): the others dropped it for missed heartbeats while its ranks trained. Others: False."""
    holder, node = getattr(handler, "_state_holder", None), getattr(handler, "_this_node", None)
    return holder is not None and node is not None and node not in holder.state.participants


def wrote_no_error_file(failure: Any) -> bool:
    """A rank's ProcessFailure of a rank that left no error file (killed, or a script that raised outside
    ``record``)."""
    from torch.distributed.elastic.multiprocessing.errors import _NOT_AVAILABLE

    return failure.error_file == _NOT_AVAILABLE


def lost_rank_0(error: BaseException) -> bool:
    """A DistStoreError of a round whose rank 0 never wrote the round's address."""
    from torch.distributed import DistStoreError
    from torch.distributed.elastic.rendezvous.api import RendezvousStoreInfo

    return isinstance(error, DistStoreError) and RendezvousStoreInfo.MASTER_ADDR_KEY in str(error)


def torchrun_parser() -> Any:
    """torchrun's own argument parser."""
    from torch.distributed.run import get_args_parser

    return get_args_parser()


def nnodes_range(nnodes: str) -> tuple[int, int]:
    """torchrun's reading of --nnodes (``2`` or ``1:3``); raises RuntimeError or ValueError on a bad one."""
    from torch.distributed.run import parse_min_max_nnodes

    return parse_min_max_nnodes(nnodes)


def launch_config(args: Any) -> tuple[Any, Callable | str, list[str]]:
    """torchrun's launch configuration of its parsed arguments, the entrypoint and its arguments."""
    from torch.distributed.run import config_from_args

    return config_from_args(args)
