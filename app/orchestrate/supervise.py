"""What a compose job's runner does while the job runs, as an engine would elsewhere: it reads the job's events
file into the job's state (``read_events``), starts again a node container that was lost (``watch_nodes``:
Docker's restart policy, bounded by --max-restarts), and ends the job when a node's agent or mpirun's launcher ends,
or the rendezvous store is lost. What becomes of a node (its gate, its ranks' restarts, a straggler's eviction and
return) is its agent's, as on every engine (app/node).

    threading.Thread(target=watch_nodes, args=(run, stop, since)).start()    # app/orchestrate/runner.py
"""

import json
import threading

from app import events
from app.orchestrate import engine
from app.orchestrate.job import CONTAINER, Run, describe_status
from app.topology import compose

EVENTS_EVERY_S = 0.5
"""How often the runner reads the job's events file for new records."""


def read_events(run: Run, stop: threading.Event, offset: int) -> None:
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


def watch_nodes(run: Run, stop: threading.Event, since: float) -> None:
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
        elif service in run.nodes and (lost or code != 0):
            _restart_node(run, name, code, stop, by_docker)


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
    if not by_docker and stop.wait(POLICY_S):  # Docker's restart policy brings back a crashed container by itself
        return
    if not stop.is_set() and not engine.running(name) and not engine.start(name) and not engine.running(name):
        run.gone.add(name)
        if going_on:
            run.say(f"cluster: {which} is gone (it cannot be started again); {going_on}")


POLICY_S = 2.0
"""Seconds Docker's restart policy has to bring back a crashed node container before the runner starts it."""
