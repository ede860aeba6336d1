"""Test worker: ``app train`` with test-only hooks: a DDP comm hook that counts the gradient
all-reduces, and a simulated crash.

    python -m tests.integration.train_worker [--counts DIR] [--crash-at-step N --crash-rank R] <app train flags>

--counts DIR: each rank writes DIR/rank-N.json: {"allreduces": ..., "step": ...}.
--crash-at-step N: after optimizer step N (and its checkpoint, if one is due), on the first attempt
only (torchrun's restart count 0), rank R exits at once with status CRASH_EXIT_CODE, like a killed
process: no cleanup, no goodbye to its peers.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from app import flags
from app.runtime.distributed import DistConfig
from app.train.main import add_arguments, config_from_args, train
from app.train.trainer import Trainer

CRASH_EXIT_CODE = 17
"""Exit status of the simulated crash."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", type=Path)
    parser.add_argument("--crash-at-step", type=int, default=0)
    parser.add_argument("--crash-rank", type=int, default=0)
    add_arguments(parser)
    args = parser.parse_args(argv)
    calls = {"allreduces": 0}

    def counting_hook(_state, bucket):
        calls["allreduces"] += 1
        return default_hooks.allreduce_hook(None, bucket)

    def crash(trainer: Trainer, step: int) -> None:
        if step == args.crash_at_step and trainer.rank == args.crash_rank and trainer.ctx.proc.restart_count == 0:
            os._exit(CRASH_EXIT_CODE)

    def prepare(trainer: Trainer) -> None:
        calls["rank"] = trainer.rank
        if args.counts:
            trainer.ddp.register_comm_hook(None, counting_hook)
        if args.crash_at_step:
            trainer.step_hooks.append(crash)

    summary = train(config_from_args(args), flags.from_args(DistConfig, args), prepare=prepare)
    if args.counts:
        args.counts.mkdir(parents=True, exist_ok=True)
        rank = calls.pop("rank")
        (args.counts / f"rank-{rank}.json").write_text(json.dumps({**calls, "step": summary["step"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
