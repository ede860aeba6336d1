"""A job's events: what happened to it, as facts, one JSON object a line in the job's events file.

    write(WORKER_FAILED, rank=3, local_rank=1, exitcode=-9, message="", attempt=0)   # a node's agent
    records, offset = read(path, offset)                                               # the cluster runner

Every record has ``time`` (seconds since the epoch), ``node`` (the writer's host name), ``rank`` (its global
rank; None for a node's agent) and ``kind``, then the fields of its kind (below). Node agents, ranks and the
gate append to the file that the launcher names (``launcher.events_file``: DDP_CLUSTER_EVENTS_FILE; the compose
cluster mounts build/cluster/<name>/events at /events); without one nothing is written. Each record is one
``write`` of one line to a file opened with O_APPEND, so the writers of several containers never interleave.

The cluster runner reads these facts, not the words of torch's log lines or of the app's own messages: a torch
release that rewords its output changes nothing here. Stdlib only (the runner runs on the host).
"""

import contextlib
import json
import os
import socket
import time
from pathlib import Path

WORKER_FAILED = "worker_failed"
"""A node's agent saw a rank's process end: ``local_rank``, ``exitcode`` (negative: the signal), ``message``
(the rank's error as torchelastic's error file holds it; "" when it wrote none), ``attempt`` (0: the first)."""
RANK_ENDED = "rank_ended"
"""A rank's job ended with a failure, as the rank saw it before its process exited: ``exitcode``. Its ``time`` orders
the ranks' ends, which their agents, each seeing its own ranks at its own next look, cannot: the rank that failed
first is the cause, its peers' failures (their connection lost) came after it."""
GAVE_UP = "gave_up"
"""A node's agent restarts its ranks no more: ``reason`` (BAD_INPUT or REPEATED), ``message`` (the failure),
``attempts`` (the attempts made)."""
ERROR = "error"
"""A rank's (or a node command's) one-line error: ``line`` (as printed), ``cause`` (its message alone),
``status`` (the exit status), ``reason`` (PEERS_LOST, PEERS_STOPPED, NO_SPACE, BATCH_NOT_KEPT or "")."""
RESUMED = "resumed"
"""Rank 0 resumed training: ``from_step``, ``checkpoint`` (None: from the start), ``reached`` (the failed
attempt's last step; None: unknown)."""
GATE = "gate"
"""A node's health gate: ``verdict`` (RECORDED, KEPT_OUT, PASSED_AFTER or PASSED), ``detail`` (its figures, as its
line says them) and ``figures`` (per device: ``device``, ``flops`` in FLOP/s, ``copy_gbps``); ``paces``, where its
running peers were asked how they measure now (app/diagnostics/peers.py): each one's ``host`` and ``figures``."""
EXCHANGE = "ranks"
"""Rank 0 at each exchange of step times (every --exchange-every steps), as metrics.jsonl's ``ranks`` record:
``step``, ``step_ms``, ``hosts``, ``busy_ms`` and ``stall_ms`` (per rank: app/train/stalls.py), ``slowest_rank``,
``slowest_host``, ``over_median_percent``, ..., and ``world_size``, ``global_batch``, ``accum_steps``,
``samples_per_s``."""
CHECKPOINT = "checkpoint"
"""Rank 0 saved a checkpoint, as metrics.jsonl's record: ``step``, ``epoch``, ``batch``, ``path``."""
RESIZE = "resize"
"""The run resumed on another number of ranks, as metrics.jsonl's record: ``from``, ``to``, ``step``,
``global_batch``, ..."""
EVICTED = "evicted"
"""A straggler left the running job, said by rank 0 at the exchange of step times whose verdict it was (every rank
reaches it alike: app/evict.py, the policy its node agent got from ``--evict-factor``): ``evicted`` (its node),
``step``, and the verdict whole (``evict.Eviction.fields``): ``factor`` (its ranks' time per step over the others'
share of its work without it, the median of its window), ``exchanges`` (at the factor or more, of the ``window``
exchanges it was judged over), ``window_s`` (from the window's first exchange to its last), ``share``, ``least`` (the
policy's factor), ``nodes_left``, ``ranks_left``, ``global_batch``, ``accum_left``, and ``slower`` (the job's step
over its best, where its waits for a CPU decided; else 0)."""
TRAINING_FACTS = (EXCHANGE, CHECKPOINT, RESIZE)
"""Records of rank 0's metrics.jsonl that are also the job's events (``app cluster status`` reads them)."""

BAD_INPUT, REPEATED = "bad_input", "repeated"
"""Why an agent gave up: a rank said its input is bad (exit status 2); a rank failed the same way twice."""
PEERS_LOST, PEERS_STOPPED, NO_SPACE = "peers_lost", "peers_stopped", "no_space"
"""Reasons of an error: other ranks stopped answering; every other rank answered, and the ones missing were stopped
by their own launcher (SIGTERM: a restart, or a new rendezvous round); a disk (or quota) is full."""
BATCH_NOT_KEPT = "batch_not_kept"
"""Reason of an error: the ranks of this attempt cannot keep the checkpoint's global batch (app/train/resize.py)."""
REGROUP = "regroup"
"""A node's agent stops its ranks because a node waits to join the job (torch's agent starts a new rendezvous round
and the world grows): not a failure. Its ranks, and the others', may report the collective this cut short."""
JOB_STARTED = "job_started"
"""The cluster runner started a job (``python -m app cluster up``): ``job`` (its name), ``launcher``, ``nodes``,
``nproc_per_node``. The records after it are that job's."""
NODE_LOST = "node_lost"
"""The cluster runner saw a node's container stop (killed, or died of a signal) and starts it again: ``lost`` (the
container), ``exitcode``. Its ranks are gone, and the others' collectives fail: no node trains until the next
exchange (``app cluster status``)."""
JOB_ENDED = "job_ended"
"""The cluster runner's job ended: ``status`` (its exit status; None when the runner itself was stopped)."""
RECORDED, KEPT_OUT, PASSED_AFTER, PASSED = "recorded", "kept_out", "passed_after", "passed"
"""A gate's verdicts: its figures recorded at the job's start; kept out; let in after being kept out; let in at
once."""
GATE_LINES_SAID_AGAIN = ("gate: kept out: ", "gate: still kept out, now by: ", "gate: passed after ")
"""The starts of a gate's own lines for the verdicts that the cluster runner says again naming the node (KEPT_OUT,
PASSED_AFTER): the runner leaves them out of the head's output that it prints, so that each verdict is one line."""


def write(kind: str, rank: int | None = None, events_file: str | os.PathLike | None = None, **fields: object) -> None:
    """Append one record of ``kind`` to ``events_file`` (default: the launcher's; none: nothing). A record that
    cannot be written (a full disk) is lost, never the writer's failure."""
    path = events_file
    if path is None:
        from app.runtime import launcher  # (the runner, without torch, reads the file it names itself)

        path = launcher.events_file()
    if path is None:
        return
    record = {"time": round(time.time(), 3), "node": socket.gethostname(), "rank": rank, "kind": kind, **fields}
    line = (json.dumps(record, default=str) + "\n").encode()
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def read(path: Path, offset: int = 0) -> tuple[list[dict], int]:
    """The records of ``path`` from byte ``offset`` on, and the offset after the last whole line (a line being
    written is read next time). A line that is not a record is skipped."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    whole = data[: data.rfind(b"\n") + 1]
    records = []
    for raw in whole.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(raw)
            if isinstance(record, dict) and "kind" in record:
                records.append(record)
    return records, offset + len(whole)


def size(path: Path) -> int:
    """The file's length now (0: none yet): a reader that starts here reads only what comes after."""
    try:
        return Path(path).stat().st_size
    except FileNotFoundError:
        return 0
