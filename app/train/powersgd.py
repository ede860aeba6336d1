"""PowerSGD (torch's ``powerSGD_hook``) with its state kept by parameter, so that it survives DDP's
bucket rebuilds and checkpoints exactly.

    keeper = PowerSGD(model.parameters(), rank=2, warmup=10, group=None)
    ddp.register_comm_hook(keeper.state, keeper.hook)
    saved = keeper.state_dict()            # this rank's part: tensors and plain types
    keeper.load_state_dict(saved_parts, rank, world_size)

torch's hook keeps, per gradient bucket, flat tensors laid out as the bucket lays out its
gradients: the error feedback (one number per gradient element) and P and Q (one block per
compressed matrix). DDP lays its buckets out anew once it has seen the order in which gradients
arrive, after the first step or two of every process. torch's hook compresses only after that
(its warm-up is at least 2 steps), but a run resumed from a checkpoint compresses from its first
step: state saved in one layout would then be read in another (a flat error tensor added to the
wrong gradients). Here the hook notices a bucket whose parameters come in another order, turns
the state into pieces by parameter and lays them out again in the bucket's order; checkpoints
hold the pieces.
"""

import functools
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_powersgd

KINDS = ("error", "p", "q")
"""The state's tensors, by parameter: error feedback, P and Q."""


class PowerSGD:
    """torch's PowerSGD state and hook, the state kept in step with DDP's bucket layout."""

    def __init__(self, params: Iterable[nn.Parameter], rank: int, warmup: int, group=None) -> None:
        params = list(params)
        self.state = torch_powersgd.PowerSGDState(
            process_group=group, matrix_approximation_rank=rank, start_powerSGD_iter=warmup
        )
        self._shapes = [tuple(p.shape) for p in params]
        self._index = {id(p): i for i, p in enumerate(params)}
        self._layout: dict[int, tuple[int, ...]] = {}
        """Bucket index -> the parameters (their indices), in the order its flat state follows."""
        self._pending: dict[str, dict[int, torch.Tensor]] = {kind: {} for kind in KINDS}
        """State by parameter, waiting for its bucket's next call."""
        self._called: set[int] = set()
        """Buckets called in this step so far: their hooks may still be running, their state is theirs."""

        @functools.wraps(torch_powersgd.powerSGD_hook)
        def hook(state, bucket):
            index, order = bucket.index(), tuple(self._index[id(p)] for p in bucket.parameters())
            if self._layout.get(index) != order:
                self._relayout(index, order, bucket.buffer())
            self._called.add(index)
            if bucket.is_last():
                self._called.clear()  # the next call begins the next step
            return torch_powersgd.powerSGD_hook(state, bucket)

        self.hook = hook

    # --- layouts --------------------------------------------------------------------------------

    def _plan(self, order: tuple[int, ...]) -> list[tuple[int, int, int]]:
        """(parameter, P numbers, Q numbers) of the matrices torch's hook compresses, in its order."""
        groups: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        for i in order:
            n = self._shapes[i][0] if self._shapes[i] else 1
            m = int(np.prod(self._shapes[i])) // n
            r = min(n, m, self.state.matrix_approximation_rank)
            if torch_powersgd._should_compress(n, m, r, self.state.min_compression_rate)[0]:
                groups.setdefault((n, m), []).append((i, n * r, m * r))  # the hook batches by shape, in order
        return [entry for group in groups.values() for entry in group]

    def _cut(self, buckets: Iterable[int]) -> dict[str, dict[int, torch.Tensor]]:
        """The laid-out state of ``buckets``, by parameter."""
        found: dict[str, dict[int, torch.Tensor]] = {kind: {} for kind in KINDS}
        s = self.state
        for b in buckets:
            order = self._layout[b]
            if b in s.error_dict:
                sizes = [int(np.prod(self._shapes[i])) for i in order]
                found["error"] |= dict(zip(order, s.error_dict[b].split(sizes), strict=True))
            if b in s.p_memory_dict:
                plan = self._plan(order)
                for kind, memory, column in (("p", s.p_memory_dict[b], 1), ("q", s.q_memory_dict[b], 2)):
                    pieces = memory.split([entry[column] for entry in plan])
                    found[kind] |= {entry[0]: t for entry, t in zip(plan, pieces, strict=True)}
        return found

    def _relayout(self, bucket: int, order: tuple[int, ...], buffer: torch.Tensor) -> None:
        """Cut the state of every bucket not yet called in this step into pieces; lay out ``bucket``'s for ``order``."""
        s = self.state
        stale = [b for b in self._layout if b not in self._called]
        for kind, pieces in self._cut(stale).items():
            self._pending[kind] |= {i: t.clone() for i, t in pieces.items()}
        for b in stale:
            del self._layout[b]
            for memory in (s.error_dict, s.p_memory_dict, s.q_memory_dict):
                memory.pop(b, None)
        errors = [self._pending["error"].pop(i, None) for i in order]
        if any(e is not None for e in errors):
            flat = [
                torch.zeros(int(np.prod(self._shapes[i]))) if e is None else e
                for i, e in zip(order, errors, strict=True)
            ]
            s.error_dict[bucket] = torch.cat(flat).to(buffer.device, buffer.dtype)
        plan = self._plan(order)
        ps = [self._pending["p"].pop(i, None) for i, _, _ in plan]
        qs = [self._pending["q"].pop(i, None) for i, _, _ in plan]
        if plan and all(t is not None for t in ps + qs):
            s.p_memory_dict[bucket] = torch.cat(ps).to(buffer.device, buffer.dtype)
            s.q_memory_dict[bucket] = torch.cat(qs).to(buffer.device, buffer.dtype)
        self._layout[bucket] = order

    # --- checkpoints ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """This rank's state, by parameter index, as tensors and plain types (``weights_only`` loads it)."""
        _kind, keys, pos, has_gauss, cached = self.state.rng.get_state()
        pieces = self._cut(self._layout)
        for kind in KINDS:
            pieces[kind] |= self._pending[kind]
        return {
            "rank": self.state.matrix_approximation_rank,
            "iter": self.state.iter,
            **{kind: {i: t.detach().to("cpu", copy=True) for i, t in pieces[kind].items()} for kind in KINDS},
            "rng": {
                "keys": torch.from_numpy(keys.astype(np.int64)),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            },
        }

    def load_state_dict(self, parts: list[dict[str, Any]], rank: int, world_size: int) -> str:
        """Continue from every rank's ``state_dict``; what was restored, in words.

        The same world size: each rank takes its own part back. Another (a resume at an epoch
        boundary on fewer or more ranks): every rank starts from the mean of the saved error
        feedbacks, which is what compression still owes the averaged gradient. P and Q come back
        when --powersgd-rank is the one they were saved with.
        """
        s, same = self.state, len(parts) == world_size
        mine = parts[rank] if same else parts[0]
        error = (
            mine["error"] if same else {i: torch.stack([p["error"][i] for p in parts]).mean(0) for i in mine["error"]}
        )
        kept = mine["rank"] == s.matrix_approximation_rank
        self._pending = {
            "error": dict(error),
            "p": dict(mine["p"]) if kept else {},
            "q": dict(mine["q"]) if kept else {},
        }
        for memory in (s.error_dict, s.p_memory_dict, s.q_memory_dict, self._layout):
            memory.clear()
        s.iter = int(mine["iter"])
        rng = mine["rng"]
        s.rng.set_state(
            ("MT19937", rng["keys"].numpy().astype(np.uint32), rng["pos"], rng["has_gauss"], rng["cached_gaussian"])
        )
        how = "exactly" if same else f"(error feedback averaged over {len(parts)} saved ranks)"
        if not kept:
            how += f"; Q and P start afresh (saved with rank {mine['rank']})"
        return f"restored at step {s.iter} {how}"
