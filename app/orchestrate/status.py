"""``python -m app cluster status``: a compose job at a glance, from the facts the runner reads.

    python -m app cluster status              # make cluster-status: one table
    python -m app cluster status --json       # the same facts as JSON, for scripts
    python -m app cluster status --name NAME  # another cluster (make cluster-status CLUSTER=NAME)

The facts are the job's events (``app.events``: build/cluster/<name>/events, where the runner marks a job's start
and end, rank 0 writes each exchange of step times, checkpoint and resize, the agents the ranks that failed, the
gates their verdicts) and the engine's state of the project's containers. Nothing is asked of the job itself: a
status never slows or stops it, and answers while the job is stuck.

Each node's state: ``training`` (its ranks were in the last exchange, and no rank of the job failed since),
``kept out`` (its gate keeps it out), ``restarting`` (a rank of it failed, or its container was lost, since the
last exchange and its gate's last word), ``down`` (its container does not run), ``joining`` (it runs and its ranks
are not in an exchange since the job's last failure or regroup: they wait for the next rendezvous round, or at its
gate) and ``idle`` (no job runs). A failure anywhere stops every rank (a collective needs them all), so after one
no node reads ``training`` until the next exchange (nor while a node of the last exchange is down): the status
shows recovery as soon as a rank's failure or the runner's restart of a container is an event, or a container's
loss is the engine's state.
"""

import json
import time
from dataclasses import asdict, dataclass, field

from app import events, job_state

TRAINING, KEPT_OUT, RESTARTING, DOWN, JOINING, IDLE = "training", "kept out", "restarting", "down", "joining", "idle"
EVICTED = "evicted"
"""Taken out of the running job as a straggler (``events.EVICTED``), not yet back in an exchange."""


@dataclass
class Node:
    name: str
    container: str
    """The engine's state of its container: running, restarting, exited, ... (missing: none)."""
    state: str = IDLE
    ranks: list[int] = field(default_factory=list)
    """Its ranks in the last exchange."""


@dataclass
class Status:
    cluster: str
    running: bool
    """A job runs: the runner marked its start and not its end."""
    started: float | None = None
    """When the job started (seconds since the epoch)."""
    ended_status: int | None = None
    """The last job's exit status, once it ended."""
    nodes: list[Node] = field(default_factory=list)
    step: int | None = None
    samples_per_s: float | None = None
    world_size: int | None = None
    global_batch: int | None = None
    accum_steps: int | None = None
    slowest: dict | None = None
    """``host``, ``rank``, ``factor`` (its busy time per step over the median) at the last exchange."""
    checkpoint: dict | None = None
    """The last checkpoint: ``step``, ``path``, ``age_s``."""
    recovering: bool = False
    """A rank failed (or the ranks regrouped) since the last exchange: no node trains until the next one."""
    restarts: int = 0
    """Times the job ran again after a failure (``job_state.resume_kind``: as the runner's lines count them)."""
    regroups: int = 0
    """Times the job ran again after a node joined (not a failure)."""
    resizes: int = 0
    evictions: int = 0
    """Times a straggler left the running job (taken out by the runner, or by its own agent: app node)."""


def fold(cluster: str, records: list[dict], containers: dict[str, str], now: float) -> Status:
    """The status of ``cluster`` from its events (``job_state.fold``) and its node containers' states (name ->
    engine state)."""
    job = job_state.fold(records)
    status = Status(cluster, running=job.started is not None and not job.ended, started=job.started)
    status.ended_status = job.ended_status
    status.restarts, status.regroups, status.resizes = job.restarts, job.regroups, job.resizes
    status.evictions = job.evictions
    if c := job.checkpoint:
        status.checkpoint = {"step": c["step"], "path": c["path"], "age_s": round(now - c["time"], 1)}
    last_exchange = job.exchange
    hosts = (last_exchange or {}).get("hosts") or []
    if last_exchange:
        status.step = last_exchange.get("step")
        status.samples_per_s = last_exchange.get("samples_per_s")
        status.world_size = last_exchange.get("world_size")
        status.global_batch = last_exchange.get("global_batch")
        status.accum_steps = last_exchange.get("accum_steps")
        median = last_exchange.get("median_busy_ms") or 0
        factor = last_exchange.get("slowest_busy_ms", 0) / median if median else None
        status.slowest = {"host": last_exchange.get("slowest_host"), "rank": last_exchange.get("slowest_rank"),
                          "factor": round(factor, 2) if factor else None}  # fmt: skip
    exchanged_at = last_exchange["time"] if last_exchange else 0.0
    lost = any(containers.get(host, "running") != "running" for host in hosts)  # a node of the last exchange is gone
    status.recovering = status.running and (job.recovering or lost)
    for name, container in containers.items():
        node = Node(name, container, ranks=[r for r, h in enumerate(hosts) if h == name])
        gate = job.gates.get(name, {})
        if not status.running:
            node.state = IDLE
        elif job.evicted_at.get(name, 0.0) > exchanged_at or (name in job.evicted_at and not node.ranks):
            node.state = EVICTED
        elif container == "restarting" or job.failed_at.get(name, 0.0) > max(exchanged_at, gate.get("time", 0.0)):
            node.state = RESTARTING
        elif container != "running":
            node.state = DOWN
        elif gate.get("verdict") == events.KEPT_OUT:
            node.state = KEPT_OUT
        elif node.ranks and not status.recovering:
            node.state = TRAINING
        else:
            node.state = JOINING
        status.nodes.append(node)
    return status


def to_json(status: Status) -> str:
    return json.dumps(asdict(status), indent=2)


def format_table(status: Status, now: float) -> str:
    """One table: the job's line, a row per node, then the slowest node, the last checkpoint, restarts, resizes."""
    if status.running:
        job = f"a job runs (started {now - status.started:.0f} s ago)"
    elif status.started is None:
        job = "no job has run here yet"
    elif status.ended_status is None:
        job = "no job runs (the runner of the last one was stopped before it ended)"
    else:
        job = f"no job runs (the last one ended with exit status {status.ended_status})"
    lines = [f"cluster {status.cluster}: {job}"]
    if status.step is not None:
        lines.append(
            f"step {status.step}, {status.samples_per_s:,.0f} samples/s, {status.world_size} ranks, global batch "
            f"{status.global_batch} (accum {status.accum_steps})"
        )
    width = max([len("node"), *(len(n.name) for n in status.nodes)])
    lines += ["", f"{'node':<{width}}  {'container':<10}  {'state':<10}  ranks"]
    for n in status.nodes:
        ranks = ", ".join(map(str, n.ranks)) or "-"
        lines.append(f"{n.name:<{width}}  {n.container:<10}  {n.state:<10}  {ranks}")
    lines.append("")
    if status.slowest and status.slowest["factor"]:
        s = status.slowest
        lines.append(f"slowest: {s['host']} (rank {s['rank']}), busy {s['factor']:.2f}x the median per step")
    c = status.checkpoint
    lines.append(f"last checkpoint: step {c['step']}, {c['age_s']:.0f} s ago ({c['path']})" if c else "no checkpoint")
    counts = {"restarts": status.restarts, "regroups": status.regroups, "resizes": status.resizes,
              "evictions": status.evictions}  # fmt: skip
    lines.append(", ".join(f"{name} {count}" for name, count in counts.items()))
    return "\n".join(lines)


def show(cluster: str, records: list[dict], containers: dict[str, str], as_json: bool) -> str:
    """What ``cluster status`` prints."""
    now = time.time()
    found = fold(cluster, records, containers, now)
    return to_json(found) if as_json else format_table(found, now)
