"""Every private name of torch that app node's agent uses (app/node/torch_elastic.py), checked on the torch installed:
a torch that renames or re-signs one fails here, and app node refuses it in one line.

    .venv/bin/python -m pytest -m torch_api tests/unit      # make test runs it on .venv's torch and on .venv-tv's
"""

import operator
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from app.node import agent, torch_elastic
from app.node.torch_elastic import PRIVATE, Private

pytestmark = pytest.mark.torch_api
ROOT = Path(__file__).resolve().parents[2]


def real_ones() -> dict[str, object]:
    """A real c10d rendezvous handler (on an in-process store), its state, and a real agent of it: the objects
    whose instances carry the names set in __init__."""
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    store = dist.HashStore()
    handler = dynamic.DynamicRendezvousHandler.from_backend(
        "job", store, C10dRendezvousBackend(store, "job"), 1, 2, local_addr="node0"
    )
    spec = WorkerSpec(role="trainer", local_world_size=1, rdzv_handler=handler, entrypoint="x.py", max_restarts=3)
    state = handler._state_holder.state
    return {
        "LocalElasticAgent": LocalElasticAgent(spec, DefaultLogsSpecs(), start_method="spawn"),
        "DynamicRendezvousHandler": handler,
        "_RendezvousState": state,
        "_RendezvousContext": dynamic._RendezvousContext(handler._this_node, state, handler._settings),
        "_DistributedRendezvousOpExecutor": handler._op_executor,
        "_NodeDesc": handler._this_node,
    }


@pytest.mark.parametrize("name", PRIVATE, ids=str)
def test_each_private_name_is_there_as_the_agent_uses_it(name: Private) -> None:
    if not name.on_instance:
        assert torch_elastic.problem(name) is None, f"torch {torch.__version__}: {torch_elastic.problem(name)}"
        return
    owner, attribute = name.name.split(".", 1)
    instance = real_ones()[owner]
    operator.attrgetter(attribute)(instance)  # AttributeError: torch renamed it


def test_the_agent_reads_and_changes_a_real_handler_through_them() -> None:
    handler = real_ones()["DynamicRendezvousHandler"]
    assert agent.round_nodes(handler) == frozenset() and agent.newcomers(handler, frozenset()) == frozenset()
    short = handler._settings.timeout.last_call
    with agent.first_round(handler):  # min 1, max 2: elastic, so the first round waits half the join timeout
        assert handler._settings.timeout.last_call == handler._settings.timeout.join * agent.FIRST_ROUND_SHARE
    assert handler._settings.timeout.last_call == short
    agent.leave_round(handler)  # it never joined: the exit op finds nothing to leave


def test_a_renamed_or_re_signed_name_is_named_and_app_node_refuses_that_torch_in_one_line(monkeypatch) -> None:
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic

    assert torch_elastic.missing() == []  # the control
    monkeypatch.delattr(dynamic.DynamicRendezvousHandler, "_stop_heartbeats")
    monkeypatch.setattr(LocalElasticAgent, "_monitor_workers", lambda self, worker_group, deadline: None)
    found = torch_elastic.missing()
    assert found == [
        f"{torch_elastic.AGENT}.LocalElasticAgent._monitor_workers(self, worker_group) takes (self, worker_group, "
        "deadline) now",
        f"{torch_elastic.DYNAMIC}.DynamicRendezvousHandler._stop_heartbeats(self) is missing",
    ], found
    with pytest.raises(torch_elastic.UsageError) as refused:
        torch_elastic.refuse_unproven()
    assert str(refused.value) == (
        f"torch {torch.__version__} is not one that app node's agent works with: {found[0]} (and 1 more); install a "
        "torch that the node extra of pyproject.toml allows (app/node/torch_elastic.py lists what it uses)"
    )


def test_app_node_on_a_torch_without_a_name_says_so_in_one_line_and_starts_nothing(tmp_path: Path) -> None:
    """A real ``python -m app node`` whose torch lacks one name (removed before app starts): exit 2, one line."""
    remove = (
        "import runpy, sys; from torch.distributed.elastic.rendezvous import dynamic_rendezvous as d; "
        "del d._RendezvousExitOp; sys.argv = ['app', 'node', '--no-fork', '--', '--standalone', '-m', 'app', "
        "'check']; runpy.run_module('app', run_name='__main__')"
    )
    done = subprocess.run([sys.executable, "-c", remove], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert "_RendezvousExitOp() is missing; install a torch" in lines[0] and "Traceback" not in done.stderr, lines


def test_the_range_pyproject_states_is_the_torch_of_every_venv_that_runs_this() -> None:
    """pyproject.toml's node extra names the releases this test runs on (.venv's torch and .venv-tv's)."""
    import tomllib

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["node"]
    [torch_line] = [line for line in extra if line.startswith("torch")]
    release = Version(torch.__version__).base_version
    assert release in SpecifierSet(torch_line.removeprefix("torch")), (torch_line, torch.__version__)


def test_a_node_out_of_its_rounds_participants_reads_as_dropped() -> None:
    """The state as the handler last read it: a node the others dropped is not among the participants."""
    handler = real_ones()["DynamicRendezvousHandler"]
    state = handler._state_holder.state
    assert torch_elastic.dropped(handler)  # a handler that never joined is in no round
    state.participants[handler._this_node] = 0
    assert not torch_elastic.dropped(handler)
    del state.participants[handler._this_node]  # what the others' sanitizing of its heartbeats does
    assert torch_elastic.dropped(handler)
    assert not torch_elastic.dropped(object())  # not c10d's: never


def test_a_round_after_a_regroup_waits_for_the_joiner_as_the_first_round_does(monkeypatch) -> None:
    """The round after this agent stopped its ranks for a waiting node waits for it as long as the job's first round
    (a loaded machine's joiner missed the 2 s last call: the round formed without it, and the job regrouped again);
    the round after that one: the short last call again."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs

    monkeypatch.delenv("DDP_CLUSTER_EVENTS_FILE", raising=False)
    ones = real_ones()
    handler, spec = ones["DynamicRendezvousHandler"], ones["LocalElasticAgent"]._worker_group.spec
    node = agent.event_agent()(spec, DefaultLogsSpecs(), start_method="spawn")
    timeout = handler._settings.timeout
    short, long = timeout.last_call, timeout.join * agent.FIRST_ROUND_SHARE
    calls: list = []

    def round_() -> None:
        calls.append((timeout.last_call, "run" in vars(handler._op_executor)))  # run wrapped: complete_early

    node.join(round_, handler)  # the first round
    node.join(round_, handler)  # a restart after a failure
    node.restarting(True)  # torch's agent restarts its ranks for a node that waits to join
    node.join(round_, handler)
    node.join(round_, handler)
    assert calls == [(long, False), (short, False), (long, True), (short, False)], calls
    assert timeout.last_call == short and "run" not in vars(handler._op_executor)


def elastic_handler(store: object, addr: str) -> object:
    """A real c10d handler of an elastic job of 1 to 3 nodes on the in-process ``store`` (torch's defaults: a
    heartbeat every 5 s, a node dead after 3 missed: 15 s; a last call of 30 s)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    backend = C10dRendezvousBackend(store, "job")
    return dynamic.DynamicRendezvousHandler.from_backend("job", store, backend, 1, 3, local_addr=addr)


def test_a_round_after_a_regroup_completes_once_the_nodes_it_awaits_are_in_unless_one_is_dead() -> None:
    """torch's join operation, wrapped (``complete_when``), on real states of a round of 1 to 3 nodes that this node
    joined: this node, a peer of its last round and the node that waited to join are awaited (``Awaited``)."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic

    handler = elastic_handler(dist.HashStore(), "this")
    this, peer, newcomer = handler._this_node, dynamic._NodeDesc("peer", 2, 0), dynamic._NodeDesc("new", 3, 0)
    now, stale = datetime.now(UTC), datetime.now(UTC) - timedelta(seconds=60)  # dead: older than 15 s

    def action(participants: set, heartbeats: dict, since: datetime = now, ready=None) -> object:
        state = dynamic._RendezvousState()
        state.participants, state.last_heartbeats = dict.fromkeys(participants, 0), dict(heartbeats)
        ready = ready or agent.Awaited(frozenset({this, peer, newcomer}), since=since).ready
        ctx = dynamic._RendezvousContext(this, state, handler._settings)
        deadline = time.monotonic() + 60
        found = torch_elastic.complete_when(ready, dynamic._RendezvousJoinOp())(ctx, deadline)
        torchs = dynamic._RendezvousJoinOp()(ctx, deadline)  # what torch's own operation does there
        return "complete" if found == dynamic._Action.MARK_RENDEZVOUS_COMPLETE else ("torch's", torchs == found)

    everyone = {this: now, peer: now, newcomer: now}
    assert action({this, peer, newcomer}, everyone) == "complete"  # 3 of 3 max: torch would complete it too
    assert action({this, newcomer}, everyone) == ("torch's", True)  # the peer is alive (its heartbeat is fresh)
    assert action({this, newcomer}, {this: now, peer: stale, newcomer: now}) == "complete"  # the peer died
    assert action({this, newcomer}, {this: now, newcomer: now}, since=stale) == "complete"  # never seen, long gone
    assert action({this, newcomer}, {this: now, newcomer: now}) == ("torch's", True)  # never seen, only just
    assert action({peer, newcomer}, everyone, ready=lambda read: True) == ("torch's", True)  # this node is not in it


def test_a_peer_briefly_out_of_the_state_is_waited_for_by_the_heartbeat_remembered_of_it() -> None:
    """A live peer exits the round it completed and joins again moments later: in between it is in neither the
    participants nor the heartbeats. Its newest heartbeat seen, remembered across reads, says it is alive; only once
    that heartbeat is older than the rendezvous allows is the peer taken for dead."""
    this, peer, newcomer = "this", "peer", "new"
    start, dead_after = datetime(2026, 1, 1, tzinfo=UTC), timedelta(seconds=15)

    def read(at: float, participants: set, heartbeats: dict) -> torch_elastic.RoundRead:
        beats = {node: start + timedelta(seconds=s) for node, s in heartbeats.items()}
        return torch_elastic.RoundRead(frozenset(participants), beats, dead_after, start + timedelta(seconds=at))

    nodes = frozenset({this, peer, newcomer})
    awaited = agent.Awaited(nodes, since=start)
    assert not awaited.ready(read(0, {peer}, {peer: 0, newcomer: 0}))  # the old round, the newcomer waits
    gap = read(10, {this, newcomer}, {this: 9, newcomer: 9})  # the peer left the old round, not yet back
    assert not awaited.ready(gap) and agent.Awaited(nodes, since=start - dead_after).ready(gap)  # (absence alone)
    assert awaited.ready(read(11, {this, newcomer, peer}, {this: 9, newcomer: 9, peer: 11}))  # it joined
    gone = agent.Awaited(nodes, since=start)
    assert not gone.ready(read(0, {peer}, {peer: 0, newcomer: 0}))
    assert not gone.ready(read(15, {this, newcomer}, {this: 15, newcomer: 15}))  # 15 s since: not yet dead
    assert gone.ready(read(15.5, {this, newcomer}, {this: 15, newcomer: 15}))  # dead as torch's rendezvous says


def test_a_regroup_round_on_real_handlers_completes_as_the_awaited_nodes_join_not_at_the_last_call() -> None:
    """Two real handlers on one store, an elastic job of 1 to 3 nodes: the peer joins first (its last call, 30 s,
    begins), then this node's real join operation, run by torch's executor inside ``complete_early``, completes the
    round as soon as it is in with the peer (torch's: 30 s later). The executor is as it was afterwards."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic

    store = dist.HashStore()
    mine, peers = elastic_handler(store, "this"), elastic_handler(store, "peer")
    this, peer = mine._this_node, peers._this_node

    def join_only(ctx, deadline):  # the peer: in the round, no more
        return dynamic._Action.FINISH if ctx.node in ctx.state.participants else dynamic._Action.ADD_TO_PARTICIPANTS

    peers._op_executor.run(join_only, peers._get_deadline(timedelta(seconds=10)))
    started = time.monotonic()
    awaited = agent.Awaited(frozenset({this, peer}), since=datetime.now(UTC))
    with torch_elastic.complete_early(mine, awaited.ready):
        mine._op_executor.run(dynamic._RendezvousJoinOp(), mine._get_deadline(timedelta(seconds=60)))
    state = mine._state_holder.state
    assert state.complete and state.participants == {peer: 0, this: 1}, vars(state)  # ranks by address
    assert time.monotonic() - started < 10, "the round waited for its last call"
    assert "run" not in vars(mine._op_executor)


def a_complete_round(store: object, beats: dict) -> None:
    """Write a complete round of the nodes of ``beats`` (node -> its last heartbeat) into ``store``'s rendezvous."""
    writer = elastic_handler(store, "writer")
    writer._state_holder.sync()  # the state there now: a write must follow a read
    state = writer._state_holder.state
    state.participants, state.last_heartbeats = {node: rank for rank, node in enumerate(beats)}, dict(beats)
    state.complete = True
    writer._state_holder.mark_dirty()
    assert writer._state_holder.sync() is True


def test_a_new_agent_takes_the_place_of_the_dead_node_at_its_address_and_its_next_round_leaves_the_old_one() -> None:
    """A node container killed and started again: its new agent has another pid, so torch names it another node,
    and the job's round waits for the old one until its heartbeats have been missed for 10 s. The new agent takes
    the old one's place instead; torch's exit operation, the first step of its next round, then takes it out."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic

    store, now = dist.HashStore(), datetime.now(UTC)
    head, dead = dynamic._NodeDesc("head", 6, 0), dynamic._NodeDesc("worker", 7, 0)
    a_complete_round(store, {head: now, dead: now - timedelta(seconds=11)})  # 2 heartbeats of 5 s missed
    new = elastic_handler(store, "worker")
    assert new._this_node != dead  # the control: torch's own name for the new agent
    assert torch_elastic.take_over(new, agent.PREDECESSOR_MISSED) == dead
    assert new._this_node == dead and new._op_executor._node == dead
    torch_elastic.leave(new)
    reader = elastic_handler(store, "reader")
    reader._state_holder.sync()
    assert set(reader._state_holder.state.participants) == {head}

    elsewhere = dynamic._NodeDesc("worker-2", 7, 0)  # another address: not this node's predecessor
    a_complete_round(store, {head: now, elsewhere: now - timedelta(seconds=11)})
    assert torch_elastic.take_over(elastic_handler(store, "worker"), agent.PREDECESSOR_MISSED) is None


def test_a_node_at_the_same_address_whose_heartbeat_moves_on_is_alive_and_left_alone() -> None:
    """Two agents given one address (the integration tests' nodes share one): the new one waits for the other's
    heartbeat to age, sees it move on instead, and stays itself. An open round is never taken over from."""
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dynamic

    store, now = dist.HashStore(), datetime.now(UTC)
    head, live = dynamic._NodeDesc("head", 6, 0), dynamic._NodeDesc("worker", 7, 0)
    a_complete_round(store, {head: now, live: now})
    new = elastic_handler(store, "worker")
    own = new._this_node
    beat = threading.Thread(target=a_complete_round, args=(store, {head: now, live: now + timedelta(seconds=1)}))
    beat.start()  # its next heartbeat, written while the new agent watches (its wait: 2 of 5 s heartbeats)
    assert torch_elastic.take_over(new, agent.PREDECESSOR_MISSED) is None
    beat.join()
    assert new._this_node == own and new._op_executor._node == own

    open_round = elastic_handler(store, "writer")
    open_round._state_holder.sync()
    state = open_round._state_holder.state
    state.participants, state.last_heartbeats = {live: 0}, {live: now - timedelta(seconds=60)}
    state.complete = False
    open_round._state_holder.mark_dirty()
    assert open_round._state_holder.sync() is True
    assert torch_elastic.take_over(elastic_handler(store, "worker"), agent.PREDECESSOR_MISSED) is None
