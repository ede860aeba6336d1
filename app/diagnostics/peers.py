"""A node's peers as they are now: a node at its health gate asks the job's running nodes, through the rendezvous
store that its gate already reaches, to measure their devices; each answers its pace, what it measures now over what
it measured at its own start, and the gate sets the job's figures against the best pace of its peers (never above
1: app/diagnostics/gate.py). A machine loaded since the job's start (the figures recorded then) lowers the bar for
a healthy node that comes back to it; a node held at a tenth of a core is still kept out, for its peers, loaded
alike and training, still do several times what it does. No peer answers (every node at its gate, a store that
serves no running job): the job's figures as recorded.

    peers.answer(where, host, baseline, measure, timeout_s)            # app node, once its gate let it in: a thread
    paces = peers.ask(where, host, timeout_s, wait_s, expected)         # app gate, when its figures fall short

The store's keys (each job's rendezvous store, so one job's): ``ddp-cluster/gate/asks`` counts the asks; ask N's
``ddp-cluster/gate/ask/N`` names it (``host@ns``); its answers are counted in ``.../answers/<ask>`` and each is
``.../answer/<ask>/<K>``, a JSON ``{"host", "pace": {device: {metric: ratio}}}``.
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


def pace(now: list[health.DeviceHealth], baseline: list[health.DeviceHealth]) -> dict[str, dict[str, float]]:
    """Each device's figures now over its figures at this node's start, metric by metric (a device not measured
    then: left out)."""
    then = {d.device: d for d in baseline}
    return {
        d.device: {m: getattr(d, m) / getattr(then[d.device], m) for m in health.METRICS if getattr(then[d.device], m)}
        for d in now
        if d.device in then
    }


def scaled(start: list[health.DeviceHealth], paces: list[dict]) -> tuple[list[health.DeviceHealth], float]:
    """The job's figures ``start`` as its peers are now: each device's each metric times the best pace that a peer
    answered for it, at most 1 (a peer faster than at its start does not raise the bar); and the lowest factor
    applied, for the line."""
    kept, lowest = [], 1.0
    for device in start:
        factors = {}
        for metric in health.METRICS:
            answered = [p["pace"][device.device][metric] for p in paces if metric in p["pace"].get(device.device, {})]
            factors[metric] = min(1.0, max(answered)) if answered else 1.0
            lowest = min(lowest, factors[metric])
        kept.append(replace(device, **{m: getattr(device, m) * f for m, f in factors.items()}))
    return kept, lowest


def ask(where: tuple[str, int], host: str, timeout_s: float, wait_s: float, expected: int = 0) -> list[dict]:
    """The paces of the job's running nodes, asked through the store at ``where`` (host, port): every answer given
    within ``wait_s`` (all ``expected`` of them: at once); none when the store does not answer."""
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
    timeout_s: float,
) -> threading.Thread:
    """Answer, from a thread of its own, every ask of another node's gate made from now on: ``measure()`` now, over
    ``baseline`` (this node's figures at its start). A store that goes away is reached again at the next look."""

    def loop() -> None:
        store, seen = None, None
        while True:
            try:
                store = store or store_client(*where, timeout_s)
                count = store.add(ASKS, 0)
                seen = count if seen is None else seen  # asks made before it answered are not its own to answer
                for number in range(seen + 1, count + 1):
                    ask_id = store.get(_ask_key(number)).decode()
                    if ask_id.partition("@")[0] != host:
                        found = json.dumps({"host": host, "pace": pace(measure(), baseline)})
                        store.set(_answer_key(ask_id, store.add(_count_key(ask_id), 1)), found)
                seen = count
            except STORE_ERRORS:  # gone (a restarting store): reached again a little later, its count afresh
                store, seen = None, None
                time.sleep(RECONNECT_S)
            time.sleep(POLL_S)

    thread = threading.Thread(target=loop, name="gate-peers", daemon=True)
    thread.start()
    return thread
