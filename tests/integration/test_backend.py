"""One backend per job, on real torchrun ranks whose GPU count the test's worker injects.

2 local ranks on a node with 1 GPU: ``--backend auto`` must give gloo on both ranks with one line
naming the node, its GPUs and local ranks and the fix; ``--backend nccl`` must fail with one line
and exit 2 at once, not after the rendezvous timeout (before this rule, rank 0 took nccl and
rank 1 gloo, and both waited the whole timeout).
"""

import json
import re
import subprocess
import time

import pytest
import torch

from tests.integration.launchers import ERROR_LINE, TORCHRUN, _clean_env

pytestmark = pytest.mark.integration

WORKER = "tests.integration.gpu_worker"
CPU_ONLY_TORCH = torch.version.cuda is None and torch.version.hip is None
NO_NCCL = "torch carries no NCCL: install a CUDA build of torch, or use --backend gloo"
"""The nccl check's line where torch has no NCCL: said only by a rank whose backend is nccl."""
TIMEOUT_S = 300
"""The rendezvous timeout given to the ranks: an error that waited for it would take this long."""


def _torchrun(nproc: int, gpus: int, args: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    cmd = [TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", "-m", WORKER, "--gpus", str(gpus), *args]
    start = time.monotonic()
    done = subprocess.run(cmd, env=_clean_env(), capture_output=True, text=True, timeout=2 * TIMEOUT_S, check=False)
    return done, time.monotonic() - start


def test_auto_with_more_local_ranks_than_gpus_is_gloo_on_every_rank(tmp_path) -> None:
    # --device-seconds 0: the backend is what this asks of the report, not the device health (2 s a rank).
    args = ["check", "--device-seconds", "0", "--timeout", str(TIMEOUT_S), "--json", str(tmp_path / "c.json")]
    done, _ = _torchrun(2, 1, args)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["backend"] == "gloo" and {r["backend"] for r in report["ranks"]} == {"gloo"}
    notes = [line for line in done.stderr.splitlines() if line.startswith("backend auto:")]
    assert len(notes) == 1, done.stderr[-3000:]  # one line for the job, from rank 0
    assert "gloo on every rank, since node" in notes[0]
    assert (
        "has 1 GPU(s) for its 2 local rank(s): for NCCL start at most one rank per GPU there (--nproc-per-node 1)"
        in notes[0]
    )


def test_auto_with_a_gpu_per_rank_would_be_nccl_control(tmp_path) -> None:
    # The negative control: with enough (injected) GPUs auto picks nccl, which needs a real GPU
    # here, so the run must fail, on nccl's account, rather than fall back to gloo: any other crash
    # (of gloo on a GPU that is not there, say) is not this control's.
    done, _ = _torchrun(2, 2, ["check", "--timeout", "30"])
    assert done.returncode != 0
    assert "backend auto:" not in done.stderr
    errors = [ERROR_LINE.match(line) for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and all(errors), done.stderr[-3000:]
    if CPU_ONLY_TORCH:  # the nccl check of each rank that took nccl (app/diagnostics/gpus.py) says it
        assert {e["cause"] for e in errors} == {NO_NCCL}, done.stderr[-3000:]
    else:  # a CUDA build: nccl fails at its first touch of the (absent) GPU
        assert all(re.search("nccl|cuda", e["cause"], re.IGNORECASE) for e in errors), done.stderr[-3000:]


def test_nccl_with_more_local_ranks_than_gpus_is_one_line_at_once() -> None:
    done, seconds = _torchrun(2, 1, ["check", "--backend", "nccl", "--timeout", str(TIMEOUT_S)])
    assert done.returncode != 0
    errors = [ERROR_LINE.match(line) for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors and all(e and e["status"] == "2" for e in errors), done.stderr[-3000:]
    # Each rank knows it at once; torchrun stops the others when the first exits, so one or both say it.
    assert {e["rank"] for e in errors} <= {"0", "1"}
    assert all(
        "--backend nccl needs a GPU for each local rank, but node " in e["cause"]
        and "has 1 GPU(s) for its 2 local rank(s): start at most one rank per GPU there (--nproc-per-node 1), "
        "or use --backend gloo"
        in e["cause"]
        for e in errors
    )
    assert seconds < TIMEOUT_S, f"{seconds:.0f} s: it waited for the rendezvous timeout (--timeout {TIMEOUT_S})"
