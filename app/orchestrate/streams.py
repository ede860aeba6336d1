"""The output of a compose job's nodes, as the runner streams it from the engine (``engine.lines``): rank 0's node
on the terminal (its standard output; standard error with --verbose) and every node's lines into the command's log;
each stream ends with the job.

    follow(run, stop, since)    # every node's output, into the log
    stream(run, stop, since)    # the main container's output, on the terminal
"""

import threading
from collections.abc import Callable, Iterator

from app import events, logs
from app.orchestrate import engine
from app.orchestrate.job import Run
from app.topology import compose


def _new_lines(stop: threading.Event, since: float, container: Callable[[], str], stderr: bool) -> Iterator[tuple]:
    """(container, line) for each line of this run's output of ``container()`` (asked again at each start: the
    node it names may change), read from ``since``. The engine's stream ends when the container stops; it is
    started again as long as the job runs (a restarted container keeps its earlier runs' output: the lines read
    again are skipped), and once the job is over one last pass reads what was missed."""
    seen: set[tuple[str, str]] = set()
    while True:
        follow = not stop.is_set()
        name = container()
        for raw in engine.lines(name, since, stop, follow, stderr=stderr):
            if (name, raw) not in seen:
                seen.add((name, raw))
                yield name, raw.partition(" ")[2]  # after the engine's time stamp
        if not follow:
            return
        stop.wait(1)


def follow(run: Run, stop: threading.Event, since: float) -> None:
    """Every node's output, stdout and stderr (tracebacks, torch's C++ lines and their ``frame #`` backtraces,
    torchrun's banners), into the log, each line named by its node's container; nothing of it to the terminal
    (``stream``). One reader per node container, each until the job is over."""
    spec = run.spec
    mpi = [compose.container(spec, compose.LAUNCHER), *(h.name for h in compose.mpi_hosts(spec))]
    containers = mpi if spec.job.launcher == "mpirun" else [h.name for h in compose.torchrun_hosts(spec)]
    readers = [threading.Thread(target=_into_log, args=(run, stop, since, name), daemon=True) for name in containers]
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()


def _into_log(run: Run, stop: threading.Event, since: float, container: str) -> None:
    for name, line in _new_lines(stop, since, lambda: container, stderr=True):
        run.log(logs.node_line(name, line))


def stream(run: Run, stop: threading.Event, since: float) -> None:
    """Print the standard output of the streamed node (``Run.main_container``): the app's own lines. Its standard
    error (tracebacks, torch's C++ warnings and their backtraces, torchrun's report) stays in the log; with
    ``--verbose`` it is printed too. Its stream is started again on the streamed node of the moment (the head lost:
    the next node) as long as the job runs."""
    for _, line in _new_lines(stop, since, lambda: run.main_container, stderr=run.verbose):
        if line.startswith(events.GATE_LINES_SAID_AGAIN):
            continue  # its gate's verdict: the runner's own line says it, naming the node (Run.gated)
        with run.lock:  # print() writes the line and its newline apart: the runner's own lines wait
            print(line, flush=True)
