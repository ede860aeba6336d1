"""``python -m app train`` and ``bench`` bad input: one line on stderr, exit status 2, nothing written."""

import importlib.util

import pytest

from app.train import data
from tests.unit.cli_errors import usage_error as _fails

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dataset", "imagenet"], "--dataset 'imagenet' is not one of digits, mnist, cifar10, synthetic"),
        (["--dataset", "mnist"], "pass --data-dir DIR"),
        (["--dataset", "cifar10", "--data-dir", "/nonexistent/data"], "is not a directory"),
        (["--model", "vgg"], "--model 'vgg' is not one of"),
        (["--precision", "fp16"], "--precision fp16 needs a CUDA GPU"),
        (["--precision", "int8"], "--precision 'int8' is not one of"),
        (["--batch-size", "0"], "--batch-size 0 must be >= 1"),
        (["--accum-steps", "0"], "--accum-steps 0 must be >= 1"),
        (["--lr", "-1"], "--lr -1.0 must be > 0"),
        (["--input-shape", "1x28"], "must be CxHxW"),
        (["--resume", "/nonexistent/step.pt"], "no such checkpoint file"),
        (["--epochs", "many"], "argument --epochs: invalid int value"),
        (["--loader", "fast"], "--loader 'fast' is not one of memory, dataloader"),
        (["--backend", "mpi"], "invalid choice"),
        (["--cuda-graphs"], "--cuda-graphs needs a CUDA GPU, and this rank trains on cpu: drop --cuda-graphs"),
        (["--cuda-graphs", "on"], "--cuda-graphs needs a CUDA GPU, and this rank trains on cpu: drop --cuda-graphs"),
        (["--cuda-graphs", "always"], "--cuda-graphs 'always' is not one of auto, on, off"),
        (["--cuda-graphs", "--accum-steps", "2"], "--cuda-graphs with --accum-steps 2: the graph is one whole"),
        (["--cuda-graphs", "--precision", "fp16"], "--cuda-graphs with --precision fp16: GradScaler checks"),
        (["--cuda-graphs", "--compile"], "--cuda-graphs with --compile: choose one"),
        (["--cuda-graphs", "--comm-hook", "fp16"], "--cuda-graphs with --comm-hook fp16: a Python comm hook"),
    ],
)
def test_bad_flag_is_one_line(capsys, tmp_path, args: list[str], message: str) -> None:
    assert message in _fails(capsys, "train", "--out", str(tmp_path / "o"), *args)
    assert not (tmp_path / "o").exists()


@pytest.mark.skipif(HAS_TORCHVISION, reason="torchvision is installed here")
@pytest.mark.parametrize(
    "args", [["--model", "resnet18"], ["--model", "resnet50"], ["--dataset", "mnist", "--data-dir", "."]]
)
def test_torchvision_missing_is_one_line(capsys, tmp_path, args: list[str]) -> None:
    assert "needs torchvision" in _fails(capsys, "train", "--out", str(tmp_path), *args)


@pytest.mark.skipif(HAS_TORCHVISION, reason="torchvision is installed here")
def test_torchvision_missing_is_said_before_any_data_is_made(capsys, tmp_path, monkeypatch) -> None:
    # 8192 synthetic 3x224x224 images are 4.9 GB: the line came after 35 s of making them.
    monkeypatch.setattr(data, "load", lambda *a, **k: pytest.fail("the data was made before the model was checked"))
    args = ["--model", "resnet50", "--dataset", "synthetic", "--input-shape", "3x224x224"]
    assert "needs torchvision" in _fails(capsys, "train", "--out", str(tmp_path), *args)


def test_resume_none_refuses_to_overwrite_checkpoints(capsys, tmp_path) -> None:
    ckpt = tmp_path / "checkpoints" / "step-00000004.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"an earlier run")
    err = _fails(capsys, "train", "--out", str(tmp_path), "--max-steps", "1")
    assert "already holds checkpoints" in err and "--resume auto" in err
    assert ckpt.read_bytes() == b"an earlier run"


def test_bench_bad_numbers(capsys) -> None:
    assert "--rounds" in _fails(capsys, "bench", "--rounds", "0")
