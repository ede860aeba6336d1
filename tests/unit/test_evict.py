"""app/evict.py: which straggler leaves a running job, from rank 0's exchanges of step times."""

import re

import pytest

from app import evict
from app.errors import UsageError

A, B, C = "c-head-1", "c-worker-1", "c-worker-2"


def exchange(at: float, busy: list[float], hosts: tuple[str, ...] = (A, B, C), accum: int = 2) -> dict:
    return {"time": at, "hosts": list(hosts), "busy_ms": busy, "world_size": len(hosts), "global_batch": 96,
            "accum_steps": accum}  # fmt: skip


def test_a_node_slow_at_every_exchange_of_the_window_is_evicted_and_the_job_left_keeps_its_global_batch() -> None:
    watch = evict.Watch(factor=3.0, after=3, min_nodes=2)
    assert watch.feed(exchange(0, [10, 10, 50])) is None
    assert watch.feed(exchange(20, [10, 10, 41])) is None
    found = watch.feed(exchange(40, [10, 11, 45]))
    assert isinstance(found, evict.Eviction)
    assert (found.node, found.exchanges, found.window, found.window_s) == (C, 3, 5, 40.0)
    assert round(found.factor, 1) == 4.3  # the median over its slow exchanges (5, 4.1, 4.3)
    assert (found.nodes_left, found.ranks_left, found.global_batch, found.accum_left) == (2, 2, 96, 3)
    assert found.line(0) == (
        f"cluster: node {C} evicted: busy 4.3x the others' median at 3 of the last 5 exchanges (40 s); the job goes on "
        "with 2 nodes, global batch 96 (accum 3); its gate takes it back once it passes"
    )
    assert "; it waits 30 s (evicted again soon after its return)" in found.line(30)


def test_three_slow_exchanges_of_the_last_five_evict_two_do_not_and_noise_below_the_factor_never_does() -> None:
    watch = evict.Watch(factor=3.0, after=3, min_nodes=2)
    for at, busy in enumerate([[10, 10, 50], [10, 10, 12], [10, 10, 12], [10, 10, 12], [10, 10, 50], [10, 10, 12]]):
        assert watch.feed(exchange(at, busy)) is None  # (at 5 the first slow one is 6 exchanges back)
    assert watch.feed(exchange(6, [10, 10, 12])) is None
    flaky = evict.Watch(factor=3.0, after=3, min_nodes=2)  # a CPU throttle: slow at most exchanges, not all
    for at, busy in enumerate([[10, 10, 50], [10, 10, 12], [10, 10, 50], [10, 10, 12]]):
        assert flaky.feed(exchange(at, busy)) is None
    assert isinstance(flaky.feed(exchange(4, [10, 10, 50])), evict.Eviction)
    calm = evict.Watch(factor=3.0, after=3, min_nodes=2)
    assert all(calm.feed(exchange(at, [10, 10, 29.9])) is None for at in range(20))  # 2.99x: never


def test_nothing_is_evicted_at_min_nodes_or_with_the_policy_off() -> None:
    at_min = evict.Watch(factor=3.0, after=1, min_nodes=3)
    assert at_min.feed(exchange(0, [10, 10, 90])) is None
    off = evict.Watch(factor=0.0, after=1, min_nodes=1)
    assert off.feed(exchange(0, [10, 10, 90])) is None


def test_a_straggler_whose_ranks_left_cannot_keep_the_global_batch_is_named_once_and_stays() -> None:
    watch = evict.Watch(factor=3.0, after=1, min_nodes=1)
    line = watch.feed(exchange(0, [10, 10, 90], accum=1))  # 96 = 32 x 3: not a multiple of 32 x 2
    assert line == (
        f"cluster: node {C} is a straggler (busy 9.0x the others' median at 1 of the last 1 exchanges) but is not "
        "evicted: the global batch 96 does not divide among the 2 ranks left (per-rank batch 32); pick a global batch "
        "that does (--accum-steps)"
    )
    assert watch.feed(exchange(1, [10, 10, 90], accum=1)) is None


def test_a_node_with_several_ranks_is_slow_when_every_rank_of_it_is() -> None:
    watch = evict.Watch(factor=3.0, after=1, min_nodes=1)
    hosts = (A, A, B, B)
    assert watch.feed({**exchange(0, [10, 10, 10, 90], hosts), "global_batch": 128}) is None  # one slow rank of B
    found = watch.feed({**exchange(1, [10, 10, 80, 90], hosts), "global_batch": 128})
    assert found.node == B and found.ranks_left == 2 and found.accum_left == 4


def test_a_node_evicted_again_soon_after_its_return_waits_longer_each_time() -> None:
    assert evict.backoff(1000.0, None, 0.0) == 0.0  # its first eviction: its gate judges it at once
    assert evict.backoff(1000.0, 900.0, 0.0) == evict.BACKOFF_S
    assert evict.backoff(1000.0, 900.0, evict.BACKOFF_S) == 2 * evict.BACKOFF_S
    assert evict.backoff(1000.0, 1000.0 - evict.RECENT_S - 1, 120.0) == 0.0  # long ago: afresh


def test_a_policy_travels_as_text_and_a_bad_one_is_refused() -> None:
    policy = evict.Policy(3.5, 2, 2)
    assert evict.Policy.parse(policy.text()) == policy and policy.text() == "3.5:2:2"
    for bad in ("3", "1:2:2", "3:0:2", "3:2:0", "a:b:c"):
        with pytest.raises(ValueError):
            evict.Policy.parse(bad)
    watch = policy.watch()
    assert (watch.factor, watch.after, watch.min_nodes, watch.who) == (3.5, 2, 2, "train")


@pytest.mark.parametrize(
    ("factor", "after", "said"),
    [
        (0.5, 3, "--evict-factor 0.5 must be above 1 (a node that many times the median rank's busy time per step "
                 "is evicted), or 0: never evict"),
        (1.0, 3, "--evict-factor 1 must be above 1"),
        (3.0, 0, "--evict-after 0 must be >= 1"),
    ],
)  # fmt: skip
def test_bad_policy_values_are_one_line_naming_the_flag(factor: float, after: int, said: str) -> None:
    with pytest.raises(UsageError, match=re.escape(said)):
        evict.check(factor, after)
    evict.check(0.0, 1)  # off
