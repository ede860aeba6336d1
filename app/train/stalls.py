"""How long this rank's collective threads waited for a CPU: the part of a collective's time that is this rank's own
doing, which its busy time does not show (app/train/watch.py exchanges it beside busy time, every --exchange-every
steps).

    python -m app train --exchange-every 20      # each exchange's record holds every rank's stall_ms beside busy_ms

A rank's busy time is its wall time less the time it waited in the gradient all-reduce, so a CPU quota (``docker
--cpus``) that runs out while the all-reduce is under way does not show in it: every rank waits alike there, the
throttled one included (tests/unit/golden/evict/README.md). The kernel counts, for each thread, the time it was
runnable but not running (the second figure of /proc/self/task/<tid>/schedstat, ``run_delay``): a throttled
container's collective threads wait that long for their quota, while on an equally busy machine every rank waits
about alike. ``CommStall.since_last`` is the longest such wait of one of the backend's threads (gloo's, by name:
they run at once, so their waits overlap) since its last call. Where the kernel keeps no such count (not Linux,
sched_info off) it reads 0.
"""

from pathlib import Path

COMM_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")
"""Names of the threads that run gloo's collectives and move their bytes (the process group's and its transport's)."""
TASKS = Path("/proc/self/task")


def run_delays(tasks: Path = TASKS, names: tuple[str, ...] = COMM_THREADS) -> dict[str, int]:
    """Each thread named one of ``names``: its id and the nanoseconds it waited runnable for a CPU so far."""
    found = {}
    try:
        threads = list(tasks.iterdir())
    except OSError:
        return found
    for thread in threads:
        try:
            if (thread / "comm").read_text().strip() in names:
                found[thread.name] = int((thread / "schedstat").read_text().split()[1])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile, a kernel without the count
            continue
    return found


class CommStall:
    """The collective threads' waits for a CPU between two calls of ``since_last``."""

    def __init__(self, tasks: Path = TASKS) -> None:
        self.tasks = tasks
        self.last = run_delays(tasks)

    def since_last(self) -> float:
        """Seconds: the longest wait of one collective thread since the last call (a thread new since counts from 0)."""
        now = run_delays(self.tasks)
        waited = max((delay - self.last.get(tid, 0) for tid, delay in now.items()), default=0)
        self.last = now
        return max(waited, 0) / 1e9
