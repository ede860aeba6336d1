"""Benchmark: samples/s of ``app train`` against a plain tutorial-style DDP loop, same data, same ranks.

    python -m app bench                                   # starts 2 local ranks itself, one per GPU on a GPU machine
    python -m app bench --nproc-per-node 4 --json bench.json
    torchrun --standalone --nproc-per-node 2 -m app bench # under any launcher: the ranks it gives
    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python -m app bench

The tutorial loop is the seed's: the MLP (784-256-10), Adam, batch 64 per rank, a DataLoader over
a TensorDataset with DistributedSampler, DDP with its defaults, ``loss.item()`` every step; on a GPU
the seed's complete CUDA script (seed 004, 6.4.8): AMP fp16 with GradScaler, a DataLoader with 4
worker processes and pinned memory, ``non_blocking`` copies. The ``app train`` side runs the real
Trainer, epoch by epoch through ``Trainer.train_epoch`` as ``fit`` does, with app train's DDP and
speed settings (its defaults, or the same flags given here) and its default ``--precision auto`` (on
a GPU bf16 where it has it, else fp16 as the seed; fp32 on a CPU), its step-time exchange, rank 0's
record of each step (OUT/progress, in a temp folder) and its TensorBoard step loss (OUT/tensorboard)
on the same synthetic samples; on a GPU it also reports its achieved TFLOP/s per GPU and MFU
(``flops``). ``--sweep`` also times each speed setting changed on its own, ``--compile`` and, on a
GPU, fp16, fp32 and ``--cuda-graphs off`` among them: the choice of defaults.
The one-process loop is app train on rank 0 alone (no DDP: a world of one), while the other
ranks wait: perfect scaling is N times its samples/s. Each round times one epoch of every loop
back to back, so that a busy machine slows them alike. Steady rates are compared: the first rounds
warm up untimed (one, or as many as a CUDA graph's eager warm-up steps and capture take:
``warmup_rounds``), so torch.compile's compiling and the capture are not counted. The ratio is the
median over the timed rounds of app / tutorial in the same round, the scaling the median of app /
(N x one process), the samples/s the median over rounds. Rank 0 prints samples/s of each, the ratio
and the scaling.
Started as one process, it runs itself again under torchrun with exactly the arguments it was
given, so every flag (the speed settings, ``--ifname``, ``--timeout``...) reaches the ranks.
"""

import argparse
import json
import math
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from app import flags, progress
from app.atomic import atomic_write_text
from app.diagnostics.collectives import synchronize
from app.errors import UsageError
from app.runtime.distributed import (
    DistConfig,
    DistContext,
    first_ranks,
    process_group,
    this_process,
)
from app.runtime.relaunch import default_ranks, relaunch
from app.topology.spec import Nodes
from app.train import data, graphs, models, sync
from app.train.config import DataConfig, ModelConfig, OutputConfig, SpeedConfig, StepsConfig, TrainConfig
from app.train.report import Reporter, format_mfu
from app.train.trainer import Trainer

SHAPE = (1, 28, 28)
SEED_WORKERS = 4
"""DataLoader workers of the seed's CUDA script."""


@dataclass(frozen=True)
class BenchConfig:
    """Benchmark."""

    nproc_per_node: int | None = field(
        default=None, metadata=flags.flag(show=f"one per GPU, else {Nodes.nproc_per_node}")
    )
    """Ranks to start with torchrun --standalone when run as one process."""
    samples: int = 8192
    """Synthetic training samples."""
    batch_size: int = 64
    """Samples per rank per step, for both loops (the seed's 64)."""
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
            ("--nproc-per-node", 1 if self.nproc_per_node is None else self.nproc_per_node, 1),
            ("--batch-size", self.batch_size, 1),
            ("--samples", self.samples, self.batch_size),
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
    flags.add_arguments(parser, DistConfig)


def train_config(bench: BenchConfig, speed: SpeedConfig) -> TrainConfig:
    """app train's configuration on the benchmark's data: the seed's MLP in app train's default precision
    (auto), ``speed`` as given, app train's output defaults (TensorBoard's step loss included; no console)."""
    return TrainConfig(
        data=DataConfig(
            dataset="synthetic", input_shape=SHAPE, train_samples=bench.samples, test_samples=bench.batch_size
        ),
        model=ModelConfig(model="mlp"),
        steps=StepsConfig(batch_size=bench.batch_size),
        speed=speed,
        output=OutputConfig(out=Path("."), quiet=True),
    )


def variants(cfg: TrainConfig, sweep: bool, device: torch.device) -> dict[str, TrainConfig]:
    """The app configurations to time: ``cfg`` alone, or with --sweep each knob changed on its own."""
    if not sweep:
        return {"app": cfg}
    found = {"app": cfg}
    if device.type == "cuda":  # the seed's precision (its GradScaler: eager), fp32, and the default precision eager
        found |= {name: replace(cfg, model=replace(cfg.model, precision=name)) for name in ("fp16", "fp32")}
        found["cuda_graphs off"] = replace(cfg, speed=replace(cfg.speed, cuda_graphs="off"))
    changes = {
        "static_graph off": {"static_graph": False},
        "gradient_as_bucket_view off": {"gradient_as_bucket_view": False},
        "bucket_cap_mb 0.25 (2 buckets)": {"bucket_cap_mb": 0.25},
        "optimizer foreach": {"optimizer_impl": "foreach"},
        "optimizer loop": {"optimizer_impl": "loop"},
        "loader dataloader": {"loader": "dataloader"},
        "comm_hook fp16": {"comm_hook": "fp16"},
        "comm_hook powersgd": {"comm_hook": "powersgd"},
        "compile": {"compile": True},
    }
    return found | {name: replace(cfg, speed=replace(cfg.speed, **change)) for name, change in changes.items()}


class TutorialLoop:
    """The seed's loop, as the tutorials write it; on CUDA the seed's complete script (AMP fp16, GradScaler,
    4 DataLoader workers, pinned memory, non_blocking copies)."""

    def __init__(self, ctx: DistContext, split: data.Split, batch_size: int) -> None:
        torch.manual_seed(0)
        self.device, cuda = ctx.device, ctx.device.type == "cuda"
        model = models.mlp().to(ctx.device)
        self.model = DDP(model, device_ids=[ctx.device.index] if cuda else None)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        self.scaler = torch.amp.GradScaler("cuda") if cuda else None
        dataset = TensorDataset(split.x, split.y)
        self.sampler = DistributedSampler(dataset, num_replicas=ctx.proc.world_size, rank=ctx.proc.rank)
        workers = SEED_WORKERS if cuda else 0
        self.loader = DataLoader(
            dataset, batch_size=batch_size, sampler=self.sampler, num_workers=workers, pin_memory=cuda
        )

    def epoch(self, epoch: int) -> int:
        """Train one epoch: the samples seen."""
        self.sampler.set_epoch(epoch)
        self.model.train()
        samples, total_loss, cuda = 0, 0.0, self.scaler is not None
        for x, y in self.loader:
            x, y = x.to(self.device, non_blocking=cuda), y.to(self.device, non_blocking=cuda)
            self.optimizer.zero_grad()
            if self.scaler is not None:
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = F.cross_entropy(self.model(x), y)
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss = F.cross_entropy(self.model(x), y)
                loss.backward()
                self.optimizer.step()
            total_loss += loss.item()
            samples += y.shape[0]
        return samples


def _trainer_epoch(trainer: Trainer | None) -> Callable[[int], int]:
    """An app train epoch as the benchmark times it: the Trainer's next epoch, as ``fit`` runs it (None: none here)."""

    def epoch(_epoch: int) -> int:
        return trainer.train_epoch().samples if trainer is not None else 0

    return epoch


def _rate(run_epoch: Callable[[int], int], epoch: int, ctx: DistContext) -> float:
    """Global samples/s of one epoch (samples summed over ranks, time of the slowest rank; the device drained)."""
    synchronize(ctx.device)
    start = time.perf_counter()
    samples = run_epoch(epoch)
    synchronize(ctx.device)
    seconds = time.perf_counter() - start
    (total,) = sync.all_sum([samples], ctx.device)
    (slowest,) = sync.all_reduce([seconds], ctx.device, "max")
    return total / slowest


def _app_trainer(cfg: TrainConfig, ctx: DistContext, dataset: data.Dataset, reporter: Reporter) -> Trainer:
    """The Trainer as app train runs it: rank 0 also records each step in OUT/progress (one pwrite) and
    writes its step loss to TensorBoard every --tensorboard-every steps."""
    trainer = Trainer(cfg, ctx, dataset, reporter, step_hooks=[reporter.after_step])
    if ctx.proc.is_main:
        trainer.progress = progress.Recorder(cfg.output.out)
    return trainer


def warmup_rounds(trainers: Iterable[Trainer]) -> int:
    """The untimed rounds that come first: one (compiling, the allocator, cuDNN), or as many epochs as a CUDA
    graph's eager warm-up steps and its capture take (``graphs.WARMUP_STEPS`` + 1 steps)."""
    return max([1, *(math.ceil((graphs.WARMUP_STEPS + 1) / len(t.loader)) for t in trainers if t.graphed)])


def measure(ctx: DistContext, configs: dict[str, TrainConfig], rounds: int) -> dict:
    """Warm every loop up (``warmup_rounds``), then time one epoch of each in turn, ``rounds`` times; medians."""
    first = next(iter(configs.values()))
    dataset = data.synthetic(first.data)
    with ExitStack() as stack:
        reporters = {name: stack.enter_context(_reporter(cfg, ctx.proc.is_main, name)) for name, cfg in configs.items()}
        quiet = Reporter(first.output.out, enabled=False)
        alone = first_ranks(ctx, [1])[1]  # rank 0 as a world of its own; None on the others
        runners = {"tutorial": TutorialLoop(ctx, dataset.train, first.steps.batch_size).epoch}
        trainers = {name: _app_trainer(cfg, ctx, dataset, reporters[name]) for name, cfg in configs.items()}
        runners |= {name: _trainer_epoch(trainer) for name, trainer in trainers.items()}
        runners["one process"] = _trainer_epoch(_app_trainer(first, alone, dataset, quiet) if alone else None)
        rates: dict[str, list[float]] = {name: [] for name in runners}
        warmup = warmup_rounds(trainers.values())  # the same on every rank: their loaders have the same length
        for epoch in range(warmup + rounds):
            for name, runner in runners.items():
                rate = _rate(runner, epoch, ctx)
                if epoch >= warmup:
                    rates[name].append(rate)
        for trainer in trainers.values():
            trainer.reporter.close()
        app = trainers["app"]
        app.count_flops()  # on CUDA: TFLOP/s per GPU and MFU of app train's median rate
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
        "batch_per_rank": first.steps.batch_size,
        "precision": app.cfg.model.precision,
        "rounds": rounds,
        "warmup_rounds": warmup,
        "threads_per_rank": torch.get_num_threads(),
        "tutorial_samples_per_s": medians["tutorial"],
        "app_samples_per_s": medians["app"],
        "ratio": ratios["app"],
        "one_process_samples_per_s": medians["one process"],
        "scaling": scaling,
        **app.speed_of_light(medians["app"] / world, 1.0),
        "app_settings": _settings(app),
        "variants": {
            name: {"samples_per_s": medians[name], "ratio": ratios[name], "settings": _settings(trainers[name])}
            for name in configs
        },
        "all_rates": rates,
    }


def _settings(trainer: Trainer) -> dict:
    """The speed settings a variant ran with, its auto choices made (cuda_graphs on or off)."""
    return vars(trainer.cfg.speed)


def _reporter(cfg: TrainConfig, is_main: bool, name: str) -> Reporter:
    """A variant's Reporter as app train's rank 0 has it (TensorBoard's step loss), in its own folder of OUT."""
    out = cfg.output.out / re.sub(r"[^a-z0-9]+", "-", name.lower())
    reporter = Reporter.of(replace(cfg.output, out=out), is_main)
    reporter.start({}, "", 0)  # --quiet: prints nothing; opens the TensorBoard file
    return reporter


def format_report(r: dict) -> str:
    s = r["app_settings"]
    ranks = f"{r['world_size']} ranks ({r['backend']} on {r['device']}, {r['threads_per_rank']} thread(s) each)"
    data = f"{r['samples']} synthetic samples, medians of {r['rounds']} rounds after {r['warmup_rounds']} warm-up"
    app = (
        f"loader {s['loader']}, {s['optimizer_impl']} Adam, bucket {s['bucket_cap_mb']:g} MiB, "
        f"gradient_as_bucket_view {s['gradient_as_bucket_view']}, static_graph {s['static_graph']}, "
        f"comm hook {s['comm_hook']}, cuda graphs {s['cuda_graphs']}"
    )
    cuda = r["device"].startswith("cuda")
    seed = (
        "the seed's CUDA script (AMP fp16 + GradScaler, 4 workers, pin_memory)"
        if cuda
        else "tutorial loop (DataLoader, DistributedSampler, Adam, DDP defaults)"
    )
    lines = [
        f"bench: {ranks}, mlp, {r['precision']}, batch {r['batch_per_rank']}/rank, {data}",
        f"  {seed:<68} {r['tutorial_samples_per_s']:8.0f} samples/s",
        f"  {'app train':<68} {r['app_samples_per_s']:8.0f} samples/s  {r['ratio']:.2f}x{format_mfu(r)}",
        f"  {'app train, one process (rank 0 alone, no DDP)':<68} {r['one_process_samples_per_s']:8.0f} samples/s",
    ]
    lines += [
        f"  {'app train, ' + name:<68} {v['samples_per_s']:8.0f} samples/s  {v['ratio']:.2f}x"
        for name, v in r["variants"].items()
        if name != "app"
    ]
    lines += [
        f"  app train settings: {app}",
        f"ratio app/{'seed' if cuda else 'tutorial'}: {r['ratio']:.2f}x (steady rates: median of per-round ratios)",
        f"scaling app/({r['world_size']} x one process): {100 * r['scaling']:.0f}% of perfect "
        "(median of per-round ratios)",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Relaunch under torchrun when alone, else measure on these ranks; rank 0 reports."""
    bench, dist_cfg = flags.from_args(BenchConfig, args), flags.from_args(DistConfig, args)
    speed = flags.from_args(SpeedConfig, args)
    proc = this_process(dist_cfg)
    nproc = bench.nproc_per_node or default_ranks(Nodes.nproc_per_node)
    if proc.world_size == 1 and nproc > 1:
        return relaunch("bench", nproc, args.argv, bench.launch_timeout)
    with process_group(proc, dist_cfg) as ctx, tempfile.TemporaryDirectory(prefix="ddp-bench-") as out:
        cfg = train_config(bench, speed)
        cfg = replace(cfg, output=replace(cfg.output, out=Path(out)))  # for OUT/progress and OUT/tensorboard
        report = measure(ctx, variants(cfg, bench.sweep, ctx.device), bench.rounds)
    if proc.is_main:
        print(format_report(report), flush=True)
        if bench.json:
            atomic_write_text(bench.json, json.dumps(report, indent=2) + "\n")
    return 0
