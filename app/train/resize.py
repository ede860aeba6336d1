"""The global batch kept when a run resumes on another number of ranks (``--min-nodes`` in the spec).

    cfg, state, change = resize.keep_global_batch(cfg, state, world_size, nodes)   # app train, on resume
    reporter.resize(change)                                                          # one line + a record

A job that lost a node goes on with the ranks it has, from its last checkpoint; one that gets the
node back grows again. Either way the optimizer steps stay the same: the per-rank batch stays and
the accumulation takes up the difference (4 ranks x 64 -> 2 ranks x 64 x accum 2 = 256), and the
loader's order (``loader``: step s takes positions [s G, (s + 1) G) of the epoch's shuffle on any
world that keeps G) gives every step the same samples, so a run that shrank and grew ends where
an uninterrupted one does but for the order of float sums. A checkpoint taken mid-epoch continues
at the same optimizer step: its micro-batch position is converted to the new accumulation.

Kept when the run's ``--batch-size`` is the checkpoint's; a new ``--batch-size`` (allowed at an
epoch boundary) sets a new global batch from the flags, as before.
"""

from dataclasses import dataclass, replace

from app import events
from app.batch import keeps
from app.errors import ClusterError
from app.train.config import TrainConfig


@dataclass(frozen=True)
class Resize:
    """A change of the number of ranks at a resume."""

    was: int
    """Ranks of the checkpoint."""
    now: int
    """Ranks of this run."""
    step: int
    """The optimizer step the run continues from."""
    global_batch: int
    accum_was: int
    accum_now: int
    why: str

    def record(self) -> dict:
        """The ``resize`` record of metrics.jsonl."""
        return {
            **{"from": self.was, "to": self.now, "why": self.why, "step": self.step},
            **{"global_batch": self.global_batch, "accum_from": self.accum_was, "accum_to": self.accum_now},
        }

    def line(self, batch_size: int) -> str:
        """``train: resize: 4 -> 2 ranks at step 120 (...): global batch 256 kept as 64 x 2 ranks x accum 2``."""
        return (
            f"train: resize: {self.was} -> {self.now} ranks at step {self.step} ({self.why}): global batch "
            f"{self.global_batch} kept as per-rank batch {batch_size} x {self.now} ranks x accum {self.accum_now}"
        )


def keep_global_batch(cfg: TrainConfig, state: dict, world: int, nodes: int) -> tuple[TrainConfig, dict, Resize | None]:
    """``cfg`` and the checkpoint ``state`` for a run of ``world`` ranks on ``nodes`` nodes that keeps the
    checkpoint's global batch, and the change of size (None: the same world)."""
    was, batch, accum_was = state["world_size"], state["batch_size"], state["accum_steps"]
    s = cfg.steps
    if batch != s.batch_size or (was, accum_was) == (world, s.accum_steps):
        return cfg, state, None  # a new --batch-size sets a new global batch; or nothing changed
    kept = batch * was * accum_was
    if not keeps(kept, batch, world):
        fits = [n for n in range(1, kept // batch + 1) if kept // batch % n == 0]
        raise ClusterError(
            f"cannot keep the global batch {kept} on {world} ranks of per-rank batch {batch} ({kept} is not a "
            f"multiple of {batch * world}): run on {', '.join(map(str, fits))} ranks, or start a new run (--out) "
            "with another --batch-size",
            reason=events.BATCH_NOT_KEPT,
        )
    accum = kept // (batch * world)
    cfg = replace(cfg, steps=replace(s, accum_steps=accum))
    position = state["batch"] // accum_was * accum  # the same optimizer step of the epoch, in micro-batches
    state = {**state, "batch": position, "world_size": world, "accum_steps": accum}
    if was == world:
        return cfg, state, None
    why = f"the job restarted on {nodes} node(s); its checkpoint was taken on {was} ranks"
    return cfg, state, Resize(was, world, state["step"], kept, accum_was, accum, why)
