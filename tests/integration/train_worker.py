"""Test worker: ``app train`` with a DDP comm hook that counts the gradient all-reduces.

    python -m tests.integration.train_worker --counts DIR <app train flags>

Each rank writes DIR/rank-N.json: {"allreduces": ..., "step": ...}.
"""

import argparse
import json
import sys
from pathlib import Path

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from app.platform import launcher
from app.train.main import add_arguments, config_from_args, train


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", type=Path, required=True)
    add_arguments(parser)
    args = parser.parse_args(argv)
    calls = {"allreduces": 0}

    def counting_hook(_state, bucket):
        calls["allreduces"] += 1
        return default_hooks.allreduce_hook(None, bucket)

    proc = launcher.detect(need_master=False)
    summary = train(
        config_from_args(args), proc, args, prepare=lambda trainer: trainer.ddp.register_comm_hook(None, counting_hook)
    )
    args.counts.mkdir(parents=True, exist_ok=True)
    (args.counts / f"rank-{proc.rank}.json").write_text(json.dumps({**calls, "step": summary["step"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
