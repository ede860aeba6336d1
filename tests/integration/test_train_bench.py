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
        "comm_hook": "none",
        "powersgd_rank": 2,
        "powersgd_warmup": 10,
        "compile": False,
        "cuda_graphs": "off",  # auto, chosen for the CPU
    }
    assert len(report["variants"]) == 10 and report["variants"]["compile"]["settings"]["compile"] is True
    assert report["precision"] == "fp32" and "mfu" not in report  # auto on a CPU; MFU on GPUs only
    assert report["warmup_rounds"] == 1 and "after 1 warm-up" in done.stdout
    assert report["one_process_samples_per_s"] > 0 and len(rates["one process"]) == 3
    per_round = [a / (2 * o) for a, o in zip(rates["app"], rates["one process"], strict=True)]
    assert report["scaling"] == pytest.approx(statistics.median(per_round))
    assert done.stdout.count("% of perfect") == 1
    assert done.stdout.count("ratio app/tutorial:") == 1  # rank 0 alone prints


def test_every_flag_reaches_the_ranks_it_starts(tmp_path) -> None:
    out = tmp_path / "bench.json"
    speed = ["--no-static-graph", "--bucket-cap-mb", "1", "--optimizer-impl", "foreach", "--loader", "dataloader"]
    done = run_single(["bench", "--rounds", "1", "--samples", "256", *speed, "--ifname", "lo", "--json", str(out)])
    assert done.returncode == 0, done.stderr[-3000:]
    settings = json.loads(out.read_text())["app_settings"]
    assert (settings["static_graph"], settings["bucket_cap_mb"]) == (False, 1.0)
    assert (settings["optimizer_impl"], settings["loader"]) == ("foreach", "dataloader")


def test_an_interface_that_does_not_exist_stops_the_ranks(tmp_path) -> None:
    # Negative control for --ifname: had it been dropped on the way, the ranks would use the default and pass.
    done = run_single(["bench", "--rounds", "1", "--samples", "256", "--ifname", "nosuchif0", "--timeout", "30"])
    assert done.returncode != 0 and "nosuchif0" in done.stderr, done.stderr[-3000:]
