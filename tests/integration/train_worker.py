"""Test worker: ``app train`` with test-only hooks: a DDP comm hook that counts the gradient
all-reduces, and a simulated crash.

    python -m tests.integration.train_worker [--counts DIR] [--crash-at-step N --crash-rank R]
        [--term-at-step N --term-rank R ...] <app train flags>

--counts DIR: each rank writes DIR/rank-N.json: {"allreduces": ..., "step": ...}.
--crash-at-step N: after optimizer step N (and its checkpoint, if one is due), on the first attempt
only (torchrun's restart count 0), each --crash-rank (repeatable; 0 when none is given) exits at once
with status CRASH_EXIT_CODE, like a killed process: no cleanup, no goodbye to its peers.
--term-at-step N: after optimizer step N, on the first attempt only, each --term-rank sends itself
SIGTERM, as a launcher that stops its workers does (torchrun's agent at a new round, scancel).
--hang-at-step N: after optimizer step N, on the first attempt only, each --hang-rank sleeps an hour.
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from app import flags
from app.errors import Stopped
from app.runtime.distributed import DistConfig
from app.train.main import add_arguments, config_from_args, train
from app.train.trainer import Trainer

CRASH_EXIT_CODE = 17
"""Exit status of the simulated crash."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", type=Path)
    parser.add_argument("--crash-at-step", type=int, default=0)
    parser.add_argument("--crash-rank", type=int, action="append", default=[])
    parser.add_argument("--term-at-step", type=int, default=0)
    parser.add_argument("--term-rank", type=int, action="append", default=[])
    parser.add_argument("--hang-at-step", type=int, default=0)
    parser.add_argument("--hang-rank", type=int, action="append", default=[])
    add_arguments(parser)
    args = parser.parse_args(argv)
    calls = {"allreduces": 0}

    def counting_hook(_state, bucket):
        calls["allreduces"] += 1
        return default_hooks.allreduce_hook(None, bucket)

    def first_attempt_at(trainer: Trainer, step: int, at: int, ranks: list[int]) -> bool:
        return step == at and trainer.rank in ranks and trainer.ctx.proc.restart_count == 0

    def crash(trainer: Trainer, step: int) -> None:
        if first_attempt_at(trainer, step, args.crash_at_step, args.crash_rank or [0]):
            os._exit(CRASH_EXIT_CODE)

    def term(trainer: Trainer, step: int) -> None:
        if first_attempt_at(trainer, step, args.term_at_step, args.term_rank):
            os.kill(os.getpid(), signal.SIGTERM)

    def hang(trainer: Trainer, step: int) -> None:
        if first_attempt_at(trainer, step, args.hang_at_step, args.hang_rank):
            time.sleep(3600)

    def prepare(trainer: Trainer) -> None:
        calls["rank"] = trainer.rank
        if args.counts:
            trainer.ddp.register_comm_hook(None, counting_hook)
        if args.crash_at_step:
            trainer.step_hooks.append(crash)
        trainer.step_hooks += [term, hang]

    try:
        summary = train(config_from_args(args), flags.from_args(DistConfig, args), prepare=prepare)
    except Stopped as stopped:  # as app.cli says it
        print(stopped, file=sys.stderr)
        return stopped.status
    if args.counts:
        args.counts.mkdir(parents=True, exist_ok=True)
        rank = calls.pop("rank")
        (args.counts / f"rank-{rank}.json").write_text(json.dumps({**calls, "step": summary["step"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
