"""``make bench-faults``' report: its figures, and the rank ends it read from the job's events (not the runner's
lines)."""

from tests.deps import need

need("docker")  # the Docker SDK, which the benchmark's module imports
from bench import faults  # noqa: E402


def _run(training_s: float, **more: object) -> dict:
    return {"training_s": training_s, "steps": 276, "faults": [], "resizes": [], **more}


def test_the_report_counts_the_rank_ends_the_events_hold_and_the_resumptions() -> None:
    fault = {"kind": "worker container killed", "recovery_s": 12.5, "steps_lost": 3, "resumed_from": 40,
             "checkpoint_interval_steps": 10}  # fmt: skip
    failures = [{"exitcode": -9}, {"exitcode": -9}, {"exitcode": 1}, {"exitcode": -15}]
    hit = _run(120.0, faults=[fault], failures=failures, resumptions=1)
    report = {"epochs": 12, "load_average_before": (1.0,), "load_average_after": (1.5,),
              "pairs": [{faults.UNDISTURBED: _run(100.0), faults.FAULTED: hit}]}  # fmt: skip
    text = faults.format_report(report)
    said = "  rank ends its agents saw: 2 x signal 9 (SIGKILL), 1 x exit 1, 1 x signal 15 (SIGTERM); resumed 1 time(s)"
    assert said in text.splitlines(), text
    assert "effective training time ratio 0.83; within the run 0.90" in text, text
