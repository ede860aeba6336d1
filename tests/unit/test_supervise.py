"""The cluster runner's account of failures (app/platform/supervise.py), from the lines the nodes print.

Docker is not asked: the containers' host names are given, and ``docker stop`` is recorded.
"""

import pytest

from app.platform import supervise
from app.platform.spec import build

CONTAINERS = {"head": "demo-head-1", "3f2a1b4c5d6e": "demo-worker-1", "0a0a0a0a0a0a": "demo-init-1"}
RESUMED = "train: resumed from step 23 (checkpoint /r/f/checkpoints/step-00000023.pt), 4 steps lost (the failed attempt reached step 27)"  # noqa: E501


@pytest.fixture
def run(tmp_path, monkeypatch):
    job = supervise.Run(build({"job": {"name": "demo"}}), tmp_path / "demo.env", tmp_path / "demo.log")
    monkeypatch.setattr(job, "_containers", lambda: CONTAINERS)
    job.docker_calls = []
    monkeypatch.setattr(supervise, "_docker", lambda *args, **_: job.docker_calls.append(args))
    return job


def test_one_line_per_restart_names_the_killed_rank_not_the_ranks_that_failed_after_it(run, capsys):
    head, worker = "demo-head-1", "worker-1"
    lines = [
        (head, "error: rank 0 on head: ranks 2-3 on 3f2a1b4c5d6e stopped answering: the gradient all-reduce ..."),
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
    run.failure(supervise.CONTAINER, "demo-worker-1 (ranks 2-3) stopped with signal 9 (SIGKILL)")
    run.observe("demo-head-1", "error: rank 0 on head: rank 3 on 3f2a1b4c5d6e stopped answering: x [exit 1; log /l]")
    run.observe("demo-head-1", RESUMED)
    assert capsys.readouterr().out.startswith(
        "cluster: restart 1: demo-worker-1 (ranks 2-3) stopped with signal 9 (SIGKILL); resumed from step 23"
    )
    run.observe("demo-head-1", "error: rank 0 on head: rank 3 on 3f2a1b4c5d6e stopped answering: y [exit 1; log /l]")
    run.observe("demo-head-1", RESUMED)
    assert capsys.readouterr().out.startswith("cluster: restart 2: rank 3 on demo-worker-1 stopped answering: y; ")


def test_a_full_disk_is_not_restarted(run, capsys):
    line = (
        "error: rank 0 on head: could not write checkpoint /results/f/checkpoints/step-00000030.pt (No space left on "
        "device): free some space or choose another --out; the earlier checkpoints are intact [exit 1; log /l]"
    )
    run.observe("demo-head-1", "error: rank 2 on 3f2a1b4c5d6e: rank 0 on head stopped answering: ... [exit 1; log /l]")
    run.observe("demo-head-1", line)
    run.observe("demo-head-1", "error: rank 0 on head: cannot resume in /results/f: ... (No space left on device) ...")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        line,
        "cluster: not restarted: every attempt would run out of disk the same way; free space in the volume "
        "demo_results, then run the job again: it resumes from its last checkpoint; the job was stopped",
    ]
    assert run.gave_up == 1 and run.docker_calls == [("stop", "--time", "10", "demo-head-1")]


def test_bad_input_is_not_restarted_and_a_worker_is_named_by_its_container(run, capsys):
    run.observe("worker-1", "error: rank 1 on 3f2a1b4c5d6e: --dataset 'nope' is not one of digits [exit 2]")
    run.observe("worker-1", "E1122 1 api.py:1] failed (exitcode: 2) local_rank: 0 (pid: 9) of binary: x")
    assert capsys.readouterr().err.splitlines() == [
        "error: rank 1 on demo-worker-1: --dataset 'nope' is not one of digits [exit 2]",
        "cluster: not restarted: bad input fails the same way on every attempt; the job was stopped",
    ]
    assert run.gave_up == 2


def test_at_the_end_a_failure_without_resume_is_told_by_the_ranks_own_lines(run, capsys):
    run.observe("demo-head-1", "error: rank 0 on head: rank 2 on 3f2a1b4c5d6e stopped answering: z [exit 1; log /l]")
    run.unresolved()
    assert capsys.readouterr().err.splitlines() == [
        "error: rank 0 on head: rank 2 on demo-worker-1 stopped answering: z [exit 1; log /l]"
    ]


def test_node_ranks_follow_c10d_order(run):
    assert run.node_ranks("demo-head-1") == [0, 1]
    assert run.node_ranks("demo-worker-1") == [2, 3]
    assert run.rank_name("worker-1", 1) == "rank 3 (local rank 1 on demo-worker-1)"
