"""Run ``python -m app train`` (or the test worker) on real local ranks, and read what it wrote.

Ranks rendezvous through a FileStore in the test's tmp_path (``--init-method file://``) with
hand-set RANK/WORLD_SIZE, so there is no port to pick and no free-port race; torchrun runs with
``--standalone`` where its restarts are what is tested.
"""

import itertools
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import torch

from tests.integration.launchers import PYTHON, TORCHRUN, _clean_env

TIMEOUT = 240
_rdzv_counter = itertools.count()


def run_ranks(
    nproc: int,
    args: list[str],
    tmp_path: Path,
    module: str = "app",
    timeout: float = TIMEOUT,
    env_of: Callable[[int], dict[str, str]] | None = None,
) -> list[subprocess.CompletedProcess]:
    """Start ``nproc`` processes of ``python -m MODULE ARGS`` as ranks of one job; wait for all.
    env_of: more environment for a rank, by its rank."""
    rdzv = tmp_path / f"rdzv-{next(_rdzv_counter)}"
    procs = []
    for rank in range(nproc):
        env = _clean_env(
            {"RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(nproc)}
            | (env_of(rank) if env_of else {})
        )
        cmd = [PYTHON, "-m", module, *args, "--init-method", f"file://{rdzv}"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def train(nproc: int, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """``app train ARGS`` on ``nproc`` ranks; asserts that every rank exited 0; rank 0's output."""
    results = run_ranks(nproc, ["train", *args], tmp_path)
    for rank, done in enumerate(results):
        assert done.returncode == 0, f"rank {rank} exited {done.returncode}: {done.stderr[-3000:]}"
    return results[0]


CHECKPOINTED = ["--train-samples", "128", "--test-samples", "32", "--epochs", "2", "--batch-size", "8"]
CHECKPOINTED += ["--checkpoint-every", "5", "--keep-checkpoints", "10"]
"""A short run with checkpoints: 128 samples, batch 8 on 2 ranks: 8 steps per epoch, 16 in all; every 5 steps."""


def uninterrupted(tmp: Path) -> Path:
    """The output folder of a CHECKPOINTED run on 2 hand-started ranks, uninterrupted: the final parameters that
    every interrupted or relaunched run of it must end with."""
    train(2, synthetic(tmp / "out", *CHECKPOINTED), tmp)
    return tmp / "out"


def synthetic(out: Path, *extra: str) -> list[str]:
    """Flags of a small, quick synthetic run writing to ``out``."""
    return ["--dataset", "synthetic", "--input-shape", "1x28x28", "--out", str(out), "--quiet", *extra]


def final_params(out: Path) -> dict[str, torch.Tensor]:
    """The model weights of the newest checkpoint in ``out``."""
    newest = sorted((out / "checkpoints").glob("step-*.pt"))[-1]
    return torch.load(newest, map_location="cpu", weights_only=True)["model_state"]


def same_final_params(reference: Path, out: Path) -> None:
    """The run in ``out`` ended with the parameters of ``reference``, bit for bit."""
    want, got = final_params(reference), final_params(out)
    for name in want:
        assert torch.equal(want[name], got[name]), name


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_params_close(a: dict, b: dict, rtol: float, atol: float) -> None:
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def train_torchrun_restarting(nproc: int, args: list[str], max_restarts: int) -> subprocess.CompletedProcess:
    """``torchrun --standalone --max-restarts N -m tests.integration.train_worker ARGS``: app train with the
    test worker's hooks (``--crash-at-step``); torchrun restarts failed ranks."""
    cmd = [
        TORCHRUN,
        "--standalone",
        f"--nproc-per-node={nproc}",
        f"--max-restarts={max_restarts}",
        "--monitor-interval=0.5",
        "-m",
        "tests.integration.train_worker",
        *args,
    ]
    return subprocess.run(cmd, env=_clean_env(), capture_output=True, text=True, timeout=TIMEOUT, check=False)
