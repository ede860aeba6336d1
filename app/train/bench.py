"""Benchmark: samples/s of ``app train`` against a plain tutorial-style DDP loop, same data, same ranks.

    python -m app bench                                   # starts 2 local ranks itself (torchrun --standalone)
    python -m app bench --nproc-per-node 4 --json bench.json
    torchrun --standalone --nproc-per-node 2 -m app bench # under any launcher: the ranks it gives
    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python -m app bench

The tutorial loop is the seed's: the MLP (784-256-10), Adam, batch 64 per rank, a DataLoader over
a TensorDataset with DistributedSampler, DDP with its defaults, ``loss.item()`` every step. The
``app train`` side runs the real Trainer with its default settings (or the DDP flags given here)
on the same synthetic samples. Each round times one epoch of every loop back to back, so that a
busy machine slows them alike; the ratio is the median over rounds of app / tutorial in the same
round, the samples/s the median over rounds. Rank 0 prints samples/s of both and the ratio.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from app.atomic import atomic_write_text
from app.errors import ClusterError, UsageError
from app.platform import launcher
from app.platform.distributed import DistContext, add_dist_arguments, dist_config_from_args, process_group
from app.train import collective, data, models
from app.train.config import DataConfig, DDPConfig, OptimConfig, RunConfig, TrainConfig
from app.train.main import add_speed_arguments
from app.train.report import Reporter
from app.train.trainer import Trainer

BATCH = 64
SHAPE = (1, 28, 28)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app bench``."""
    parser.add_argument(
        "--nproc-per-node",
        metavar="N",
        type=int,
        default=2,
        help="ranks to start with torchrun --standalone when run as one process (default 2)",
    )
    parser.add_argument(
        "--samples", metavar="N", type=int, default=8192, help="synthetic training samples (default 8192)"
    )
    parser.add_argument(
        "--rounds", metavar="N", type=int, default=11, help="timed epochs of each loop, alternating (default 11)"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--sweep", action="store_true", help="also time app train with each speed knob changed")
    add_speed_arguments(parser.add_argument_group("app train side (default: its defaults)"))
    parser.add_argument(
        "--launch-timeout",
        metavar="S",
        type=float,
        default=600,
        help="seconds before the started ranks are stopped (default 600)",
    )
    add_dist_arguments(parser)


def _child_argv(args: argparse.Namespace) -> list[str]:
    """These flags again, for the ranks that _relaunch starts."""
    values = {
        "--samples": args.samples,
        "--rounds": args.rounds,
        "--loader": args.loader,
        "--optimizer-impl": args.optimizer_impl,
        "--bucket-cap-mb": args.bucket_cap_mb,
        "--timeout": args.timeout,
        "--backend": args.backend,
    }
    argv = [str(item) for pair in values.items() for item in pair]
    argv.append("--gradient-as-bucket-view" if args.gradient_as_bucket_view else "--no-gradient-as-bucket-view")
    argv.append("--static-graph" if args.static_graph else "--no-static-graph")
    return argv + (["--json", args.json] if args.json else []) + (["--sweep"] if args.sweep else [])


def _relaunch(args: argparse.Namespace) -> int:
    """Run this benchmark again under torchrun --standalone with --nproc-per-node ranks."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(args.nproc_per_node),
        "-m",
        "app",
        "bench",
        *_child_argv(args),
    ]
    try:
        return subprocess.run(cmd, timeout=args.launch_timeout, check=False).returncode
    except subprocess.TimeoutExpired:
        raise ClusterError(f"bench did not finish within --launch-timeout {args.launch_timeout:g}s") from None


def _config(args: argparse.Namespace) -> TrainConfig:
    """app train's configuration: its defaults, or the knobs given on the command line."""
    return TrainConfig(
        data=DataConfig(
            dataset="synthetic", input_shape=SHAPE, train_samples=args.samples, test_samples=BATCH, loader=args.loader
        ),
        optim=OptimConfig(model="mlp", batch_size=BATCH, optimizer_impl=args.optimizer_impl),
        ddp=DDPConfig(
            bucket_cap_mb=args.bucket_cap_mb,
            gradient_as_bucket_view=args.gradient_as_bucket_view,
            static_graph=args.static_graph,
        ),
        run=RunConfig(out=Path("."), quiet=True),
    )


def variants(cfg: TrainConfig, sweep: bool) -> dict[str, TrainConfig]:
    """The app configurations to time: ``cfg`` alone, or with --sweep each knob changed on its own."""
    if not sweep:
        return {"app": cfg}
    d, o, k = cfg.data, cfg.optim, cfg.ddp
    return {
        "app": cfg,
        "static_graph off": replace(cfg, ddp=replace(k, static_graph=False)),
        "gradient_as_bucket_view off": replace(cfg, ddp=replace(k, gradient_as_bucket_view=False)),
        "bucket_cap_mb 0.25 (2 buckets)": replace(cfg, ddp=replace(k, bucket_cap_mb=0.25)),
        "optimizer foreach": replace(cfg, optim=replace(o, optimizer_impl="foreach")),
        "optimizer loop": replace(cfg, optim=replace(o, optimizer_impl="loop")),
        "loader dataloader": replace(cfg, data=replace(d, loader="dataloader")),
    }


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


def _rate(runner, epoch: int, ctx: DistContext) -> float:
    """Global samples/s of one epoch (samples summed over ranks, time of the slowest rank)."""
    samples, seconds = runner.timed_epoch(epoch)
    (total,) = collective.all_sum([samples], ctx.device)
    slowest = torch.tensor([seconds], dtype=torch.float64, device=ctx.device)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
    return total / float(slowest.item())


def measure(ctx: DistContext, configs: dict[str, TrainConfig], rounds: int) -> dict:
    """Warm every loop up, then time one epoch of each in turn, ``rounds`` times; medians."""
    first = next(iter(configs.values()))
    dataset = data.synthetic(first.data)
    runners: dict = {"tutorial": TutorialLoop(ctx, dataset.train)}
    runners |= {name: Trainer(cfg, ctx, dataset, Reporter(cfg.run.out, enabled=False)) for name, cfg in configs.items()}
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
        "app_settings": _settings(first),
        "variants": {
            name: {"samples_per_s": medians[name], "ratio": ratios[name], "settings": _settings(cfg)}
            for name, cfg in configs.items()
        },
        "all_rates": rates,
    }


def _settings(cfg: TrainConfig) -> dict:
    return {"loader": cfg.data.loader, "optimizer_impl": cfg.optim.optimizer_impl, **vars(cfg.ddp)}


def format_report(r: dict) -> str:
    s = r["app_settings"]
    ranks = f"{r['world_size']} ranks ({r['backend']} on {r['device']}, {r['threads_per_rank']} thread(s) each)"
    data = f"{r['samples']} synthetic samples, medians of {r['rounds']} rounds"
    app = (
        f"loader {s['loader']}, {s['optimizer_impl']} Adam, bucket {s['bucket_cap_mb']:g} MiB, "
        f"gradient_as_bucket_view {s['gradient_as_bucket_view']}, static_graph {s['static_graph']}"
    )
    lines = [
        f"bench: {ranks}, mlp, batch {r['batch_per_rank']}/rank, {data}",
        f"  {'tutorial loop (DataLoader, DistributedSampler, Adam, DDP defaults)':<68} "
        f"{r['tutorial_samples_per_s']:8.0f} samples/s",
        f"  {'app train':<68} {r['app_samples_per_s']:8.0f} samples/s  {r['ratio']:.2f}x",
    ]
    lines += [
        f"  {'app train, ' + name:<68} {v['samples_per_s']:8.0f} samples/s  {v['ratio']:.2f}x"
        for name, v in r["variants"].items()
        if name != "app"
    ]
    lines += [f"  app train settings: {app}", f"ratio app/tutorial: {r['ratio']:.2f}x (median of per-round ratios)"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Relaunch under torchrun when alone, else measure on these ranks; rank 0 reports."""
    if args.rounds < 1 or args.samples < BATCH or args.nproc_per_node < 1:
        raise UsageError("--rounds must be >= 1, --samples >= 64 and --nproc-per-node >= 1")
    cfg = _config(args)
    proc = launcher.detect(need_master=args.init_method is None)
    if proc.world_size == 1 and args.nproc_per_node > 1:
        return _relaunch(args)
    with process_group(proc, dist_config_from_args(args)) as ctx:
        report = measure(ctx, variants(cfg, args.sweep), args.rounds)
    if proc.is_main:
        print(format_report(report), flush=True)
        if args.json:
            atomic_write_text(args.json, json.dumps(report, indent=2) + "\n")
    return 0
