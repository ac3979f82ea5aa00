"""The benchmark's time budget (`benchmark.budget_minutes`): project each arm's cost from its measured step
time, cut what would not fit, and say what was cut and why. The policy (nothing is cut unmeasured; accuracy
runs go seed by seed so a cut keeps complete pairs): docs/benchmarks/README.md#the-time-budget.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

SPEED_SHARE = 0.5  # of the budget, for speed mode when accuracy mode follows
CLOCK: Callable[[], float] = time.monotonic  # the budget's clock (tests replace it)


def fmt_seconds(s: float | None) -> str:
    """'45 s', '3 min 05 s', 'unknown'."""
    if s is None or not math.isfinite(s):
        return "unknown"
    s = max(0, round(s))
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"


def slower(ratio: float | None, baseline: str) -> str:
    """'21x slower than fp32', '1.6x faster than fp32', 'about as fast as fp32'."""
    if ratio is None:
        return f"speed relative to {baseline} unknown"
    if ratio >= 1.05:
        return f"{ratio:.{0 if ratio >= 10 else 1}f}x slower than {baseline}"
    if ratio <= 0.95:
        return f"{1 / ratio:.1f}x faster than {baseline}"
    return f"about as fast as {baseline}"


class Budget:
    """Wall-clock seconds since the benchmark started, against `minutes` (None: no budget, nothing is cut)."""

    def __init__(self, minutes: float | None, clock: Callable[[], float] | None = None):
        self.seconds = None if minutes is None else 60.0 * minutes
        self.clock = clock or CLOCK
        self.start = self.clock()
        self.cuts: list[dict] = []

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self, share: float = 1.0) -> float:
        """Seconds left of `share` of the budget (inf without a budget)."""
        return math.inf if self.seconds is None else share * self.seconds - self.elapsed()

    def cut(self, arm: str, mode: str, action: str, detail: str, reason: str) -> None:
        """Record a cut: mode speed|sweep|accuracy, action skipped|shortened; detail says what remained."""
        self.cuts.append(dict(arm=arm, mode=mode, action=action, detail=detail, reason=reason,
                              at_seconds=round(self.elapsed(), 1)))

    def summary(self) -> dict:
        used, total = self.elapsed(), self.seconds
        return dict(minutes=None if total is None else total / 60, seconds_used=round(used, 1),
                    within=None if total is None else used <= total, speed_share=SPEED_SHARE, cuts=self.cuts)


# --- speed mode -----------------------------------------------------------------------------------

def sweep_cost(step: float, batch_size: int, sizes: list[int], steps: int) -> float:
    """The memory sweep's projected seconds: step time scaled linearly with the batch."""
    return sum(step * bs / batch_size * steps for bs in sizes)


def fit_after_pilot(left: float, step: float, first_steps: int, reserve: float) -> bool:
    """Whether `first_steps` (warm-up and probe) at `step` s fit in `left` s, less `reserve` for unmeasured arms."""
    return first_steps * step <= left - reserve


def fit_after_probe(left: float, step: float, more_steps: int, sweep: float, reserve: float) -> tuple[int, bool]:
    """(timed steps to add after the probe, whether to sweep) within `left` seconds less `reserve`: the
    sweep goes first, then steps."""
    room = left - reserve
    if more_steps * step + sweep <= room:
        return more_steps, True
    if step <= 0:
        return more_steps, False
    return max(0, min(more_steps, int(room // step))), False


# --- accuracy mode --------------------------------------------------------------------------------

def seed_major(arms: list[str], seeds: list[int], baseline: str) -> list[tuple[str, int]]:
    """The run order: every arm's seed 1 (baseline first), then seed 2, ..."""
    order = [baseline] + [a for a in arms if a != baseline]
    return [(a, s) for s in seeds for a in order]


def plan_accuracy(left: float, pending: list[tuple[str, int]], per_run: dict[str, float], baseline: str,
                  seeds_done: set[int]) -> tuple[list[tuple[str, int]], list[tuple[str, str | int]]]:
    """The pending runs to keep (in order) within `left` seconds, and the drops in the order made:
    ("arm", name) or ("seed", seed). per_run: the projected seconds of one run of each pending arm."""
    keep = list(pending)
    drops: list[tuple[str, str | int]] = []
    while keep and sum(per_run[a] for a, _ in keep) > left:
        others = sorted({a for a, _ in keep if a != baseline}, key=lambda a: -per_run[a])
        pending_seeds = {s for _, s in keep}
        seeds = sorted(pending_seeds | seeds_done)
        last = seeds[-1] if seeds[-1] in pending_seeds else None
        if len(others) > 1:
            drop = [("arm", others[0])]
        elif last is not None and len(seeds) > 2:
            drop = [("seed", last)]
        elif others:  # the baseline's pending runs would compare with nothing
            drop = [("arm", others[0])] + [("arm", baseline)] * any(a == baseline for a, _ in keep)
        elif last is not None and len(seeds) > 1:
            drop = [("seed", last)]
        else:
            break  # what is left runs over the budget
        drops += drop
        keep = [(a, s) for a, s in keep if ("arm", a) not in drop and ("seed", s) not in drop]
    return keep, drops
