"""A torchrun script whose last rank (on a worker container) dies before a collective.

Used by test_cluster.py: the failure must reach `make cluster-up`'s exit status quickly,
although the head container (rank 0) did nothing wrong.
"""

import sys
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
if dist.get_rank() == dist.get_world_size() - 1:
    print("last rank: exiting with status 3 on purpose", flush=True)
    sys.exit(3)
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
