"""`app bench` starts its own 2 ranks and reports both loops (figures only: no timed asserts)."""

import json
import statistics

import pytest

from tests.integration.launchers import run_single

pytestmark = pytest.mark.integration


def test_bench_reports_both_loops_and_the_ratio(tmp_path) -> None:
    out = tmp_path / "bench.json"
    done = run_single(["bench", "--rounds", "3", "--samples", "512", "--sweep", "--json", str(out)], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == 2 and report["batch_per_rank"] == 64
    assert report["tutorial_samples_per_s"] > 0 and report["app_samples_per_s"] > 0
    rates = report["all_rates"]
    per_round = [a / t for a, t in zip(rates["app"], rates["tutorial"], strict=True)]
    assert len(per_round) == 3 and report["ratio"] == pytest.approx(statistics.median(per_round))
    assert report["app_settings"] == {
        "loader": "memory",
        "optimizer_impl": "fused",
        "bucket_cap_mb": 25.0,
        "gradient_as_bucket_view": True,
        "static_graph": True,
        "sync_bn": False,
    }
    assert len(report["variants"]) == 7
    assert done.stdout.count("ratio app/tutorial:") == 1  # rank 0 alone prints
