"""One backend per job, agreed through the rendezvous store before any NCCL call.

    choice = agree(store, proc, "auto", devices.probe())   # every rank gets the same Choice
    choice.backend, choice.note                             # "gloo", "backend auto: gloo on every rank ..."

The rule: nccl needs a GPU of its own for every rank, so a node with more local ranks than visible
GPUs cannot run it (two ranks on one GPU fail in NCCL: "Duplicate GPU detected"). ``--backend
auto`` is nccl when every node of the job has at least as many GPUs as local ranks, else gloo on
every rank (with one line naming the node, its GPUs and local ranks, and the fix), and plain gloo
without a word where no node has a GPU. ``--backend nccl`` on a node short of GPUs is a usage error
naming the same. A backend decided per rank would split the job: one rank in an NCCL group, its
peer in a gloo group, both waiting for the rendezvous timeout.

How they agree: each rank writes its node's facts (host, GPUs, local ranks) to the store; rank 0
reads every rank's, decides, and writes the choice, which every rank reads. A rank on a node short
of GPUs under ``--backend nccl`` fails at once, without waiting (rank 0 after writing the choice),
so the error comes in seconds, never after the rendezvous timeout.
"""

import json
import time
from dataclasses import asdict, dataclass
from datetime import timedelta

import torch.distributed as dist

from app.errors import ClusterError, UsageError, first_line
from app.runtime.devices import NodeDevices
from app.runtime.launcher import ProcessInfo

PREFIX = "backend"
"""The store keys of the agreement live under this prefix."""
TELL_S = 5.0
"""Longest that rank 0 waits for the others to read an error before it exits (and its store with it)."""


@dataclass(frozen=True)
class NodeFacts:
    """What one rank tells the others about its node."""

    host: str
    node_rank: int
    local_ranks: int
    """Ranks on this node (its local world size)."""
    gpus: int
    """GPUs this node's ranks see (0 without CUDA)."""

    @property
    def short(self) -> bool:
        """More local ranks than GPUs: some rank would have no GPU of its own."""
        return self.local_ranks > self.gpus


@dataclass(frozen=True)
class Choice:
    """The job's backend, and the line that explains a fallback (None when nothing needs saying)."""

    backend: str
    note: str | None = None


def node_facts(proc: ProcessInfo, devices: NodeDevices) -> NodeFacts:
    return NodeFacts(proc.host, proc.node_rank, proc.local_world_size, devices.count if devices.cuda else 0)


def _shortage(node: NodeFacts) -> str:
    gpus = f"{node.gpus} GPU(s)" if node.gpus else "no GPU (CUDA is not available there)"
    return f"node {node.host} has {gpus} for its {node.local_ranks} local rank(s)"


def _fix(node: NodeFacts) -> str:
    if node.gpus:
        return f"start at most one rank per GPU there (--nproc-per-node {node.gpus})"
    return "run the job on GPU nodes only"


def choose(requested: str, nodes: list[NodeFacts]) -> Choice:
    """The backend for a job whose nodes are ``nodes``; UsageError for nccl on a node short of GPUs."""
    short = next((node for node in nodes if node.short), None)
    if requested == "gloo":
        return Choice("gloo")
    if requested == "nccl":
        if short is not None:
            raise UsageError(
                f"--backend nccl needs a GPU for each local rank, but {_shortage(short)}: "
                f"{_fix(short)}, or use --backend gloo"
            )
        return Choice("nccl")
    if short is None:
        return Choice("nccl")
    if not any(node.gpus for node in nodes):
        return Choice("gloo")  # a CPU job: nothing to explain
    return Choice("gloo", f"backend auto: gloo on every rank, since {_shortage(short)}: for NCCL {_fix(short)}")


def agree(store: dist.Store, proc: ProcessInfo, requested: str, devices: NodeDevices, timeout: timedelta) -> Choice:
    """The job's backend, the same on every rank, through ``store`` (no process group exists yet)."""
    mine = node_facts(proc, devices)
    if proc.world_size == 1:
        return choose(requested, [mine])
    store.set(f"{PREFIX}/rank{proc.rank}", json.dumps(asdict(mine)))
    if requested == "nccl" and mine.short and not proc.is_main:
        store.add(f"{PREFIX}/told", 1)  # knows already: rank 0 need not wait for it
        return choose(requested, [mine])  # raises now: rank 0 tells the other nodes
    try:
        if proc.is_main:
            _decide(store, proc, requested, timeout)
        store.wait([f"{PREFIX}/choice"], timeout)
        found = json.loads(store.get(f"{PREFIX}/choice"))
    except RuntimeError as error:  # a rank that never came, or a store that went away
        raise ClusterError(
            f"the ranks could not agree on a backend within {timeout.total_seconds():g}s ({first_line(error)}): "
            "check that every rank started; the other ranks' errors say why not"
        ) from None
    if "error" in found:
        store.add(f"{PREFIX}/told", 1)
        raise UsageError(found["error"])
    return Choice(found["backend"], found["note"])


def _decide(store: dist.Store, proc: ProcessInfo, requested: str, timeout: timedelta) -> None:
    """Rank 0: read every rank's facts, choose, and write the choice (or the error) for all."""
    keys = [f"{PREFIX}/rank{r}" for r in range(proc.world_size)]
    store.wait(keys, timeout)
    nodes = [NodeFacts(**json.loads(raw)) for raw in store.multi_get(keys)]
    try:
        choice = choose(requested, nodes)
    except UsageError as error:
        store.set(f"{PREFIX}/choice", json.dumps({"error": str(error)}))
        _until_told(store, proc.world_size - 1)
        raise
    store.set(f"{PREFIX}/choice", json.dumps(asdict(choice)))


def _until_told(store: dist.Store, others: int, within_s: float = TELL_S) -> None:
    """Keep the store (rank 0 may serve it) up until the other ranks have read the error, or ``within_s``."""
    deadline = time.monotonic() + within_s
    while store.add(f"{PREFIX}/told", 0) < others and time.monotonic() < deadline:
        time.sleep(0.05)
