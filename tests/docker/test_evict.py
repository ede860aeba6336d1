"""A straggler evicted from a running job (issue 26) on the compose cluster of 3 nodes x 1 rank (--min-nodes 2, gloo,
the fault job of test_faults.py): every rank is paced (100 ms a step) and worker-2 sleeps 1.5 s more a step from step
20 on (a slowness no load can shrink: 14x the others' and more, 9x their share of its work without it), so it is
evicted once 4 of the last 7 exchanges read it 2x that share or more (the default policy), the
others go on at the same global batch with no step lost (rank 0 then sleeps 1.5 s a step until the world is whole
again: about 4 minutes left for a return that takes seconds once the test heals the node); its gate keeps it out
while the job's figures are set beyond any device; healed (no sleep, figures within reach), it passes and the world
grows back; the final parameters are those of the same job run undisturbed (with no eviction
policy) but for the order of float sums. The same with a real CPU quota (``docker update --cpus 0.1``) is marked
noise (make test-noise).

Run: ``DDP_TEST_IMAGE_NAME=... .venv/bin/python -m pytest tests/docker/test_evict.py`` (about 3 minutes).
"""

import os
import re
import statistics
import uuid

import pytest
from bench.drive import CFS_PERIOD_US, OUT, FaultRun, explain
from bench.gate_figures import KEEP_OUT, LET_IN, MEASURED

from app import events

from .test_elastic import TOLERANCE, _difference, _down, _gate, _gate_line

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def fault_run(cpu_image, tmp_path):
    job = FaultRun(f"ddpv-{uuid.uuid4().hex[:8]}", tmp_path / "results", cpu_image)
    yield job
    _down(job)


EVICT_TRAIN = [
    "--dataset", "digits", "--epochs", "12", "--batch-size", "16", "--accum-steps", "2", "--exchange-every", "4",
    "--checkpoint-every", "10", "--out", "/results/f", "--resume", "auto", "--timeout", "20",
]  # fmt: skip
"""3 ranks x 16 x accum 2 = global batch 96 (2 ranks: accum 3): 15 steps an epoch, 180 in all; an exchange every 4."""
EVICT_HOOKS = ["--fault-at-step", "20", "--fault-rank", "2", "--sleep-rank", "0", "--sleep-ms", "1500",
               "--sleep-below-world", "3"]  # fmt: skip
"""At step 20 the worker-2's rank marks the step (the test throttles it then); while the job has 2 ranks, rank 0
sleeps 1.5 s a step, so that it outlasts the evicted node's gate (the whole job does not sleep)."""
EVICT_LINE = re.compile(
    r"^cluster: node (?P<node>\S+) evicted: busy (?P<factor>[\d.]+)x the others' share without it \(their median x "
    r"1\.5\), the median of the last (?P<window>\d+) exchanges \(4 at 2x or more, \d+ s\); the job goes on with 2 "
    r"nodes, global batch 96 \(accum 3\); its gate takes it back once it passes$",
    re.M,
)


EVICT_SPEC = ["--nodes", "3", "--nproc-per-node", "1", "--min-nodes", "2"]
EVICT_FINAL_STEP = 180


@pytest.fixture(scope="module")
def undisturbed(cpu_image, tmp_path_factory) -> dict:
    """The same 3-node job, undisturbed and with no eviction policy (on equal nodes the policy would judge this
    machine's noise); its final checkpoint."""
    job = FaultRun(f"ddpv-{uuid.uuid4().hex[:8]}", tmp_path_factory.mktemp("undisturbed") / "results", cpu_image)
    try:
        done = job.finish(job.start([], *EVICT_SPEC, "--evict-factor", "0", train=EVICT_TRAIN))
        assert done.returncode == 0, explain(done)
        return job.final_state(EVICT_FINAL_STEP)
    finally:
        _down(job)


def _gone_then_back(job: FaultRun, done, evicted: re.Match, worker: str, undisturbed: dict) -> None:
    """After its eviction line: the job went on without the worker with no step lost, its gate let it back in, the
    world grew back to 3, no restart was counted, and the final parameters are the undisturbed run's but for the
    order of float sums."""
    after = done.stdout[evicted.end() :]
    assert re.search(rf"^cluster: the job goes on without {worker}: resumed from step \d+ \(checkpoint "
                     r"/results/f/checkpoints/emergency\.pt\), no steps lost$", after, re.M), explain(done)  # fmt: skip
    assert re.search(rf"^cluster: node {worker} passed its gate after \d+ s kept out: ", after, re.M), explain(done)
    assert "cluster: restart" not in done.stdout, explain(done)  # an eviction is no failure
    resizes = [(m["from"], m["to"]) for m in job.metrics() if m["event"] == "resize"]
    assert resizes == [(3, 2), (2, 3)], resizes
    assert [m["lost"] for m in job.metrics() if m["event"] == "resume"] == [0, 0]
    summary = job.summary()
    assert summary["world_size"] == 3 and summary["step"] == EVICT_FINAL_STEP, summary
    drift = _difference(undisturbed["model_state"], job.final_state(EVICT_FINAL_STEP)["model_state"])
    print(f"evict: evicted and back vs undisturbed: max |difference| {drift:.3g} (tolerance {TOLERANCE:g})")
    assert drift <= TOLERANCE
    print("evict:", *(line for line in done.stdout.splitlines() if line.startswith(("cluster: ", "train: resize"))),
          sep="\n")  # fmt: skip


PACE_MS, SLOW_MS = 100, 1500
"""Every rank's sleep per step, and the straggler's more: its busy time is about 14x the others' paced 100 ms (and
their compute), 1,600 / (100 x 1.5) = 10.7x their share of its work without it at most, far past the policy's 2x
however loaded the machine is: evicted at the 4th exchange after its sleep starts (about 16 steps, 26 s)."""
SLOW_FILE = f"{OUT}/slow"
"""worker-2 sleeps while this file is there (the test creates it at step 20 and removes it to heal the node)."""


def test_a_paced_straggler_is_evicted_the_job_goes_on_at_the_same_global_batch_and_healed_it_comes_back(
    fault_run, undisturbed
):
    """Issue 26 on 3 nodes x 1 rank (--min-nodes 2), every cause set by the test: worker-2 slow by a sleep per step
    is evicted after 4 slow exchanges of 7, the others go on at global batch 96 with no step lost; its gate
    keeps it out (the job's figures beyond any device); healed, it passes and the world grows back to 3; the final
    parameters are the undisturbed run's but for the order of float sums."""
    worker = fault_run.container("worker").removesuffix("-1") + "-2"
    hooks = ["--fault-at-step", "20", "--fault-rank", "2", "--pace-ms", str(PACE_MS), "--sleep-host", worker,
             "--sleep-while", SLOW_FILE, "--sleep-ms", str(SLOW_MS),
             "--sleep-rank", "0", "--sleep-below-world", "3"]  # fmt: skip
    proc = fault_run.start(hooks, *EVICT_SPEC, train=EVICT_TRAIN)
    fault_run.marker(proc)
    fault_run.set_gate_figures(KEEP_OUT)  # before the eviction: its gate's first judgment keeps it out
    fault_run.touch(SLOW_FILE)
    record = fault_run.wait_event(proc, f"{worker}'s eviction", lambda r: r["kind"] == events.EVICTED)
    fault_run.wait_event(proc, f"{worker}'s gate keeping it out", _gate(worker, events.KEPT_OUT))
    fault_run.in_head("rm", SLOW_FILE)
    fault_run.set_gate_figures(LET_IN)  # healed
    done = fault_run.finish(proc)
    assert done.returncode == 0, explain(done)

    [evicted] = EVICT_LINE.finditer(done.stdout)  # one eviction: none before the sleep, nor after the return
    assert evicted["node"] == worker and record["evicted"] == worker, (evicted[0], record)
    assert record["exchanges"] == 4 and record["window"] == int(evicted["window"]) and record["nodes_left"] == 2, record
    # The factor the rule read: the median, over the exchanges of its window, of its busy time over the others' median
    # rank's x 1.5 (3 ranks over the 2 left: their share of its work without it), read here from the exchanges
    seen = [r for r in fault_run.events() if r["kind"] == events.EXCHANGE and r["time"] <= record["time"]]
    seen = seen[-record["window"] :]
    others = [statistics.median(ms for host, ms in zip(r["hosts"], r["busy_ms"], strict=True) if host != worker)
              for r in seen]  # fmt: skip
    factors = [r["busy_ms"][r["hosts"].index(worker)] / (median * 1.5) for r, median in zip(seen, others, strict=True)]
    assert sum(f >= 2 for f in factors) == 4 and abs(record["factor"] - statistics.median(factors)) <= 0.01, (
        factors, record)  # fmt: skip
    assert abs(float(evicted["factor"]) - record["factor"]) <= 0.051, (evicted[0], record)  # said to 0.1, kept to 0.01
    _gone_then_back(fault_run, done, evicted, worker, undisturbed)


@pytest.mark.noise
def test_a_straggler_is_evicted_the_job_goes_on_at_the_same_global_batch_and_healed_it_comes_back(
    fault_run, undisturbed
):
    """Marked noise (make test-noise): a real CPU quota, judged by the eviction rule against the others' busy times and
    by the gate against figures measured under load. Issue 26 on 3 nodes x 1 rank (--min-nodes 2): a worker held to a
    tenth of a core mid-run is evicted after 4 slow exchanges of 7, the others go on at global batch 96 with no step
    lost, its gate keeps it out; healed, it passes and the world grows back to 3; the final parameters are the
    undisturbed run's but for the order of float sums."""
    proc = fault_run.start(EVICT_HOOKS, *EVICT_SPEC, *MEASURED, train=EVICT_TRAIN)
    fault_run.marker(proc)
    worker = fault_run.container("worker").removesuffix("-1") + "-2"
    throttled = fault_run.engine.containers.get(worker)
    # A tenth of a core, not SICK_QUOTA_US: the evicted node starts again under it, and at 0.05 its Python took over
    # 300 s to reach its gate in a slow make test; at 0.1 its gate keeps it out at a fifth of the job's figure
    throttled.update(cpu_period=CFS_PERIOD_US, cpu_quota=CFS_PERIOD_US // 10)  # docker update --cpus 0.1
    said = _gate_line(fault_run, proc, worker)
    assert said.startswith("gate: kept out: device check "), said
    throttled.update(cpu_quota=CFS_PERIOD_US * os.cpu_count())  # healed
    done = fault_run.finish(proc)
    assert done.returncode == 0, explain(done)

    [evicted] = EVICT_LINE.finditer(done.stdout)  # one eviction: none before the throttle, nor after the return
    assert evicted["node"] == worker, evicted[0]
    [record] = [e for e in fault_run.events() if e["kind"] == "evicted"]
    assert record["evicted"] == worker and record["exchanges"] == 4 and record["nodes_left"] == 2, record
    _gone_then_back(fault_run, done, evicted, worker, undisturbed)
