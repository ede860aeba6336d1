"""A job's state, folded from its events (app/events.py): the one fold that the cluster runner's lines,
``app cluster status`` and every node's metrics read.

    state = job_state.fold(records)                 # app cluster status (with the containers), app/metrics.py
    job_state.resume_kind(since)                    # the runner, at each resume: restart N, or not

Each RESUMED record (rank 0 training again) is counted one way, by the records since the job last ran:
``EVICTION`` when a node was evicted since (the job goes on without it); else ``REGROUP`` when an agent stopped
its ranks for a node that waits to join (REGROUP) and every failure since is a rank so stopped (SIGTERM) or one
whose peers were (``events.PEERS_STOPPED``); else ``RESTART`` when a rank or a node failed (WORKER_FAILED, ERROR,
NODE_LOST); else ``CONTINUED`` (a job that resumes an earlier job's checkpoint, nothing failed). Stdlib only: the
runner runs on the host, the metrics in every node.
"""

import signal
from dataclasses import dataclass, field

from app import events

RESTART, EVICTION, REGROUP, CONTINUED = "restart", "eviction", "regroup", "continued"
"""What a resume was (``resume_kind``)."""
FAILURES = (events.WORKER_FAILED, events.ERROR, events.NODE_LOST)
"""Records of a failure: a rank's process ended (its agent's word), a rank's one-line error, a node's container
lost (the runner's word)."""
STOPS_THE_RANKS = (events.WORKER_FAILED, events.RANK_ENDED, events.ERROR, events.NODE_LOST, events.REGROUP)
"""Records after which no rank trains until the next exchange: a rank's process ended (its agent's word, or the
rank's own), a rank's one-line error, a node's container lost (the runner's word), an agent stopping its ranks for
a new member."""


def this_job(records: list[dict]) -> tuple[list[dict], dict | None, dict | None]:
    """The records since the last job's start, that start, and its end (None: it runs, or none ended). Without a
    start (a node run without the cluster runner: ``app node``, an Ansible or Kubernetes node) every record is the
    job's."""
    starts = [i for i, r in enumerate(records) if r.get("kind") == events.JOB_STARTED]
    mine = records[starts[-1] :] if starts else records
    if not starts:
        return mine, None, None
    ended = next((r for r in mine if r.get("kind") == events.JOB_ENDED), None)
    return mine, mine[0], ended


def stopped_by_launcher(record: dict, cut_short: set) -> bool:
    """A failure record of a rank that its launcher stopped (SIGTERM), or whose collective was cut short by peers
    so stopped (``cut_short``: the ranks whose error said so)."""
    if record.get("kind") == events.ERROR:
        return record.get("reason") == events.PEERS_STOPPED
    if record.get("kind") == events.WORKER_FAILED:
        return record.get("exitcode") == -signal.SIGTERM or record.get("rank") in cut_short
    return False


def resume_kind(since: list[dict]) -> str:
    """What the RESUMED record that follows ``since`` (the job's records since it last ran) was: RESTART, EVICTION,
    REGROUP or CONTINUED (the module's docstring says when)."""
    kinds = {r.get("kind") for r in since}
    if events.EVICTED in kinds:
        return EVICTION
    failures = [r for r in since if r.get("kind") in FAILURES]
    cut_short = {
        r.get("rank") for r in since if r.get("kind") == events.ERROR and r.get("reason") == events.PEERS_STOPPED
    }
    if events.REGROUP in kinds and all(stopped_by_launcher(r, cut_short) for r in failures):
        return REGROUP
    return RESTART if failures else CONTINUED


@dataclass
class JobState:
    """What a job's events say of it (``fold``)."""

    started: float | None = None
    """When the cluster runner started it (None: no runner's start, or none)."""
    ended_status: int | None = None
    ended: bool = False
    exchange: dict | None = None
    """Rank 0's last exchange of step times (``events.EXCHANGE``)."""
    checkpoint: dict | None = None
    """The last checkpoint: ``step``, ``path``, ``time``."""
    restarts: int = 0
    regroups: int = 0
    evictions: int = 0
    """Times a straggler left the running job (taken out by the runner, or by its own agent: app node)."""
    resizes: int = 0
    steps_lost: int = 0
    """Steps trained again after failures: at each resume, the step reached less the step resumed from."""
    stopped_at: float = 0.0
    """When the ranks last stopped (``STOPS_THE_RANKS``)."""
    failed_at: dict[str, float] = field(default_factory=dict)
    """Node -> when a rank of it failed, or its container was lost, last."""
    gates: dict[str, dict] = field(default_factory=dict)
    """Node -> its gate's last record."""
    evicted_at: dict[str, float] = field(default_factory=dict)

    @property
    def recovering(self) -> bool:
        """A rank failed (or the ranks regrouped) since the last exchange: no node trains until the next one."""
        return self.stopped_at > (self.exchange["time"] if self.exchange else 0.0)


def fold(records: list[dict]) -> JobState:
    """The state of the last job of ``records`` (the events file, in order)."""
    mine, started, ended = this_job(records)
    state = JobState(started=started["time"] if started else None, ended=ended is not None)
    state.ended_status = ended.get("status") if ended else None
    since: list[dict] = []
    for record in mine:
        kind = record.get("kind")
        since.append(record)
        if kind == events.EXCHANGE:
            state.exchange = record
        elif kind == events.CHECKPOINT:
            state.checkpoint = {"step": record.get("step"), "path": record.get("path"), "time": record["time"]}
        elif kind == events.RESIZE:
            state.resizes += 1
        elif kind == events.RESUMED:
            was = resume_kind(since)
            state.restarts += was == RESTART
            state.regroups += was == REGROUP
            state.steps_lost += max((record.get("reached") or 0) - (record.get("from_step") or 0), 0)
            since = []
        elif kind == events.GATE:
            state.gates[record.get("node")] = record
        elif kind == events.EVICTED:
            state.evictions += 1
            state.evicted_at[record.get("evicted")] = record["time"]
        if kind in STOPS_THE_RANKS:
            state.stopped_at = record["time"]
            if kind != events.REGROUP:
                state.failed_at[record.get("lost") or record.get("node")] = record["time"]
    return state
