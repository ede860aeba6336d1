"""``app links``' schedule and verdict: round-robin pairing, the outlier rule, --fail-below, flags."""

import itertools
import json
import random
from pathlib import Path

import pytest

from app.diagnostics.links import below, directed, judge, leaders, round_robin
from tests.unit.cli_errors import usage_error


@pytest.mark.parametrize("n", range(2, 10))
def test_round_robin_meets_every_pair_once_in_disjoint_rounds(n: int) -> None:
    rounds = round_robin(n)
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    pairs = [pair for r in rounds for pair in r]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))  # every pair, exactly once
    for r in rounds:
        busy = [node for pair in r for node in pair]
        assert len(busy) == len(set(busy)), f"a node twice in one round: {r}"
        assert len(r) == n // 2  # odd n: exactly one node has a bye
    steps = [step for phase in directed(rounds) for step in phase]
    assert sorted(steps) == sorted(itertools.permutations(range(n), 2))  # every ordered pair once


def test_odd_rounds_give_each_node_one_bye() -> None:
    byes = [set(range(5)) - {node for pair in r for node in pair} for r in round_robin(5)]
    assert sorted(b.pop() for b in byes) == [0, 1, 2, 3, 4]


def test_leaders_are_the_first_rank_of_each_host() -> None:
    assert leaders(["a", "a", "b", "b", "c"]) == [0, 2, 4]
    assert leaders(["b", "a", "b", "a"]) == [0, 1]


def _matrix(n: int, fast: float = 10.0, slow: dict | None = None, jitter: float = 0.0) -> list:
    """Every link ``fast`` GB/s (+- jitter, deterministic), except ``slow``: {(src, dst): GB/s}."""
    slow = slow or {}
    m = [[None] * n for _ in range(n)]
    for i, j in itertools.permutations(range(n), 2):
        wobble = jitter * (((i * 7 + j * 3) % 5) - 2) / 2  # in [-jitter, +jitter]
        m[i][j] = slow.get((i, j), fast * (1 + wobble))
    return m


@pytest.mark.parametrize("n", [3, 4, 6])
def test_a_node_that_sends_slowly_is_named_and_nothing_else(n: int) -> None:
    slow = {(1, j): 0.02 for j in range(n) if j != 1}
    verdict = judge(_matrix(n, slow=slow, jitter=0.1), k=3)
    assert verdict.slow_nodes == [(1, "send")]
    assert verdict.slow_links == []


def test_the_links_of_a_slow_sender_do_not_condemn_their_receivers() -> None:
    # node 1 sends at a thousandth; node 3 receives from the two others at 0.7 of the rest: its link from
    # node 1 is node 1's fault, and the two left are not slow as a group (they were, dragged by that link).
    slow = {(1, j): 0.01 for j in range(4) if j != 1} | {(0, 3): 7.0, (2, 3): 7.0}
    verdict = judge(_matrix(4, slow=slow), k=3)
    assert verdict.slow_nodes == [(1, "send")]
    assert verdict.slow_links == []


@pytest.mark.parametrize("name", ["slow-sender-1.json", "slow-sender-2.json"])
def test_a_recorded_slow_sender_is_named_as_a_node_not_its_receivers(name: str) -> None:
    # Real reports (golden/links/README.md): 4 ranks posing as 4 nodes, node 1 sleeping 0.25 s before each send;
    # the other links read 0.56-3.26 GB/s, a factor 6 apart on this busy 2-core machine.
    report = json.loads((Path(__file__).parent / "golden" / "links" / name).read_text())
    verdict = judge(report["bandwidth_gbps"], k=3)
    assert verdict.slow_nodes == [(1, "send")] and verdict.slow_links == []


@pytest.mark.parametrize(
    "matrix",
    [
        [[None, 0.024, 0.024], [0.693, None, 0.966], [0.878, 1.429, None]],
        [[None, 0.024, 0.024], [0.945, None, 1.406], [0.946, 1.664, None]],
    ],
)
def test_a_sender_throttled_on_3_nodes_is_not_named_a_slow_receiver_too(matrix) -> None:
    # Two attempts of test_measure's links job beside two busy loops (make test, 4492e9e): the head's interface
    # shaped by tc, its links into it 1.6x below the workers' two links to each other; they named it "both".
    verdict = judge(matrix, k=3)
    assert verdict.slow_nodes == [(0, "send")] and verdict.slow_links == []


def test_a_node_that_receives_slowly_or_both() -> None:
    n = 5
    receive = judge(_matrix(n, slow={(i, 3): 1.0 for i in range(n) if i != 3}), k=3)
    assert receive.slow_nodes == [(3, "receive")] and receive.slow_links == []
    both_ways = {(i, 3): 1.0 for i in range(n) if i != 3} | {(3, j): 1.0 for j in range(n) if j != 3}
    both = judge(_matrix(n, slow=both_ways), k=3)
    assert both.slow_nodes == [(3, "both")] and both.slow_links == []


def test_one_slow_link_is_named_alone() -> None:
    verdict = judge(_matrix(4, slow={(2, 0): 3.0}, jitter=0.1), k=3)
    assert verdict.slow_nodes == []
    assert verdict.slow_links == [(2, 0)]


def test_a_node_and_an_unrelated_link() -> None:
    slow = {(0, j): 0.5 for j in range(1, 5)} | {(3, 4): 0.5}
    verdict = judge(_matrix(5, slow=slow), k=3)
    assert verdict.slow_nodes == [(0, "send")]
    assert verdict.slow_links == [(3, 4)]


@pytest.mark.parametrize("n", [3, 4, 8])
def test_noise_alone_names_nothing(n: int) -> None:
    verdict = judge(_matrix(n, jitter=0.2), k=3)
    assert verdict.slow_nodes == [] and verdict.slow_links == []
    assert verdict.threshold is not None and verdict.threshold <= verdict.median / 1.25**3 + 1e-9


def test_k_moves_the_threshold() -> None:
    # Steady links: MAD 0, so s is its floor 1.25 and the threshold median / 1.25^k.
    m = _matrix(4, slow={(1, 2): 6.0})
    assert judge(m, k=2).threshold == pytest.approx(6.4) and judge(m, k=2).slow_links == [(1, 2)]
    assert judge(m, k=3).threshold == pytest.approx(5.12) and judge(m, k=3).slow_links == []


def test_noisy_links_widen_the_rule() -> None:
    # Three nodes, one sending slowly, the healthy links +-20% apart (as on a busy machine).
    m = [[None, 2.92, 2.55], [0.021, None, 0.021], [2.43, 3.38, None]]
    verdict = judge(m, k=3)
    assert verdict.slow_nodes == [(1, "send")] and verdict.slow_links == []
    assert verdict.spread > 1.25 and verdict.threshold < 2.0


def test_two_nodes_have_no_rule() -> None:
    verdict = judge([[None, 10.0], [0.01, None]], k=3)
    assert verdict.threshold is None and verdict.slow_nodes == [] and verdict.slow_links == []
    assert verdict.median == pytest.approx(0.01**0.5 * 10**0.5)  # geometric
    assert below([[None, 10.0], [0.01, None]], verdict.median, 0.5) == [(1, 0)]


def test_fail_below_fraction_of_the_median() -> None:
    m = _matrix(3, slow={(0, 1): 4.0})
    assert below(m, 10.0, 0.5) == [(0, 1)]
    assert below(m, 10.0, 0.3) == []
    assert below(m, 10.0, None) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bytes", "big"], "--bytes 'big' is not a size"),
        (["--bytes", "0"], "--bytes 0 must be >= 1"),
        (["--iters", "0"], "--iters 0 >= 1"),
        (["--k", "0"], "--k 0.0 must be a positive number"),
        (["--fail-below", "1.5"], "--fail-below 1.5 must be a fraction of the median in (0, 1]"),
        (["--fail-below", "half"], "argument --fail-below: invalid float value"),
        (["--plot", "links.jpg"], "the picture is a PNG"),
    ],
)
def test_bad_flag_is_one_line(capsys, args: list[str], message: str) -> None:
    assert message in usage_error(capsys, "links", *args)


def test_one_node_is_a_usage_error(capsys) -> None:
    # A single process is one node: there is no link to measure.
    assert "links needs 2 or more nodes" in usage_error(capsys, "links")


@pytest.mark.parametrize("n", [3, 4, 6])
def test_a_node_at_half_speed_gets_the_same_verdict_every_time(n: int) -> None:
    """The container run that gave three verdicts (the node, one link, nothing): one node's sends at 0.44-0.58 of
    the median, every link +-8 % of noise; 300 draws must all name the node, and only it."""
    rng = random.Random(17)
    verdicts = set()
    for _ in range(300):
        m = _matrix(n)
        for i, j in itertools.permutations(range(n), 2):
            m[i][j] = 1.5 * rng.uniform(0.92, 1.08) * (rng.uniform(0.44, 0.58) if i == 0 else 1.0)
        v = judge(m, k=3)
        verdicts.add((tuple(v.slow_nodes), tuple(v.slow_links)))
    assert verdicts == {(((0, "send"),), ())}


@pytest.mark.parametrize("n", [3, 4, 6])
def test_noise_and_a_node_at_four_fifths_name_nothing(n: int) -> None:
    """The negative control of the half-speed rule: +-8 % noise and one node at 0.8 never name anything."""
    rng = random.Random(5)
    for _ in range(300):
        m = _matrix(n)
        for i, j in itertools.permutations(range(n), 2):
            m[i][j] = 1.5 * rng.uniform(0.92, 1.08) * (0.8 if i == 0 else 1.0)
        v = judge(m, k=3)
        assert v.slow_nodes == [] and v.slow_links == [], m


def test_with_three_nodes_one_named_node_leaves_too_few_links_to_name_another() -> None:
    """The CI run that named two senders: the head at a third of the others, and worker-2's link to the head
    at twice the rest. Once the head is named, the only link that touches neither it nor worker-1 is that
    fast one: one figure is no median, so worker-1 is judged against nothing and not named."""
    m = [[None, 0.661, 0.675], [1.942, None, 1.854], [3.815, 2.387, None]]
    verdict = judge(m, k=3)
    assert verdict.slow_nodes == [(0, "send")] and verdict.slow_links == []
