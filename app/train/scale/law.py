"""The scaling law of data-parallel training, fitted to measured times (pure arithmetic: no torch).

A job of fixed size (an epoch of D samples) on N ranks that each take B samples per step runs
D / (B N) steps: with the time of one step split into compute and the gradient communication,

    T_N = T_1 / N + T_comm(N)                 (the whole job; the seed's law)
    t_N = t_1 + c_N                           (one step: T_N = D / (B N) * t_N, T_1 = D / B * t_1)

where t_1 is one rank's compute per step and c_N what the gradient all-reduce adds to a step on
N ranks. A ring all-reduce of S bytes takes

    a_N = 2 (N - 1) / N * S / busbw + latency   (a_1 = 0: one rank sends nothing)

(busbw in nccl-tests' sense). ``fit_link`` fits busbw and latency to all-reduces timed at several
sizes and world sizes; ``fit_scaling`` fits t_1 and the exposed fraction k in c_N = k a_N to the
step times by least squares. k = 1: every step waits for a plain all-reduce of its gradients;
smaller when buckets overlap with backward or a comm hook sends fewer bytes; 0 when steps do not
grow with N at all. Speed-up is N t_1 / t_N (samples/s against one rank), efficiency speed-up / N.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

LARGEST_WORLD = 1 << 20
"""The model's answers stop here: "any N" means any N up to about a million ranks."""


def ring_factor(world_size: int) -> float:
    """2 (N - 1) / N: the share of the bytes each rank sends (and receives) in a ring all-reduce."""
    return 2.0 * (world_size - 1) / world_size


def _least_squares(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) of the straight line through (xs, ys) by least squares; slope 0 when xs do not vary."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def _through_origin(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The slope of the line through the origin that fits (xs, ys) best."""
    sxx = sum(x * x for x in xs)
    return sum(x * y for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0


@dataclass(frozen=True)
class AllReduceSample:
    """One timed all-reduce."""

    world_size: int
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class Link:
    """The all-reduce cost model: a_N(S) = 2 (N - 1) / N * S / busbw + latency."""

    busbw: float
    """Bus bandwidth in bytes/s."""
    latency: float
    """Seconds per all-reduce beyond the bytes."""

    def seconds(self, world_size: int, nbytes: float) -> float:
        """Predicted time of one all-reduce of ``nbytes`` on ``world_size`` ranks."""
        if world_size <= 1:
            return 0.0
        return ring_factor(world_size) * nbytes / self.busbw + self.latency


def fit_link(samples: Sequence[AllReduceSample]) -> Link:
    """busbw and latency from all-reduces timed at two or more sizes (or world sizes).

    Both are kept positive: when the best straight line has a negative latency, or times that do
    not grow with the bytes (a noisy machine), latency is 0 and busbw fits all the time. Raises
    ValueError without two distinct 2 (N - 1) / N * S.
    """
    points = [(ring_factor(s.world_size) * s.nbytes, s.seconds) for s in samples if s.world_size > 1]
    if len({x for x, _ in points}) < 2:
        raise ValueError("fitting busbw and latency needs all-reduces of at least two sizes on more than one rank")
    xs, ys = [x for x, _ in points], [y for _, y in points]
    latency, per_byte = _least_squares(xs, ys)
    if latency < 0 or per_byte <= 0:  # noise hid one of them: every second goes to the bytes
        latency, per_byte = 0.0, _through_origin(xs, ys)
    if per_byte <= 0:
        raise ValueError("all-reduce times are not positive: nothing to fit")
    return Link(busbw=1.0 / per_byte, latency=latency)


@dataclass(frozen=True)
class StepSample:
    """The measured time of one training step on ``world_size`` ranks (the median of several)."""

    world_size: int
    seconds: float


@dataclass(frozen=True)
class ScalingFit:
    """t_N = t_1 + k * a_N, fitted: the law's parameters and what they predict."""

    t1: float
    """One rank's time per step (compute only), seconds."""
    exposed: float
    """k: the fraction of a plain all-reduce of the gradients that a step waits for (>= 0)."""
    link: Link
    nbytes: int
    """S: the gradient bytes of one step."""
    rms_error: float
    """Root mean square of measured minus predicted step times, seconds."""

    def comm(self, world_size: int) -> float:
        """c_N: seconds that gradient communication adds to a step on ``world_size`` ranks."""
        return self.exposed * self.link.seconds(world_size, self.nbytes)

    def step(self, world_size: int) -> float:
        """Predicted seconds per step."""
        return self.t1 + self.comm(world_size)

    def efficiency(self, world_size: int) -> float:
        """Predicted speed-up over N: t_1 / t_N."""
        return self.t1 / self.step(world_size)

    def speedup(self, world_size: int) -> float:
        """Predicted samples/s on N ranks over one rank's: N t_1 / t_N."""
        return world_size * self.efficiency(world_size)

    @property
    def efficiency_limit(self) -> float:
        """Efficiency as N grows without bound: t_1 / (t_1 + k (2 S / busbw + latency))."""
        return self.t1 / (self.t1 + self.exposed * (2 * self.nbytes / self.link.busbw + self.link.latency))

    def largest_world(self, threshold: float = 0.5) -> int | None:
        """The largest N whose predicted efficiency is >= ``threshold``; None when every N keeps it."""
        if self.efficiency_limit >= threshold:
            return None
        # k (2 (N-1)/N S / busbw + latency) <= t_1 (1 - e) / e, with e the threshold; solve for (N-1)/N.
        budget = self.t1 * (1 - threshold) / threshold - self.exposed * self.link.latency
        if budget < 0:
            return 1
        share = budget * self.link.busbw / (2 * self.exposed * self.nbytes)  # (N - 1) / N allowed, < 1 here
        largest = max(1, math.floor(1 / (1 - share) + 1e-9))
        return min(largest, LARGEST_WORLD)


def fit_scaling(steps: Sequence[StepSample], link: Link, nbytes: int) -> ScalingFit:
    """Fit t_N = t_1 + k a_N to measured step times by least squares (k >= 0).

    Raises ValueError without two distinct world sizes, or when no positive t_1 fits (steps that
    grow with N far faster than the all-reduce does: more ranks than cores, say).
    """
    if len({s.world_size for s in steps}) < 2:
        raise ValueError("fitting the scaling law needs step times at two or more world sizes")
    xs = [link.seconds(s.world_size, nbytes) for s in steps]
    ys = [s.seconds for s in steps]
    t1, exposed = _least_squares(xs, ys)
    if exposed < 0:
        t1, exposed = sum(ys) / len(ys), 0.0
    if t1 <= 0:
        raise ValueError("no positive compute time fits: step times grow with N far faster than the all-reduce")
    rms = math.sqrt(sum((y - (t1 + exposed * x)) ** 2 for x, y in zip(xs, ys, strict=True)) / len(ys))
    return ScalingFit(t1=t1, exposed=exposed, link=link, nbytes=nbytes, rms_error=rms)
