"""Backend choice (one per job, agreed through the store) and process-group configuration; the GPU
facts are injected (the GPU paths run on a lent GPU machine)."""

import threading
from datetime import timedelta

import pytest
import torch.distributed as dist

from app.errors import UsageError
from app.runtime import backend
from app.runtime.backend import Choice, NodeFacts, choose
from app.runtime.devices import NodeDevices
from app.runtime.distributed import DistConfig
from app.runtime.launcher import Launcher, ProcessInfo


def _node(gpus: int, local_ranks: int, host: str = "vm", node_rank: int = 0) -> NodeFacts:
    return NodeFacts(host, node_rank, local_ranks, gpus)


@pytest.mark.parametrize(
    ("requested", "nodes", "chosen"),
    [
        ("auto", [_node(0, 1)], "gloo"),
        ("auto", [_node(1, 1)], "nccl"),
        ("auto", [_node(8, 8), _node(8, 4, "b", 1)], "nccl"),
        ("auto", [_node(1, 2)], "gloo"),  # more local ranks than GPUs: gloo on every rank, not per rank
        ("auto", [_node(8, 8), _node(0, 8, "cpu1", 1)], "gloo"),
        ("gloo", [_node(8, 8)], "gloo"),
        ("nccl", [_node(8, 8)], "nccl"),
    ],
)
def test_choose(requested: str, nodes: list[NodeFacts], chosen: str) -> None:
    assert choose(requested, nodes).backend == chosen


def test_auto_says_why_it_falls_back_in_one_line() -> None:
    assert choose("auto", [_node(0, 2)]) == Choice("gloo")  # a CPU job: nothing to say
    note = choose("auto", [_node(8, 8, "node0"), _node(1, 2, "node1", 1)]).note
    assert note == (
        "backend auto: gloo on every rank, since node node1 has 1 GPU(s) for its 2 local rank(s): "
        "for NCCL start at most one rank per GPU there (--nproc-per-node 1)"
    )


def test_nccl_short_of_gpus_is_a_usage_error_naming_node_and_fix() -> None:
    with pytest.raises(UsageError) as error:
        choose("nccl", [_node(1, 2)])
    assert str(error.value) == (
        "--backend nccl needs a GPU for each local rank, but node vm has 1 GPU(s) for its 2 local rank(s): "
        "start at most one rank per GPU there (--nproc-per-node 1), or use --backend gloo"
    )
    with pytest.raises(UsageError, match="node vm has no GPU \\(CUDA is not available there\\) for its 1 local"):
        choose("nccl", [_node(0, 1)])


def _proc(rank: int, world: int, local_world: int, host: str) -> ProcessInfo:
    return ProcessInfo(
        rank, rank % local_world, world, local_world, rank // local_world, "h", 29500, Launcher.TORCHRUN, host=host
    )


def _agree_on_threads(requested: str, gpus_by_node: list[int], local_world: int) -> list:
    """Every rank of a job in a thread of its own, agreeing through one in-memory store."""
    world = len(gpus_by_node) * local_world
    store, found = dist.HashStore(), [None] * world

    def rank(r: int) -> None:
        gpus = gpus_by_node[r // local_world]
        facts = NodeDevices(cuda=gpus > 0, count=gpus)
        try:
            found[r] = backend.agree(
                store, _proc(r, world, local_world, f"node{r // local_world}"), requested, facts, timedelta(seconds=20)
            )
        except UsageError as error:
            found[r] = error

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return found


def test_every_rank_agrees_on_the_fallback() -> None:
    found = _agree_on_threads("auto", [2, 1], local_world=2)  # node1: 1 GPU for 2 ranks
    assert {c.backend for c in found} == {"gloo"}
    assert all("node node1 has 1 GPU(s) for its 2 local rank(s)" in c.note for c in found)
    assert {c.backend for c in _agree_on_threads("auto", [2, 2], local_world=2)} == {"nccl"}


def test_every_rank_gets_the_nccl_error() -> None:
    found = _agree_on_threads("nccl", [2, 1], local_world=2)
    assert all(isinstance(e, UsageError) and "node node1 has 1 GPU(s)" in str(e) for e in found)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"backend": "mpi"}, "--backend"), ({"timeout_s": 0}, "--timeout"), ({"init_method": "/tmp/x"}, "file://")],
)
def test_bad_dist_config(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        DistConfig(**kwargs)
