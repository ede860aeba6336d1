"""The robust outlier rule of ``app links`` (link bandwidth) and ``app check`` (device throughput).

    rule = judge_values([9.8, 10.1, 4.2, 10.0], k=3)      # rule.threshold: 5.05; 4.2 is below it
    slow = [i for i, v in enumerate(values) if rule.is_slow(v)]

The rule works on the logarithm of the figures, since a slow part is slow by a factor and the noise
of a measurement is a fraction of it: a figure is slow when it is below median / s^k, with
s = max(exp(1.4826 x MAD of ln figures), 1.25) (median: the geometric one; MAD: median absolute
deviation; 1.4826 x MAD estimates the standard deviation of normal noise; k: 3 by default). The
floor 1.25 keeps steady figures from flagging small differences: with k = 3 a figure is slow only
below median / 1.95, about half the median, or lower where the figures are noisy. It holds while
fewer than half the figures are slow. ``--fail-below FRACTION`` is the plain cut: below FRACTION x
the median.
"""

import math
import statistics
from dataclasses import dataclass

from app.errors import UsageError

MAD_SCALE = 1.4826
"""MAD x this estimates the standard deviation of normally distributed noise."""
MIN_SPREAD = 1.25
"""s, the factor per k of the rule, is at least this."""
DEFAULT_K = 3.0
"""Deviations below the median that make a figure slow."""


@dataclass(frozen=True)
class Rule:
    """The rule's figures over one set of measurements."""

    median: float
    """Geometric median of the figures."""
    mad_log: float
    """Median absolute deviation of their logarithms."""
    spread: float | None
    """s: max(exp(1.4826 x mad_log), 1.25); None when the rule does not judge (too few figures)."""
    threshold: float | None
    """median / s^k: below it a figure is slow; None when the rule does not judge."""

    def is_slow(self, value: float) -> bool:
        """Whether ``value`` is below the threshold (never, when the rule does not judge)."""
        return self.threshold is not None and value < self.threshold


def judge_values(values: list[float], k: float, judged: bool = True) -> Rule:
    """The rule over ``values``; ``judged`` False gives the median and MAD only (too few to judge)."""
    logs = [math.log(max(v, 1e-12)) for v in values] or [0.0]
    center = statistics.median(logs)
    mad_log = statistics.median(abs(x - center) for x in logs)
    if not judged:
        return Rule(math.exp(center), mad_log, None, None)
    spread = max(math.exp(MAD_SCALE * mad_log), MIN_SPREAD)
    return Rule(math.exp(center), mad_log, spread, math.exp(center) / spread**k)


def slow_as_a_group(group: list[float], others: list[float], k: float) -> bool:
    """Whether ``group`` (one part's figures: a node's links in one direction) is slow as a whole against
    ``others`` (the figures that do not involve the part): its geometric mean below the others' median /
    s^(k / sqrt(len(group))), and each of its figures below median / s^(k / 2), with the others' median and s.
    The mean of m figures has 1/sqrt(m) of one figure's noise, so a part at half speed is told apart in every
    run, where its single figures straddle the one-figure threshold; s from the others alone keeps the slow
    part's own figures from widening the rule (with 3 nodes they are a third of all links); the second
    condition keeps one very slow figure from condemning its whole group. Fewer others than the group has
    figures judge nothing: one other figure (3 nodes, one already named) is its own noise, not a median."""
    if not group or len(others) < len(group):
        return False
    rule = judge_values(others, k)
    mean = math.exp(statistics.fmean(math.log(max(v, 1e-12)) for v in group))
    every = all(v < rule.median / rule.spread ** (k / 2) for v in group)
    return every and mean < rule.median / rule.spread ** (k / math.sqrt(len(group)))


def formula(rule: Rule, k: float, unit: str) -> str:
    """The rule with its figures, in one line: ``median / s^k = ... ; s = ...``."""
    return (
        f"median / s^k = {rule.median:.3f} / {rule.spread:.3f}^{k:g} = {rule.threshold:.3f} {unit}; "
        f"s = max(e^({MAD_SCALE} x MAD of ln {unit}), {MIN_SPREAD:g}) = max(e^({MAD_SCALE} x {rule.mad_log:.3f}), "
        f"{MIN_SPREAD:g}), k = {k:g}"
    )


def check_k(k: float) -> None:
    """--k must be a positive number of deviations."""
    if k <= 0:
        raise UsageError(f"--k {k} must be a positive number of deviations (3 is usual)")


def check_fraction(fraction: float | None) -> None:
    """--fail-below must be a fraction of the median in (0, 1]."""
    if fraction is not None and not 0 < fraction <= 1:
        raise UsageError(f"--fail-below {fraction} must be a fraction of the median in (0, 1], e.g. 0.5")
