"""Statistics against hand computation and scipy's own t-tests."""

from __future__ import annotations

import pytest
from scipy import stats as scipy_stats

from ampft.benchmark import stats


def test_describe_median_and_quartiles():
    d = stats.describe([4.0, 1.0, 3.0, 2.0, 100.0])
    assert (d["n"], d["median"], d["min"], d["max"]) == (5, 3.0, 1.0, 100.0)
    assert (d["q1"], d["q3"], d["iqr"]) == (2.0, 4.0, 2.0)  # robust to the one slow step
    assert d["mean"] == 22.0 and d["std"] == pytest.approx(43.61, abs=0.01)
    one = stats.describe([2.5])
    assert (one["median"], one["iqr"], one["std"]) == (2.5, 0.0, None)
    with pytest.raises(ValueError):
        stats.describe([])


def test_paired_difference_ci_by_hand_and_scipy():
    base = {1: 0.90, 2: 0.92, 3: 0.93}
    arm = {1: 0.91, 2: 0.93, 3: 0.92}
    d = stats.difference_ci(arm, base)
    # differences +0.01, +0.01, -0.01: mean 0.00333, sd 0.011547, t(0.975, 2) = 4.302653
    half = 4.302653 * 0.0115470 / 3**0.5
    assert d["n"] == 3
    assert d["mean"] == pytest.approx(0.0033333, abs=1e-6)
    assert (d["ci_low"], d["ci_high"]) == (pytest.approx(0.0033333 - half, abs=1e-5),
                                           pytest.approx(0.0033333 + half, abs=1e-5))
    ci = scipy_stats.ttest_rel([0.91, 0.93, 0.92], [0.90, 0.92, 0.93]).confidence_interval()
    assert (d["ci_low"], d["ci_high"]) == (pytest.approx(ci.low), pytest.approx(ci.high))


def test_degenerate_cases():
    assert stats.difference_ci({1: 0.91, 2: 0.93}, {4: 0.90, 5: 0.92}) is None  # no seed shared: nothing paired
    single = stats.difference_ci({1: 0.9, 2: 0.7}, {1: 0.8, 3: 0.6})  # seed 1 only
    assert single["n"] == 1 and single["mean"] == pytest.approx(0.1) and single["ci_low"] is None  # no interval
    same = stats.difference_ci({1: 1.0, 2: 1.0}, {1: 1.0, 2: 1.0})
    assert (same["mean"], same["ci_low"], same["ci_high"]) == (0.0, 0.0, 0.0)
    assert stats.ratio(1.0, 0) is None and stats.ratio(3.0, 4.0) == 0.75
