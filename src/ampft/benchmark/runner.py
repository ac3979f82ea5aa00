"""check → speed arms → accuracy arms × seeds (in this process, or each in its own: the Trainer's, and every run
with accuracy.isolate) → statistics, claims and targets → results.json/csv, report.md, PNGs, rewritten after every
seed so that a benchmark stopped midway keeps what it measured.

The time budget (`benchmark.budget_minutes`; docs/benchmarks/README.md#the-time-budget): speed mode may use
`SPEED_SHARE` of it when accuracy mode follows, shared equally by the speed arms not yet measured (`measure_arm`
fits an arm's steps and sweep into its share); before each accuracy run the rest is projected from the runs so far
and the slowest arms' remaining runs are cut until it fits. Every cut is recorded with its reason for the report.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from ampft.benchmark import environment, results
from ampft.benchmark.accuracy import epoch_flops, run_isolated, run_seed
from ampft.benchmark.config import CONF_DIR, Mode, Runner, arms_for, check
from ampft.benchmark.report import fmt_seconds, write_outputs
from ampft.benchmark.speed import measure_arm
from ampft.devices import cpu_fp16_note, cpu_half_support
from ampft.errors import BenchmarkConfigError
from ampft.estimate.run import predict_arms

log = logging.getLogger(__name__)

SPEED_SHARE = 0.5  # of the budget, for speed mode when accuracy mode follows
CLOCK = time.monotonic  # the budget's clock (tests replace it)


class Budget:
    """Wall-clock seconds since the benchmark started, against `minutes` (None: no budget, nothing is cut), and
    the cuts made to keep it."""

    def __init__(self, minutes: float | None):
        self.seconds = None if minutes is None else 60.0 * minutes
        self.start = CLOCK()
        self.cuts: list[dict] = []

    def elapsed(self) -> float:
        return CLOCK() - self.start

    def left(self, share: float = 1.0) -> float:
        """Seconds left of `share` of the budget (inf without a budget)."""
        return math.inf if self.seconds is None else share * self.seconds - self.elapsed()

    def cut(self, arm: str, mode: str, action: str, detail: str, reason: str) -> None:
        """Record a cut: mode speed|sweep|accuracy, action skipped|shortened; detail says what remained."""
        self.cuts.append(dict(arm=arm, mode=mode, action=action, detail=detail, reason=reason,
                              at_seconds=round(self.elapsed(), 1)))

    def summary(self) -> dict:
        used = self.elapsed()
        return dict(minutes=None if self.seconds is None else self.seconds / 60, seconds_used=round(used, 1),
                    within=None if self.seconds is None else used <= self.seconds, cuts=self.cuts)


class _Run:
    """One benchmark run: its config, arms' finetune configs, environment, budget and speed-mode step times."""

    def __init__(self, b: DictConfig, cfgs: dict, env: dict, budget: Budget):
        self.b, self.cfgs, self.env, self.budget = b, cfgs, env, budget
        self.acc_arms = arms_for(b, Mode.accuracy)
        self.steps: dict[str, float] = {}  # speed mode's step seconds: the timed median, else the pilot's projection
        self.pilots: dict[str, float] = {}

    def ratio(self, arm: str) -> float | None:
        """`arm`'s speed-mode step time over the baseline's."""
        mine, base = self.steps.get(arm), self.steps.get(self.b.baseline)
        return mine / base if mine and base else None

    def slower(self, arm: str) -> str:
        """E.g. "fp16: 21x slower than fp32 on this CPU (AMD EPYC) (no AVX512-FP16/AMX-FP16)": a half precision's
        CPU flags say why it may be slow."""
        env, base, r = self.env, self.b.baseline, self.ratio(arm)
        if arm == base:
            how = "the baseline"
        elif r is None:
            how = f"speed relative to {base} unknown"
        elif r >= 1.05:
            how = f"{r:.{0 if r >= 10 else 1}f}x slower than {base}"
        elif r <= 0.95:
            how = f"{1 / r:.1f}x faster than {base}"
        else:
            how = f"about as fast as {base}"
        precision = next(c for (_, name, _), c in self.cfgs.items() if name == arm).precision.name.value
        why = ""
        if env["device_type"] == "cpu" and precision in ("fp16", "bf16"):
            have, p = cpu_half_support(set(env.get("cpu_features") or []))[precision], precision.upper()
            why = f" (it has {', '.join(have)})" if have else f" (no AVX512-{p}/AMX-{p})"
        return f"{arm}: {how} on this {'CPU' if env['device_type'] == 'cpu' else 'GPU'} ({env['device_name']}){why}"

    def progress(self, what: str) -> None:
        limit = "" if self.budget.seconds is None else f" of a {fmt_seconds(self.budget.seconds)} budget"
        log.info("[%s%s] %s", fmt_seconds(self.budget.elapsed()), limit, what)


def run_benchmark(b: DictConfig, out_dir: Path, conf_dir: Path = CONF_DIR, command: str = "") -> Path:
    """Run every mode and arm of benchmark config `b` within its time budget; write everything into out_dir;
    return report.md."""
    budget = Budget(b.budget_minutes)  # the budget counts from the start, composing included
    cfgs = check(b, conf_dir)  # every problem before anything is measured
    cuda = torch.cuda.is_available() and not next(iter(cfgs.values())).trainer.cpu
    if b.gpu and not cuda:
        raise BenchmarkConfigError([f"benchmark={b.name} measures a GPU and this machine has none (or trainer.cpu="
                                    "true): use make benchmark on a CPU, or benchmark.gpu=false to run it here "
                                    "anyway (hours on a CPU, with no time budget)"])
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment.describe(torch.device("cuda" if cuda else "cpu"))
    run = _Run(b, cfgs, env, budget)
    log.info("benchmark %s on %s: modes %s, arms %s, budget %s", b.name, env["device_name"],
             [Mode(m).value for m in b.modes], [a.name for a in b.arms],
             "none" if b.budget_minutes is None else f"{b.budget_minutes:g} min")
    if env["device_type"] == "cpu":
        log.info("CPU half-precision support: %s", cpu_fp16_note(set(env["cpu_features"])))
    res: dict = dict(benchmark=OmegaConf.to_container(b, resolve=True, enum_to_str=True), environment=env,
                     command=command or f"python recipes/benchmark.py benchmark={b.name}", speed=None, accuracy=None)
    if speed_arms := arms_for(b, Mode.speed):
        res["speed"] = _speed_mode(run, speed_arms, out_dir)
    if run.acc_arms:
        _accuracy_mode(run, res, out_dir)
    if run.budget.left() < 0:
        log.warning("the benchmark took %s, over its budget of %s (benchmark.budget_minutes): see the report",
                    fmt_seconds(run.budget.elapsed()), fmt_seconds(run.budget.seconds))
    return _finish(run, res, out_dir)


def _speed_mode(run: _Run, arms: list[DictConfig], out_dir: Path) -> dict:
    """Measure the speed arms one after another, each within its share of the budget: results' `speed`."""
    b, raw = run.b, []
    for i, arm in enumerate(arms):
        share = run.budget.left(SPEED_SHARE if run.acc_arms else 1.0) / (len(arms) - i)
        run.progress(f"speed arm {i + 1}/{len(arms)}: {arm.name}"
                     + ("" if math.isinf(share) else f", {fmt_seconds(share)} of the budget for it"))
        sweeps = bool(b.sweep.batch_sizes) and (b.sweep.arms is None or arm.name in b.sweep.arms)
        with environment.OtherLoad() as other:
            r = measure_arm(run.cfgs[(Mode.speed.value, arm.name, None)], out_dir / "arms" / "speed" / arm.name,
                            b.speed.warmup_steps, b.speed.timed_steps, b.seed, b.sweep if sweeps else None,
                            seconds=None if math.isinf(share) else max(share, 0.0), skippable=arm.name != b.baseline)
        if r["pilot_step_seconds"] is not None:
            run.pilots[arm.name] = r["pilot_step_seconds"]
        run.steps[arm.name] = r["projected_step_seconds"] if r.get("skipped") else statistics.median(r["step_seconds"])
        budget_left = f"{fmt_seconds(share)} of speed mode's budget for this arm"
        if r.get("skipped"):
            run.budget.cut(arm.name, "speed", "skipped", f"pilot steps only ({r['pilot_step_seconds']:.2f} s a step "
                           f"at batch {max(1, r['batch_size'] // 4)})", f"{run.slower(arm.name)} in its pilot steps: "
                           f"{run.steps[arm.name]:.2f} s a full step, so not even its warm-up and two timed steps fit "
                           f"in the {budget_left}")
            continue
        why = f"{run.slower(arm.name)}: {run.steps[arm.name]:.2f} s a step, with {budget_left}"
        if (n := len(r["step_seconds"])) < b.speed.timed_steps:
            run.budget.cut(arm.name, "speed", "shortened", f"{n} of {b.speed.timed_steps} timed steps", why)
        if sweeps and not r["sweep"]:
            run.budget.cut(arm.name, "sweep", "skipped", "no memory sweep", why)
        raw.append(dict(arm=arm.name, other_cpu_share=other.share, **r))
    summaries = [results.summarize_speed_arm(r, run.env, OmegaConf.to_container(b.peak_tflops)) for r in raw]
    if run.env["device_type"] == "cuda":  # a GPU without a known peak: say how to get an MFU
        for source in sorted({a["peak_tflops_source"] for a in summaries if a["peak_tflops"] is None}):
            log.warning("no MFU: %s", source)
    results.add_speed_ratios(summaries, b.baseline)
    predicted = predict_arms({r["arm"]: run.cfgs[(Mode.speed.value, r["arm"], None)] for r in raw}, run.env)
    return dict(raw=raw, arms=summaries, predicted=predicted)


def _accuracy_mode(run: _Run, res: dict, out_dir: Path) -> None:
    """The accuracy runs seed by seed (every arm's first seed, the baseline first, then the second, ...: a cut
    keeps complete pairs), each within the budget; res["accuracy"] is summarized after every run and the outputs
    written after every seed (marked partial)."""
    b, cfgs = run.b, run.cfgs
    by_name, seeds, runs = {a.name: a for a in run.acc_arms}, list(b.accuracy.seeds), []
    names = [b.baseline, *(n for n in by_name if n != b.baseline)]
    pending = [(name, seed) for seed in seeds for name in names]
    seconds: dict[str, list[float]] = {}  # each arm's runs' wall seconds, for the budget's projections
    flops_of: dict[str, tuple[int, float] | None] = {}  # per model and data
    while pending := _fit_accuracy(run, pending, seconds, runs):
        arm_name, seed = pending.pop(0)
        run.progress(f"accuracy run {len(runs) + 1}/{len(runs) + len(pending) + 1}: {arm_name}, seed {seed}")
        cfg = cfgs[(Mode.accuracy.value, arm_name, seed)]
        run_dir = out_dir / "arms" / "accuracy" / arm_name / f"seed{seed}"
        tic = run.budget.elapsed()
        if by_name[arm_name].runner == Runner.trainer or b.accuracy.isolate:
            record = run_isolated(by_name[arm_name], cfg, run_dir, b.accuracy.profile_steps)
        else:
            with environment.OtherLoad() as other:
                record = run_seed(cfg, run_dir, arm_name, seed)
            record["other_cpu_share"] = other.share
        seconds.setdefault(arm_name, []).append(run.budget.elapsed() - tic)
        if (key := OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, ["model", "task"]))) not in flops_of:
            flops_of[key] = epoch_flops(cfg)  # between the timed runs
        if flops_of[key] and record.get("train_seconds"):
            record["train_examples"], per_epoch = flops_of[key]
            record["model_tflops"] = per_epoch * record["epochs"] / record["train_seconds"] / 1e12
        runs.append(record)
        log.info("  %s seed %d: %s samples/s, %s", arm_name, seed, record.get("train_samples_per_second"),
                 record.get("eval"))
        runs.sort(key=lambda r: (list(by_name).index(r["arm"]), seeds.index(r["seed"])))
        res["accuracy"] = results.summarize_accuracy(b, runs, run.env, cfgs)
        if pending and pending[0][1] != seed:  # a seed done: the report so far, marked partial
            _finish(run, res, out_dir, partial=sorted({r["seed"] for r in runs}, key=seeds.index))


def _fit_accuracy(run: _Run, pending: list[tuple[str, int]], seconds: dict[str, list[float]],
                  runs: list[dict]) -> list[tuple[str, int]]:
    """The pending accuracy runs that fit in the budget, each cut recorded. A run is projected at its arm's mean
    so far, else the baseline's mean times the arm's speed-mode step-time ratio; before the baseline's first run
    only that run is projected, from its speed-mode step. While the rest does not fit, the slowest pending arm
    (the baseline last of all) loses its last pending run."""
    b, left = run.b, run.budget.left()
    if not pending or math.isinf(left):
        return pending
    if not seconds.get(b.baseline):
        bound = _first_run_bound(run, run.cfgs[(Mode.accuracy.value, *pending[0])])
        if bound and bound[0] > left:
            run.budget.cut(", ".join(dict.fromkeys(a for a, _ in pending)), "accuracy", "skipped", "no accuracy runs",
                           f"the first accuracy run ({b.baseline}, {bound[1]}) could take up to "
                           f"~{fmt_seconds(bound[0])} (from {b.baseline}'s speed-mode step time, every row at full "
                           f"length), with {fmt_seconds(left)} of the budget left")
            return []
        return pending
    base = statistics.fmean(seconds[b.baseline])

    def cost(arm: str) -> float:
        return statistics.fmean(seconds[arm]) if seconds.get(arm) else base * (run.ratio(arm) or 1.0)

    keep = list(pending)
    while keep and sum(cost(a) for a, _ in keep) > left:
        slowest = max(dict.fromkeys(a for a, _ in keep), key=lambda a: (a != b.baseline, cost(a)))
        keep.remove(next(p for p in reversed(keep) if p[0] == slowest))
    for arm in dict.fromkeys(a for a, _ in pending):
        if (n := sum(a == arm for a, _ in pending)) > sum(a == arm for a, _ in keep):
            kept = [r["seed"] for r in runs if r["arm"] == arm] + [s for a, s in keep if a == arm]
            run.budget.cut(arm, "accuracy", "shortened" if kept else "skipped",
                           f"seeds {kept} of {list(b.accuracy.seeds)}" if kept else "no accuracy runs",
                           f"{run.slower(arm)}: its {n} remaining accuracy runs would take ~{fmt_seconds(n * cost(arm))}, "
                           f"with {fmt_seconds(left)} of the budget left for {len(pending)} runs")
    return keep


def _first_run_bound(run: _Run, cfg: DictConfig) -> tuple[float, str] | None:
    """(seconds, what) bounding the first accuracy run from the baseline's speed-mode step, every row at full
    length; None without a speed-mode baseline or a known training-set size."""
    step, tr, samples = run.steps.get(run.b.baseline), cfg.trainer, cfg.task.max_train_samples
    if step is None or not (tr.max_steps > 0 or samples):
        return None
    steps = int(tr.max_steps) if tr.max_steps > 0 else math.ceil(
        math.ceil(samples / tr.batch_size) / tr.grad_accum * tr.epochs)
    rows = tr.batch_size * tr.grad_accum
    timed = run.cfgs[(Mode.speed.value, run.b.baseline, None)]  # the shape its step was timed at (its own overrides')
    per_step = step * rows * cfg.task.max_length / (timed.trainer.batch_size * timed.task.max_length)
    return steps * per_step, f"{steps} steps of {rows} x up to {cfg.task.max_length} tokens"


def _finish(run: _Run, res: dict, out_dir: Path, partial: list[int] | None = None) -> Path:
    """Budget and claims into `res`, then every output written; partial: the seeds done so far."""
    res.pop("partial_seeds", None)
    if partial:
        res["partial_seeds"] = partial
    ratios = {a: round(r, 3) for a in run.steps if a != run.b.baseline and (r := run.ratio(a)) is not None}
    res["budget"] = dict(run.budget.summary(), pilot_step_seconds=run.pilots, step_time_vs_baseline=ratios)
    res["claims"] = results.evaluate_claims(res)
    return write_outputs(res, out_dir)
