"""The fault job of the fault suite and the benchmarks: ``python -m app train`` exactly as the command
line runs it, plus fault hooks.

    python -m app cluster up --script docker/bench/fault_job.py \\
        --args '--marker /results/x/fault.json --fault-at-step 30 --fault-rank 3 --slow-ms 500 -- --out /results/x ...'
    python docker/bench/fault_job.py --marker m.json --fault-at-step 6 --fault-rank 2 --stall -- <train flags>

Used by the fault suite (tests/docker/test_faults.py), the hang and straggler tests
(tests/integration/test_train_health.py), ``make bench-faults`` and ``make bench-straggler``. The flags
before ``--`` are the hooks'; the rest are app train's. Runs through ``app.cli.main`` (one-line errors,
per-rank logs) with ``app.train.main.train`` given one more step hook. The product has no fault flags.

Hooks, on the first attempt only (the process found no --marker when it started):
  at --fault-at-step, rank --fault-rank writes --marker (JSON: step, rank, host, pid, time), then
    --stall: stops itself (SIGSTOP), like a hung process
    --fill-disk: fills the file system of --marker, leaving --leave-mib MiB free
    --hang-s S: sleeps S seconds once, inside the step (a rank that hangs past --timeout; the hang test
      expects the flight recorder to name the sleep's line)
  and from then on sleeps --slow-ms per step (the others wait for it), so a test can act at a known step.
Always: --sleep-rank R sleeps --sleep-ms per step (a straggler), with --sleep-below-world N only while
the job has fewer than N ranks (the shrunk job waits for a node to rejoin); --sleep-host H: every rank on the
host named H sleeps instead, only while the file --sleep-while names exists (a slow node that heals when a
test removes it); --pace-ms: every rank sleeps that long per step (a job slow enough to act on);
--first-steps FILE gets one
JSON line per process with its first completed step and the time (``make bench-faults``).
Holds (every rank waits at a step boundary, inside no collective, so that no timeout runs; at most HOLD_S):
  --hold-at-step S --hold-until FILE: at step S, until FILE exists (a test acts on a job at a known step, then
    lets it go on: the job cannot end before the test has seen what it waits for)
  --hold-below-world N --hold-after K: once this process ran K steps with fewer than N ranks, until its launcher
    stops it (SIGTERM, at that step boundary: the step kept), as when a node joins and the world grows again
"""

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from app import cli
from app.train import main as train_main

HOLD_S = 600.0
"""The longest a hold waits: a test that never releases its job fails on its own timeout, not this one."""


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    hooks, train_args = _split(argv)
    parser = argparse.ArgumentParser(prog="fault_job.py")
    parser.add_argument("--marker", type=Path)
    parser.add_argument("--fault-at-step", type=int, default=0)
    parser.add_argument("--fault-rank", type=int, default=0)
    parser.add_argument("--slow-ms", type=float, default=0)
    parser.add_argument("--stall", action="store_true")
    parser.add_argument("--fill-disk", action="store_true")
    parser.add_argument("--leave-mib", type=float, default=1.0)
    parser.add_argument("--hang-s", type=float, default=0)
    parser.add_argument("--sleep-rank", type=int, default=-1)
    parser.add_argument("--sleep-ms", type=float, default=0)
    parser.add_argument("--sleep-below-world", type=int, default=0)
    parser.add_argument("--sleep-host", default="")
    parser.add_argument("--pace-ms", type=float, default=0)
    parser.add_argument("--sleep-while", type=Path)
    parser.add_argument("--first-steps", type=Path)
    parser.add_argument("--hold-at-step", type=int, default=0)
    parser.add_argument("--hold-until", type=Path)
    parser.add_argument("--hold-below-world", type=int, default=0)
    parser.add_argument("--hold-after", type=int, default=0)
    return parser.parse_args(hooks), train_args


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the hooks' flags, app train's flags): the two sides of ``--``."""
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def fill(folder: Path, leave: int) -> None:
    """Fill ``folder``'s file system until ``leave`` bytes are free."""
    chunk = b"\0" * 2**20
    with open(folder / "filler", "wb") as handle:
        while os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize > leave + len(chunk):
            handle.write(chunk)
            handle.flush()


def hold(trainer, until) -> None:
    """Wait at this step boundary until ``until()`` or SIGTERM (``Stopped`` raised here, as at any boundary: the
    trainer keeps the step), at most HOLD_S."""
    deadline = time.monotonic() + HOLD_S
    while not until() and time.monotonic() < deadline:
        if trainer.stop is not None:
            trainer.stop.check()
        time.sleep(0.1)


def fault_hook(opts: argparse.Namespace):
    armed = opts.marker is not None and not opts.marker.exists()
    state = {"slow": False, "first": True, "below": 0}

    def hook(trainer, step: int) -> None:
        if opts.hold_until and step == opts.hold_at_step:
            hold(trainer, opts.hold_until.exists)
        if opts.hold_below_world and trainer.ctx.proc.world_size < opts.hold_below_world:
            state["below"] += 1
            if state["below"] >= opts.hold_after:
                hold(trainer, lambda: False)
        if state["first"] and opts.first_steps:
            state["first"] = False
            line = {"rank": trainer.rank, "restart": trainer.ctx.proc.restart_count, "step": step, "time": time.time()}
            with open(opts.first_steps, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(line) + "\n")
        whole = opts.sleep_below_world and trainer.ctx.proc.world_size >= opts.sleep_below_world
        if trainer.rank == opts.sleep_rank and not whole:
            time.sleep(opts.sleep_ms / 1000)
        time.sleep(opts.pace_ms / 1000)
        if opts.sleep_host == socket.gethostname() and opts.sleep_while and opts.sleep_while.exists():
            time.sleep(opts.sleep_ms / 1000)
        if armed and step == opts.fault_at_step and trainer.rank == opts.fault_rank:
            info = {"step": step, "rank": trainer.rank, "host": socket.gethostname(), "pid": os.getpid()}
            tmp = opts.marker.with_suffix(".tmp")
            tmp.write_text(json.dumps({**info, "time": time.time()}))
            tmp.replace(opts.marker)
            state["slow"] = True
            if opts.fill_disk:
                fill(opts.marker.parent, int(opts.leave_mib * 2**20))
            if opts.stall:
                os.kill(os.getpid(), signal.SIGSTOP)
            if opts.hang_s:
                time.sleep(opts.hang_s)  # HANG_LINE: the flight recorder names this line
        if state["slow"]:
            time.sleep(opts.slow_ms / 1000)

    return hook


def main(argv: list[str]) -> int:
    opts, train_args = parse(argv)
    real_train = train_main.train
    hook = fault_hook(opts)

    def train_with_hook(cfg, dist_cfg, prepare=None):
        return real_train(cfg, dist_cfg, prepare=lambda trainer: trainer.step_hooks.append(hook))

    train_main.train = train_with_hook
    return cli.main(["train", *train_args])


if __name__ == "__main__":
    cli.leave(main(sys.argv[1:]))
