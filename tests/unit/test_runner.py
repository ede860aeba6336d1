# ruff: noqa: E501  (torchrun's own output lines, quoted whole)
"""The cluster runner's reading of node output: the app's lines for the user, the rest for the log,
each failure (and each restart) as one line. Docker is not asked: the containers' host names are
given, and ``docker stop`` is recorded."""

import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from app.orchestrate import runner
from app.orchestrate.runner import Filter, describe_status, root_cause, worker_failed
from app.topology.spec import build

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


def test_torchruns_report_of_an_ended_worker_is_read() -> None:
    line = "E1122 11:25:09.788000 7 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 6038) of binary: /x"
    assert worker_failed(line) == (-9, 1)
    assert worker_failed("epoch 3/10  train loss 0.5") is None


def test_statuses_read_as_exits_and_signals() -> None:
    assert describe_status(1) == "exit 1"
    assert describe_status(137) == "signal 9 (SIGKILL)"
    assert describe_status(-15) == "signal 15 (SIGTERM)"


def test_torchruns_exceptions_read_in_the_users_terms() -> None:
    spec = build({"nodes": {"nodes": 3}, "rendezvous": {"join_timeout": 30}})
    text = root_cause("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError", spec)
    assert "not all 3 nodes joined within --join-timeout 30s" in text
    assert root_cause("ValueError: x", spec) == "ValueError: x"


# --- failures, restarts and their one line (Run.observe); Docker is not asked (host names are container names)

RESUMED = "train: resumed from step 23 (checkpoint /r/f/checkpoints/step-00000023.pt), 4 steps lost (the failed attempt reached step 27)"


@pytest.fixture
def run(tmp_path, monkeypatch):
    job = runner.Run(build({"job": {"name": "demo"}}), tmp_path, tmp_path / "demo.log")
    job.docker_calls = []
    monkeypatch.setattr(runner, "_docker", lambda *args, **_: job.docker_calls.append(args))
    return job


def test_one_line_per_restart_names_the_killed_rank_not_the_ranks_that_failed_after_it(run, capsys):
    head, worker = "demo-head-1", "worker-1"
    lines = [
        (
            head,
            "error: rank 0 on demo-head-1: ranks 2-3 on demo-worker-1 stopped answering: the gradient all-reduce ...",
        ),
        (worker, "E1122 12:15:03.098000 6 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 17) of binary: x"),
        (head, "E1122 12:15:03.098000 7 api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 156) of binary: x"),
        (head, "W1122 12:15:03.580000 7 api.py:1002] failed (exitcode: -15) local_rank: 1 (pid: 157) of binary: x"),
    ]
    assert all(run.observe(node, line) for node, line in lines)
    assert capsys.readouterr().out == ""  # held back: the job may resume
    assert run.observe(head, RESUMED)
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "cluster: restart 1: rank 3 (local rank 1 on demo-worker-1) ended with signal 9 (SIGKILL); resumed from "
        "step 23 (checkpoint /r/f/checkpoints/step-00000023.pt), 4 steps lost (the failed attempt reached step 27)"
    ]
    assert run.incident is None and run.errors == []


def test_a_container_that_stopped_is_the_cause_and_a_hang_report_names_containers(run, capsys):
    run.failure(runner.CONTAINER, "demo-worker-1 (ranks 2-3) stopped with signal 9 (SIGKILL)")
    run.observe(
        "demo-head-1", "error: rank 0 on demo-head-1: rank 3 on demo-worker-1 stopped answering: x [exit 1; log /l]"
    )
    run.observe("demo-head-1", RESUMED)
    assert capsys.readouterr().out.startswith(
        "cluster: restart 1: demo-worker-1 (ranks 2-3) stopped with signal 9 (SIGKILL); resumed from step 23"
    )
    run.observe(
        "demo-head-1", "error: rank 0 on demo-head-1: rank 3 on demo-worker-1 stopped answering: y [exit 1; log /l]"
    )
    run.observe("demo-head-1", RESUMED)
    assert capsys.readouterr().out.startswith("cluster: restart 2: rank 3 on demo-worker-1 stopped answering: y; ")


def test_a_full_disk_is_not_restarted(run, capsys):
    line = (
        "error: rank 0 on demo-head-1: could not write checkpoint /results/f/checkpoints/step-00000030.pt (No space left on "
        "device): free some space or choose another --out; the earlier checkpoints are intact [exit 1; log /l]"
    )
    run.observe(
        "demo-head-1", "error: rank 2 on demo-worker-1: rank 0 on demo-head-1 stopped answering: ... [exit 1; log /l]"
    )
    run.observe("demo-head-1", line)
    run.observe(
        "demo-head-1", "error: rank 0 on demo-head-1: cannot resume in /results/f: ... (No space left on device) ..."
    )
    assert capsys.readouterr().err.splitlines() == [line]  # at once; why it was not restarted: the final line
    assert run.gave_up.status == 1 and run.ended.is_set() and run.status == 1  # the runner stops every container
    assert runner._failure(run, 143, Filter()) == (
        "not restarted: every attempt would run out of disk the same way; free space in the volume demo_results, "
        "then run the job again: it resumes from its last checkpoint; the job was stopped"
    )


def test_bad_input_is_not_restarted_and_a_worker_is_named_by_its_container(run, capsys):
    run.observe("worker-1", "error: rank 1 on demo-worker-1: --dataset 'nope' is not one of digits [exit 2]")
    run.observe("worker-1", "E1122 1 api.py:1] failed (exitcode: 2) local_rank: 0 (pid: 9) of binary: x")
    assert capsys.readouterr().err.splitlines() == [
        "error: rank 1 on demo-worker-1: --dataset 'nope' is not one of digits [exit 2]"
    ]
    assert run.gave_up == runner.Stopped("bad input fails the same way on every attempt", 2)


def test_at_the_end_a_failure_without_resume_is_told_by_the_ranks_own_lines(run, capsys):
    run.observe(
        "demo-head-1", "error: rank 0 on demo-head-1: rank 2 on demo-worker-1 stopped answering: z [exit 1; log /l]"
    )
    run.unresolved()
    assert capsys.readouterr().err.splitlines() == [
        "error: rank 0 on demo-head-1: rank 2 on demo-worker-1 stopped answering: z [exit 1; log /l]"
    ]


def test_node_ranks_follow_c10d_order(run):
    assert run.node_ranks("demo-head-1") == [0, 1]
    assert run.node_ranks("demo-worker-1") == [2, 3]
    assert run.rank_name("worker-1", 1) == "rank 3 (local rank 1 on demo-worker-1)"


def _docker_events_of(project: str) -> list[int]:
    """Pids of ``docker events`` processes that watch ``project`` (any parent: a leaked one is reparented to 1)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[1:2] == [b"events"] and f"label=com.docker.compose.project={project}".encode() in argv:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(shutil.which("docker") is None, reason="needs the docker CLI")
def test_the_node_watcher_ends_with_the_job_and_leaves_no_docker_events(tmp_path):
    """The watcher blocks reading ``docker events`` (no container of this project dies): stop must end it."""
    project = f"nowatch-{os.getpid()}"
    job = runner.Run(build({"job": {"name": project}}), tmp_path / "x.env", tmp_path / "x.log")
    stop = threading.Event()
    watcher = threading.Thread(target=runner._watch_nodes, args=(job, stop, time.time()), daemon=True)
    watcher.start()
    deadline = time.monotonic() + 30
    while not _docker_events_of(project) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _docker_events_of(project), "the watcher did not start docker events"  # the negative control
    stop.set()  # what cluster up does when the job has ended
    watcher.join(timeout=20)
    left = _docker_events_of(project)
    for pid in left:  # a leak found: clean up after the failed test
        os.kill(pid, 9)
    assert not watcher.is_alive() and not left


def _attempt(run, node: str, rank: int, local_rank: int, message: str) -> Filter:
    """One attempt of a user script that raises on one rank: its traceback, then torchrun's report."""
    filt = Filter()
    lines = [
        f"[rank{rank}]: Traceback (most recent call last):",
        f'[rank{rank}]:   File "/job/script.py", line 9, in <module>',
        f'[rank{rank}]:     raise RuntimeError("{message}")',
        f"[rank{rank}]: RuntimeError: {message}",
        f"E1122 12:15:03.098000 7 api.py:1002] failed (exitcode: 1) local_rank: {local_rank} (pid: 40) of binary: x",
    ]
    for line in lines:
        run.take(node, filt, line)
        run.observe(node, line)
    return filt


def test_the_final_line_names_the_rank_and_node_that_raised(run):
    filt = _attempt(run, "demo-head-1", 1, 1, "boom")
    assert runner._failure(run, 1, filt) == "rank 1 on demo-head-1: RuntimeError: boom"
    other = _attempt(run, "worker-1", 3, 1, "boom")  # a worker's rank, read from its own output
    assert run.raised == {} and run.failed_before[3] == "RuntimeError: boom"
    assert other.cause_rank == 3 and run.where(3) == "rank 3 on demo-worker-1"


def test_a_failure_that_repeats_on_the_next_attempt_stops_the_restarts(run, capsys):
    _attempt(run, "demo-head-1", 1, 1, "boom")
    assert run.gave_up is None  # once may be chance
    filt = _attempt(run, "demo-head-1", 1, 1, "boom")
    assert run.ended.is_set() and run.status == 1
    assert runner._failure(run, 143, filt) == (
        "not restarted: rank 1 on demo-head-1 failed the same way on two attempts in a row (RuntimeError: boom): a "
        "restart cannot cure it; fix the script, then run the job again; the job was stopped"
    )


def test_different_failures_or_a_lost_container_keep_the_restarts(run):
    _attempt(run, "demo-head-1", 1, 1, "boom at step 3")
    _attempt(run, "demo-head-1", 1, 1, "boom at step 7")  # another failure: restarted
    assert run.gave_up is None
    run.failure(runner.CONTAINER, "demo-worker-1 (ranks 2-3) stopped with signal 9 (SIGKILL)")
    _attempt(run, "demo-head-1", 1, 1, "boom at step 7")  # the same, but a container was lost: not the script's
    assert run.gave_up is None


def _event(action: str, service: str, code: int | None = None) -> str:
    """One line of ``docker events --format '{{json .}}'`` for a container of the project ``demo``."""
    attributes = {"com.docker.compose.service": service, "name": f"demo-{service}" + ("" if "-" in service else "-1")}
    return json.dumps(
        {"Action": action, "Actor": {"Attributes": attributes | ({"exitCode": str(code)} if code is not None else {})}}
    )


@pytest.mark.parametrize(
    ("events", "restarted", "ended"),
    [
        ([("kill", "head", None), ("die", "head", 137)], [("demo-head-1", True)], None),  # docker kill: a node lost
        (
            [("kill", "worker-1", None), ("die", "worker-1", 1)],
            [("demo-worker-1", True)],
            None,
        ),  # docker stop: torchrun exits 1
        ([("die", "head", 139)], [("demo-head-1", False)], None),  # died of a signal (a crash, the OOM killer)
        ([("die", "worker-1", 1)], [], (1, "demo-worker-1")),  # its agent gave up: the job's end
        (
            [("kill", "head", None), ("die", "head", 137), ("die", "worker-1", 0)],
            [("demo-head-1", True)],
            (0, "demo-worker-1"),
        ),
        ([("die", "init", 0), ("die", "rendezvous", 137)], [], (137, "demo-rendezvous-1")),
    ],
)
def test_a_node_lost_is_restarted_a_node_that_ended_ends_the_job_and_so_does_the_store_lost(
    run, monkeypatch, events, restarted, ended
):
    lines = [_event(*e) + "\n" for e in events]

    class Events:  # docker events, as read: the lines, then nothing
        stdout = iter(lines)

        def kill(self) -> None: ...

        def wait(self) -> None: ...

    monkeypatch.setattr(runner.subprocess, "Popen", lambda *_, **__: Events())
    calls = []
    monkeypatch.setattr(
        runner, "_restart_node", lambda _run, name, code, _stop, by_docker: calls.append((name, by_docker))
    )
    runner._watch_nodes(run, threading.Event(), 0.0)
    assert calls == restarted
    assert (run.status, run.ended_by) == ended if ended else not run.ended.is_set()
    if ended and ended[1] == "demo-rendezvous-1":
        assert runner._failure(run, run.status, Filter()) == (
            "the rendezvous store (demo-rendezvous-1) was lost: it stopped with signal 9 (SIGKILL); run the job again "
            "to resume from its last checkpoint"
        )


def test_a_node_kept_out_by_its_gate_is_one_line_and_no_restart(run, capsys):
    kept = "gate: kept out: device check 4.1 GFLOP/s against the job's 36.2 (fail below 0.5); tried again every 10 s"
    assert run.observe("worker-1", kept)
    assert capsys.readouterr().out.splitlines() == [
        "cluster: node demo-worker-1 kept out: device check 4.1 GFLOP/s against the job's 36.2 (fail below 0.5); "
        "tried again every 10 s"
    ]
    assert run.restarts == 0 and run.incident is None  # nothing counted against --max-restarts
    back = "gate: passed after 40 s kept out: cpu 35.0 GFLOP/s, 3.1 GB/s copy against the job's cpu 36.2 GFLOP/s, 3.0 GB/s copy"
    assert run.observe("worker-1", back)
    assert capsys.readouterr().out == (
        "cluster: node demo-worker-1 passed its gate after 40 s kept out: cpu 35.0 GFLOP/s, 3.1 GB/s copy against "
        "the job's cpu 36.2 GFLOP/s, 3.0 GB/s copy; it joins at the next rendezvous round\n"
    )
    assert Filter().is_internal("gate: passed in 4.2 s: cpu 35.0 GFLOP/s, 3.1 GB/s copy against the job's ...")


@pytest.mark.parametrize(
    ("by_docker", "state", "calls", "slept"),
    [
        (True, "false false", [("inspect", "demo-worker-1"), ("start", "demo-worker-1")], []),  # docker kill: at once
        (False, "false false", [("inspect", "demo-worker-1"), ("start", "demo-worker-1")], [runner.POLICY_S]),
        (False, "false true", [("inspect", "demo-worker-1")], [runner.POLICY_S]),  # Docker's policy brought it back
    ],
)
def test_a_lost_node_is_started_at_once_when_docker_stopped_it_else_after_the_restart_policy(
    run, monkeypatch, by_docker, state, calls, slept
):
    done = []

    def docker(*args, **_):
        done.append((args[0], args[-1]))
        return subprocess.CompletedProcess(args, 0, state if args[0] == "inspect" else "", "")

    monkeypatch.setattr(runner, "_docker", docker)
    monkeypatch.setattr(runner.time, "sleep", lambda s: slept_now.append(s))
    slept_now: list[float] = []
    runner._restart_node(run, "demo-worker-1", 137, threading.Event(), by_docker)
    assert (done, slept_now) == (calls, slept) and run.restarts == 1 and not run.gone


# --- the command's log (logs/cluster.log): every node named alike, plain text, no empty lines


def test_the_log_names_every_node_by_its_container_and_holds_plain_lines_only(run, capsys):
    """compose logs prefixes a node by its service (``head-1``) or its container (``demo-worker-1``); the log names
    each as docker ps does, without terminal escape codes, and a line with nothing to say is not written (issue 25:
    ``head-1:`` beside ``ddp-cluster-worker-1:``, 60 ``\\x1b[K``, 24 bare ``: `` lines)."""
    for service, rest in [
        ("head-1", "2026-11-22T12:15:03.1Z train: epoch 1/2\x1b[K"),
        ("demo-worker-1", "2026-11-22T12:15:03.2Z \x1b[31mW1122 a warning\x1b[0m"),
        ("", ""),  # a blank line of compose logs
        ("head-1", "2026-11-22T12:15:03.3Z \x1b[K"),
    ]:
        runner._take_line(run, service, rest)
    assert run.log_file.read_text() == "demo-head-1: train: epoch 1/2\ndemo-worker-1: W1122 a warning\n"
    run.log("compose up: exit 0: \x1b[1mContainer demo-head-1\x1b[0m  Started\x1b[K\n\n")
    assert run.log_file.read_text().splitlines()[-1] == "compose up: exit 0: Container demo-head-1  Started"
