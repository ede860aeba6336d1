"""The monitor profile (make cluster-up MONITOR=1): a real Prometheus (Debian's, in its own image) scrapes every
node of a running job on the compose mini-cluster; its HTTP API, on the host's loopback, shows every node's and
rank's series with the runner's names, a restart counted after a worker container is killed, and the job's
samples/s as rank 0 records it at each exchange of step times. A Prometheus that cannot start is one line and
the job goes on.

Run: ``make test-images && .venv/bin/python -m pytest tests/docker/test_monitor.py`` (about 2 minutes).
"""

import json
import re
import socket
import sys
import time
import urllib.parse
import urllib.request

import pytest
from bench.drive import OUT, FaultRun, explain
from bench.metrics import free_port

from .conftest import IMAGE_NAME, ROOT, built, project_leftovers, run

pytestmark = [pytest.mark.docker, pytest.mark.slow]

PACE_MS = 400
"""Rank 0 sleeps this long in every step, so that the job's pace is the sleep's, not this machine's load."""
TRAIN = ["--dataset", "digits", "--epochs", "2", "--batch-size", "16", "--checkpoint-every", "10", "--out", OUT,
         "--resume", "auto", "--exchange-every", "4"]  # fmt: skip
"""46 steps of 64 samples (4 ranks), an exchange of step times every 4."""


@pytest.fixture(scope="module")
def monitor_image(engine) -> str:
    return built(f"{IMAGE_NAME}-prometheus:bookworm")


def query(port: int, promql: str) -> list[dict]:
    """The vector of an instant query to Prometheus's HTTP API on the host's loopback."""
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return body["data"]["result"]


def over_time(port: int, promql: str, start: float) -> list[tuple[float, float]]:
    """(time, value) of the one series of a range query from ``start`` until now, every second."""
    span = {"query": promql, "start": start, "end": time.time(), "step": 1}
    url = f"http://127.0.0.1:{port}/api/v1/query_range?" + urllib.parse.urlencode(span)
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    found = body["data"]["result"]
    assert len(found) == 1, found
    return [(at, float(value)) for at, value in found[0]["values"]]


@pytest.fixture
def monitored(monitor_image, cpu_image, tmp_path):
    job = FaultRun(f"ddpm-{re.sub('[^0-9]', '', str(free_port()))}{tmp_path.name[-4:].lower()}", tmp_path / "r",
                   cpu_image)  # fmt: skip
    yield job, monitor_image
    run([sys.executable, "-m", "app", "cluster", "down", "--name", job.project], 240)
    assert project_leftovers(job.project) == []


def test_prometheus_sees_every_node_and_rank_a_restart_and_the_samples_per_second_rank_0_records(monitored):
    job, image = monitored
    port = free_port()
    hooks = ["--fault-at-step", "25", "--fault-rank", "3", "--sleep-rank", "0", "--sleep-ms", str(PACE_MS)]
    began = time.time()
    proc = job.start(hooks, "--monitor", "--monitor-image", image, "--monitor-port", str(port), train=TRAIN)
    job.marker(proc)  # step 25: Prometheus has scraped several exchanges; the worker container is killed
    job.engine.containers.get(job.container("worker")).kill()
    done = job.finish(proc)
    assert done.returncode == 0, explain(done)
    assert f"monitor: Prometheus at http://127.0.0.1:{port} scrapes every node's metrics" in done.stdout, explain(done)
    assert "cluster: restart 1: " in done.stdout, explain(done)

    head, worker = job.container("head"), job.container("worker")  # Prometheus outlives the job: it is asked after
    ever = f'job="{job.project}"'
    gates = query(port, f"max_over_time(ddp_node_gate_kept_out{{{ever}}}[10m])")
    assert {s["metric"]["node"] for s in gates} == {head, worker}, gates
    busy = query(port, f"max_over_time(ddp_rank_busy_seconds{{{ever}}}[10m])")
    assert sorted((s["metric"]["rank"], s["metric"]["node"]) for s in busy) == [
        ("0", head), ("1", head), ("2", worker), ("3", worker)
    ], busy  # fmt: skip
    assert {s["metric"].get("instance") for s in busy} == {f"{head}:9473"}  # one source: rank 0's node
    [restarts] = query(port, f"max(max_over_time(ddp_job_restarts_total{{{ever}}}[10m]))")
    assert float(restarts["value"][1]) >= 1, restarts

    # every (step, samples/s) Prometheus scraped is rank 0's record of that step's exchange (metrics.jsonl): the
    # same figure, not one of this machine's load (an epoch's average against one exchange's flipped under load)
    exchanged = {(float(r["step"]), float(r["samples_per_s"])) for r in job.metrics() if r["event"] == "ranks"}
    steps = dict(over_time(port, f"ddp_job_step{{{ever}}}", began))
    rates = dict(over_time(port, f"ddp_job_samples_per_second{{{ever}}}", began))
    scraped = {(steps[at], rate) for at, rate in rates.items() if at in steps}
    assert len({step for step, _ in scraped}) >= 3, (scraped, exchanged)  # several exchanges before the fault
    assert scraped <= exchanged, (scraped - exchanged, exchanged)


def test_a_prometheus_that_cannot_start_is_one_line_and_the_job_goes_on(monitor_image, cluster):
    with socket.socket() as taken:  # its port is another program's
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cluster.make("cluster-up", "MONITOR=1", f"MONITOR_PORT={port}", "NPROC_PER_NODE=1",
                            "JOB=train --dataset digits --epochs 1 --out /results/d")  # fmt: skip
    assert done.returncode == 0, explain(done)
    [line] = [line for line in done.stdout.splitlines() if line.startswith("monitor: Prometheus")]
    assert line.startswith("monitor: Prometheus did not start (") and "address already in use" in line, line
    assert line.endswith(
        f"the job goes on without it: free port {port} or give MONITOR_PORT, see {ROOT}/logs/cluster.log"
    ), line
    assert cluster.json("d/summary.json")["step"] > 0
    missing = run([sys.executable, "-m", "app", "cluster", "up", "--name", cluster.project, "--image", cluster.image,
                   "--monitor", "--monitor-image", "no-such-prometheus:1"], 60)  # fmt: skip
    assert (missing.returncode, missing.stdout) == (2, ""), explain(missing)
    [said] = missing.stderr.strip().splitlines()  # "; log ..." when the shared logs/cluster.log holds other runs' lines
    assert said.startswith(
        "error: image no-such-prometheus:1 is missing: build it with `make monitor-image` (MONITOR=1 does) [exit 2"
    ), explain(missing)
