"""The models: the seed's MLP, a small CNN with BatchNorm, torchvision's ResNet-18 and ResNet-50.

``input_shape(model, data_shape)`` says what one sample must look like for the model; the data
is resized to it once, in memory (``data.adapt``). ``memory_format(model, device)`` is the layout
its images take: channels_last for the conv models on CUDA (NHWC: what cuDNN's tensor-core
convolutions read without transposing), the default elsewhere.

    python -m app train --model resnet50 --dataset synthetic --input-shape 3x224x224 --precision bf16 \
        --batch-size 128     # the classic per-GPU DDP benchmark (img/s per GPU), on synthetic images
"""

import torch
from torch import nn

from app.errors import UsageError


def mlp(num_classes: int = 10) -> nn.Module:
    """The seed's model: Flatten, Linear 784-256, ReLU, Linear 256-10 (1x28x28 input)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, num_classes))


def cnn(channels: int, num_classes: int = 10) -> nn.Module:
    """Two 3x3 conv + BatchNorm + ReLU blocks, a max pool, a 4x4 average pool, a linear head."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 3, padding=1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.AdaptiveAvgPool2d(4),
        nn.Flatten(),
        nn.Linear(64 * 16, num_classes),
    )


TORCHVISION = ("resnet18", "resnet50")
"""The models torchvision builds."""
CONV = ("cnn", *TORCHVISION)
"""The models whose images go channels_last on CUDA."""


def require(name: str):
    """torchvision's model module when ``name`` is one of its models (None for the others); a one-line
    UsageError when torchvision does not import. app train asks first, before any data is made."""
    if name not in TORCHVISION:
        return None
    try:
        from torchvision import models as tv_models
    except ImportError as error:
        raise UsageError(
            f"--model {name} needs torchvision, which does not import here ({error}): "
            "install the torchvision that matches torch, or use --model mlp or cnn"
        ) from None
    return tv_models


def torchvision_model(name: str, num_classes: int = 10) -> nn.Module:
    """torchvision's ``name`` (resnet18, resnet50), randomly initialised (no weights are downloaded)."""
    return getattr(require(name), name)(weights=None, num_classes=num_classes)


def input_shape(model: str, data_shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """The sample shape ``model`` takes, given the dataset's own shape."""
    if model == "mlp":
        return (1, 28, 28)
    if model in TORCHVISION:
        return (3, max(32, data_shape[1]), max(32, data_shape[2]))
    return data_shape


def memory_format(model: str, device: torch.device) -> torch.memory_format:
    """channels_last for the conv models on CUDA, else the default (contiguous) layout."""
    return torch.channels_last if model in CONV and device.type == "cuda" else torch.contiguous_format


def build(model: str, data_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """A freshly initialised ``model`` for samples of ``input_shape(model, data_shape)``."""
    if model == "mlp":
        return mlp(num_classes)
    if model == "cnn":
        return cnn(data_shape[0], num_classes)
    if model in TORCHVISION:
        return torchvision_model(model, num_classes)
    raise UsageError(f"--model {model!r} is not one of mlp, cnn, {', '.join(TORCHVISION)}")
