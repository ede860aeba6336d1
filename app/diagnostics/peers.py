"""A node's peers as they are now: a node at its health gate asks the job's running nodes, through the rendezvous
store that its gate already reaches, to measure their devices; each answers what it measures now, in the units of
its record (its record now x what it measures now over what it measured at its own start: the same as what it
measures now, unless its record was rewritten since), and the gate sets the job's figures against the best answer,
device by device and metric by metric, where that is lower (app/diagnostics/gate.py). A machine loaded since the
job's start (the figures recorded then) lowers the bar for a healthy node that comes back to it; a node held at a
tenth of a core is still kept out, for its peers, loaded alike and training, still do several times what it does.
No peer answers (every node at its gate, a store that serves no running job): the job's figures as recorded.

    peers.answer(where, host, baseline, measure, record, timeout_s)    # app node, once its gate let it in: a thread
    answers = peers.ask(where, host, timeout_s, wait_s, expected)       # app gate, when its figures fall short

The store's keys (each job's rendezvous store, so one job's): ``ddp-cluster/gate/asks`` counts the asks; ask N's
``ddp-cluster/gate/ask/N`` names it (``host@ns``); its answers are counted in ``.../answers/<ask>`` and each is
``.../answer/<ask>/<K>``, a JSON ``{"host", "figures": {device: {metric: value}}}``.
"""

import json
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from app.diagnostics import health
from app.errors import ClusterError
from app.runtime.distributed import store_client

ASKS = "ddp-cluster/gate/asks"
POLL_S = 1.0
"""How often a running node looks for asks; and how much longer than its peers' measurement an ask waits."""
RECONNECT_S = 5.0
"""How long a running node waits to reach its store again after it went away."""
STORE_ERRORS = (ClusterError, RuntimeError, ValueError)
"""What a store that went away or timed out raises (a ClusterError at connection, torch's errors after)."""


def _ask_key(number: int) -> str:
    return f"ddp-cluster/gate/ask/{number}"


def _count_key(ask: str) -> str:
    return f"ddp-cluster/gate/answers/{ask}"


def _answer_key(ask: str, number: int) -> str:
    return f"ddp-cluster/gate/answer/{ask}/{number}"


def now(
    measured: list[health.DeviceHealth], baseline: list[health.DeviceHealth], record: list[health.DeviceHealth] | None
) -> dict[str, dict[str, float]]:
    """A running node's answer: each device's figures now (``measured``) in the units of its ``record`` as it is
    now (record x measured / ``baseline``, its figures at its start; no record: as measured). A device not measured
    at its start is left out."""
    then, kept = {d.device: d for d in baseline}, {d.device: d for d in record or baseline}
    return {
        d.device: {
            m: getattr(d, m) * getattr(kept.get(d.device, then[d.device]), m) / getattr(then[d.device], m)
            for m in health.METRICS
            if getattr(then[d.device], m)
        }
        for d in measured
        if d.device in then
    }


def scaled(start: list[health.DeviceHealth], answers: list[dict]) -> tuple[list[health.DeviceHealth], float]:
    """The job's figures ``start`` as its peers are now: each device's each metric lowered to the best that a peer
    answered for it (a peer faster than the job's figures does not raise the bar); and the lowest ratio of the
    figures so lowered to the recorded ones, for the line."""
    kept, lowest = [], 1.0
    for device in start:
        lowered = {}
        for metric in health.METRICS:
            told = [
                a["figures"][device.device][metric] for a in answers if metric in a["figures"].get(device.device, {})
            ]
            recorded = getattr(device, metric)
            lowered[metric] = min(recorded, max(told)) if told else recorded
            lowest = min(lowest, lowered[metric] / recorded) if recorded else lowest
        kept.append(replace(device, **lowered))
    return kept, lowest


def ask(where: tuple[str, int], host: str, timeout_s: float, wait_s: float, expected: int = 0) -> list[dict]:
    """The answers of the job's running nodes (``now``), asked through the store at ``where`` (host, port): every
    answer given within ``wait_s`` (all ``expected`` of them: at once); none when the store does not answer."""
    try:
        store = store_client(*where, timeout_s)
        ask_id = f"{host}@{time.time_ns()}"
        store.set(_ask_key(store.add(ASKS, 1)), ask_id)
        deadline = time.monotonic() + wait_s
        count = 0
        while time.monotonic() < deadline:
            count = store.add(_count_key(ask_id), 0)
            if expected and count >= expected:
                break
            time.sleep(0.1)
        found = [json.loads(store.get(_answer_key(ask_id, k))) for k in range(1, count + 1)]
    except STORE_ERRORS:
        return []
    return [answer for answer in found if answer.get("host") != host]


def answer(
    where: tuple[str, int],
    host: str,
    baseline: list[health.DeviceHealth],
    measure: Callable[[], list[health.DeviceHealth]],
    record: Callable[[], list[health.DeviceHealth] | None],
    timeout_s: float,
    stop: threading.Event | None = None,
) -> threading.Thread:
    """Answer, from a thread of its own, every ask of another node's gate made from now on (``now``: ``measure()``
    against ``baseline``, this node's figures at its start, in the units of ``record()``, its record as it is then).
    A store that goes away is reached again a little later. It answers until ``stop`` is set (None: for as long
    as this process lives)."""
    stop = stop or threading.Event()

    def loop() -> None:
        store, seen = None, None
        while not stop.is_set():
            try:
                store = store or store_client(*where, timeout_s)
                count = store.add(ASKS, 0)
                seen = count if seen is None else seen  # asks made before it answered are not its own to answer
                for number in range(seen + 1, count + 1):
                    ask_id = store.get(_ask_key(number)).decode()
                    if ask_id.partition("@")[0] != host:
                        found = json.dumps({"host": host, "figures": now(measure(), baseline, record())})
                        store.set(_answer_key(ask_id, store.add(_count_key(ask_id), 1)), found)
                seen = count
            except STORE_ERRORS:  # gone (a restarting store): reached again a little later, its count afresh
                store, seen = None, None
                stop.wait(RECONNECT_S)
            stop.wait(POLL_S)

    thread = threading.Thread(target=loop, name="gate-peers", daemon=True)
    thread.start()
    return thread
