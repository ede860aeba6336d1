"""A rank that says how it started, for tests/integration/test_node.py: one JSON line on stdout.

    python -m app node --records DIR -- --standalone --nproc-per-node 2 tests/integration/node_job.py a b

``--raise-on-rank R DIR``: rank R raises instead, once rank 0 has reported in this attempt (a file in DIR says
so): the agent stops the other ranks when R fails, so rank 0's line is there at every attempt, whatever the load.
``--os-exit S``: every rank leaves with ``os._exit(S)``.
It reads nothing of torch before it looks: what a fork of app node's preloaded server already holds
shows in ``sys.modules``; its parent is that server (or torchrun's agent, for a new interpreter).
"""

import json
import os
import sys
import time
from pathlib import Path

preloaded = "torch._dynamo" in sys.modules
REPORT_WAIT_S = 120
"""How long rank R waits for rank 0's report before it says that it did not come."""


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().replace(b"\0", b" ").decode().strip()


def reported() -> Path | None:
    """The file by which rank 0 says it reported in this attempt, with --raise-on-rank."""
    if sys.argv[1:2] != ["--raise-on-rank"]:
        return None
    return Path(sys.argv[3]) / f"reported-{os.environ['TORCHELASTIC_RESTART_COUNT']}"


if __name__ == "__main__":
    import torch

    rank, marker = os.environ["RANK"], reported()
    if marker and rank == sys.argv[2]:
        deadline = time.monotonic() + REPORT_WAIT_S
        while rank != "0" and not marker.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"rank 0 did not report within {REPORT_WAIT_S} s")
            time.sleep(0.05)
        raise RuntimeError(f"boom on rank {rank}")
    report = json.dumps({
        "rank": int(os.environ["RANK"]),
        "world": int(os.environ["WORLD_SIZE"]),
        "preloaded": preloaded,
        "threads": torch.get_num_threads(),
        "argv": sys.argv,
        "title": cmdline(os.getpid()),
        "parent": cmdline(os.getppid()),
    })  # fmt: skip
    os.write(1, f"{report}\n".encode())  # one write, under PIPE_BUF: the ranks' lines never interleave
    if marker and rank == "0":
        marker.touch()
    if sys.argv[1:2] == ["--os-exit"]:
        os._exit(int(sys.argv[2]))  # no teardown, as `python -m app` leaves
