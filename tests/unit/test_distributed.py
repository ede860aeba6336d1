"""Backend choice and process-group configuration (the GPU paths run on a lent GPU machine)."""

import pytest

from app.errors import UsageError
from app.runtime.distributed import DistConfig, resolve_backend


@pytest.mark.parametrize(
    ("requested", "local_rank", "cuda", "gpus", "backend"),
    [
        ("auto", 0, False, 0, "gloo"),
        ("auto", 0, True, 1, "nccl"),
        ("auto", 1, True, 1, "gloo"),  # more local ranks than GPUs: this rank has none
        ("gloo", 0, True, 8, "gloo"),
        ("nccl", 3, True, 8, "nccl"),
    ],
)
def test_resolve_backend(requested: str, local_rank: int, cuda: bool, gpus: int, backend: str) -> None:
    assert resolve_backend(requested, local_rank, cuda, gpus) == backend


def test_nccl_without_gpu_is_a_clear_error() -> None:
    with pytest.raises(UsageError, match="--backend nccl needs a GPU for local rank 0 but CUDA is not available"):
        resolve_backend("nccl", 0, False, 0)
    with pytest.raises(UsageError, match="2 GPU\\(s\\) visible"):
        resolve_backend("nccl", 2, True, 2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"backend": "mpi"}, "--backend"), ({"timeout_s": 0}, "--timeout"), ({"init_method": "/tmp/x"}, "file://")],
)
def test_bad_dist_config(kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        DistConfig(**kwargs)
