"""``--precision auto`` and ``--cuda-graphs auto`` (both the defaults), chosen once, where the device is known.

    cfg, chosen = auto.resolve(cfg, device)   # the Trainer calls it: precision fp32|bf16|fp16, cuda_graphs on|off
    chosen                                    # {"precision": "sm_90 has bf16", "cuda_graphs": "..."}: why, for auto

precision auto: bf16 on a CUDA GPU of compute capability 8.0 and up (bf16 tensor cores, fp32's range:
no loss scaling), fp16 with a GradScaler on older CUDA GPUs, fp32 on a CPU (the CPU defaults do not
change). torchtitan and Lightning default mixed precision to bf16 where the GPU has it likewise.

cuda_graphs auto: on where the whole step can be one CUDA graph (``graphs.GraphedStep``): a CUDA
device, a precision without a host-side scaler (not fp16), --accum-steps 1, no --compile, --comm-hook
none and no other Python comm hook (app scale's bucket timer). Shapes are static: the loader pads each
epoch to whole global batches, so every batch has the captured size (and a batch of another size
would run eagerly), and the models have no data-dependent control flow. Otherwise eager, and the
start line says why; --cuda-graphs on where it cannot be is a one-line error (``config.graph_blockers``
and ``_device_blockers`` hold each reason and each error once), off is always eager.
"""

from dataclasses import replace

import torch

from app.errors import UsageError
from app.train.config import Blocker, TrainConfig, graph_blockers

BF16_CAPABILITY = (8, 0)
"""The first compute capability with bf16 tensor cores (Ampere)."""
CAPTURABLE = "the whole step can be captured"
"""Why --cuda-graphs auto captures the step."""

Capability = tuple[int, int] | None
"""A CUDA GPU's compute capability, (9, 0) for sm_90; None off CUDA."""


def capability_of(device: torch.device) -> Capability:
    """The compute capability of ``device`` (None off CUDA)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def choose_precision(asked: str, device: torch.device, capability: Capability) -> tuple[str, str]:
    """(the precision, why: "" when asked for by name) for --precision ``asked`` on ``device``."""
    if asked != "auto":
        return asked, ""
    if device.type != "cuda" or capability is None:
        return "fp32", device.type
    sm = f"sm_{capability[0]}{capability[1]}"
    if capability >= BF16_CAPABILITY:
        return "bf16", f"{sm} has bf16"
    return "fp16", f"{sm} has no bf16: fp16 with GradScaler"


def _device_blockers(device: torch.device, python_hook: bool) -> list[Blocker]:
    """What keeps the step out of a CUDA graph beside the config (``config.graph_blockers``)."""
    found = []
    if device.type != "cuda":
        found.append(
            Blocker(
                f"{device.type} has no CUDA graphs",
                f"--cuda-graphs needs a CUDA GPU, and this rank trains on {device}: drop --cuda-graphs",
            )
        )
    if python_hook:
        found.append(
            Blocker(
                "a Python comm hook (app scale's timer)",
                "--cuda-graphs with a Python comm hook (app scale times the buckets with one): it runs once at "
                "capture, not at each replay: use --cuda-graphs off",
            )
        )
    return found


def choose_cuda_graphs(cfg: TrainConfig, device: torch.device, precision: str, python_hook: bool) -> tuple[str, str]:
    """(on or off, why: "" when asked for by name) for ``cfg``'s --cuda-graphs, trained in ``precision`` on
    ``device``; python_hook: the Trainer registers a Python comm hook of its own. Raises UsageError for an ``on``
    that cannot be."""
    asked = cfg.speed.cuda_graphs
    if asked == "off":
        return "off", ""
    blockers = _device_blockers(device, python_hook) + graph_blockers(cfg, precision)
    if asked == "on":
        if blockers:
            raise UsageError(blockers[0].error)
        return "on", ""
    return ("off", blockers[0].reason) if blockers else ("on", CAPTURABLE)


def resolve(
    cfg: TrainConfig, device: torch.device, python_hook: bool = False, capability: Capability = None
) -> tuple[TrainConfig, dict[str, str]]:
    """``cfg`` with its auto choices made for ``device`` (capability: read from the device when None), and why
    each auto choice fell as it did, by field (``precision``, ``cuda_graphs``; only those asked auto)."""
    capability = capability or capability_of(device)
    precision, why_precision = choose_precision(cfg.model.precision, device, capability)
    graphs, why_graphs = choose_cuda_graphs(cfg, device, precision, python_hook)
    resolved = replace(cfg, model=replace(cfg.model, precision=precision), speed=replace(cfg.speed, cuda_graphs=graphs))
    why = {"precision": why_precision, "cuda_graphs": why_graphs}
    return resolved, {name: text for name, text in why.items() if text}
