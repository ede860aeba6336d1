"""Models, precision, the optimizer and the reporter, each on its own."""

import io
import json

import pytest
import torch

from app.errors import UsageError
from app.train import models, precision
from app.train.report import Reporter, format_epoch
from app.train.trainer import build_optimizer

CPU = torch.device("cpu")


def test_mlp_is_the_seed_model() -> None:
    m = models.mlp()
    assert [type(x).__name__ for x in m] == ["Flatten", "Linear", "ReLU", "Linear"]
    assert (m[1].in_features, m[1].out_features, m[3].out_features) == (784, 256, 10)
    assert m(torch.zeros(5, 1, 28, 28)).shape == (5, 10)


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32), (1, 28, 28)])
def test_cnn_has_batchnorm_and_takes_any_shape(shape: tuple) -> None:
    m = models.build("cnn", shape, 10)
    assert any(isinstance(x, torch.nn.BatchNorm2d) for x in m.modules())
    assert m(torch.zeros(2, *shape)).shape == (2, 10)


def test_precision_choices() -> None:
    assert precision.make("fp32", CPU).scaler is None
    bf16 = precision.make("bf16", CPU)
    with bf16.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with pytest.raises(UsageError, match="fp16 needs a CUDA GPU"):
        precision.make("fp16", CPU)
    with pytest.raises(UsageError, match="no bfloat16 support"):
        precision.check_supported("bf16", torch.device("cuda", 0), bf16_supported=False)


@pytest.mark.parametrize(
    "name, cls", [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD)]
)
@pytest.mark.parametrize(
    "impl, fused, foreach", [("fused", True, None), ("foreach", None, True), ("loop", None, False)]
)
def test_optimizer_kinds(name: str, cls, impl: str, fused, foreach) -> None:
    model = torch.nn.Linear(2, 2)
    opt = build_optimizer(name, model.parameters(), 0.1, 0.0, impl)
    group = opt.param_groups[0]
    assert type(opt) is cls and group["fused"] == fused and group["foreach"] == foreach
    model(torch.ones(1, 2)).sum().backward()
    opt.step()  # every kind runs on CPU


RECORD = {
    "epoch": 0,
    "epochs": 2,
    "step": 5,
    "train_loss": 1.5,
    "test_loss": 1.25,
    "test_accuracy": 0.5,
    "test_correct": 9,
    "test_samples": 18,
    "samples_per_s": 1234.0,
    "step_ms": 2.5,
    "seconds": 1.0,
}


def test_reporter_on_rank_0_prints_and_keeps_metrics(tmp_path) -> None:
    stream = io.StringIO()
    with Reporter(tmp_path, enabled=True, stream=stream) as reporter:
        reporter.epoch(RECORD)
        assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1  # line-buffered: written at once
    assert stream.getvalue() == format_epoch(RECORD) + "\n"
    assert "acc 50.00% (9/18)" in stream.getvalue() and "1234 samples/s" in stream.getvalue()
    assert json.loads((tmp_path / "metrics.jsonl").read_text())["test_correct"] == 9


def test_reporter_quiet_and_other_ranks(tmp_path) -> None:
    stream = io.StringIO()
    with Reporter(tmp_path / "q", enabled=True, quiet=True, stream=stream) as reporter:
        reporter.epoch(RECORD)
    Reporter(tmp_path / "r1", enabled=False, stream=stream).epoch(RECORD)
    assert stream.getvalue() == ""
    assert (tmp_path / "q" / "metrics.jsonl").exists() and not (tmp_path / "r1").exists()


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _epoch_with_bar(stream: io.StringIO, tmp_path) -> str:
    with Reporter(tmp_path, enabled=True, stream=stream) as reporter:
        with reporter.bar(0, 2, 0, 4) as bar:
            for _ in range(4):
                bar.advance(torch.tensor(0.5))
        reporter.epoch(RECORD)
    return stream.getvalue()


def test_a_terminal_gets_tqdm_bar_then_the_epoch_line(tmp_path) -> None:
    shown = _epoch_with_bar(_Terminal(), tmp_path)
    assert "\repoch 1/2:   0%|" in shown and "0/4" in shown and "batch/s" in shown
    assert shown.endswith("\r" + format_epoch(RECORD) + "\n")  # the bar's line is cleared first


def test_a_file_or_pipe_gets_the_epoch_line_alone(tmp_path) -> None:
    assert _epoch_with_bar(io.StringIO(), tmp_path) == format_epoch(RECORD) + "\n"
