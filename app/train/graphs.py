"""The whole training step in one CUDA graph (``--cuda-graphs``): captured once, replayed at every full batch.
The default, ``--cuda-graphs auto``, takes this path wherever the step allows it (``auto.py``).

    python -m app train --cuda-graphs --precision bf16 --batch-size 512          # one GPU
    torchrun --standalone --nproc-per-node 8 -m app train --cuda-graphs ...      # DDP on NCCL

    step = GraphedStep(forward, optimizer, precision, side_stream, batch_size)   # the Trainer builds it
    loss = step(x, y)            # forward, backward, all-reduce, optimizer step; the loss, detached

The graph holds every kernel of one optimizer step: the forward pass (autocast without its cast
cache), the loss, the backward pass with DDP's gradient all-reduce (NCCL's kernels are captured:
NCCL >= 2.9.6) and the optimizer step (Adam/AdamW with ``capturable=True``: its step count lives on
the GPU). One ``cudaGraphLaunch`` replaces some hundreds of kernel launches, which is what a small
model's step is made of. What torch's CUDA-graph rules ask, and how this meets them:

- warm-up before capture, on a side stream: the first WARMUP_STEPS steps are real training steps,
  run eagerly on the stream the graph is later captured on (DDP, built on that stream too, needs at
  least 11 eager iterations before a full-backward capture; cuBLAS and the allocator settle);
- static shapes and addresses: each batch is copied into the graph's own input tensors (a copy on
  the GPU); a batch of another size (an epoch's last, short one) runs eagerly, the same model and
  optimizer (a capturable optimizer also steps eagerly);
- nothing in the step waits for the host: no GradScaler (fp16 is refused; auto trains it eagerly), no
  Python comm hook (``--comm-hook`` must be none: a hook runs once at capture), one optimizer step
  per batch (``--accum-steps 1``). Python hooks on the gradients run only at capture, so the
  straggler report's all-reduce wait is not measured with graphs (counted 0).

Equal to eager: the same kernels run in the same order, except that Adam's step count and bias
correction are computed on the GPU (capturable); tests/integration/test_train_graphs.py (marked
gpu) compares the loss curve and the parameters with an eager run.
"""

from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from app.train.precision import DTYPES

WARMUP_STEPS = 11
"""Eager steps before the capture (torch's rule for DDP's full-backward capture: at least 11)."""


class GraphedStep:
    """One rank's training step as a CUDA graph: eager for the first WARMUP_STEPS, then replayed."""

    def __init__(
        self,
        forward: Callable[[torch.Tensor], torch.Tensor],
        optimizer: torch.optim.Optimizer,
        precision: str,
        stream: torch.cuda.Stream,
        batch_size: int,
    ) -> None:
        """batch_size: the full batch, the shape captured (shorter batches run eagerly)."""
        self.forward, self.optimizer, self.stream, self.batch_size = forward, optimizer, stream, batch_size
        self.dtype = DTYPES.get(precision)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        """The graph's input images, labels and loss."""
        self.eager_steps = 0

    def _step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        autocast = (
            torch.autocast(device_type="cuda", dtype=self.dtype, cache_enabled=False) if self.dtype else nullcontext()
        )
        with autocast:
            loss = F.cross_entropy(self.forward(x), y)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Train on one batch: replay the graph (same shape as captured), capture it, or step eagerly."""
        if self.static is not None and x.shape == self.static[0].shape:
            images, labels, loss = self.static
            images.copy_(x)
            labels.copy_(y)
            self.graph.replay()  # type: ignore[union-attr]
            return loss.clone()
        if self.graph is None and self.eager_steps >= WARMUP_STEPS and x.shape[0] == self.batch_size:
            return self._capture(x, y)
        return self._eager(x, y)

    def _eager(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            self.optimizer.zero_grad(set_to_none=True)  # after replays: the graph's gradients are not ours
            loss = self._step(x, y)
        torch.cuda.current_stream().wait_stream(self.stream)
        self.eager_steps += 1
        return loss

    def _capture(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Capture the step on this batch's shape, then replay it once: capture alone runs nothing."""
        images, labels = x.clone(), y.clone()
        torch.cuda.current_stream().synchronize()
        self.optimizer.zero_grad(set_to_none=True)  # backward allocates the gradients from the graph's pool
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=self.stream):
            loss = self._step(images, labels)
        self.static = (images, labels, loss)
        self.graph.replay()
        return loss.clone()
