"""``python -m app train``: flags -> TrainConfig -> process group -> Trainer -> summary."""

import argparse
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path

import torch.distributed as dist

from app.errors import ClusterError
from app.platform import doctor, launcher
from app.platform.distributed import add_dist_arguments, dist_config_from_args, process_group
from app.platform.launcher import ProcessInfo
from app.train import checkpoint, data, models
from app.train.collective import main_decides
from app.train.config import (
    DATASETS,
    LOADERS,
    MODELS,
    OPTIMIZER_IMPLS,
    OPTIMIZERS,
    PRECISIONS,
    DataConfig,
    DDPConfig,
    OptimConfig,
    RunConfig,
    TrainConfig,
    parse_shape,
)
from app.train.report import Reporter
from app.train.trainer import Trainer


def add_speed_arguments(group) -> None:
    """The flags that decide speed; ``app bench`` takes the same ones."""
    d, o, k = DataConfig(), OptimConfig(), DDPConfig()
    group.add_argument(
        "--loader",
        metavar="KIND",
        default=d.loader,
        help=f"{' | '.join(LOADERS)}: batches indexed from memory (default, fast) or torch DataLoader "
        "(workers, pinned memory on GPU)",
    )
    group.add_argument(
        "--optimizer-impl",
        metavar="KIND",
        default=o.optimizer_impl,
        help=f"{' | '.join(OPTIMIZER_IMPLS)}: optimizer kernels (default {o.optimizer_impl})",
    )
    group.add_argument(
        "--bucket-cap-mb", metavar="MB", type=float, default=k.bucket_cap_mb, help="gradient bucket MiB (default 25)"
    )
    group.add_argument(
        "--gradient-as-bucket-view",
        action=argparse.BooleanOptionalAction,
        default=k.gradient_as_bucket_view,
        help="gradients alias the buckets (default on)",
    )
    group.add_argument(
        "--static-graph",
        action=argparse.BooleanOptionalAction,
        default=k.static_graph,
        help="the same graph every step (default on; off with --accum-steps > 1)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app train`` (stable: --dataset --model --epochs --out --resume)."""
    parser.usage = "%(prog)s [--dataset digits] [--model mlp] [--epochs N] [--out DIR] [--resume auto] [options]"
    d, o, r = DataConfig(), OptimConfig(), RunConfig()
    g = parser.add_argument_group("data")
    g.add_argument(
        "--dataset",
        metavar="NAME",
        default=d.dataset,
        help=f"{' | '.join(DATASETS)} (default {d.dataset}: scikit-learn's handwritten digits, no network needed)",
    )
    g.add_argument(
        "--data-dir", metavar="DIR", type=Path, help="folder with MNIST/raw/ or cifar-10-batches-py/ (mnist, cifar10)"
    )
    g.add_argument("--download", action="store_true", help="download mnist/cifar10 into --data-dir when missing")
    g.add_argument(
        "--input-shape", metavar="CxHxW", default="1x28x28", help="synthetic sample shape CxHxW (default 1x28x28)"
    )
    g.add_argument("--num-classes", metavar="N", type=int, default=d.num_classes, help="synthetic classes (default 10)")
    g.add_argument("--train-samples", metavar="N", type=int, default=d.train_samples, help="synthetic training samples")
    g.add_argument("--test-samples", metavar="N", type=int, default=d.test_samples, help="synthetic test samples")
    g.add_argument(
        "--workers", metavar="N", type=int, default=d.workers, help="DataLoader workers with --loader dataloader"
    )
    g = parser.add_argument_group("model and optimisation")
    g.add_argument(
        "--model",
        metavar="NAME",
        default=o.model,
        help=f"{' | '.join(MODELS)} (default {o.model}, the seed's 784-256-10)",
    )
    g.add_argument(
        "--optimizer", metavar="NAME", default=o.optimizer, help=f"{' | '.join(OPTIMIZERS)} (default {o.optimizer})"
    )
    g.add_argument("--lr", metavar="LR", type=float, default=o.lr, help=f"learning rate (default {o.lr:g})")
    g.add_argument("--weight-decay", metavar="WD", type=float, default=o.weight_decay, help="weight decay (default 0)")
    g.add_argument(
        "--batch-size", metavar="N", type=int, default=o.batch_size, help=f"per-rank batch (default {o.batch_size})"
    )
    g.add_argument(
        "--accum-steps",
        metavar="K",
        type=int,
        default=o.accum_steps,
        help="micro-batches per optimizer step; all-reduce on the last only (default 1)",
    )
    g.add_argument("--epochs", metavar="N", type=int, default=o.epochs, help=f"epochs (default {o.epochs})")
    g.add_argument(
        "--max-steps", metavar="N", type=int, default=o.max_steps, help="stop after N optimizer steps (0: no limit)"
    )
    g.add_argument(
        "--precision",
        metavar="P",
        default=o.precision,
        help=f"{' | '.join(PRECISIONS)} (default fp32; fp16 needs CUDA)",
    )
    g.add_argument(
        "--seed", metavar="N", type=int, default=o.seed, help="seed of weights, synthetic data and shuffle (default 0)"
    )
    g = parser.add_argument_group("DDP and speed (defaults chosen with python -m app bench --sweep)")
    add_speed_arguments(g)
    g.add_argument("--sync-bn", action="store_true", help="BatchNorm -> SyncBatchNorm (CUDA)")
    g = parser.add_argument_group("output and checkpoints")
    g.add_argument(
        "--out",
        metavar="DIR",
        type=Path,
        default=r.out,
        help=f"output folder (default {r.out}/): checkpoints/, metrics.jsonl, summary.json",
    )
    g.add_argument(
        "--resume",
        metavar="none|auto|PATH",
        default=r.resume,
        help="none (default; refuses to overwrite checkpoints), auto (latest in OUT/checkpoints, if any) or PATH",
    )
    g.add_argument(
        "--checkpoint-every",
        metavar="N",
        type=int,
        default=r.checkpoint_every,
        help="also checkpoint every N optimizer steps (default 0: epoch ends and the end)",
    )
    g.add_argument(
        "--checkpoint-every-epochs",
        metavar="N",
        type=int,
        default=r.checkpoint_every_epochs,
        help="checkpoint every N epochs (default 1; 0: only the end)",
    )
    g.add_argument(
        "--keep-checkpoints", metavar="N", type=int, default=r.keep_checkpoints, help="newest to keep (default 3)"
    )
    g.add_argument("--quiet", action="store_true", help="print only the final summary line")
    g.add_argument("--crash-at-step", type=int, default=0, help=argparse.SUPPRESS)
    g.add_argument("--crash-rank", type=int, default=0, help=argparse.SUPPRESS)
    add_dist_arguments(parser)


def _section(cls, args: argparse.Namespace, **given):
    """A config section from the flags of the same names (``given`` overrides)."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if f.name not in given}, **given)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig the flags describe (raises UsageError on a bad value)."""
    return TrainConfig(
        data=_section(DataConfig, args, input_shape=parse_shape(args.input_shape)),
        optim=_section(OptimConfig, args),
        ddp=_section(DDPConfig, args),
        run=_section(RunConfig, args),
    )


def prepare_data(cfg: TrainConfig, proc: ProcessInfo) -> data.Dataset:
    """Load the dataset on every rank (one download per node first) and fit it to the model."""
    if cfg.data.download and dist.is_initialized():
        if proc.local_rank == 0:
            data.load(cfg.data, cfg.optim.seed)
        dist.barrier()
    loaded = data.load(cfg.data, cfg.optim.seed)
    return data.adapt_dataset(loaded, models.input_shape(cfg.optim.model, loaded.shape))


def _resume_state(cfg: TrainConfig, identity: dict) -> tuple[dict, str] | None:
    """On rank 0: the checkpoint to continue from, read and checked, or None to start fresh."""
    checkpoint.ensure_writable(cfg.run.out)
    path = checkpoint.resolve_resume(cfg.run.out, cfg.run.resume)
    if path is None:
        return None
    state = checkpoint.load(path)
    checkpoint.check_identity(path, state, identity)
    return state, str(path)


def train(
    cfg: TrainConfig, proc: ProcessInfo, args: argparse.Namespace, prepare: Callable[[Trainer], None] | None = None
) -> dict:
    """Join the group, train, and return the summary (the same on every rank).

    prepare: called with the Trainer before training starts (e.g. to register a DDP comm hook).
    """
    with process_group(proc, dist_config_from_args(args)) as ctx:
        dataset = prepare_data(cfg, proc)
        trainer = Trainer(cfg, ctx, dataset, Reporter(cfg.run.out, proc.is_main, cfg.run.quiet))
        if prepare is not None:
            prepare(trainer)
        resume = main_decides(lambda: _resume_state(cfg, trainer.identity), proc.is_main)
        if resume is not None:
            trainer.restore(*resume)
        summary = trainer.fit()
        trainer.reporter.finish(summary)
        return summary


def run(args: argparse.Namespace) -> int:
    """Train on this rank; rank 0 prints and writes. Exit 0 when parameters ended identical everywhere."""
    cfg = config_from_args(args)
    proc = launcher.detect(need_master=args.init_method is None)
    doctor.preflight(proc, dist_config_from_args(args))  # a bad rendezvous: one line now, not a hang later
    summary = train(cfg, proc, args)
    if not summary["params_identical"]:
        raise ClusterError(
            f"parameters differ across ranks after training (max difference "
            f"{summary['param_spread']:g}): a rank diverged; check the backend and the devices"
        )
    return 0
