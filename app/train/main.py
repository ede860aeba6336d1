"""``python -m app train``: flags -> TrainConfig -> process group -> Trainer -> summary."""

import argparse
import json
from collections.abc import Callable

import torch.distributed as dist

from app import events, evict, flags, progress
from app.diagnostics import doctor
from app.errors import ClusterError, Stopped, first_line
from app.runtime.distributed import (
    DistConfig,
    DistContext,
    process_group,
    record_collectives,
    this_process,
)
from app.train import checkpoint, data, flight, models, resize, snapshot, stop, watch
from app.train.config import SECTIONS, TrainConfig
from app.train.report import Reporter
from app.train.sync import main_decides
from app.train.trainer import Trainer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app train``: one group per TrainConfig section, then the process group's."""
    parser.usage = "%(prog)s [--dataset digits] [--model mlp] [--epochs N] [--out DIR] [--resume auto] [options]"
    for section in SECTIONS.values():
        flags.add_arguments(parser, section)
    flags.add_arguments(parser, DistConfig)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig the flags describe (raises UsageError on a bad value)."""
    return TrainConfig(**{name: flags.from_args(section, args) for name, section in SECTIONS.items()})


def prepare_data(cfg: TrainConfig, ctx: DistContext) -> data.Dataset:
    """Load the dataset on every rank (one download per node first) and fit it to the model."""
    seed = cfg.steps.seed
    if cfg.data.download and dist.is_initialized():
        if ctx.proc.local_rank == 0:
            data.load(cfg.data, seed)
        dist.barrier()
    loaded = data.load(cfg.data, seed)
    return data.adapt_dataset(loaded, models.input_shape(cfg.model.model, loaded.shape))


def _resume_state(cfg: TrainConfig, identity: dict) -> tuple[tuple[dict, str] | None, int | None]:
    """On rank 0: the checkpoint to continue from, read and checked (None: start fresh), and the step
    that an earlier attempt in this folder reached (None: no record)."""
    out = cfg.output.out
    checkpoint.ensure_writable(out)
    reached = progress.reached(out)
    path = checkpoint.resolve_resume(out, cfg.output.resume)
    latest = None
    if path is not None:
        checkpoint.ensure_space(out, path)
        if cfg.output.resume == "auto" and (found := checkpoint.newest_that_loads(out)):
            path, state, skipped = found
            for line in skipped:  # a newer one torn: said, and skipped
                print(line, flush=True)
        else:
            state = checkpoint.load(path)
        checkpoint.check_identity(path, state, identity)
        latest = (state, str(path))
    if cfg.output.resume == "auto":  # the state the survivors of a failed collective kept, when newer
        latest = snapshot.newer(out, latest[0]["step"] if latest else -1, identity) or latest
    return latest, reached


def _earlier_summary(cfg: TrainConfig) -> dict | None:
    """summary.json of the run that finished in --out (None: none, or unreadable)."""
    try:
        return json.loads((cfg.output.out / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _nothing_left_line(cfg: TrainConfig, trainer: Trainer, earlier: dict) -> str:
    """A finished job run again: one line, and its earlier summary stays as it was."""
    o = cfg.steps
    limit = f"--max-steps {o.max_steps}" if o.max_steps and trainer.pos.step >= o.max_steps else f"{o.epochs} epochs"
    return (
        f"train: nothing left to do: {cfg.output.out} finished at step {trainer.pos.step} ({limit}; "
        f"test accuracy {earlier.get('test_accuracy', float('nan')):.4f}); its summary.json is kept: give more "
        "--epochs or --max-steps to train on, or another --out to start afresh"
    )


def train(cfg: TrainConfig, dist_cfg: DistConfig, prepare: Callable[[Trainer], None] | None = None) -> dict:
    """Join the group, train, and return the summary (the same on every rank).

    prepare: called with the Trainer before training starts, e.g. to register a DDP comm hook or
    append to ``trainer.step_hooks``.
    """
    models.require(cfg.model.model)  # torchvision missing: one line now, before the data is made
    proc = this_process(dist_cfg)
    doctor.preflight(proc, dist_cfg)  # a bad rendezvous: one line now, not a hang later
    dumps = record_collectives(cfg.output.out / "flight")  # torch's flight recorder, before the group
    with process_group(proc, dist_cfg) as ctx, Reporter.of(cfg.output, ctx.proc.is_main) as reporter:
        dataset = prepare_data(cfg, ctx)
        trainer = Trainer(cfg, ctx, dataset, reporter, step_hooks=[reporter.after_step])
        resume, reached = main_decides(lambda: _resume_state(cfg, trainer.identity), ctx.proc.is_main)
        change = None
        if resume is not None:  # on another number of ranks: the checkpoint's global batch is kept
            kept, state, change = resize.keep_global_batch(cfg, resume[0], ctx.proc.world_size, ctx.proc.num_nodes)
            resume = (state, resume[1])
            if kept is not cfg:  # another accumulation: the loader and DDP (static graph) are built for it
                cfg, trainer = kept, Trainer(kept, ctx, dataset, reporter, step_hooks=[reporter.after_step])
        trainer.progress = progress.Recorder(cfg.output.out) if ctx.proc.is_main else None
        if prepare is not None:
            prepare(trainer)
        if resume is not None:
            trainer.restore(*resume)
        if change is not None:
            reporter.resize(change, cfg.steps.batch_size)
        trainer.note_previous_attempt(reached)
        if trainer.finished and (earlier := main_decides(lambda: _earlier_summary(cfg), ctx.proc.is_main)):
            if ctx.proc.is_main:
                reporter.event("nothing_left", step=trainer.pos.step, resumed_from=trainer.resumed_from)
                print(_nothing_left_line(cfg, trainer, earlier), flush=True)
            return earlier
        recorder = flight.Recorder(dumps, ctx.proc.rank, dist_cfg.timeout_s, trainer.watch.stage, ctx.backend != "nccl")
        with stop.Stop() as trainer.stop:
            try:
                with recorder:
                    summary = trainer.fit()
            except Stopped as stopped:  # SIGTERM from the launcher, seen at a step boundary: keep the step, go
                ctx.mark_broken("stopped by SIGTERM")
                tail = snapshot.keep(trainer)
                line = f"train: stopped by SIGTERM after step {trainer.pos.step}{tail}" if tail else ""
                raise Stopped(line, stopped.status) from None
            except watch.Leave as leaving:  # app node's policy evicted this rank's node: its ranks leave here
                ctx.mark_broken("evicted")
                if ctx.proc.local_rank == 0:
                    print(leaving.eviction.line(0, "train"), flush=True)
                raise Stopped("", evict.LEFT) from None
            except RuntimeError as error:  # a collective that timed out or lost a peer: name the ranks that stopped
                if not watch.collective_failed(error):
                    raise
                ctx.mark_broken(first_line(error))
                line = _failed_collective(error, trainer, recorder, dumps)
                found = trainer.watch
                reason = events.PEERS_LOST if found.peers_lost else events.PEERS_STOPPED if found.peers_stopped else ""
                if (left := trainer.watch.left) and watch.lost_peer(error):  # the evicted node's ranks are gone
                    line = f"node {left.node} left the job (evicted at step {trainer.watch.exchanged_at}'s exchange)"
                    raise ClusterError(line + snapshot.write(trainer), evict.PEER_LEFT, reason) from error
                raise ClusterError(line + snapshot.write(trainer), reason=reason) from error
        reporter.finish(summary)
        return summary


def _failed_collective(error: RuntimeError, trainer: Trainer, recorder: flight.Recorder, dumps) -> str:
    """The line of a failed collective: the roll call, and after a timeout where the flight recorder saw
    the silent ranks (a peer whose connection was lost is gone: no dump of its will come); a rank that was
    itself stopped past the timeout says so and names no one."""
    if stopped := trainer.watch.stopped(error, recorder.timeout_s):
        return stopped
    if watch.lost_peer(error):
        return trainer.watch.explain(error, trainer.pos.step)
    recorder.dump(trainer.watch.stage()[0])  # this rank's side of the failed collective
    found = flight.read(dumps, trainer.world, trainer.watch.hosts)  # where the silent ranks were
    return "; ".join(filter(None, [trainer.watch.explain(error, trainer.pos.step), found]))


def run(args: argparse.Namespace) -> int:
    """Train on this rank; rank 0 prints and writes. Exit 0 when parameters ended identical everywhere."""
    summary = train(config_from_args(args), flags.from_args(DistConfig, args))
    if not summary["params_identical"]:
        raise ClusterError(
            f"parameters differ across ranks after training (max difference "
            f"{summary['param_spread']:g}): a rank diverged; check the backend and the devices"
        )
    return 0
