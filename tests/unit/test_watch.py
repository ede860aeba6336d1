"""app/train/watch.py's pure parts: who is the straggler, how ranks read, which errors are a lost peer."""

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from app.train.watch import StragglerNamer, analyse, collective_failed, ranks_text

HOSTS = ["head", "head", "w1", "w1"]


def rows(busy_ms: list[float], wait_ms: list[float], steps: int = 10, stall_ms: float = 0.0) -> list[list[float]]:
    """Exchange rows of ranks whose steps all take as long (lockstep): wall = busy + wait per step; each rank's
    collective threads waited ``stall_ms`` a step for a CPU."""
    wall = [b + w for b, w in zip(busy_ms, wait_ms, strict=True)]
    assert len({round(x, 6) for x in wall}) == 1, "in synchronous DDP every rank's step takes as long"
    stall = steps * stall_ms / 1e3
    return [
        [steps, steps * t / 1e3, steps / 1e3, steps * w / 1e3, 12.5, stall] for t, w in zip(wall, wait_ms, strict=True)
    ]


def test_the_straggler_is_the_rank_the_others_wait_for_not_the_one_with_long_steps():
    # Rank 2 is busy 60 ms per step; the others finish in 10 ms and wait 50 ms for it in the all-reduce.
    record, line = analyse(rows([10, 10, 60, 10], [50, 50, 0, 50]), HOSTS, step=40, percent=50)
    assert record["slowest_rank"] == 2 and record["slowest_host"] == "w1"
    assert record["busy_ms"] == [10, 10, 60, 10] and record["median_busy_ms"] == 10
    assert record["wait_ms"] == [50, 50, 0, 50] and record["hosts"] == HOSTS  # (the job's events carry the record)
    assert record["over_median_percent"] == 500 and record["step_ms"] == 60 and record["steps"] == 10
    assert line == (
        "train: rank 2 on w1 is the slowest (a straggler): busy 60.0 ms per step, 500% above the median 10.0 ms "
        "(data 1.0 ms, compute 59.0 ms; steps take 60.0 ms)"
    )


def test_no_line_below_the_threshold():
    record, line = analyse(rows([10, 12, 11, 10], [2, 0, 1, 2], stall_ms=0.5), HOSTS, step=20, percent=50)
    assert record["slowest_rank"] == 1 and line is None
    assert record["stall_ms"] == [0.5] * 4  # each rank's collective threads' wait for a CPU, per step


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([3], "rank 3"), ([2, 3], "ranks 2-3"), ([5, 0, 2, 6, 7], "ranks 0, 2, 5-7")],
)
def test_ranks_text(ranks, text):
    assert ranks_text(ranks) == text


def test_lost_peers_and_timeouts_are_collective_failures_but_bugs_are_not():
    gloo = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [172.18.0.3]:41913"
    assert collective_failed(RuntimeError(gloo))
    assert collective_failed(RuntimeError("Timed out waiting 20000ms for recv operation to complete"))
    assert collective_failed(dist.DistBackendError("NCCL communicator was aborted"))
    assert not collective_failed(RuntimeError("mat1 and mat2 shapes cannot be multiplied (64x10 and 784x256)"))
    assert not collective_failed(ValueError("Timed out"))


def test_a_straggler_is_named_once_it_is_the_slowest_at_five_exchanges_in_a_row():
    namer = StragglerNamer()
    # Noise: the slowest rank changes at every exchange, or stays for fewer than five, so none is named.
    assert [namer.name(r) for r in (2, 0, 2, 2, None, 1, 3, 3, 3, 3, 1)] == [False] * 11
    # Rank 3 stays the slowest: named at its fifth exchange, then not again while it stays.
    assert [namer.name(r) for r in (3,) * 7] == [False] * 4 + [True, False, False]
    # Another rank takes its place for good: named; after a window with none over, rank 3 again.
    assert [namer.name(r) for r in (1,) * 5] == [False] * 4 + [True]
    assert [namer.name(r) for r in (None, *(3,) * 5)] == [False] * 5 + [True]


GOLDEN = Path(__file__).parent / "golden" / "straggler"


def named_on(records: str, percent: float = 50.0) -> list[tuple[int, int]]:
    """(step, rank) of each straggler line the rule prints over a real run's ``ranks`` records (as analyse made them
    with --straggler-percent ``percent``)."""
    namer = StragglerNamer()
    lines = [json.loads(line) for line in (GOLDEN / records).read_text().splitlines()]
    over = [(r["step"], r["slowest_rank"] if r["over_median_percent"] > percent else None) for r in lines]
    return [(step, rank) for step, rank in over if namer.name(rank)]


def test_an_undisturbed_run_names_no_straggler():
    # 3 ranks on 2 shared cores, 250 exchanges (every 2 steps): 36 are over 50 %, their slowest rank changing;
    # twice rank 1 was the slowest at two in a row, which the rule of two named (steps 130 and 270).
    assert named_on("undisturbed-3-ranks.jsonl") == []


def test_a_rank_that_sleeps_every_step_is_named_once_at_its_fifth_exchange():
    assert named_on("rank-2-sleeps-100-ms.jsonl") == [(10, 2)]


@pytest.mark.parametrize(
    ("answered", "said"),
    [
        (None, "no store answers (rank 0's on head, nor the survivors' store): which ranks stopped cannot be told"),
        ({1}, "rank 0 on head stopped answering: the gradient all-reduce of step 7 failed"),  # the control
    ],
)
def test_a_roll_call_that_no_store_holds_blames_no_rank(monkeypatch, answered, said):
    """The rendezvous store killed (issue 25): no roll call can be held, so no rank is named as stopped (rank 0
    never left); when one is held, the silent rank is named."""
    from types import SimpleNamespace

    from app.train.watch import Watch

    watch = object.__new__(Watch)
    watch.doing, watch.world, watch.hosts, watch.exchanged_at, watch._where = ("gradient all-reduce", 7), 2, [
        "head", "worker"], 6, ""  # fmt: skip
    watch.ctx = SimpleNamespace(proc=SimpleNamespace(survivors_store=("rdzv", 29500)))
    watch.answers = {1: {"host": "worker", "stopped": False}}
    monkeypatch.setattr(Watch, "_roll_call", lambda self, completed, grace: answered)
    line = watch.explain(RuntimeError("Connection closed by peer"), 6)
    assert said in line, line
    assert ("stopped answering" in line) == (answered is not None), line


@pytest.mark.parametrize(
    ("said", "line"),
    [
        # The job is being stopped (the rendezvous store lost, CI of 3c25d53): compose stops the worker first; its
        # ranks keep their step and say so; rank 1, on rank 0's own node, still waits on rank 0 in the ring.
        (
            {2: True, 3: True},
            "ranks 2-3 on worker stopped: their launcher ended them (SIGTERM); not answered yet, "
            "on a node that answers (it may be waiting on this rank): rank 1 on head",
        ),
        ({2: False, 3: False}, "rank 1 on head stopped answering: "),  # the controls: no launcher stopped anyone
        ({1: False}, "ranks 2-3 on worker stopped answering: "),  # a whole node gone
    ],
)
def test_a_rank_silent_beside_ranks_that_their_launcher_stopped_is_not_blamed(monkeypatch, said, line):
    from types import SimpleNamespace

    from app.train.watch import Watch

    watch = object.__new__(Watch)
    watch.doing, watch.world, watch.hosts, watch.exchanged_at, watch._where = ("gradient all-reduce", 28), 4, [
        "head", "head", "worker", "worker"], 20, ""  # fmt: skip
    watch.ctx = SimpleNamespace(proc=SimpleNamespace(survivors_store=None))
    watch.answers = {0: {"host": "head", "stopped": False}} | {
        r: {"host": HOSTS[r] if r < 2 else "worker", "stopped": stopped} for r, stopped in said.items()}  # fmt: skip
    monkeypatch.setattr(Watch, "_roll_call", lambda self, completed, grace: set(watch.answers))
    text = watch.explain(RuntimeError("[pair.cc:534] Connection closed by peer [172.18.0.3]:41913"), 27)
    assert line in text, text
    assert watch.peers_lost == ("stopped answering" in text) and watch.peers_stopped == ("launcher" in text), text


def test_app_nodes_policy_sends_the_slow_nodes_ranks_away_and_the_others_remember_it(monkeypatch, tmp_path):
    """Every rank runs the same rule on the same table (``Watch.pace``): the straggler's ranks raise Leave, the
    others remember which node left; rank 0 writes the eviction to the job's events."""
    from types import SimpleNamespace

    from app import events, evict
    from app.train.watch import Leave, Watch

    monkeypatch.setenv("DDP_CLUSTER_EVENTS_FILE", str(tmp_path / "events"))

    def rank(number: int, host: str) -> Watch:
        watch = object.__new__(Watch)
        watch.rank, watch.left = number, None
        watch.ctx = SimpleNamespace(proc=SimpleNamespace(host=host))
        watch._pace, watch._recalled = evict.Policy(3.0, 1, 2).watch(), 0.0
        return watch

    slow = {"step": 20, "hosts": ["a", "b", "c"], "busy_ms": [10.0, 11.0, 90.0], "world_size": 3,
            "global_batch": 48, "accum_steps": 2}  # fmt: skip
    first, other, straggler = rank(0, "a"), rank(1, "b"), rank(2, "c")
    first.pace(slow)
    other.pace(slow)
    assert first.left.node == other.left.node == "c"
    with pytest.raises(Leave) as leaving:
        straggler.pace(slow)
    said = leaving.value.eviction.line(0, "train")
    assert said.startswith("train: node c evicted: busy 5.7x the others' share without it"), said
    said = [(r["rank"], r["evicted"], r["step"]) for r in events.read(tmp_path / "events")[0]]
    assert said == [(0, "c", 20)]  # rank 0 alone writes it
    calm = rank(1, "b")
    calm.pace(slow | {"busy_ms": [10.0, 11.0, 12.0]})
    assert calm.left is None
