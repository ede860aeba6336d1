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


def gather_rng(device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Every rank's RNG states, in rank order (for the checkpoint)."""
    state = rng_state(device)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [state]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, state)
    return out
