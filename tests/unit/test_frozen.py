"""app/train/frozen.py: the gaps in a process's time, as a frozen process finds them."""

import time

from app.train import frozen


class Still(frozen.Clock):
    """The clock without its ticking thread: the test ticks it (no race with a real tick)."""

    def _tick(self) -> None:
        return None


def test_a_gap_longer_than_gap_s_is_kept_and_read_while_recent() -> None:
    clock = Still()
    now = time.monotonic()
    clock.last, clock.gaps = now - 30.0, [(now - 500.0, 90.0)]  # a freeze of 30 s just ended; one of 90 s long ago
    clock._note(now)
    assert clock.gaps[-1] == (now, 30.0)
    assert 30.0 <= clock.longest_gap(within_s=60) < 90.0  # the old one is out of the window
    assert clock.longest_gap(within_s=1000) == 90.0


def test_ticks_closer_than_gap_s_are_no_gap_and_an_open_gap_counts() -> None:
    clock = Still()
    now = time.monotonic()
    clock.last, clock.gaps = now, []
    clock._note(now + frozen.GAP_S / 2)
    assert clock.gaps == []
    clock.last = time.monotonic() - 40.0  # thawed: this clock's thread has not ticked since
    assert clock.longest_gap(within_s=1) >= 39.0
