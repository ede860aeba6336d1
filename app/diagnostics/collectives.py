"""What each collective of ``app comm`` is: its buffers, its exact expected values, its bandwidth.

    from app.diagnostics import collectives as c
    bufs = c.make_buffers("all_gather", count, rank, world, torch.float32, device, modulus, fill=True)
    bufs.step()                                   # one all_gather over count elements (nccl-tests' S)
    wrong, senders = c.verify("all_gather", bufs, count, rank, world, modulus)
    algbw, busbw = c.bandwidths("all_gather", nbytes, seconds, world)

What S (the size), busbw's factor and the fill values are is told once, in ``python -m app comm
--help`` (app/diagnostics/comm.py's docstring); the code below follows it.
"""

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from app.errors import UsageError

MAX_MODULUS = 127
"""Fill values are (i + rank) mod K with K a prime up to this."""


@dataclass(frozen=True)
class DType:
    """An element type of the sweep."""

    torch_dtype: torch.dtype
    label: str
    """nccl-tests' name for it (the type column)."""
    exact: int
    """Every integer from 0 to this is exact in the type, so sums below it are too."""


DTYPES = {
    "float32": DType(torch.float32, "float", 1 << 24),
    "bf16": DType(torch.bfloat16, "bfloat16", 1 << 8),
    "fp16": DType(torch.float16, "half", 1 << 11),
    "fp8": DType(torch.float8_e4m3fn, "f8e4m3", 1 << 4),
}


@dataclass(frozen=True)
class Collective:
    """How one collective is named, sized and scored."""

    name: str
    redop: str
    root: int
    chunked: bool
    """The size splits into n chunks (one per rank): its count rounds down to a multiple of n."""
    bus_factor: Callable[[int], float]
    """busbw / algbw for n ranks (nccl-tests' doc/PERFORMANCE.md)."""


def _ring(n: int) -> float:
    return 2 * (n - 1) / n


def _spread(n: int) -> float:
    return (n - 1) / n


def _one(n: int) -> float:
    return 1.0


COLLECTIVES = {
    c.name: c
    for c in (
        Collective("all_reduce", "sum", -1, False, _ring),
        Collective("all_gather", "none", -1, True, _spread),
        Collective("reduce_scatter", "sum", -1, True, _spread),
        Collective("broadcast", "none", 0, False, _one),
        Collective("all_to_all", "none", -1, True, _spread),
        Collective("send_recv", "none", -1, False, _one),
    )
}
OPS = tuple(COLLECTIVES)


_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str, flag: str) -> int:
    """Bytes from '8', '64K', '64M', '1G' or '64MiB' (binary multiples, as nccl-tests' -b/-e)."""
    match = _SIZE.match(str(text))
    if not match:
        raise UsageError(f"{flag} {text!r} is not a size: write bytes as 8, 64K, 64M or 1G (binary multiples)")
    return int(match.group(1)) * _UNITS[match.group(2).lower()]


def size_parser(flag: str) -> Callable[[str], int]:
    """``parse_size`` for one flag, as ``app.flags`` takes it: ``flag(parse=size_parser("--bytes"))``."""

    def size(text: str) -> int:
        return parse_size(text, flag)

    return size


def format_size(nbytes: int) -> str:
    """'64 MiB', '512 KiB', '8 B': the largest binary unit that divides the size."""
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor} {unit}"
    return f"{nbytes} B"


def element_count(op: str, nbytes: int, elem_size: int, world: int) -> int:
    """Elements of the buffer for a requested size: chunked collectives round down to n, at least 1 per rank."""
    count = max(1, nbytes // elem_size)
    if COLLECTIVES[op].chunked:
        count = max(world, count - count % world)
    return count


def bandwidths(op: str, nbytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for ``nbytes`` (nccl-tests' S) moved in ``seconds`` on ``world`` ranks."""
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * COLLECTIVES[op].bus_factor(world)


def fill_modulus(dtype: str, world: int) -> int:
    """K: fill values are 0..K-1, so a sum over ``world`` ranks stays exact; the largest prime that fits."""
    bound = min(MAX_MODULUS, DTYPES[dtype].exact // world + 1)
    for k in range(bound, 1, -1):
        if all(k % d for d in range(2, math.isqrt(k) + 1)):
            return k
    return 1


def _pattern(rank: int, modulus: int) -> torch.Tensor:
    """One period of rank ``rank``'s fill values, as float32 (exact small integers)."""
    return ((torch.arange(modulus) + rank) % modulus).to(torch.float32)


def _tile(period: torch.Tensor, start: int, numel: int) -> torch.Tensor:
    """Elements start..start+numel of the periodic sequence that ``period`` repeats."""
    k = period.numel()
    rolled = period.roll(-(start % k))
    return rolled.repeat(-(-numel // k))[:numel]


def rank_data(rank: int, numel: int, modulus: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """What rank ``rank`` sends: element i is (i + rank) mod modulus."""
    return _tile(_pattern(rank, modulus), 0, numel).to(device=device, dtype=dtype)


class Buffers(NamedTuple):
    """One collective's tensors on one rank; ``step`` launches it once."""

    send: torch.Tensor
    recv: torch.Tensor
    step: Callable[[], object]


def _gather_single() -> Callable:
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_single() -> Callable:
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _send_recv(send: torch.Tensor, recv: torch.Tensor, rank: int, world: int) -> None:
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def make_buffers(
    op: str, count: int, rank: int, world: int, dtype: torch.dtype, device: torch.device, modulus: int, fill: bool
) -> Buffers:
    """Tensors for ``op`` over ``count`` elements (nccl-tests' S), filled for checking when ``fill``."""
    chunk = count // world if COLLECTIVES[op].chunked else count
    send_numel = chunk if op == "all_gather" else count
    recv_numel = chunk if op == "reduce_scatter" else count
    if fill:
        send = rank_data(rank, send_numel, modulus, dtype, device)
        recv = torch.full((recv_numel,), math.nan, dtype=dtype, device=device)
    else:
        send = torch.zeros(send_numel, dtype=dtype, device=device)
        recv = torch.zeros(recv_numel, dtype=dtype, device=device)
    if op == "all_reduce":
        return Buffers(send, send, lambda: dist.all_reduce(send))
    if op == "broadcast":
        buf = send if rank == 0 else recv
        return Buffers(buf, buf, lambda: dist.broadcast(buf, src=0))
    if op == "all_gather":
        return Buffers(send, recv, lambda: _gather_single()(recv, send))
    if op == "reduce_scatter":
        return Buffers(send, recv, lambda: _reduce_scatter_single()(recv, send))
    if op == "all_to_all":
        return Buffers(send, recv, lambda: dist.all_to_all_single(recv, send))
    return Buffers(send, recv, lambda: _send_recv(send, recv, rank, world))


def expected(op: str, count: int, rank: int, world: int, modulus: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The exact result on ``rank`` (float32) and, where the layout tells it, each element's sender."""
    chunk = count // world if COLLECTIVES[op].chunked else count
    periods = [_pattern(r, modulus) for r in range(world)]
    if op in ("all_reduce", "reduce_scatter"):
        start = rank * chunk if op == "reduce_scatter" else 0
        return _tile(torch.stack(periods).sum(0), start, chunk), None
    if op in ("all_gather", "all_to_all"):
        start = rank * chunk if op == "all_to_all" else 0
        parts = [_tile(p, start, chunk) for p in periods]
        return torch.cat(parts), torch.arange(world).repeat_interleave(chunk)
    sender = 0 if op == "broadcast" else (rank - 1) % world
    return _tile(periods[sender], 0, count), torch.full((count,), sender)


def verify(op: str, bufs: Buffers, count: int, rank: int, world: int, modulus: int) -> tuple[int, list[int]]:
    """(wrong elements, ranks whose data arrived wrong) for the result in ``bufs.recv``."""
    want, senders = expected(op, count, rank, world, modulus)
    wrong = bufs.recv.detach().to("cpu", torch.float32) != want
    nwrong = int(wrong.sum())
    if nwrong == 0 or senders is None:
        return nwrong, []
    return nwrong, sorted(set(senders[wrong].tolist()))


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU, where collectives return when done)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
