"""Test worker: an app command on a machine with as many GPUs as the test says (none are real).

    python -m tests.integration.gpu_worker --gpus N <app command and flags>
    torchrun --standalone --nproc-per-node 2 -m tests.integration.gpu_worker --gpus 1 check

torch.cuda.is_available and torch.cuda.device_count are replaced in this process only, so that the
backend rule and the doctor see N GPUs; nothing may touch a real CUDA device, which is why the
cases that run here are the ones that end on gloo or in a usage error before the process group.
"""

import argparse
import sys

import torch

from app import cli


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--gpus", type=int, required=True)
    args, rest = parser.parse_known_args(argv)
    torch.cuda.is_available = lambda: args.gpus > 0
    torch.cuda.device_count = lambda: args.gpus
    return cli.main(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
