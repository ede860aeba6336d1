"""Whether this process was itself stopped (``docker pause``, SIGSTOP, a frozen VM): a thread that ticks every
TICK_S keeps the gaps between its ticks; a process that was frozen finds a gap as long as the freeze, since
the monotonic clock runs on while every thread of the process stands still.

    clock = frozen.Clock()                 # starts its daemon thread
    clock.longest_gap(within_s=60)         # seconds of the longest gap that ended in the last 60 s (0.0: none)

``app train``'s ranks use it after a failed collective (app/train/watch.py): a rank stopped for longer than
--timeout says so, instead of naming as silent the ranks that gave up waiting for it.
"""

import threading
import time

TICK_S = 0.25
"""How often the thread ticks."""
GAP_S = 2.0
"""A gap between ticks longer than this is kept (shorter ones: a busy machine's scheduling)."""


class Clock:
    """The gaps in this process's time: (when each ended, how long it was), by the monotonic clock."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.gaps: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._tick, name="frozen-clock", daemon=True).start()

    def _tick(self) -> None:
        while True:
            time.sleep(TICK_S)
            self._note(time.monotonic())

    def _note(self, now: float) -> None:
        with self._lock:
            if now - self.last > GAP_S:
                self.gaps = [*self.gaps[-9:], (now, now - self.last)]
            self.last = now

    def longest_gap(self, within_s: float) -> float:
        """The longest gap (seconds) that ended in the last ``within_s`` seconds, counting the one still open (a
        thread thawed before this clock's: its tick has not come yet)."""
        now = time.monotonic()
        with self._lock:
            found = [length for end, length in self.gaps if now - end <= within_s]
            return max([*found, now - self.last - TICK_S, 0.0])
