"""Achieved TFLOP/s per GPU and MFU (model FLOPs utilisation) of a training run.

    per_sample = flops.per_sample(model, x, y, precision)  # FLOPs of one sample's forward + backward
    peak = flops.peak(device)                              # Peak: the GPU's dense bf16 TFLOP/s, and whence
    achieved = per_sample * samples / seconds / 1e12       # TFLOP/s on this GPU; MFU = achieved / peak.tflops

FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` over one forward and backward
pass of a copy of the model (the real one is left untouched: no gradients, no BatchNorm
statistics); the optimizer's elementwise work is not counted, as in the usual MFU definition. The
peak is the GPU's dense (no sparsity) bf16 tensor-core figure from its vendor's data sheet for the
GPUs in ``app.runtime.devices.PEAK_BF16_TFLOPS`` (``app check`` judges GPUs against it too); for
any other GPU it is measured: the best of a few bf16 matrix products of 8192 x 8192 (what ``app
check`` measures too), so its MFU is against what this GPU reaches, not a data sheet. ``app
train``, ``app bench`` and ``app scale`` show both on CUDA.
"""

import copy
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from app.runtime.devices import Peak, table_peak
from app.train.precision import Precision

MATMUL_N = 8192
MATMUL_REPEATS = 10


def per_sample(model: nn.Module, x: torch.Tensor, y: torch.Tensor, precision: Precision) -> float:
    """FLOPs of one sample's forward and backward pass (counted on a copy of ``model`` over the batch ``x, y``)."""
    twin = copy.deepcopy(model)
    twin.train()
    with FlopCounterMode(display=False) as counter:
        with precision.autocast():
            loss = F.cross_entropy(twin(x), y)
        loss.backward()
    return counter.get_total_flops() / max(int(x.shape[0]), 1)


def measured_peak(device: torch.device) -> Peak:
    """The best bf16 matrix-product rate of ``device`` over a few products (a second or so)."""
    a = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device=device, dtype=torch.bfloat16)
    torch.matmul(a, b)
    best = float("inf")
    for _ in range(MATMUL_REPEATS):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.matmul(a, b)
        torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return Peak(2 * MATMUL_N**3 / best / 1e12, f"measured (bf16 matmul {MATMUL_N}^3)")


def peak(device: torch.device) -> Peak:
    """The dense bf16 peak of the GPU ``device``: its data sheet's when known, else measured."""
    return table_peak(torch.cuda.get_device_name(device)) or measured_peak(device)


def achieved(per_sample_flops: float, samples: float, seconds: float) -> float:
    """TFLOP/s of ``samples`` samples trained in ``seconds`` on one GPU."""
    return per_sample_flops * samples / seconds / 1e12 if seconds > 0 else 0.0


def describe(tflops: float, top: Peak) -> dict:
    """The record fields: achieved TFLOP/s per GPU, MFU against ``top``, and the peak's source."""
    return {"tflops_per_gpu": tflops, "mfu": tflops / top.tflops, "peak_tflops": top.tflops, "peak_source": top.source}
