"""Benchmark: samples/s of ``app train`` against a plain tutorial-style DDP loop, same data, same ranks.

    python -m app bench                                   # starts 2 local ranks itself (torchrun --standalone)
    python -m app bench --nproc-per-node 4 --json bench.json
    torchrun --standalone --nproc-per-node 2 -m app bench # under any launcher: the ranks it gives
    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python -m app bench

The tutorial loop is the seed's: the MLP (784-256-10), Adam, batch 64 per rank, a DataLoader over
a TensorDataset with DistributedSampler, DDP with its defaults, ``loss.item()`` every step. The
``app train`` side runs the real Trainer, epoch by epoch through ``Trainer.train_epoch`` as ``fit``
does, with app train's DDP and speed settings (its defaults, or the same flags given here), its
step-time exchange and rank 0's record of each step (OUT/progress, in a temp folder) on the same
synthetic samples. The one-process loop is app train on rank 0 alone (no DDP: a world of
one), while the other ranks wait: perfect scaling is N times its samples/s. Each round times one
epoch of every loop back to back, so that a busy machine slows them alike; the ratio is the median
over rounds of app / tutorial in the same round, the scaling the median of app / (N x one process),
the samples/s the median over rounds. Rank 0 prints samples/s of each, the ratio and the scaling.
Started as one process, it runs itself again under torchrun with exactly the arguments it was
given, so every flag (the speed settings, ``--ifname``, ``--timeout``...) reaches the ranks.
"""

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from app import flags, progress
from app.atomic import atomic_write_text
from app.errors import UsageError
from app.runtime.distributed import (
    DistContext,
    add_dist_arguments,
    dist_config_from_args,
    first_ranks,
    process_group,
    this_process,
)
from app.runtime.relaunch import relaunch
from app.topology.spec import Nodes
from app.train import data, models, sync
from app.train.config import DataConfig, ModelConfig, OutputConfig, SpeedConfig, StepsConfig, TrainConfig
from app.train.report import Reporter
from app.train.trainer import Trainer

BATCH = 64
SHAPE = (1, 28, 28)


@dataclass(frozen=True)
class BenchConfig:
    """Benchmark."""

    nproc_per_node: int = Nodes.nproc_per_node
    """Ranks to start with torchrun --standalone when run as one process."""
    samples: int = 8192
    """Synthetic training samples."""
    rounds: int = 11
    """Timed epochs of each loop, alternating."""
    json: Path | None = None
    """Also write the figures as JSON to this file."""
    sweep: bool = False
    """Also time app train with each speed setting changed on its own."""
    launch_timeout: float = field(default=600.0, metadata=flags.flag(metavar="S"))
    """Seconds before the ranks it started are stopped."""

    def __post_init__(self) -> None:
        for name, value, least in (
            ("--nproc-per-node", self.nproc_per_node, 1),
            ("--samples", self.samples, BATCH),
            ("--rounds", self.rounds, 1),
        ):
            if value < least:
                raise UsageError(f"{name} {value} must be >= {least}")
        if self.launch_timeout <= 0:
            raise UsageError(f"--launch-timeout {self.launch_timeout:g} must be > 0 seconds")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app bench``: its own, app train's DDP and speed settings, the process group's."""
    flags.add_arguments(parser, BenchConfig)
    flags.add_arguments(parser, SpeedConfig)
    add_dist_arguments(parser)


def train_config(bench: BenchConfig, speed: SpeedConfig) -> TrainConfig:
    """app train's configuration on the benchmark's data: the seed's MLP and batch, ``speed`` as given."""
    return TrainConfig(
        data=DataConfig(dataset="synthetic", input_shape=SHAPE, train_samples=bench.samples, test_samples=BATCH),
        model=ModelConfig(model="mlp"),
        steps=StepsConfig(batch_size=BATCH),
        speed=speed,
        output=OutputConfig(out=Path("."), tensorboard=False, quiet=True),
    )


def variants(cfg: TrainConfig, sweep: bool) -> dict[str, TrainConfig]:
    """The app configurations to time: ``cfg`` alone, or with --sweep each knob changed on its own."""
    if not sweep:
        return {"app": cfg}
    changes = {
        "static_graph off": {"static_graph": False},
        "gradient_as_bucket_view off": {"gradient_as_bucket_view": False},
        "bucket_cap_mb 0.25 (2 buckets)": {"bucket_cap_mb": 0.25},
        "optimizer foreach": {"optimizer_impl": "foreach"},
        "optimizer loop": {"optimizer_impl": "loop"},
        "loader dataloader": {"loader": "dataloader"},
        "comm_hook fp16": {"comm_hook": "fp16"},
        "comm_hook powersgd": {"comm_hook": "powersgd"},
    }
    return {"app": cfg} | {name: replace(cfg, speed=replace(cfg.speed, **change)) for name, change in changes.items()}


class TutorialLoop:
    """The seed's loop, as the tutorials write it."""

    def __init__(self, ctx: DistContext, split: data.Split) -> None:
        torch.manual_seed(0)
        self.device = ctx.device
        model = models.mlp().to(ctx.device)
        self.model = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        dataset = TensorDataset(split.x, split.y)
        self.sampler = DistributedSampler(dataset, num_replicas=ctx.proc.world_size, rank=ctx.proc.rank)
        self.loader = DataLoader(dataset, batch_size=BATCH, sampler=self.sampler)

    def timed_epoch(self, epoch: int) -> tuple[int, float]:
        """Train one epoch: (samples, seconds)."""
        self.sampler.set_epoch(epoch)
        self.model.train()
        samples, total_loss = 0, 0.0
        start = time.perf_counter()
        for x, y in self.loader:
            x, y = x.to(self.device), y.to(self.device)
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            total_loss += loss.item()
            samples += y.shape[0]
        return samples, time.perf_counter() - start


def _trainer_epoch(trainer: Trainer | None) -> Callable[[int], tuple[int, float]]:
    """An app train epoch as the benchmark times it: the Trainer's next epoch, as ``fit`` runs it (None: none here)."""

    def timed_epoch(_epoch: int) -> tuple[int, float]:
        if trainer is None:
            return 0, 0.0
        stats = trainer.train_epoch()
        return stats.samples, stats.seconds

    return timed_epoch


def _rate(timed_epoch: Callable[[int], tuple[int, float]], epoch: int, ctx: DistContext) -> float:
    """Global samples/s of one epoch (samples summed over ranks, time of the slowest rank)."""
    samples, seconds = timed_epoch(epoch)
    (total,) = sync.all_sum([samples], ctx.device)
    (slowest,) = sync.all_reduce([seconds], ctx.device, "max")
    return total / slowest


def _app_trainer(cfg: TrainConfig, ctx: DistContext, dataset: data.Dataset, quiet: Reporter) -> Trainer:
    """The Trainer as app train runs it: rank 0 also records each step in OUT/progress (one pwrite)."""
    trainer = Trainer(cfg, ctx, dataset, quiet)
    if ctx.proc.is_main:
        trainer.progress = progress.Recorder(cfg.output.out)
    return trainer


def measure(ctx: DistContext, configs: dict[str, TrainConfig], rounds: int) -> dict:
    """Warm every loop up, then time one epoch of each in turn, ``rounds`` times; medians."""
    first = next(iter(configs.values()))
    dataset = data.synthetic(first.data)
    quiet = Reporter(first.output.out, enabled=False)
    alone = first_ranks(ctx, [1])[1]  # rank 0 as a world of its own; None on the others
    runners = {"tutorial": TutorialLoop(ctx, dataset.train).timed_epoch}
    runners |= {name: _trainer_epoch(_app_trainer(cfg, ctx, dataset, quiet)) for name, cfg in configs.items()}
    runners["one process"] = _trainer_epoch(_app_trainer(first, alone, dataset, quiet) if alone else None)
    rates: dict[str, list[float]] = {name: [] for name in runners}
    for epoch in range(rounds + 1):
        for name, runner in runners.items():
            rate = _rate(runner, epoch, ctx)
            if epoch > 0:  # epoch 0 warms up
                rates[name].append(rate)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    ratios = {
        name: statistics.median(a / t for a, t in zip(rates[name], rates["tutorial"], strict=True)) for name in configs
    }
    world = ctx.proc.world_size
    scaling = statistics.median(a / (world * o) for a, o in zip(rates["app"], rates["one process"], strict=True))
    return {
        "world_size": ctx.proc.world_size,
        "backend": ctx.backend,
        "device": str(ctx.device),
        "samples": first.data.train_samples,
        "batch_per_rank": BATCH,
        "rounds": rounds,
        "threads_per_rank": torch.get_num_threads(),
        "tutorial_samples_per_s": medians["tutorial"],
        "app_samples_per_s": medians["app"],
        "ratio": ratios["app"],
        "one_process_samples_per_s": medians["one process"],
        "scaling": scaling,
        "app_settings": _settings(first),
        "variants": {
            name: {"samples_per_s": medians[name], "ratio": ratios[name], "settings": _settings(cfg)}
            for name, cfg in configs.items()
        },
        "all_rates": rates,
    }


def _settings(cfg: TrainConfig) -> dict:
    return vars(cfg.speed)


def format_report(r: dict) -> str:
    s = r["app_settings"]
    ranks = f"{r['world_size']} ranks ({r['backend']} on {r['device']}, {r['threads_per_rank']} thread(s) each)"
    data = f"{r['samples']} synthetic samples, medians of {r['rounds']} rounds"
    app = (
        f"loader {s['loader']}, {s['optimizer_impl']} Adam, bucket {s['bucket_cap_mb']:g} MiB, "
        f"gradient_as_bucket_view {s['gradient_as_bucket_view']}, static_graph {s['static_graph']}, "
        f"comm hook {s['comm_hook']}"
    )
    lines = [
        f"bench: {ranks}, mlp, batch {r['batch_per_rank']}/rank, {data}",
        f"  {'tutorial loop (DataLoader, DistributedSampler, Adam, DDP defaults)':<68} "
        f"{r['tutorial_samples_per_s']:8.0f} samples/s",
        f"  {'app train':<68} {r['app_samples_per_s']:8.0f} samples/s  {r['ratio']:.2f}x",
        f"  {'app train, one process (rank 0 alone, no DDP)':<68} {r['one_process_samples_per_s']:8.0f} samples/s",
    ]
    lines += [
        f"  {'app train, ' + name:<68} {v['samples_per_s']:8.0f} samples/s  {v['ratio']:.2f}x"
        for name, v in r["variants"].items()
        if name != "app"
    ]
    lines += [
        f"  app train settings: {app}",
        f"ratio app/tutorial: {r['ratio']:.2f}x (median of per-round ratios)",
        f"scaling app/({r['world_size']} x one process): {100 * r['scaling']:.0f}% of perfect "
        "(median of per-round ratios)",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Relaunch under torchrun when alone, else measure on these ranks; rank 0 reports."""
    bench, dist_cfg = flags.from_args(BenchConfig, args), dist_config_from_args(args)
    cfg = train_config(bench, flags.from_args(SpeedConfig, args))
    proc = this_process(dist_cfg)
    if proc.world_size == 1 and bench.nproc_per_node > 1:
        return relaunch("bench", bench.nproc_per_node, args.argv, bench.launch_timeout)
    with process_group(proc, dist_cfg) as ctx, tempfile.TemporaryDirectory(prefix="ddp-bench-") as out:
        cfg = replace(cfg, output=replace(cfg.output, out=Path(out)))  # for OUT/progress
        report = measure(ctx, variants(cfg, bench.sweep), bench.rounds)
    if proc.is_main:
        print(format_report(report), flush=True)
        if bench.json:
            atomic_write_text(bench.json, json.dumps(report, indent=2) + "\n")
    return 0
