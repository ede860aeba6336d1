"""A straggler evicted from a running job (issue 26) on the compose cluster of 3 nodes x 1 rank (--min-nodes 2, gloo,
the fault job of test_faults.py): a worker held to a tenth of a core (``docker update --cpus 0.1``) mid-run is
evicted after 3 slow exchanges of step times, the others go on at the same global batch with no step lost, its gate
keeps it out; healed, it passes and the world grows back; the final parameters are those of the same job run
undisturbed (which evicts nobody) but for the order of float sums.

Run: ``DDP_TEST_IMAGE_NAME=... .venv/bin/python -m pytest tests/docker/test_evict.py`` (about 3 minutes).
"""

import os
import re
import uuid

import pytest

from tests.rigs.faults.drive import CFS_PERIOD_US, FaultRun, explain

from .test_elastic import TOLERANCE, _difference, _down, _gate_line

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
    r"^cluster: node (?P<node>\S+) evicted: busy (?P<factor>[\d.]+)x the others' median at 3 of the last 5 "
    r"exchanges \(\d+ s\); the job goes on with 2 nodes, global batch 96 \(accum 3\); its gate takes it back "
    r"once it passes$",
    re.M,
)


EVICT_SPEC = ["--nodes", "3", "--nproc-per-node", "1", "--min-nodes", "2"]
EVICT_FINAL_STEP = 180


@pytest.fixture(scope="module")
def undisturbed(cpu_image, tmp_path_factory) -> dict:
    """The same 3-node job, undisturbed, under the default policy: it evicts nobody; its final checkpoint."""
    job = FaultRun(f"ddpv-{uuid.uuid4().hex[:8]}", tmp_path_factory.mktemp("undisturbed") / "results", cpu_image)
    try:
        done = job.finish(job.start(EVICT_HOOKS[4:], *EVICT_SPEC, train=EVICT_TRAIN))
        assert done.returncode == 0, explain(done)
        assert " evicted: " not in done.stdout and not [e for e in job.events() if e["kind"] == "evicted"], done.stdout
        return job.final_state(EVICT_FINAL_STEP)
    finally:
        _down(job)


def test_a_straggler_is_evicted_the_job_goes_on_at_the_same_global_batch_and_healed_it_comes_back(
    fault_run, undisturbed
):
    """Issue 26 on 3 nodes x 1 rank (--min-nodes 2): a worker held to a tenth of a core mid-run is evicted after 3
    slow exchanges of 5, the others go on at global batch 96 with no step lost, its gate keeps it out; healed, it passes
    and the world grows back to 3; the final parameters are the undisturbed run's (which evicted nobody) but for
    the order of float sums."""
    proc = fault_run.start(EVICT_HOOKS, *EVICT_SPEC, train=EVICT_TRAIN)
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
    assert evicted["node"] == worker and float(evicted["factor"]) >= 3, evicted[0]
    after = done.stdout[evicted.end() :]
    assert re.search(rf"^cluster: the job goes on without {worker}: resumed from step \d+ \(checkpoint "
                     r"/results/f/checkpoints/emergency\.pt\), no steps lost$", after, re.M), explain(done)  # fmt: skip
    assert re.search(rf"^cluster: node {worker} passed its gate after \d+ s kept out: ", after, re.M), explain(done)
    assert "cluster: restart" not in done.stdout, explain(done)  # an eviction is no failure
    resizes = [(m["from"], m["to"]) for m in fault_run.metrics() if m["event"] == "resize"]
    assert resizes == [(3, 2), (2, 3)], resizes
    assert [m["lost"] for m in fault_run.metrics() if m["event"] == "resume"] == [0, 0]
    [record] = [e for e in fault_run.events() if e["kind"] == "evicted"]
    assert record["evicted"] == worker and record["exchanges"] == 3 and record["backoff_s"] == 0, record
    summary = fault_run.summary()
    assert summary["world_size"] == 3 and summary["step"] == EVICT_FINAL_STEP, summary
    drift = _difference(undisturbed["model_state"], fault_run.final_state(EVICT_FINAL_STEP)["model_state"])
    print(f"evict: evicted and back vs undisturbed: max |difference| {drift:.3g} (tolerance {TOLERANCE:g})")
    assert drift <= TOLERANCE
    print("evict:", *(line for line in done.stdout.splitlines() if line.startswith(("cluster: ", "train: resize"))),
          sep="\n")  # fmt: skip
