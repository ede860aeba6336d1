"""A rank that says how it started, for tests/integration/test_node.py: one JSON line on stdout.

    python -m app node --records DIR -- --standalone --nproc-per-node 2 tests/integration/node_job.py a b

``--raise-on-rank R``: rank R raises instead; ``--os-exit S``: every rank leaves with ``os._exit(S)``.
It reads nothing of torch before it looks: what a fork of app node's preloaded server already holds
shows in ``sys.modules``; its parent is that server (or torchrun's agent, for a new interpreter).
"""

import json
import os
import sys

preloaded = "torch._dynamo" in sys.modules


def cmdline(pid: int) -> str:
    with open(f"/proc/{pid}/cmdline", "rb") as handle:
        return handle.read().replace(b"\0", b" ").decode().strip()


if __name__ == "__main__":
    import torch

    if sys.argv[1:2] == ["--raise-on-rank"] and os.environ["RANK"] == sys.argv[2]:
        raise RuntimeError(f"boom on rank {os.environ['RANK']}")
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
    if sys.argv[1:2] == ["--os-exit"]:
        os._exit(int(sys.argv[2]))  # no teardown, as `python -m app` leaves
