"""What rank 0 prints in a real run: tqdm's bar on a terminal (a pty), plain lines in a pipe or a
log file (no carriage returns, no escape codes); the other ranks print nothing."""

import fcntl
import os
import pty
import struct
import subprocess
import termios

import pytest

from tests.integration.launchers import PYTHON, _clean_env
from tests.integration.train_runs import run_ranks

pytestmark = pytest.mark.integration

FLAGS = ["--dataset", "synthetic", "--train-samples", "128", "--test-samples", "16", "--batch-size", "8"]


LINES = ["train: ", "tensorboard: ", "epoch 1/2  train loss", "epoch 2/2  train loss", "done: 16 steps, 2 epochs"]


def test_a_pipe_gets_plain_lines_from_rank_0_only(tmp_path) -> None:
    results = run_ranks(2, ["train", *FLAGS, "--epochs", "2", "--out", str(tmp_path / "run")], tmp_path)
    assert [r.returncode for r in results] == [0, 0], results[0].stderr[-3000:]
    shown = results[0].stdout
    assert "\r" not in shown and "\x1b" not in shown
    lines = shown.splitlines()
    assert len(lines) == 5 and all(line.startswith(p) for line, p in zip(lines, LINES, strict=True))
    assert results[1].stdout == ""


def test_a_terminal_gets_the_bar(tmp_path) -> None:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 rows, 100 columns
    cmd = [PYTHON, "-m", "app", "train", *FLAGS, "--epochs", "2", "--out", str(tmp_path / "run")]
    with subprocess.Popen(
        cmd, env=_clean_env(), stdin=subprocess.DEVNULL, stdout=follower, stderr=subprocess.PIPE
    ) as proc:
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            shown += chunk
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-3000:]
    os.close(leader)
    text = shown.decode()
    assert "\repoch 1/2:" in text and "batch/s" in text and "\repoch 2/2:" in text  # tqdm's bar, redrawn in place
    assert "epoch 2/2  train loss" in text and "done: 32 steps, 2 epochs" in text  # one rank: 16 steps an epoch
