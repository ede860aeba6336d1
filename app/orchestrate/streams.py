"""The output of a compose job's nodes, as the runner streams it: rank 0's node on the terminal (its standard
output; standard error with --verbose) and every node's lines into the command's log; each stream ends with the
job.

    follow(run, stop, since)    # compose logs --follow of every node, into the log
    stream(run, stop, since)    # the main container's output, on the terminal
"""

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Iterator

from app import events, logs
from app.orchestrate import engine
from app.orchestrate.job import Run
from app.topology import compose


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


def follow(run: Run, stop: threading.Event, since: float) -> None:
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


def stream(run: Run, stop: threading.Event, since: float) -> None:
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
