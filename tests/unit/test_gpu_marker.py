"""The suite's one GPU rule (tests/conftest.py): gpu-marked tests skip without CUDA; other tests see no GPU."""

import os
import subprocess
import sys

import pytest
import torch

from tests import conftest


class _Item:
    """The little of a pytest item the rule reads and writes."""

    def __init__(self, gpu: bool) -> None:
        self.markers = [pytest.mark.gpu.mark] if gpu else []
        self.nodeid = f"tests/unit/test_{'gpu' if gpu else 'cpu'}.py::test"

    def get_closest_marker(self, name: str):
        return next((m for m in self.markers if m.name == name), None)

    def add_marker(self, marker) -> None:
        self.markers.append(marker.mark)


def _skipped(item: _Item) -> list[str]:
    return [m.kwargs["reason"] for m in item.markers if m.name == "skip"]


@pytest.mark.parametrize("gpus", [0, 1])
def test_gpu_tests_skip_with_one_reason_only_where_no_gpu_is_visible(monkeypatch, gpus: int) -> None:
    monkeypatch.setattr(conftest, "gpus_here", lambda: gpus)
    gpu, cpu = _Item(gpu=True), _Item(gpu=False)
    conftest.pytest_collection_modifyitems(None, [gpu, cpu])  # type: ignore[arg-type]
    assert _skipped(gpu) == ([conftest.NO_GPU] if gpus == 0 else []) and _skipped(cpu) == []


def test_a_test_without_the_marker_sees_no_gpu_here_or_in_its_subprocesses() -> None:
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and not torch.cuda.is_available()
    assert torch.cuda.device_count() == 0
    child = "import torch; print(torch.cuda.device_count())"
    assert subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip() == "0"


@pytest.fixture(scope="module")
def visible_to_a_module_fixture() -> str | None:
    """What a module-scoped fixture sees: it runs before any test's own fixtures (test_comm_hooks trains in one)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_a_module_scoped_fixture_sees_no_gpu_either(visible_to_a_module_fixture: str | None) -> None:
    assert visible_to_a_module_fixture == ""
