"""Device health: the figures of one device, and the verdict that names a slow rank (the outlier rule of app links)."""

import dataclasses
import itertools
import json
import time
from pathlib import Path

import pytest
import torch

from app.diagnostics import health, outliers
from app.diagnostics.health import DeviceHealth
from app.errors import UsageError


def _figures(flops: list[float], copy: list[float] | None = None) -> list[DeviceHealth]:
    copy = copy or [5.0] * len(flops)
    pairs = enumerate(zip(flops, copy, strict=True))
    return [DeviceHealth(f"cuda:{i}", "bfloat16", 8192, f, 1 << 28, c, 2.0) for i, (f, c) in pairs]


def test_measure_on_cpu_gives_positive_figures_in_bounded_calls() -> None:
    found = health.measure(torch.device("cpu"), seconds=0.4)
    assert found.device == "cpu" and found.dtype == "float32" and found.matmul_size == health.MATMUL_SIZE["cpu"]
    assert found.flops > 0 and found.copy_gbps > 0
    assert found.flops_rounds == (found.flops,) and found.copy_gbps_rounds == (found.copy_gbps,)  # one round fits
    assert health.figure("flops", found.flops, found.device).endswith(" GFLOP/s")
    assert health.figure("flops", 212e12, "cuda:1") == "212.0 TFLOP/s"


def test_rate_is_work_over_time_and_stops_after_its_samples() -> None:
    calls = []
    assert health.rate(lambda: calls.append(1), 10.0, torch.device("cpu"), 0.01) > 0
    # 2 untimed-or-calibration calls, then at most SAMPLES samples of one or more calls each.
    assert len(calls) >= 3


def test_every_sample_spans_the_sample_time_even_when_the_calibration_call_was_slow() -> None:
    # The first two calls take 50 ms (a throttled start), the rest 1 ms: the samples must still span
    # MIN_SAMPLE_S each, not the 4 calls that 50 ms implied (5 samples in 20 ms: one CPU quota period).
    calls: list[tuple[float, float]] = []

    def step() -> None:
        began = time.perf_counter()
        time.sleep(0.05 if len(calls) < 2 else 0.001)
        calls.append((began, time.perf_counter()))

    health.rate(step, 1.0, torch.device("cpu"), budget_s=0.0)
    timed = calls[2:]  # after the untimed call and the calibration call: one sample (no budget for more)
    # rate's clock starts before the first call's own, and a loaded machine can stop the process in between (a CI
    # run read 0.19999881 s, a loaded unit run less): a quarter of the sample as slack, against the 4 ms that 4 calls
    # of 1 ms would span without the fix
    assert timed[-1][1] - timed[0][0] >= 0.75 * health.MIN_SAMPLE_S


def test_every_sample_of_a_measurement_starts_together_and_the_figure_is_the_median_round() -> None:
    # app check passes its barrier: each of the rounds' two samples starts on every rank at once.
    starts: list[float] = []
    found = health.measure(torch.device("cpu"), seconds=2.0, together=lambda: starts.append(time.perf_counter()))
    assert health.rounds_for(2.0) == health.SAMPLES and len(starts) == 2 * health.SAMPLES
    assert len(found.flops_rounds) == len(found.copy_gbps_rounds) == health.SAMPLES
    assert found.flops == sorted(found.flops_rounds)[health.SAMPLES // 2]
    assert all(b - a >= health.MIN_SAMPLE_S for a, b in itertools.pairwise(starts))  # a sample between two starts
    assert [health.rounds_for(s) for s in (0.1, 0.4, 0.8, 2.0, 60.0)] == [1, 1, 2, 5, 5]


def test_a_slow_device_is_named_and_only_it() -> None:
    verdict = health.judge(_figures([690e12, 700e12, 680e12, 212e12]))
    assert [(s.rank, s.metric) for s in verdict.slow] == [(3, "flops")]
    assert verdict.slow[0].median == pytest.approx((690e12 * 685e12) ** 0.5, rel=0.01)  # geometric median


def test_a_slow_copy_is_named_too() -> None:
    verdict = health.judge(_figures([700e12] * 3, copy=[2000.0, 2100.0, 400.0]))
    assert [(s.rank, s.metric) for s in verdict.slow] == [(2, "copy_gbps")]


def test_noise_names_none() -> None:
    # +-25% apart, as busy CPU containers are: nothing is half the median.
    assert health.judge(_figures([3.1e9, 2.4e9, 3.0e9, 2.6e9])).slow == []


def test_two_ranks_are_judged_by_fail_below_only() -> None:
    verdict = health.judge(_figures([700e12, 100e12]), fail_below=0.5)
    assert verdict.slow == [] and verdict.rules["flops"].threshold is None
    assert [(s.rank, s.metric) for s in verdict.below_fail] == [(1, "flops")]


def test_fail_below_is_a_fraction() -> None:
    verdict = health.judge(_figures([700e12, 690e12, 500e12]), fail_below=0.8)
    assert [s.rank for s in verdict.below_fail] == [2]
    assert health.judge(_figures([700e12, 690e12, 500e12]), fail_below=0.5).below_fail == []
    with pytest.raises(UsageError, match="must be a fraction of the median in \\(0, 1\\]"):
        outliers.check_fraction(2.0)


# --- nodes as nodes ------------------------------------------------------------------------------


def _cpu(flops_g: list[float], copy: list[float]) -> list[DeviceHealth]:
    return [DeviceHealth("cpu", "float32", 512, f * 1e9, 64 << 20, c, 2.0) for f, c in zip(flops_g, copy, strict=True)]


def _rounds(flops_g: list[list[float]]) -> list[DeviceHealth]:
    """CPU ranks with their product's figure in each round (the copy equal everywhere)."""
    return [
        DeviceHealth("cpu", "float32", 512, sorted(r)[len(r) // 2] * 1e9, 64 << 20, 5.0, 2.0,
                     tuple(f * 1e9 for f in r), (5.0,) * len(r))
        for r in flops_g
    ]  # fmt: skip


def _ranks(figures: list[DeviceHealth], hosts: list[str]) -> list[dict]:
    """app check's gathered rank reports, as health.section reads them."""
    return [
        {"rank": r, "host": h, "device": f.device, "health": dataclasses.asdict(f)}
        for r, (f, h) in enumerate(zip(figures, hosts, strict=True))
    ]


def test_a_node_whose_ranks_are_half_of_all_is_named_as_a_node() -> None:
    # The 2 x 2: the worker at 0.3 CPU read 11.8-12.2 GFLOP/s, the head 76-89; the rule over ranks
    # named nothing (half the ranks are slow), the node rule names the worker, on both figures.
    figures = _cpu([76.0, 89.0, 11.8, 12.2], [5.0, 6.0, 1.1, 1.3])
    hosts = ["head", "head", "worker", "worker"]
    assert health.judge(figures, floor=health.CPU_RANK_FLOOR).slow == []
    part = health.section(_ranks(figures, hosts), 3.0, None)
    assert [(n["host"], n["ranks"], n["metric"]) for n in part["slow_nodes"]] == [
        ("worker", [2, 3], "flops"),
        ("worker", [2, 3], "copy_gbps"),
    ]
    assert part["slow_nodes"][0]["factor"] == pytest.approx((76.0 + 89.0) / (11.8 + 12.2))  # a CPU node: its ranks' sum
    report = {"device_health": part, "world_size": 4}
    assert health.format_lines(report)[1] == (
        "slow node: worker (ranks 2, 3): 24.0 GFLOP/s against head's 165.0, 6.9x below it in the median round: sure, "
        "2x or more in 1 of 1 round(s) measured at the same moments"
    )  # figures without rounds (recorded before them): one round
    assert [f["ranks"] for f in health.failures(report)] == [[2, 3], [2, 3]]


def test_the_verdict_agrees_with_the_slow_node_it_names() -> None:
    # Issue 36: a worker at 0.3 CPU named as a slow node, then `verdict: no slow device`, then `result: FAILED`.
    figures = _cpu([160.0, 165.0, 14.0, 15.3], [5.0, 6.0, 4.0, 4.5])  # the rank rule names none (half are slow)
    report = {"device_health": health.section(_ranks(figures, ["head"] * 2 + ["worker"] * 2), 3.0, None)}
    lines = health.format_lines(report | {"world_size": 4})
    assert [line.split(":")[0] for line in lines] == ["device health", "slow node"]
    quiet = _cpu([160.0, 165.0, 150.0, 158.0], [5.0, 6.0, 4.0, 4.5])  # nothing named: the verdict says so
    report = {"device_health": health.section(_ranks(quiet, ["head"] * 2 + ["worker"] * 2), 3.0, None)}
    assert health.format_lines(report | {"world_size": 4})[-1] == "verdict: no slow device"


def test_nodes_within_the_factor_are_not_named_and_the_line_says_how_far_the_slowest_is() -> None:
    figures = _cpu([80.0, 70.0, 40.0, 45.0], [5.0, 6.0, 4.0, 4.5])  # 1.8x apart: a busy machine's noise
    part = health.section(_ranks(figures, ["head", "head", "worker", "worker"]), 3.0, None)
    assert part["slow_nodes"] == []
    assert health.node_lines(part) == [
        "verdict: no slow node (the slowest: worker (ranks 2, 3): 85.0 GFLOP/s against head's 150.0, 1.8x below it "
        "in the median round; a node is named at 2x or more in most rounds)"
    ]


def test_one_node_has_no_node_verdict_and_every_slow_node_is_named() -> None:
    one = health.section(_ranks(_cpu([80.0, 70.0, 75.0], [5.0] * 3), ["a"] * 3), 3.0, None)
    assert one["slowest_node"] is None and health.node_lines(one) == []
    three = _cpu([80.0, 20.0, 25.0], [5.0, 5.0, 5.0])  # 2 of 3 nodes at a quarter: both named against the fastest
    part = health.section(_ranks(three, ["a", "b", "c"]), 3.0, None)
    assert [n["host"] for n in part["slow_nodes"]] == ["b", "c"]


def test_a_gpu_rank_is_judged_by_the_rule_alone_a_cpu_rank_below_a_third_too() -> None:
    # Below the outlier rule's median / 1.95 but not below a third: named on GPUs (no shared cores), not on CPUs.
    gpu = health.judge(_figures([700e12, 690e12, 710e12, 300e12]))
    assert [s.rank for s in gpu.slow] == [3]
    cpu = health.judge(_cpu([70.0, 69.0, 71.0, 30.0], [5.0] * 4), floor=health.CPU_RANK_FLOOR)
    assert cpu.slow == []


def test_a_gpu_below_a_third_of_its_data_sheet_peak_fails_whatever_the_others_read() -> None:
    # One H200 alone (no rank rule, no node rule): 212 TFLOP/s is below 989.4 / 3; 672 (measured) is not.
    ranks = [
        {"rank": 0, "host": "n", "device": "cuda:0", "device_name": "NVIDIA H200", "health": dataclasses.asdict(f)}
        for f in _figures([212e12])
    ]
    part = health.section(ranks, 3.0, None)
    assert [(e["rank"], e["peak"]) for e in part["below_peak"]] == [(0, 989.4e12)]
    report = {"device_health": part, "world_size": 1}
    assert "slow: rank 0 on n (cuda:0): 212.0 TFLOP/s, below 1/3 of the data sheet (H200)'s bf16 peak of 989.4" in (
        health.format_lines(report)
    )
    assert [f["ranks"] for f in health.failures(report)] == [[0]]
    ranks[0]["health"]["flops"] = 672e12
    assert health.section(ranks, 3.0, None)["below_peak"] == []
    ranks[0]["device_name"] = "Some Other GPU"  # no data sheet known: not judged against one
    ranks[0]["health"]["flops"] = 1e12
    assert health.section(ranks, 3.0, None)["below_peak"] == []


# --- the rules on recorded clusters (golden/check/README.md) --------------------------------------

GOLDEN = Path(__file__).parent / "golden" / "check"


def recorded(name: str) -> list[dict]:
    """The gathered rank reports of a recorded ``app check`` (its --json), as health.section reads them."""
    report = json.loads((GOLDEN / name).read_text())
    part = report["device_health"]
    shape = {"dtype": part["dtype"], "matmul_size": part["matmul_size"], "copy_bytes": part["copy_bytes"]}
    return [
        r
        | {
            "health": shape
            | {"device": r["device"], "flops": r["matmul_flops"], "copy_gbps": r["copy_gbps"], "seconds": 2.0}
            | {"flops_rounds": r.get("matmul_flops_rounds") or (), "copy_gbps_rounds": r.get("copy_gbps_rounds") or ()}
        }
        for r in report["ranks"]
    ]


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("undisturbed-*.json")))
def test_a_recorded_undisturbed_cluster_names_nothing(name: str) -> None:
    part = health.section(recorded(name), outliers.DEFAULT_K, None)
    assert part["slow_nodes"] == [] and part["slow"] == [], part


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("worker-at-*.json")))
def test_a_recorded_worker_at_a_third_or_a_tenth_of_a_cpu_is_named_as_a_node_and_only_it(name: str) -> None:
    ranks = recorded(name)
    part = health.section(ranks, outliers.DEFAULT_K, None)
    worker = ranks[2]["host"]
    assert part["slow_nodes"] and {(n["host"], tuple(n["ranks"])) for n in part["slow_nodes"]} == {(worker, (2, 3))}
    assert part["slow"] == []  # half the ranks are slow: the rule over ranks names none of them


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*-loops-*.json")))
def test_recorded_rounds_are_judged_round_by_round_in_most_of_them(name: str) -> None:
    # Recorded with rounds (5 at the default 2 s): the worker at a third is slow in most rounds, nothing else is.
    part = health.section(recorded(name), outliers.DEFAULT_K, None)
    slowest = part["slowest_node"]
    assert slowest["rounds"] == health.SAMPLES
    assert (slowest["slow_rounds"] > health.SAMPLES // 2) == bool(part["slow_nodes"]) == name.startswith("worker-at-")


def test_nodes_are_compared_round_by_round_so_load_that_moves_between_rounds_names_nobody() -> None:
    # Equal nodes in every round but one (round 3, when load hit the head alone): the medians of the ranks' own
    # figures are 3.2x apart (30 against 95), the median round 1.05x.
    head = [100.0, 100.0, 30.0, 30.0, 30.0]
    worker = [95.0, 95.0, 95.0, 28.0, 28.0]
    assert sorted(worker)[2] / sorted(head)[2] >= health.NODE_FACTOR  # what judging the medians would name
    part = health.section(_ranks(_rounds([head, head, worker, worker]), ["h", "h", "w", "w"]), 3.0, None)
    assert part["slow_nodes"] == [] and part["slowest_node"]["factor"] < 1.1
    nodes = {
        (n.host, n.metric): n for n in health.judge_nodes(_rounds([head, head, worker, worker]), ["h"] * 2 + ["w"] * 2)
    }
    assert nodes["h", "flops"].slow_rounds == 1 and not nodes["h", "flops"].slow  # round 3 alone: 3.2x below


def test_a_node_slow_in_most_rounds_is_named_and_the_line_says_in_how_many() -> None:
    fast, slow = [90.0] * 5, [20.0, 20.0, 20.0, 85.0, 88.0]  # 4.5x below in 3 rounds of 5
    part = health.section(_ranks(_rounds([fast, fast, slow, slow]), ["h", "h", "w", "w"]), 3.0, None)
    [named] = part["slow_nodes"]
    assert (named["host"], named["rounds"], named["slow_rounds"]) == ("w", 5, 3)
    assert named["factor"] == pytest.approx(4.5)
    line = health.node_lines(part)[0]
    assert line.startswith("slow node: w (ranks 2, 3): 40.0 GFLOP/s against h's 180.0, 4.5x below it in the median")
    assert f"likely, {health.NODE_FACTOR:g}x or more in 3 of 5 round(s)" in line
    always = health.section(_ranks(_rounds([fast, fast, [20.0] * 5, [20.0] * 5]), ["h", "h", "w", "w"]), 3.0, None)
    assert f": sure, {health.NODE_FACTOR:g}x or more in 5 of 5 round(s)" in health.node_lines(always)[0]
    twice = [20.0, 20.0, 85.0, 85.0, 88.0]  # slow in 2 rounds of 5: a busy moment, not a slow node
    part = health.section(_ranks(_rounds([fast, fast, twice, twice]), ["h", "h", "w", "w"]), 3.0, None)
    assert part["slow_nodes"] == [] and part["slowest_node"]["slow_rounds"] == 2


def test_cpu_nodes_with_different_rank_counts_are_judged_by_what_the_node_does_gpu_nodes_by_their_devices() -> None:
    # A fresh-clone make test's Ansible job of 2 + 1 ranks: node0's two ranks shared its cores (43.5 GFLOP/s a node
    # by the ranks' median, 87 in all) and node1's one had them alone (86.4): equal nodes, not a slow one.
    cpu = [
        DeviceHealth("cpu", "float32", 512, f * 1e9, 64 << 20, c, 2.0, (f * 1e9,) * 5, (c,) * 5)
        for f, c in ((43.5, 2.0), (43.5, 2.0), (86.4, 4.1))
    ]
    part = health.section(_ranks(cpu, ["node0", "node0", "node1"]), 3.0, None)
    assert part["slow_nodes"] == [] and part["slowest_node"]["factor"] < 1.1
    assert health.node_figure([43.5, 43.5], "cpu") == 87.0
    # On GPUs each rank has a device: a node is as fast as its devices, not their count.
    assert health.node_figure([700e12, 700e12], "cuda:0") == pytest.approx(700e12)
