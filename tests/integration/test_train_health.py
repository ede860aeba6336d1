"""Hang and straggler reports of app train (app/train/watch.py) on real local ranks.

A rank that stops (SIGSTOP, like a hung process) is named by the ranks that still answer, once
their collective times out; a rank that is slow every step is named as the straggler. Each test
moves the fault to another rank as its own negative control: the report must follow it.
The fault hooks are the fault suite's test job (tests/rigs/faults/fault_job.py).
"""

import json
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.integration.launchers import ERROR_LINE, PYTHON, _clean_env
from tests.integration.train_runs import TIMEOUT, metrics, synthetic

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "rigs" / "faults" / "fault_job.py"
COLLECTIVE_TIMEOUT = 8


def start_ranks(nproc: int, hooks: list[str], train_args: list[str], tmp_path: Path) -> list[subprocess.Popen]:
    """``nproc`` ranks of the fault job, rendezvous through a file in ``tmp_path``."""
    procs = []
    for rank in range(nproc):
        env = _clean_env(
            {"RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(nproc)}
        )
        cmd = [PYTHON, str(JOB), *hooks, "--", *train_args, "--init-method", f"file://{tmp_path / 'rdzv'}"]
        procs.append(
            subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    return procs


def answers_of_the_others(faulty: int, hooks: list[str], tmp_path: Path) -> list[str]:
    """3 ranks of a small synthetic run with --timeout COLLECTIVE_TIMEOUT, rank ``faulty`` hooked: the causes of
    the one-line errors that the other ranks end with (each exits 1); every rank is killed at the end."""
    train_args = synthetic(tmp_path / "out", "--train-samples", "512", "--epochs", "1", "--batch-size", "8")
    hooks = ["--marker", str(tmp_path / "fault.json"), "--fault-at-step", "6", "--fault-rank", str(faulty), *hooks]
    procs = start_ranks(3, hooks, [*train_args, "--timeout", str(COLLECTIVE_TIMEOUT)], tmp_path)
    try:
        answering = [p for rank, p in enumerate(procs) if rank != faulty]
        results = [p.communicate(timeout=TIMEOUT) for p in answering]
    finally:
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
    causes = []
    for proc, (_stdout, stderr) in zip(answering, results, strict=True):
        assert proc.returncode == 1, stderr[-3000:]
        line = ERROR_LINE.match(stderr.splitlines()[-1])
        assert line, stderr[-3000:]
        assert len(stderr.strip().splitlines()) == 1, stderr[-3000:]  # the one line: the details are in the log
        causes.append(line["cause"])
    return causes


@pytest.mark.parametrize("stalled", [2, 0])
def test_the_ranks_that_still_answer_name_the_one_that_stopped(tmp_path, stalled):
    causes = answers_of_the_others(stalled, ["--stall"], tmp_path)
    assert json.loads((tmp_path / "fault.json").read_text())["step"] == 6
    host = socket.gethostname()
    for cause in causes:
        assert cause.startswith(f"rank {stalled} on {host} stopped answering: the gradient all-reduce of step 7 "), (
            cause
        )
        assert "2 of 3 ranks answer" in cause, cause


@pytest.mark.parametrize("slow", [1, 0])
def test_the_slowest_rank_is_named_in_metrics_and_on_the_console(tmp_path, slow):
    out = tmp_path / "out"
    hooks = ["--sleep-rank", str(slow), "--sleep-ms", "40"]
    train_args = synthetic(out, "--train-samples", "640", "--epochs", "1", "--batch-size", "8", "--exchange-every", "5")
    procs = start_ranks(2, hooks, [*train_args, "--no-quiet", "--straggler-percent", "50"], tmp_path)
    results = [p.communicate(timeout=TIMEOUT) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    ranks = [m for m in metrics(out) if m["event"] == "ranks"]
    assert [m["step"] for m in ranks] == [5, 10, 15, 20, 25, 30, 35, 40], ranks
    # The sleeping rank is busy ~40 ms longer per step; every other rank waits for it in the all-reduce.
    assert all(m["slowest_rank"] == slow and m["slowest_host"] == socket.gethostname() for m in ranks), ranks
    assert all(m["busy_ms"][slow] > m["busy_ms"][1 - slow] + 20 for m in ranks), ranks
    said = [line for line in results[0][0].splitlines() if "(a straggler)" in line]
    assert len(said) == 1 and said[0].startswith(f"train: rank {slow} on "), results[0][0][-3000:]


@pytest.mark.parametrize("hung", [1, 0])
def test_the_flight_recorder_names_the_collective_and_the_line_a_hung_rank_is_at(tmp_path, hung):
    """A rank sleeps inside a step past --timeout: the others' line names the collective it never joined, its
    sequence number, the rank and host, and the hook's line (torch's flight recorder, read by torch's analysis)."""
    causes = answers_of_the_others(hung, ["--hang-s", str(4 * COLLECTIVE_TIMEOUT)], tmp_path)
    line_no = next(i for i, text in enumerate(JOB.read_text().splitlines(), 1) if "HANG_LINE" in text)
    host = socket.gethostname()
    for cause in causes:
        assert cause.startswith(f"rank {hung} on {host} stopped answering: the gradient all-reduce of step 7 "), cause
        found = re.search(r"flight recorder: gloo:all_reduce #(\d+) \(sequence number\) of group (\S+) was never "
                          r"joined by rank (\d+) on (\S+) at (\S+):(\d+) in (\w+); "
                          r"dumps in ([^\s;]+)", cause)  # fmt: skip
        assert found, cause
        assert found[3] == str(hung) and found[4] == host and int(found[1]) > 6, cause
        assert (found[5], int(found[6]), found[7]) == ("tests/rigs/faults/fault_job.py", line_no, "hook"), cause
        assert Path(found[8]) == tmp_path / "out" / "flight"
        assert (Path(found[8]) / "analysis.txt").is_file()  # what torch's analysis said, off the terminal
