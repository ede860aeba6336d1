"""TrainConfig sections validate on construction and name the flag to fix."""

import pytest

from app.errors import UsageError
from app.train.config import (
    DataConfig,
    HealthConfig,
    OptimizerConfig,
    OutputConfig,
    SpeedConfig,
    StepsConfig,
    TrainConfig,
    parse_shape,
)


def test_defaults_are_the_offline_digits_mlp_run() -> None:
    cfg = TrainConfig()
    assert (cfg.data.dataset, cfg.model.model, cfg.steps.batch_size) == ("digits", "mlp", 64)
    assert cfg.model.precision == "auto" and cfg.optim.optimizer == "adam" and cfg.optim.lr == 1e-3
    assert cfg.speed.gradient_as_bucket_view and cfg.speed.static_graph and cfg.speed.loader == "memory"
    assert str(cfg.output.out) == "runs" and cfg.output.resume == "none"


@pytest.mark.parametrize("text, shape", [("1x28x28", (1, 28, 28)), ("3X32x32", (3, 32, 32))])
def test_parse_shape(text: str, shape: tuple) -> None:
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["28x28", "1x0x28", "ax28x28", ""])
def test_parse_shape_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="CxHxW"):
        parse_shape(text)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: DataConfig(dataset="svhn"), "--dataset 'svhn'"),
        (lambda: DataConfig(dataset="mnist"), "--data-dir"),
        (lambda: DataConfig(num_classes=1), "--num-classes 1 must be >= 2"),
        (lambda: DataConfig(train_samples=0), "--train-samples 0 must be > 0"),
        (lambda: DataConfig(workers=-1), "--workers -1"),
        (lambda: OptimizerConfig(optimizer="lamb"), "--optimizer 'lamb'"),
        (lambda: StepsConfig(epochs=0), "--epochs 0 must be >= 1"),
        (lambda: StepsConfig(max_steps=-2), "--max-steps -2"),
        (lambda: OptimizerConfig(weight_decay=-0.1), "--weight-decay"),
        (lambda: SpeedConfig(bucket_cap_mb=0), "--bucket-cap-mb 0"),
        (lambda: OutputConfig(keep_checkpoints=0), "--keep-checkpoints 0"),
        (lambda: OutputConfig(checkpoint_every=-1), "--checkpoint-every -1"),
        (lambda: OutputConfig(resume="/no/such/file.pt"), "no such checkpoint file"),
        (lambda: OutputConfig(checkpoint_every_seconds=-5), "--checkpoint-every-seconds -5"),
        (lambda: HealthConfig(exchange_every=-1), "--exchange-every -1"),
        (lambda: HealthConfig(straggler_percent=0), "--straggler-percent 0 must be > 0"),
        (lambda: TrainConfig(health=HealthConfig(exchange_every=0)), "--checkpoint-every-seconds 30 needs the ranks'"),
    ],
)
def test_bad_values_name_the_flag(build, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        build()


def test_data_dir_must_exist_unless_downloading(tmp_path) -> None:
    assert DataConfig(dataset="mnist", data_dir=tmp_path).data_dir == tmp_path
    assert DataConfig(dataset="mnist", data_dir=tmp_path / "new", download=True).download
    with pytest.raises(UsageError, match="is not a directory"):
        DataConfig(dataset="mnist", data_dir=tmp_path / "new")
