"""A torchrun script that runs an app command once a file exists: a test readies the cluster (shapes a link with tc)
before the measurement starts, then creates the file.

    python -m app cluster up --nodes 3 --nproc-per-node 1 --script tests/docker/jobs/app_after.py \
        --args '/results/go links --json /results/links/links.json'

Used by test_measure.py. Every rank waits for the file before it joins the process group (at most WAIT_S).
"""

import sys
import time
from pathlib import Path

from app import cli

WAIT_S = 600.0


def main(argv: list[str]) -> int:
    ready, deadline = Path(argv[0]), time.monotonic() + WAIT_S
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    return cli.main(argv[1:])


if __name__ == "__main__":
    cli.leave(main(sys.argv[1:]))
