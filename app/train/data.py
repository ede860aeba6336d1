"""Datasets as in-memory tensors: digits (scikit-learn, offline), MNIST and CIFAR-10 (torchvision), synthetic.

Every dataset becomes two ``Split``s of float32 images (N, C, H, W), normalised, and int64 labels;
``adapt`` then resizes them once to the shape the model takes (digits' 8x8 -> 28x28 for the MLP).
MNIST and CIFAR-10 are read by torchvision's own loaders from ``--data-dir`` (its layout:
DIR/MNIST/raw/*-ubyte, DIR/cifar-10-batches-py/data_batch_*).
"""

import gzip
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F

from app.errors import UsageError, first_line
from app.train.config import DataConfig

MNIST_MEAN_STD = ((0.1307,), (0.3081,))
CIFAR_MEAN_STD = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))


@dataclass(frozen=True)
class Split:
    """Images and labels of one split, in memory."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])


@dataclass(frozen=True)
class Dataset:
    """A train and a test split with their sample shape and class count."""

    name: str
    train: Split
    test: Split
    num_classes: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.train.x.shape[1:])  # type: ignore[return-value]


def _normalise(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    m = torch.tensor(mean, dtype=x.dtype).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=x.dtype).view(1, -1, 1, 1)
    return (x - m) / s


def load_digits(seed: int = 0) -> Dataset:
    """scikit-learn's 1,797 handwritten 8x8 digits; a stratified 80/20 split, fixed by ``seed``.

    The images are read from the file scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``,
    64 pixels and the label per row) without importing scikit-learn: its import (scipy with it) is
    about a second of every rank's start, and every restart's.
    """
    path = _sklearn_data("digits.csv.gz")
    with gzip.open(path, "rt", encoding="ascii") as rows:
        table = torch.tensor([[float(v) for v in row.split(",")] for row in rows if row.strip()])
    x = table[:, :64].reshape(-1, 1, 8, 8) / 16.0
    y = table[:, 64].to(torch.int64)
    train_idx, test_idx = stratified_split(y, TEST_FRACTION, seed)
    mean, std = x[train_idx].mean().item(), x[train_idx].std().item()
    x = _normalise(x, (mean,), (std,))
    return Dataset("digits", Split(x[train_idx], y[train_idx]), Split(x[test_idx], y[test_idx]), 10)


TEST_FRACTION = 0.2
"""The digits' test split: a fifth of each class (360 of 1,797 images)."""


def _sklearn_data(name: str) -> Path:
    """A data file scikit-learn ships, found without importing scikit-learn."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(next(iter(spec.submodule_search_locations or []), "")) / "datasets" / "data" / name if spec else None
    if path is None or not path.is_file():
        raise UsageError(f"--dataset digits reads scikit-learn's {name}, not found here: pip install scikit-learn")
    return path


def stratified_split(y: torch.Tensor, test_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, test) indices: ``ceil(test_fraction * N)`` test samples shared among the classes by their
    sizes (largest remainders first), each class's chosen by a permutation seeded with ``seed``."""
    counts = torch.bincount(y)
    n_test = math.ceil(test_fraction * len(y))
    quota = counts.double() * n_test / len(y)
    share = quota.floor().long()
    for c in sorted(range(len(counts)), key=lambda c: (-(quota[c] - share[c]).item(), c))[: n_test - int(share.sum())]:
        share[c] += 1
    g = torch.Generator().manual_seed(seed)
    train, test = [], []
    for c, k in enumerate(share.tolist()):
        members = torch.nonzero(y == c).flatten()
        members = members[torch.randperm(len(members), generator=g)]
        test.append(members[:k])
        train.append(members[k:])
    return torch.cat(train).sort().values, torch.cat(test).sort().values


def synthetic(cfg: DataConfig, seed: int = 0) -> Dataset:
    """Gaussian images labelled by a fixed random linear teacher: learnable, any shape, no files."""
    g = torch.Generator().manual_seed(seed)
    n = cfg.train_samples + cfg.test_samples
    x = torch.randn((n, *cfg.input_shape), generator=g)
    teacher = torch.randn((x[0].numel(), cfg.num_classes), generator=g)
    y = (x.flatten(1) @ teacher).argmax(dim=1)
    cut = cfg.train_samples
    return Dataset("synthetic", Split(x[:cut], y[:cut]), Split(x[cut:], y[cut:]), cfg.num_classes)


def _torchvision():
    try:
        import torchvision
    except ImportError as error:
        raise UsageError(
            f"this needs torchvision, which does not import here ({error}): "
            "install the torchvision that matches torch, or use --dataset digits"
        ) from None
    return torchvision


def _torchvision_split(cls, root: Path, train: bool, download: bool, layout: str):
    try:
        return cls(root=str(root), train=train, download=download)
    except RuntimeError as error:
        raise UsageError(
            f"{cls.__name__} files not found under {root} ({first_line(error)}): "
            f"put them in {root}/{layout} or add --download"
        ) from None


def load_mnist(root: Path, download: bool) -> Dataset:
    """MNIST through torchvision.datasets.MNIST (reads DIR/MNIST/raw/*-ubyte)."""
    tv = _torchvision()
    splits = []
    for train in (True, False):
        ds = _torchvision_split(tv.datasets.MNIST, root, train, download, "MNIST/raw/")
        x = _normalise(ds.data.float().unsqueeze(1) / 255.0, *MNIST_MEAN_STD)
        splits.append(Split(x, ds.targets.long()))
    return Dataset("mnist", splits[0], splits[1], 10)


def load_cifar10(root: Path, download: bool) -> Dataset:
    """CIFAR-10 through torchvision.datasets.CIFAR10 (reads DIR/cifar-10-batches-py/)."""
    tv = _torchvision()
    splits = []
    for train in (True, False):
        ds = _torchvision_split(_cifar_class(tv), root, train, download, "cifar-10-batches-py/")
        x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float() / 255.0
        splits.append(Split(_normalise(x, *CIFAR_MEAN_STD), torch.tensor(ds.targets, dtype=torch.int64)))
    return Dataset("cifar10", splits[0], splits[1], 10)


def _cifar_class(tv):
    """torchvision's CIFAR10 with its md5 sums dropped, so that it checks the files exist.

    The sums guard downloads; files the user placed (or a test wrote) are still required, and
    read by torchvision's own code.
    """
    base = tv.datasets.CIFAR10

    class CIFAR10(base):
        train_list: ClassVar = [(name, None) for name, _ in base.train_list]
        test_list: ClassVar = [(name, None) for name, _ in base.test_list]
        meta: ClassVar = {**base.meta, "md5": None}

    return CIFAR10


def load(cfg: DataConfig, seed: int = 0) -> Dataset:
    """The dataset ``cfg`` names, in memory."""
    if cfg.dataset == "digits":
        return load_digits(seed)
    if cfg.dataset == "synthetic":
        return synthetic(cfg, seed)
    assert cfg.data_dir is not None  # DataConfig checked it
    if cfg.dataset == "mnist":
        return load_mnist(Path(cfg.data_dir), cfg.download)
    return load_cifar10(Path(cfg.data_dir), cfg.download)


def adapt(split: Split, shape: tuple[int, int, int]) -> Split:
    """Resize images to ``shape`` (CxHxW): channels repeated or averaged, bilinear resampling."""
    x = split.x
    channels, height, width = shape
    if x.shape[1] != channels:
        x = x.mean(dim=1, keepdim=True) if channels == 1 else x.mean(dim=1, keepdim=True).expand(-1, channels, -1, -1)
    if tuple(x.shape[2:]) != (height, width):
        x = F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False)
    return Split(x.contiguous(), split.y)


def adapt_dataset(data: Dataset, shape: tuple[int, int, int]) -> Dataset:
    """Both splits resized to ``shape``."""
    return Dataset(data.name, adapt(data.train, shape), adapt(data.test, shape), data.num_classes)
