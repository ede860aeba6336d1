"""The few collectives the trainer needs besides DDP's own: share a decision, sum, compare, gather.

``group`` is the process group to use (None: the whole job), as in ``DistContext.group``.
"""

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


def _size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group) if dist.is_initialized() else 1


def all_reduce(values: list[float], device: torch.device, op: str = "sum", group=None) -> list[float]:
    """Element-wise ``op`` (sum, max or min) of ``values`` over the group's ranks, in float64 (counts stay exact)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if _size(group) > 1:
        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        dist.all_reduce(t, op=ops[op], group=group)
    return t.tolist()


def all_sum(values: list[float], device: torch.device, group=None) -> list[float]:
    """Element-wise sum of ``values`` over the group's ranks (float64, so sample counts stay exact)."""
    return all_reduce(values, device, "sum", group)


def param_spread(model: nn.Module, group=None) -> float:
    """Largest difference of any parameter element between the group's ranks (0.0: identical everywhere)."""
    flat = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    if _size(group) == 1:
        return 0.0
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    return float((high - low).max().item())


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """This rank's RNG states: the CPU generator, and its GPU's when it has one."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Restore what rng_state returned (the GPU part only on a GPU)."""
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def gather(obj: T, group=None) -> list[T]:
    """``obj`` of every rank of the group, in rank order (pickled: small objects, tensors on the CPU)."""
    if _size(group) == 1:
        return [obj]
    out: list = [None] * _size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def gather_rng(device: torch.device, group=None) -> list[dict[str, torch.Tensor]]:
    """Every rank's RNG states, in rank order (for the checkpoint)."""
    return gather(rng_state(device), group)
