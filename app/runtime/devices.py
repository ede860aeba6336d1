"""This node's GPUs as torch sees them: the facts that the backend rule and the doctor judge.

    found = devices.probe()      # NodeDevices(cuda=True, count=8, torch_cuda="13.0", driver_cuda="13.0", ...)
    devices.describe(0)          # ("NVIDIA H100 80GB HBM3", 85_520_809_984)
    devices.table_peak("NVIDIA H100 80GB HBM3")  # Peak(989.4, "data sheet (H100)"): dense bf16 TFLOP/s

Nothing here reads the environment: CUDA_VISIBLE_DEVICES acts through torch's own count. Tests
inject other facts by giving the rules a NodeDevices of their own, or, in a worker process of their
own, by replacing torch.cuda.is_available and torch.cuda.device_count.
"""

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import torch

SHM = Path("/dev/shm")
"""Where NCCL's shared-memory transport puts its segments."""


@dataclass(frozen=True)
class NodeDevices:
    """The GPU side of one node."""

    cuda: bool
    """torch can use CUDA here."""
    count: int
    """GPUs visible to this process (0 without CUDA)."""
    torch_cuda: str | None = None
    """The CUDA version torch was built with, e.g. 13.0 (None: a CPU build)."""
    driver_cuda: str | None = None
    """The newest CUDA version the driver supports, e.g. 13.0 (None: no driver)."""
    nccl: str | None = None
    """The NCCL version torch carries, e.g. 2.28.9 (None: none)."""
    shm_bytes: int | None = None
    """Size of /dev/shm (None: not mounted)."""


def _cuda_version(number: int) -> str:
    """12040 -> 12.4 (CUDA's encoding: 1000 x major + 10 x minor)."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _driver_cuda() -> str | None:
    """The newest CUDA version the driver supports: cuDriverGetVersion of the driver's own library (libcuda),
    which needs no CUDA context (torch has no public call for it)."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:  # no driver installed
        return None
    number = ctypes.c_int(0)
    if libcuda.cuDriverGetVersion(ctypes.byref(number)) != 0:
        return None
    return _cuda_version(number.value) if number.value > 0 else None


def _nccl() -> str | None:
    try:
        found = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return None
    return ".".join(map(str, found)) if isinstance(found, tuple) else str(found)


def shm_bytes(path: Path = SHM) -> int | None:
    """Size of the file system at ``path``, or None when it does not exist."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_frsize * stat.f_blocks


def probe() -> NodeDevices:
    """This node's facts, in well under a second (no CUDA context is created)."""
    cuda = torch.cuda.is_available()
    return NodeDevices(
        cuda=cuda,
        count=torch.cuda.device_count() if cuda else 0,
        torch_cuda=torch.version.cuda,
        driver_cuda=_driver_cuda() if cuda else None,
        nccl=_nccl() if cuda else None,
        shm_bytes=shm_bytes(),
    )


def describe(device: torch.device) -> tuple[str, int]:
    """(name, memory in bytes) of a device: the GPU's, or the CPU's (total RAM)."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return props.name, props.total_memory
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return "cpu", pages * size


PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989.4),
    ("GH200", 989.4),
    ("H100 NVL", 835.0),
    ("H100 PCIe", 756.5),
    ("H100", 989.4),  # SXM / HBM3
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.05),
    ("L4", 121.0),
    ("A10G", 70.0),
)
"""Dense bf16 tensor-core TFLOP/s by a part of the device name (first match wins: the longer names first)."""


@dataclass(frozen=True)
class Peak:
    """A GPU's dense bf16 peak and where it comes from."""

    tflops: float
    source: str
    """'data sheet (NAME)' or 'measured (bf16 matmul 8192^3)'."""


def table_peak(name: str) -> Peak | None:
    """The data-sheet peak of the GPU called ``name`` (as torch.cuda.get_device_name says), or None."""
    for part, tflops in PEAK_BF16_TFLOPS:
        if part in name:
            return Peak(tflops, f"data sheet ({part})")
    return None
