"""The fault suite: the compose cluster (2 nodes x 2 ranks, gloo) heals itself, or says in one line why not.

Each fault strikes at step 25 of a 46-step job, after the checkpoints of steps 10, 20 and 23: the fault
job (docker/bench/fault_job.py) writes a marker there and slows its steps, and the test acts on a container.
1. a training process killed (kill -9 inside the worker container), 2. the worker container killed,
4. the worker container paused past the collective timeout: the job resumes and ends with parameters
and optimizer state identical to an uninterrupted run's, as it does with 3. the head container killed
(rank 0's node: the rendezvous lives in a store container of its own); 5. the results volume full
during a checkpoint write, 6. the rendezvous store's container killed: the job ends within the stated
bound with the stated line, and the last checkpoint loads (and, the space freed, the job resumes and
finishes).

Run: ``DDP_TEST_IMAGE_NAME=... .venv/bin/python -m pytest tests/docker/test_faults.py`` (a few minutes).
"""

import calendar
import re
import sys
import threading
import time
import uuid

import pytest
import torch
from bench.drive import COLLECTIVE_TIMEOUT, FINAL_STEP, OUT, FaultRun, explain

from app import events
from app.orchestrate import engine
from app.orchestrate import status as job_status
from app.topology.compose import STOP_GRACE_S  # the nodes stop within it once the store is gone

from .conftest import ROOT, project_leftovers, run

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FAULT_STEP = 25
HOOKS = ["--fault-at-step", str(FAULT_STEP), "--fault-rank", "3", "--slow-ms", "500"]
RECOVERING = {job_status.DOWN, job_status.RESTARTING, job_status.JOINING, job_status.KEPT_OUT, job_status.IDLE}
"""What ``cluster status`` may read for a node between its loss and its ranks' next exchange."""
RESUMED = re.compile(
    r"; resumed from step (?P<step>\d+) \(checkpoint /results/f/checkpoints/(step-\d{8}|emergency)\.pt\), "
    r"((?P<lost>\d+) steps? lost \(the failed attempt reached step (?P<reached>\d+)\)|no steps lost)$"
)


def new_run(image: str, tmp_path) -> FaultRun:
    return FaultRun(f"ddpf-{uuid.uuid4().hex[:8]}", tmp_path / "results", image)


@pytest.fixture
def fault_run(cpu_image, tmp_path):
    """A compose project of its own, removed afterwards."""
    job = new_run(cpu_image, tmp_path)
    yield job
    run([sys.executable, "-m", "app", "cluster", "down", "--name", job.project], 240)
    assert project_leftovers(job.project) == []


@pytest.fixture(scope="module")
def reference(cpu_image, tmp_path_factory) -> dict:
    """The final checkpoint of the same job without a fault."""
    job = new_run(cpu_image, tmp_path_factory.mktemp("reference"))
    try:
        done = job.finish(job.start([]))
        assert done.returncode == 0, explain(done)
        assert "cluster: restart" not in done.stdout, explain(done)
        return job.final_state()
    finally:
        run([sys.executable, "-m", "app", "cluster", "down", "--name", job.project], 240)


def assert_same_training(state: dict, want: dict) -> None:
    """The same weights and optimizer state, bit for bit: the fault cost time, not correctness."""
    assert state["step"] == want["step"] == FINAL_STEP
    for name, tensor in want["model_state"].items():
        assert torch.equal(state["model_state"][name], tensor), name
    for index, slots in want["optimizer"]["state"].items():
        for key, tensor in slots.items():
            assert torch.equal(state["optimizer"]["state"][index][key], tensor), (index, key)


def restart_line(job: FaultRun, stdout: str) -> tuple[str, re.Match]:
    """The one restart line (there must be exactly one), and its resume part; checked against metrics.jsonl."""
    lines = [line for line in stdout.splitlines() if line.startswith("cluster: restart")]
    assert len(lines) == 1, stdout[-5000:]
    resumed = RESUMED.search(lines[0])
    assert resumed, lines[0]
    step = int(resumed["step"])  # an emergency snapshot of the last step, or the last checkpoint
    lost, reached = (int(resumed["lost"]), int(resumed["reached"])) if resumed["lost"] else (0, step)
    assert 23 <= step <= reached and reached >= FAULT_STEP and lost == reached - step, lines[0]
    [event] = [m for m in job.metrics() if m["event"] == "resume"]
    assert (event["from_step"], event["lost"], event["reached"]) == (step, lost, reached), event
    return lines[0], resumed


def recovers(job: FaultRun, reference: dict, fault) -> str:
    """Run the job, call ``fault(marker, the job's process)`` at the fault step; the job must end 0 with the reference's
    state and resume from the emergency snapshot of the step it had reached: no step lost. Returns the restart line."""
    proc = job.start(HOOKS)
    marker = job.marker(proc)
    assert (marker["step"], marker["rank"]) == (FAULT_STEP, 3)
    fault(marker, proc)
    done = job.finish(proc)
    assert done.returncode == 0, explain(done)
    line, _ = restart_line(job, done.stdout)
    assert "/emergency.pt), no steps lost" in line, line
    assert_same_training(job.final_state(), reference)
    return line


def test_a_killed_training_process_is_restarted_and_the_job_ends_as_if_nothing_happened(fault_run, reference):
    worker = fault_run.container("worker")

    def kill_rank_3(marker: dict, _proc) -> None:
        assert fault_run.engine.containers.get(worker).exec_run(["kill", "-9", str(marker["pid"])]).exit_code == 0

    line = recovers(fault_run, reference, kill_rank_3)
    assert line.startswith(f"cluster: restart 1: rank 3 (local rank 1 on {worker}) ended with signal 9 (SIGKILL); ")


class StatusPoller(threading.Thread):
    """``cluster status``'s fold of the job's events and its containers' states, taken over and over while the job
    runs (as ``python -m app cluster status`` does, in this process): each snapshot's nodes' states."""

    def __init__(self, job: FaultRun) -> None:
        super().__init__(daemon=True)
        self.job, self.seen, self.done = job, [], threading.Event()

    def run(self) -> None:
        nodes = {self.job.container(service) for service in ("head", "worker")}
        while not self.done.is_set():
            containers = {name: state for name, state in engine.project_containers(self.job.project).items()
                          if name in nodes}  # fmt: skip
            found = job_status.fold(self.job.project, self.job.events(), containers, time.time())
            self.seen.append({node.name: node.state for node in found.nodes})
            self.done.wait(0.2)


def test_a_killed_worker_container_is_started_again_and_the_job_ends_as_if_nothing_happened(fault_run, reference):
    """Issue 36 item 3 too: ``cluster status`` polled throughout reads the worker training, then not (down,
    restarting, joining or kept out), then training again; and whenever it reads the worker out, the head does not
    read training either (a collective needs every rank)."""
    worker, head = fault_run.container("worker"), fault_run.container("head")
    poller = StatusPoller(fault_run)
    poller.start()
    try:
        line = recovers(fault_run, reference, lambda *_: fault_run.engine.containers.get(worker).kill())
    finally:
        poller.done.set()
        poller.join()
    assert line.startswith(f"cluster: restart 1: {worker} (ranks 2-3) stopped with signal 9 (SIGKILL); "), line
    states = [seen[worker] for seen in poller.seen if worker in seen]
    order = [state for i, state in enumerate(states) if i == 0 or states[i - 1] != state]
    out = [i for i, state in enumerate(order) if state != job_status.TRAINING and "training" in order[:i]]
    assert out and "training" in order[out[0] :], order  # training, out, training again
    assert set(order[out[0] : order.index("training", out[0])]) <= RECOVERING, order
    both = [seen for seen in poller.seen if seen.get(worker) in RECOVERING - {job_status.IDLE}]
    assert both and not [seen for seen in both if seen.get(head) == job_status.TRAINING], both


def test_a_paused_worker_is_named_and_after_unpause_the_job_resumes(fault_run, reference):
    worker = fault_run.container("worker")

    def pause_past_the_timeout(_marker: dict, proc) -> None:
        paused, head = fault_run.engine.containers.get(worker), fault_run.container("head")
        paused.pause()
        try:  # until the head's ranks timed out and named the silent ones (their error), not for a time
            fault_run.wait_event(
                proc, "the head's ranks' error", lambda r: r["kind"] == events.ERROR and r["node"] == head
            )
        finally:
            paused.unpause()

    line = recovers(fault_run, reference, pause_past_the_timeout)
    said = re.match(
        rf"cluster: restart 1: ranks 2-3 on {worker} stopped answering: the gradient all-reduce of step (\d+) "
        rf"failed \(Timed out waiting {COLLECTIVE_TIMEOUT * 1000}ms for (send|recv) operation to complete\); "
        "2 of 4 ranks answer",
        line,
    )
    assert said and int(said[1]) > FAULT_STEP, line
    # A paused rank writes no flight-recorder dump: the line says so rather than nothing (issue 25).
    assert f"; flight recorder: no dump from ranks 2-3 on {worker} (a stopped or paused process" in line, line


def test_a_killed_head_is_started_again_and_the_job_ends_as_if_nothing_happened(fault_run, reference):
    """Rank 0's node is a worker like any other: the rendezvous lives in a store container of its own, where the
    survivors hold their roll call once rank 0's store is gone with the head, and keep the step."""
    head = fault_run.container("head")
    line = recovers(fault_run, reference, lambda *_: fault_run.engine.containers.get(head).kill())
    assert line.startswith(f"cluster: restart 1: {head} (ranks 0-1) stopped with signal 9 (SIGKILL); "), line
    [resumed] = [r for r in fault_run.metrics() if r.get("event") == "resume"]  # the restarted head's agent counts
    assert resumed["restart_count"] == 1, resumed  # from 0: the record says what the terminal says (issue 25)


def test_the_rendezvous_store_lost_stops_the_job_within_the_bound_with_one_line(fault_run):
    proc = fault_run.start(HOOKS)
    fault_run.marker(proc)
    store = fault_run.container("rendezvous")
    fault_run.engine.containers.get(store).kill()
    killed_at = time.monotonic()
    project = {"label": f"com.docker.compose.project={fault_run.project}"}
    while fault_run.engine.containers.list(filters=project):  # those that run
        assert time.monotonic() - killed_at < 300, "containers still running"
        time.sleep(0.5)
    stopped_within = time.monotonic() - killed_at
    done = fault_run.finish(proc)
    assert done.returncode == 137, explain(done)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    lost = (
        f"error: the rendezvous store ({store}) was lost: it stopped with signal 9 (SIGKILL); run the job again to "
        "resume from its last checkpoint"
    )
    assert len(errors) == 1 and re.fullmatch(rf"{re.escape(lost)} \[exit 137(; log \S+)?\]", errors[0]), explain(done)
    assert "frame #" not in done.stdout + done.stderr and "TCPStore" not in done.stdout, explain(done)  # in the log
    log = (ROOT / "logs" / "cluster.log").read_text().splitlines()  # every node's lines (other tests' too)
    blamed = [line for line in log if fault_run.project in line and "stopped answering" in line]
    assert not blamed, blamed  # issue 25: the worker said rank 0 stopped answering, which never left
    assert stopped_within <= STOP_GRACE_S + 15, f"the nodes ran {stopped_within:.0f}s after the store"
    last = sorted((fault_run.results / "f" / "checkpoints").glob("step-*.pt"))[-1]
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert 23 <= state["step"] <= FAULT_STEP + 5 and state["model_state"], last


def test_a_full_results_volume_fails_with_one_line_keeps_the_last_checkpoint_and_resumes_once_freed(
    fault_run, reference
):
    # The results volume is a 24 MiB tmpfs, made before compose up with compose's labels (compose adopts it,
    # and removes it at cluster down); a holder container keeps it mounted (a tmpfs volume that no container
    # mounts is empty). The job fills it at step 25, leaving 1 MiB: the checkpoint of step 30 needs ~2.4.
    volume, holder = f"{fault_run.project}_results", f"{fault_run.project}-holder"
    tmpfs = {"type": "tmpfs", "device": "tmpfs", "o": "size=24m,uid=1000,gid=1000,mode=0755"}
    labels = {"com.docker.compose.project": fault_run.project, "com.docker.compose.volume": "results"}
    fault_run.engine.volumes.create(volume, driver="local", driver_opts=tmpfs, labels=labels)
    held = fault_run.engine.containers.run(
        fault_run.image, ["infinity"], entrypoint="sleep", name=holder, network_mode="none",
        volumes=[f"{volume}:/results"], detach=True,
    )  # fmt: skip
    try:
        disk_full_then_freed(fault_run, reference, volume, holder)
    finally:
        held.remove(force=True)


def disk_full_then_freed(fault_run: FaultRun, reference: dict, volume: str, holder: str) -> None:
    proc = fault_run.start([*HOOKS, "--fill-disk", "--leave-mib", "1"])
    marker = fault_run.marker(proc)
    done = fault_run.finish(proc)
    assert done.returncode == 1, explain(done)
    path = f"{OUT}/checkpoints/step-00000030.pt"
    assert re.search(
        rf"^error: rank 0 on {fault_run.container('head')}: could not write checkpoint {path} "
        r"\(No space left on device\): free some space "
        r"or choose another --out; the earlier checkpoints are intact \[exit 1; log \S+\]$",
        done.stderr,
        re.M,
    ), explain(done)
    said = "error: not restarted: every attempt would run out of disk the same way; free space in the volume"
    assert done.stderr.splitlines()[-1].startswith(f"{said} {volume}, then run the job again"), explain(done)
    assert "cluster: restart" not in done.stdout, "a full disk must not be restarted into the same failure"
    finished = fault_run.engine.containers.get(fault_run.container("head")).attrs["State"]["FinishedAt"]
    stopped = calendar.timegm(time.strptime(finished.strip()[:19], "%Y-%m-%dT%H:%M:%S"))
    assert stopped - marker["time"] <= 5 * 0.5 + STOP_GRACE_S + 15, "the job went on after the failed write"
    checkpoints = fault_run.results / "f" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [f"step-{s:08d}.pt" for s in (10, 20, 23)]
    assert torch.load(checkpoints / "step-00000023.pt", map_location="cpu", weights_only=True)["step"] == 23

    assert fault_run.engine.containers.get(holder).exec_run(["rm", f"{OUT}/filler"]).exit_code == 0
    again = fault_run.finish(fault_run.start([]))
    assert again.returncode == 0, explain(again)
    assert "cluster: resumed from step 23 (checkpoint /results/f/checkpoints/step-00000023.pt)" in again.stdout
    assert_same_training(fault_run.final_state(), reference)
