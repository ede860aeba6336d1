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
    time.sleep(peers.POLL_S * 1.5)  # it has looked once: the asks from now on are its to answer
    answers = peers.ask(("127.0.0.1", store.port), "worker-2", 5.0, wait_s=10.0, expected=1)
    assert answers == [{"host": "head", "figures": {"cpu": {"flops": 30e9, "copy_gbps": 1.5}}}]
    assert len(calls) == 1
    assert peers.ask(("127.0.0.1", store.port), "head", 5.0, wait_s=2 * peers.POLL_S) == []  # its own ask: no answer
    assert len(calls) == 1


def test_with_nobody_answering_or_no_store_the_ask_is_empty_within_its_wait(store) -> None:
    start = time.monotonic()
    assert peers.ask(("127.0.0.1", store.port), "worker-2", 5.0, wait_s=0.5, expected=2) == []
    assert time.monotonic() - start < 5
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
    time.sleep(peers.POLL_S * 1.5)
    cfg = GateConfig(records=tmp_path / "gate", device_seconds=0.2)
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
    answered = {"host": "head", "figures": {"cpu": {"flops": 26.4e9, "copy_gbps": 3.0}}}
    assert gate.asked(healthy) == {"paces": [answered]}
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
    time.sleep(peers.POLL_S * 1.5)
    del first  # its next look fails; it tries again RECONNECT_S later
    time.sleep(peers.POLL_S * 1.5)
    again = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    time.sleep(peers.RECONNECT_S + peers.POLL_S * 1.5)  # reached again: its first look there is its baseline
    answers = peers.ask(("127.0.0.1", again.port), "worker-2", 5.0, wait_s=10.0, expected=1)
    assert [a["host"] for a in answers] == ["head"]
