"""Process-group set-up and teardown for every launcher, with a timeout on everything.

    with process_group(detect(), DistConfig(backend="auto")) as ctx:
        ...  # ctx.device is cuda:LOCAL_RANK under nccl, cpu under gloo
        parts = first_ranks(ctx, [1, 2])  # parts[2]: ranks 0-1 as a group of their own (None on the others)

Backend ``auto`` is nccl when every node of the job has a GPU for each of its local ranks, else
gloo on every rank; the ranks agree on it through the store before any NCCL call
(``app.runtime.backend``). The store is torchrun's own under torchrun, a ``file://`` path when
``--init-method`` gives one, otherwise a TCP store on MASTER_ADDR:MASTER_PORT that rank 0 serves.
"""

import argparse
import gc
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist

from app import flags
from app.errors import ClusterError, UsageError, first_line
from app.flags import flag
from app.runtime import backend, devices, launcher
from app.runtime.launcher import ProcessInfo

BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class DistConfig:
    """Process group: how to join it."""

    backend: str = field(default="auto", metadata=flag(choices=BACKENDS))
    """Communication backend: auto (nccl when every node has a GPU per local rank, else gloo), gloo or nccl."""
    timeout_s: float = field(default=120.0, metadata=flag(option="--timeout", metavar="S"))
    """Seconds before a stuck rendezvous or collective fails."""
    ifname: str | None = None
    """Network interface for gloo and NCCL, e.g. eth0 (sets GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME)."""
    init_method: str | None = field(default=None, metadata=flag(metavar="URL"))
    """A file:///shared/path rendezvous shared by all ranks, instead of MASTER_ADDR:MASTER_PORT."""

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise UsageError(f"--backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.timeout_s <= 0:
            raise UsageError(f"--timeout {self.timeout_s} must be a positive number of seconds")
        if self.init_method is not None and not self.init_method.startswith(("file://", "tcp://", "env://")):
            raise UsageError(f"--init-method {self.init_method!r} must start with file://, tcp:// or env://")


@dataclass(frozen=True)
class DistContext:
    """A joined process group: who we are, which backend, which device our tensors live on."""

    proc: ProcessInfo
    backend: str
    device: torch.device
    broken: list[str] = field(default_factory=list)
    """Why the group can no longer be trusted (a collective failed); non-empty skips the exit barrier."""
    group: dist.ProcessGroup | None = None
    """The group that DDP and the workload's collectives use: None is the whole job (``proc`` describes it)."""

    def mark_broken(self, reason: str) -> None:
        """Record that a collective failed, so leaving the group does not wait on the lost peers."""
        self.broken.append(reason)


def this_process(cfg: DistConfig) -> ProcessInfo:
    """This process as its launcher describes it; MASTER_ADDR is required unless ``cfg`` names a rendezvous.

    The one way a command describes its process (``launcher.detect`` with what ``cfg`` implies).
    """
    return launcher.detect(need_master=cfg.init_method is None)


def add_command_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Flags of a command that joins the process group: its own config's (``cls``), then DistConfig's."""
    flags.add_arguments(parser, cls)
    flags.add_arguments(parser, DistConfig)


def command_process(cls: type, args: argparse.Namespace) -> tuple[Any, DistConfig, ProcessInfo]:
    """Such a command's config, its DistConfig and this process, from the flags ``add_command_arguments`` made."""
    dist_cfg = flags.from_args(DistConfig, args)
    return flags.from_args(cls, args), dist_cfg, this_process(dist_cfg)


def record_collectives(folder: Path) -> Path:
    """Torch's flight recorder on, before the group starts; its dumps' prefix (launcher.record_collectives)."""
    return launcher.record_collectives(folder)


def rendezvous_store(proc: ProcessInfo, timeout: timedelta) -> dist.Store:
    """The store on MASTER_ADDR:MASTER_PORT: torchrun's agent's, or one that rank 0 serves (in memory: one process)."""
    if proc.world_size == 1:
        return dist.HashStore()
    where = f"{proc.master_addr}:{proc.master_port} (MASTER_ADDR:MASTER_PORT)"
    try:
        if proc.torchelastic and proc.agent_store:
            return _agent_store(proc, timeout)
        return dist.TCPStore(
            proc.master_addr,
            proc.master_port,
            proc.world_size,
            is_master=proc.is_main,
            timeout=timeout,
            wait_for_workers=False,
        )
    except (RuntimeError, OSError) as error:
        if proc.is_main and not proc.agent_store:
            raise ClusterError(
                f"could not serve the rendezvous on port {proc.master_port} of {proc.host} ({first_line(error)}): "
                "another process holds MASTER_PORT? pick a free one"
            ) from None
        raise ClusterError(
            f"could not reach the rendezvous at {where} within {timeout.total_seconds():g}s ({first_line(error)}): "
            f"is rank 0 running there, and does the network let port {proc.master_port} through? "
            "python -m app doctor checks both"
        ) from None


def store_client(host: str, port: int, timeout_s: float) -> dist.Store:
    """A client of the TCPStore at ``host:port``, connected within ``timeout_s`` (its operations then time out
    after ``timeout_s`` too); a ClusterError saying why not (``no answer within 3 s``, ``failed (...)``).

    Connected in a thread of its own: torch's client waits forever for a server that accepts and never
    answers (its timeout covers the operations, not the handshake); such a thread is left behind."""
    found: list[dist.Store | Exception] = []

    def connect() -> None:
        try:
            timeout = timedelta(seconds=timeout_s)
            found.append(dist.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False))
        except (RuntimeError, ValueError) as error:  # DistError, DistStoreError, a timeout: RuntimeErrors
            found.append(error)

    thread = threading.Thread(target=connect, name=f"store-client-{host}:{port}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not found:
        raise ClusterError(f"no answer within {timeout_s:g} s")
    if isinstance(found[0], Exception):
        raise ClusterError(f"failed ({first_line(found[0], 160)})")
    return found[0]


def _agent_store(proc: ProcessInfo, timeout: timedelta) -> dist.Store:
    """torchrun's agent store, under a prefix per restart attempt.

    The agent keeps its store across ``--max-restarts``; without the prefix a restarted group reads
    the gloo addresses that the dead attempt left there and fails to connect (torch 2.13).
    """
    base = dist.TCPStore(proc.master_addr, proc.master_port, proc.world_size, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"attempt_{proc.restart_count}", base)


def rendezvous_endpoint(proc: ProcessInfo, cfg: DistConfig) -> tuple[str, int] | None:
    """The rendezvous host and port, or None (one process, or a file:// rendezvous)."""
    if proc.world_size == 1 or (cfg.init_method or "").startswith("file://"):
        return None
    if (cfg.init_method or "").startswith("tcp://"):
        url = urlparse(cfg.init_method)
        return url.hostname or "", url.port or proc.master_port
    return proc.master_addr or "", proc.master_port


def job_store(proc: ProcessInfo, cfg: DistConfig) -> dist.Store:
    """The job's store, where the ranks meet before (and to build) the process group.

    A file:// rendezvous is a FileStore on that file; otherwise the store on the rendezvous
    endpoint (tcp:// in --init-method, else MASTER_ADDR:MASTER_PORT): torchrun's agent's, or the
    one rank 0 serves. torch's own ``init_method`` handlers build the same stores.
    """
    timeout = timedelta(seconds=cfg.timeout_s)
    if (cfg.init_method or "").startswith("file://"):
        return dist.FileStore(cfg.init_method.removeprefix("file://"), proc.world_size)
    host, port = rendezvous_endpoint(proc, cfg) or ("", proc.master_port)
    return rendezvous_store(replace(proc, master_addr=host, master_port=port), timeout)


def _init(proc: ProcessInfo, cfg: DistConfig, backend: str, device: torch.device, store: dist.Store) -> None:
    timeout = timedelta(seconds=cfg.timeout_s)
    kwargs: dict = {"backend": backend, "timeout": timeout, "rank": proc.rank, "world_size": proc.world_size}
    if device.type == "cuda":
        kwargs["device_id"] = device
    try:
        dist.init_process_group(store=store, **kwargs)
    except (RuntimeError, ValueError) as error:
        ifname = cfg.ifname or proc.ifname
        via = f"interface {ifname}" if ifname else "the interface of this host's name (set --ifname to choose)"
        raise ClusterError(
            f"could not join the {proc.world_size}-process {backend} group within {cfg.timeout_s:g}s "
            f"({first_line(error)}): check that every rank started and that the others reach this node through {via}"
        ) from None


@contextmanager
def process_group(proc: ProcessInfo, cfg: DistConfig) -> Iterator[DistContext]:
    """Join the process group for the duration of the block; always destroy it afterwards.

    The ranks first agree on one backend through the job's store (``app.runtime.backend``); rank 0
    prints the one line that explains a fallback to gloo.
    """
    if cfg.ifname:
        launcher.export_socket_ifname(cfg.ifname)
    store = job_store(proc, cfg)
    choice = backend.agree(store, proc, cfg.backend, devices.probe(), timedelta(seconds=cfg.timeout_s))
    if choice.note and proc.is_main:
        print(choice.note, file=sys.stderr, flush=True)
    device = torch.device("cuda", proc.local_rank) if choice.backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        _init(proc, cfg, choice.backend, device, store)
        _HELD.append(dist.group.WORLD)
        ctx = DistContext(proc=proc, backend=choice.backend, device=device)
        yield ctx
        if not ctx.broken:
            _leave_together(ctx)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def report_inside(action: Callable[[], object], is_main: bool) -> Callable[[], None]:
    """Run rank 0's report (``action``: print, write the JSON) inside the process group, before the ranks leave it
    together: once they leave, a failed command's other ranks end at once, and a launcher that stops the job when a
    node fails (the compose runner) would stop rank 0 before its report was written. What ``action`` raises is
    raised by the returned call, made after the group is left, so that a report that cannot be written does not
    keep the other ranks at the leaving barrier until the timeout."""
    failed: list[Exception] = []
    if is_main:
        try:
            action()
        except Exception as error:  # raised again once the ranks have left together
            failed.append(error)

    def after() -> None:
        if failed:
            raise failed[0]

    return after


def first_ranks(ctx: DistContext, sizes: Iterable[int]) -> dict[int, DistContext | None]:
    """For each size N: the job's ranks 0..N-1 as a group of their own, as this rank sees it.

    A collective: every rank calls it with the same sizes, in the same order. This rank gets a
    context whose ``proc`` describes its place in the smaller job (same rank, world size N, its
    node's share of the N ranks) for each N it belongs to, and None for the others; N equal to the
    job's world size is the whole job.
    """
    proc, found = ctx.proc, {}
    for size in sizes:
        if size >= proc.world_size:
            found[size] = ctx
            continue
        group = subgroup(list(range(size)))
        if proc.rank >= size:
            found[size] = None
            continue
        on_node = min(proc.local_world_size, size - proc.node_rank * proc.local_world_size)
        sub = replace(proc, world_size=size, local_world_size=on_node, named_nodes=0, named_nodes_by="")
        found[size] = DistContext(proc=sub, backend=ctx.backend, device=ctx.device, group=group)
    return found


_HELD: list = []
"""Every process group this process joined, held until ``release_groups`` (see there)."""


def subgroup(ranks: list[int]) -> Any:
    """``dist.new_group(ranks)`` (every rank of the job calls it), held until ``release_groups``."""
    group = dist.new_group(ranks=ranks)
    _HELD.append(group)
    return group


def release_groups() -> None:
    """Free this process's process groups now, gloo's worker threads joined with the GIL released.

    A DDP model holds its process group, and the trainer's model is freed by the garbage collector,
    which holds the GIL. Left the group's last owner, the model's reducer joins gloo's worker threads
    holding the GIL while one of them waits for the GIL to release a tensor it exchanged: the rank
    never ends (seen under ``app node`` after a restart: 1 rank of 4 stuck after its job was done,
    its job held 5 minutes by torchrun's exit barrier). Held here until the models are collected,
    each group's last owner is this list, and torch's binding frees a group with the GIL released.
    """
    gc.collect()
    _HELD.clear()


def _leave_together(ctx: DistContext) -> None:
    """Wait (within the timeout) until every rank is done before tearing the group down.

    A rank that destroys its connections while a peer is still finishing (rank 0 writing the last
    checkpoint, say) can make the peer hang or abort at exit; after this barrier no traffic is left.
    """
    try:
        dist.barrier()
    except (RuntimeError, ValueError) as error:
        raise ClusterError(
            f"finished, but not every other rank reached the end ({first_line(error)}): see the other ranks' errors"
        ) from None
