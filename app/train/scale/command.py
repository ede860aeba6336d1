"""Scaling report: app train's step time at world sizes 1, 2, 4, ..., where it goes (compute, gradient
all-reduce), the scaling law fitted to it and what it predicts for more ranks.

    python -m app scale                                    # starts 4 local ranks itself, measures N = 1, 2, 4
                                                           # 2 or more GPUs: one rank per GPU, N = 1, 2, 4...
    python -m app scale --world-sizes 1,2 --json scale.json --plot scale.png
    python -m app scale --sweep --world-sizes 1,2          # every --comm-hook x --sweep-buckets, and --compile
    torchrun --standalone --nproc-per-node 4 -m app scale  # under any launcher: N = 1, 2, 4, ... up to its ranks
    mpirun -np 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 python -m app scale
    srun -N 2 --ntasks-per-node 4 python -m app scale --json scale.json
    python -m app scale --from-json scale.json --plot scale.png   # a report written earlier, drawn here
    make scale SCALE_ARGS="--sweep"; make cluster-scale NODES=2 NPROC_PER_NODE=2   # the compose mini-cluster

What runs: app train's Trainer, one epoch at a time (``Trainer.train_epoch``), with app train's
model, optimizer, batch and DDP/speed flags, on the job's first N ranks as a process group of
their own (``first_ranks``) while the other ranks wait; on a cluster the first ranks fill the
first node, so N up to --nproc-per-node measures one node's links and larger N the network. As one
process it runs itself again under torchrun --standalone on max(--world-sizes) local ranks. On
the compose mini-cluster (make cluster-scale) the nodes are containers on one machine: N within a
node measures loopback, N across nodes the bridge network between containers, and every rank
shares the host's cores.

What is measured (app/train/scale/timing.py): per optimizer step, the step, its compute (the same steps
under DDP's no_sync), its gradient all-reduce (a comm hook that times each bucket from call to
completion) and the exposed communication (step - compute); and a bare all_reduce of S/64, S/8
and S bytes (S: the gradient bytes) on each N, from which busbw and latency are fitted. Every
variant at every N is built and warmed up first; then each of --rounds rounds (--steps steps of
synthetic data, or one epoch of digits, synced and then no_sync) visits every N and variant in
turn, so that a busy machine slows them alike. Figures are medians over rounds, the slowest
rank's; speed-up is the median of each round's ratio. Each N runs alone, so on a machine with
fewer cores than ranks the compute per step grows with N: the report says so. --sweep keeps one
model per variant and N in memory.

The law (app/train/scale/law.py): T_N = T_1 / N + T_comm(N) for a job of fixed size; per step
t_N = t_1 + k * (2 (N - 1) / N * S / busbw + latency), with t_1 and k (the share of a plain fp32
all-reduce that a step waits for) fitted to the step times by least squares. Printed per N:
measured and predicted step time, speed-up (samples/s over one rank's: N t_1 / t_N) and
efficiency (speed-up / N), and the largest N whose predicted efficiency stays >= 50%.

--json PATH (rank 0) writes the report. Its keys are stable (``"format": 1``) and described one by
one in a JSON Schema (app/train/scale/report.py, ``--print-schema`` prints it): a CI job can
compare runs by them. --plot PATH.png (rank 0, matplotlib) draws the measured points, the fitted
curves and perfect scaling.
"""

import argparse
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist

from app import flags, plots
from app.atomic import atomic_write_text
from app.errors import UsageError
from app.flags import flag
from app.runtime.distributed import (
    DistConfig,
    DistContext,
    first_ranks,
    process_group,
    this_process,
)
from app.runtime.relaunch import local_gpus, relaunch
from app.train import auto, flops, models, precision
from app.train.config import (
    COMM_HOOKS,
    DataConfig,
    ModelConfig,
    OptimizerConfig,
    OutputConfig,
    SpeedConfig,
    StepsConfig,
    TrainConfig,
)
from app.train.main import prepare_data
from app.train.report import Reporter
from app.train.scale import report as scale_report
from app.train.scale import timing
from app.train.scale.law import AllReduceSample
from app.train.trainer import Trainer

DATASETS = ("synthetic", "digits")
STANDALONE_SIZES = (1, 2, 4)
"""--world-sizes when started as one process on a machine with fewer than 2 GPUs."""
BARE_FRACTIONS = (64, 8, 1)
"""The bare all-reduce's sizes: S divided by these."""


def parse_sizes(text: str) -> tuple[int, ...]:
    """``1,2,4`` -> (1, 2, 4): distinct world sizes, one of them 1."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise UsageError(f"{text!r} must be rank counts separated by commas, e.g. 1,2,4")
    sizes = tuple(int(p) for p in parts)
    if min(sizes) < 1:
        raise UsageError(f"{text!r}: a world size must be >= 1")
    if len(set(sizes)) != len(sizes):
        raise UsageError(f"{text!r} names a world size twice")
    if 1 not in sizes or len(sizes) < 2:
        raise UsageError(f"{text!r} needs 1 (the baseline of speed-up) and at least one more, e.g. 1,2,4")
    return tuple(sorted(sizes))


def parse_buckets(text: str) -> tuple[float, ...]:
    """``25,0.01`` -> (25.0, 0.01): bucket sizes in MiB, each > 0."""
    try:
        sizes = tuple(float(p) for p in text.split(","))
    except ValueError:
        raise UsageError(f"{text!r} must be bucket sizes in MiB separated by commas, e.g. 25,0.01") from None
    if not sizes or min(sizes) <= 0:
        raise UsageError(f"{text!r}: each bucket size must be > 0 MiB")
    return sizes


@dataclass(frozen=True)
class ScaleConfig:
    """Scaling report."""

    world_sizes: tuple[int, ...] | None = field(
        default=None,
        metadata=flag(
            parse=parse_sizes,
            show="1,2,4 (2+ GPUs: 1,2,4,... up to them); under a launcher 1,2,4,... up to its ranks",
            metavar="N,N,...",
        ),
    )
    """World sizes to measure, with 1; comma-separated."""
    dataset: str = field(default="synthetic", metadata=flag(metavar="NAME"))
    """synthetic (a round is --steps steps) or digits (a round is one epoch of scikit-learn's digits)."""
    steps: int = 20
    """Optimizer steps per timed round with synthetic data."""
    rounds: int = 5
    """Timed rounds per world size (synced and no_sync epochs alternate); figures are medians."""
    sweep: bool = False
    """Measure every --comm-hook with every --sweep-buckets size, and the given settings under --compile; name the
    fastest."""
    sweep_buckets: tuple[float, ...] = field(
        default=(25.0, 0.01), metadata=flag(parse=parse_buckets, show="25,0.01", metavar="MB,MB,...")
    )
    """Bucket sizes (MiB) for --sweep; the seed MLP's gradients are 1 bucket at 25 and 2 at 0.01."""
    json: Path | None = None
    """Also write the report as JSON to this file (its keys: --print-schema)."""
    plot: Path | None = field(default=None, metadata=flag(metavar="PATH.png"))
    """Also draw step time and speed-up against ranks, measured and fitted, into this PNG (needs matplotlib)."""
    launch_timeout: float = field(default=1800.0, metadata=flag(metavar="S"))
    """Seconds before the ranks it started as one process are stopped."""
    print_schema: bool = False
    """Print the JSON Schema of --json files (every key, described) and exit."""
    from_json: Path | None = None
    """Measure nothing: print (and --plot) a report that --json wrote earlier, e.g. on a cluster without matplotlib."""

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise UsageError(f"--dataset {self.dataset!r} is not one of {', '.join(DATASETS)}")
        for name, value, least in (("--steps", self.steps, 2), ("--rounds", self.rounds, 1)):
            if value < least:
                raise UsageError(f"{name} {value} must be >= {least}")
        if self.launch_timeout <= 0:
            raise UsageError(f"--launch-timeout {self.launch_timeout:g} must be > 0 seconds")
        if self.from_json is not None and not self.from_json.is_file():
            raise UsageError(f"--from-json {self.from_json}: no such file (a report that --json wrote)")
        for flag_name, path in (("--json", self.json), ("--plot", self.plot)):
            if path is not None and not path.parent.is_dir():
                raise UsageError(f"{flag_name} {path}: no folder {path.parent}: create it or choose another path")


EXCLUDED_STEPS = ("epochs", "max_steps")
"""StepsConfig's fields that a timing run sets itself."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app scale``: its own, then app train's model, optimizer, steps and speed, the group's."""
    flags.add_arguments(parser, ScaleConfig)
    for section in (ModelConfig, OptimizerConfig):
        flags.add_arguments(parser, section)
    flags.add_arguments(parser, StepsConfig, exclude=EXCLUDED_STEPS)
    flags.add_arguments(parser, SpeedConfig)
    flags.add_arguments(parser, DistConfig)


def train_config(scale: ScaleConfig, args: argparse.Namespace) -> TrainConfig:
    """app train's configuration as the flags give it (the data per world size: ``for_world``)."""
    return TrainConfig(
        data=DataConfig(dataset=scale.dataset),
        model=flags.from_args(ModelConfig, args),
        optim=flags.from_args(OptimizerConfig, args),
        steps=flags.from_args(StepsConfig, args),
        speed=flags.from_args(SpeedConfig, args),
        output=OutputConfig(out=Path("."), tensorboard=False, quiet=True),
    )


def for_world(cfg: TrainConfig, scale: ScaleConfig, world_size: int) -> TrainConfig:
    """``cfg`` with synthetic data of --steps steps per epoch on ``world_size`` ranks."""
    if cfg.data.dataset != "synthetic":
        return cfg
    samples = scale.steps * world_size * cfg.steps.batch_size * cfg.steps.accum_steps
    return replace(cfg, data=replace(cfg.data, train_samples=samples))


def variant_name(speed: SpeedConfig) -> str:
    return f"{speed.comm_hook}, bucket {speed.bucket_cap_mb:g} MiB" + (", compile" if speed.compile else "")


def variants(cfg: TrainConfig, scale: ScaleConfig) -> dict[str, TrainConfig]:
    """The configurations to measure: ``cfg``, or with --sweep every comm hook with every bucket size, and ``cfg``
    compiled (--compile; --cuda-graphs is not swept: a captured step has no no_sync to time its compute, and the
    bucket timer is a Python comm hook, so auto runs every variant eagerly)."""
    if not scale.sweep:
        return {variant_name(cfg.speed): cfg}
    found = {}
    for hook in COMM_HOOKS:
        for cap in scale.sweep_buckets:
            speed = replace(cfg.speed, comm_hook=hook, bucket_cap_mb=cap)
            found[variant_name(speed)] = replace(cfg, speed=speed)
    compiled = replace(cfg.speed, compile=True)
    return found | {variant_name(compiled): replace(cfg, speed=compiled)}


def default_sizes(world_size: int) -> tuple[int, ...]:
    """1, 2, 4, ... below ``world_size``, and ``world_size``."""
    sizes, n = [], 1
    while n < world_size:
        sizes.append(n)
        n *= 2
    return (*sizes, world_size)


def _shared(outcome: dict, ctx: DistContext) -> dict:
    """Rank 0's ``outcome`` on every rank (rank 0 is in every group); also where waiting ranks wait."""
    payload = [outcome]
    if ctx.proc.world_size > 1:
        dist.broadcast_object_list(payload, src=0)
    return payload[0]


def _clock(sub: DistContext, cfg: TrainConfig) -> timing.StepClock:
    """A warmed-up clock of ``cfg``'s Trainer on ``sub``."""
    timer = timing.CommTimer(sub.device)
    trainer = Trainer(cfg, sub, prepare_data(cfg, sub), Reporter(Path("."), enabled=False), wrap_comm_hook=timer.wrap)
    clock = timing.StepClock(trainer, timer)
    clock.warm_up(synced_steps=max(3, cfg.speed.powersgd_warmup + 2 if cfg.speed.comm_hook == "powersgd" else 0))
    return clock


def _clocks(ctx: DistContext, scale: ScaleConfig, configs: dict[str, TrainConfig], sizes, parts) -> tuple[dict, dict]:
    """Every variant's clock at every world size (this rank's; None where it is not in the group), and the skipped."""
    clocks: dict[tuple[str, int], timing.StepClock | None] = {}
    skipped: dict[str, str] = {}
    for n in sizes:
        for name, variant in configs.items():
            if name in skipped:
                continue
            outcome: dict = {}
            if parts[n] is not None:
                try:
                    clocks[name, n] = _clock(parts[n], for_world(variant, scale, n))
                except UsageError as error:
                    outcome = {"skipped": str(error)}
            outcome = _shared(outcome, ctx)  # every rank learns what rank 0 (in every group) met
            if "skipped" in outcome:
                if not scale.sweep:
                    raise UsageError(outcome["skipped"])
                skipped[name] = outcome["skipped"]
    return {key: clock for key, clock in clocks.items() if key[0] not in skipped}, skipped


def gradient_bytes(cfg: TrainConfig, ctx: DistContext) -> int:
    """S for ``cfg``'s model on its data."""
    data = prepare_data(for_world(cfg, ScaleConfig(), 1), ctx)
    return timing.gradient_bytes(models.build(cfg.model.model, data.shape, data.num_classes))


def measure(ctx: DistContext, scale: ScaleConfig, cfg: TrainConfig, sizes: tuple[int, ...]) -> dict | None:
    """Every variant at every world size, and the bare all-reduces; the report on rank 0 (None elsewhere)."""
    parts = first_ranks(ctx, sizes)
    nbytes = gradient_bytes(cfg, ctx)
    bare: list[AllReduceSample] = []
    for n in sizes[1:]:
        if parts[n] is not None:
            times = timing.time_allreduce(parts[n], [max(4, nbytes // f) for f in BARE_FRACTIONS], scale.rounds)
            bare += [AllReduceSample(n, size, seconds) for size, seconds in times.items()]
        _shared({}, ctx)
    configs = variants(cfg, scale)
    clocks, skipped = _clocks(ctx, scale, configs, sizes, parts)
    for _ in range(scale.rounds):  # rounds alternate between world sizes and variants
        for n in sizes:
            for name in configs:
                if clocks.get((name, n)) is not None:
                    clocks[name, n].round()
            _shared({}, ctx)
    measured: dict[str, dict[int, dict]] = {name: {1: {"skipped": reason}} for name, reason in skipped.items()}
    for (name, n), clock in clocks.items():
        if clock is not None:
            measured.setdefault(name, {})[n] = {"times": vars(clock.result())}
    measured = {name: measured[name] for name in configs}
    if not ctx.proc.is_main:
        return None
    context = _context(ctx, scale, cfg, sizes, nbytes)
    return scale_report.build(context, bare, measured, {name: v.speed for name, v in configs.items()})


def _context(ctx: DistContext, scale: ScaleConfig, cfg: TrainConfig, sizes: tuple[int, ...], nbytes: int) -> dict:
    return {
        "world_sizes": list(sizes),
        "launcher": ctx.proc.launcher.value,
        "backend": ctx.backend,
        "device": str(ctx.device),
        "nodes": ctx.proc.num_nodes,
        "threads_per_rank": torch.get_num_threads(),
        "cpu_count": os.cpu_count() or 0,
        "model": cfg.model.model,
        "dataset": cfg.data.dataset,
        "batch_per_rank": cfg.steps.batch_size * cfg.steps.accum_steps,
        "gradient_bytes": nbytes,
        **_speed_of_light(cfg, ctx),
        "rounds": scale.rounds,
        "steps_per_round": scale.steps if cfg.data.dataset == "synthetic" else None,
    }


def _speed_of_light(cfg: TrainConfig, ctx: DistContext) -> dict:
    """On CUDA: one sample's training FLOPs and the GPU's bf16 peak (the report's TFLOP/s and MFU); nulls elsewhere."""
    if ctx.device.type != "cuda":
        return {"flops_per_sample": None, "peak_tflops": None, "peak_source": None}
    data = prepare_data(for_world(cfg, ScaleConfig(), 1), ctx)
    model = models.build(cfg.model.model, data.shape, data.num_classes).to(ctx.device)
    n = cfg.steps.batch_size
    x, y = data.train.x[:n].to(ctx.device), data.train.y[:n].to(ctx.device)
    top = flops.peak(ctx.device)
    name, _ = auto.choose_precision(cfg.model.precision, ctx.device, auto.capability_of(ctx.device))
    per_sample = flops.per_sample(model, x, y, precision.make(name, ctx.device))
    return {"flops_per_sample": per_sample, "peak_tflops": top.tflops, "peak_source": top.source}


def run(args: argparse.Namespace) -> int:
    """Relaunch under torchrun when alone, else measure on these ranks; rank 0 reports."""
    scale, dist_cfg = flags.from_args(ScaleConfig, args), flags.from_args(DistConfig, args)
    if scale.print_schema:
        print(json.dumps(scale_report.SCHEMA, indent=2))
        return 0
    cfg = train_config(scale, args)
    if scale.plot is not None:
        plots.prepare(scale.plot)  # a .png, and matplotlib there, before anything is measured
    if scale.from_json is not None:
        return _show(scale_report.read(scale.from_json), scale)
    proc = this_process(dist_cfg)
    if proc.world_size == 1:
        gpus = local_gpus()
        sizes = scale.world_sizes or (default_sizes(gpus) if gpus >= 2 else STANDALONE_SIZES)
        return relaunch("scale", max(sizes), args.argv, scale.launch_timeout)
    sizes = scale.world_sizes or default_sizes(proc.world_size)
    if max(sizes) > proc.world_size:
        raise UsageError(
            f"--world-sizes {','.join(map(str, sizes))} goes beyond the {proc.world_size} ranks this job has: "
            f"start {max(sizes)} ranks or measure up to {proc.world_size}"
        )
    with process_group(proc, dist_cfg) as ctx:
        report = measure(ctx, scale, cfg, sizes)
    if report is None:
        return 0
    if scale.json:
        atomic_write_text(scale.json, json.dumps(report, indent=2) + "\n")
    return _show(report, scale)


def _show(report: dict, scale: ScaleConfig) -> int:
    print(scale_report.format_report(report), flush=True)
    if scale.plot:
        scale_report.plot(report, scale.plot)
    return 0
