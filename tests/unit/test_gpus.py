"""The doctor's GPU checks, each rule on injected facts (no GPU here)."""

import pytest

from app.diagnostics import doctor, gpus
from app.diagnostics.findings import FAILED, OK, SKIPPED
from app.errors import ClusterError, UsageError
from app.runtime.devices import NodeDevices
from app.runtime.distributed import DistConfig
from app.runtime.launcher import Launcher, ProcessInfo

H100 = NodeDevices(cuda=True, count=8, torch_cuda="13.0", driver_cuda="13.0", nccl="2.28.9", shm_bytes=32 << 30)
CPU = NodeDevices(cuda=False, count=0, shm_bytes=64 << 20)


def _proc(local_ranks: int, host: str = "node1") -> ProcessInfo:
    return ProcessInfo(0, 0, local_ranks, local_ranks, 0, None, 29500, Launcher.TORCHRUN, host=host)


def _status(findings) -> dict[str, tuple[str, str]]:
    return {f.check: (f.status, f.detail) for f in findings}


def test_a_healthy_gpu_node_passes_every_check() -> None:
    found = _status(gpus.diagnose(_proc(8), "auto", H100))
    assert {check: status for check, (status, _) in found.items()} == dict.fromkeys(gpus.CHECKS, OK)
    assert found["gpus"][1] == "8 GPU(s) for 8 local rank(s) on node1: nccl"
    assert found["nccl"][1] == "NCCL 2.28.9"


def test_a_cpu_node_skips_them() -> None:
    found = _status(gpus.diagnose(_proc(2), "auto", CPU))
    assert {check: status for check, (status, _) in found.items()} == dict.fromkeys(gpus.CHECKS, SKIPPED)


def test_more_local_ranks_than_gpus() -> None:
    one = NodeDevices(cuda=True, count=1, torch_cuda="13.0", driver_cuda="13.0", nccl="2.28.9", shm_bytes=1 << 30)
    found = _status(gpus.diagnose(_proc(2, "vm"), "auto", one))
    assert found["gpus"] == (OK, "1 GPU(s) for 2 local rank(s) on vm: gloo (auto); for NCCL --nproc-per-node 1")
    assert found["nccl"][0] == SKIPPED  # this node cannot run nccl
    with pytest.raises(UsageError, match="node vm has 1 GPU\\(s\\) for its 2 local rank\\(s\\)"):
        gpus.diagnose(_proc(2, "vm"), "nccl", one)


def test_dockers_default_shm_fails_under_nccl_only() -> None:
    small = NodeDevices(**{**H100.__dict__, "shm_bytes": 64 << 20})
    status, detail = _status(gpus.diagnose(_proc(8), "auto", small))["shm"]
    assert status == FAILED and "/dev/shm is 64 MiB on node1, below the 256 MiB" in detail
    assert "--shm-size=1g or --ipc=host" in detail
    assert _status(gpus.diagnose(_proc(1), "auto", small))["shm"][0] == SKIPPED  # no peer on the node
    assert _status(gpus.diagnose(_proc(8), "gloo", small))["shm"][0] == SKIPPED


@pytest.mark.parametrize(
    ("driver", "torch_cuda", "status", "words"),
    [
        ("13.0", "13.0", OK, "driver supports CUDA 13.0, torch is built for CUDA 13.0"),
        ("12.8", "12.4", OK, "torch is built for CUDA 12.4"),
        ("12.2", "12.4", OK, "(minor version compatibility)"),
        ("12.8", "13.0", FAILED, "install a driver for CUDA 13.x, or torch built for CUDA 12.x"),
    ],
)
def test_driver_against_torch_cuda(driver: str, torch_cuda: str, status: str, words: str) -> None:
    found = gpus.check_cuda(NodeDevices(cuda=True, count=1, torch_cuda=torch_cuda, driver_cuda=driver))
    assert found.status == status and words in found.detail


def test_nccl_missing_from_torch_fails_under_nccl() -> None:
    found = gpus.check_nccl(True, NodeDevices(cuda=True, count=1))
    assert found.status == FAILED and "torch carries no NCCL" in found.detail


def test_the_doctor_runs_them_and_a_failure_stops_the_preflight() -> None:
    small = NodeDevices(**{**H100.__dict__, "shm_bytes": 64 << 20})
    proc, cfg = _proc(8), DistConfig(timeout_s=1, init_method="file:///shared/rdzv")  # no network to check
    diag = doctor.diagnose(proc, cfg, found=H100)
    assert [f.check for f in diag.findings][-4:] == list(gpus.CHECKS) and diag.ok
    with pytest.raises(ClusterError, match="/dev/shm is 64 MiB"):
        doctor.preflight(proc, cfg, announce=False, found=small)
