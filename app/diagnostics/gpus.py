"""The doctor's GPU checks: what breaks NCCL on a node, found before the process group starts.

    findings = gpus.diagnose(proc, "auto", devices.probe())   # run by app doctor, app check, app train

  gpus   visible GPUs against local ranks (the backend rule of app/runtime/backend.py, on this
         node): --backend nccl with more local ranks than GPUs is a usage error (exit 2) naming
         the fix; auto says which backend this node allows
  shm    under nccl with 2 or more local ranks: /dev/shm holds at least 256 MiB; NCCL's
         shared-memory transport puts its buffers there, and Docker's default of 64 MB makes it
         fail ("unhandled system error", NVIDIA/nccl#342)
  cuda   the driver supports the CUDA version torch was built for (same major version or newer:
         within one major, CUDA's minor version compatibility holds)
  nccl   under nccl: the NCCL version torch carries (torch built without NCCL fails)

Each rule is a function of the facts (``NodeDevices``), so tests give their own facts.
"""

from app.diagnostics.findings import FAILED, OK, SKIPPED, Finding
from app.runtime import backend
from app.runtime.devices import NodeDevices
from app.runtime.launcher import ProcessInfo

CHECKS = ("gpus", "shm", "cuda", "nccl")
MIB = 1 << 20
MIN_SHM_BYTES = 256 * MIB
"""Smallest /dev/shm that NCCL's shared-memory transport works in (Docker's default: 64 MB)."""


def local_backend(proc: ProcessInfo, requested: str, found: NodeDevices) -> str:
    """The backend this node allows (the job may still fall back to gloo for another node's sake)."""
    return backend.choose(requested, [backend.node_facts(proc, found)]).backend


def check_gpus(proc: ProcessInfo, requested: str, found: NodeDevices) -> Finding:
    """Visible GPUs against local ranks; UsageError under --backend nccl with too few."""
    facts = backend.node_facts(proc, found)
    chosen = backend.choose(requested, [facts])  # raises for nccl with too few
    if not found.cuda:
        return Finding("gpus", SKIPPED, f"no GPU on {proc.host} (CUDA is not available): gloo on CPU")
    seen = f"{facts.gpus} GPU(s) for {facts.local_ranks} local rank(s) on {proc.host}"
    if facts.short and requested == "auto":
        return Finding("gpus", OK, f"{seen}: gloo (auto); for NCCL --nproc-per-node {facts.gpus}")
    return Finding("gpus", OK, f"{seen}: {chosen.backend}")


def check_shm(proc: ProcessInfo, nccl: bool, found: NodeDevices) -> Finding:
    """Under nccl with several local ranks, /dev/shm must hold NCCL's shared-memory buffers."""
    if not nccl or proc.local_world_size < 2:
        return Finding("shm", SKIPPED, "not nccl with 2 or more local ranks")
    if found.shm_bytes is None:
        return Finding(
            "shm", FAILED, f"/dev/shm is not mounted on {proc.host}: NCCL's shared-memory transport needs it"
        )
    size = f"/dev/shm is {found.shm_bytes / MIB:.0f} MiB on {proc.host}"
    if found.shm_bytes < MIN_SHM_BYTES:
        return Finding(
            "shm",
            FAILED,
            f"{size}, below the {MIN_SHM_BYTES // MIB} MiB that NCCL's shared-memory transport needs (Docker's "
            "default 64 MB, NVIDIA/nccl#342): start the container with --shm-size=1g or --ipc=host",
        )
    return Finding("shm", OK, size)


def _major_minor(version: str) -> tuple[int, int]:
    major, _, minor = version.partition(".")
    return int(major), int(minor.split(".")[0] or 0)


def check_cuda(found: NodeDevices) -> Finding:
    """The driver's CUDA version against the one torch was built for."""
    if not found.cuda or found.torch_cuda is None or found.driver_cuda is None:
        return Finding("cuda", SKIPPED, "no CUDA driver, or torch built without CUDA")
    versions = f"driver supports CUDA {found.driver_cuda}, torch is built for CUDA {found.torch_cuda}"
    if _major_minor(found.driver_cuda)[0] < _major_minor(found.torch_cuda)[0]:
        return Finding(
            "cuda",
            FAILED,
            f"{versions}: install a driver for CUDA {found.torch_cuda.split('.')[0]}.x, or torch built for "
            f"CUDA {found.driver_cuda.split('.')[0]}.x",
        )
    if _major_minor(found.driver_cuda) < _major_minor(found.torch_cuda):
        return Finding("cuda", OK, f"{versions} (minor version compatibility)")
    return Finding("cuda", OK, versions)


def check_nccl(nccl: bool, found: NodeDevices) -> Finding:
    """Under nccl: the NCCL version torch carries."""
    if not nccl:
        return Finding("nccl", SKIPPED, "not nccl")
    if found.nccl is None:
        return Finding("nccl", FAILED, "torch carries no NCCL: install a CUDA build of torch, or use --backend gloo")
    return Finding("nccl", OK, f"NCCL {found.nccl}")


def diagnose(proc: ProcessInfo, requested: str, found: NodeDevices) -> list[Finding]:
    """Every GPU check of this rank (UsageError: --backend nccl with too few GPUs)."""
    gpus = check_gpus(proc, requested, found)
    nccl = local_backend(proc, requested, found) == "nccl"
    return [gpus, check_shm(proc, nccl, found), check_cuda(found), check_nccl(nccl, found)]
