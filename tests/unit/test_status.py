"""``app cluster status``: a job's state folded from its events and its containers' states."""

import json

from app import events
from app.orchestrate import status
from app.train.report import Reporter

HEAD, WORKER = "c-head-1", "c-worker-1"
T0 = 1000.0


def _record(kind: str, at: float, node: str = HEAD, rank: int | None = None, **fields) -> dict:
    return {"time": at, "node": node, "rank": rank, "kind": kind, **fields}


def _exchange(at: float, step: int, hosts: list[str], busy: list[float]) -> dict:
    median = sorted(busy)[len(busy) // 2]
    slowest = max(range(len(busy)), key=busy.__getitem__)
    return _record(
        events.EXCHANGE, at, rank=0, step=step, hosts=hosts, busy_ms=busy, slowest_rank=slowest,
        slowest_host=hosts[slowest], slowest_busy_ms=busy[slowest], median_busy_ms=median,
        wait_ms=[max(busy) - b for b in busy],
        world_size=len(hosts), global_batch=256, accum_steps=1, samples_per_s=20000.0,
    )  # fmt: skip


FOUR = [HEAD, HEAD, WORKER, WORKER]
RUNNING = {HEAD: "running", WORKER: "running"}


def test_a_running_job_shows_its_last_exchange_checkpoint_and_every_node_training() -> None:
    records = [
        _record(events.JOB_STARTED, T0, node="host"),
        _exchange(T0 + 5, 20, FOUR, [10.0, 10.0, 11.0, 30.0]),
        _record(events.CHECKPOINT, T0 + 6, rank=0, step=20, path="/results/x/step-20.pt"),
        _exchange(T0 + 9, 40, FOUR, [10.0, 10.0, 11.0, 33.0]),
    ]
    found = status.fold("c", records, RUNNING, now=T0 + 10)
    assert found.running and found.step == 40 and found.world_size == 4 and found.samples_per_s == 20000.0
    assert [(n.name, n.state, n.ranks) for n in found.nodes] == [
        (HEAD, "training", [0, 1]),
        (WORKER, "training", [2, 3]),
    ]
    assert found.slowest == {"host": WORKER, "rank": 3, "factor": 3.0}
    assert found.checkpoint == {"step": 20, "path": "/results/x/step-20.pt", "age_s": 4.0}
    table = status.format_table(found, now=T0 + 10)
    assert table.splitlines()[:2] == [
        "cluster c: a job runs (started 10 s ago)",
        "step 40, 20,000 samples/s, 4 ranks, global batch 256 (accum 1)",
    ]
    assert f"{WORKER}  running     training    2, 3" in table
    assert f"slowest: {WORKER} (rank 3), busy 3.00x the median per step" in table
    assert "last checkpoint: step 20, 4 s ago (/results/x/step-20.pt)" in table
    assert json.loads(status.to_json(found))["nodes"][1]["state"] == "training"


def test_a_failed_rank_a_gate_a_lost_container_and_a_resume_each_show() -> None:
    records = [
        _record(events.JOB_STARTED, T0, node="host"),
        _exchange(T0 + 5, 20, FOUR, [10.0] * 4),
        _record(events.WORKER_FAILED, T0 + 6, node=WORKER, local_rank=1, exitcode=-9, message="", attempt=0),
    ]
    assert [n.state for n in status.fold("c", records, RUNNING, T0 + 7).nodes] == ["joining", "restarting"]
    gated = [*records, _record(events.GATE, T0 + 8, node=WORKER, verdict=events.KEPT_OUT, detail="")]
    gated += [_record(events.RESUMED, T0 + 9, rank=0, from_step=20), _exchange(T0 + 10, 40, [HEAD, HEAD], [10.0] * 2)]
    found = status.fold("c", gated, RUNNING, T0 + 11)
    assert [(n.state, n.ranks) for n in found.nodes] == [("training", [0, 1]), ("kept out", [])]
    assert found.restarts == 1 and found.world_size == 2
    lost = status.fold("c", gated, {HEAD: "running", WORKER: "exited"}, T0 + 11)
    assert [n.state for n in lost.nodes] == ["training", "down"]
    passed = [*gated, _record(events.GATE, T0 + 12, node=WORKER, verdict=events.PASSED_AFTER, detail="")]
    assert [n.state for n in status.fold("c", passed, RUNNING, T0 + 13).nodes] == ["training", "joining"]
    resized = [*passed, _record(events.RESIZE, T0 + 14, rank=0, **{"from": 2, "to": 4, "step": 40})]
    assert status.fold("c", resized, RUNNING, T0 + 15).resizes == 1


def test_a_killed_worker_reads_down_restarting_joining_then_training_and_no_node_trains_meanwhile() -> None:
    """Issue 36 item 3: the worker's container killed after the exchange of step 40. Each state shows as soon as
    its cause is a fact (the engine's container state, a rank's event); no node reads training until the next
    exchange, and the metrics say the same."""
    run = [_record(events.JOB_STARTED, T0, node="host"), _exchange(T0 + 5, 40, FOUR, [10.0] * 4)]
    seen = [status.fold("c", run, RUNNING, T0 + 6)]
    seen.append(status.fold("c", run, {HEAD: "running", WORKER: "exited"}, T0 + 7))  # killed: the engine says so
    run += [_record(events.ERROR, T0 + 7.1, rank=r, line="...", cause="...", status=1, reason=events.PEERS_LOST)
            for r in (0, 1)]  # fmt: skip
    seen.append(status.fold("c", run, {HEAD: "running", WORKER: "exited"}, T0 + 8))
    run.append(_record(events.NODE_LOST, T0 + 8.5, node="host", lost=WORKER, exitcode=137))  # the runner's word
    seen.append(status.fold("c", run, RUNNING, T0 + 9))  # started again: at its gate, then in the rendezvous
    run.append(_record(events.GATE, T0 + 10, node=WORKER, verdict=events.KEPT_OUT, detail=""))
    seen.append(status.fold("c", run, RUNNING, T0 + 11))
    run.append(_record(events.GATE, T0 + 12, node=WORKER, verdict=events.PASSED_AFTER, detail=""))
    seen.append(status.fold("c", run, RUNNING, T0 + 12.5))
    run += [_record(events.RESUMED, T0 + 13, rank=0, from_step=40), _exchange(T0 + 14, 50, FOUR, [10.0] * 4)]
    seen.append(status.fold("c", run, RUNNING, T0 + 15))
    assert [[n.state for n in found.nodes] for found in seen] == [
        ["training", "training"],
        ["joining", "down"],
        ["restarting", "down"],
        ["restarting", "restarting"],
        ["restarting", "kept out"],
        ["restarting", "joining"],
        ["training", "training"],
    ]
    assert [found.recovering for found in seen] == [False, True, True, True, True, True, False]


def test_a_node_started_again_before_any_rank_said_it_failed_reads_restarting_not_training() -> None:
    """The runner's word that it starts a lost container again comes before the ranks' (their roll call takes a
    moment): the node it names, running again with its ranks still in the last exchange, is not training."""
    run = [_record(events.JOB_STARTED, T0, node="host"), _exchange(T0 + 5, 40, FOUR, [10.0] * 4)]
    run.append(_record(events.NODE_LOST, T0 + 6, node="host", lost=WORKER, exitcode=137))
    assert [n.state for n in status.fold("c", run, RUNNING, T0 + 7).nodes] == ["joining", "restarting"]


def test_only_the_last_job_counts_and_an_ended_job_is_idle() -> None:
    first = [_record(events.JOB_STARTED, T0, node="host"), _record(events.RESUMED, T0 + 1, rank=0, from_step=0)]
    first += [_exchange(T0 + 2, 20, FOUR, [10.0] * 4), _record(events.JOB_ENDED, T0 + 3, node="host", status=1)]
    ended = status.fold("c", first, RUNNING, T0 + 4)
    assert not ended.running and ended.ended_status == 1 and {n.state for n in ended.nodes} == {"idle"}
    assert "no job runs (the last one ended with exit status 1)" in status.format_table(ended, T0 + 4)
    stopped = [*first[:-1], _record(events.JOB_ENDED, T0 + 3, node="host", status=None)]  # the runner's Ctrl-C
    assert "the runner of the last one was stopped" in status.format_table(status.fold("c", stopped, {}, T0 + 4), T0)
    second = status.fold("c", [*first, _record(events.JOB_STARTED, T0 + 5, node="host")], RUNNING, T0 + 6)
    assert second.running and second.restarts == 0 and second.step is None  # nothing of the first job's
    assert [n.state for n in second.nodes] == ["joining", "joining"]
    never = status.fold("c", [], {}, T0)
    assert "no job has run here yet" in status.format_table(never, T0) and "no checkpoint" in status.format_table(
        never, T0
    )


def test_rank_0_writes_the_facts_the_status_reads_into_the_events_file(tmp_path, monkeypatch) -> None:
    # A checkpoint's own ``path`` field is a field of the record, not where the record goes.
    file = tmp_path / "events.jsonl"
    monkeypatch.setenv("DDP_CLUSTER_EVENTS_FILE", str(file))
    reporter = Reporter(tmp_path / "out", enabled=True)
    reporter.event("checkpoint", step=20, epoch=3, batch=0, path="/results/x/step-20.pt")
    reporter.event("epoch", epoch=3)  # metrics.jsonl only
    reporter.close()
    records, _ = events.read(file)
    assert [(r["kind"], r["rank"], r["step"], r["path"]) for r in records] == [
        ("checkpoint", 0, 20, "/results/x/step-20.pt")
    ]
    assert [json.loads(line)["event"] for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()] == [
        "checkpoint",
        "epoch",
    ]


def test_an_evicted_node_shows_evicted_until_it_is_back_and_its_resume_is_no_restart() -> None:
    records = [
        _record(events.JOB_STARTED, T0, node="host"),
        _exchange(T0 + 5, 20, FOUR, [10.0, 10.0, 40.0, 40.0]),
        _record(events.EVICTED, T0 + 6, node="host", evicted=WORKER, factor=4.0, exchanges=3, window_s=3.0),
        _record(events.RESUMED, T0 + 8, rank=0, from_step=20, checkpoint="/results/x/emergency.pt", reached=20),
        _exchange(T0 + 9, 24, [HEAD, HEAD], [10.0, 10.0]),
    ]
    found = status.fold("c", records, RUNNING, now=T0 + 10)
    assert [(n.name, n.state) for n in found.nodes] == [(HEAD, "training"), (WORKER, "evicted")]
    assert (found.evictions, found.restarts) == (1, 0)
    assert "restarts 0, regroups 0, resizes 0, evictions 1" in status.format_table(found, now=T0 + 10)
    back = [*records, _exchange(T0 + 20, 40, FOUR, [10.0, 10.0, 11.0, 11.0])]
    again = status.fold("c", back, RUNNING, now=T0 + 21)
    assert [(n.name, n.state) for n in again.nodes] == [(HEAD, "training"), (WORKER, "training")]
