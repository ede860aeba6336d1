"""Typed configuration of one training run: seven sections, every field validated on construction.

Each field is written once, here: its name is its flag (``batch_size`` -> ``--batch-size``), its
default the flag's default and the docstring under it the flag's ``--help`` (``app.flags``); each
section is one group of ``python -m app train --help``. Precedence: command-line flags > these
defaults. A bad value raises ``UsageError`` naming the flag and the fix, from the command line and
from code alike.
"""

from dataclasses import dataclass, field, fields
from pathlib import Path

from app import batch
from app.errors import UsageError
from app.flags import flag

DATASETS = ("digits", "mnist", "cifar10", "synthetic")
MODELS = ("mlp", "cnn", "resnet18", "resnet50")
PRECISIONS = ("fp32", "bf16", "fp16")
"""What a run trains in; --precision also takes auto (app/train/auto.py chooses one of these)."""
CUDA_GRAPHS = ("auto", "on", "off")
OPTIMIZERS = ("adam", "adamw", "sgd")
OPTIMIZER_IMPLS = ("fused", "foreach", "loop")
LOADERS = ("memory", "dataloader")
COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
POWERSGD_MIN_WARMUP = 2
"""torch's floor for start_powerSGD_iter with error feedback: DDP rebuilds its buckets after the first steps."""


def parse_shape(text: str) -> tuple[int, int, int]:
    """``1x28x28`` -> (1, 28, 28): channels x height x width."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"{text!r} must be CxHxW with positive integers, e.g. 1x28x28")
    return int(parts[0]), int(parts[1]), int(parts[2])


def _positive(flag: str, value: float) -> None:
    if value <= 0:
        raise UsageError(f"{flag} {value} must be > 0")


def _non_negative(flag: str, value: float) -> None:
    if value < 0:
        raise UsageError(f"{flag} {value} must be >= 0 (0 turns it off)")


def _at_least_one(flag: str, value: int) -> None:
    if value < 1:
        raise UsageError(f"{flag} {value} must be >= 1")


def _one_of(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"{flag} {value!r} is not one of {', '.join(choices)}")


@dataclass(frozen=True)
class DataConfig:
    """Data: which samples."""

    dataset: str = field(default="digits", metadata=flag(metavar="NAME"))
    """digits (scikit-learn's 8x8 digits, offline), mnist or cifar10 (torchvision, from --data-dir) or synthetic."""
    data_dir: Path | None = field(default=None, metadata=flag(metavar="DIR"))
    """Folder holding MNIST/ or cifar-10-batches-py/ (torchvision's layout); needed by mnist and cifar10."""
    download: bool = False
    """Download mnist/cifar10 into --data-dir when missing (needs network)."""
    input_shape: tuple[int, int, int] = field(
        default=(1, 28, 28), metadata=flag(parse=parse_shape, show="1x28x28", metavar="CxHxW")
    )
    """Shape of one synthetic sample: channels x height x width."""
    num_classes: int = 10
    """Classes of the synthetic data."""
    train_samples: int = 8192
    """Synthetic training samples."""
    test_samples: int = 1024
    """Synthetic test samples."""
    workers: int = 0
    """DataLoader worker processes (with --loader dataloader)."""

    def __post_init__(self) -> None:
        _one_of("--dataset", self.dataset, DATASETS)
        if self.dataset in ("mnist", "cifar10") and self.data_dir is None:
            raise UsageError(
                f"--dataset {self.dataset} reads files: pass --data-dir DIR (add --download to fetch them)"
            )
        if self.data_dir is not None and not self.download and not Path(self.data_dir).is_dir():
            raise UsageError(f"--data-dir {self.data_dir} is not a directory: create it or add --download")
        for name, value in (
            ("--num-classes", self.num_classes),
            ("--train-samples", self.train_samples),
            ("--test-samples", self.test_samples),
        ):
            _positive(name, value)
        if self.num_classes < 2:
            raise UsageError(f"--num-classes {self.num_classes} must be >= 2")
        _non_negative("--workers", self.workers)


@dataclass(frozen=True)
class ModelConfig:
    """Model and precision."""

    model: str = field(default="mlp", metadata=flag(metavar="NAME"))
    """mlp (the seed's 784-256-10), cnn (small, with BatchNorm), resnet18 or resnet50 (need torchvision)."""
    precision: str = field(default="auto", metadata=flag(metavar="NAME"))
    """auto (bf16 on a GPU of compute capability 8.0 and up, fp16 on older GPUs, fp32 on CPU), fp32, bf16
    (autocast; CPU or a GPU with bf16) or fp16 (autocast + GradScaler; CUDA only)."""

    def __post_init__(self) -> None:
        _one_of("--model", self.model, MODELS)
        _one_of("--precision", self.precision, ("auto", *PRECISIONS))


@dataclass(frozen=True)
class OptimizerConfig:
    """Optimizer."""

    optimizer: str = field(default="adam", metadata=flag(metavar="NAME"))
    """adam, adamw or sgd (momentum 0.9)."""
    lr: float = 1e-3
    """Learning rate."""
    weight_decay: float = 0.0
    """Weight decay."""

    def __post_init__(self) -> None:
        _one_of("--optimizer", self.optimizer, OPTIMIZERS)
        _positive("--lr", self.lr)
        _non_negative("--weight-decay", self.weight_decay)


@dataclass(frozen=True)
class StepsConfig:
    """Steps: their size, their number and their order."""

    batch_size: int = batch.BATCH_SIZE
    """Samples per rank per micro-step; the global batch is batch_size * world size * accum_steps."""
    accum_steps: int = batch.ACCUM_STEPS
    """Micro-steps per optimizer step; gradients are all-reduced on the last one only (no_sync)."""
    epochs: int = 10
    """Passes over the training set."""
    max_steps: int = 0
    """Stop after this many optimizer steps in total (0: no limit)."""
    seed: int = 0
    """Seed of the weights, the synthetic data and the sampler's shuffle."""

    def __post_init__(self) -> None:
        _at_least_one("--batch-size", self.batch_size)
        _at_least_one("--accum-steps", self.accum_steps)
        _at_least_one("--epochs", self.epochs)
        _non_negative("--max-steps", self.max_steps)


@dataclass(frozen=True)
class SpeedConfig:
    """DDP and speed: how batches, gradients and steps move (defaults chosen by app bench and app scale --sweep)."""

    loader: str = field(default="memory", metadata=flag(metavar="KIND"))
    """memory: batches indexed from in-memory tensors (fast); dataloader: torch DataLoader (the same samples)."""
    optimizer_impl: str = field(default="fused", metadata=flag(metavar="KIND"))
    """fused (one kernel for all parameters), foreach (multi-tensor) or loop (per parameter)."""
    bucket_cap_mb: float = field(default=25.0, metadata=flag(metavar="MB"))
    """Gradient bucket size in MiB (DDP's default 25)."""
    gradient_as_bucket_view: bool = True
    """Gradients alias the all-reduce buckets: one copy less per step."""
    static_graph: bool = True
    """The graph is the same every step: DDP may reorder and skip its per-step checks (off with --accum-steps > 1)."""
    sync_bn: bool = False
    """Convert BatchNorm layers to SyncBatchNorm (CUDA only)."""
    comm_hook: str = field(default="none", metadata=flag(metavar="NAME"))
    """Gradients on the wire: none (DDP's fp32 all-reduce), fp16 or bf16 (half the bytes), powersgd (low rank)."""
    powersgd_rank: int = 2
    """PowerSGD's matrix approximation rank: each gradient matrix n x m travels as (n + m) x rank numbers."""
    powersgd_warmup: int = 10
    """Optimizer steps of plain all-reduce before PowerSGD compresses (>= 2): early gradients are the sensitive ones."""
    compile: bool = False
    """torch.compile the model (after DDP: its buckets become the graph's breaks); the first steps compile."""
    cuda_graphs: str = field(default="auto", metadata=flag(metavar="auto|on|off", alone="on"))
    """Capture the whole training step (forward, backward with DDP's all-reduce, optimizer) in one CUDA graph and
    replay it: on (CUDA only; --accum-steps 1, fp32 or bf16, --comm-hook none, no --compile), off (eager), or
    auto: on where it can be, else eager (the start line says why). --cuda-graphs alone is on."""

    def __post_init__(self) -> None:
        _one_of("--loader", self.loader, LOADERS)
        _one_of("--optimizer-impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        _positive("--bucket-cap-mb", self.bucket_cap_mb)
        _one_of("--comm-hook", self.comm_hook, COMM_HOOKS)
        _at_least_one("--powersgd-rank", self.powersgd_rank)
        if self.powersgd_warmup < POWERSGD_MIN_WARMUP:
            raise UsageError(
                f"--powersgd-warmup {self.powersgd_warmup} must be >= {POWERSGD_MIN_WARMUP}: PowerSGD's error "
                "feedback can only start once DDP has rebuilt its buckets (after 2 steps)"
            )
        _one_of("--cuda-graphs", self.cuda_graphs, CUDA_GRAPHS)


@dataclass(frozen=True)
class OutputConfig:
    """Output and checkpoints (written by global rank 0 only)."""

    out: Path = field(default=Path("runs"), metadata=flag(metavar="DIR"))
    """Output folder: checkpoints/, metrics.jsonl, summary.json, tensorboard/."""
    resume: str = field(default="none", metadata=flag(metavar="none|auto|PATH"))
    """none (refuse to overwrite earlier checkpoints), auto (the latest in OUT/checkpoints, if any) or a PATH."""
    checkpoint_every: int = 0
    """Also save every N optimizer steps (0: only at epoch ends and the end)."""
    checkpoint_every_epochs: int = 1
    """Save every N epochs (0: only the end)."""
    checkpoint_every_seconds: float = field(default=30.0, metadata=flag(metavar="S"))
    """Also save once this many seconds passed since the last checkpoint, so a failure loses at most about
    that much work (decided at each --exchange-every step, so that every rank agrees; 0: off)."""
    keep_checkpoints: int = 3
    """How many recent checkpoints to keep (older ones are deleted after a new one is safely written)."""
    tensorboard: bool = True
    """Write TensorBoard scalars to OUT/tensorboard/ (needs the tensorboard package; without it, off and said so)."""
    tensorboard_every: int = 10
    """Also write rank 0's training loss to TensorBoard every N optimizer steps (0: once per epoch only)."""
    quiet: bool = False
    """Print only errors and the final summary line."""

    def __post_init__(self) -> None:
        _non_negative("--checkpoint-every", self.checkpoint_every)
        _non_negative("--checkpoint-every-epochs", self.checkpoint_every_epochs)
        _non_negative("--checkpoint-every-seconds", self.checkpoint_every_seconds)
        _non_negative("--tensorboard-every", self.tensorboard_every)
        _at_least_one("--keep-checkpoints", self.keep_checkpoints)
        if self.resume not in ("none", "auto") and not Path(self.resume).is_file():
            raise UsageError(f"--resume {self.resume}: no such checkpoint file (use auto, none or an existing file)")


@dataclass(frozen=True)
class HealthConfig:
    """Stragglers and hangs (app/train/watch.py)."""

    exchange_every: int = 20
    """Every N optimizer steps the ranks share their step, data and compute times (one small all_gather):
    the slowest rank is named in metrics.jsonl (0: never; then --checkpoint-every-seconds must be 0 too)."""
    straggler_percent: float = field(default=50.0, metadata=flag(metavar="X"))
    """Name the slowest rank on the console (rank 0, one line) when it is busy more than X percent longer per step
    than the median rank."""

    def __post_init__(self) -> None:
        _non_negative("--exchange-every", self.exchange_every)
        _positive("--straggler-percent", self.straggler_percent)


@dataclass(frozen=True)
class TrainConfig:
    """One training run: one section per group of flags."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    steps: StepsConfig = field(default_factory=StepsConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    health: HealthConfig = field(default_factory=HealthConfig)

    def __post_init__(self) -> None:
        if self.speed.cuda_graphs == "on" and (blockers := graph_blockers(self, self.model.precision)):
            raise UsageError(blockers[0].error)
        if self.output.checkpoint_every_seconds and not self.health.exchange_every:
            raise UsageError(
                f"--checkpoint-every-seconds {self.output.checkpoint_every_seconds:g} needs the ranks' exchange to "
                "agree on the time: keep --exchange-every > 0, or pass --checkpoint-every-seconds 0"
            )


@dataclass(frozen=True)
class Blocker:
    """What keeps the whole step out of one CUDA graph."""

    reason: str
    """Why --cuda-graphs auto runs eagerly, in a few words for the start line."""
    error: str
    """The one-line error of --cuda-graphs on."""


def graph_blockers(cfg: TrainConfig, precision: str) -> list[Blocker]:
    """What in ``cfg`` (trained in ``precision``) keeps its step out of one CUDA graph, whatever the device; first
    the first to fix. (The device's part: app/train/auto.py.)"""
    found = []
    if cfg.speed.compile:
        found.append(
            Blocker("--compile", "--cuda-graphs with --compile: choose one (the compiled model is not captured)")
        )
    if cfg.speed.comm_hook != "none":
        found.append(
            Blocker(
                f"--comm-hook {cfg.speed.comm_hook} runs in Python",
                f"--cuda-graphs with --comm-hook {cfg.speed.comm_hook}: a Python comm hook runs once at capture, not "
                "at each replay: use --comm-hook none",
            )
        )
    if cfg.steps.accum_steps > 1:
        found.append(
            Blocker(
                f"--accum-steps {cfg.steps.accum_steps}",
                f"--cuda-graphs with --accum-steps {cfg.steps.accum_steps}: the graph is one whole optimizer step; "
                "use --accum-steps 1 (a larger --batch-size instead)",
            )
        )
    if precision == "fp16":
        named, fix = ("--precision fp16", "bf16 (no scaler) or fp32")
        if cfg.model.precision == "auto":
            named, fix = "--precision auto (fp16 on a GPU without bf16)", "fp32"
        found.append(
            Blocker(
                "fp16's GradScaler checks for overflow on the host",
                f"--cuda-graphs with {named}: GradScaler checks for overflow on the host at every step; "
                f"use --precision {fix}",
            )
        )
    return found


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in fields(TrainConfig)}  # type: ignore[misc]
"""TrainConfig's sections by field name, in the order of ``--help``."""
