"""A compose job's state as the runner keeps it, folded from the job's events (``app.events``, in order): the
failures seen since it last ran (``Incident``), why it was stopped (``Stopped``), and ``Run``, which turns each
record into the line the user sees (``on_event``): one line per restart with its cause, a gate's verdict, an
eviction, a failure no restart cures; and at the end the command's error line (``failure_line``).

    run = Run(spec, env_file, log_file); run.on_event(record)     # app/orchestrate/runner.py, for every record

What a resume was (a restart, an eviction's, a node that joined) is ``app.job_state``'s one fold, which
``app cluster status`` and the node's metrics read too.
"""

import collections
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from app import contract, events, evict, job_state, logs, progress
from app.topology import compose
from app.topology.spec import ClusterSpec, Job

RESULTS_DIR = Path("build/results")
"""Where a job's results are copied by default (make's RESULTS asks for this, not restating it)."""
CONTAINER, KILLED, SILENT, ERROR, EXITED, CUT_SHORT, STOPPED = range(7)
"""Kinds of failure, the most telling first: a node's container stopped, a rank was killed by a signal,
ranks stopped answering (the others' report), another error of the app, a rank's exit status, a rank whose
collective was cut short by peers that their launcher stopped (its report), a rank stopped by its launcher."""


def hint(name: str, action: str, make: bool) -> str:
    """How a user runs ``action`` on the cluster ``name``: ``make cluster-down CLUSTER=x`` where make started it,
    else ``python -m app cluster down --name x`` (no name for the spec's default)."""
    named = name != Job().name
    if make:
        return f"make cluster-{action}" + (f" CLUSTER={name}" if named else "")
    return f"python -m app cluster {action}" + (f" --name {name}" if named else "")


def describe_status(code: int) -> str:
    """``exit 1``, or ``signal 9 (SIGKILL)`` for a negative status or a shell's 128 + N."""
    number = -code if code < 0 else code - 128 if code > 128 else 0
    if number:
        try:
            return f"signal {number} ({signal.Signals(number).name})"
        except ValueError:
            return f"signal {number}"
    return f"exit {code}"


@dataclass
class Incident:
    """The failures seen since the job last ran; its cause is the first one of the most telling kind: the earliest
    in time (a rank's own end, when it told it: ``events.RANK_ENDED``), else the first one read."""

    causes: list[tuple[int, float, str, int | None]] = field(default_factory=list)
    """(kind, when it happened, its line, the rank it names or None)."""

    def add(self, kind: int, text: str, at: float, rank: int | None = None) -> None:
        self.causes.append((kind, at, text, rank))

    def _first(self) -> tuple[int, float, str, int | None] | None:
        return min(self.causes, key=lambda c: c[:2]) if self.causes else None

    @property
    def cause(self) -> str:
        first = self._first()
        return first[2] if first else "a rank failed"

    @property
    def rank(self) -> int | None:
        """The rank the cause names (None: a container, or no rank's)."""
        first = self._first()
        return first[3] if first else None


BAD_INPUT = "bad input fails the same way on every attempt"
"""Why a job whose rank said its input is bad (exit status 2) is not restarted."""


@dataclass(frozen=True)
class Stopped:
    """A job stopped because no restart can cure its failure."""

    why: str
    status: int
    """The job's exit status: 2 for bad input, else 1."""
    line: str = ""
    """The command's whole line, when it is not ``not restarted: WHY``."""


@dataclass
class Run:
    """One compose project running one job."""

    spec: ClusterSpec
    folder: Path
    """Where the cluster's files were rendered (``compose.cluster_files``)."""
    log_file: Path
    verbose: bool = False
    monitor: compose.Monitor | None = None
    """The monitor profile's Prometheus, when the job is watched by one (``--monitor``)."""
    results: Path = RESULTS_DIR
    """Where the job's results volume is copied on the host (--results): a rank's line that names a file of it
    (its log under /results) names the copy."""
    make: bool = False
    """Started by make's cluster targets (--make): the hints name them (``hint``)."""
    restarts: int = 0
    """Worker containers started again."""
    resumed_as: collections.Counter = field(default_factory=collections.Counter)
    """The job's resumes by what each was (``job_state.resume_kind``: RESTART, EVICTION, REGROUP, CONTINUED)."""
    incident: Incident | None = None
    """The failure the job has not yet resumed from."""
    errors: list[str] = field(default_factory=list)
    """The ranks' one-line errors during the incident (printed at the end if the job does not resume)."""
    gave_up: Stopped | None = None
    """Why the job was stopped rather than restarted (None: it was not)."""
    raised: dict[int, str] = field(default_factory=dict)
    """Global rank -> ``rank R on NODE: ERROR``: the error it failed with in this incident (torchelastic's error
    file, as its agent read it)."""
    rank_ended: dict[int, float] = field(default_factory=dict)
    """Global rank -> when it last said its job ended with a failure (``events.RANK_ENDED``), not yet matched by
    its agent's record."""
    causes: dict[int | None, str] = field(default_factory=dict)
    """Global rank (None: a node's own command) -> the cause of its last one-line error."""
    gone: set[str] = field(default_factory=set)
    """Node containers that will not come back (no restarts left, or removed)."""
    ended: threading.Event = field(default_factory=threading.Event)
    """Set once the job is over (``end``)."""
    status: int = 1
    """The job's exit status, once ended."""
    ended_by: str = ""
    """The container whose end ended the job ('' when the runner ended it)."""
    notes: list[str] = field(default_factory=list)
    since: list[dict] = field(default_factory=list)
    """The job's records since it last ran: what the next resume was (``job_state.resume_kind``)."""
    stopped_ranks: set[int] = field(default_factory=set)
    """Ranks whose error said their peers were stopped by their launcher (``events.PEERS_STOPPED``)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def main_container(self) -> str:
        """The container whose output is streamed: mpirun's launcher, or the first torchrun node still in the job
        (c10d gives it rank 0: ``compose.rank_order``)."""
        if self.spec.job.launcher == "mpirun":
            return compose.container(self.spec, compose.LAUNCHER)
        order = compose.rank_order(self.spec)
        return next((name for name in order if name not in self.gone), order[0])

    @property
    def nodes(self) -> list[str]:
        """The services of the job's nodes (restarted when lost): torchrun's, or mpirun's workers."""
        return compose.node_services(self.spec)

    def end(self, status: int, by: str = "") -> None:
        """The job is over with ``status`` (the first end counts); the runner then stops every container."""
        with self.lock:
            if not self.ended.is_set():
                self.status, self.ended_by = status, by
                self.ended.set()

    def compose(self, *args: str, every_profile: bool = False) -> list[str]:
        """``docker compose`` for this project; the mpi profile's services when the job runs mpirun; every profile's
        (mpi, monitor) with ``every_profile``."""
        profile = ["--profile", "mpi"] if every_profile or self.spec.job.launcher == "mpirun" else []
        profile += ["--profile", compose.MONITOR] if every_profile else []
        return [
            "docker",
            "compose",
            *compose.compose_args(self.spec, self.folder),
            *profile,
            "--progress",
            "quiet",
            *args,
        ]

    def say(self, text: str, stream=None) -> None:
        """A line for the user (stdout unless ``stream`` is given), kept in ``notes``."""
        with self.lock:
            print(text, file=stream or sys.stdout, flush=True)
            self.notes.append(text)

    def log(self, text: str | None) -> None:
        """A line (or lines) for the command's log, without terminal escape codes or empty lines (``logs.plain``)."""
        text = logs.plain(text or "")
        if not text:
            return
        with self.lock, open(self.log_file, "a", encoding="utf-8") as handle:
            handle.write(text + "\n")

    # --- failures and restarts ------------------------------------------------------------------

    def failure(self, kind: int, text: str, at: float | None = None, rank: int | None = None) -> None:
        """A failure seen (at ``at``: now when not told): part of the incident that the next resume (or the end)
        reports."""
        with self.lock:
            self.incident = self.incident or Incident()
            self.incident.add(kind, text, time.time() if at is None else at, rank)
        self.log(f"cluster: failure: {text}")

    def on_event(self, record: dict) -> None:
        """One record of the job's events file (``app.events``): a failure, a resume, a gate's verdict, or why a
        node's agent restarts no more. The runner knows what happened from these facts alone."""
        kind = record.get("kind")
        node = self.container_of(str(record.get("node") or "?"))
        with self.lock:
            self.since.append(record)
        if kind == events.RANK_ENDED and record.get("rank") is not None:
            with self.lock:
                self.rank_ended[int(record["rank"])] = float(record["time"])
        elif kind == events.WORKER_FAILED:
            self.worker_failed(node, record)
        elif kind == events.ERROR:
            self.app_error(record)
        elif kind == events.GAVE_UP:
            self.agent_gave_up(node, record)
        elif kind == events.RESUMED:
            self.resumed(progress.Resumed(int(record["from_step"]), record.get("checkpoint"), record.get("reached")))
        elif kind == events.GATE:
            self.gated(node, record)
        elif kind == events.EVICTED:  # the ranks' verdict: the evicted node's agent takes it out of the job
            self.say(evict.Eviction.of(record).line(0))

    def worker_failed(self, node: str, record: dict) -> None:
        """A node's agent saw a rank's process end (torchelastic's ``ProcessFailure``)."""
        code, rank = int(record["exitcode"]), record.get("rank")
        where = f"local rank {record.get('local_rank')} on {node}"
        with self.lock:  # when the rank ended, as it told it; else when its agent saw it
            at = self.rank_ended.pop(int(rank), None) if rank is not None else None
            cut_short = rank in self.stopped_ranks  # its peers were stopped by their launcher
        # SIGTERM: its launcher stopped it (a restart, a new round); a rank cut short by such a stop exits with 1
        kind = STOPPED if code == -signal.SIGTERM else CUT_SHORT if cut_short else KILLED if code < 0 else EXITED
        text = f"rank {rank} ({where}) ended with {describe_status(code)}"
        self.failure(kind, text, at or float(record.get("time") or time.time()), rank)
        if record.get("message") and rank is not None:
            with self.lock:
                self.raised[int(rank)] = f"rank {rank} on {node}: {record['message']}"

    def hint(self, action: str) -> str:
        """The command that runs ``action`` on this cluster, as the user started this one (``hint``)."""
        return hint(self.spec.job.name, action, self.make)

    def on_host(self, line: str) -> str:
        """A rank's line with the log it names under the results volume named as the host's copy of it."""
        return line.replace(f"; log {contract.RESULTS_DIR}/", f"; log {self.results}/")

    def app_error(self, record: dict) -> None:
        """A rank's one-line error: held back while the job may resume; a hopeless one stops the job."""
        line, cause, reason = str(record.get("line", "")), str(record.get("cause", "")), record.get("reason")
        line = self.on_host(line)
        kinds = {events.PEERS_LOST: SILENT, events.PEERS_STOPPED: CUT_SHORT}
        if reason == events.PEERS_STOPPED and record.get("rank") is not None:
            with self.lock:
                self.stopped_ranks.add(int(record["rank"]))
        self.failure(kinds.get(reason, ERROR), cause)
        with self.lock:
            self.errors.append(line)
            self.causes[record.get("rank")] = cause
        if record.get("reason") == events.NO_SPACE:
            self.give_up(
                f"every attempt would run out of disk the same way; free space in the volume "
                f"{self.spec.job.name}_results, then run the job again: it resumes from its last checkpoint",
                1,
                line,
            )
        elif reason == events.BATCH_NOT_KEPT:  # the cause, not the node loss that brought the job to this world
            self.give_up(
                "the job's global batch cannot be kept on the ranks of this attempt (the line above), nor by a restart "
                "on them; run it again where it can (an --accum-steps that every world from --min-nodes to --nodes "
                "keeps), or start a new run (--out)",
                1,
                line,
            )
        elif record.get("status") == 2:
            self.give_up(BAD_INPUT, 2, line)

    def agent_gave_up(self, node: str, record: dict) -> None:
        """A node's agent restarts its ranks no more: bad input, or the same failure on two attempts in a row."""
        if record.get("reason") == events.BAD_INPUT:
            self.give_up(BAD_INPUT, 2)
            return
        rank, attempts = record.get("rank"), int(record.get("attempts", 2))
        cause = self.causes.get(rank) or str(record.get("message", ""))
        self.give_up(
            f"rank {rank} on {node} failed the same way on attempts {attempts - 1} and {attempts} ({cause}): a "
            "restart cannot cure it; fix the script, then run the job again",
            1,
        )

    def gated(self, node: str, record: dict) -> None:
        """A node's gate kept it out (not a restart: nothing is counted), or let it in after keeping it out."""
        verdict, detail = record.get("verdict"), record.get("detail", "")
        if verdict == events.PASSED_AFTER:
            waited = f"after {record.get('waited')} s kept out"
            self.say(f"cluster: node {node} passed its gate {waited}: {detail}; it joins at the next rendezvous round")
        elif verdict == events.KEPT_OUT:
            shape = self.spec.nodes
            going_on = f"; the job goes on with the other nodes (--min-nodes {shape.min_nodes})"
            going_on = going_on if shape.elastic else ""
            retry = f"; tried again every {float(record.get('retry_every', 0)):g} s"
            self.say(f"cluster: node {node} kept out: {detail}{retry}{going_on}")

    def resumed(self, resumed: progress.Resumed) -> None:
        """The job runs again: one line for the restart, with the failure's cause; none when it was no failure
        (``job_state.resume_kind``: an evicted node left, or a node joined, or nothing failed)."""
        with self.lock:
            incident, self.incident, self.errors = self.incident, None, []
            since, self.since = self.since, []
            self.raised.clear()
            self.rank_ended.clear()
            self.stopped_ranks.clear()
        said = resumed.line().removeprefix("train: ")
        kind = job_state.resume_kind(since)
        self.resumed_as[kind] += 1
        if kind == job_state.EVICTION:  # the ranks lost were an evicted node's
            gone = dict.fromkeys(self.container_of(str(r.get("evicted"))) for r in since if r["kind"] == events.EVICTED)
            self.say(f"cluster: the job goes on without {', '.join(gone)}: {said}")
        elif kind == job_state.RESTART:
            cause = incident.cause if incident else "a rank failed"
            self.say(f"cluster: restart {self.resumed_as[job_state.RESTART]}: {cause}; {said}")
        else:  # an earlier job's checkpoint; or a node joined: the agents stopped their ranks for the new round
            self.say(f"cluster: {said}")

    def give_up(self, why: str, status: int, line: str = "") -> None:
        """Stop a job that failed in a way no restart can cure (its agents would restart it).

        The rank's line is printed now; why the job was not restarted is the command's own line at the end.
        """
        with self.lock:
            if self.gave_up:
                return
            self.gave_up = Stopped(why, status)
        for said in [line] if line else dict.fromkeys(self.errors):
            self.say(said, sys.stderr)
        self.end(status)

    def store_lost(self, name: str, code: int) -> None:
        """The rendezvous store's container stopped while the job ran: no node could join a new round; the job
        stops (the nodes have their checkpoints)."""
        with self.lock:
            self.gave_up = self.gave_up or Stopped(
                "the rendezvous store was lost",
                code or 1,
                f"the rendezvous store ({name}) was lost: it stopped with {describe_status(code)}; run the job "
                "again to resume from its last checkpoint",
            )
        self.end(self.gave_up.status, name)

    def unresolved(self) -> None:
        """At the end: the failure the job did not resume from, as the ranks said it (or its cause)."""
        if self.incident is None or self.gave_up:
            return
        for line in dict.fromkeys(self.errors):
            self.say((line), sys.stderr)
        if not self.errors:
            self.say(f"cluster: the job did not resume: {self.incident.cause}", sys.stderr)

    # --- names --------------------------------------------------------------------------------

    def node_ranks(self, container: str) -> list[int]:
        """The global ranks of a torchrun node (``compose.rank_order`` says which node holds which)."""
        return compose.node_ranks(self.spec, container)

    def container_of(self, node: str) -> str:
        """The container of a service's node (``worker-1`` -> ``ddp-cluster-worker-1``)."""
        return node if node.startswith(f"{self.spec.job.name}-") else f"{self.spec.job.name}-{node}"


def failure_line(run: Run, status: int) -> str:
    """The job's failure in one line: not restarted, ran out of time, a container lost, or the root cause."""
    spec = run.spec
    if run.gave_up:
        return run.gave_up.line or f"not restarted: {run.gave_up.why}; the job was stopped"
    if status == 124:
        return (
            f"the job ran past its time limit (--time-limit {spec.job.time_limit}s) and was stopped; "
            f"see {run.hint('logs')}, then {run.hint('down')}"
        )
    ended_by = run.ended_by or run.main_container
    if status >= 128:
        return (
            f"{ended_by} ended with {describe_status(status)}: the job cannot go on without it; the other nodes were "
            "stopped; run the job again to resume from its last checkpoint"
        )
    if run.raised and not run.errors:  # a rank's exception (a script's), which no line of the app's told: the
        first = run.incident.rank if run.incident else None  # cause's, not a peer's that lost it after
        if first in run.raised:
            return run.raised[first]
        if first is None:
            return run.raised[min(run.raised)]
    which = f"{ended_by} (rank 0's node)" if ended_by == run.main_container else ended_by
    return f"the job failed: {which} ended with {describe_status(status)}; see above"
