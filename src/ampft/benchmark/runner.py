"""check → speed arms → accuracy arms × seeds (in this process, or each in its own: the Trainer's, and every run
with accuracy.isolate) → statistics, claims and targets → results.json/csv, report.md, PNGs, rewritten after every
seed so that a benchmark stopped midway keeps what it measured."""

from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from ampft.benchmark import budget, environment, results, stats
from ampft.benchmark.accuracy import epoch_flops, run_isolated, run_seed
from ampft.benchmark.config import CONF_DIR, BenchmarkConfigError, Mode, Runner, arms_for, check
from ampft.benchmark.report import write_outputs
from ampft.benchmark.speed import measure_arm, pilot_batch_size
from ampft.config import ConfigError
from ampft.devices import cpu_fp16_note, cpu_half_support
from ampft.estimate.run import predict_arms
from ampft.extras import MissingExtraError
from ampft.tasks import check_installed

log = logging.getLogger(__name__)


class SpeedPlan:
    """The time budget's decisions for one speed arm (see `ampft.benchmark.budget` for the policy)."""

    def __init__(self, run: _Run, arm: DictConfig, unmeasured: int):
        self.run, self.b, self.name, self.unmeasured = run, run.b, arm.name, unmeasured
        self.first_steps = run.b.speed.warmup_steps + 2
        self.share = budget.SPEED_SHARE if run.acc_arms else 1.0
        self.is_base = arm.name == run.b.baseline

    def _reserve(self, step: float) -> float:
        """Room for the speed arms after this one: each at least its build, pilots, warm-up and probe (what is
        never cut before it is measured), estimated like this one's; the rest of theirs is cut to fit."""
        pilot = self.run.pilots.get(self.name, 0.0)
        return self.unmeasured * (self.run.build_seconds + 2 * pilot + self.first_steps * step)

    def _vs_base(self) -> str:
        ratio = self.run.ratios.get(self.name)
        return f", {budget.slower(ratio, self.b.baseline)}" if ratio else ""

    def after_pilot(self, pilot: float, build_seconds: float) -> bool:
        r, b, name = self.run, self.b, self.name
        r.pilots[name], r.build_seconds = pilot, build_seconds
        pilot_batch = pilot_batch_size(b.batch_size)
        base_pilot, base_step = r.pilots.get(b.baseline), r.steps.get(b.baseline)
        if base_pilot and base_step and not self.is_base:
            r.ratios[name] = pilot / base_pilot
            step = base_step * r.ratios[name]
        else:
            step = pilot * b.batch_size / pilot_batch  # no reference yet: linear in the batch
        left = r.budget.left(self.share)
        log.info("  %s: pilot step (batch %d) %.2f s%s; warm-up and probe projected at ~%s", name, pilot_batch,
                 pilot, self._vs_base(), budget.fmt_seconds(self.first_steps * step))
        if not (fits := self.is_base or budget.fit_after_pilot(left, step, self.first_steps, self._reserve(step))):
            r.budget.cut(name, "speed", "skipped", f"pilot steps at batch {pilot_batch} only ({pilot:.2f} s a step)",
                         f"{r.slower(name, Mode.speed)} in its pilot steps: its warm-up and probe steps alone would "
                         f"take ~{budget.fmt_seconds(self.first_steps * step)}, with {budget.fmt_seconds(left)} of "
                         "speed mode's share of the budget left")
        return fits

    def after_probe(self, probe: list[float]) -> tuple[int, bool]:
        r, b, name = self.run, self.b, self.name
        step = r.steps[name] = statistics.median(probe)
        if not self.is_base and b.baseline in r.steps:
            r.ratios[name] = step / r.steps[b.baseline]
        more, sweeping = b.speed.timed_steps - len(probe), r.sweeps(name)
        sweep = budget.sweep_cost(step, b.batch_size, list(b.sweep.batch_sizes), b.sweep.steps) if sweeping else 0
        left, reserve = r.budget.left(self.share), self._reserve(step)
        n, do_sweep = budget.fit_after_probe(left, step, more, sweep, reserve)
        log.info("  %s: probe step %.2f s%s; %d more timed steps%s", name, step, self._vs_base(), n,
                 " and the memory sweep" if sweeping and do_sweep else "")
        head = f"{name} (the baseline) on this {r.where}" if self.is_base else r.slower(name, Mode.speed)
        reason = (f"{head}: {budget.fmt_seconds(step)} a step; the rest of the arm would "
                  f"take ~{budget.fmt_seconds(more * step + sweep)}, with {budget.fmt_seconds(left - reserve)} "
                  "of speed mode's share of the budget left for it")
        if sweeping and not do_sweep:
            r.budget.cut(name, "sweep", "skipped", "no memory sweep", reason)
        if n < more:
            r.budget.cut(name, "speed", "shortened", f"{len(probe) + n} of {b.speed.timed_steps} timed steps", reason)
        return n, do_sweep


class _Run:
    """The state of one benchmark run: the budget, and what has been measured so far for projections."""

    def __init__(self, b: DictConfig, cfgs: dict, env: dict, clock: budget.Budget):
        self.b, self.cfgs, self.env, self.budget = b, cfgs, env, clock
        self.where = f"{'CPU' if env['device_type'] == 'cpu' else 'GPU'} ({env['device_name']})"
        self.acc_arms = arms_for(b, Mode.accuracy)
        self.pilots: dict[str, float] = {}  # pilot step seconds (a quarter of the batch)
        self.steps: dict[str, float] = {}  # median probe step seconds (full batch)
        self.ratios: dict[str, float] = {}  # step time / the baseline's
        self.speed_costs: list[float] = []  # wall seconds of each speed arm
        self.build_seconds = 0.0
        self.run_seconds: dict[str, list[float]] = {}  # accuracy runs' wall seconds per arm

    def sweeps(self, arm: str) -> bool:
        """Whether the memory sweep measures this speed arm."""
        return bool(self.b.sweep.batch_sizes) and (self.b.sweep.arms is None or arm in self.b.sweep.arms)

    def slower(self, arm: str, mode: Mode) -> str:
        """How much slower than the baseline `arm` is here, e.g. "fp16: 21x slower than fp32 on this CPU (AMD
        EPYC) (no AVX512-FP16/AMX-FP16)": a half precision's CPU flags say why it may be slow."""
        seed = self.b.accuracy.seeds[0] if Mode(mode) == Mode.accuracy else None
        precision = self.cfgs[(Mode(mode).value, arm, seed)].precision.name.value
        why = ""
        if self.env["device_type"] == "cpu" and precision in ("fp16", "bf16"):
            have = cpu_half_support(set(self.env.get("cpu_features") or []))[precision]
            p = precision.upper()
            why = f" (it has {', '.join(have)})" if have else f" (no AVX512-{p}/AMX-{p})"
        return f"{arm}: {budget.slower(self.ratios.get(arm), self.b.baseline)} on this {self.where}{why}"

    def per_run(self, arms: set[str]) -> dict[str, float] | None:
        """Projected seconds of one accuracy run per arm; None before the baseline has run."""
        base = self.run_seconds.get(self.b.baseline)
        if not base:
            return None
        mean = statistics.fmean(base)
        return {a: statistics.fmean(self.run_seconds[a]) if self.run_seconds.get(a)
                else mean * self.ratios.get(a, 1.0) for a in arms}

    def progress(self, what: str, remaining: float | None, scope: str = "") -> None:
        b = self.budget
        limit = "" if b.seconds is None else f" of a {budget.fmt_seconds(b.seconds)} budget"
        log.info("[%s%s] %s; expected remaining ~%s%s", budget.fmt_seconds(b.elapsed()), limit, what,
                 budget.fmt_seconds(remaining), scope)


def run_benchmark(b: DictConfig, out_dir: Path, conf_dir: Path = CONF_DIR, command: str = "") -> Path:
    """Run every mode and arm of benchmark config `b` within its time budget; write everything into out_dir;
    return report.md."""
    clock = budget.Budget(b.budget_minutes)  # the budget counts from the start, composing included
    cfgs = check(b, conf_dir)  # every problem before anything is measured
    _check_extras(b, cfgs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not next(iter(cfgs.values())).trainer.cpu
    env = environment.describe(torch.device("cuda" if cuda else "cpu"))
    run = _Run(b, cfgs, env, clock)
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
    if run.budget.seconds is not None and not run.budget.summary()["within"]:
        log.warning("the benchmark took %s, over its budget of %s (benchmark.budget_minutes): see the report",
                    budget.fmt_seconds(run.budget.elapsed()), budget.fmt_seconds(run.budget.seconds))
    return _finish(run, res, out_dir)


def _speed_mode(run: _Run, arms: list[DictConfig], out_dir: Path) -> dict:
    """Measure the speed arms one after another, each within the budget (its SpeedPlan): results' `speed`."""
    b, env, raw = run.b, run.env, []
    for i, arm in enumerate(arms, 1):
        costs = run.speed_costs  # of the arms before this one: the projection of this one and the rest
        run.progress(f"speed arm {i}/{len(arms)}: {arm.name}",
                     (len(arms) - i + 1) * statistics.fmean(costs) if costs else None,
                     " for speed mode (accuracy mode: projected from its first run)" if run.acc_arms else "")
        tic = run.budget.elapsed()
        with environment.OtherLoad() as other:
            r = measure_arm(run.cfgs[(Mode.speed.value, arm.name, None)], out_dir / "arms" / "speed" / arm.name,
                            b.speed.warmup_steps, b.speed.timed_steps, b.seed,
                            b.sweep if run.sweeps(arm.name) else None, plan=SpeedPlan(run, arm, len(arms) - i))
        run.speed_costs.append(run.budget.elapsed() - tic)
        if not r.get("skipped"):
            raw.append(dict(arm=arm.name, other_cpu_share=other.share, **r))
    peak_override = OmegaConf.to_container(b.peak_tflops)
    summaries = [results.summarize_speed_arm(r, env, peak_override) for r in raw]
    if env["device_type"] == "cuda":  # a GPU without a known peak: say how to get an MFU
        for source in sorted({a["peak_tflops_source"] for a in summaries if a["peak_tflops"] is None}):
            log.warning("no MFU: %s", source)
    results.add_speed_ratios(summaries, b.baseline)
    predicted = predict_arms({r["arm"]: run.cfgs[(Mode.speed.value, r["arm"], None)] for r in raw}, env)
    return dict(raw=raw, arms=summaries, predicted=predicted)


def _accuracy_mode(run: _Run, res: dict, out_dir: Path) -> None:
    """The accuracy runs, seed by seed, each within the budget; res["accuracy"] is summarized after every run
    and the outputs written after every seed (marked partial)."""
    b, cfgs = run.b, run.cfgs
    by_name, seeds, runs = {a.name: a for a in run.acc_arms}, list(b.accuracy.seeds), []
    names = list(by_name)
    pending = budget.seed_major(names, seeds, b.baseline)
    flops_of: dict[str, tuple[int, float] | None] = {}  # per model and data
    bound = _first_run_bound(run, cfgs[(Mode.accuracy.value, *pending[0])])
    if bound and bound[0] > run.budget.left():  # never without a budget: then left() is inf
        run.budget.cut(", ".join(names), "accuracy", "skipped", "no accuracy runs",
                       f"the first accuracy run ({b.baseline}, {bound[1]}) could take up to "
                       f"~{budget.fmt_seconds(bound[0])} (from {b.baseline}'s speed-mode step time, every row "
                       f"at full length), with {budget.fmt_seconds(run.budget.left())} of the budget left")
        pending = []
    while pending:
        per_run = run.per_run({a for a, _ in pending})
        if per_run is not None and b.budget_minutes is not None and not (
                pending := _cut_accuracy(run, pending, per_run, runs)):
            break
        arm_name, seed = pending.pop(0)
        remaining = None if per_run is None else per_run[arm_name] + sum(per_run[a] for a, _ in pending)
        run.progress(f"accuracy run {len(runs) + 1}/{len(runs) + len(pending) + 1}: {arm_name}, seed {seed}",
                     remaining)
        cfg = cfgs[(Mode.accuracy.value, arm_name, seed)]
        run_dir = out_dir / "arms" / "accuracy" / arm_name / f"seed{seed}"
        tic = run.budget.elapsed()
        if Runner(by_name[arm_name].runner) == Runner.trainer or b.accuracy.isolate:
            record = run_isolated(by_name[arm_name], cfg, run_dir, b.accuracy.profile_steps)
        else:
            with environment.OtherLoad() as other:
                record = run_seed(cfg, run_dir, arm_name, seed)
            record["other_cpu_share"] = other.share
        run.run_seconds.setdefault(arm_name, []).append(run.budget.elapsed() - tic)
        if (key := OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, ["model", "task"]))) not in flops_of:
            flops_of[key] = epoch_flops(cfg)  # between the timed runs
        if flops_of[key] and record.get("train_seconds"):
            record["train_examples"], per_epoch = flops_of[key]
            record["model_tflops"] = per_epoch * record["epochs"] / record["train_seconds"] / 1e12
        runs.append(record)
        log.info("  %s seed %d: %s samples/s, %s", arm_name, seed, record.get("train_samples_per_second"),
                 record.get("eval"))
        runs.sort(key=lambda r: (names.index(r["arm"]), seeds.index(r["seed"])))
        res["accuracy"] = results.summarize_accuracy(b, runs, run.env, cfgs)
        if pending and pending[0][1] != seed:  # a seed done: the report so far, marked partial
            _finish(run, res, out_dir, partial=sorted({r["seed"] for r in runs}, key=seeds.index))


def _finish(run: _Run, res: dict, out_dir: Path, partial: list[int] | None = None) -> Path:
    """Budget and claims into `res`, then every output written; partial: the seeds done so far."""
    res.pop("partial_seeds", None)
    if partial:
        res["partial_seeds"] = partial
    res["budget"] = dict(run.budget.summary(), pilot_step_seconds=run.pilots,
                         step_time_vs_baseline={k: round(v, 3) for k, v in run.ratios.items()})
    res["claims"] = results.evaluate_claims(res)
    return write_outputs(res, out_dir)


def _first_run_bound(run: _Run, cfg: DictConfig) -> tuple[float, str] | None:
    """(seconds, what) bounding the first accuracy run from the baseline's speed-mode step, every row at full
    length; None without a speed-mode baseline or a known training-set size."""
    step, tr, samples = run.steps.get(run.b.baseline), cfg.trainer, cfg.task.max_train_samples
    if step is None or not (tr.max_steps > 0 or samples):
        return None
    steps = int(tr.max_steps) if tr.max_steps > 0 else math.ceil(
        math.ceil(samples / tr.batch_size) / tr.grad_accum * tr.epochs)
    rows = tr.batch_size * tr.grad_accum
    per_step = step * rows * cfg.task.max_length / (run.b.batch_size * run.b.seq_len)
    return steps * per_step, f"{steps} steps of {rows} x up to {cfg.task.max_length} tokens"


def _cut_accuracy(run: _Run, pending: list[tuple[str, int]], per_run: dict[str, float],
                  runs: list[dict]) -> list[tuple[str, int]]:
    """Apply the accuracy part of the budget policy before the next run; record each cut."""
    b, left, all_seeds = run.b, run.budget.left(), list(run.b.accuracy.seeds)
    keep, drops = budget.plan_accuracy(left, pending, per_run, b.baseline, {r["seed"] for r in runs})
    for kind, what in drops:
        done, n = sorted(r["seed"] for r in runs if r["arm"] == what), sum(1 for a, _ in pending if a == what)
        if kind == "seed":
            run.budget.cut(", ".join(a for a, s in pending if s == what), "accuracy", "shortened",
                           f"seed {what} dropped", f"the remaining {len(pending)} accuracy runs would take "
                           f"~{budget.fmt_seconds(sum(per_run[a] for a, _ in pending))}, with "
                           f"{budget.fmt_seconds(left)} of the budget left, after the slowest arms were skipped")
        elif what == b.baseline:
            run.budget.cut(what, "accuracy", "shortened", f"seeds {done} of {all_seeds}",
                           f"{what}: its remaining accuracy runs would compare with nothing once the other "
                           "arms were skipped")
        else:
            run.budget.cut(what, "accuracy", "shortened" if done else "skipped",
                           f"seeds {done} of {all_seeds}" if done else "no accuracy runs",
                           run.slower(what, Mode.accuracy) + (": speed measured, " if what in run.steps else ": ")
                           + f"its {n} remaining accuracy runs would take ~{budget.fmt_seconds(n * per_run[what])}, "
                           f"with {budget.fmt_seconds(left)} of the budget left")
        pending = [p for p in pending if (p[0] if kind == "arm" else p[1]) != what]
    return keep


def _check_extras(b: DictConfig, cfgs: dict) -> None:
    """Accuracy mode's metrics and confidence intervals need the `metrics` extra: say so before measuring.
    Speed mode needs no extra; plots are skipped with a warning when matplotlib is missing."""
    acc = next((cfg for (mode, *_), cfg in cfgs.items() if mode == Mode.accuracy.value), None)
    if acc is None:
        return
    problems = []
    try:
        check_installed(acc.task.metrics, key=f"benchmark.task={b.task}: task.metrics")
    except ConfigError as exc:
        problems += exc.problems
    try:
        if len(b.accuracy.seeds) > 1:
            stats._t_ppf(0.975, 1)
    except MissingExtraError as exc:
        problems.append(f"benchmark.accuracy.seeds={list(b.accuracy.seeds)}: {exc}")
    if problems:
        raise BenchmarkConfigError(problems)
