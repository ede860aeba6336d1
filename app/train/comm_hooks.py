"""Cheaper gradient communication: torch's DDP comm hooks by name (--comm-hook), and their state for
checkpoints.

    hook = comm_hooks.register(ddp, cfg.speed, ctx.group)           # once, before the first step
    saved = collective.gather(comm_hooks.state_of(hook))            # every rank's part, for rank 0 to save
    comm_hooks.restore(hook, saved, rank, world_size)               # after a resume

none      DDP's own all-reduce of its fp32 buckets (C++, no hook).
fp16      ``default_hooks.fp16_compress_hook``: each bucket is cast to float16, all-reduced and cast back:
          half the bytes, 10 mantissa bits. gloo all-reduces float16 on CPU.
bf16      ``default_hooks.bf16_compress_hook``: the same in bfloat16 (fp32's range, 7 mantissa bits). torch's
          DDP accepts it only from a torch built with CUDA 11+ and NCCL 2.10+ (or XPU with XCCL): a CPU-only
          torch refuses it under any backend, although gloo itself can all-reduce bfloat16.
powersgd  ``powerSGD_hook`` (app/train/powersgd.py): each gradient matrix n x m (a tensor folded to
          2-D) travels as a rank-r product P Q^T, (n + m) r numbers instead of n m, in two small
          all-reduces; vectors (biases) and matrices that would not shrink go uncompressed. The first
          --powersgd-warmup steps use the plain all-reduce. Error feedback adds what compression
          dropped to the next step's gradient, so nothing is lost for good; that memory (per rank),
          the reused Q and P (warm start), the step count and the seed of new Qs are its state, which
          checkpoints keep, so that a resumed run takes the very steps an uninterrupted one takes.
          Under gloo it needs all gradients in one bucket (--bucket-cap-mb >= their size): with two
          or more, its all-reduces start from callbacks on gloo's threads and from the backward pass
          at once, in an order that differs between ranks, and the ranks wait on each other until
          the timeout (torch 2.13; a 2-bucket MLP hangs on its first compressed step).

The hooks average over the process group DDP was given (``group``; None: the whole job).
"""

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from app.errors import UsageError, first_line
from app.train.config import SpeedConfig
from app.train.powersgd import PowerSGD

Hook = Callable[[Any, Any], torch.futures.Future]
"""A DDP comm hook: ``hook(state, bucket) -> Future[Tensor]``."""

_HOOKS: dict[str, Hook] = {
    "none": default_hooks.allreduce_hook,
    "fp16": default_hooks.fp16_compress_hook,
    "bf16": default_hooks.bf16_compress_hook,
}
"""The stateless hooks; powersgd's is its keeper's (``PowerSGD.hook``)."""


@dataclass(frozen=True)
class CommHook:
    """The hook a DDP model communicates with."""

    name: str
    """--comm-hook's value."""
    state: Any
    """What the hook gets as its first argument: the process group, or PowerSGD's state."""
    fn: Hook
    """The hook itself."""
    powersgd: PowerSGD | None = None
    """PowerSGD's state keeper (--comm-hook powersgd)."""


def make(speed: SpeedConfig, params: Iterable[nn.Parameter], group=None) -> CommHook:
    """The hook that --comm-hook names, for a model with ``params`` on ``group``."""
    if speed.comm_hook != "powersgd":
        return CommHook(speed.comm_hook, group, _HOOKS[speed.comm_hook])
    keeper = PowerSGD(params, speed.powersgd_rank, speed.powersgd_warmup, group)
    return CommHook(speed.comm_hook, keeper.state, keeper.hook, keeper)


def register(ddp: nn.Module, speed: SpeedConfig, group=None, wrap: Callable[[Hook], Hook] | None = None) -> CommHook:
    """Give ``ddp`` the hook that --comm-hook names (none registers nothing unless ``wrap`` is given).

    A model that is not DDP (a world of one: nothing to communicate) gets no hook; PowerSGD's state
    is still made, so that checkpoints carry it on. wrap: returns the hook to register in place of
    the one given (e.g. one that times it, as ``app scale`` does); with ``none`` it gets DDP's
    all-reduce as a Python hook.
    """
    model = ddp.module if isinstance(ddp, DDP) else ddp
    hook = make(speed, model.parameters(), group)
    if not isinstance(ddp, DDP) or (speed.comm_hook == "none" and wrap is None):
        return hook
    _check_powersgd_buckets(ddp, speed)
    try:
        ddp.register_comm_hook(hook.state, wrap(hook.fn) if wrap else hook.fn)
    except TypeError as error:
        if speed.comm_hook != "bf16":
            raise
        raise UsageError(
            f"--comm-hook bf16: torch {torch.__version__} refuses it ({first_line(error)}): "
            "use --comm-hook fp16 (gloo all-reduces float16 on CPU) or powersgd, or bf16 on CUDA GPUs with NCCL"
        ) from None
    return hook


def _check_powersgd_buckets(ddp: DDP, speed: SpeedConfig) -> None:
    """PowerSGD under gloo only with one bucket (see the module docstring)."""
    if speed.comm_hook != "powersgd" or dist.get_backend(ddp.process_group) != "gloo":
        return
    mib = sum(p.numel() * p.element_size() for p in ddp.module.parameters() if p.requires_grad) / 2**20
    if mib > speed.bucket_cap_mb:
        raise UsageError(
            f"--comm-hook powersgd with gloo needs the gradients in one bucket, but they are {mib:.2f} MiB and "
            f"--bucket-cap-mb is {speed.bucket_cap_mb:g} (several buckets hang gloo): pass --bucket-cap-mb "
            f"{math.ceil(mib * 100) / 100:g} or more, or use --backend nccl"
        )


def has_state(hook: CommHook) -> bool:
    """Whether the hook keeps state across steps that a checkpoint must hold (PowerSGD)."""
    return hook.powersgd is not None


def state_of(hook: CommHook) -> dict:
    """This rank's part of the hook's state, as tensors and plain types (``torch.load(weights_only=True)`` reads it)."""
    return {"name": hook.name, **hook.powersgd.state_dict()} if hook.powersgd else {}


def restore(hook: CommHook, saved: list[dict], rank: int, world_size: int) -> str:
    """Continue from every rank's saved part (``state_of``); what was restored, in words ("" for a stateless hook)."""
    if hook.powersgd is None:
        return ""
    if not saved or not saved[0] or saved[0].get("name") != hook.name:
        return "none saved: PowerSGD starts afresh"
    return hook.powersgd.load_state_dict(saved, rank, world_size)
