"""``python -m app cluster``: run one job on the compose mini-cluster and keep it alive until it ends.

    python -m app cluster up                                   # make cluster-up: the spec's default job
    python -m app cluster up --nodes 3 --nproc-per-node 1 --command check
    python -m app cluster up --max-restarts 0 --command 'train --epochs 3 --out /results/x'
    python -m app cluster up --launcher mpirun --command check   # make cluster-mpi
    python -m app cluster status [--json]                      # make cluster-status: the job at a glance
    python -m app cluster logs                                 # make cluster-logs
    python -m app cluster down                                 # make cluster-down

Runs on the host, with the stdlib and the Docker SDK for Python (``app.orchestrate.engine``: no torch; make's
cluster targets run it with build/tools-venv's python). The spec flags are ``python -m app
topology``'s; they are checked once, then every file the cluster needs is rendered once into
build/cluster/<name>/ (``compose.cluster_files``: compose's env file, nodes.yaml with each node's
command, the launch files the nodes read); the containers only exec what was rendered.
``up`` streams rank 0's node (the first torchrun node still in the job; the launcher under mpirun)
and exits with the job's status, whatever happens to the nodes: a node container that is lost (killed,
or stopped by hand) is started again (Docker's restart policy brings back one that crashed) up to
--max-restarts times, the head like any other, and torchrun's agents restart every worker in a new
rendezvous round, the job resuming from its last checkpoint. The rendezvous is a store container of
its own (``compose.RENDEZVOUS``), so no node's loss ends the job; the job ends when a node's torchrun
agent ends by itself (0: the job finished; else torchrun gave up) or mpirun's launcher ends.
What happened to the job is read from its events file (``app.events``: build/cluster/<name>/events, mounted in
every container), where each node's torch agent writes every rank that failed (its exit status or signal, and
its error from torchelastic's error file) and why it gave up, the ranks their one-line errors and resumes, the
gate its verdicts; the nodes' output is never read for a fault, so a torch release that rewords its lines
changes nothing here. The terminal shows the streamed node's standard output only; its standard error
(tracebacks, torch's C++ warnings with their ``frame #`` backtraces, torchrun's report) and every node's output
go to the command's one log (logs/cluster.log, or --log-dir; ``--verbose`` prints the streamed node's standard
error too): the status line and the error line name the same file. A node container that runs under a CPU or
memory limit (``docker update``: the containers are reused from job to job) is one line. Every process and
stream ``up`` starts (the engine's events and logs, compose logs) ends with it. ``down`` says what it removed.

What the user sees of a failure (docs/faults.md):
- one line per restart, once the job runs again: which node or rank failed and why (signal or
  exit status, or the ranks that stopped answering), the step it resumed from and the steps lost:
  ``cluster: restart 1: ddp-cluster-worker-1 (ranks 2-3) stopped with signal 9 (SIGKILL); resumed
  from step 30 (checkpoint ...), 2 steps lost (the failed attempt reached step 32)``;
- a failure that a restart cannot cure (bad input: exit status 2; a full disk; a rank that failed the same way
  on two attempts in a row, which its agent restarts no more) is not restarted: the rank's one line at once,
  and the command's own line ``error: not restarted: ...`` says why;
- the rendezvous store lost ends the job: the nodes are stopped (within STOP_GRACE_S) and the
  command's line names the store;
- a failure the job did not recover from: the ranks' own one-line errors, then the command's.
Results are copied to --results.
"""

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app import contract, events, evict, flags, job_state, logs, progress
from app.atomic import atomic_write_text
from app.errors import ClusterError, UsageError
from app.flags import flag
from app.orchestrate import collect, engine
from app.orchestrate import status as job_status
from app.topology import command as topology
from app.topology import compose
from app.topology.spec import ClusterSpec, Job

STOP_GRACE_S = compose.STOP_GRACE_S
RESULTS_DIR = Path("build/results")
"""Where a job's results are copied by default (make's RESULTS asks for this, not restating it)."""
EVENTS_EVERY_S = 0.5
"""How often the runner reads the job's events file for new records."""
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
    evicting: dict[str, float] = field(default_factory=dict)
    """Node containers stopped by an eviction -> seconds each waits before it is started again (its gate)."""
    since: list[dict] = field(default_factory=list)
    """The job's records since it last ran: what the next resume was (``job_state.resume_kind``)."""
    stopped_ranks: set[int] = field(default_factory=set)
    """Ranks whose error said their peers were stopped by their launcher (``events.PEERS_STOPPED``)."""
    returned: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Node -> when it was last started again after an eviction, and the wait it had then (``evict.backoff``)."""
    watch: evict.Watch | None = None
    """The straggler policy of the spec (``--evict-factor``), fed every exchange of step times."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        n = self.spec.nodes
        if self.spec.job.launcher != "mpirun" and n.elastic and n.evict_factor:
            self.watch = evict.Watch(n.evict_factor, n.evict_after, n.min_nodes)

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
        elif kind == events.EXCHANGE and self.watch is not None:
            self.paced(record)

    def paced(self, record: dict) -> None:
        """An exchange of step times: a straggler past the spec's policy leaves the job (``evict``)."""
        found = self.watch.feed(record)
        if isinstance(found, str):
            self.say(found)
        elif found is not None and not self.ended.is_set():
            name = self.container_of(found.node)
            returned_at, last_wait = self.returned.get(name, (None, 0.0))
            wait = evict.backoff(time.time(), returned_at, last_wait)
            with self.lock:
                if name in self.evicting:
                    return
                self.evicting[name] = wait
            self.say(found.line(wait))
            fields = {"factor": round(found.factor, 2), "exchanges": found.exchanges, "window_s": found.window_s}
            events.write(events.EVICTED, events_file=compose.events_file(self.folder), evicted=name, **fields,
                         backoff_s=wait)  # fmt: skip
            threading.Thread(target=engine.stop, args=(name, compose.STOP_GRACE_S), daemon=True).start()

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


def _ends_with(stop: threading.Event, proc: subprocess.Popen) -> subprocess.Popen:
    """``proc``, ended once ``stop`` is set: a thread blocked reading its output must not outlive the job."""

    def end() -> None:
        stop.wait()
        _end(proc)

    threading.Thread(target=end, daemon=True).start()
    return proc


def _end(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and what it started (its own session): ``docker compose`` runs compose as a child plugin process,
    which kept the pipe open for up to a minute after the CLI itself was killed."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _log_line(run: Run, service: str, rest: str) -> str:
    """One line of ``compose logs --timestamps`` (``service | time line``) into the log, its node named as docker ps
    names it (``logs.node_line``); returns its time stamp."""
    stamp, _, line = rest.partition(" ")
    if service:
        run.log(logs.node_line(run.container_of(service), line))
    return stamp


def _lines(stop: threading.Event, args: list[str], follow: bool) -> Iterator[str]:
    """The output lines of ``compose logs`` (``args``); one that follows is ended once ``stop`` is set, so that no
    reader outlives the job."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    proc = _ends_with(stop, proc) if follow else proc
    try:
        assert proc.stdout is not None
        yield from proc.stdout
    finally:
        _end(proc)


def _follow(run: Run, stop: threading.Event, since: float) -> None:
    """Every node's output, stdout and stderr (tracebacks, torch's C++ lines and their ``frame #`` backtraces,
    torchrun's banners), into the log; nothing of it to the terminal (``_stream``).

    ``compose logs --follow`` ends when the containers it follows stop; it is started again (from the last
    line seen) as long as the job runs, so a restarted node is followed too; once the job is over, one last
    pass reads every line of this run that was missed. ``--since`` includes its own time, and a container
    that compose starts again keeps its earlier runs' output: the lines read again are skipped.
    """
    services = [*([compose.LAUNCHER] if run.spec.job.launcher == "mpirun" else []), *run.nodes]
    after = f"{since:.3f}"  # this run's lines only
    seen: set[tuple[str, str]] = set()  # the lines taken: node, time and line (compose pads the node's name)
    while True:
        follow = not stop.is_set()
        args = run.compose("logs", *(["--follow"] if follow else []), "--no-color", "--timestamps", "--since",
                           after if follow else f"{since:.3f}", *services)  # fmt: skip
        for raw in _lines(stop, args, follow):
            service, _, rest = raw.rstrip("\n").partition(" | ")
            if (service.strip(), rest) not in seen:
                seen.add((service.strip(), rest))
                after = _log_line(run, service.strip(), rest) or after
        if not follow:
            return
        stop.wait(1)


def _stream(run: Run, stop: threading.Event, since: float) -> None:
    """Print the standard output of the streamed node (``Run.main_container``): the app's own lines. Its standard
    error (tracebacks, torch's C++ warnings and their backtraces, torchrun's report) stays in the log; with
    ``--verbose`` it is printed too. The engine keeps the two apart; its stream ends when the container stops, and
    is started again (on the streamed node then: the head lost, the next node) as long as the job runs; once the
    job is over, one last pass prints what was missed."""
    seen: set[tuple[str, str]] = set()
    while True:
        follow = not stop.is_set()
        container = run.main_container
        for raw in engine.lines(container, since, stop, follow, stderr=run.verbose):
            if (container, raw) not in seen:
                seen.add((container, raw))
                line = raw.partition(" ")[2]  # after the engine's time stamp
                if line.startswith(events.GATE_LINES_SAID_AGAIN):
                    continue  # its gate's verdict: the runner's own line says it, naming the node (Run.gated)
                with run.lock:  # print() writes the line and its newline apart: the runner's own lines wait
                    print(line, flush=True)
        if not follow:
            return
        stop.wait(1)


def _read_events(run: Run, stop: threading.Event, offset: int) -> None:
    """The job's events file (``app.events``) from ``offset`` (its length when the job started): each new record
    logged and taken (``Run.on_event``); once the job is over, one last read."""
    path = compose.events_file(run.folder)
    while True:
        last = stop.is_set()
        records, offset = events.read(path, offset)
        for record in records:
            run.log(f"event: {json.dumps(record)}")
            run.on_event(record)
        if last:
            return
        stop.wait(EVENTS_EVERY_S)


def _watch_nodes(run: Run, stop: threading.Event, since: float) -> None:
    """Docker's events of this run's containers: a node container lost (docker sent it a signal, or it died of
    one) is started again, up to --max-restarts times; a node whose torchrun agent ended by itself ends the job
    (0: every agent finished; else torchrun gave up), as mpirun's launcher does; so does the rendezvous store
    lost. ``--since``: the events from the run's start, none missed while this reader started."""
    torchrun = run.spec.job.launcher != "mpirun"
    signalled: set[str] = set()  # containers that docker sent a signal (kill, stop, rm --force) since they last died
    for event in engine.container_events(run.spec.job.name, since, stop, ("kill", "die")):
        if stop.is_set() or run.ended.is_set():
            break
        attributes = event["Actor"]["Attributes"]
        service, name = attributes.get("com.docker.compose.service"), attributes.get("name", "?")
        if event.get("Action", event.get("status")) == "kill":
            signalled.add(name)
            continue
        code = int(attributes.get("exitCode", "0"))
        by_docker = name in signalled
        lost = by_docker or code >= 128
        signalled.discard(name)
        if service == compose.RENDEZVOUS:
            run.store_lost(name, code)
        elif service == compose.LAUNCHER or (torchrun and service in run.nodes and not lost):
            run.end(code, name)
        elif name in run.evicting:
            threading.Thread(target=_readmit, args=(run, name, stop), daemon=True).start()
        elif service in run.nodes and (lost or code != 0):
            _restart_node(run, name, code, stop, by_docker)


def _readmit(run: Run, name: str, stop: threading.Event) -> None:
    """Start an evicted node again once its wait is over: its gate judges it, keeps it out while it is slow and lets
    it join the next rendezvous round once it passes (the world grows back)."""
    with run.lock:
        wait = run.evicting.get(name, 0.0)
    if stop.wait(wait) or run.ended.is_set():
        return
    with run.lock:
        run.evicting.pop(name, None)
        run.returned[name] = (time.time(), wait)
    run.log(f"cluster: starting {name} again after its eviction (waited {wait:g} s)")
    if not engine.start(name) and not engine.running(name):
        run.gone.add(name)
        run.say(f"cluster: {name} is gone (it cannot be started again after its eviction)")


def _restart_node(run: Run, name: str, code: int, stop: threading.Event, by_docker: bool) -> None:
    """Start a lost node container again: at once when docker stopped it (kill, stop: its restart policy leaves a
    container stopped by hand alone); one that crashed, after Docker's restart policy had its chance."""
    if stop.is_set() or run.ended.is_set():
        return  # the job is over: the runner stops the other nodes
    limit = run.spec.rendezvous.max_restarts
    ranks = run.node_ranks(name)
    which = f"{name} (ranks {ranks[0]}-{ranks[-1]})" if len(ranks) > 1 else name
    shape = run.spec.nodes
    going_on = f"the job goes on with the other nodes (--min-nodes {shape.min_nodes})" if shape.elastic else ""
    if run.restarts >= limit:
        run.gone.add(name)
        left = f"no restarts left (--max-restarts {limit})"
        run.say(f"cluster: {which} stopped with {describe_status(code)}; {left}{'; ' + going_on if going_on else ''}")
        return
    run.restarts += 1
    events.write(events.NODE_LOST, events_file=compose.events_file(run.folder), lost=name, exitcode=code)
    run.failure(CONTAINER, f"{which} stopped with {describe_status(code)}")
    run.log(f"cluster: starting {name} again (container restart {run.restarts} of {limit})")
    if not by_docker:
        time.sleep(POLICY_S)  # Docker's restart policy brings back a crashed container by itself
    if not stop.is_set() and not engine.running(name) and not engine.start(name) and not engine.running(name):
        run.gone.add(name)
        if going_on:
            run.say(f"cluster: {which} is gone (it cannot be started again); {going_on}")


POLICY_S = 2.0
"""Seconds Docker's restart policy has to bring back a crashed node container before the runner starts it."""

STATE_DIR = Path("build/cluster")
"""Where each job's rendered files, events and log go by default: STATE_DIR/NAME."""


@dataclass(frozen=True)
class ClusterFlags:
    """What to do with the compose cluster, and where its files go."""

    action: str = field(metadata=flag(positional=True, choices=("up", "status", "logs", "down")))
    """Run a job, show the job at a glance, show every node's output, remove."""
    json: bool = False
    """status: print JSON (for scripts) rather than the table."""
    results: Path = field(default=RESULTS_DIR, metadata=flag(metavar="DIR"))
    """Results go here."""
    state_dir: Path = field(default=STATE_DIR, metadata=flag(metavar="DIR"))
    """Rendered files, logs."""
    image_name: str | None = field(default=None, metadata=flag(metavar="NAME"))
    """Without --image: the image is NAME:cpu, or NAME:cuda with --gpus-per-node > 0 (default: IMAGE_NAME of
    docker/versions.env)."""
    build: str | None = field(default=None, metadata=flag(metavar="COMMAND"))
    """up: once the spec is checked, build the image with COMMAND plus ``--flavour cpu|cuda`` (the spec's) before
    the nodes start (make cluster-up gives the image builder)."""
    monitor: bool = False
    """up: also start Prometheus (compose profile monitor, make cluster-up MONITOR=1), scraping every node's metrics;
    its UI on the host's loopback at --monitor-port; it stays up after the job, until cluster down."""
    monitor_image: str | None = field(default=None, metadata=flag(metavar="IMAGE"))
    """The Prometheus image of --monitor (default: MONITOR_IMAGE of docker/versions.env; make monitor-image)."""
    monitor_port: int = field(default=contract.MONITOR_PORT, metadata=flag(metavar="PORT"))
    """--monitor: Prometheus's UI at http://127.0.0.1:PORT."""
    make: bool = False
    """The lines' hints name make's targets (make cluster-down CLUSTER=x), as make's cluster targets ask; else this
    command's own (python -m app cluster down --name x)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app cluster``: the action, where results go, then the spec's flags."""
    flags.add_arguments(parser, ClusterFlags)
    topology.add_spec_arguments(parser)


def _prepare(args: argparse.Namespace) -> Run:
    """The spec, checked once, and every file the cluster needs, rendered once into STATE_DIR/NAME/."""
    spec = topology.spec_from_args(args)
    engine.sdk()  # missing: one line before anything is written
    if getattr(args, "image", None) is None and args.image_name:  # (spec flags are absent unless given)
        image = f"{args.image_name}:{contract.flavour(spec.nodes.gpus_per_node)}"
        spec = dataclasses.replace(spec, job=dataclasses.replace(spec.job, image=image))
    folder = (args.state_dir / spec.job.name).resolve()
    monitor = compose.Monitor(**({"image": args.monitor_image} if args.monitor_image else {}), port=args.monitor_port)
    for name, text in compose.cluster_files(spec, folder, monitor).items():
        atomic_write_text(folder / name, text)
    log_file = getattr(args, "log_file", None) or args.state_dir / f"{spec.job.name}.log"  # the command's log
    events_file = compose.events_file(folder)  # every container's agent and ranks append to it, as their user
    events_file.parent.mkdir(parents=True, exist_ok=True)
    events_file.touch()
    events_file.parent.chmod(0o777)
    events_file.chmod(0o666)
    monitor = monitor if args.monitor else None
    return Run(spec, folder, Path(log_file).resolve(), args.verbose, monitor, args.results, args.make)


def _down(run: Run) -> int:
    """Remove the project's containers, network and volumes; one line says what was removed."""
    there = engine.project_objects(run.spec.job.name)
    done = subprocess.run(
        run.compose("down", "--volumes", "--remove-orphans", "--timeout", str(STOP_GRACE_S), every_profile=True),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    left = engine.project_objects(run.spec.job.name)
    if done.returncode != 0 or left:
        detail = (done.stderr.strip().splitlines() or [""])[-1]
        names = " ".join(name for _, name in left)
        raise ClusterError(f"cluster-down left {names or 'an error'} behind for {run.spec.job.name}: {detail}")
    run.say(f"cluster: {run.spec.job.name}: {removed(there)}")
    return 0


def removed(objects: list[tuple[str, str]]) -> str:
    """``removed 3 containers (a, b, c), 1 network (n), 2 volumes (v, w)``, or that there was nothing to remove."""
    parts = []
    for kind in ("container", "network", "volume"):
        names = sorted(name for k, name in objects if k == kind)
        if names:
            parts.append(f"{len(names)} {kind}{'s' if len(names) > 1 else ''} ({', '.join(names)})")
    return f"removed {', '.join(parts)}" if parts else "nothing to remove (no container, network or volume)"


def _limits(run: Run) -> None:
    """One line for each node container that runs under a CPU or memory limit: the containers are reused from job
    to job, so a ``docker update --cpus`` of an earlier one would silently slow this job."""
    torchrun = run.spec.job.launcher != "mpirun"
    for name in compose.rank_order(run.spec) if torchrun else [run.container_of(s) for s in run.nodes]:
        host = (engine.inspect(name) or {}).get("HostConfig") or {}
        numbers = (host.get(key) or 0 for key in ("NanoCpus", "CpuQuota", "CpuPeriod", "Memory"))
        if limit := describe_limits(*numbers):
            run.say(f"cluster: {name} runs under a limit: {limit}; it slows the job (it was set on "
                    f"the container, which jobs reuse): {run.hint('down')} removes it")  # fmt: skip


def describe_limits(nano_cpus: int, cpu_quota: int, cpu_period: int, memory: int) -> str:
    """``0.5 CPUs, 512 MiB of memory`` for a container's HostConfig limits ("" for none)."""
    cpus = nano_cpus / 1e9 if nano_cpus else cpu_quota / (cpu_period or 100_000) if cpu_quota > 0 else 0
    parts = [f"{cpus:g} CPUs"] if cpus else []
    if memory > 0:
        parts.append(f"{memory / 2**20:g} MiB of memory")
    return ", ".join(parts)


def _up(run: Run) -> int:
    spec = run.spec
    if not engine.has_image(spec.job.image):
        raise UsageError(f"image {spec.job.image} is missing: build it with `make images`")
    if run.monitor and not engine.has_image(run.monitor.image):
        raise UsageError(f"image {run.monitor.image} is missing: build it with `make monitor-image` (MONITOR=1 does)")
    shape = f"{spec.nodes.nodes} node(s) x {spec.nodes.nproc_per_node}"
    run.say(f"cluster: {spec.job.name}: {spec.job.launcher}, {shape}: {compose.job_line(spec)}")
    run.log_file.parent.mkdir(parents=True, exist_ok=True)
    run.log(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} cluster up {spec.job.name}")  # a log holds every run's lines
    stop = threading.Event()
    start, since, offset = time.monotonic(), time.time(), events.size(compose.events_file(run.folder))
    # Detached: compose starts the store and the nodes (once the store is healthy) and returns; the
    # job's end is a node's agent ending by itself (mpirun's launcher ending), whatever is lost meanwhile.
    services = [compose.LAUNCHER] if spec.job.launcher == "mpirun" else []  # mpirun: the launcher and its workers
    started = subprocess.run(run.compose("up", "--detach", *services), capture_output=True, text=True,
                             timeout=spec.rendezvous.join_timeout + 300, check=False)  # fmt: skip
    run.log(f"compose up: exit {started.returncode}: {started.stdout}{started.stderr}")
    if engine.inspect(run.main_container) is None:
        detail = (started.stderr.strip().splitlines() or ["no output"])[-1]
        raise ClusterError(f"the cluster did not start: {detail}: see {run.log_file}")
    _limits(run)
    shape = {"launcher": spec.job.launcher, "nodes": spec.nodes.nodes, "nproc_per_node": spec.nodes.nproc_per_node}
    events.write(events.JOB_STARTED, events_file=compose.events_file(run.folder), job=spec.job.name, **shape)
    if run.monitor:  # (after the start's record: no scrape of it shows the last job's figures)
        _start_monitor(run)
    threads = [
        threading.Thread(target=_watch_nodes, args=(run, stop, since), daemon=True),
        threading.Thread(target=_read_events, args=(run, stop, offset), daemon=True),
        threading.Thread(target=_follow, args=(run, stop, since), daemon=True),
        threading.Thread(target=_stream, args=(run, stop, since), daemon=True),
    ]
    try:
        for thread in threads:
            thread.start()
        if not run.ended.wait(max(spec.job.time_limit - (time.monotonic() - start), 1)):
            run.end(124)
        if run.status == 0 and not run.gave_up and spec.job.launcher != "mpirun":
            engine.wait(compose.rank_order(spec), STOP_GRACE_S)  # the other agents are leaving torchrun's exit barrier
        # The job is over: the nodes still up cannot go on without it; stopped first, reported after.
        subprocess.run(run.compose("stop", "--timeout", str(STOP_GRACE_S)), capture_output=True, timeout=180,
                       check=False)  # fmt: skip
    except BaseException:  # the runner itself stopped (Ctrl-C): the job's end, status unknown
        events.write(events.JOB_ENDED, events_file=compose.events_file(run.folder), status=None)
        raise
    finally:
        stop.set()  # ends the streams the threads read (the engine's events and logs, compose logs)
    elapsed = time.monotonic() - start
    for thread in threads[1:]:
        thread.join(timeout=60)  # their last pass: the records and lines of this run not yet read
    status = run.gave_up.status if run.gave_up else run.status
    events.write(events.JOB_ENDED, events_file=compose.events_file(run.folder), status=status)
    if 0 < status < 128 and not run.gave_up:
        run.unresolved()
    _collect(run, elapsed)
    run.say(f"cluster: job exit status {status} after {elapsed:.0f}s; logs: {run.log_file} and {run.hint('logs')}; "
            f"remove: {run.hint('down')}")  # fmt: skip
    if status:
        raise ClusterError(_failure(run, status), status)
    return 0


def _start_monitor(run: Run) -> None:
    """Start the monitor profile's Prometheus beside the running nodes; one line says where its UI is, or why it
    did not start (the job goes on either way)."""
    started = subprocess.run(run.compose("--profile", compose.MONITOR, "up", "--detach", "--wait", compose.PROMETHEUS),
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    run.log(f"compose up prometheus: exit {started.returncode}: {started.stdout}{started.stderr}")
    if started.returncode == 0:
        run.say(f"monitor: Prometheus at http://127.0.0.1:{run.monitor.port} scrapes every node's metrics "
                f"(e.g. the graph of ddp_job_samples_per_second); it stays up until {run.hint('down')}")  # fmt: skip
        return
    detail = (started.stderr.strip().splitlines() or ["no output"])[-1]
    run.say(f"monitor: Prometheus did not start ({detail}); the job goes on without it: free port "
            f"{run.monitor.port} or give MONITOR_PORT, see {run.log_file}")  # fmt: skip


def _failure(run: Run, status: int) -> str:
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


def _collect(run: Run, elapsed: float) -> None:
    """Copy the results volume home (through rank 0's node: each run's folder as the job left it, ``collect``) and
    print the newest summary written during this job."""
    results, main = run.results, run.main_container
    if not collect.bring_home(lambda into: engine.copy_out(main, str(contract.RESULTS_DIR), into), results):
        run.say(f"cluster: the results were not copied to {results}: {main}'s {contract.RESULTS_DIR} "
                f"could not be read; the volume {run.spec.job.name}_results keeps them until cluster-down")  # fmt: skip
        return
    fresh = [p for p in results.rglob("summary.json") if p.stat().st_mtime >= time.time() - elapsed - 5]
    if fresh:
        newest = max(fresh, key=lambda p: p.stat().st_mtime)
        run.say(f"cluster: summary ({newest}):\n{newest.read_text().rstrip()}")
    run.say(f"cluster: results in {results} (the volume {run.spec.job.name}_results keeps them until cluster-down)")


def run(args: argparse.Namespace) -> int:
    """Run the action; exit with the job's status (up), 0 (status, logs, down), 2 for bad input."""
    if args.action == "status":
        return _status(topology.spec_from_args(args), args.state_dir, args.json, args.make)
    job = _prepare(args)
    if args.action == "down":
        return _down(job)
    if args.action == "logs":
        status = subprocess.run(
            job.compose("logs", "--no-color", "--timestamps", every_profile=True), check=False
        ).returncode
        records, _ = events.read(compose.events_file(job.folder))
        for record in records:  # what happened to the jobs, after what their nodes said (progress: cluster status)
            if record.get("kind") != events.EXCHANGE:
                print(describe_event(record))
        return status
    if args.build:
        _build(args.build, contract.flavour(job.spec.nodes.gpus_per_node))
    return _up(job)


def _status(spec: ClusterSpec, state_dir: Path, as_json: bool, make: bool = False) -> int:
    """``cluster status``: the job at a glance from its events and its containers' states (nothing is rendered)."""
    name = spec.job.name
    path = compose.events_file((state_dir / name).resolve())
    containers = engine.project_containers(name)
    if not path.exists() and not containers:
        raise UsageError(
            f"no cluster named {name} here (no {path}, no containers of compose project {name}): start one with "
            f"{hint(name, 'up', make)}, or name yours with --name"
        )
    records, _ = events.read(path)
    for service in (compose.RENDEZVOUS, compose.PROMETHEUS):  # no node of the job
        containers.pop(compose.container(spec, service), None)
    print(job_status.show(name, records, containers, as_json))
    return 0


def _build(command: str, flavour: str) -> None:
    """Build the image the spec's nodes need: COMMAND with ``--flavour FLAVOUR``; its own lines are the user's."""
    argv = [*shlex.split(command), "--flavour", flavour]
    try:
        status = subprocess.run(argv, check=False).returncode
    except OSError as error:
        raise UsageError(
            f"--build {command!r} does not run ({error.strerror}): give a command that builds the image"
        ) from None
    if status != 0:
        raise ClusterError(f"the image build (--build) failed with exit status {status}; its lines are above", status)


def describe_event(record: dict) -> str:
    """``events | 2026-11-27T06:10:01 ddp-cluster-worker-1 rank 3: worker_failed exitcode=-9 ...``: one record of
    the events file, as ``cluster logs`` prints it after the nodes' output."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(float(record.get("time", 0))))
    who = f"{record.get('node')}" + (f" rank {record['rank']}" if record.get("rank") is not None else "")
    fields = " ".join(f"{key}={json.dumps(value)}" for key, value in record.items()
                      if key not in ("time", "node", "rank", "kind"))  # fmt: skip
    return f"events | {stamp} {who}: {record.get('kind')} {fields}".rstrip()
