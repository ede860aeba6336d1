"""Datasets in memory: digits (real, offline), synthetic, and the resizing to the model's input."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.errors import UsageError
from app.train import data, models
from app.train.config import DataConfig

ROOT = Path(__file__).resolve().parents[2]


def test_digits_is_real_sklearn_data_split_80_20_stratified() -> None:
    ds = data.load_digits()
    assert (len(ds.train), len(ds.test)) == (1437, 360) and ds.shape == (1, 8, 8) and ds.num_classes == 10
    assert torch.bincount(ds.test.y, minlength=10).min() >= 35  # every class in the test split
    assert abs(ds.train.x.mean().item()) < 1e-4 and abs(ds.train.x.std().item() - 1) < 1e-3
    assert torch.equal(data.load_digits().train.x, ds.train.x)  # the split is fixed
    assert not torch.equal(data.load_digits(seed=1).test.y, ds.test.y)  # and chosen by the seed


def test_digits_are_scikit_learns_own_images_read_without_importing_it() -> None:
    script = """
import sys
from app.train import data
ds = data.load_digits()
assert "sklearn" not in sys.modules and "scipy" not in sys.modules, "scikit-learn was imported"
from sklearn.datasets import load_digits
bunch = load_digits()
torch = data.torch
def rows(x, y):  # each image as its pixels' integer levels 0-16 (normalisation is affine), with its label
    x = x.flatten(1).double()
    return sorted(zip((16 * (x - x.min()) / (x.max() - x.min())).round().int().tolist(), y.tolist()))
ours = rows(torch.cat([ds.train.x, ds.test.x]), torch.cat([ds.train.y, ds.test.y]))
assert ours == rows(torch.tensor(bunch.data), torch.tensor(bunch.target)), "not scikit-learn's digits"
"""
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT)


def test_the_stratified_split_shares_the_test_samples_by_class_size() -> None:
    y = torch.tensor([0] * 10 + [1] * 5 + [2] * 2)
    train, test = data.stratified_split(y, 0.3, seed=0)
    assert torch.bincount(y[test], minlength=3).tolist() == [3, 2, 1]  # ceil(5.1) = 6: 3 + 1.5 + 0.6
    assert sorted(torch.cat([train, test]).tolist()) == list(range(17))


def test_synthetic_has_the_asked_shape_and_is_deterministic() -> None:
    cfg = DataConfig(dataset="synthetic", input_shape=(3, 5, 7), num_classes=4, train_samples=20, test_samples=6)
    a, b = data.synthetic(cfg, seed=1), data.synthetic(cfg, seed=1)
    assert a.train.x.shape == (20, 3, 5, 7) and a.test.x.shape == (6, 3, 5, 7)
    assert int(a.train.y.max()) < 4 and torch.equal(a.train.x, b.train.x)
    assert not torch.equal(a.train.x, data.synthetic(cfg, seed=2).train.x)


def test_adapt_resizes_digits_for_the_mlp_and_resnet() -> None:
    ds = data.load_digits()
    mlp_in = data.adapt(ds.test, models.input_shape("mlp", ds.shape))
    assert mlp_in.x.shape == (360, 1, 28, 28) and torch.equal(mlp_in.y, ds.test.y)
    rgb = data.adapt(ds.test, models.input_shape("resnet18", ds.shape))
    assert rgb.x.shape == (360, 3, 32, 32) and torch.equal(rgb.x[:, 0], rgb.x[:, 2])
    assert data.adapt(ds.test, ds.shape).x is not None and models.input_shape("cnn", ds.shape) == (1, 8, 8)


def test_adapt_averages_colour_to_grey() -> None:
    x = torch.stack([torch.zeros(2, 2), torch.ones(2, 2), 2 * torch.ones(2, 2)]).unsqueeze(0)
    out = data.adapt(data.Split(x, torch.zeros(1, dtype=torch.int64)), (1, 2, 2))
    assert torch.allclose(out.x, torch.ones(1, 1, 2, 2))


def test_digits_without_scikit_learn_is_one_line_naming_the_fix(monkeypatch) -> None:
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError) as caught:
        data.load_digits()
    assert str(caught.value) == (
        "--dataset digits reads scikit-learn's digits.csv.gz, not found here: pip install scikit-learn"
    )
