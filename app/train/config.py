"""Typed configuration of one training run; every field validated on construction.

Precedence: command-line flags > these defaults. Each section is a frozen dataclass; a bad value
raises ``UsageError`` naming the flag and the fix.
"""

from dataclasses import dataclass, field
from pathlib import Path

from app.errors import UsageError

DATASETS = ("digits", "mnist", "cifar10", "synthetic")
MODELS = ("mlp", "cnn", "resnet18")
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adam", "adamw", "sgd")
OPTIMIZER_IMPLS = ("fused", "foreach", "loop")
LOADERS = ("memory", "dataloader")


def parse_shape(text: str) -> tuple[int, int, int]:
    """``1x28x28`` -> (1, 28, 28): channels x height x width."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UsageError(f"--input-shape {text!r} must be CxHxW with positive integers, e.g. 1x28x28")
    return int(parts[0]), int(parts[1]), int(parts[2])


def _positive(flag: str, value: float) -> None:
    if value <= 0:
        raise UsageError(f"{flag} {value} must be > 0")


def _non_negative(flag: str, value: float) -> None:
    if value < 0:
        raise UsageError(f"{flag} {value} must be >= 0 (0 turns it off)")


def _one_of(flag: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UsageError(f"{flag} {value!r} is not one of {', '.join(choices)}")


@dataclass(frozen=True)
class DataConfig:
    """Which samples, and how they reach the model."""

    dataset: str = "digits"
    """digits (scikit-learn, offline), mnist or cifar10 (torchvision, from data_dir) or synthetic."""
    data_dir: Path | None = None
    """Folder holding MNIST/ or cifar-10-batches-py/ (torchvision's layout); needed by mnist, cifar10."""
    download: bool = False
    """Download mnist/cifar10 into data_dir when missing (needs network)."""
    input_shape: tuple[int, int, int] = (1, 28, 28)
    """Shape of one synthetic sample (CxHxW)."""
    num_classes: int = 10
    """Classes of the synthetic data."""
    train_samples: int = 8192
    """Synthetic training samples."""
    test_samples: int = 1024
    """Synthetic test samples."""
    loader: str = "memory"
    """memory: batches indexed from in-memory tensors (fast); dataloader: torch DataLoader per sample."""
    workers: int = 0
    """DataLoader worker processes (loader=dataloader)."""

    def __post_init__(self) -> None:
        _one_of("--dataset", self.dataset, DATASETS)
        _one_of("--loader", self.loader, LOADERS)
        if self.dataset in ("mnist", "cifar10") and self.data_dir is None:
            raise UsageError(
                f"--dataset {self.dataset} reads files: pass --data-dir DIR (add --download to fetch them)"
            )
        if self.data_dir is not None and not self.download and not Path(self.data_dir).is_dir():
            raise UsageError(f"--data-dir {self.data_dir} is not a directory: create it or add --download")
        for flag, value in (
            ("--num-classes", self.num_classes),
            ("--train-samples", self.train_samples),
            ("--test-samples", self.test_samples),
        ):
            _positive(flag, value)
        if self.num_classes < 2:
            raise UsageError(f"--num-classes {self.num_classes} must be >= 2")
        _non_negative("--workers", self.workers)


@dataclass(frozen=True)
class OptimConfig:
    """Model, optimizer and the shape of one step."""

    model: str = "mlp"
    """mlp (the seed's 784-256-10), cnn (small, with BatchNorm) or resnet18 (needs torchvision)."""
    optimizer: str = "adam"
    """adam, adamw or sgd (momentum 0.9)."""
    optimizer_impl: str = "fused"
    """fused (one kernel for all parameters), foreach (multi-tensor) or loop (per parameter)."""
    lr: float = 1e-3
    """Learning rate."""
    weight_decay: float = 0.0
    """Weight decay."""
    batch_size: int = 64
    """Samples per rank per micro-step; the global batch is batch_size * world size * accum_steps."""
    accum_steps: int = 1
    """Micro-steps per optimizer step; gradients are all-reduced on the last one only (no_sync)."""
    epochs: int = 20
    """Passes over the training set."""
    max_steps: int = 0
    """Stop after this many optimizer steps in total (0: no limit)."""
    precision: str = "fp32"
    """fp32, bf16 (autocast; CPU or a GPU with bf16) or fp16 (autocast + GradScaler; CUDA only)."""
    seed: int = 0
    """Seed of the weights, the synthetic data and the sampler's shuffle."""

    def __post_init__(self) -> None:
        _one_of("--model", self.model, MODELS)
        _one_of("--optimizer", self.optimizer, OPTIMIZERS)
        _one_of("--optimizer-impl", self.optimizer_impl, OPTIMIZER_IMPLS)
        _one_of("--precision", self.precision, PRECISIONS)
        _positive("--lr", self.lr)
        _non_negative("--weight-decay", self.weight_decay)
        for flag, value in (
            ("--batch-size", self.batch_size),
            ("--accum-steps", self.accum_steps),
            ("--epochs", self.epochs),
        ):
            if value < 1:
                raise UsageError(f"{flag} {value} must be >= 1")
        _non_negative("--max-steps", self.max_steps)


@dataclass(frozen=True)
class DDPConfig:
    """The DDP knobs that decide speed; defaults chosen by ``python -m app bench``."""

    bucket_cap_mb: float = 25.0
    """Gradient bucket size in MiB (DDP's default 25)."""
    gradient_as_bucket_view: bool = True
    """Gradients alias the all-reduce buckets: one copy less per step."""
    static_graph: bool = True
    """The graph is the same every step: DDP may reorder and skip its per-step checks."""
    sync_bn: bool = False
    """Convert BatchNorm layers to SyncBatchNorm (CUDA only)."""

    def __post_init__(self) -> None:
        _positive("--bucket-cap-mb", self.bucket_cap_mb)


@dataclass(frozen=True)
class RunConfig:
    """Where results go, checkpoints, and what is printed."""

    out: Path = Path("runs")
    """Output folder: checkpoints/, metrics.jsonl, summary.json (written by global rank 0 only)."""
    resume: str = "none"
    """none (refuse to overwrite an earlier run's checkpoints), auto (latest in out/checkpoints) or a PATH."""
    checkpoint_every: int = 0
    """Also save every N optimizer steps (0: only at epoch ends and the end)."""
    checkpoint_every_epochs: int = 1
    """Save every N epochs (0: only the end)."""
    keep_checkpoints: int = 3
    """How many recent checkpoints to keep (older ones are deleted after a new one is safely written)."""
    quiet: bool = False
    """Print only errors and the final summary line."""
    crash_at_step: int = 0
    """Testing aid: after this optimizer step, on the first attempt only, exit abruptly (simulated failure)."""
    crash_rank: int = 0
    """Testing aid: which rank crashes at crash_at_step."""

    def __post_init__(self) -> None:
        for flag, value in (
            ("--checkpoint-every", self.checkpoint_every),
            ("--checkpoint-every-epochs", self.checkpoint_every_epochs),
            ("--crash-at-step", self.crash_at_step),
            ("--crash-rank", self.crash_rank),
        ):
            _non_negative(flag, value)
        if self.keep_checkpoints < 1:
            raise UsageError(f"--keep-checkpoints {self.keep_checkpoints} must be >= 1")
        if self.resume not in ("none", "auto") and not Path(self.resume).is_file():
            raise UsageError(f"--resume {self.resume}: no such checkpoint file (use auto, none or an existing file)")


@dataclass(frozen=True)
class TrainConfig:
    """One training run."""

    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    run: RunConfig = field(default_factory=RunConfig)
