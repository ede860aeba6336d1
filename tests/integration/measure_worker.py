"""Test worker: ``app comm`` / ``app links`` with faults that only a test may inject.

    python -m tests.integration.measure_worker [--corrupt-rank R] [--ranks-per-host N]
        [--slow-sender R --delay S] [--slow-device R] [--report-written PATH] [--one-core] <app command and flags>

--corrupt-rank R: rank R's fill function (app.diagnostics.collectives.rank_data) returns one wrong element,
    so the sweep must count it (#wrong > 0) and fail.
--ranks-per-host N: every N consecutive ranks pose as one host (node0, node1, ...), so ``app
    links`` sees several nodes on one machine.
--slow-sender R --delay S: rank R sleeps S seconds before each bandwidth transfer it sends, so its
    outgoing links are slow and the verdict must name it.
--slow-device R[,R...]: each such rank's device-health measurement (``app check``) does each matrix product
    and copy SLOW_DEVICE_FACTOR (10) times while counting it once, so its device reads at a tenth of its
    speed: far below the third (health.CPU_RANK_FLOOR) that a CPU rank must be under, whatever the noise.
--report-written PATH: a rank other than 0, once its command returned (it left the process group), exits 7 with
    one line when rank 0's report PATH is not there yet: what a launcher that stops the job as soon as a node fails
    leaves of it.
--one-core: every rank runs on the same core (the lowest this process may use), so the ranks share it
    evenly and their device figures differ by what the test injects, not by how the scheduler spread three
    ranks over two cores or what else the machine runs (two fast ranks a factor apart widen the rule's
    spread until a rank at a third of their speed is no longer below it).
"""

import argparse
import dataclasses
import os
import sys
import time

from app import cli
from app.diagnostics import collectives, health, links
from app.runtime import launcher


def _corrupt(rank: int) -> None:
    fill = collectives.rank_data

    def wrong_fill(sender, numel, modulus, dtype, device):
        data = fill(sender, numel, modulus, dtype, device)
        if sender == rank:
            data[0] += 1
        return data

    collectives.rank_data = wrong_fill


def _pose_as_hosts(per_host: int) -> None:
    detect = launcher.detect

    def posing(*args, **kwargs):
        info = detect(*args, **kwargs)
        return dataclasses.replace(info, host=f"node{info.rank // per_host}")

    launcher.detect = posing


def _slow_sender(delay: float) -> None:
    send = links._Link._send

    def slow_send(self, tensor, peer):
        if tensor.numel() > links.LATENCY_BYTES:
            time.sleep(delay)
        send(self, tensor, peer)

    links._Link._send = slow_send


REPORT_MISSING = 7
"""--report-written's exit status."""
SLOW_DEVICE_FACTOR = 10
"""--slow-device's rank does each step this many times while counting it once."""


def _slow_device() -> None:
    sample = health.sample

    def slow_sample(step, work, device, sample_s, calls):
        def repeated():
            for _ in range(SLOW_DEVICE_FACTOR - 1):
                step()
            return step()

        return sample(repeated, work, device, sample_s, calls)

    health.sample = slow_sample


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--corrupt-rank", type=int)
    parser.add_argument("--ranks-per-host", type=int)
    parser.add_argument("--slow-sender", type=int)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--slow-device", type=lambda text: {int(r) for r in text.split(",")}, default=set())
    parser.add_argument("--report-written")
    parser.add_argument("--one-core", action="store_true")
    args, rest = parser.parse_known_args(argv)
    if args.one_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    rank = launcher.detect(need_master=False).rank
    if args.corrupt_rank is not None:
        _corrupt(args.corrupt_rank)
    if args.ranks_per_host:
        _pose_as_hosts(args.ranks_per_host)
    if args.slow_sender == rank:
        _slow_sender(args.delay)
    if rank in args.slow_device:
        _slow_device()
    status = cli.main(rest)
    if args.report_written and rank != 0 and not os.path.exists(args.report_written):
        print(f"error: rank {rank} left the job before rank 0 wrote {args.report_written}", file=sys.stderr)
        return REPORT_MISSING
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
