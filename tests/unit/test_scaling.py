"""The scaling law's fit (app/train/scale/law.py) recovers what made synthetic timings, noise and all."""

import random

import pytest

from app.train.scale.law import AllReduceSample, Link, StepSample, fit_link, fit_scaling, ring_factor

S = 814_120  # the seed MLP's gradient bytes
T1 = 5.7e-3
LINK = Link(busbw=2.5e8, latency=3e-4)
WORLDS = (1, 2, 4, 8)
NOISE = 0.03  # 3% multiplicative noise, like medians on a busy machine


def _noisy(value: float, rng: random.Random) -> float:
    return value * (1 + rng.gauss(0, NOISE))


def _allreduces(rng: random.Random) -> list[AllReduceSample]:
    return [
        AllReduceSample(n, size, _noisy(LINK.seconds(n, size), rng))
        for n in WORLDS[1:]
        for size in (S // 64, S // 8, S)
        for _ in range(3)
    ]


def _steps(rng: random.Random, exposed: float) -> list[StepSample]:
    return [StepSample(n, _noisy(T1 + exposed * LINK.seconds(n, S), rng)) for n in WORLDS for _ in range(5)]


@pytest.mark.parametrize("seed", range(5))
def test_the_fit_recovers_t1_and_the_communication_time(seed: int) -> None:
    rng = random.Random(seed)
    link = fit_link(_allreduces(rng))
    assert link.busbw == pytest.approx(LINK.busbw, rel=0.05)
    fit = fit_scaling(_steps(rng, exposed=1.0), link, S)
    assert fit.t1 == pytest.approx(T1, rel=0.05)
    for n in WORLDS[1:]:
        assert fit.comm(n) == pytest.approx(LINK.seconds(n, S), rel=0.05), n
    assert fit.exposed == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("seed", range(5))
def test_steps_without_a_communication_term_fit_none(seed: int) -> None:
    # Negative control: the same link, but steps that do not grow with N.
    rng = random.Random(seed)
    fit = fit_scaling(_steps(rng, exposed=0.0), fit_link(_allreduces(rng)), S)
    assert fit.t1 == pytest.approx(T1, rel=0.05)
    assert all(fit.comm(n) < 0.05 * T1 for n in WORLDS), [fit.comm(n) for n in WORLDS]
    assert fit.largest_world() is None  # nothing to lose: every N keeps its efficiency


def test_half_the_exposure_is_seen_as_half() -> None:
    fit = fit_scaling(_steps(random.Random(7), exposed=0.5), fit_link(_allreduces(random.Random(8))), S)
    assert fit.exposed == pytest.approx(0.5, rel=0.1)


def test_largest_world_at_half_efficiency() -> None:
    # a_2 = 3.8 ms, so a_N = 2 (N-1)/N * 3.8 ms; with t_1 = 6 ms: e(4) = 6/11.7 >= 0.5 > e(5) = 6/12.08.
    fit = fit_scaling([StepSample(1, 6e-3), StepSample(2, 9.8e-3)], Link(busbw=S / 3.8e-3, latency=0.0), S)
    assert fit.exposed == pytest.approx(1.0) and fit.t1 == pytest.approx(6e-3)
    assert fit.largest_world() == 4
    assert fit.efficiency(4) >= 0.5 > fit.efficiency(5)
    assert fit.speedup(4) == pytest.approx(4 * fit.efficiency(4))
    assert fit.efficiency_limit == pytest.approx(6 / (6 + 7.6))
    assert fit.largest_world(threshold=0.3) is None  # the limit, 44%, stays above 30%


def test_latency_alone_can_stop_scaling() -> None:
    fit = fit_scaling([StepSample(1, 1e-3), StepSample(2, 3e-3)], Link(busbw=1e12, latency=2e-3), S)
    assert fit.largest_world() == 1


def test_times_that_do_not_grow_with_the_bytes_go_to_bandwidth() -> None:
    link = fit_link([AllReduceSample(2, S, 1e-3), AllReduceSample(2, 8 * S, 1e-4)])
    assert link.latency == 0.0 and link.busbw == pytest.approx((S**2 + 64 * S**2) / (S * 1e-3 + 8 * S * 1e-4))


def test_ring_factor() -> None:
    assert [ring_factor(n) for n in (1, 2, 4)] == [0.0, 1.0, 1.5]


def test_what_cannot_be_fitted_says_why() -> None:
    with pytest.raises(ValueError, match="two sizes"):
        fit_link([AllReduceSample(2, S, 1e-3), AllReduceSample(1, 8, 1e-6)])
    with pytest.raises(ValueError, match="two or more world sizes"):
        fit_scaling([StepSample(2, 1e-3), StepSample(2, 1.1e-3)], LINK, S)
    with pytest.raises(ValueError, match="positive compute time"):
        fit_scaling([StepSample(2, 1e-3), StepSample(4, 1e-1)], Link(busbw=1e12, latency=1e-6), S)
