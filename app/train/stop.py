"""A rank that its launcher stops keeps its step: SIGTERM ends training at the next step boundary.

    torchrun ... -m app train --out runs/x --resume auto     # torchrun's agent stops its workers with SIGTERM
    kill -TERM <pid of rank 0>                              # or scancel, a preemption, a deleted pod

Every launcher stops a rank with SIGTERM first: torchrun's agent when it starts a new rendezvous round
(a process or node lost elsewhere, a node that joins), Slurm at scancel, a preemption or the time
limit, Kubernetes when a pod is deleted, ``docker stop``. By default that ends the process at once,
and the restarted job takes the last periodic checkpoint. While ``app train`` trains, SIGTERM is
noted instead (``Stop``), and the rank stops at the next optimizer-step boundary, where its state is
whole (under DDP every rank holds it): rank 0 keeps that step in the emergency snapshot
(``snapshot.keep``), every other rank says its step in the rendezvous store for the others' roll call
(a rank still inside a collective fails once its peers leave, and holds the roll call of
``snapshot.write``). At most the step in flight is lost, and the resumed run says ``no steps lost``.

Bounded. A rank inside a collective runs no Python until the collective returns; a peer that is
stopped too makes it fail at once, but one that hangs would keep it there until --timeout. The
signal also wakes a watcher thread (``signal.set_wakeup_fd``): a rank that has not finished
stopping STOP_GRACE_S after the signal exits with status 143, as SIGTERM's default would have,
well within the grace every launcher gives before SIGKILL (torchrun 30 s, Slurm's KillWait 30 s,
Kubernetes 30 s, compose's stop_grace_period here 10 s).
"""

import os
import select
import signal
import sys
import threading

from app.errors import Stopped

STOP_GRACE_S = 8.0
"""Seconds a rank has, after SIGTERM, to reach a step boundary and keep its step before it exits anyway."""
STATUS = 128 + signal.SIGTERM
"""The exit status of a stopped rank: what SIGTERM's default action reports (143)."""


class Stop:
    """SIGTERM noted while training (``with Stop() as stop: ... stop.check()``); the old handler after."""

    def __init__(self, grace_s: float = STOP_GRACE_S) -> None:
        self.grace_s = grace_s
        self.requested = False
        self._done = threading.Event()
        self._installed = False

    def __enter__(self) -> "Stop":
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach the main thread only: a trainer run in a thread keeps the default
        self._wake, wake = os.pipe()
        os.set_blocking(wake, False)
        self._previous_fd = signal.set_wakeup_fd(wake)
        self._previous = signal.signal(signal.SIGTERM, self._note)
        self._wake_write, self._installed = wake, True
        threading.Thread(target=self._watch, name="stop-watch", daemon=True).start()
        return self

    def __exit__(self, *_exc) -> None:
        self.finished()
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            signal.set_wakeup_fd(self._previous_fd)
            os.close(self._wake_write)

    def _note(self, _signum: int, _frame) -> None:
        self.requested = True

    def check(self) -> None:
        """At a step boundary: raise Stopped when SIGTERM came."""
        if self.requested:
            raise Stopped("SIGTERM", STATUS)

    def finished(self) -> None:
        """Stopping is done (or training ended): the watcher has nothing left to bound."""
        self._done.set()

    def _watch(self) -> None:
        """Wake on a signal; SIGTERM not done with within the grace: exit as SIGTERM would have."""
        try:
            self._wait_for_signals()
        finally:
            os.close(self._wake)

    def _wait_for_signals(self) -> None:
        while not self._done.is_set():
            try:
                ready, _, _ = select.select([self._wake], [], [], 1.0)
                got = os.read(self._wake, 64) if ready else b""
            except OSError:
                return
            if signal.SIGTERM in got and not self._done.wait(self.grace_s):
                late = f"not at a step boundary within {self.grace_s:g} s"
                print(f"train: stopped by SIGTERM inside a collective ({late}): no emergency snapshot", file=sys.stderr)
                sys.stderr.flush()
                os._exit(STATUS)
