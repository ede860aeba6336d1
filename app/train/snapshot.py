"""Emergency snapshots: when a collective fails, the survivors keep the step they all completed; a rank
stopped by its launcher (SIGTERM, ``stop.Stop``) keeps its own.

    line = trainer.watch.explain(error, trainer.pos.step)   # the roll call: who answers, and their last step
    line += snapshot.write(trainer)                         # the lowest rank that answered writes it, if they agree
    tail = snapshot.keep(trainer)                           # stopped at a step boundary: rank 0 writes it
    found = snapshot.newer(out, step)                       # at a resume (rank 0): (state, path) when newer
    gone = snapshot.retire(out, step)                       # the job finished (rank 0): the step it dropped

Under DDP every rank holds the whole state after each optimizer step: parameters, optimizer,
sampler position (epoch, batch, step). A collective that fails (a peer lost, a timeout) leaves the
ranks still alive at the step they last completed, whatever the last periodic checkpoint was. In
the roll call each survivor tells the others that step through the rendezvous store; the lowest of
those that completed the newest step writes its state to ``OUT/checkpoints/emergency.pt``
(atomic: temp file, fsync, rename) before the ranks exit, and the restarted job resumes from it
when it is newer than the latest checkpoint: at most the failed step is lost instead of
everything since the last checkpoint.

Trust. The survivors may differ by a step: a peer lost inside a ring all-reduce can leave one rank
with the whole result (its step completed) and another without (its step failed). A rank's
all-reduce returns only once every rank's gradients are summed into it, so a completed step is the
step of an uninterrupted run on every rank that completed it: the newest is kept (before this, a
disagreement kept nothing, and ``make bench-faults`` lost 1,292 and 1,420 steps to it in one run).
Nothing is written when a hook holds per-rank state (PowerSGD): the error line says so, and the
restart takes the last checkpoint. A snapshot that does not load (torn, foreign) or was made by
another kind of run is set aside with one line, and the restart takes the last checkpoint.
A job that finishes leaves no snapshot its final checkpoint supersedes: once that checkpoint is on disk
and reads back whole, rank 0 removes a snapshot of its step or older (one unlink, then the folder's fsync).
RNG: the writer's generator state only (the lost ranks' are gone); exact for training that draws
no random numbers (the MLP and CNN here), as every resume of this app is checked to be.
"""

from pathlib import Path

from app.atomic import atomic_remove, atomic_write_bytes
from app.errors import UsageError
from app.train import checkpoint, comm_hooks, sync

NAME = "emergency.pt"
"""The snapshot's file in OUT/checkpoints (not a step-*.pt: --keep-checkpoints never removes it)."""


def path_of(out: Path) -> Path:
    return checkpoint.directory(out) / NAME


def write(trainer) -> str:
    """After a failed collective and its roll call: write the snapshot when this rank is the lowest of those that
    answered with the newest completed step (this rank's). What happened, as the tail of the error line."""
    answers, step = trainer.watch.answers, trainer.pos.step
    if not answers:
        return ""
    newest = max(a.get("completed", -1) for a in answers.values())
    holders = sorted(r for r, a in answers.items() if a.get("completed", -1) == newest)
    if newest < 0 or step != newest or trainer.rank != holders[0]:
        return ""
    return _keep_state(trainer, holders)


def keep(trainer) -> str:
    """Stopped at a step boundary (``stop.Stop``): every rank says its step for the others' roll call;
    rank 0 keeps its state, whole at that boundary, without waiting for anyone. What happened, as the
    tail of rank 0's line (empty on the others)."""
    trainer.watch.announce(trainer.pos.step, stopped=True)
    return _keep_state(trainer, [trainer.rank]) if trainer.rank == 0 else ""


def _keep_state(trainer, agreed_by: list[int]) -> str:
    """Write this rank's state as the snapshot, atomically; what happened, as the tail of a line."""
    if comm_hooks.has_state(trainer.comm):
        return f"; no emergency snapshot: --comm-hook {trainer.comm.name} keeps state on every rank"
    state = trainer._state([sync.rng_state(trainer.ctx.device)], [], [trainer.epoch_sums()])
    state["snapshot"] = {"agreed_by": agreed_by, "world_size": trainer.world}
    target = path_of(trainer.cfg.output.out)
    try:
        atomic_write_bytes(target, checkpoint.encode(state))
    except OSError as error:
        return f"; no emergency snapshot: {target}: {error.strerror or error}"
    return f"; rank {trainer.rank} kept step {trainer.pos.step} in {target}"


def newer(out: Path, step: int, identity: dict) -> tuple[dict, str] | None:
    """The snapshot in ``out`` as (state, path) when it is newer than checkpoint step ``step`` (-1: none)
    and can be trusted; else None (one line when it is set aside)."""
    path = path_of(out)
    if not path.is_file():
        return None
    try:
        state = checkpoint.load(path)
        checkpoint.check_identity(path, state, identity)
    except UsageError as error:
        path.replace(path.with_suffix(".untrusted"))
        print(f"train: emergency snapshot set aside ({error}); resuming from the last checkpoint", flush=True)
        return None
    if state.get("step", -1) <= step:
        return None
    return state, str(path)


def retire(out: Path, step: int) -> int | None:
    """The job finished with its final checkpoint of ``step``: remove the snapshot when that checkpoint reads back
    whole and the snapshot is of ``step`` or older. The snapshot's step when it is removed; else None (none there,
    the checkpoint missing or torn, or a snapshot newer or unreadable: it stays for ``newer`` to judge)."""
    path = path_of(out)
    if not path.is_file():
        return None
    try:
        if checkpoint.load(checkpoint.path_for(out, step)).get("step") != step:
            return None
        kept = checkpoint.load(path).get("step", step + 1)
        if kept > step:
            return None
        atomic_remove(path)
    except (UsageError, OSError):
        return None
    return kept
