"""The arms' raw runs → per-arm statistics over seeds, speed ratios, targets and accuracy checks.

Works on plain dicts (what results.json holds), so `runner.rerender` can summarize a saved run again."""

from __future__ import annotations

from math import sqrt
from statistics import mean, median, stdev

from omegaconf import DictConfig, OmegaConf

from ampft.benchmark.flops import mfu, peak_tflops
from ampft.benchmark.peer.config import Runner
from ampft.config import Precision


def _points(value: float | None) -> float | None:
    """Metrics in [0, 1] (GLUE's fractions) as percentage points; others as they are."""
    return None if value is None else (100 * value if abs(value) <= 1 else value)


def summarize(p: DictConfig, cfgs: dict[str, DictConfig], runs: list[dict], env: dict, command: str | None) -> dict:
    """Per arm over seeds (medians for speed, means for the metric), speed ratios, targets and accuracy checks."""
    first = cfgs[p.arms[0].name]
    metric = first.task.main_metric
    arms = {}
    for arm in p.arms:
        rs = [r for r in runs if r["arm"] == arm.name]
        cfg = cfgs[arm.name]
        peak, peak_source = peak_tflops(rs[0]["precision"], env["device_type"], env["device_name"],
                                        {rs[0]["precision"]: p.peak_tflops})
        tflops = median(r["model_tflops"] for r in rs)
        arms[arm.name] = dict(
            runner=Runner(arm.runner).value, overrides=list(arm.overrides),
            samples_per_second=median(r["samples_per_second"] for r in rs),
            tokens_per_second=median(r["tokens_per_second"] for r in rs),
            train_seconds=median(r["train_seconds"] for r in rs),
            wall_seconds=median(r["wall_seconds"] for r in rs),
            setup_seconds=median(r["setup_seconds"] for r in rs),
            metric=mean(_points(r["eval"][metric]) for r in rs),
            metric_per_seed=[_points(r["eval"][metric]) for r in rs],
            metric_std=stdev(_points(r["eval"][metric]) for r in rs) if len(rs) > 1 else None,
            samples_per_second_per_seed=[r["samples_per_second"] for r in rs],
            peak_memory_bytes=max(r["peak_memory_bytes"] for r in rs), peak_memory_kind=rs[0]["peak_memory_kind"],
            model_tflops=tflops, mfu=mfu(tflops, peak), peak_tflops=peak,
            peak_tflops_source=peak_source.replace("benchmark.peak_tflops." + rs[0]["precision"], "peer.peak_tflops"),
            precision=rs[0]["precision"], attn_implementation=rs[0]["attn_implementation"],
            padding=cfg.trainer.padding.value, group_by_length=bool(cfg.trainer.group_by_length),
            compile=bool(cfg.trainer.compile), steps=rs[0]["steps"], train_examples=rs[0]["train_examples"],
            other_load=max((r["other_load"] or 0.0) for r in rs),
            profile=next((r["profile"] for r in rs if (r.get("profile") or {}).get("steps")), None),
        )
    trainers = [n for n, a in arms.items() if a["runner"] == Runner.trainer.value]
    for a in arms.values():  # against the Trainer arms of the same precision
        a["speedup"] = {t: a["samples_per_second"] / arms[t]["samples_per_second"] for t in trainers
                        if arms[t]["precision"] == a["precision"]}
    targets = [dict(arm=t.arm, over=t.over, min_ratio=t.min_ratio,
                    ratio=arms[t.arm]["samples_per_second"] / arms[t.over]["samples_per_second"]) for t in p.targets]
    for t in targets:
        t["met"] = t["ratio"] >= t["min_ratio"]
    references = list(p.accuracy_reference) or trainers
    accuracy = [paired_accuracy(arms[n]["metric_per_seed"], arms[ref]["metric_per_seed"], p.accuracy_tolerance)
                | dict(arm=n, reference=ref) for ref in references for n in arms if n != ref]
    c = first
    setup = dict(model=c.model.name, task=c.task.name, train_file=c.task.train_file, validation_file=c.task.validation_file,
                 max_train_samples=c.task.max_train_samples, max_length=c.task.max_length,
                 batch_size=c.trainer.batch_size, lr=c.optim.lr, epochs=c.trainer.epochs, max_steps=c.trainer.max_steps,
                 precision=c.precision.name.value, seeds=list(p.seeds), metric=metric)
    gains = precision_gains(arms, precision_pairs(p, cfgs))
    return dict(name=p.name, command=command, environment=env, setup=setup, arms=arms, targets=targets,
                accuracy=accuracy, accuracy_tolerance=p.accuracy_tolerance, precision_gains=gains,
                by_precision=by_precision(arms, gains), runs=runs, config=OmegaConf.to_container(p, resolve=True))


def paired_accuracy(arm: list[float], reference: list[float], tolerance: float) -> dict:
    """An arm's metric against a reference arm's, paired by seed (every arm ran the same seeds, so the same
    initialisation and examples): the per-seed differences, their mean and its standard error; whether the
    mean is within `tolerance` points, and within one seed standard deviation of the reference (how far two
    seeds of the reference itself typically fall apart; None with one seed)."""
    per_seed = [a - r for a, r in zip(arm, reference, strict=True)]
    difference = mean(per_seed)
    several = len(per_seed) > 1
    reference_std = stdev(reference) if several else None
    return dict(difference=difference, per_seed=per_seed,
                standard_error=stdev(per_seed) / sqrt(len(per_seed)) if several else None,
                reference_std=reference_std, within=abs(difference) <= tolerance,
                within_reference_std=abs(difference) <= reference_std if several else None)


def precision_pairs(p: DictConfig, cfgs: dict[str, DictConfig]) -> list[tuple[str, str]]:
    """(fp32 arm, arm) for each arm in another precision whose finetune config is, but for the precision
    group, an fp32 arm's of the same runner: the two differ in nothing else, so their samples/s ratio is
    that side's gain from the precision, and their metrics are paired (same seeds, data and order)."""
    def rest(name: str) -> dict:
        return {k: v for k, v in OmegaConf.to_container(cfgs[name], resolve=True).items() if k != "precision"}

    fp32 = [a for a in p.arms if Precision(cfgs[a.name].precision.name) == Precision.fp32]
    pairs = []
    for arm in p.arms:
        if Precision(cfgs[arm.name].precision.name) == Precision.fp32:
            continue
        base = next((b for b in fp32 if Runner(b.runner) == Runner(arm.runner) and rest(b.name) == rest(arm.name)),
                    None)
        if base is not None:
            pairs.append((base.name, arm.name))
    return pairs


def precision_gains(arms: dict[str, dict], pairs: list[tuple[str, str]]) -> list[dict]:
    """Each pair's samples/s ratio (medians over seeds) and metric difference (mean of the per-seed
    differences, in points), from the arms' measured numbers."""
    gains = []
    for base, arm in pairs:
        a, b = arms[arm], arms[base]
        per_seed = [x - y for x, y in zip(a["metric_per_seed"], b["metric_per_seed"], strict=True)]
        gains.append(dict(runner=a["runner"], fp32=base, arm=arm, precision=a["precision"],
                          ratio=a["samples_per_second"] / b["samples_per_second"],
                          metric_difference=mean(per_seed), metric_difference_per_seed=per_seed))
    return gains


def by_precision(arms: dict[str, dict], gains: list[dict]) -> list[dict]:
    """ampft against the Trainer in each precision, for every Trainer pair and ampft pair of the same
    precision: samples/s ratios and metric differences in fp32 and in the other precision, and how ampft's
    gain from that precision compares with the Trainer's."""
    out = []
    for t in (g for g in gains if g["runner"] == Runner.trainer.value):
        for a in (g for g in gains if g["runner"] == Runner.ampft.value and g["precision"] == t["precision"]):
            rows = []
            for key in ("fp32", "arm"):
                ta, aa = arms[t[key]], arms[a[key]]
                rows.append(dict(precision=aa["precision"], trainer=t[key], ampft=a[key],
                                 ratio=aa["samples_per_second"] / ta["samples_per_second"],
                                 metric_difference=mean(x - y for x, y in zip(aa["metric_per_seed"],
                                                                              ta["metric_per_seed"], strict=True))))
            out.append(dict(precision=t["precision"], trainer_gain=t["ratio"], ampft_gain=a["ratio"],
                            gain_ratio=a["ratio"] / t["ratio"], gain_at_least_trainer=a["ratio"] >= t["ratio"],
                            rows=rows))
    return out
