"""MNIST, CIFAR-10 and ResNet-18 through torchvision's real loaders, on files the tests write.

Runs in .venv-tv (``make test-torchvision``: docker/versions.env's TV_TORCH_VERSION and
TORCHVISION_VERSION); skipped where torchvision does not import. No download: tiny MNIST idx files and CIFAR
pickle batches are built in tmp_path in the formats torchvision reads.
"""

import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from app.train import data
from app.train.config import DataConfig
from tests.integration.launchers import run_single
from tests.integration.train_runs import run_ranks, summary

pytest.importorskip("torchvision", reason="torchvision is not installed: run `make test-torchvision`")
pytestmark = [pytest.mark.torchvision, pytest.mark.integration]


def _idx(path: Path, magic: int, array: np.ndarray) -> None:
    path.write_bytes(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape) + array.tobytes())


def write_mnist(root: Path, n_train: int = 64, n_test: int = 20) -> dict:
    """MNIST-format files in root/MNIST/raw/ (idx: big-endian header, uint8 data)."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    made = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        images = rng.integers(0, 40, size=(n, 28, 28), dtype=np.uint8)
        images[np.arange(n), labels * 2, :] = 255  # a bright row that names the class
        _idx(raw / f"{prefix}-images-idx3-ubyte", 2051, images)
        _idx(raw / f"{prefix}-labels-idx1-ubyte", 2049, labels)
        made[prefix] = (images, labels)
    return made


def write_cifar(root: Path, per_batch: int = 8) -> np.ndarray:
    """CIFAR-10 python batches in root/cifar-10-batches-py/ (pickled dicts, uint8 rows of 3072)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    first = None
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        rows = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        first = rows if first is None else first
        batch = {"data": rows, "labels": [int(i) % 10 for i in range(per_batch)]}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    return first


def test_mnist_files_load_through_torchvision(tmp_path) -> None:
    made = write_mnist(tmp_path)
    ds = data.load(DataConfig(dataset="mnist", data_dir=tmp_path))
    assert (len(ds.train), len(ds.test), ds.shape) == (64, 20, (1, 28, 28))
    assert torch.equal(ds.train.y, torch.from_numpy(made["train"][1]).long())
    pixel = (made["t10k"][0][3, 5, 7] / 255.0 - 0.1307) / 0.3081
    assert ds.test.x[3, 0, 5, 7].item() == pytest.approx(pixel, rel=1e-5)


def test_cifar10_files_load_through_torchvision(tmp_path) -> None:
    first = write_cifar(tmp_path)
    ds = data.load(DataConfig(dataset="cifar10", data_dir=tmp_path))
    assert (len(ds.train), len(ds.test), ds.shape) == (40, 8, (3, 32, 32))
    red = first[2, :1024].reshape(32, 32)[4, 9] / 255.0  # rows hold R, then G, then B planes
    assert ds.train.x[2, 0, 4, 9].item() == pytest.approx((red - 0.4914) / 0.2470, rel=1e-5)


def test_missing_mnist_files_are_one_line(tmp_path) -> None:
    done = run_single(["train", "--dataset", "mnist", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o")])
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "MNIST files not found" in done.stderr and "--download" in done.stderr


def test_mlp_trains_on_mnist_files(tmp_path) -> None:
    write_mnist(tmp_path)
    out = tmp_path / "run"
    done = run_single(
        [
            "train",
            "--dataset",
            "mnist",
            "--data-dir",
            str(tmp_path),
            "--epochs",
            "2",
            "--batch-size",
            "16",
            "--out",
            str(out),
            "--quiet",
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert summary(out)["dataset"] == "mnist" and summary(out)["test_samples"] == 20


def test_resnet18_on_cifar10_two_ranks(tmp_path) -> None:
    write_cifar(tmp_path)
    out = tmp_path / "run"
    args = [
        "train",
        "--dataset",
        "cifar10",
        "--data-dir",
        str(tmp_path),
        "--model",
        "resnet18",
        "--epochs",
        "1",
        "--batch-size",
        "4",
        "--out",
        str(out),
        "--quiet",
    ]
    results = run_ranks(2, args, tmp_path)
    assert [r.returncode for r in results] == [0, 0], results[0].stderr[-3000:]
    s = summary(out)
    assert s["model"] == "resnet18" and s["step"] == 5 and s["params_identical"] is True


def test_resnet50_on_synthetic_224_images(tmp_path) -> None:
    # The classic per-GPU DDP benchmark's model and images (Horovod's synthetic benchmark), kept tiny:
    # 2 steps of 2 images per rank, 2 ranks.
    out = tmp_path / "run"
    shape = ["--dataset", "synthetic", "--input-shape", "3x224x224", "--train-samples", "8", "--test-samples", "4"]
    args = ["train", *shape, "--model", "resnet50", "--batch-size", "2", "--epochs", "1", "--out", str(out), "--quiet"]
    results = run_ranks(2, args, tmp_path)
    assert [r.returncode for r in results] == [0, 0], results[0].stderr[-3000:]
    s = summary(out)
    assert s["model"] == "resnet50" and s["step"] == 2 and s["params_identical"] is True
    assert s["channels_last"] is False  # channels_last is for CUDA; this runs on the CPU
