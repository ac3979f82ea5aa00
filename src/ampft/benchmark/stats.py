"""Summary statistics of step times and seeds, and a t-based confidence interval of an arm's difference to
the baseline, paired by seed (SciPy's t quantile: the `metrics` extra, imported only when an interval is
computed)."""

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


def difference_ci(arm: dict[int, float], base: dict[int, float], confidence: float = 0.95) -> dict | None:
    """Mean of arm - base over the seeds both have a value for, with a t-based confidence interval (None with
    fewer than two); None when they share no seed. The same seed means the same initialisation and data order
    in every arm, so the pairing removes the seed's effect; every arm runs every seed (`combine` refuses one
    missing), so only a diverged run leaves a seed unpaired."""
    if not (d := [arm[s] - base[s] for s in sorted(set(arm) & set(base))]):
        return None
    mean, low, high = statistics.fmean(d), None, None
    if len(d) > 1:
        half = t_ppf(0.5 + confidence / 2, len(d) - 1) * statistics.stdev(d) / math.sqrt(len(d))
        low, high = mean - half, mean + half
    return dict(n=len(d), mean=mean, ci_low=low, ci_high=high, confidence=confidence)


def ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None
