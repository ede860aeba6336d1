"""The few collectives the trainer needs besides DDP's own: share a decision, sum, compare, gather."""

from collections.abc import Callable
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn

from app.errors import UsageError

T = TypeVar("T")


def main_decides(fn: Callable[[], T], is_main: bool) -> T:
    """Run ``fn`` on global rank 0 only and give every rank its result, or its UsageError."""
    payload: list = [None]
    if is_main:
        try:
            payload = [("ok", fn())]
        except UsageError as error:
            payload = [("error", str(error))]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(payload, src=0)
    kind, value = payload[0]
    if kind == "error":
        raise UsageError(value)
    return value


def all_sum(values: list[float], device: torch.device) -> list[float]:
    """Element-wise sum of ``values`` over all ranks (float64, so sample counts stay exact)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def param_spread(model: nn.Module) -> float:
    """Largest difference of any parameter element between ranks (0.0: identical everywhere)."""
    flat = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return 0.0
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return float((high - low).max().item())


def gather_rng() -> list[torch.Tensor]:
    """Every rank's CPU RNG state, in rank order (for the checkpoint)."""
    state = torch.get_rng_state()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [state]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, state)
    return out
