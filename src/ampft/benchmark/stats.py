"""Summary statistics: median and spread of step times, mean/std over seeds, and a t-based confidence
interval of an arm's difference to the baseline (its t quantile from SciPy, the `metrics` extra, imported
only when an interval is computed)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from ampft.extras import require


def _t_ppf(q: float, dof: float) -> float:
    return float(require("scipy.stats", "metrics", "the benchmark's confidence intervals (accuracy mode, "
                         "two or more seeds)").t.ppf(q, dof))


def describe(values: Sequence[float]) -> dict[str, float | int | None]:
    """n, median, quartiles (linear interpolation), IQR, min, max, mean, std (n-1; None for n < 2)."""
    xs = sorted(float(v) for v in values)
    if not xs:
        raise ValueError("describe() needs at least one value")
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
    return dict(
        n=len(xs),
        median=statistics.median(xs),
        q1=q1,
        q3=q3,
        iqr=q3 - q1,
        min=xs[0],
        max=xs[-1],
        mean=statistics.fmean(xs),
        std=statistics.stdev(xs) if len(xs) > 1 else None,
    )


def difference_ci(arm: dict[int, float], base: dict[int, float], confidence: float = 0.95) -> dict:
    """Mean of arm - base with a t-based confidence interval.

    Paired over the seeds both have (the same seed means the same initialisation and data order in every
    arm, so the pairing removes the seed's effect); Welch's unpaired interval when no seed is shared.
    The interval is None when there are too few runs (n < 2) for a variance.
    """
    shared = sorted(set(arm) & set(base))
    if shared:
        d = [arm[s] - base[s] for s in shared]
        n = len(d)
        mean = statistics.fmean(d)
        if n < 2:
            return dict(method="paired", n=n, mean=mean, ci_low=None, ci_high=None, confidence=confidence)
        half = _t_ppf(0.5 + confidence / 2, n - 1) * statistics.stdev(d) / math.sqrt(n)
        return dict(method="paired", n=n, mean=mean, ci_low=mean - half, ci_high=mean + half,
                    confidence=confidence)
    x, y = list(arm.values()), list(base.values())
    mean = statistics.fmean(x) - statistics.fmean(y) if x and y else None
    if len(x) < 2 or len(y) < 2:
        return dict(method="welch", n=min(len(x), len(y)), mean=mean, ci_low=None, ci_high=None,
                    confidence=confidence)
    vx, vy = statistics.variance(x) / len(x), statistics.variance(y) / len(y)
    if vx + vy == 0:
        return dict(method="welch", n=min(len(x), len(y)), mean=mean, ci_low=mean, ci_high=mean,
                    confidence=confidence)
    dof = (vx + vy) ** 2 / (vx**2 / (len(x) - 1) + vy**2 / (len(y) - 1))
    half = _t_ppf(0.5 + confidence / 2, dof) * math.sqrt(vx + vy)
    return dict(method="welch", n=min(len(x), len(y)), mean=mean, ci_low=mean - half, ci_high=mean + half,
                confidence=confidence)


def ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return value / base
