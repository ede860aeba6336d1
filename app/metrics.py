"""A job's facts as Prometheus metrics: what ``app cluster status`` shows, as series that a Prometheus scrapes.

    python -m app node --metrics-port 9473 -- TORCHRUN_ARGS -m app train ...   # http://<node>:9473/metrics
    curl -s http://ddp-cluster-head-1:9473/metrics | grep '^ddp_'

Every node's agent serves metrics (prometheus-client's HTTP server, on the node's cluster address only), read from
the job's events file at each scrape: the same facts the runner and ``app cluster status`` read, so a scrape asks
nothing of the ranks and costs them no step time. Each series has one source: the node that held rank 0 at the
last exchange of step times serves the ranks', the job's and ``ddp_node_training`` (before the first exchange
every node serves the job's); each node serves its own gate and device series. So a node's own events file is
enough (Ansible, Slurm, Kubernetes) and a Prometheus that scrapes every node counts nothing twice. Names and units
follow Prometheus's conventions (base units, ``_seconds``, ``_total``); every series is labelled ``job`` (the
cluster's job name) and ``node`` (the host name, as ``docker ps`` and the runner name it), a rank's also
``rank`` (its ``node`` is the node that holds it); a scrape keeps them with ``honor_labels: true``:

  per rank (at the last exchange of step times)
    ddp_rank_busy_seconds               busy time per step (computing and loading, not waiting for the others)
    ddp_rank_wait_seconds               time per step waiting for the others (the gradients' all-reduce)
    ddp_rank_busy_ratio                 that over the median rank's (the slowest rank's is the straggler factor)
  per node
    ddp_node_training                   1 while the node's ranks are in the job's last exchange, and no rank
                                        failed since (0 for every node from a rank's failure to the next exchange)
    ddp_node_device_matmul_flops        its devices' matrix-product rate at its gate (FLOP/s; label ``device``)
    ddp_node_device_copy_bytes_per_second   its devices' copy rate at its gate (label ``device``)
    ddp_node_gate_kept_out              1 while its gate keeps it out
  per job
    ddp_job_step, ddp_job_samples_per_second, ddp_job_world_size, ddp_job_global_batch_size,
    ddp_job_accumulation_steps, ddp_job_restarts_total, ddp_job_regroups_total, ddp_job_resizes_total,
    ddp_job_evictions_total,
    ddp_job_steps_lost_total, ddp_job_last_checkpoint_step, ddp_job_last_checkpoint_timestamp_seconds
"""

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from app import events, job_state
from app.errors import UsageError

PREFIX = "ddp_"


def families(job: str, node: str, records: list[dict]) -> list[Any]:
    """The metric families that ``node`` serves in ``job`` from the job's event records (prometheus-client's
    objects). Each series has one source, so that a Prometheus that scrapes every node counts nothing twice and
    a node's own events file is enough on engines without a shared one: the node that held rank 0 at the last
    exchange of step times (it wrote that record) serves the job's, the ranks' and every node's training series;
    each node serves its own gate and device series; before the first exchange every node serves the job's."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    state = job_state.fold(records)
    mine = job_state.this_job(records)[0]
    exchange = state.exchange
    hosts = (exchange or {}).get("hosts") or []
    speaks_for_job = exchange is None or hosts[:1] == [node]
    found = []

    def gauge(name: str, doc: str, labels: list[str], rows: list[tuple[list[str], float]]) -> None:
        family = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
        for values, value in rows:
            family.add_metric(values, value)
        found.append(family)

    gates = [r for r in mine if r.get("kind") == events.GATE]
    own_gates = [r for r in gates if r.get("node") == node]
    kept_out = bool(own_gates) and own_gates[-1].get("verdict") == events.KEPT_OUT
    job_labels, at_job = ["job", "node"], [job, node]
    gauge("node_gate_kept_out", "1 while the node's gate keeps it out.", job_labels, [(at_job, float(kept_out))])
    measured = next((g.get("figures") for g in reversed(own_gates) if g.get("figures")), None) or []
    device_labels = ["job", "node", "device"]
    gauge("node_device_matmul_flops", "Matrix-product rate of each device at the node's gate (FLOP/s).",
          device_labels, [([job, node, d["device"]], d["flops"]) for d in measured])  # fmt: skip
    gauge("node_device_copy_bytes_per_second", "Copy rate of each device at the node's gate.",
          device_labels, [([job, node, d["device"]], d["copy_gbps"] * 1e9) for d in measured])  # fmt: skip
    if not speaks_for_job:
        return found
    if exchange:
        _rank_families(job, exchange, gauge)
    known = sorted({*hosts, *(g.get("node") for g in gates if g.get("node"))} or {node})
    training = not state.ended and not state.recovering  # a rank failed since the last exchange: none trains
    gauge("node_training", "1 while the node's ranks are in the job's last exchange of step times.", job_labels,
          [([job, name], float(training and name in hosts)) for name in known])  # fmt: skip
    ex = exchange or {}
    for name, doc, value in (
        ("job_step", "Optimizer step at the last exchange of step times.", ex.get("step")),
        ("job_samples_per_second", "Training samples per second at the last exchange.", ex.get("samples_per_s")),
        ("job_world_size", "Ranks in the job.", ex.get("world_size")),
        ("job_global_batch_size", "Samples per optimizer step over all ranks.", ex.get("global_batch")),
        ("job_accumulation_steps", "Micro-batches per optimizer step.", ex.get("accum_steps")),
        ("job_last_checkpoint_step", "Step of the last checkpoint.", (state.checkpoint or {}).get("step")),
    ):
        if value is not None:
            gauge(name, doc, job_labels, [(at_job, float(value))])
    if state.checkpoint:
        gauge("job_last_checkpoint_timestamp_seconds", "When the last checkpoint was taken (seconds since the epoch).",
              job_labels, [(at_job, state.checkpoint["time"])])  # fmt: skip
    for name, doc, value in (
        ("job_restarts", "Times the job ran again after a failure.", state.restarts),
        ("job_regroups", "Times the job ran again after a node joined (no failure).", state.regroups),
        ("job_resizes", "Times the job resumed on another number of ranks.", state.resizes),
        ("job_evictions", "Times a slow node was taken out of the running job.", state.evictions),
        (
            "job_steps_lost",
            "Steps trained again after failures (reached, less the step resumed from).",
            state.steps_lost,
        ),
    ):
        family = CounterMetricFamily(PREFIX + name, doc, labels=job_labels)
        family.add_metric(at_job, float(value))
        found.append(family)
    return found


def _rank_families(job: str, exchange: dict, gauge: Callable) -> None:
    """Every rank's series at the last exchange of step times, each labelled with the node that holds it."""
    hosts, busy = exchange.get("hosts") or [], exchange.get("busy_ms") or []
    wait = exchange.get("wait_ms") or [0.0] * len(busy)
    median = exchange.get("median_busy_ms") or 0.0
    ranks = [([job, host, str(r)], b, w) for r, (host, b, w) in enumerate(zip(hosts, busy, wait, strict=False))]
    labels = ["job", "node", "rank"]
    gauge("rank_busy_seconds", "Busy time per step at the last exchange (not waiting).", labels,
          [(at, b / 1000) for at, b, _ in ranks])  # fmt: skip
    gauge("rank_wait_seconds", "Time per step waiting for the other ranks at the last exchange.", labels,
          [(at, w / 1000) for at, _, w in ranks])  # fmt: skip
    gauge("rank_busy_ratio", "Busy time per step over the median rank's.", labels,
          [(at, b / median if median else 0.0) for at, b, _ in ranks])  # fmt: skip


class EventsCollector:
    """prometheus-client's custom collector: the families of ``node`` from ``events_file``, whose new records are
    read at each scrape (the file only grows; scrapes come on threads of their own)."""

    def __init__(self, job: str, node: str, events_file: Path) -> None:
        self.job, self.node, self.events_file = job, node, events_file
        self._records: list[dict] = []
        self._offset = 0
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Any]:
        with self._lock:
            new, self._offset = events.read(self.events_file, self._offset)
            self._records += new
            records = list(self._records)
        yield from families(self.job, self.node, records)


def serve(port: int, address: str, job: str, node: str, events_file: Path) -> str:
    """Serve the node's metrics on ``address:port`` in a thread of this process; the line that says where."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise UsageError(
            "--metrics-port needs prometheus-client, which the image has: pip install prometheus-client, or give "
            "--metrics-port 0"
        ) from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EventsCollector(job, node, events_file))
    try:
        start_http_server(port, addr=address, registry=registry)
    except OSError as error:
        return (
            f"metrics: not served: port {port} on {address} ({error.strerror or error}); the job goes on without them"
        )
    return f"metrics: http://{node}:{port}/metrics"
