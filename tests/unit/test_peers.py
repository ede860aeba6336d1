"""app/diagnostics/peers.py: a node at its gate asks the running nodes, through a real TCPStore (as c10d's
rendezvous store), how they measure now; the job's figures are lowered to the best they answer."""

import threading
import time

import pytest

from app.diagnostics import gate, peers
from app.diagnostics.gate_config import GateConfig
from app.diagnostics.health import DeviceHealth


def cpu(flops: float, copy: float = 3.0) -> DeviceHealth:
    return DeviceHealth("cpu", "float32", 256, flops, 1 << 20, copy, 1.0)


@pytest.fixture(autouse=True)
def answering(monkeypatch):
    """Every answering thread a test starts ends with the test."""
    stop = threading.Event()
    started = peers.answer
    monkeypatch.setattr(peers, "answer", lambda *args: started(*args, stop=stop))
    yield
    stop.set()


LONG_S = 120.0
"""A bound for what a test waits on (an answer), never its verdict: on a loaded machine a thread's first look at the
store may come late; an answer comes or the test fails after this long."""


def answered(port: int, host: str = "worker-2") -> list[dict]:
    """Ask until a running node answers (an ask made before its first look at the store is not its own to answer)."""
    deadline = time.monotonic() + LONG_S
    while time.monotonic() < deadline:
        if found := peers.ask(("127.0.0.1", port), host, 5.0, wait_s=3 * peers.POLL_S, expected=1):
            return found
    raise AssertionError(f"no running node answered within {LONG_S:g} s")


@pytest.fixture
def store():
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_an_answer_is_what_the_node_measures_now_in_its_records_units_and_the_best_one_lowers_the_bar() -> None:
    assert peers.now([cpu(20e9, 1.5)], [cpu(80e9, 3.0)], [cpu(80e9, 3.0)]) == {"cpu": {"flops": 20e9, "copy_gbps": 1.5}}
    assert peers.now([cpu(20e9, 1.5)], [cpu(80e9, 3.0)], None) == {"cpu": {"flops": 20e9, "copy_gbps": 1.5}}
    rewritten = peers.now([cpu(20e9, 1.5)], [cpu(80e9, 3.0)], [cpu(1e30, 1e30)])  # a test set the job's figures
    assert rewritten == {"cpu": {"flops": pytest.approx(0.25e30), "copy_gbps": pytest.approx(0.5e30)}}
    assert peers.now([cpu(20e9)], [DeviceHealth("cuda:0", "bfloat16", 8, 1e12, 1, 1.0, 1.0)], None) == {}
    answers = [{"host": "a", "figures": {"cpu": {"flops": 20e9, "copy_gbps": 1.5}}},
               {"host": "b", "figures": {"cpu": {"flops": 32e9, "copy_gbps": 5.0}}}]  # fmt: skip
    [against], lowest = peers.scaled([cpu(80e9, 3.0)], answers)
    assert (against.flops, against.copy_gbps, lowest) == (32e9, 3.0, 0.4)  # b's 32; the copy not above the job's
    assert peers.scaled([cpu(80e9)], []) == ([cpu(80e9)], 1.0)  # nobody answered: as recorded


def test_a_running_node_answers_another_nodes_ask_and_never_its_own(store) -> None:
    calls = []

    def measure_now() -> list[DeviceHealth]:
        calls.append(time.monotonic())
        return [cpu(30e9, 1.5)]

    peers.answer(("127.0.0.1", store.port), "head", [cpu(60e9, 3.0)], measure_now, lambda: None, 5.0)
    assert answered(store.port) == [{"host": "head", "figures": {"cpu": {"flops": 30e9, "copy_gbps": 1.5}}}]
    assert calls  # it measured to answer
    own = "head@1"  # an ask of its own node's gate (its host), then another node's
    store.set(peers._ask_key(store.add(peers.ASKS, 1)), own)
    assert answered(store.port, "worker-1")[0]["host"] == "head"  # asks are taken in order: the own one is behind
    assert store.add(peers._count_key(own), 0) == 0  # ... and was not answered


def test_with_nobody_answering_or_no_store_the_ask_is_empty_within_its_wait(store) -> None:
    assert peers.ask(("127.0.0.1", store.port), "worker-2", 5.0, wait_s=0.5, expected=2) == []
    with __import__("socket").socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert peers.ask(("127.0.0.1", port), "worker-2", 1.0, wait_s=0.5) == []


def test_a_node_short_of_the_recorded_figures_passes_against_its_loaded_peers_and_a_tenth_of_them_does_not(
    store, tmp_path, monkeypatch
) -> None:
    """The job's figures were recorded on a quiet machine (80); the machine is loaded now: the running head measures
    26.4. A node that comes back at 25 (healthy under the same load) passes against 26.4; one at 4 (a tenth of a
    core) is kept out, its line naming its peers' figures. Each verdict's event keeps the answers."""
    peers.answer(("127.0.0.1", store.port), "head", [cpu(80e9, 3.0)], lambda: [cpu(26.4e9, 3.0)], lambda: None, 5.0)
    answered(store.port)  # it looks at the store: each ask from now on is answered
    cfg = GateConfig(records=tmp_path / "gate", device_seconds=LONG_S)  # an ask waits on its answer this long at most
    mine = gate.launcher.this_node()
    monkeypatch.setattr(gate, "checks", lambda *_: (None, ""))  # the doctor's checks: another test's
    start = [cpu(80e9, 3.0)]
    where = ("127.0.0.1", store.port, False)
    monkeypatch.setattr(gate, "measure", lambda *_: [cpu(25e9, 3.0)])
    healthy = gate.judge(cfg, mine, where, start, expected=1)
    assert healthy.why is None and healthy.paced == "x 0.33: the best of its 1 running peer(s) now", healthy
    assert gate.judged_figures(healthy, start).startswith(
        "cpu 25.0 GFLOP/s, 3.0 GB/s copy against the job's cpu 26.4 GFLOP/s, 3.0 GB/s copy (x 0.33: the best of its"
    )
    told = {"host": "head", "figures": {"cpu": {"flops": 26.4e9, "copy_gbps": 3.0}}}
    assert gate.asked(healthy) == {"paces": [told]}
    monkeypatch.setattr(gate, "measure", lambda *_: [cpu(4e9, 3.0)])
    held = gate.judge(cfg, mine, where, start, expected=1)
    assert held.why == (
        "device check 4.0 GFLOP/s against the job's 26.4 (fail below 0.5); the job's figures x 0.33: the best of its 1 "
        "running peer(s) now"
    )
    monkeypatch.setattr(gate, "measure", lambda *_: [cpu(50e9, 3.0)])
    alone = gate.judge(cfg, mine, where, start, expected=1)  # half the recorded figures or more: nobody is asked
    assert alone.why is None and alone.paces == () and alone.against is None


def test_a_running_node_answers_again_once_its_store_is_back() -> None:
    """The store went away (a restarting rendezvous container): the answering thread reaches it again and answers."""
    from torch.distributed import TCPStore

    first = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = first.port
    peers.answer(("127.0.0.1", port), "head", [cpu(60e9)], lambda: [cpu(30e9)], lambda: None, 1.0)
    assert [a["host"] for a in answered(port)] == ["head"]
    del first  # its next look fails; it tries again RECONNECT_S later
    again = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    assert [a["host"] for a in answered(again.port)] == ["head"]
