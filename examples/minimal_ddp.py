"""A plain torchrun script that knows nothing of this project: DDP on random data.

    torchrun --standalone --nproc-per-node 2 examples/minimal_ddp.py --steps 20
    make cluster-up SCRIPT=examples/minimal_ddp.py ARGS="--steps 20"

It shows that `make cluster-up SCRIPT=...` runs a user's script unchanged: torchrun
sets the usual environment, init_process_group("gloo") reads it.
"""

import argparse
import gc
import socket

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)
        model = DistributedDataParallel(torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        generator = torch.Generator().manual_seed(rank)
        for _ in range(args.steps):
            x = torch.randn(32, 8, generator=generator)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"minimal_ddp rank {rank}/{world} on {socket.gethostname()}: loss {loss.item():.4f}", flush=True)
        # DDP keeps replicas identical: every rank must hold rank 0's weights.
        weights = model.module.weight.detach().clone()
        dist.broadcast(weights, src=0)
        assert torch.equal(weights, model.module.weight.detach()), "replicas diverged"
        # DDP holds the process group: free it first, so that gloo's threads end while Python
        # is alive (left to interpreter shutdown, torch 2.13 may abort at exit).
        del model, optimizer
        gc.collect()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
