"""``app links``, ``app comm`` and ``app check``'s device health across the compose mini-cluster's containers.

The proof that ``app links`` finds a slow node: a test-only container joins one cluster
container's network namespace with NET_ADMIN (the cluster containers keep every capability
dropped) and throttles its interface to 20 Mbit/s with tc; the report must name that container,
and only it. The same run without a throttle names none: marked noise (make test-noise), as its verdict rests
on this machine's noise (tests/unit/golden/links holds the rule to recorded runs).

The proof that ``app check`` finds a slow node: on the default cluster (2 nodes x 2 ranks) the worker's ranks measure
their devices at a tenth of their speed (tests/integration/measure_worker.py's --slow-device); the worker must be
named as a node, and only it, and the check fails. With a real CPU limit (``docker update --cpus`` 0.1 and 0.33) and
without one the verdicts rest on this machine's load: marked noise (make test-noise).

Run: ``DDP_TEST_IMAGE_NAME=... .venv/bin/python -m pytest tests/docker/test_measure.py``.
"""

import subprocess
import time

import pytest

from .conftest import IMAGE_NAME, ROOT, built, explain, run

pytestmark = pytest.mark.docker

THROTTLE_IMAGE = "ddp-cluster-node:bookworm"  # has iproute2 (tc); `make ansible-node-image` builds it
# 1 MiB transfers: 40 ms at 200 Mbit/s (a tenth of the clean median is over 1 Gbit/s: --fail-below 0.1
# is crossed), about 1 ms unthrottled; the best of 10 visits per link rides out a busy machine's
# scheduling noise and keeps the run short.
LINKS_ARGS = "LINKS_ARGS=--bytes 1M --iters 10 --fail-below 0.1"
HALF_ARGS = "LINKS_ARGS=--bytes 16M --iters 3"  # 16 MiB transfers: tbf's 1 MB burst is a small part of each
HALF_RUNS_AT_MOST = 5
"""Runs of the half-speed test: the throttle lands at 0.36-0.63 of the median (a busy machine moves the median),
and the verdict is judged on the first three that land at about half (0.3-0.6)."""
TBF = ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "200mbit", "burst", "32kbit", "latency", "400ms"]


@pytest.fixture(scope="module")
def throttle_image(engine) -> str:
    return built(THROTTLE_IMAGE, "ansible-node-image")


def _running_head(project: str, job: subprocess.Popen, service: str = "head", timeout: float = 600) -> str:
    """The id of the head container (or ``service``'s), as soon as it runs (before its job starts: the rendezvous
    and torch take seconds); ``job``, the make that starts it, must still run meanwhile (``timeout`` only bounds a
    hung one: a busy machine took more than 120 s to get there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        labels = [f"label=com.docker.compose.project={project}", f"label=com.docker.compose.service={service}"]
        filters = [arg for value in [*labels, "status=running"] for arg in ("--filter", value)]
        found = run(["docker", "ps", "-q", *filters], 30).stdout.split()
        if found:
            return found[0]
        assert job.poll() is None, f"the job ended before the {service} container of {project} ran: {job.communicate()}"
        time.sleep(0.2)
    raise AssertionError(f"the {service} container of {project} did not start within {timeout:g}s")


def _with_running(cluster, make_args: list[str], action, service: str = "head") -> subprocess.CompletedProcess:
    """Run ``make MAKE_ARGS`` on the cluster, calling ``action(container id)`` as soon as ``service`` runs."""
    cmd = ["make", "--no-print-directory", "BASE=local", f"IMAGE_NAME={IMAGE_NAME}", *make_args]
    cmd += [f"CLUSTER={cluster.project}", f"RESULTS={cluster.results}"]
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        action(_running_head(cluster.project, job, service=service))
        out, err = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    return subprocess.CompletedProcess(job.args, job.returncode, out, err)


@pytest.mark.noise
def test_links_on_an_undisturbed_cluster_names_nothing(cluster) -> None:
    """Marked noise (make test-noise): on a busy 2-core machine an undisturbed link can read well below its peers;
    tests/unit/golden/links holds the rule to recorded real runs. Every node is named as docker ps names it."""
    clean = cluster.make("cluster-links", "NODES=3", "NPROC_PER_NODE=1", LINKS_ARGS)
    assert clean.returncode == 0, explain(clean)
    report = cluster.json("links/links.json")
    head, workers = f"{cluster.project}-head-1", [f"{cluster.project}-worker-{i}" for i in (1, 2)]
    assert report["nodes"] == [head, *workers], "every node is named as docker ps names its container"
    assert report["slow_nodes"] == [] and report["slow_links"] == [] and report["below_fail"] == []
    assert "verdict: no slow node or link" in clean.stdout


AFTER_JOB = "tests/docker/jobs/app_after.py"
READY = "/results/links-ready"
"""The ranks of AFTER_JOB wait for this file: the test creates it once the head's link is shaped."""
LINKS_JOB = f"links --json /results/links/links.json --plot /results/links/links.png {LINKS_ARGS.split('=', 1)[1]}"


def test_links_names_the_throttled_container_and_only_it(cluster, throttle_image) -> None:
    """The head container's interface throttled from a container of the test's own (20x below its peers' links)
    before the measurement starts: the head is named as the node that sends slowly, and nothing else."""
    head, workers = f"{cluster.project}-head-1", [f"{cluster.project}-worker-{i}" for i in (1, 2)]

    def throttle(head_id: str) -> None:
        netns = ["--network", f"container:{head_id}", "--cap-add", "NET_ADMIN"]
        tc = run(["docker", "run", "--rm", *netns, throttle_image, *TBF], 120)
        assert tc.returncode == 0, explain(tc)
        ready = run(["docker", "exec", head_id, "touch", READY], 60)
        assert ready.returncode == 0, explain(ready)

    job = ["cluster-up", "NODES=3", "NPROC_PER_NODE=1", f"SCRIPT={AFTER_JOB}", f"ARGS={READY} {LINKS_JOB}"]
    throttled = _with_running(cluster, job, throttle)
    assert throttled.returncode != 0, explain(throttled)  # --fail-below 0.1 is crossed
    report = cluster.json("links/links.json")
    assert report["nodes"] == [head, *workers], "every node is named as docker ps names its container"
    assert f"{head} " in throttled.stdout and all(f"{w} " in throttled.stdout for w in workers), explain(throttled)
    assert report["slow_nodes"] == [{"node": head, "direction": "send"}], explain(throttled)
    assert report["slow_links"] == []
    assert {(s["src"], s["dst"]) for s in report["below_fail"]} == {(head, n) for n in workers}
    assert f"verdict: slow: node {head} (sends slowly" in throttled.stdout
    assert (cluster.results / "links" / "links.png").read_bytes()[:4] == b"\x89PNG"


def _log_readers_of(project: str) -> list[str]:
    """``compose logs`` processes still following ``project`` (cluster up must leave none behind)."""
    found = run(["pgrep", "-af", f"compose -p {project} .* logs "], 30).stdout
    return found.splitlines()


def _throttled_links(cluster, rate_mbit: int) -> dict:
    """One ``make cluster-links`` run with the head container's egress held to ``rate_mbit`` by tc tbf."""
    cmd = ["make", "--no-print-directory", "BASE=local", f"IMAGE_NAME={IMAGE_NAME}", "cluster-links"]
    cmd += [f"CLUSTER={cluster.project}", f"RESULTS={cluster.results}", "NODES=3", "NPROC_PER_NODE=1", HALF_ARGS]
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        head = _running_head(cluster.project, job)
        netns = ["--network", f"container:{head}", "--cap-add", "NET_ADMIN"]
        tbf = ["tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "1mb"]
        tc = run(["docker", "run", "--rm", *netns, THROTTLE_IMAGE, *tbf, "latency", "400ms"], 120)
        assert tc.returncode == 0, explain(tc)
        out, err = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    assert job.returncode == 0, explain(subprocess.CompletedProcess(cmd, job.returncode, out, err))
    return cluster.json("links/links.json")


@pytest.mark.noise
@pytest.mark.timeout(1800)
def test_a_node_at_half_speed_gets_the_same_verdict_every_run(cluster, throttle_image) -> None:
    """The defect: the head at about half the median bandwidth gave three verdicts in three identical runs (the
    node, one link, nothing). Three runs with its egress held to about half the clean median must all name it.

    Marked noise (make test-noise, not make test): with 3 nodes the head's sends are judged against the two links
    between the workers, and on this 2-core machine those two are sometimes a factor 2.6 apart (0.63 and 1.61 GB/s
    in one run, the head's sends at 0.41 of the median): the rule then rightly holds back, and the test fails on the
    machine's noise (CI at stop 19, a fresh-clone make test at stop 22). tests/unit/test_links.py holds the rule to
    the same verdict over 300 draws of +-8 % noise, for 3, 4 and 6 nodes."""
    clean = cluster.make("cluster-links", "NODES=3", "NPROC_PER_NODE=1", HALF_ARGS)
    assert clean.returncode == 0, explain(clean)
    median = cluster.json("links/links.json")["median_gbps"]
    rate_mbit = max(int(median * 8000 * 0.42), 1)  # tbf's rate at 0.42 of the median gave 0.4-0.55 of it
    verdicts, ratios = [], []
    for _ in range(HALF_RUNS_AT_MOST):  # a run where tbf did not hold the head at about half speed says nothing
        report = _throttled_links(cluster, rate_mbit)
        sends = report["bandwidth_gbps"][0][1]  # head -> worker-1
        ratios.append(round(sends / report["median_gbps"], 2))
        if 0.3 < ratios[-1] < 0.6:
            verdicts.append((report["slow_nodes"], report["slow_links"]))
        print("bandwidth (GB/s):", report["bandwidth_gbps"])
        if len(verdicts) == 3:
            break
    print(f"links at half speed: clean median {median:.2f} GB/s, tbf {rate_mbit} mbit, head->worker-1 / median "
          f"{ratios}, verdicts at about half speed {verdicts}")  # fmt: skip
    assert len(verdicts) == 3, ratios  # three runs with the head really at about half speed
    head = report["nodes"][0]  # rank 0's node, the throttled one
    assert verdicts == [([{"node": head, "direction": "send"}], [])] * 3, verdicts
    assert _log_readers_of(cluster.project) == []  # cluster up left no reader behind


def test_comm_across_containers(cluster) -> None:
    args = "COMM_ARGS=--max-bytes 1M --step-factor 16 --iters 2"
    done = cluster.make("cluster-comm", "NODES=2", "NPROC_PER_NODE=2", args)
    assert done.returncode == 0, explain(done)
    report = cluster.json("comm/cluster.json")
    assert report["ok"] and report["world_size"] == 4 and report["nodes"] == 2, report["failures"]
    head, worker = f"{cluster.project}-head-1", f"{cluster.project}-worker-1"
    assert report["hosts"] == [head, head, worker, worker], "ranks named by their containers, as docker ps names them"
    assert {r["op"] for r in report["results"]} == {
        "all_reduce",
        "all_gather",
        "reduce_scatter",
        "broadcast",
        "all_to_all",
        "send_recv",
    }
    assert all(r["wrong"] == 0 for r in report["results"])
    assert (cluster.results / "comm" / "cluster.png").stat().st_size > 20_000


# The check's device health on the default cluster (2 nodes x 2 ranks, torchrun's restarts off for a check):
# the worker container limited to a tenth of a CPU once its gate has spoken reads 7-14x below the head (recorded:
# tests/unit/golden/check), far past health.NODE_FACTOR (2) whatever this machine's noise. --timeout covers the
# limited worker's slow start (torch's import at a tenth of a core).
CHECK_ARGS = "CHECK_ARGS=--timeout 300"
LIMITED_JOIN_TIMEOUT = 300
"""The rendezvous's wait for the worker. Limited from its start, its torch import and gate at a tenth of a core took
33 s on an idle machine, more than the spec's default (120 s) on CI at stop 34, and more than 300 s beside another
container test (the head's agent gave up before any check ran: no check.json). So the worker is limited once its gate
has spoken (torch imported, about to join), and the wait covers what is left at a tenth of a core."""
WORKER_LIMIT = ["--cpus", "0.1"]
THIRD_LIMIT = ["--cpus", "0.33"]
"""A third of the core that each of the 2 nodes gets on this 2-core machine: 2.27-5.65x below the head in the median
round in 16 runs beside 0-4 busy loops (docs/measuring.md)."""


def _limited_check(cluster, limit_args: list[str]) -> subprocess.CompletedProcess:
    """``make cluster-check`` on a fresh default cluster whose worker is limited with ``docker update`` as it runs
    (its containers removed before and after: a limit stays on a container that the next job reuses)."""
    cluster.make("cluster-down")

    def limit(worker_id: str) -> None:
        deadline = time.monotonic() + 300  # its gate's line: torch imported, the node about to join the job
        while "gate: " not in run(["docker", "logs", worker_id], 30).stdout and time.monotonic() < deadline:
            time.sleep(0.2)
        done = run(["docker", "update", *limit_args, worker_id], 60)
        assert done.returncode == 0, explain(done)

    spec = cluster.results.parent / "limited.toml"
    spec.write_text(f"[rendezvous]\njoin_timeout = {LIMITED_JOIN_TIMEOUT}\n")
    try:
        return _with_running(cluster, ["cluster-check", CHECK_ARGS, f"SPEC={spec}"], limit, service="worker-1")
    finally:
        cluster.make("cluster-down")


def _assert_worker_named(cluster, limited: subprocess.CompletedProcess) -> None:
    assert (cluster.results / "check.json").exists(), explain(limited)
    report = cluster.json("check.json")
    worker = f"{cluster.project}-worker-1"
    slow = report["device_health"]["slow_nodes"]
    assert slow and {(s["host"], tuple(s["ranks"])) for s in slow} == {(worker, (2, 3))}, explain(limited)
    assert f"slow node: {worker} (ranks 2, 3): " in limited.stdout, explain(limited)
    assert limited.returncode != 0 and "device_health on rank 2, 3: slow node " in limited.stderr, explain(limited)


SLOW_DEVICE_JOB = ["MAX_RESTARTS=0", "SCRIPT=tests/integration/measure_worker.py",
                   "ARGS=--slow-device 2,3 check --json /results/check.json"]  # fmt: skip
"""The check with the worker's ranks (2, 3) doing each matrix product and copy 10 times while counting it once: its
devices read at a tenth of their speed, whatever the machine's load (measure_worker.py)."""


def test_check_names_the_node_with_slow_devices_and_only_it(cluster) -> None:
    _assert_worker_named(cluster, cluster.make("cluster-up", *SLOW_DEVICE_JOB))


@pytest.mark.noise
def test_check_names_the_cpu_limited_node_and_only_it(cluster) -> None:
    """Marked noise (make test-noise): a real CPU quota (a tenth of a core) against the head's figures measured beside
    whatever else the machine runs."""
    _assert_worker_named(cluster, _limited_check(cluster, WORKER_LIMIT))


@pytest.mark.noise
def test_check_names_a_node_at_a_third_of_its_speed_in_every_run(cluster) -> None:
    """Marked noise (make test-noise): a third of a core is a third of the worker's speed only while the head gets
    its own core; under make test's load the head gets less and the worker is nearer its speed (docs/measuring.md)."""
    for _ in range(3):
        _assert_worker_named(cluster, _limited_check(cluster, THIRD_LIMIT))


@pytest.mark.noise
def test_check_on_an_undisturbed_cluster_names_nothing(cluster) -> None:
    """Marked noise (make test-noise): an undisturbed verdict holds only while the nodes' figures in the median round
    stay within a factor 2 (on this 2-core machine beside 0-4 busy loops: 1.69x at most); tests/unit/test_health.py
    judges the rule on recorded undisturbed clusters (golden/check)."""
    clean = cluster.make("cluster-check", CHECK_ARGS)
    assert clean.returncode == 0, explain(clean)
    health = cluster.json("check.json")["device_health"]
    assert health["slow_nodes"] == [] and health["slow"] == [], explain(clean)
    assert "verdict: no slow node (the slowest: " in clean.stdout and "verdict: no slow device" in clean.stdout
