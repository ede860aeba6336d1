"""A job's global batch (per-rank batch x ranks x accumulation) and the worlds that keep it: app train keeps it on a
resume on another number of ranks (app/train/resize.py), an eviction only leaves ranks that keep it (app/evict.py),
and the cluster spec refuses an elastic job that some world it may shrink to cannot keep (``check_shrink``). The
per-rank batch stays; the accumulation takes the difference. Needs no torch.

    python -m app topology --nodes 3 --nproc-per-node 1 --min-nodes 2 --command 'train --accum-steps 2'
"""

import argparse
import math
import shlex

from app.errors import UsageError

BATCH_SIZE, ACCUM_STEPS = 64, 1
"""app train's --batch-size and --accum-steps when not given (its StepsConfig's defaults)."""


def keeps(global_batch: int, per_rank: int, ranks: int) -> bool:
    """A world of ``ranks`` keeps ``global_batch`` at this per-rank batch (a whole accumulation)."""
    return global_batch % (per_rank * ranks) == 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def steps_of(command: str) -> tuple[int, int] | None:
    """The per-rank batch and the accumulation of an ``app train`` command line; None for another command."""
    words = shlex.split(command)
    if words[:1] != ["train"]:
        return None
    parser = _Parser(add_help=False, allow_abbrev=False)
    parser.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    parser.add_argument("--accum-steps", type=int, default=ACCUM_STEPS)
    try:
        known, _ = parser.parse_known_args(words[1:])
        for flag, value in (("--batch-size", known.batch_size), ("--accum-steps", known.accum_steps)):
            if value < 1:
                raise UsageError(f"{flag} {value} must be >= 1")
    except UsageError as error:
        raise UsageError(f"--command {command!r}: {error}") from None
    return known.batch_size, known.accum_steps


def check_shrink(command: str, nodes: int, min_nodes: int, nproc: int) -> None:
    """An elastic job's train command keeps its global batch on every smaller world it may go on with (``min_nodes``
    to ``nodes`` - 1 nodes), else a UsageError naming the batch and the --accum-steps that fits."""
    steps = steps_of(command)
    if steps is None or min_nodes >= nodes:
        return
    b, a = steps
    kept = b * nproc * nodes * a
    unkept = [n for n in range(min_nodes, nodes) if not keeps(kept, b, n * nproc)]
    if not unkept:
        return
    step = math.lcm(*(n // math.gcd(n, nodes) for n in range(min_nodes, nodes)))  # accum steps every world keeps
    fit = step * -(-a // step)  # the least of them from --accum-steps on
    same = f" or --batch-size {b * a // fit} --accum-steps {fit} (global batch {kept} kept)" if b * a % fit == 0 else ""
    raise UsageError(
        f"--min-nodes {min_nodes}: the global batch {kept} (per-rank batch {b} x {nodes * nproc} ranks x accum {a}) "
        f"cannot be kept on {' or '.join(map(str, unkept))} node(s), where the per-rank batch stays: give the train "
        f"command --accum-steps {fit} (global batch {b * nproc * nodes * fit}){same}, a batch that every world from "
        f"{min_nodes} to {nodes} nodes divides"
    )
