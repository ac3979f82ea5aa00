"""check → speed arms → accuracy arms × seeds → statistics and claims → results.json/csv, report.md, PNGs."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from ampft.benchmark import environment, plots, report, results, stats
from ampft.benchmark.accuracy import run_seed
from ampft.benchmark.config import CONF_DIR, BenchmarkConfigError, Mode, arms_for, check
from ampft.benchmark.speed import measure_arm
from ampft.config import ConfigError
from ampft.evaluation.metrics import check_installed
from ampft.extras import MissingExtraError

log = logging.getLogger(__name__)


def _device(cfg: DictConfig) -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() and not cfg.trainer.cpu else "cpu")


def run_benchmark(b: DictConfig, out_dir: Path, conf_dir: Path = CONF_DIR, command: str = "") -> Path:
    """Run every mode and arm of benchmark config `b`; write everything into out_dir; return report.md."""
    cfgs = check(b, conf_dir)  # every problem before anything is measured
    _check_extras(b, cfgs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = environment.describe(_device(next(iter(cfgs.values()))))
    log.info("benchmark %s on %s: modes %s, arms %s", b.name, env["device_name"],
             [Mode(m).value for m in b.modes],
             [a.name for a in b.arms])
    plain = OmegaConf.to_container(b, resolve=True, enum_to_str=True)
    res: dict = dict(benchmark=plain, environment=env, command=command or f"python recipes/benchmark.py "
                     f"benchmark={b.name}", speed=None, accuracy=None)

    speed_arms = arms_for(b, Mode.speed)
    if speed_arms:
        raw = []
        sweep_arms = None if b.sweep.arms is None else set(b.sweep.arms)
        for i, arm in enumerate(speed_arms, 1):
            log.info("speed arm %d/%d: %s", i, len(speed_arms), arm.name)
            do_sweep = b.sweep.batch_sizes and (sweep_arms is None or arm.name in sweep_arms)
            with environment.OtherLoad() as other:
                r = measure_arm(cfgs[(Mode.speed.value, arm.name, None)], out_dir / "arms" / "speed" / arm.name,
                                b.speed.warmup_steps, b.speed.timed_steps, b.seed, b.sweep if do_sweep else None)
            raw.append(dict(arm=arm.name, other_cpu_share=other.share, **r))
        peak_override = OmegaConf.to_container(b.peak_tflops)
        arms = [results.summarize_speed_arm(r, env, peak_override) for r in raw]
        if env["device_type"] == "cuda":  # a GPU without a known peak: say how to get an MFU
            for source in sorted({a["peak_tflops_source"] for a in arms if a["peak_tflops"] is None}):
                log.warning("no MFU: %s", source)
        results.add_speed_ratios(arms, b.baseline)
        res["speed"] = dict(raw=raw, arms=arms)

    acc_arms = arms_for(b, Mode.accuracy)
    if acc_arms:
        runs = []
        for i, arm in enumerate(acc_arms, 1):
            for seed in b.accuracy.seeds:
                log.info("accuracy arm %d/%d: %s, seed %d", i, len(acc_arms), arm.name, seed)
                cfg = cfgs[(Mode.accuracy.value, arm.name, seed)]
                with environment.OtherLoad() as other:
                    run = run_seed(cfg, out_dir / "arms" / "accuracy" / arm.name / f"seed{seed}", arm.name, seed)
                runs.append(dict(run, other_cpu_share=other.share))
        res["accuracy"] = dict(runs=runs, arms=results.summarize_accuracy(runs, [a.name for a in acc_arms],
                                                                         b.baseline))

    res["claims"] = results.evaluate_claims(res)
    return write_outputs(res, out_dir)


def _check_extras(b: DictConfig, cfgs: dict) -> None:
    """Accuracy mode's metrics and confidence intervals need the `metrics` extra: say so before measuring.
    Speed mode needs no extra; plots are skipped with a warning when matplotlib is missing."""
    acc = [cfg for (mode, *_), cfg in cfgs.items() if mode == Mode.accuracy.value]
    if not acc:
        return
    problems = []
    try:
        check_installed(acc[0].task.metrics, key=f"benchmark.task={b.task}: task.metrics")
    except ConfigError as exc:
        problems += exc.problems
    if len(b.accuracy.seeds) > 1:
        try:
            stats._t_ppf(0.975, 1)
        except MissingExtraError as exc:
            problems.append(f"benchmark.accuracy.seeds={list(b.accuracy.seeds)}: {exc}")
    if problems:
        raise BenchmarkConfigError(problems)


def write_outputs(res: dict, out_dir: Path) -> Path:
    """results.json, results.csv, the PNGs and report.md; also usable to re-render a saved results.json."""
    out_dir = Path(out_dir)
    report.write_json(res, out_dir / "results.json")
    report.write_csv(res, out_dir / "results.csv")
    try:
        made = plots.make_plots(res, out_dir)
    except MissingExtraError as exc:
        log.warning("no PNG plots (report.md has every number): %s", exc)
        made = []
    path = out_dir / "report.md"
    path.write_text(report.render(res, made))
    log.info("report: %s", path)
    return path
