"""app/job_state.py: one fold of a job's events, which the runner's lines, `app cluster status` and the metrics all
read. Each recorded events file of a real compose run (tests/unit/golden/events/README.md) is fed to all three: the
same restarts, regroups and evictions."""

import json
from pathlib import Path

import pytest

from app import events, job_state, metrics
from app.orchestrate import engine, job
from app.orchestrate import status as job_status
from app.topology.spec import build
from tests.deps import need

GOLDEN = Path(__file__).parent / "golden" / "events"
parser = need("prometheus_client.parser")

RECORDED = {  # file -> (restarts, regroups, evictions), read from each run's records by hand (the README says how)
    "eviction-then-rejoin.jsonl": (0, 1, 1),
    "node-killed-then-rejoin.jsonl": (1, 1, 0),
    "kept-out-eight-rounds-loaded.jsonl": (4, 4, 0),
}


def recorded(name: str) -> list[dict]:
    return [json.loads(line) for line in (GOLDEN / name).read_text().splitlines()]


def said_by_the_runner(records: list[dict], tmp_path: Path, monkeypatch, capsys) -> tuple[int, int, int]:
    """The runner's lines over the records (as its reader hands them on): restart lines, regroups, eviction lines."""
    monkeypatch.setattr(engine, "client", lambda *_, **__: pytest.fail("the engine was asked"))
    run = job.Run(build({"job": {"name": "demo"}}), tmp_path, tmp_path / "demo.log")  # not elastic: no watch
    for record in records:
        run.on_event(record)
    lines = capsys.readouterr().out.splitlines()
    restarts = [line for line in lines if line.startswith("cluster: restart ")]
    assert [line.split(":")[1] for line in restarts] == [f" restart {n}" for n in range(1, len(restarts) + 1)]
    left = [line for line in lines if line.startswith("cluster: the job goes on without ")]
    return len(restarts), run.resumed_as[job_state.REGROUP], len(left)


def served_by_rank_0s_node(records: list[dict]) -> tuple[int, int, int]:
    exchange = next((r for r in reversed(records) if r.get("kind") == events.EXCHANGE), None)  # none: every node
    families = {f.name: f for f in metrics.families("demo", (exchange or records[-1])["node"], records)}
    return tuple(int(families[f"ddp_job_{name}"].samples[0].value) for name in ("restarts", "regroups", "evictions"))


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_one_recorded_run_counts_the_same_in_the_runners_lines_the_status_and_the_metrics(
    name: str, tmp_path, monkeypatch, capsys
) -> None:
    records = recorded(name)
    state = job_status.fold("demo", records, {}, records[-1]["time"])
    in_status = (state.restarts, state.regroups, state.evictions)
    assert said_by_the_runner(records, tmp_path, monkeypatch, capsys) == RECORDED[name]
    assert in_status == RECORDED[name]
    assert served_by_rank_0s_node(records) == RECORDED[name]


def _r(kind: str, **fields) -> dict:
    return {"time": 1.0, "node": "head", "rank": fields.pop("rank", None), "kind": kind, **fields}


REGROUPED = [
    _r(events.REGROUP),
    _r(events.WORKER_FAILED, rank=0, exitcode=-15),
    _r(events.ERROR, rank=1, reason=events.PEERS_STOPPED),
    _r(events.WORKER_FAILED, rank=1, exitcode=1),
]
"""A node joins: the agents stop their ranks (SIGTERM); rank 1's all-reduce was cut short by it (and says so)."""


@pytest.mark.parametrize(
    ("since", "kind"),
    [
        ([], job_state.CONTINUED),  # a job that resumes an earlier job's checkpoint: once counted as a restart
        ([_r(events.WORKER_FAILED, rank=1, exitcode=-9)], job_state.RESTART),
        ([_r(events.NODE_LOST, lost="worker-1", exitcode=137)], job_state.RESTART),
        ([_r(events.REGROUP)], job_state.REGROUP),
        (REGROUPED, job_state.REGROUP),
        ([_r(events.REGROUP), _r(events.WORKER_FAILED, rank=1, exitcode=1)], job_state.RESTART),  # a failure beside
        ([_r(events.ERROR, rank=1, reason=events.PEERS_STOPPED)], job_state.RESTART),  # stopped, and no node joins
        ([_r(events.EVICTED, evicted="worker-2"), _r(events.WORKER_FAILED, rank=1, exitcode=1)], job_state.EVICTION),
    ],
)
def test_what_a_resume_was_comes_from_the_records_since_the_job_last_ran(since: list[dict], kind: str) -> None:
    assert job_state.resume_kind(since) == kind
