"""The training loop: DDP, accumulation with no_sync, mixed precision, evaluation, checkpoints.

    trainer = Trainer(cfg, ctx, data, reporter)   # inside app.runtime.distributed.process_group (or a group of
                                                    # its first ranks: first_ranks; ctx.group then)
    trainer.restore(state, source)                  # optional, from checkpoint.load
    trainer.note_previous_attempt(reached)          # optional: the step an earlier attempt reached (app.progress)
    trainer.step_hooks.append(hook)                 # optional: hook(trainer, step) after each optimizer step
    summary = trainer.fit()                         # or: stats = trainer.train_epoch(), one epoch at a time

One optimizer step is ``accum_steps`` micro-batches; gradients are all-reduced on the last one
only (``no_sync`` on the others) and each micro-batch's loss is divided by the group's size. The
gradients travel as --comm-hook says (``comm_hooks``: fp32, fp16, bf16 or PowerSGD, whose state
the checkpoints keep).

After each optimizer step ``progress`` records it (app train gives rank 0 a recorder of
OUT/progress: what a restarted job reports as lost), and every ``--exchange-every`` steps the ranks
share their step times (``watch``: the straggler, and, in ``fit``, whether
``--checkpoint-every-seconds`` is due).

Step hooks are the extension point: each is called on every rank as ``hook(trainer, step)`` after
optimizer step ``step`` (1, 2, ...) has been taken and checkpointed (``--checkpoint-every``), before
the ``--max-steps`` check. A hook may read the trainer (``pos``, ``last_loss``, ``model``, ``ctx``)
but must not change it; one that runs a collective must be registered on every rank. The
TensorBoard step loss is one (``Reporter.after_step``).
"""

import math
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from app import progress
from app.errors import UsageError, first_line
from app.runtime.distributed import DistContext
from app.train import auto, checkpoint, comm_hooks, flops, graphs, models, report, snapshot, sync, watch
from app.train import precision as amp
from app.train.config import TrainConfig
from app.train.data import Dataset
from app.train.loader import TrainLoader, eval_batches, on_device
from app.train.report import Reporter
from app.train.stop import Stop

EVAL_BATCH = 1024


@dataclass
class Position:
    """Where training stands: the next batch of ``epoch`` to run, and optimizer steps so far.

    ``epoch`` is 0-based, in every record that names one: the epoch whose record (line and metrics.jsonl)
    is still to come. After its last step the position stays in it (``batch`` = its length) until ``fit``
    has written its record, so a checkpoint taken between the two resumes into writing that record, and one
    taken after it into the next epoch: each epoch's record is written once, whatever fails when."""

    epoch: int = 0
    batch: int = 0
    step: int = 0


@dataclass
class EpochSums:
    """What this rank did so far in the current epoch; checkpoints carry it, so that an epoch resumed part-way
    (or after its last step) has the record of the whole epoch."""

    loss_sum: float = 0.0
    samples: int = 0
    steps: int = 0
    seconds: float = 0.0

    def as_list(self) -> list[float]:
        return [self.loss_sum, self.samples, self.steps, self.seconds]


@dataclass(frozen=True)
class EpochStats:
    """What this rank did in one ``train_epoch``."""

    loss_sum: float
    """Sum of the micro-batch losses, each times its samples."""
    samples: int
    steps: int
    """Optimizer steps taken."""
    seconds: float
    stopped: bool
    """--max-steps was reached: training ends here."""


StepHook = Callable[["Trainer", int], None]
"""Called as ``hook(trainer, step)`` after each optimizer step (see the module docstring)."""


def identity(cfg: TrainConfig, data: Dataset) -> dict:
    """What a checkpoint must match to be resumed by a run of ``cfg`` on ``data``."""
    return {
        "model": cfg.model.model,
        "dataset": data.name,
        "input_shape": list(data.shape),
        "num_classes": data.num_classes,
    }


def build_optimizer(
    name: str, params, lr: float, weight_decay: float, impl: str = "fused", capturable: bool = False
) -> torch.optim.Optimizer:
    """Adam, AdamW or SGD (momentum 0.9) with the fused, foreach or per-parameter implementation.

    capturable: Adam's step count on the device, so that a CUDA graph can hold the step (SGD needs nothing).
    """
    kind = {"fused": {"fused": True}, "foreach": {"foreach": True}, "loop": {"foreach": False}}[impl]
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=weight_decay, **kind)
    cls = torch.optim.AdamW if name == "adamw" else torch.optim.Adam
    return cls(params, lr=lr, weight_decay=weight_decay, capturable=capturable, **kind)


def run_rates(epochs: Sequence[tuple[float, float]]) -> dict:
    """The samples/s of a run from each of its epochs' (samples, seconds), in order.

    ``samples_per_s`` is the whole run's: all samples over all seconds. ``steady_samples_per_s`` leaves the first
    epoch out: it also holds the warm-up (torch.compile's compiling, the CUDA graph's capture, cuDNN's autotuning,
    the allocator's growth), so this is the rate the run settles at; None when the run trained one epoch only.
    """
    samples, seconds = (sum(e[i] for e in epochs) for i in (0, 1))
    after = epochs[1:]
    steady_samples, steady_seconds = (sum(e[i] for e in after) for i in (0, 1))
    return {
        "samples_per_s": samples / seconds if seconds else 0.0,
        "steady_samples_per_s": (steady_samples / steady_seconds if steady_seconds else 0.0) if after else None,
        "train_seconds": seconds,
    }


def modes(d: dict) -> str:
    """What a run (``Trainer.describe``) trains in and how, for its start line: ``bf16 (auto: sm_90 has bf16),
    cuda_graphs (auto: the whole step can be captured), channels_last`` on an H100, ``fp32 (auto: cpu)`` on a CPU
    (where CUDA graphs are no choice to tell)."""
    why = {name: f" (auto: {text})" for name, text in d["auto"].items()}
    found = [d["precision"] + why.get("precision", "")]
    found += [f"{d['comm_hook']} gradients"] if d["comm_hook"] != "none" else []
    found += ["compile"] if d["compile"] else []
    if d["cuda_graphs"]:
        found.append("cuda_graphs" + why.get("cuda_graphs", ""))
    elif "cuda_graphs" in why and d["device"].startswith("cuda"):
        found.append("eager" + why["cuda_graphs"])
    found += ["channels_last"] if d["channels_last"] else []
    return ", ".join(found)


def static_graph(cfg: TrainConfig) -> bool:
    """static_graph as configured, except with accumulation: DDP's static graph cannot begin in no_sync."""
    return cfg.speed.static_graph and cfg.steps.accum_steps == 1


def wrap_ddp(model: nn.Module, ctx: DistContext, cfg: TrainConfig) -> nn.Module:
    """DDP with the configured buckets; BatchNorm -> SyncBatchNorm when asked.

    On a world of one it is the model itself: DDP would only add a bucket copy and a one-rank
    all-reduce to every step (about a third of the seed MLP's step on a CPU), for the same result.
    """
    if ctx.proc.world_size == 1:
        return model
    if cfg.speed.sync_bn:
        if ctx.device.type != "cuda" and ctx.proc.world_size > 1:
            raise UsageError(
                "--sync-bn needs CUDA devices (SyncBatchNorm has no CPU implementation): drop --sync-bn on CPU"
            )
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    return DDP(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        process_group=ctx.group,
        bucket_cap_mb=cfg.speed.bucket_cap_mb,
        gradient_as_bucket_view=cfg.speed.gradient_as_bucket_view,
        static_graph=static_graph(cfg),
    )


class Trainer:
    """Trains one model on one rank of a joined process group."""

    def __init__(
        self,
        cfg: TrainConfig,
        ctx: DistContext,
        data: Dataset,
        reporter: Reporter,
        step_hooks: Iterable[StepHook] = (),
        wrap_comm_hook: Callable[[comm_hooks.Hook], comm_hooks.Hook] | None = None,
    ) -> None:
        """wrap_comm_hook: wraps the gradient communication hook before DDP gets it (see ``comm_hooks.register``).
        ``cfg``'s auto choices are made here, for ``ctx.device``: ``self.cfg`` holds what was chosen."""
        cfg, self.chosen = auto.resolve(cfg, ctx.device, python_hook=wrap_comm_hook is not None)
        """Why each auto choice (--precision, --cuda-graphs) fell as it did, by field."""
        self.cfg, self.ctx, self.data, self.reporter = cfg, ctx, data, reporter
        self.step_hooks: list[StepHook] = list(step_hooks)
        """Called after each optimizer step, in order (see the module docstring)."""
        self.rank, self.world = ctx.proc.rank, ctx.proc.world_size
        o, s, speed = cfg.optim, cfg.steps, cfg.speed
        self.precision = amp.make(cfg.model.precision, ctx.device)
        fmt = models.memory_format(cfg.model.model, ctx.device)
        torch.manual_seed(s.seed)
        self.model = models.build(cfg.model.model, data.shape, data.num_classes).to(ctx.device, memory_format=fmt)
        side = torch.cuda.Stream(ctx.device) if speed.cuda_graphs == "on" else None
        with torch.cuda.stream(side) if side else nullcontext():  # DDP is built where the graph is captured
            self.ddp = wrap_ddp(self.model, ctx, cfg)
        """The model as it trains: DDP, or the model itself on a world of one."""
        self.comm = comm_hooks.register(self.ddp, speed, ctx.group, wrap_comm_hook)
        self.model = self.ddp.module if isinstance(self.ddp, DDP) else self.ddp  # SyncBatchNorm makes a new one
        self.forward = torch.compile(self.ddp) if speed.compile else self.ddp
        """What a training batch goes through: ``ddp``, or ``ddp`` compiled by torch.compile (--compile)."""
        self.optimizer = build_optimizer(
            o.optimizer, self.model.parameters(), o.lr, o.weight_decay, speed.optimizer_impl, bool(side)
        )
        self.graphed = (
            graphs.GraphedStep(self.forward, self.optimizer, cfg.model.precision, side, s.batch_size) if side else None
        )
        """--cuda-graphs: the whole step as one CUDA graph (forward, backward, all-reduce, optimizer)."""
        self.loader = TrainLoader(
            data.train,
            self.rank,
            self.world,
            s.batch_size,
            s.seed,
            ctx.device,
            speed.loader,
            cfg.data.workers,
            fmt,
            accum_steps=s.accum_steps,
        )
        self.test = on_device(data.test, ctx.device, fmt) if speed.loader == "memory" else data.test
        """The test split, where evaluation reads it (on the device with the memory loader)."""
        self.flops_per_sample = 0.0
        """FLOPs of one sample's forward and backward pass (counted on CUDA only, where TFLOP/s and MFU are shown)."""
        self.peak: flops.Peak | None = None
        self.pos = Position()
        self.carried = EpochSums()
        """The current epoch's sums from the checkpoint it resumed from (zero: it starts here)."""
        self._sums = lambda: self.carried
        """This rank's sums of the current epoch so far, as a checkpoint takes them (``train_epoch`` sets it)."""
        self.last_loss = torch.zeros((), device=ctx.device)
        """This rank's loss of the latest micro-batch (detached; ``.item()`` waits for the device)."""
        self.resumed_from: str | None = None
        self.previous: progress.Resumed | None = None
        """Where this run started again after an earlier attempt, and what that attempt had done (``resume``)."""
        self.watch = watch.Watch(cfg.health, ctx, self.model)
        if ctx.proc.is_main:  # the job's earlier rounds: its best pace on each set of nodes (app/evict.py)
            self.watch.recall(report.exchanges(cfg.output.out))
        self.progress: progress.Recorder | None = None
        """Records each step reached (app train gives rank 0 one for OUT/progress)."""
        self.stop: Stop | None = None
        """SIGTERM noted while training (app train gives it one): training stops at the next step boundary."""
        self._saved_step = -1
        self._saved_at = time.monotonic()
        self._save_every_s = 0.0
        """--checkpoint-every-seconds while ``fit`` runs (``train_epoch`` alone, as app bench runs it: by steps)."""

    # --- identity and state -------------------------------------------------------------------

    @property
    def identity(self) -> dict:
        """What a checkpoint must match to be resumed by this run."""
        return identity(self.cfg, self.data)

    def _state(self, rng: list[dict[str, torch.Tensor]], comm: list[dict], sums: list[list[float]]) -> dict:
        o, scaler = self.cfg.steps, self.precision.scaler
        return {
            **self.identity,
            "model_state": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler else {},
            "epoch": self.pos.epoch,
            "batch": self.pos.batch,
            "step": self.pos.step,
            "world_size": self.world,
            "batch_size": o.batch_size,
            "accum_steps": o.accum_steps,
            "seed": o.seed,
            "rng": rng,
            "comm_hook": comm,
            "epoch_sums": sums,
        }

    def restore(self, state: dict, source: str) -> None:
        """Continue from a checkpoint's state (already checked against ``identity``)."""
        self._check_position(state, source)
        self._lay_out_buckets()  # first: its passes touch the comm hook's state and the RNG, restored below
        try:
            self.model.load_state_dict(state["model_state"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, KeyError, ValueError) as error:
            raise UsageError(
                f"checkpoint {source} does not fit this model ({first_line(error, 200)}): choose another --out"
            ) from None
        if self.precision.scaler and state.get("scaler"):
            self.precision.scaler.load_state_dict(state["scaler"])
        rng = state["rng"]
        sync.set_rng_state(rng[self.rank] if len(rng) == self.world else rng[0], self.ctx.device)
        restored = comm_hooks.restore(self.comm, state.get("comm_hook", []), self.rank, self.world)
        if restored:
            self.reporter.event("comm_hook", hook=self.comm.name, state=restored)
        self.pos = Position(state["epoch"], state["batch"], state["step"])
        sums = state.get("epoch_sums") or []  # per rank; an emergency snapshot's: its writer's alone
        if self.pos.batch and sums:
            self.carried = EpochSums(*(sums[self.rank] if len(sums) == self.world else sums[0]))
        self._saved_step = self.pos.step
        self.resumed_from = source

    def _lay_out_buckets(self) -> None:
        """Let DDP order its gradient buckets now, as the uninterrupted run did in its first steps.

        DDP settles its bucket order over its first two backward passes (static_graph's first one
        all-reduces every gradient at its end; then buckets are rebuilt in the order gradients became
        ready). gloo and NCCL sum each element in an order that depends on its place in the bucket,
        and with more than two ranks another order rounds differently: a resumed run would drift
        from the uninterrupted one by rounding (4 ranks: ~1e-8 after a few steps). Two backward
        passes of a zero loss (eval mode: BatchNorm statistics stay; no optimizer step; the zero
        gradients are dropped) leave the buckets as the uninterrupted run has them. They run before
        the checkpoint's state is loaded: a comm hook's state (PowerSGD's step count, error feedback,
        the seed it draws Q with) and the RNG they may touch are restored after them.
        """
        if not isinstance(self.ddp, DDP):
            return  # a world of one: no buckets
        self.model.eval()
        x = self.loader.split.x[: self.cfg.steps.batch_size].to(self.ctx.device)
        for _ in range(2):
            with self.precision.autocast():
                (self.ddp(x).float().sum() * 0.0).backward()
        self.optimizer.zero_grad(set_to_none=True)
        self.model.train()

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks: per-rank batch x world size x accumulation."""
        s = self.cfg.steps
        return s.batch_size * self.world * s.accum_steps

    def restart_count(self) -> int:
        """torchrun's restart count of this job (a collective): the highest of its ranks' TORCHELASTIC_RESTART_COUNT.
        A node started again after it was lost runs a new agent, which counts from 0 while the others count on:
        after a head kill rank 0 alone would say 0 where the job (and the cluster's line) is at restart 1."""
        return int(sync.all_reduce([self.ctx.proc.restart_count], self.ctx.device, "max", self.ctx.group)[0])

    def note_previous_attempt(self, reached: int | None) -> None:
        """Note where this run starts relative to an earlier attempt that reached step ``reached`` (None: unknown)."""
        if self.resumed_from or (reached or 0) > self.pos.step:
            self.previous = progress.Resumed(self.pos.step, self.resumed_from, reached)

    def _check_position(self, state: dict, source: str) -> None:
        if state["batch"] == 0:
            return  # an epoch boundary: any world size or batch size can continue from here
        o = self.cfg.steps
        have = (state["world_size"], state["batch_size"], state["accum_steps"], state["seed"])
        if have != (self.world, o.batch_size, o.accum_steps, o.seed):
            raise UsageError(
                f"checkpoint {source} was taken mid-epoch with world size {have[0]}, --batch-size {have[1]}, "
                f"--accum-steps {have[2]}, --seed {have[3]}: resume with the same values"
            )

    def _save(self) -> None:
        """Checkpoint the current position (a collective: every rank calls it; rank 0 writes)."""
        start = time.perf_counter()
        self.watch.doing = (watch.CHECKPOINT, self.pos.step)
        group = self.ctx.group
        rng = sync.gather_rng(self.ctx.device, group)
        comm = sync.gather(comm_hooks.state_of(self.comm), group) if comm_hooks.has_state(self.comm) else []
        sums = sync.gather(self.epoch_sums(), group)
        if self.ctx.proc.is_main:
            out, pos = self.cfg.output, self.pos
            path = checkpoint.save(out.out, self._state(rng, comm, sums), pos.step, out.keep_checkpoints)
            self.reporter.event("checkpoint", step=pos.step, epoch=pos.epoch, batch=pos.batch, path=str(path))
        self._saved_step = self.pos.step
        self._saved_at = time.monotonic()
        self.watch.window.idle += time.perf_counter() - start

    def _retire_snapshot(self) -> None:
        """The job finished (rank 0): remove the emergency snapshot that its final checkpoint, read back, supersedes."""
        if self.ctx.proc.is_main and (kept := snapshot.retire(self.cfg.output.out, self.pos.step)) is not None:
            self.reporter.event("snapshot_removed", step=kept, checkpoint_step=self.pos.step)

    # --- the loop -------------------------------------------------------------------------------

    def _run_batch(self, x: torch.Tensor, y: torch.Tensor, sync: bool, weight: float) -> torch.Tensor:
        """Forward and backward of one micro-batch; gradients all-reduced only when ``sync``."""
        if sync:
            self.watch.doing = (watch.GRADIENTS, self.pos.step + 1)
        if self.graphed is not None:  # forward, backward and the optimizer step: one graph (no accumulation)
            return self.graphed(x, y)
        with nullcontext() if sync else self.no_sync():
            with self.precision.autocast():
                loss = F.cross_entropy(self.forward(x), y)
            scaled = loss * weight if weight != 1.0 else loss
            (self.precision.scaler.scale(scaled) if self.precision.scaler else scaled).backward()
        self.watch.backward_done()
        return loss.detach()

    def no_sync(self) -> AbstractContextManager:
        """DDP's no_sync: backward passes in this block do not all-reduce their gradients."""
        return self.ddp.no_sync() if isinstance(self.ddp, DDP) else nullcontext()

    def _optimizer_step(self) -> None:
        """The optimizer's step (with --cuda-graphs the graph took it already); count it."""
        scaler = self.precision.scaler
        if self.graphed is None:
            if scaler:
                scaler.step(self.optimizer)
                scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.pos.step += 1

    def _after_step(self) -> bool:
        """Progress, exchange, checkpoint, step hooks and step limit after an optimizer step; False: stop now."""
        out, step = self.cfg.output, self.pos.step
        if self.progress is not None:
            self.progress.record(step)
        if self.stop is not None:
            self.stop.check()
        self.watch.window.steps += 1
        due = bool(out.checkpoint_every and step % out.checkpoint_every == 0)
        if self.watch.due(step):
            due = self._exchange(step) or due
        if due:
            self._save()
        for hook in self.step_hooks:
            hook(self, step)
        return not (self.cfg.steps.max_steps and step >= self.cfg.steps.max_steps)

    def _exchange(self, step: int) -> bool:
        """Share step times (a collective); rank 0 reports the slowest rank. True: a time-based checkpoint is due."""
        record, line, since_checkpoint = self.watch.exchange(step, time.monotonic() - self._saved_at)
        rate = 1000 * self.global_batch / record["step_ms"] if record["step_ms"] > 0 else 0.0
        job = {"world_size": self.world, "global_batch": self.global_batch, "accum_steps": self.cfg.steps.accum_steps}
        self.reporter.ranks(record | job | {"samples_per_s": round(rate, 1)}, line)
        self.watch.pace(record | job)
        return bool(self._save_every_s) and since_checkpoint >= self._save_every_s

    def epoch_sums(self) -> list[float]:
        """This rank's sums of the current epoch so far, for a checkpoint (``EpochSums``)."""
        return self._sums().as_list()

    def train_epoch(self) -> EpochStats:
        """Train the rest of the current epoch (or until --max-steps) and move on to the next epoch when it is done;
        what this rank did in the epoch, the part before a resume included. ``fit`` writes the epoch's record
        between the two (``_train_rest``, ``_next_epoch``)."""
        stats = self._train_rest()
        self._next_epoch()
        return stats

    def _next_epoch(self) -> None:
        """The epoch's last batch is done and its record written: the position moves to the next epoch."""
        if self.pos.batch >= len(self.loader):
            self.pos = Position(self.pos.epoch + 1, 0, self.pos.step)
            self.carried = EpochSums()

    def _train_rest(self) -> EpochStats:
        """Train from the current position to the end of its epoch, or until --max-steps; the position stays in
        the epoch (its last batch done) for its record."""
        epoch, k, total = self.pos.epoch, self.cfg.steps.accum_steps, len(self.loader)
        carried = self.carried
        loss_sum = torch.full((), carried.loss_sum, dtype=torch.float32, device=self.ctx.device)
        samples, steps, stopped = carried.samples, carried.steps, False
        start = time.perf_counter() - carried.seconds
        self._sums = lambda: EpochSums(float(loss_sum), samples, steps, time.perf_counter() - start)
        self.watch.new_window()
        clock = self.watch.window
        with self.reporter.bar(epoch, self.cfg.steps.epochs, self.pos.batch, total) as bar:
            fetch = time.perf_counter()
            for i, (x, y) in enumerate(self.loader.epoch(epoch, self.pos.batch), self.pos.batch):
                clock.data += time.perf_counter() - fetch
                group_start = i - i % k
                group_size = min(k, total - group_start)
                boundary = i + 1 == group_start + group_size
                self.last_loss = self._run_batch(x, y, boundary, 1.0 / group_size)
                loss_sum.add_(self.last_loss, alpha=y.shape[0])  # one kernel, no temporary
                samples += y.shape[0]
                bar.advance(self.last_loss)
                if boundary:
                    self._optimizer_step()
                    steps += 1
                    self.pos.batch = i + 1
                    if not self._after_step():
                        stopped = True
                        break
                    clock = self.watch.window  # a new one after an exchange
                fetch = time.perf_counter()
        sums = self._sums()
        return EpochStats(sums.loss_sum, sums.samples, sums.steps, sums.seconds, stopped)

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Test loss and accuracy over all ranks, every test sample counted exactly once."""
        self.watch.doing = (watch.EVALUATION, self.pos.step)
        self.model.eval()
        sums = torch.zeros(2, dtype=torch.float64, device=self.ctx.device)  # loss, correct: read once, at the end
        count = 0
        for x, y in eval_batches(self.test, self.rank, self.world, EVAL_BATCH, self.ctx.device):
            with self.precision.autocast():
                logits = self.model(x)
            sums[0] += F.cross_entropy(logits.float(), y, reduction="sum")
            sums[1] += (logits.argmax(dim=1) == y).sum()
            count += y.shape[0]
        self.model.train()
        loss_sum, correct = sums.tolist()
        loss_sum, correct, count = sync.all_sum([loss_sum, correct, count], self.ctx.device, self.ctx.group)
        return {
            "test_loss": loss_sum / max(count, 1),
            "test_accuracy": correct / max(count, 1),
            "test_correct": int(correct),
            "test_samples": int(count),
        }

    def _epoch_record(self, epoch: int, stats: EpochStats) -> dict:
        loss_sum, samples, steps, seconds = sync.all_sum(
            [stats.loss_sum, stats.samples, stats.steps, stats.seconds], self.ctx.device, self.ctx.group
        )
        seconds /= self.world
        return {
            "epoch": epoch,
            "epochs": self.cfg.steps.epochs,
            "step": self.pos.step,
            "train_loss": loss_sum / max(samples, 1),
            "train_samples": int(samples),
            "samples_per_s": samples / seconds if seconds > 0 else 0.0,
            "step_ms": 1000 * seconds / max(steps / self.world, 1),
            "seconds": seconds,
            "lr": self.optimizer.param_groups[0]["lr"],
            **self.speed_of_light(samples / self.world, seconds),
            **self.evaluate(),
        }

    @property
    def finished(self) -> bool:
        """Nothing is left to train: every epoch is done, or --max-steps is reached (a finished job resumed)."""
        o = self.cfg.steps
        return self.pos.epoch >= o.epochs or bool(o.max_steps and self.pos.step >= o.max_steps)

    def count_flops(self) -> None:
        """On CUDA: count one sample's training FLOPs and find the GPU's bf16 peak (for TFLOP/s and MFU)."""
        if self.ctx.device.type != "cuda":
            return
        n = self.cfg.steps.batch_size
        x, y = (t[:n].to(self.ctx.device) for t in (self.loader.split.x, self.loader.split.y))
        self.flops_per_sample = flops.per_sample(self.model, x, y, self.precision)
        self.peak = flops.peak(self.ctx.device)

    def speed_of_light(self, samples_per_gpu: float, seconds: float) -> dict:
        """Achieved TFLOP/s per GPU and MFU of ``samples_per_gpu`` samples in ``seconds`` (empty off CUDA)."""
        if self.peak is None:
            return {}
        return flops.describe(flops.achieved(self.flops_per_sample, samples_per_gpu, seconds), self.peak)

    def fit(self) -> dict:
        """Train to the end (or --max-steps) and return the summary; rank 0 reports and saves."""
        o, out = self.cfg.steps, self.cfg.output
        start = {**self.describe(), "resumed_from": self.resumed_from, "position": vars(self.pos)}
        self.reporter.start(start, self.banner(), self.pos.step)
        if self.previous is not None:
            self.reporter.resumed(self.previous, self.restart_count())
        self._saved_at, self._save_every_s = time.monotonic(), out.checkpoint_every_seconds
        self.count_flops()
        record: dict = {}
        epochs: list[tuple[float, float]] = []
        """Each epoch's (samples, seconds) of this run."""
        go_on = not self.finished
        while go_on and self.pos.epoch < o.epochs:
            epoch = self.pos.epoch
            stats = self._train_rest()
            go_on = not stats.stopped
            between = time.perf_counter()  # the epoch's end (test set, records): not training, as a checkpoint is not
            record = self._epoch_record(epoch, stats)
            epochs.append((record["train_samples"], record["seconds"]))
            self.reporter.epoch(record)
            self._next_epoch()
            self.watch.window.idle += time.perf_counter() - between
            if go_on and out.checkpoint_every_epochs and (epoch + 1) % out.checkpoint_every_epochs == 0:
                self._save()
        if self._saved_step != self.pos.step:
            self._save()
        self._retire_snapshot()
        if self.progress is not None:
            self.progress.close()
        return self._summary(record or self.evaluate(), run_rates(epochs))

    def _summary(self, last: dict, rates: dict) -> dict:
        spread = sync.param_spread(self.model, self.ctx.group)
        out = self.cfg.output.out
        return {
            **self.describe(),
            "step": self.pos.step,
            "epochs_completed": self.pos.epoch,
            "test_loss": last["test_loss"],
            "test_accuracy": last["test_accuracy"],
            "test_correct": last["test_correct"],
            "test_samples": last["test_samples"],
            **rates,
            **{k: last[k] for k in ("tflops_per_gpu", "mfu", "peak_tflops", "peak_source") if k in last},
            "params_identical": spread == 0.0,
            "param_spread": spread,
            "resumed_from": self.resumed_from,
            "checkpoint": str(checkpoint.path_for(out, self.pos.step)),
            "summary_path": str(out / "summary.json"),
        }

    def describe(self) -> dict:
        """The run's shape, for the banner, metrics.jsonl and the summary."""
        o, s, p = self.cfg.optim, self.cfg.steps, self.ctx.proc
        return {
            "model": self.cfg.model.model,
            "dataset": self.data.name,
            "world_size": p.world_size,
            "nodes": p.num_nodes,
            "launcher": p.launcher.value,
            "backend": self.ctx.backend,
            "device": str(self.ctx.device),
            "batch_size": s.batch_size,
            "accum_steps": s.accum_steps,
            "global_batch": self.global_batch,
            "precision": self.cfg.model.precision,
            "optimizer": o.optimizer,
            "lr": o.lr,
            "static_graph": static_graph(self.cfg),
            "compile": self.cfg.speed.compile,
            "cuda_graphs": self.cfg.speed.cuda_graphs == "on",
            "auto": self.chosen,
            "channels_last": self.loader.memory_format == torch.channels_last,
            "comm_hook": self.comm.name,
            "epochs": s.epochs,
            "train_samples": len(self.data.train),
            "test_samples": len(self.data.test),
        }

    def banner(self) -> str:
        """The start line: the run's shape, what it trains in and how (the auto choices with their reasons)."""
        d = self.describe()
        return (
            f"train: {d['model']} on {d['dataset']} ({d['train_samples']} train / {d['test_samples']} test), "
            f"{d['world_size']} rank(s) on {d['nodes']} node(s), per-rank batch {d['batch_size']} x "
            f"{d['world_size']} ranks x accum {d['accum_steps']} = global batch {d['global_batch']}, "
            f"{modes(d)}, {d['backend']} on {d['device']}, {math.ceil(len(self.loader) / d['accum_steps'])}"
            " steps/epoch"
        )
