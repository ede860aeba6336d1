"""Mixed precision with torch.amp: fp32, bf16 (autocast) or fp16 (autocast + GradScaler).

fp16 needs CUDA (its GradScaler guards against fp16's narrow range); bf16 runs on CPU and on GPUs
that support it. Any other combination is a ``UsageError`` that names the fix.
"""

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from app.errors import UsageError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Precision:
    """Autocast for the forward pass and an optional GradScaler for the backward pass."""

    name: str
    device: torch.device
    scaler: torch.amp.GradScaler | None

    def autocast(self) -> AbstractContextManager:
        """The context in which the forward pass and the loss run."""
        if self.name == "fp32":
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=DTYPES[self.name])


def check_supported(name: str, device: torch.device, bf16_supported: bool | None = None) -> None:
    """Raise UsageError when ``name`` cannot run on ``device``."""
    if name == "fp16" and device.type != "cuda":
        raise UsageError(
            "--precision fp16 needs a CUDA GPU (GradScaler on CPU is not supported here): "
            "use --precision bf16 or fp32 on CPU"
        )
    if name == "bf16" and device.type == "cuda":
        supported = torch.cuda.is_bf16_supported() if bf16_supported is None else bf16_supported
        if not supported:
            raise UsageError(f"--precision bf16: {device} has no bfloat16 support: use --precision fp16 or fp32")


def make(name: str, device: torch.device) -> Precision:
    """The Precision for ``name`` on ``device``, after checking that it is supported."""
    check_supported(name, device)
    scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
    return Precision(name, device, scaler)
