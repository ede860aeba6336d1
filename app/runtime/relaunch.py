"""Run an app command again on local ranks: what ``app bench`` and ``app scale`` do when started alone.

    python -m app bench            # one process: runs `torchrun --standalone --nproc-per-node 2 -m app bench`
                                   # (on a GPU machine: --nproc-per-node <its GPUs>, one rank per GPU)

The command gets exactly the arguments it was given, so every flag reaches the ranks; torchrun
picks its own free port (``--standalone``), so nothing else on the machine is in the way.
"""

import subprocess
import sys
from collections.abc import Sequence

import torch

from app.errors import ClusterError


def local_gpus() -> int:
    """GPUs this machine shows torch (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_ranks(cpu: int) -> int:
    """Local ranks to start: one per GPU on a GPU machine (so NCCL can run), else ``cpu``."""
    return local_gpus() or cpu


def relaunch(command: str, nproc: int, argv: Sequence[str], timeout: float) -> int:
    """``python -m app COMMAND ARGV`` under ``torchrun --standalone`` on ``nproc`` local ranks; its exit status."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    try:
        return subprocess.run([*cmd, "-m", "app", command, *argv], timeout=timeout, check=False).returncode
    except subprocess.TimeoutExpired:
        raise ClusterError(f"{command} did not finish within --launch-timeout {timeout:g}s") from None
