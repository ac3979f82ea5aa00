"""The arms' raw runs → per-arm statistics over seeds, speed ratios, targets and accuracy checks.

Works on plain dicts (what results.json holds), so `runner.rerender` can summarize a saved run again."""

from __future__ import annotations

from statistics import mean, median, stdev

from omegaconf import DictConfig, OmegaConf

from ampft.benchmark.flops import mfu, peak_tflops
from ampft.benchmark.peer.config import Runner


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
        )
    trainers = [n for n, a in arms.items() if a["runner"] == Runner.trainer.value]
    for a in arms.values():
        a["speedup"] = {t: a["samples_per_second"] / arms[t]["samples_per_second"] for t in trainers}
    targets = [dict(arm=t.arm, over=t.over, min_ratio=t.min_ratio,
                    ratio=arms[t.arm]["samples_per_second"] / arms[t.over]["samples_per_second"]) for t in p.targets]
    for t in targets:
        t["met"] = t["ratio"] >= t["min_ratio"]
    references = list(p.accuracy_reference) or trainers
    accuracy = [dict(arm=n, reference=ref, difference=arms[n]["metric"] - arms[ref]["metric"],
                     within=abs(arms[n]["metric"] - arms[ref]["metric"]) <= p.accuracy_tolerance)
                for ref in references for n in arms if n != ref]
    c = first
    setup = dict(model=c.model.name, task=c.task.name, train_file=c.task.train_file, validation_file=c.task.validation_file,
                 max_train_samples=c.task.max_train_samples, max_length=c.task.max_length,
                 batch_size=c.trainer.batch_size, lr=c.optim.lr, epochs=c.trainer.epochs, max_steps=c.trainer.max_steps,
                 precision=c.precision.name.value, seeds=list(p.seeds), metric=metric)
    return dict(name=p.name, command=command, environment=env, setup=setup, arms=arms, targets=targets,
                accuracy=accuracy, accuracy_tolerance=p.accuracy_tolerance, runs=runs,
                config=OmegaConf.to_container(p, resolve=True))
