# ruff: noqa: E501  (torchrun's own output lines, quoted whole)
"""The cluster runner's reading of node output: the app's lines for the user, the rest for the log,
and each failure as one line."""

from app.platform.spec import build
from app.platform.supervise import Filter, describe_status, failure_note, root_cause

TORCHRUN_FAILURE = """\
train: mlp on digits (1437 train / 360 test), 4 rank(s) on 2 node(s)
[rank1]: Traceback (most recent call last):
[rank0]: Traceback (most recent call last):
[rank1]:   File "/opt/venv/lib/python3.11/site-packages/app/train/report.py", line 16, in <module>
[rank1]:     from tqdm import tqdm
[rank0]:   File "/opt/venv/lib/python3.11/site-packages/app/train/report.py", line 16, in <module>
[rank1]: ModuleNotFoundError: No module named 'tqdm'
[rank0]: ModuleNotFoundError: No module named 'tqdm'
E1122 11:25:09.788000 7 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 40) of binary: /opt/venv/bin/python3.11
Traceback (most recent call last):
  File "/opt/venv/bin/torchrun", line 8, in <module>
    sys.exit(main())
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
-m app FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_11:25:09
  host      : head
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 40)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
epoch 1/10  train loss 1.6745
"""


def test_the_users_lines_pass_and_internals_stay_in_the_log() -> None:
    f = Filter()
    shown = [line for line in TORCHRUN_FAILURE.splitlines() if not f.is_internal(line)]
    assert shown == [
        "train: mlp on digits (1437 train / 360 test), 4 rank(s) on 2 node(s)",
        "epoch 1/10  train loss 1.6745",
    ]


def test_the_apps_exception_is_the_root_cause_not_torchruns() -> None:
    f = Filter()
    for line in TORCHRUN_FAILURE.splitlines():
        f.is_internal(line)
    assert f.cause == "ModuleNotFoundError: No module named 'tqdm'" and not f.said_error
    alone = Filter()
    for line in (
        "Traceback (most recent call last):",
        '  File "x"',
        "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
    ):
        alone.is_internal(line)
    assert "RendezvousTimeoutError" in alone.cause


def test_an_error_line_of_the_app_is_shown_and_noted() -> None:
    f = Filter()
    assert not f.is_internal("error: rank 0 on head: --dataset 'x' is not one of digits [exit 2]")
    assert f.said_error


def test_failures_become_one_line_each() -> None:
    line = "E1122 11:25:09.788000 7 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 6038) of binary: /x"
    assert failure_note("worker-1", line) == "worker-1: local rank 1 (pid 6038) ended with signal 9 (SIGKILL)"
    restart = "W1122 ... [default] Worker group FAILED. 2/3 attempts left; will restart worker group"
    assert "2 of 3 restarts left" in failure_note("head", restart)
    assert failure_note("head", "epoch 3/10  train loss 0.5") is None


def test_statuses_read_as_exits_and_signals() -> None:
    assert describe_status(1) == "exit 1"
    assert describe_status(137) == "signal 9 (SIGKILL)"
    assert describe_status(-15) == "signal 15 (SIGTERM)"


def test_torchruns_exceptions_read_in_the_users_terms() -> None:
    spec = build({"nodes": {"nodes": 3}, "rendezvous": {"join_timeout": 30}})
    text = root_cause("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", spec)
    assert "not all 3 nodes joined within --join-timeout 30s" in text
    assert root_cause("ValueError: x", spec) == "ValueError: x"
