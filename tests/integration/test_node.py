"""``python -m app node``: the health gate, then torchrun's agent in the same process with every rank a
fork of one preloaded server; each test against real ranks on localhost (``--standalone``)."""

import base64
import contextlib
import datetime
import functools
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from bench import fault_job
from bench.gate_figures import LET_IN, set_figures

from app import events, progress
from app.node import agent
from app.runtime import network
from app.train.stop import STATUS
from tests.deps import need
from tests.integration.launchers import PYTHON, _clean_env, one_error_line
from tests.integration.train_runs import CHECKPOINTED, TIMEOUT, same_final_params, synthetic, uninterrupted

pytestmark = pytest.mark.integration

NODE_JOB = Path(__file__).with_name("node_job.py")
FAULT_JOB = Path(fault_job.__file__).resolve()
TWO_RANKS = ["--standalone", "--nproc-per-node", "2"]


def node_command(tmp_path: Path, words: list[str], *flags: str) -> list[str]:
    return [PYTHON, "-m", "app", "node", "--records", str(tmp_path / "gate"), "--device-seconds", "0.2", *flags,
            "--log-dir", str(tmp_path / "logs"), "--", *words]  # fmt: skip


def run_node(tmp_path: Path, words: list[str], *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = node_command(tmp_path, words, *flags)
    return subprocess.run(cmd, env=env or _clean_env(), capture_output=True, text=True, timeout=TIMEOUT, check=False)


def reports(done: subprocess.CompletedProcess) -> list[dict]:
    """The ranks' lines of node_job.py, by rank."""
    found = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return sorted(found, key=lambda r: r["rank"])


def without_omp() -> dict[str, str]:
    """The test environment without OMP_NUM_THREADS: torchrun's agent sets it (1) for a node of 2 ranks."""
    env = _clean_env()
    del env["OMP_NUM_THREADS"]
    return env


def test_each_rank_is_a_fork_of_the_preloaded_server_running_its_script_as_python_would(tmp_path: Path) -> None:
    done = run_node(tmp_path, [*TWO_RANKS, str(NODE_JOB), "a", "b"], env=without_omp())
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("gate: "), done.stdout  # the gate ran first (it recorded this node)
    ranks = reports(done)
    assert [r["rank"] for r in ranks] == [0, 1], done.stdout
    for rank in ranks:
        assert rank["preloaded"], rank  # torch._dynamo was there before the script imported anything
        assert "multiprocessing.forkserver" in rank["parent"], rank
        assert rank["argv"] == [str(NODE_JOB), "a", "b"], rank
        assert rank["title"] == f"python -u {NODE_JOB} a b [rank {rank['rank']}]", rank
        assert rank["threads"] == 1, rank  # torchrun's OMP_NUM_THREADS=1, although the server read none


def test_without_fork_each_rank_is_a_new_interpreter_as_under_torchrun(tmp_path: Path) -> None:
    """The control: --no-fork starts every rank as torchrun does, with nothing imported before the script."""
    done = run_node(tmp_path, [*TWO_RANKS, str(NODE_JOB), "a", "b"], "--no-fork")
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = reports(done)
    assert [r["rank"] for r in ranks] == [0, 1], done.stdout
    for rank in ranks:
        assert not rank["preloaded"], rank
        assert "app node" in rank["parent"] and "forkserver" not in rank["parent"], rank
        assert rank["title"].endswith(f"-u {NODE_JOB} a b"), rank


LINES_JOB = """
import io, os, sys
whole = isinstance(sys.stdout.buffer, io.BufferedWriter) and sys.stdout.line_buffering
for i in range(3000):
    print(f"rank {os.environ['RANK']} line {i} whole={whole}")
"""


def test_ranks_on_one_pipe_under_python_u_write_whole_lines(tmp_path: Path) -> None:
    """The image sets PYTHONUNBUFFERED: print() there writes a line's text and its newline apart, and two ranks'
    lines came out joined in the node's output (``rank 3 of 4 uprank 2 of 4 up``)."""
    job = tmp_path / "lines_job.py"
    job.write_text(LINES_JOB)
    done = run_node(tmp_path, [*TWO_RANKS, str(job)], env=_clean_env({"PYTHONUNBUFFERED": "1"}))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if "line" in line]
    joined = [line for line in lines if not re.fullmatch(r"rank [01] line \d+ whole=True", line)]
    assert not joined, joined[:5]
    assert len(lines) == 2 * 3000


@pytest.mark.parametrize("status", [0, 5])
def test_a_rank_that_leaves_with_os_exit_ends_with_that_status(tmp_path: Path, status: int) -> None:
    """``python -m app`` itself leaves with os._exit: a fork that vanished with status 0 would leave torch's agent
    waiting forever for its return value."""
    done = run_node(tmp_path, [*TWO_RANKS, str(NODE_JOB), "--os-exit", str(status)])
    assert done.returncode == (1 if status else 0), done.stderr[-3000:]
    if status:
        assert f"exitcode  : {status}" in done.stderr, done.stderr[-3000:]  # torchrun's report of the rank
    else:
        assert [r["rank"] for r in reports(done)] == [0, 1], done.stdout


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run on hand-started ranks (a FileStore rendezvous): the final parameters to match."""
    return uninterrupted(tmp_path_factory.mktemp("reference"))


def test_a_training_job_under_app_node_ends_bit_for_bit_as_on_other_launchers(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "out"
    done = run_node(tmp_path, [*TWO_RANKS, "-m", "app", "train", *synthetic(out, *CHECKPOINTED)])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: 16 steps, 2 epochs" in done.stdout, done.stdout
    same_final_params(reference, out)


def test_a_rank_that_crashes_is_restarted_from_the_step_the_other_kept(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "out"
    worker = ["-m", "tests.integration.train_worker", "--crash-at-step", "7", "--crash-rank", "1"]
    words = [*TWO_RANKS, "--max-restarts", "1", "--monitor-interval", "0.5", *worker, *synthetic(out, *CHECKPOINTED)]
    done = run_node(tmp_path, [*words, "--resume", "auto"])
    assert done.returncode == 0, done.stderr[-3000:]
    snapshot = out / "checkpoints" / "emergency.pt"
    assert f"train: resumed from step 7 (checkpoint {snapshot}), no steps lost" in done.stdout, done.stdout[-3000:]
    assert "failed (exitcode: 17) local_rank: 1" in done.stderr, done.stderr[-3000:]  # torch's line (the runner's)
    same_final_params(reference, out)


def this_machines_address() -> str:
    """This machine's address on its default route (not loopback), for a node that holds rank 0."""
    name = network.default_route_interface()
    found = network.interfaces().get(name or "", [])
    if not found:
        pytest.skip("this machine has no default route: two nodes need a non-loopback address for rank 0's")
    return found[0]


@contextmanager
def store_server() -> Iterator[int]:
    """A TCPStore server in a process of its own, as the compose cluster's rendezvous container: its port."""
    serve = (
        "import time, torch.distributed as d; s = d.TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)"
    )
    proc = subprocess.Popen([PYTHON, "-c", f"{serve}; print(s.port, flush=True); time.sleep(3600)"],
                            stdout=subprocess.PIPE, text=True, env=_clean_env())  # fmt: skip
    try:
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def test_the_node_of_rank_0_lost_its_survivors_keep_the_step_in_the_rendezvous_store(
    tmp_path: Path, reference: Path
) -> None:
    """The head container killed: rank 0's store (ddp-node's setting: a store per round, in rank 0) goes with its
    node. Two nodes of one rank each and a c10d store of its own (the compose cluster's rendezvous container):
    rank 0 stops after step 7, its whole node is killed; rank 1 holds the roll call in the rendezvous store,
    keeps step 7, and the node started again (as the runner does) resumes from it: no step lost, bit for bit."""
    out, marker, snapshot = tmp_path / "out", tmp_path / "fault.json", tmp_path / "out" / "checkpoints" / "emergency.pt"
    hooks = [str(FAULT_JOB), "--marker", str(marker), "--fault-at-step", "7", "--fault-rank", "0", "--stall", "--"]
    job = [*hooks, *synthetic(out, *CHECKPOINTED, "--resume", "auto")]
    # app node sets a store per round, in rank 0 (envvars.STORE_PER_ROUND); gloo on loopback: one machine.
    env = _clean_env({"GLOO_SOCKET_IFNAME": "lo"})
    head_address = this_machines_address()  # rank 0's node: an address the other node does not take for itself

    def start(port: int, addr: str, name: str) -> subprocess.Popen:
        c10d = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=t", "--max-restarts=1", "--monitor-interval=0.5", f"--local-addr={addr}"]  # fmt: skip
        cmd = node_command(tmp_path / name, [*c10d, *job])  # c10d orders the nodes by address: the head's is first
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip

    with store_server() as port:
        head, worker = start(port, head_address, "head"), start(port, "worker.invalid", "worker")
        try:
            deadline = time.monotonic() + TIMEOUT
            while not marker.exists() and time.monotonic() < deadline:
                assert head.poll() is None and worker.poll() is None, worker.communicate()[1][-3000:]
                time.sleep(0.1)
            os.killpg(head.pid, signal.SIGKILL)  # the node: its agent, fork server and rank (and rank 0's store)
            head.wait()
            head = start(port, head_address, "head-again")
            said = {name: proc.communicate(timeout=TIMEOUT) for name, proc in (("worker", worker), ("head", head))}
        finally:
            for proc in (head, worker):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
    assert (worker.returncode, head.returncode) == (0, 0), said
    lost = [line for line in said["worker"][1].splitlines() if "rank 0 on " in line and "stopped answering" in line]
    assert lost and f"; rank 1 kept step 7 in {snapshot} [exit 1;" in lost[0], said["worker"][1][-3000:]
    assert "1 of 2 ranks answer in the rendezvous store (rank 0's is gone)" in lost[0], lost[0]
    assert f"train: resumed from step 7 (checkpoint {snapshot}), no steps lost" in said["head"][0], said["head"]
    took_over = agent.TOOK_OVER.partition("{node}")[0] + head_address + "_"  # its new agent: a new pid, its place
    assert took_over in said["head"][0], said["head"][0][-3000:]
    same_final_params(reference, out)


def test_an_elastic_job_starts_with_a_node_that_comes_seconds_after_the_first(tmp_path: Path) -> None:
    """--nnodes 1:2 with a 2 s last call (ddp-cluster's rendering): the second node starts 6 s after the first, as
    on a loaded machine. The first round waits for it (half the join timeout), so the job starts on both nodes:
    started on the first alone, it would have ended there before the second came."""
    env = _clean_env({"GLOO_SOCKET_IFNAME": "lo"})

    def start(port: int, addr: str, name: str) -> subprocess.Popen:
        c10d = [
            "--nnodes=1:2",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=late",
            "--rdzv-conf=last_call_timeout=2,join_timeout=60",
            f"--local-addr={addr}",
        ]
        cmd = node_command(tmp_path / name, [*c10d, str(NODE_JOB)])
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    with store_server() as port:
        first = start(port, this_machines_address(), "first")
        time.sleep(6)
        second = start(port, "second.invalid", "second")
        said = [proc.communicate(timeout=TIMEOUT) for proc in (first, second)]
    assert (first.returncode, second.returncode) == (0, 0), said
    ranks = [json.loads(line) for out, _ in said for line in out.splitlines() if line.startswith("{")]
    assert sorted((r["rank"], r["world"]) for r in ranks) == [(0, 2), (1, 2)], said


@pytest.mark.parametrize(("nnodes", "world"), [("1:3", "ok"), ("1", "failed")])
def test_a_node_alone_in_an_elastic_round_under_slurm_is_no_world_of_one(tmp_path: Path, nnodes: str, world: str):
    """Slurm's step names 3 nodes; two died and the survivor's agent (--nnodes 1:3) formed a round of its node alone,
    as an elastic rendezvous may: its rank trains on (issue 36, where the doctor failed it at every restart and the
    job ended). The control: an agent of a job of one node (--nnodes 1) in that allocation is a world of one."""
    report = tmp_path / "doctor.json"
    words = ["--standalone", f"--nnodes={nnodes}", "--nproc-per-node=1"]
    words.append("--rdzv-conf=join_timeout=4,last_call_timeout=1")  # the first round waits 2 s for more nodes
    slurm = _clean_env({"SLURM_STEP_NUM_NODES": "3", "SLURM_JOB_NUM_NODES": "1"})
    done = run_node(tmp_path, [*words, "-m", "app", "doctor", "--json", str(report)], env=slurm)
    assert done.returncode == (0 if world == "ok" else 1), done.stderr[-3000:]
    [found] = [c for c in json.loads(report.read_text())["checks"] if c["check"] == "world"]
    assert found["status"] == world, found
    if world == "ok":
        assert "a round of an elastic job of 1 to 3 nodes (SLURM_STEP_NUM_NODES=3)" in found["detail"], found


def rendezvous_state(port: int, run_id: str) -> Any:
    """The c10d rendezvous state of ``run_id`` as every node's agent reads it from the store at ``port`` (torch's
    C10dRendezvousBackend: the pickled state, base64); None before the first node wrote it."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
    key = f"torch.rendezvous.{run_id}"
    if not store.check([key]):
        return None
    try:
        return pickle.loads(base64.b64decode(store.get(key)))
    except (ValueError, pickle.UnpicklingError):  # the backend's empty sentinel
        return None


def wait_for(what: str, ready: Callable[[], bool], procs: list[subprocess.Popen], timeout: float = TIMEOUT) -> None:
    """Poll ``ready`` until it holds, while every process of ``procs`` runs."""
    deadline = time.monotonic() + timeout
    while not ready():
        for proc in procs:
            assert proc.poll() is None, f"waiting for {what}: {proc.args} ended: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.2)


def test_a_node_dropped_from_the_round_it_completed_joins_the_next_with_the_others(tmp_path: Path) -> None:
    """A node that stops answering for longer than the heartbeats allow while its first round completes (a
    container starved on a loaded machine) is dropped from that round by the others: it held rank 0, which gives
    every node the round's address, and now never does. The node left waiting joins the next round with it, and
    the job runs on both (before: it failed the job, `DistStoreError: wait timeout ... MASTER_ADDR`, a make test
    run's red). The stall is the test's: SIGSTOP while the round completes, SIGCONT once the store shows the drop."""
    env = _clean_env({"GLOO_SOCKET_IFNAME": "lo"})
    # Heartbeats every 1 s, 20 missed drop a node: time for the second node to start and complete the round
    # while the first is stopped; the store's reads give up after 20 s.
    conf = "--rdzv-conf=join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=20,read_timeout=20"

    def start(port: int, addr: str, name: str) -> subprocess.Popen:
        c10d = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=stall", conf, f"--local-addr={addr}"]  # fmt: skip
        cmd = node_command(tmp_path / name, [*c10d, str(NODE_JOB)])
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip

    head_address = this_machines_address()  # the first address in c10d's order: rank 0
    with store_server() as port:
        head = start(port, head_address, "head")
        procs = [head]
        try:
            state = functools.partial(rendezvous_state, port, "stall")
            wait_for("the head in round 0", lambda: (s := state()) is not None and len(s.participants) == 1, procs)
            os.killpg(head.pid, signal.SIGSTOP)  # the head stalls: its agent, fork server, everything
            worker = start(port, "worker.invalid", "worker")
            procs.append(worker)
            wait_for("round 0 complete with both", lambda: state().complete and len(state().participants) == 2,
                     [worker])  # fmt: skip
            wait_for("the stalled head dropped from round 0",
                     lambda: all(n.addr != head_address for n in state().participants), [worker])  # fmt: skip
            os.killpg(head.pid, signal.SIGCONT)
            said = {name: proc.communicate(timeout=TIMEOUT) for name, proc in (("head", head), ("worker", worker))}
        finally:
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
    assert (head.returncode, worker.returncode) == (0, 0), said
    ranks = [json.loads(line) for out, _ in said.values() for line in out.splitlines() if line.startswith("{")]
    assert sorted((r["rank"], r["world"]) for r in ranks) == [(0, 2), (1, 2)], said
    assert agent.NO_RANK_0 in said["worker"][0].splitlines(), said["worker"]  # the node that waited says why
    assert not [line for _, err in said.values() for line in err.splitlines() if line.startswith("error: ")], said


def test_a_node_dropped_from_the_round_its_ranks_train_in_regroups_with_them(tmp_path: Path, reference: Path) -> None:
    """A node whose agent stalls past the heartbeats' limit while its ranks train (a container starved on a loaded
    machine) is dropped from the round by the others; its ranks go on. Back, it stops them at a step they keep and
    joins the next round, which the others take as a node waiting to join: one job again, no step lost, the final
    parameters the uninterrupted run's (before: it trained on in a round that no longer counted it, and the next
    node to join opened a round of its own, a make test run's split job). The stall is the test's: SIGSTOP to the
    worker's agent alone (its ranks hold at step 3, in no collective) until the store shows the drop."""
    env = _clean_env({"GLOO_SOCKET_IFNAME": "lo"})
    conf = "--rdzv-conf=join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=3"  # dropped after 3 s
    out, go = tmp_path / "out", tmp_path / "go"
    job = [str(FAULT_JOB), "--hold-at-step", "3", "--hold-until", str(go), "--",
           *synthetic(out, *CHECKPOINTED, "--resume", "auto")]  # fmt: skip

    def start(port: int, addr: str, name: str) -> subprocess.Popen:
        c10d = ["--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=dropped", conf, f"--local-addr={addr}"]  # fmt: skip
        cmd = node_command(tmp_path / name, [*c10d, *job])
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip

    head_address = this_machines_address()  # rank 0
    with store_server() as port:
        procs = [start(port, head_address, "head"), start(port, "worker.invalid", "worker")]
        head, worker = procs
        try:
            state = functools.partial(rendezvous_state, port, "dropped")
            wait_for("both ranks held at step 3", lambda: progress.reached(out) == 3, procs)
            os.kill(worker.pid, signal.SIGSTOP)  # the worker's agent alone: its ranks hold on
            wait_for("the stalled worker dropped from round 0",
                     lambda: all(n.addr == head_address for n in state().participants), [head])  # fmt: skip
            os.kill(worker.pid, signal.SIGCONT)
            wait_for("the next round, complete with both",
                     lambda: (s := state()).round > 0 and s.complete and len(s.participants) == 2, procs)  # fmt: skip
            go.touch()  # (the resumed ranks are past step 3: a job that never regrouped would be held until now)
            said = {name: proc.communicate(timeout=TIMEOUT) for name, proc in (("head", head), ("worker", worker))}
        finally:
            go.touch()
            for proc in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                    os.killpg(proc.pid, signal.SIGKILL)
    assert (head.returncode, worker.returncode) == (0, 0), said
    assert agent.DROPPED in said["worker"][0].splitlines(), said["worker"]  # the node that was dropped says why
    assert not [line for _, err in said.values() for line in err.splitlines() if line.startswith("error: ")], said
    same_final_params(reference, out)


REGROUP_S = 300
"""A hung test's bound on the round after a regroup, not a measured window: the round completes in seconds once the
dead nodes' heartbeats expire (10 s), and torch's last call there would hold it 600 s (half the 1,200 s join
timeout)."""


def test_a_round_after_a_regroup_completes_once_its_nodes_are_in_not_at_its_last_call(tmp_path: Path) -> None:
    """--nnodes 1:3 on three nodes of one rank (the first round completes at once, whole). While the ranks hold at
    step 2, two workers' nodes are killed, and one of them is started again: a new agent, which waits to join. The
    head stops its ranks for it (a regroup) and joins the next round, which the job, short of 3 nodes for good,
    would have held for its last call (half the 1,200 s join timeout) waiting for a third node; it completes as soon
    as the head and the new worker are in, the dead workers taken for dead by their heartbeats (10 s). The verdict: that
    round complete within REGROUP_S, the regroup in the job's events, the job resumed from step 2 and ended."""
    events_file, out, go = tmp_path / "events.jsonl", tmp_path / "out", tmp_path / "go"
    env = _clean_env({"GLOO_SOCKET_IFNAME": "lo", "DDP_CLUSTER_EVENTS_FILE": str(events_file)})
    conf = "--rdzv-conf=join_timeout=1200,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=10"
    # Global batch 48 (3 ranks x 8 x accum 2; on 2 ranks, accum 3): 4 steps.
    train = ["--train-samples", "192", "--test-samples", "48", "--epochs", "1", "--batch-size", "8",
             "--accum-steps", "2", "--resume", "auto"]  # fmt: skip
    job = [str(FAULT_JOB), "--hold-at-step", "2", "--hold-until", str(go), "--", *synthetic(out, *train)]

    def start(port: int, addr: str, name: str) -> subprocess.Popen:
        c10d = ["--nnodes=1:3", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                "--rdzv-id=regroup", conf, "--monitor-interval=0.5", f"--local-addr={addr}"]  # fmt: skip
        cmd = node_command(tmp_path / name, [*c10d, *job])
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip

    head_address = this_machines_address()  # rank 0, whose round store outlives the workers
    with store_server() as port:
        state = functools.partial(rendezvous_state, port, "regroup")
        head = start(port, head_address, "head")
        workers = [start(port, f"worker-{i}.invalid", f"worker-{i}") for i in (1, 2)]
        procs = [head, *workers]
        try:
            wait_for("the three ranks held at step 2", lambda: progress.reached(out) == 2, procs)
            for worker in workers:
                os.killpg(worker.pid, signal.SIGKILL)  # the node: its agent, fork server and rank
                worker.communicate()
            again = start(port, "worker-1.invalid", "worker-1-again")  # a new agent: a node new to the rendezvous
            procs = [head, again]
            wait_for("the new worker waiting to join (or joined)",
                     lambda: bool((s := state()).wait_list) or s.round > 0, procs)  # fmt: skip
            wait_for("the round after the regroup, complete with the head and the new worker",
                     lambda: (s := state()).round > 0 and s.complete and len(s.participants) == 2, procs,
                     timeout=REGROUP_S)  # fmt: skip
            go.touch()  # (the resumed ranks are past step 2)
            said = {name: proc.communicate(timeout=TIMEOUT) for name, proc in (("head", head), ("again", again))}
        finally:
            go.touch()
            for proc in (head, *workers, *procs):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
    assert (head.returncode, again.returncode) == (0, 0), said
    records, _ = events.read(events_file)
    assert [r["why"] for r in records if r["kind"] == events.REGROUP] == ["a node waits to join"], records
    snapshot = out / "checkpoints" / "emergency.pt"
    assert f"train: resumed from step 2 (checkpoint {snapshot}), no steps lost" in said["head"][0], said["head"]


def test_an_exception_of_a_script_is_reported_as_torchrun_reports_it(tmp_path: Path) -> None:
    done = run_node(tmp_path, [*TWO_RANKS, str(NODE_JOB), "--raise-on-rank", "1", str(tmp_path)])
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback (most recent call last):" in done.stderr and "RuntimeError: boom on rank 1" in done.stderr
    assert "Root Cause (first observed failure):" in done.stderr  # torchrun's report, as torchrun prints it
    assert "exitcode  : 1" in done.stderr, done.stderr[-3000:]
    assert "error: " not in done.stderr and "app/cli.py" not in done.stderr, done.stderr[-3000:]
    assert [r["rank"] for r in reports(done)] == [0], done.stdout  # rank 0 ran to its end


def test_sigterm_to_the_node_stops_its_ranks_at_a_step_they_keep(tmp_path: Path, reference: Path) -> None:
    """docker stop, scancel, a pod deleted: the node's agent stops its ranks, rank 0 keeps the step they reached,
    the node exits 143 without a line of its own; run again, the job resumes from that step and ends exactly."""
    out = tmp_path / "out"
    slow = [str(FAULT_JOB), "--sleep-rank", "0", "--sleep-ms", "300", "--"]  # 0.3 s a step: time to stop it
    cmd = node_command(tmp_path, [*TWO_RANKS, *slow, *synthetic(out, *CHECKPOINTED, "--resume", "auto")])
    proc = subprocess.Popen(cmd, env=_clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + TIMEOUT
        while (progress.reached(out) or 0) < 3 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == STATUS, stderr[-3000:]
    kept = progress.reached(out)
    snapshot = out / "checkpoints" / "emergency.pt"
    assert f"train: stopped by SIGTERM after step {kept}; rank 0 kept step {kept} in {snapshot}" in stderr, stderr
    assert "error: " not in stderr and "Traceback" not in stderr, stderr[-3000:]
    set_figures(tmp_path / "gate", LET_IN)  # its gate judges the node again: it passes whatever the machine's load
    again = run_node(tmp_path, [*TWO_RANKS, "-m", "app", "train", *synthetic(out, *CHECKPOINTED, "--resume", "auto")])
    assert f"train: resumed from step {kept} (checkpoint {snapshot}), no steps lost" in again.stdout, again.stdout
    same_final_params(reference, out)


@pytest.mark.parametrize(
    ("words", "said"),
    [
        ([], "no job given: python -m app node -- TORCHRUN_ARGS -m app check (see --help)"),
        (["--nnodes", "0", "-m", "app", "check"], "torchrun's arguments: min_nodes must be > 0 and <= max_nodes"),
        (["--nnodes", "two", "-m", "app", "check"], "torchrun's arguments: --nnodes two: "),
        (["--bogus", "-m", "app", "check"], "torchrun's arguments: unrecognized arguments: --bogus"),
    ],
)
def test_bad_torchrun_arguments_are_one_line_and_exit_2_at_once(tmp_path: Path, words: list[str], said: str) -> None:
    done = run_node(tmp_path, words)
    assert done.returncode == 2, done.stderr[-3000:]
    line = one_error_line(done.stderr)
    assert line["cause"].startswith(said), line["cause"]
    assert not (tmp_path / "gate").exists()  # at once: refused before the gate measured or recorded anything


def test_a_node_the_gate_keeps_out_starts_no_rank_and_exits_3_with_one_line(tmp_path: Path) -> None:
    first = run_node(tmp_path, [*TWO_RANKS, str(NODE_JOB)])
    assert first.returncode == 0, first.stderr[-3000:]
    [record] = (tmp_path / "gate").glob("*.json")
    body = json.loads(record.read_text())
    body["devices"][0]["flops"] *= 1000  # a start no CPU reaches: this node is now far below it
    record.write_text(json.dumps(body))
    done = run_node(tmp_path, [*TWO_RANKS, str(NODE_JOB)])
    assert done.returncode == 3, done.stderr[-3000:]
    line = one_error_line(done.stderr)
    assert line["cause"].startswith(f"{record.stem} kept out: device check "), line["cause"]
    assert reports(done) == []  # no rank started


def test_a_failure_that_repeats_stops_the_restarts_after_the_second_attempt_and_the_events_say_so(
    tmp_path: Path,
) -> None:
    """A script that raises on rank 1 at every attempt: two attempts of the 4 that --max-restarts 3 allows; the
    job's events file holds each attempt's failure (the exception, from torchelastic's error file) and why the
    agent gave up."""
    events_file = tmp_path / "events.jsonl"
    env = _clean_env() | {"DDP_CLUSTER_EVENTS_FILE": str(events_file)}
    words = [*TWO_RANKS, "--max-restarts", "3", str(NODE_JOB), "--raise-on-rank", "1", str(tmp_path)]
    done = run_node(tmp_path, words, env=env)
    assert done.returncode == 1, done.stderr[-3000:]
    records, _ = events.read(events_file)
    failed = [
        r for r in records if r["kind"] == events.WORKER_FAILED and r["exitcode"] != -15
    ]  # (-15: the agent stopped it)
    assert [(r["rank"], r["exitcode"], r["attempt"]) for r in failed] == [(1, 1, 0), (1, 1, 1)], records
    assert all(r["message"] == "RuntimeError: boom on rank 1" for r in failed), failed
    ended = [r for r in records if r["kind"] == events.RANK_ENDED]  # the rank's own end, before its agent saw it
    assert [(r["rank"], r["exitcode"]) for r in ended] == [(1, 1), (1, 1)], records
    assert all(e["time"] <= f["time"] for e, f in zip(ended, failed, strict=True)), records
    [gave_up] = [r for r in records if r["kind"] == events.GAVE_UP]
    assert (gave_up["rank"], gave_up["reason"], gave_up["attempts"]) == (1, events.REPEATED, 2), gave_up
    # Rank 1 raises once rank 0 has reported (node_job.py): rank 0 reports once in each of the two attempts, rank 1
    # never, and no third attempt starts.
    assert [r["rank"] for r in reports(done)] == [0, 0], done.stdout


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    """The node's metrics as (name, sorted labels) -> value; empty while nothing answers."""
    parser = need("prometheus_client.parser")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    families = parser.text_string_to_metric_families(text)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def test_a_node_serves_its_metrics_while_its_ranks_train_and_a_port_in_use_only_costs_the_metrics(
    tmp_path: Path,
) -> None:
    """app node --serve-metrics on loopback, a digits job of 2 ranks: a scrape during the job finds both ranks'
    busy time and the job's step from rank 0's exchanges (read from the events file, as the runner reads it)."""
    events_file = tmp_path / "events.jsonl"
    env = _clean_env() | {"DDP_CLUSTER_EVENTS_FILE": str(events_file)}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    words = [*TWO_RANKS, "--local-addr", "127.0.0.1", "-m", "app", "train",
             "--dataset", "digits", "--epochs", "30", "--out", str(tmp_path / "out")]  # fmt: skip
    cmd = node_command(tmp_path, words, "--serve-metrics", "--metrics-port", str(port))
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict = {}
    try:
        deadline = time.monotonic() + TIMEOUT
        while job.poll() is None and time.monotonic() < deadline:
            scraped = _scrape(port)
            if any(name == "ddp_job_step" and value > 0 for (name, _), value in scraped.items()):
                seen = scraped
                break
            time.sleep(0.2)
        out, err = job.communicate(timeout=TIMEOUT)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, err[-3000:]
    host = socket.gethostname()
    assert f"metrics: http://{host}:{port}/metrics" in out, out
    assert seen, "no scrape during the job found a step"
    [job_label] = {dict(labels)["job"] for name, labels in seen if name == "ddp_job_step"}  # --standalone's rdzv id
    node = (("job", job_label), ("node", host))
    ranks = {labels for name, labels in seen if name == "ddp_rank_busy_seconds"}
    assert ranks == {(*node, ("rank", "0")), (*node, ("rank", "1"))}, seen
    assert seen["ddp_job_world_size", node] == 2 and seen["ddp_node_training", node] == 1.0, seen
    assert seen["ddp_node_device_matmul_flops", (("device", "cpu"), *node)] > 0, seen  # the gate's figures
    # The same port taken: the node says so in one line and the job runs as before.
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (the scrapes' connections are in TIME_WAIT)
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = run_node(tmp_path / "again", [*TWO_RANKS, "--local-addr", "127.0.0.1", str(NODE_JOB)], "--serve-metrics",
                        "--metrics-port", str(port), env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"metrics: not served: port {port} on 127.0.0.1 (" in done.stdout, done.stdout
    assert [r["rank"] for r in reports(done)] == [0, 1]
