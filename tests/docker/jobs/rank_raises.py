"""A torchrun script whose rank 1 raises at every attempt (the head's second rank on the 2 x 2 cluster).

Used by test_cluster.py: its agent restarts it once (the first failure may be chance), sees the same failure
again and restarts no more; the job ends with the line that says so.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
print(f"rank {dist.get_rank()}/{dist.get_world_size()} up (restart {os.environ['TORCHELASTIC_RESTART_COUNT']})",
      flush=True)  # fmt: skip
if dist.get_rank() == 1:
    raise RuntimeError("boom on rank 1")
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
