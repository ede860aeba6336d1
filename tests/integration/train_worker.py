"""Test worker: ``app train`` with test-only hooks: a DDP comm hook that counts the gradient
all-reduces, a simulated crash, dropout, a rank knocked off the others' parameters.

    python -m tests.integration.train_worker [--counts DIR] [--crash-at-step N --crash-rank R]
        [--term-at-step N --term-rank R ...] [--dropout P] [--nudge-at-step N --nudge-rank R] <app train flags>

--counts DIR: each rank writes DIR/rank-N.json: {"allreduces": ..., "step": ...}.
--crash-at-step N: after optimizer step N (and its checkpoint, if one is due), on the first attempt
only (torchrun's restart count 0), each --crash-rank (repeatable; 0 when none is given) exits at once
with status CRASH_EXIT_CODE, like a killed process: no cleanup, no goodbye to its peers.
--term-at-step N: after optimizer step N, on the first attempt only, each --term-rank sends itself
SIGTERM, as a launcher that stops its workers does (torchrun's agent at a new round, scancel).
--hang-at-step N: after optimizer step N, on the first attempt only, each --hang-rank sleeps an hour.
--dropout P: the model's input goes through dropout while it trains (torch's global RNG draws the mask; no
model of the app's uses that RNG while training, so only this shows whether a resumed run restores it).
--nudge-at-step N: after optimizer step N, --nudge-rank adds NUDGE to the first element of the model's first
parameter: that rank's parameters then differ from the others' by NUDGE.
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from app import cli, flags
from app.errors import Stopped
from app.runtime.distributed import DistConfig
from app.train.main import add_arguments, config_from_args, train
from app.train.trainer import Trainer

CRASH_EXIT_CODE = 17
"""Exit status of the simulated crash."""
NUDGE = 0.25
"""What --nudge-at-step adds to one parameter element of --nudge-rank."""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", type=Path)
    parser.add_argument("--crash-at-step", type=int, default=0)
    parser.add_argument("--crash-rank", type=int, action="append", default=[])
    parser.add_argument("--term-at-step", type=int, default=0)
    parser.add_argument("--term-rank", type=int, action="append", default=[])
    parser.add_argument("--hang-at-step", type=int, default=0)
    parser.add_argument("--hang-rank", type=int, action="append", default=[])
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--nudge-at-step", type=int, default=0)
    parser.add_argument("--nudge-rank", type=int, default=1)
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

    def nudge(trainer: Trainer, step: int) -> None:
        if step == args.nudge_at_step and trainer.rank == args.nudge_rank:
            with torch.no_grad():
                next(trainer.model.parameters()).view(-1)[0] += NUDGE

    def dropout(module: torch.nn.Module, inputs: tuple) -> tuple:
        return tuple(F.dropout(x, args.dropout, training=module.training) for x in inputs)

    def prepare(trainer: Trainer) -> None:
        calls["rank"] = trainer.rank
        if args.dropout:
            trainer.model.register_forward_pre_hook(dropout)
        if args.nudge_at_step:
            trainer.step_hooks.append(nudge)
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
    try:
        status = main(sys.argv[1:])
    finally:  # as python -m app does: a gloo group left to the interpreter's shutdown may abort the rank (SIGABRT)
        cli.release_process_groups()
    sys.exit(status)
