"""app/metrics.py: a node's Prometheus metrics, folded from the job's events and served over HTTP."""

import socket
import urllib.request

from app import events, metrics
from tests.deps import need
from tests.unit.test_status import FOUR, HEAD, T0, WORKER, _exchange, _record

parser = need("prometheus_client.parser")


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    """(name, sorted labels) -> value of every sample of an exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }


def _exposition(node: str, records: list[dict]) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)

    class Fixed:
        def collect(self):
            return metrics.families("c", node, records)

    registry.register(Fixed())
    return generate_latest(registry).decode()


RECORDS = [
    _record(events.JOB_STARTED, T0, node="host"),
    _record(
        events.GATE,
        T0 + 1,
        node=WORKER,
        verdict=events.RECORDED,
        detail="",
        figures=[{"device": "cpu", "flops": 80e9, "copy_gbps": 4.0}],
    ),
    _exchange(T0 + 5, 20, FOUR, [10.0, 10.0, 11.0, 30.0]),
    _record(events.CHECKPOINT, T0 + 6, rank=0, step=20, path="/results/x/step-20.pt"),
    _record(events.WORKER_FAILED, T0 + 6.5, node=WORKER, rank=3, local_rank=1, exitcode=-9, message="", attempt=0),
    _record(events.RESUMED, T0 + 7, rank=0, from_step=20, checkpoint="/results/x/step-20.pt", reached=23),
    _exchange(T0 + 9, 40, FOUR, [10.0, 10.0, 11.0, 33.0]),
]


def test_rank_0s_node_serves_every_rank_the_nodes_training_and_the_job_in_base_units() -> None:
    found = _samples(_exposition(HEAD, RECORDS))
    head, worker = (("job", "c"), ("node", HEAD)), (("job", "c"), ("node", WORKER))
    assert found["ddp_rank_busy_seconds", (*worker, ("rank", "3"))] == 0.033  # each rank under the node it is on
    assert found["ddp_rank_busy_ratio", (*worker, ("rank", "3"))] == 3.0
    assert found["ddp_rank_wait_seconds", (*worker, ("rank", "2"))] == 0.022  # it waits for rank 3
    assert found["ddp_rank_wait_seconds", (*worker, ("rank", "3"))] == 0.0
    assert found["ddp_rank_busy_seconds", (*head, ("rank", "0"))] == 0.010
    assert {labels[-1] for name, labels in found if name == "ddp_rank_busy_seconds"} == {
        ("rank", str(r)) for r in range(4)
    }
    assert found["ddp_node_training", head] == 1.0 and found["ddp_node_training", worker] == 1.0
    assert found["ddp_node_gate_kept_out", head] == 0.0
    assert found["ddp_job_step", head] == 40 and found["ddp_job_world_size", head] == 4
    assert found["ddp_job_samples_per_second", head] == 20000.0
    assert found["ddp_job_global_batch_size", head] == 256 and found["ddp_job_accumulation_steps", head] == 1
    assert found["ddp_job_restarts_total", head] == 1 and found["ddp_job_steps_lost_total", head] == 3
    assert found["ddp_job_resizes_total", head] == 0 and found["ddp_job_evictions_total", head] == 0
    assert found["ddp_job_last_checkpoint_step", head] == 20
    assert found["ddp_job_last_checkpoint_timestamp_seconds", head] == T0 + 6


def test_another_node_serves_its_own_gate_and_devices_and_nothing_twice() -> None:
    found = _samples(_exposition(WORKER, RECORDS))
    node = (("job", "c"), ("node", WORKER))
    assert found["ddp_node_device_matmul_flops", (("device", "cpu"), *node)] == 80e9
    assert found["ddp_node_device_copy_bytes_per_second", (("device", "cpu"), *node)] == 4e9
    assert found["ddp_node_gate_kept_out", node] == 0.0
    assert {name for name, _ in found} == {  # the job's and the ranks' come from rank 0's node alone
        "ddp_node_gate_kept_out",
        "ddp_node_device_matmul_flops",
        "ddp_node_device_copy_bytes_per_second",
    }


def test_before_the_first_exchange_every_node_serves_the_job() -> None:
    found = _samples(_exposition(WORKER, RECORDS[:2]))
    node = (("job", "c"), ("node", WORKER))
    assert found["ddp_job_restarts_total", node] == 0 and found["ddp_node_training", node] == 0.0
    assert not [name for name, _ in found if name.startswith("ddp_rank_")]


def test_an_eviction_is_counted() -> None:
    evicted = [*RECORDS, _record(events.EVICTED, T0 + 11, node="host", evicted=WORKER, factor=4.1, window_s=60)]
    found = _samples(_exposition(HEAD, evicted))
    assert found["ddp_job_evictions_total", (("job", "c"), ("node", HEAD))] == 1


def test_a_kept_out_node_says_so_and_trains_no_more() -> None:
    kept = [*RECORDS, _record(events.GATE, T0 + 11, node=HEAD, verdict=events.KEPT_OUT, detail="slow")]
    kept.append(_exchange(T0 + 12, 60, [WORKER, WORKER], [10.0, 10.0]))
    found = _samples(_exposition(HEAD, kept))
    assert found["ddp_node_gate_kept_out", (("job", "c"), ("node", HEAD))] == 1.0
    assert not [name for name, _ in found if name.startswith(("ddp_rank_", "ddp_job_"))]  # rank 0 is elsewhere now
    by_worker = _samples(_exposition(WORKER, kept))  # which says so
    assert by_worker["ddp_node_training", (("job", "c"), ("node", HEAD))] == 0.0
    assert by_worker["ddp_node_training", (("job", "c"), ("node", WORKER))] == 1.0
    assert {labels[1] for name, labels in by_worker if name == "ddp_rank_busy_seconds"} == {("node", WORKER)}


def test_from_a_ranks_failure_to_the_next_exchange_no_node_trains() -> None:
    """Issue 36 item 3: the worker killed, the head's ranks fail (peers lost): the dead worker is not training,
    nor is the head, until the next exchange."""
    failed = [*RECORDS, _record(events.ERROR, T0 + 11, rank=0, line="", cause="", status=1, reason=events.PEERS_LOST)]
    training = [("ddp_node_training", (("job", "c"), ("node", node))) for node in (HEAD, WORKER)]
    found = _samples(_exposition(HEAD, failed))
    assert [found[key] for key in training] == [0.0, 0.0]
    back = _samples(_exposition(HEAD, [*failed, _exchange(T0 + 14, 50, FOUR, [10.0] * 4)]))
    assert [back[key] for key in training] == [1.0, 1.0]


def test_served_over_http_and_a_port_in_use_is_one_line(tmp_path) -> None:
    file = tmp_path / "events.jsonl"
    for record in RECORDS:
        fields = {k: v for k, v in record.items() if k not in ("time", "node", "rank", "kind")}
        events.write(record["kind"], record["rank"], events_file=file, **fields)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    line = metrics.serve(port, "127.0.0.1", "c", HEAD, file)
    assert line == f"metrics: http://{HEAD}:{port}/metrics"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    assert _samples(text)["ddp_job_step", (("job", "c"), ("node", HEAD))] == 40
    again = metrics.serve(port, "127.0.0.1", "c", HEAD, file)
    assert again.startswith(f"metrics: not served: port {port} on 127.0.0.1 (") and "the job goes on" in again
