# ruff: noqa: E501  (torchrun's own output lines, quoted whole)
"""The cluster runner: what happened to a job, read from its events file (``app.events``: the records that node
agents and ranks write), each failure (and each restart) as one line; the nodes' output goes to the log, never
read for a fault. The engine is not asked (the containers' host names are given), except by the watcher's own test."""

import argparse
import json
import os
import sys
import threading
import time
import types

import pytest

from app import events, evict, job_state
from app.errors import UsageError
from app.orchestrate import engine, job, runner, streams, supervise
from app.orchestrate.job import describe_status
from app.orchestrate.runner import describe_limits, removed
from app.topology import compose
from app.topology.spec import build


def test_statuses_read_as_exits_and_signals() -> None:
    assert describe_status(1) == "exit 1"
    assert describe_status(137) == "signal 9 (SIGKILL)"
    assert describe_status(-15) == "signal 15 (SIGTERM)"


# --- failures, restarts and their one line (Run.on_event); Docker is not asked (host names are container names)

RESUMED = "resumed from step 23 (checkpoint /r/f/checkpoints/step-00000023.pt), 4 steps lost (the failed attempt reached step 27)"


@pytest.fixture
def run(tmp_path, monkeypatch):
    state = job.Run(build({"job": {"name": "demo"}}), tmp_path, tmp_path / "demo.log")

    def asked(*_, **__):
        raise AssertionError("the engine was asked")

    monkeypatch.setattr(engine, "client", asked)
    return state


def happen(run, *records: tuple) -> None:
    """Write ``records`` (node, rank, kind, fields) to the job's events file as the nodes do, then let the runner
    read them (its last pass, as at the job's end)."""
    path = compose.events_file(run.folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    start = events.size(path)
    for node, rank, kind, fields in records:
        events.write(kind, rank, path, **fields)
        lines = path.read_text().splitlines()
        record = json.loads(lines[-1]) | {"node": node}  # the writer's host name: its container's
        path.write_text("\n".join([*lines[:-1], json.dumps(record)]) + "\n")
    stop = threading.Event()
    stop.set()
    supervise.read_events(run, stop, start)


def failed(node: str, rank: int, local_rank: int, code: int, message: str = "", attempt: int = 0) -> tuple:
    fields = {"local_rank": local_rank, "exitcode": code, "message": message, "attempt": attempt}
    return (node, rank, events.WORKER_FAILED, fields)


def error(node: str, rank: int | None, cause: str, status: int = 1, reason: str = "") -> tuple:
    who = f"rank {rank} on {node}: " if rank is not None else ""
    line = f"error: {who}{cause} [exit {status}; log /l]"
    return (node, rank, events.ERROR, {"line": line, "cause": cause, "status": status, "reason": reason})


def resumed() -> tuple:
    fields = {"from_step": 23, "checkpoint": "/r/f/checkpoints/step-00000023.pt", "reached": 27}
    return ("demo-head-1", 0, events.RESUMED, fields)


def test_one_line_per_restart_names_the_killed_rank_not_the_ranks_that_failed_after_it(run, capsys):
    happen(
        run,
        error(
            "demo-head-1",
            0,
            "ranks 2-3 on demo-worker-1 stopped answering: the gradient all-reduce ...",
            reason=events.PEERS_LOST,
        ),
        failed("demo-worker-1", 3, 1, -9),
        failed("demo-head-1", 0, 0, 1, "error: rank 0 on demo-head-1: ranks 2-3 ..."),
        failed("demo-head-1", 1, 1, -15),
    )
    assert capsys.readouterr().out == ""  # held back: the job may resume
    happen(run, resumed())
    assert capsys.readouterr().out.splitlines() == [
        f"cluster: restart 1: rank 3 (local rank 1 on demo-worker-1) ended with signal 9 (SIGKILL); {RESUMED}"
    ]
    assert run.incident is None and run.errors == [] and run.raised == {}


def test_a_container_that_stopped_is_the_cause_and_a_hang_report_names_containers(run, capsys):
    run.failure(job.CONTAINER, "demo-worker-1 (ranks 2-3) stopped with signal 9 (SIGKILL)")
    happen(
        run,
        error("demo-head-1", 0, "rank 3 on demo-worker-1 stopped answering: x", reason=events.PEERS_LOST),
        resumed(),
    )
    assert capsys.readouterr().out.startswith(
        "cluster: restart 1: demo-worker-1 (ranks 2-3) stopped with signal 9 (SIGKILL); resumed from step 23"
    )
    happen(
        run,
        error("demo-head-1", 0, "rank 3 on demo-worker-1 stopped answering: y", reason=events.PEERS_LOST),
        resumed(),
    )
    assert capsys.readouterr().out.startswith("cluster: restart 2: rank 3 on demo-worker-1 stopped answering: y; ")


def test_a_full_disk_is_not_restarted(run, capsys):
    full = error(
        "demo-head-1",
        0,
        "could not write checkpoint /results/f/checkpoints/step-00000030.pt (No space left on device): ...",
        reason=events.NO_SPACE,
    )
    happen(
        run,
        error("demo-worker-1", 2, "rank 0 on demo-head-1 stopped answering: ...", reason=events.PEERS_LOST),
        full,
        error("demo-head-1", 0, "cannot resume in /results/f: ...", reason=events.NO_SPACE),
    )
    assert capsys.readouterr().err.splitlines() == [
        full[3]["line"]
    ]  # at once; why it was not restarted: the final line
    assert run.gave_up.status == 1 and run.ended.is_set() and run.status == 1  # the runner stops every container
    assert job.failure_line(run, 143) == (
        "not restarted: every attempt would run out of disk the same way; free space in the volume demo_results, "
        "then run the job again: it resumes from its last checkpoint; the job was stopped"
    )


def test_a_batch_the_ranks_left_cannot_keep_is_the_final_lines_cause_not_the_node_loss(run, capsys):
    """Issue 36, item 2: a node lost, then the survivors cannot keep the global batch; the job ends, and its last
    line names the batch (the rank's line at once), not the node whose loss brought the job to this world."""
    cause = "cannot keep the global batch 192 on 2 ranks of per-rank batch 64 (192 is not a multiple of 128): ..."
    kept = error("demo-head-1", 0, cause, reason=events.BATCH_NOT_KEPT)
    run.failure(job.CONTAINER, "demo-worker-1 stopped with signal 9 (SIGKILL)")
    happen(run, error("demo-worker-1", 2, "rank 0 on demo-head-1 stopped answering: ...", reason=events.PEERS_LOST),
           kept)  # fmt: skip
    assert capsys.readouterr().err.splitlines() == [kept[3]["line"]]
    assert run.ended.is_set() and run.status == 1
    assert job.failure_line(run, 1).startswith(
        "not restarted: the job's global batch cannot be kept on the ranks of this attempt (the line above)"
    )


def test_bad_input_is_not_restarted_and_a_worker_is_named_by_its_container(run, capsys):
    bad = error("demo-worker-1", 1, "--dataset 'nope' is not one of digits", status=2)
    happen(run, bad, failed("demo-worker-1", 1, 0, 2, bad[3]["line"]))
    assert capsys.readouterr().err.splitlines() == [bad[3]["line"]]
    assert run.gave_up == job.Stopped("bad input fails the same way on every attempt", 2)


def test_an_agent_that_gave_up_on_bad_input_stops_the_job_with_status_2(run):
    happen(run, ("demo-head-1", 0, events.GAVE_UP, {"reason": events.BAD_INPUT, "message": "", "attempts": 1}))
    assert run.gave_up == job.Stopped("bad input fails the same way on every attempt", 2) and run.status == 2


def test_at_the_end_a_failure_without_resume_is_told_by_the_ranks_own_lines(run, capsys):
    said = error("demo-head-1", 0, "rank 2 on demo-worker-1 stopped answering: z", reason=events.PEERS_LOST)
    happen(run, said)
    run.unresolved()
    assert capsys.readouterr().err.splitlines() == [said[3]["line"]]


def test_a_ranks_log_in_the_results_volume_is_named_by_its_copy_on_the_host(run, capsys):
    """make cluster-check's ranks log under /results (--log-dir), which is copied to --results: the line the user
    reads names the copy, not a file inside a container that is gone."""
    line = "error: rank 0 on demo-head-1: device health: slow node [exit 1; log /results/logs/check-rank0.log]"
    happen(run, ("demo-head-1", 0, events.ERROR, {"line": line, "cause": "device health: slow node", "status": 1}))
    run.unresolved()
    assert capsys.readouterr().err.splitlines() == [line.replace("/results/", f"{runner.RESULTS_DIR}/")]


def _tree(root, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _files(root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_copied_results_hold_each_run_as_the_job_left_it_and_keep_what_the_volume_never_held(
    run, tmp_path, monkeypatch, capsys
):
    """The volume's run x pruned step 5 (--keep-checkpoints 2) and removed its emergency snapshot since the last
    copy: the host's x loses them too; make comm's local file and an older cluster's run y stay; nothing else."""
    run.results = tmp_path / "results"
    _tree(run.results, {"x/progress": "12", "x/checkpoints/step-00000005.pt": "5", "x/checkpoints/emergency.pt": "7",
                        "x/logs/train-rank1.log": "old", "y/summary.json": "{}", "comm/local.json": "local"})  # fmt: skip
    volume = {"x/progress": "16", "x/checkpoints/step-00000010.pt": "10", "x/checkpoints/step-00000016.pt": "16",
              "x/summary.json": "{}", "x/logs/train-rank0.log": "new", "comm/cluster.json": "cluster"}  # fmt: skip

    def copy_out(name, folder, into):
        assert (name, folder) == ("demo-head-1", "/results")
        _tree(into, volume)
        return True

    monkeypatch.setattr(engine, "copy_out", copy_out)
    runner._collect(run, elapsed=60)
    assert _files(run.results) == {**volume, "y/summary.json": "{}", "comm/local.json": "local"}
    assert [p.name for p in run.results.iterdir() if p.name.startswith(".")] == []  # no staging folder left
    assert f"cluster: results in {run.results} " in capsys.readouterr().out


def test_a_copy_that_fails_leaves_the_results_as_they_were(run, tmp_path, monkeypatch, capsys):
    run.results = tmp_path / "results"
    _tree(run.results, {"x/progress": "12", "x/checkpoints/step-00000005.pt": "5"})
    monkeypatch.setattr(engine, "copy_out", lambda name, folder, into: _tree(into, {"x/progress": "1"}) or False)
    runner._collect(run, elapsed=60)
    assert _files(run.results) == {"x/progress": "12", "x/checkpoints/step-00000005.pt": "5"}
    assert "cluster: the results were not copied to " in capsys.readouterr().out


def test_node_ranks_follow_c10d_order(run):
    assert run.node_ranks("demo-head-1") == [0, 1]
    assert run.node_ranks("demo-worker-1") == [2, 3]


def test_the_final_line_names_the_rank_and_node_that_raised(run):
    happen(run, failed("demo-head-1", 1, 1, 1, "RuntimeError: boom"), failed("demo-head-1", 0, 0, -15))
    assert job.failure_line(run, 1) == "rank 1 on demo-head-1: RuntimeError: boom"


def ended(node: str, rank: int, code: int, at: float) -> tuple:
    return (node, rank, events.RANK_ENDED, {"exitcode": code, "time": at})


def test_the_cause_is_the_rank_that_ended_first_not_the_first_agent_to_see_its_own(run, capsys):
    """Rank 1 exits with 3; rank 0 loses it and raises. The head's agent looked first and wrote first; the ranks'
    own ends say rank 1 ended first: the line names it, and the final line is not rank 0's lost connection."""
    happen(
        run,
        ended("demo-worker-1", 1, 3, 1_800_000_000.0),
        ended("demo-head-1", 0, 1, 1_800_000_000.004),  # 4 ms later: its peer's connection closed
        failed("demo-head-1", 0, 0, 1, "RuntimeError: Connection closed by peer"),
        failed("demo-worker-1", 1, 0, 3),
    )
    run.unresolved()
    assert capsys.readouterr().err.splitlines() == [
        "cluster: the job did not resume: rank 1 (local rank 0 on demo-worker-1) ended with exit 3"
    ]
    assert job.failure_line(run, 1) == "the job failed: demo-head-1 (rank 0's node) ended with exit 1; see above"


def test_without_the_ranks_own_ends_the_first_record_read_is_the_cause(run, capsys):
    """torchrun's own launch (--no-fork, a program): no rank tells its end; the agents' records, in their order."""
    happen(run, failed("demo-head-1", 0, 0, 1, "RuntimeError: boom"), failed("demo-worker-1", 1, 0, 3))
    assert run.incident.cause == "rank 0 (local rank 0 on demo-head-1) ended with exit 1"
    assert job.failure_line(run, 1) == "rank 0 on demo-head-1: RuntimeError: boom"


def test_a_failure_that_repeats_ends_the_job_with_a_line_that_says_so(run, capsys):
    happen(run, failed("demo-head-1", 1, 1, 1, "RuntimeError: boom"))
    assert run.gave_up is None  # once may be chance
    gave_up = {"reason": events.REPEATED, "message": "RuntimeError: boom", "attempts": 2}
    happen(run, failed("demo-head-1", 1, 1, 1, "RuntimeError: boom", 1), ("demo-head-1", 1, events.GAVE_UP, gave_up))
    assert run.ended.is_set() and run.status == 1
    assert job.failure_line(run, 143) == (
        "not restarted: rank 1 on demo-head-1 failed the same way on attempts 1 and 2 (RuntimeError: boom): a "
        "restart cannot cure it; fix the script, then run the job again; the job was stopped"
    )


# torch's output of one fault, as torch 2.13 words it and reworded (another glog prefix, another banner, other words):
# it goes to the log; what the runner concludes comes from the events alone.
TORCH_213 = """\
[rank1]: Traceback (most recent call last):
[rank1]: RuntimeError: boom
E1122 11:25:09.788000 7 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 1 (pid: 40) of binary: /opt/venv/bin/python3.11
[W1126 06:00:01.123456 TCPStore.cpp:138] [c10d] recvValueWithTimeout failed on SocketImpl(fd=3)
frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x98 (0x7f in libc10.so)
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
-m app FAILED
Root Cause (first observed failure):
  exitcode  : 1 (pid: 40)
"""
TORCH_REWORDED = """\
{rank=1} Exception in worker:
{rank=1} RuntimeError: boom
2026-11-22T11:25:09Z ERROR elastic/api.py:99 worker process 40 (local rank 1) exited, status=1
<W 06:00:01 TCPStore.cpp:200> c10d: receive timed out
  #0 c10::Error::Error() in libc10.so
torch.distributed.elastic.WorkerFailure
************************************************************
app: 1 worker failed
first failure: local rank 1, exit 1
"""


@pytest.mark.parametrize("output", [TORCH_213, TORCH_REWORDED])
def test_torch_output_in_any_wording_goes_to_the_log_and_changes_nothing_the_runner_concludes(
    run, monkeypatch, capsys, output
):
    said = {"demo-head-1": [f"2026-11-22T11:25:09.000Z {line}" for line in output.splitlines()]}
    monkeypatch.setattr(engine, "lines", lambda name, *_, **__: iter(said.get(name, [])))  # the engine's log stream
    stop = threading.Event()
    stop.set()
    streams.follow(run, stop, 0.0)
    happen(run, failed("demo-head-1", 1, 1, 1, "RuntimeError: boom"), failed("demo-head-1", 0, 0, -15))
    assert capsys.readouterr() == ("", "")  # nothing of it on the terminal
    assert output.splitlines()[-1] in run.log_file.read_text()  # all of it in the log
    assert run.incident.cause == "rank 1 (local rank 1 on demo-head-1) ended with exit 1"
    assert job.failure_line(run, 1) == "rank 1 on demo-head-1: RuntimeError: boom"


def test_the_events_file_is_read_by_whole_lines_and_a_stray_line_is_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    events.write(events.GATE, None, path, verdict=events.PASSED, detail="d")
    with open(path, "a") as handle:
        handle.write('not json\n{"kind": "gate", "ver')  # a line being written
    records, offset = events.read(path)
    assert [r["verdict"] for r in records] == [events.PASSED] and offset == len(path.read_bytes()) - len(
        '{"kind": "gate", "ver'
    )
    assert events.read(path, offset) == ([], offset)
    assert events.read(tmp_path / "none.jsonl", 0) == ([], 0)


def test_a_limit_left_on_a_node_container_is_described_and_the_down_line_says_what_went():
    assert describe_limits(500_000_000, 0, 0, 0) == "0.5 CPUs"
    assert describe_limits(0, 150_000, 100_000, 512 * 2**20) == "1.5 CPUs, 512 MiB of memory"
    assert describe_limits(0, -1, 0, 0) == ""
    assert removed(
        [("container", "d-head-1"), ("network", "d_cluster"), ("container", "d-rendezvous-1"), ("volume", "d_results")]
    ) == ("removed 2 containers (d-head-1, d-rendezvous-1), 1 network (d_cluster), 1 volume (d_results)")
    assert removed([]) == "nothing to remove (no container, network or volume)"


def test_a_node_that_runs_under_a_limit_is_one_line(run, monkeypatch, capsys):
    limits = {"demo-head-1": {"NanoCpus": 0, "Memory": 2**30}, "demo-worker-1": {"NanoCpus": 500_000_000, "Memory": 0}}
    monkeypatch.setattr(engine, "inspect", lambda name: {"HostConfig": limits[name]})
    runner._limits(run)
    assert capsys.readouterr().out.splitlines() == [
        "cluster: demo-head-1 runs under a limit: 1024 MiB of memory; it slows the job (it was set on the container, "
        "which jobs reuse): python -m app cluster down --name demo removes it",
        "cluster: demo-worker-1 runs under a limit: 0.5 CPUs; it slows the job (it was set on the container, which "
        "jobs reuse): python -m app cluster down --name demo removes it",
    ]


def test_hints_name_the_cluster_as_the_user_started_it(run):
    """make's targets (--make) or the app's own command; a cluster of another name by its name (issue 36, item 5:
    `remove: make cluster-down` for CLUSTER=x would have removed the default cluster)."""
    assert runner.hint("ddp-cluster", "down", make=True) == "make cluster-down"
    assert runner.hint("x", "down", make=True) == "make cluster-down CLUSTER=x"
    assert runner.hint("ddp-cluster", "logs", make=False) == "python -m app cluster logs"
    assert runner.hint("x", "down", make=False) == "python -m app cluster down --name x"
    assert job.failure_line(run, 124).endswith("see python -m app cluster logs --name demo, then python -m app cluster "
                                              "down --name demo")  # fmt: skip
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)
    args = parser.parse_args(["up", "--make", "--name", "x", "--state-dir", str(run.folder)])
    made = runner._prepare(argparse.Namespace(**vars(args), verbose=False))
    assert made.hint("down") == "make cluster-down CLUSTER=x"


def test_down_and_logs_keep_the_files_that_up_rendered(run):
    """``cluster down --name x`` gives no shape: the nodes of x's ``up`` (3 here) stay in its compose files, so that
    down and logs see every one of them (before: re-rendered at the default 2, the third an orphan)."""
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)

    def prepare(*words: str) -> runner.Run:
        args = parser.parse_args([*words, "--name", "x", "--state-dir", str(run.folder)])
        return runner._prepare(argparse.Namespace(**vars(args), verbose=False))

    def services() -> set[str]:
        return set(json.loads((run.folder / "x" / "nodes.yaml").read_text())["services"])

    prepare("up", "--nodes", "3")
    three = services()
    for action in ("down", "logs"):
        prepare(action)
        assert services() == three, action
    prepare("up")
    assert services() < three  # up renders the shape it is given: 2 nodes


def _engine_answers() -> bool:
    try:
        engine.client().ping()
        return True
    except Exception:
        return False


@pytest.mark.skipif(not _engine_answers(), reason="needs a Docker engine that answers")
def test_the_node_watcher_ends_with_the_job(tmp_path):
    """The watcher blocks reading the engine's events (no container of this project dies): stop must end it."""
    state = job.Run(build({"job": {"name": f"nowatch-{os.getpid()}"}}), tmp_path / "x.env", tmp_path / "x.log")
    stop = threading.Event()
    watcher = threading.Thread(target=supervise.watch_nodes, args=(state, stop, time.time()), daemon=True)
    watcher.start()
    watcher.join(timeout=2)
    assert watcher.is_alive(), "the watcher did not wait for the engine's events"  # the negative control
    stop.set()  # what cluster up does when the job has ended
    watcher.join(timeout=20)
    assert not watcher.is_alive()


def _event(action: str, service: str, code: int | None = None) -> dict:
    """One event of the Engine API (``/events``) for a container of the project ``demo``."""
    attributes = {"com.docker.compose.service": service, "name": f"demo-{service}" + ("" if "-" in service else "-1")}
    return {
        "Action": action,
        "Actor": {"Attributes": attributes | ({"exitCode": str(code)} if code is not None else {})},
    }


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
    monkeypatch.setattr(engine, "container_events", lambda *_: iter([_event(*e) for e in events]))
    calls = []
    monkeypatch.setattr(
        supervise, "_restart_node", lambda _run, name, code, _stop, by_docker: calls.append((name, by_docker))
    )
    supervise.watch_nodes(run, threading.Event(), 0.0)
    assert calls == restarted
    assert (run.status, run.ended_by) == ended if ended else not run.ended.is_set()
    if ended and ended[1] == "demo-rendezvous-1":
        assert job.failure_line(run, run.status) == (
            "the rendezvous store (demo-rendezvous-1) was lost: it stopped with signal 9 (SIGKILL); run the job again "
            "to resume from its last checkpoint"
        )


def test_a_node_kept_out_by_its_gate_is_one_line_and_no_restart(run, capsys):
    kept = {
        "verdict": events.KEPT_OUT,
        "detail": "device check 4.1 GFLOP/s against the job's 36.2 (fail below 0.5)",
        "retry_every": 10,
    }
    happen(run, ("demo-worker-1", None, events.GATE, kept))
    assert capsys.readouterr().out.splitlines() == [
        "cluster: node demo-worker-1 kept out: device check 4.1 GFLOP/s against the job's 36.2 (fail below 0.5); "
        "tried again every 10 s"
    ]
    assert run.restarts == 0 and run.incident is None  # nothing counted against --max-restarts
    figures = "cpu 35.0 GFLOP/s, 3.1 GB/s copy against the job's cpu 36.2 GFLOP/s, 3.0 GB/s copy"
    happen(run, ("demo-worker-1", None, events.GATE, {"verdict": events.PASSED_AFTER, "detail": figures, "waited": 40}))
    assert capsys.readouterr().out == (
        "cluster: node demo-worker-1 passed its gate after 40 s kept out: cpu 35.0 GFLOP/s, 3.1 GB/s copy against "
        "the job's cpu 36.2 GFLOP/s, 3.0 GB/s copy; it joins at the next rendezvous round\n"
    )
    happen(run, ("demo-head-1", None, events.GATE, {"verdict": events.PASSED, "detail": figures}))
    assert capsys.readouterr().out == ""  # a node let in at once: nothing to say


CUT_SHORT = (
    "the gradient all-reduce of step 124 failed (Connection closed by peer); rank 1 on demo-worker-1 stopped: "
    "their launcher ended them (SIGTERM); rank 0 kept step 123 in /r/f/checkpoints/emergency.pt"
)
REGROUP = ("demo-worker-1", None, events.REGROUP, {"why": "a node waits to join"})
LEFT_LINE = "node demo-worker-1 left the job (evicted at step 16's exchange); rank 0 kept step 16 in emergency.pt"


@pytest.mark.parametrize("agent_saw_it_fail", [False, True])
def test_a_node_that_joins_restarts_the_ranks_for_a_new_round_which_is_no_failure(run, capsys, agent_saw_it_fail):
    """A node passed its gate: the agents stop their ranks for the new round (SIGTERM), one before the other, so
    rank 0's all-reduce is cut short and it says so; its own agent may see it fail first. The world grows: no
    restart is counted or said."""
    seen = [failed("demo-head-1", 0, 0, 1, f"error: rank 0 on demo-head-1: {CUT_SHORT}")] if agent_saw_it_fail else []
    happen(run, REGROUP, failed("demo-worker-1", 1, 0, -15), error("demo-head-1", 0, CUT_SHORT,
           reason=events.PEERS_STOPPED), *seen)  # fmt: skip
    happen(run, resumed())
    assert capsys.readouterr().out.splitlines() == [f"cluster: {RESUMED}"]
    assert (
        run.resumed_as[job_state.RESTART] == 0
        and run.incident is None
        and run.since == []
        and run.stopped_ranks == set()
    )


def test_an_evicted_nodes_leaving_is_said_as_such_though_the_agents_regroup_without_it(run, capsys):
    """The ranks evict worker-1 at an exchange (rank 0's ``evicted`` record): its ranks leave (status LEFT), the
    others' next collective fails (status PEER_LEFT) and their agents regroup without it."""
    found = evict.Eviction("demo-worker-1", 4.0, 4, 7, 12.0, 2.0, 2.0, 1, 2, 64, 2)
    evicted = ("demo-head-1", 0, events.EVICTED, {"evicted": found.node, "step": 16, **found.fields()})
    happen(run, evicted, failed("demo-worker-1", 1, 0, evict.LEFT), error("demo-head-1", 0, LEFT_LINE, 5,
           reason=events.PEERS_LOST), failed("demo-head-1", 0, 0, evict.PEER_LEFT), REGROUP)  # fmt: skip
    happen(run, resumed())
    assert capsys.readouterr().out.splitlines() == [
        found.line(0),
        f"cluster: the job goes on without demo-worker-1: {RESUMED}",
    ]
    assert run.since == [] and run.resumed_as[job_state.RESTART] == 0


def test_ranks_stopped_by_their_launcher_without_a_node_joining_are_a_restart(run, capsys):
    happen(run, error("demo-head-1", 0, CUT_SHORT, reason=events.PEERS_STOPPED), failed("demo-worker-1", 1, 0, -15))
    happen(run, resumed())
    assert capsys.readouterr().out.splitlines() == [f"cluster: restart 1: {CUT_SHORT}; {RESUMED}"]


def test_a_failure_beside_a_node_joining_is_still_a_restart(run, capsys):
    happen(run, REGROUP, failed("demo-worker-1", 1, 0, -9), error("demo-head-1", 0, CUT_SHORT,
           reason=events.PEERS_STOPPED))  # fmt: skip
    happen(run, resumed())
    assert capsys.readouterr().out.splitlines() == [
        f"cluster: restart 1: rank 1 (local rank 0 on demo-worker-1) ended with signal 9 (SIGKILL); {RESUMED}"
    ]


@pytest.mark.parametrize(
    ("by_docker", "state", "calls", "slept"),
    [
        (True, "stopped", [("inspect", "demo-worker-1"), ("start", "demo-worker-1")], []),  # docker kill: at once
        (False, "stopped", [("inspect", "demo-worker-1"), ("start", "demo-worker-1")], [supervise.POLICY_S]),
        (False, "running", [("inspect", "demo-worker-1")], [supervise.POLICY_S]),  # Docker's policy brought it back
    ],
)
def test_a_lost_node_is_started_at_once_when_docker_stopped_it_else_after_the_restart_policy(
    run, monkeypatch, by_docker, state, calls, slept
):
    done = []

    def running(name: str) -> bool:
        done.append(("inspect", name))
        return state == "running"

    monkeypatch.setattr(engine, "running", running)
    monkeypatch.setattr(engine, "start", lambda name: done.append(("start", name)) or True)
    slept_now: list[float] = []

    class Stop(threading.Event):  # the job's stop event, which the supervisor waits on for Docker's policy
        def wait(self, timeout: float | None = None) -> bool:
            slept_now.append(timeout)
            return False

    supervise._restart_node(run, "demo-worker-1", 137, Stop(), by_docker)
    assert (done, slept_now) == (calls, slept) and run.restarts == 1 and not run.gone


def test_cluster_logs_prints_each_event_after_the_nodes_output(tmp_path):
    path = tmp_path / "events.jsonl"
    events.write(events.WORKER_FAILED, 3, path, local_rank=1, exitcode=-9, message="", attempt=0)
    [record], _ = events.read(path)
    line = runner.describe_event(record | {"node": "demo-worker-1"})
    assert line.startswith("events | ") and line.endswith(
        'demo-worker-1 rank 3: worker_failed local_rank=1 exitcode=-9 message="" attempt=0'
    )


# --- the command's log (logs/cluster.log): every node named alike, plain text, no empty lines


def test_the_log_names_every_node_by_its_container_and_holds_plain_lines_only(run, monkeypatch, capsys):
    """Each node's output is read from its container and named by it, without terminal escape codes, and a line with
    nothing to say is not written (issue 25: ``head-1:`` beside ``ddp-cluster-worker-1:``, 60 ``\\x1b[K``, 24 bare
    ``: `` lines); a line read again when a stream starts again is written once."""
    said = {
        "demo-head-1": ["2026-11-22T12:15:03.1Z train: epoch 1/2\x1b[K", "2026-11-22T12:15:03.3Z \x1b[K"],
        "demo-worker-1": ["2026-11-22T12:15:03.2Z \x1b[31mW1122 a warning\x1b[0m", "2026-11-22T12:15:03.4Z "],
    }
    asked: list[tuple[str, bool]] = []

    def lines(name: str, since: float, stop, follow: bool, stderr: bool = False):
        asked.append((name, stderr))
        if follow:
            stop.set()  # the job ends while it is followed: one last pass reads it all again
        return iter(said.get(name, []))

    monkeypatch.setattr(engine, "lines", lines)
    streams.follow(run, threading.Event(), 0.0)
    logged = sorted(run.log_file.read_text().splitlines())
    assert logged == ["demo-head-1: train: epoch 1/2", "demo-worker-1: W1122 a warning"], logged
    assert {name for name, _ in asked} == {"demo-head-1", "demo-worker-1"} and all(err for _, err in asked)
    run.log("compose up: exit 0: \x1b[1mContainer demo-head-1\x1b[0m  Started\x1b[K\n\n")
    assert run.log_file.read_text().splitlines()[-1] == "compose up: exit 0: Container demo-head-1  Started"


def test_a_missing_sdk_or_engine_is_one_line_that_names_the_fix(monkeypatch):
    missing = (
        r"^the Docker SDK for Python is missing \(the \[cluster\] extra\): \S+ -m pip install 'ddp-cluster\[cluster\]'$"
    )
    asks = (engine.client, lambda: engine.has_image("x"), lambda: engine.inspect("x"), lambda: engine.start("x"))
    for stand_in in (None, types.ModuleType("docker")):  # no SDK: import fails, or finds the repository's docker/
        with monkeypatch.context() as without:
            without.setitem(sys.modules, "docker", stand_in)
            for ask in asks:  # (those that catch the engine's errors caught the SDK's import error instead)
                with pytest.raises(UsageError, match=missing):
                    ask()
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:1")  # nothing listens there
    with pytest.raises(UsageError, match=r"^the Docker engine does not answer \(Connection refused\): start it with `"):
        engine.project_objects("demo")


def test_a_stream_that_follows_ends_with_the_job():
    """A container's log stream blocks until its next line; once the job is over the reader closes it (a blocked
    read then ends), so that no reader outlives the job."""
    closed = threading.Event()

    class Stream:  # the SDK's log stream: one line, then nothing until it is closed
        def __iter__(self):
            yield b"2026-11-28T10:00:00.1Z first\n"
            closed.wait(60)

        def close(self) -> None:
            closed.set()

    stop = threading.Event()
    lines = engine._split(engine._closed_by(stop, Stream()))
    assert next(lines) == "2026-11-28T10:00:00.1Z first"
    threading.Timer(0.5, stop.set).start()
    assert list(lines) == []
    assert closed.is_set()  # the reader closed it (without, the read ends by itself after 60 s, still open)


def test_each_gate_verdict_of_the_streamed_head_is_one_line_the_runners_naming_the_node(run, monkeypatch, capsys):
    """The head's own output is printed, but its gate's kept-out and passed-after lines are said by the runner (from
    the gate's events, naming the node), not twice; the gate's other lines (its start figures, a pass at once) stay."""
    said = ["gate: demo-head-1 at the job's start: cpu 80.0 GFLOP/s, 3.0 GB/s copy; recorded in /results/gate/h.json",
            "gate: kept out: device check 20.0 GFLOP/s against the job's 80.0 (fail below 0.5); tried again every 10 s",
            "gate: still kept out, now by: transfer check: 1 MiB to rendezvous:29400 and back: failed (reset)",
            "gate: passed after 20 s kept out: cpu 79.0 GFLOP/s, 3.0 GB/s copy against the job's cpu 80.0 GFLOP/s",
            "train: epoch 1/2 ..."]  # fmt: skip
    monkeypatch.setattr(type(run), "main_container", property(lambda _: "demo-head-1"))
    monkeypatch.setattr(engine, "lines", lambda *_, **__: iter(f"2026-11-28T10:00:00.1Z {line}" for line in said))
    stop = threading.Event()
    stop.set()
    streams.stream(run, stop, 0.0)
    kept, still, back = ({"verdict": v, "detail": d} for v, d in [
        (events.KEPT_OUT, said[1].removeprefix("gate: kept out: ").partition(";")[0]),
        (events.KEPT_OUT, said[2].removeprefix("gate: still kept out, now by: ")),
        (events.PASSED_AFTER, said[3].partition(": ")[2].partition(": ")[2])])  # fmt: skip
    happen(
        run,
        *(
            ("demo-head-1", None, events.GATE, fields | {"retry_every": 10, "waited": 20})
            for fields in (kept, still, back)
        ),
    )
    assert capsys.readouterr().out.splitlines() == [
        said[0],
        said[4],
        "cluster: node demo-head-1 kept out: device check 20.0 GFLOP/s against the job's 80.0 (fail below 0.5); tried again every 10 s",
        "cluster: node demo-head-1 kept out: transfer check: 1 MiB to rendezvous:29400 and back: failed (reset); tried again every 10 s",
        "cluster: node demo-head-1 passed its gate after 20 s kept out: cpu 79.0 GFLOP/s, 3.0 GB/s copy against the job's cpu 80.0 GFLOP/s; it joins at the next rendezvous round",
    ]


def test_the_runner_says_the_ranks_eviction_and_decides_nothing_itself(tmp_path, capsys):
    """An elastic job's exchanges (3 nodes x 1 rank, worker-2 busy 5x the others at every exchange) are no verdict of
    the runner's: the nodes' agents evict (the ranks' policy, app/node). The ``evicted`` record that rank 0 writes is
    said as the line the ranks decided, and the runner writes nothing and asks nothing of the engine."""
    spec = build({"job": {"name": "demo", "command": "train --accum-steps 2"}, "nodes": {"nodes": 3, "min_nodes": 2,
                  "nproc_per_node": 1}})  # fmt: skip
    state = job.Run(spec, tmp_path, tmp_path / "demo.log")
    hosts = ["demo-head-1", "demo-worker-1", "demo-worker-2"]
    watch = spec.nodes.eviction.watch()  # what every rank runs
    for at in range(evict.AFTER):
        record = {"time": float(at), "node": hosts[0], "rank": 0, "kind": events.EXCHANGE, "hosts": hosts,
                  "busy_ms": [10.0, 10.0, 50.0], "world_size": 3, "global_batch": 96, "accum_steps": 2}  # fmt: skip
        state.on_event(record)
        found = watch.feed(record)
    assert capsys.readouterr().out == "" and not compose.events_file(state.folder).exists()
    state.on_event({"time": 4.0, "node": hosts[0], "rank": 0, "kind": events.EVICTED, "evicted": found.node,
                    "step": 16, **found.fields()})  # fmt: skip
    said = capsys.readouterr().out.splitlines()
    assert said == [found.line(0)] and said[0].startswith("cluster: node demo-worker-2 evicted: busy 3.3x the others'")
