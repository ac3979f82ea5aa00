"""Summary statistics of step times and seeds, and a t-based confidence interval of an arm's difference to
the baseline (SciPy's t quantile: the `metrics` extra, imported only when an interval is computed)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from ampft.extras import require


def t_ppf(q: float, dof: float) -> float:
    return float(require("scipy.stats", "metrics", "the benchmark's confidence intervals (accuracy mode, "
                         "two or more seeds)").t.ppf(q, dof))


def describe(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, median, quartiles (linear interpolation), IQR, min, max, mean, std (n-1; None for n < 2)."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("describe() needs at least one value")
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
    return dict(n=len(xs), median=statistics.median(xs), q1=q1, q3=q3, iqr=q3 - q1, min=xs[0], max=xs[-1],
                mean=statistics.fmean(xs), std=statistics.stdev(xs) if len(xs) > 1 else None)


def difference_ci(arm: dict[int, float], base: dict[int, float], confidence: float = 0.95) -> dict:
    """Mean of arm - base with a t-based confidence interval (None with fewer than two runs).

    Paired over the seeds both have (the same seed means the same initialisation and data order in every
    arm, so the pairing removes the seed's effect); Welch's unpaired interval when no seed is shared.
    """
    q, half = 0.5 + confidence / 2, None
    shared = sorted(set(arm) & set(base))
    if shared:
        d = [arm[s] - base[s] for s in shared]
        method, n, mean = "paired", len(d), statistics.fmean(d)
        if n >= 2:
            half = t_ppf(q, n - 1) * statistics.stdev(d) / math.sqrt(n)
    else:
        x, y = list(arm.values()), list(base.values())
        method, n = "welch", min(len(x), len(y))
        mean = statistics.fmean(x) - statistics.fmean(y) if x and y else None
        if n >= 2:
            vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
            half = 0.0  # no spread at all: the interval is the mean
            if vx + vy > 0:
                dof = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
                half = t_ppf(q, dof) * math.sqrt(vx + vy)
    low, high = (None, None) if half is None else (mean - half, mean + half)
    return dict(method=method, n=n, mean=mean, ci_low=low, ci_high=high, confidence=confidence)


def ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None
