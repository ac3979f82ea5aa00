"""Raw measurements → per-arm statistics → the claims and the comparison's checks, each with a plain verdict
(docs/architecture.md). Everything works on plain dicts (what results.json holds), so a report can be
re-rendered without re-measuring.
"""

from __future__ import annotations

from math import sqrt
from statistics import mean, median, stdev

from omegaconf import DictConfig, OmegaConf

from ampft.benchmark import flops, stats
from ampft.benchmark.config import BenchmarkConfig, Mode, Runner, arms_for, check
from ampft.config import Precision
from ampft.devices import HF_ANCHOR, MEMORY_CLAIM, NVIDIA_ANCHOR, SLACK, TENSOR_CORE_SPEEDUP, TIME_CLAIM
from ampft.tasks import family_for

REPRODUCED, NOT_REPRODUCED, NOT_CHECKED = "reproduced", "did not reproduce", "not checked"
MIXED = ("fp16", "bf16")


# --- speed ----------------------------------------------------------------------------------------

def summarize_speed_arm(raw: dict, env: dict, peak_override: dict | None) -> dict:
    """Median and spread of step time; throughput, TFLOP/s and MFU at the median; peak memory."""
    t = stats.describe(raw["step_seconds"])
    bs, tokens = raw["batch_size"], raw["batch_size"] * raw["seq_len"]
    # Throughput quartiles come from the step-time quartiles (a slower step is a lower throughput).
    samples = dict(median=bs / t["median"], q1=bs / t["q3"], q3=bs / t["q1"], min=bs / t["max"], max=bs / t["min"])
    tflops = raw["flops_per_token"] * tokens / t["median"] / 1e12
    peak, source = flops.peak_tflops(raw["precision"], env["device_type"], env["device_name"], peak_override)
    mem = raw["memory_peak"]
    memory, kind = ((mem["peak_allocated_bytes"], "cuda_peak_allocated") if "peak_allocated_bytes" in mem
                    else (mem.get("peak_rss_bytes"), "cpu_peak_rss"))
    return dict(
        {k: raw[k] for k in ("arm", "precision", "precision_requested", "attn_implementation")},
        batch_size=bs, seq_len=raw["seq_len"], step_time=t, samples_per_second=samples,
        tokens_per_second={k: v * raw["seq_len"] for k, v in samples.items()}, tflops=tflops,
        peak_tflops=peak, peak_tflops_source=source, mfu=flops.mfu(tflops, peak),
        peak_memory_bytes=memory, peak_memory_kind=kind, peak_reserved_bytes=mem.get("peak_reserved_bytes"),
        **{k: raw[k] for k in ("skipped_steps", "flops_per_token", "params", "params_nonembedding")},
        other_cpu_share=raw.get("other_cpu_share"),
    )


def add_speed_ratios(arms: list[dict], baseline: str) -> None:
    base = next((a for a in arms if a["arm"] == baseline), None)
    for a in arms:
        # Time per sample, so arms with another batch size compare fairly; equal to the step-time ratio
        # when the batch is the same.
        s = stats.ratio(a["samples_per_second"]["median"], base["samples_per_second"]["median"]) if base else None
        a.update(speedup=s, time_vs_baseline=1 / s if s else None,
                 memory_vs_baseline=stats.ratio(a["peak_memory_bytes"], base["peak_memory_bytes"]) if base else None)


# --- accuracy ---------------------------------------------------------------------------------------

def _points(value: float | None, scale: float) -> float | None:
    """A metric as percentage points: scale 100 for fractions (GLUE's), 1 for a family's percent scores
    (`Family.scores_in_percent`: seqeval, SQuAD), whatever the value (an F1 of 0.5% is half a point)."""
    return None if value is None else scale * value


def _paired(a: dict, b: dict, scale: float) -> list[tuple[float, float]]:
    """(a's metric, b's) in points for each seed both arms have a metric for (a diverged or missing run has
    none); `metric_per_seed` follows benchmark.accuracy.seeds."""
    return [(_points(x, scale), _points(y, scale)) for x, y in zip(a["metric_per_seed"], b["metric_per_seed"],
                                                                   strict=True) if x is not None and y is not None]


def _if_any(f, values: list[float]):
    return f(values) if values else None


def _median_of(rows: list[dict], key: str) -> float | None:
    return _if_any(median, [r[key] for r in rows if r.get(key) is not None])


def summarize_accuracy(b: DictConfig | dict, runs: list[dict], env: dict, cfgs: dict | None = None) -> dict:
    """Per arm over its seeds, and the comparison's checks (module docstring). `cfgs` (`config.check`'s) finds
    the precision twins and the task's family (whether its metric is a fraction or percent); without it there are
    no precision gains and the metric is taken as a fraction (sequence classification's)."""
    b = OmegaConf.merge(OmegaConf.structured(BenchmarkConfig), b)
    task = next((c.task for (mode, *_), c in (cfgs or {}).items() if mode == Mode.accuracy.value), None)
    scale = 1.0 if task is not None and family_for(task.family).scores_in_percent else 100.0
    measured = [(a, rs) for a in arms_for(b, Mode.accuracy) if (rs := [r for r in runs if r["arm"] == a.name])]
    baseline, seeds = b.baseline, b.accuracy.seeds
    base_runs = next((rs for a, rs in measured if a.name == baseline), [])
    base = {r["seed"]: r["metric"] for r in base_runs if r["metric"] is not None}
    base_time = [r["train_seconds"] for r in base_runs if r.get("train_seconds")]
    seed_of = {(r["arm"], r["seed"]): r for r in runs}

    def per_seed(name: str, key: str) -> list:
        return [seed_of.get((name, s), {}).get(key) for s in seeds]

    arms = {}
    for arm, rs in measured:
        ok = [r for r in rs if r["metric"] is not None]
        values = {r["seed"]: r["metric"] for r in ok}
        times = [r["train_seconds"] for r in ok]
        first = rs[0]
        peak, source = flops.peak_tflops(first["precision"], env["device_type"], env["device_name"],
                                         OmegaConf.to_container(b.peak_tflops))
        tflops = [r["model_tflops"] for r in ok if r.get("model_tflops")]

        arms[arm.name] = dict(
            arm=arm.name, runner=Runner(arm.runner).value, overrides=list(arm.overrides), precision=first["precision"],
            main_metric=first["main_metric"], runs=len(rs), diverged=sum(r["diverged"] for r in rs),
            metric=_if_any(stats.describe, list(values.values())), metric_per_seed=per_seed(arm.name, "metric"),
            diff=stats.difference_ci(values, base) if arm.name != baseline else None,
            train_seconds=_if_any(stats.describe, times),
            time_vs_baseline=stats.ratio(mean(times), mean(base_time)) if times and base_time else None,
            samples_per_second=_median_of(ok, "train_samples_per_second"),
            tokens_per_second=_median_of(ok, "train_tokens_per_second"), wall_seconds=_median_of(ok, "wall_seconds"),
            samples_per_second_per_seed=per_seed(arm.name, "train_samples_per_second"),
            skipped_steps=[r.get("skipped_steps") for r in rs],
            loss_scale_final=[r.get("loss_scale_final") for r in rs],
            other_cpu_share=max((r.get("other_cpu_share") or 0.0 for r in rs), default=None),
            peak_memory_bytes=max((r.get("peak_memory_bytes") or 0 for r in rs), default=None) or None,
            peak_memory_kind=first.get("peak_memory_kind"),
            model_tflops=_if_any(median, tflops), mfu=flops.mfu(median(tflops), peak) if tflops else None,
            peak_tflops=peak, peak_tflops_source=source, attn_implementation=first.get("attn_implementation"),
            steps=first.get("steps"), train_examples=first.get("train_examples"),
            profile=next((r["profile"] for r in rs if (r.get("profile") or {}).get("steps")), None),
        )
    trainers = [n for n, a in arms.items() if a["runner"] == Runner.trainer.value]

    def ratio(x: str, y: str) -> float | None:
        return stats.ratio(arms[x]["samples_per_second"], arms[y]["samples_per_second"])

    for name, a in arms.items():  # against the Trainer arms of the same precision
        a["speedup"] = {t: ratio(name, t) for t in trainers if arms[t]["precision"] == a["precision"]}
    targets = [dict(arm=t.arm, over=t.over, min_ratio=t.min_ratio, ratio=(r := ratio(t.arm, t.over)),
                    met=r is not None and r >= t.min_ratio)
               for t in b.targets if t.arm in arms and t.over in arms]
    references = [r for r in (list(b.accuracy.reference) or trainers) if r in arms]
    checks = [paired_accuracy(pairs, b.accuracy.tolerance) | dict(arm=n, reference=ref)
              for ref in references for n in arms if n != ref and (pairs := _paired(arms[n], arms[ref], scale))]
    gains, versus = precision_gains(arms, precision_pairs(b, cfgs, list(arms)), scale) if cfgs else ([], [])
    return dict(runs=runs, arms=list(arms.values()), targets=targets, checks=checks,
                tolerance=b.accuracy.tolerance, precision_gains=gains, by_precision=versus)


def paired_accuracy(pairs: list[tuple[float, float]], tolerance: float) -> dict:
    """An arm's metric against a reference arm's, paired by seed ((arm, reference) in points): the per-seed
    differences, their mean and its standard error; whether the mean is within `tolerance` points, and within
    one seed standard deviation of the reference (its own seed-to-seed spread; None with one seed)."""
    per_seed = [a - r for a, r in pairs]
    difference, several = mean(per_seed), len(per_seed) > 1
    reference_std = stdev(r for _, r in pairs) if several else None
    return dict(difference=difference, per_seed=per_seed,
                standard_error=stdev(per_seed) / sqrt(len(per_seed)) if several else None,
                reference_std=reference_std, within=abs(difference) <= tolerance,
                within_reference_std=abs(difference) <= reference_std if several else None)


def precision_pairs(b: DictConfig, cfgs: dict, names: list[str]) -> list[tuple[str, str]]:
    """(fp32 arm, arm) for each arm in another precision whose finetune config is, but for the precision
    group, an fp32 arm's of the same runner: the two differ in nothing else, so their samples/s ratio is
    that side's gain from the precision, and their metrics are paired (same seeds, data and order)."""
    def key(arm) -> tuple[str, bool, tuple]:  # (name, fp32?, (runner, the config but for its precision))
        cfg = OmegaConf.to_container(cfgs[(Mode.accuracy.value, arm.name, b.accuracy.seeds[0])], resolve=True)
        return arm.name, Precision(cfg.pop("precision")["name"]) == Precision.fp32, (Runner(arm.runner), cfg)

    arms = [key(a) for a in b.arms if a.name in names]
    return [(twin, name) for name, fp32, rest in arms if not fp32
            and (twin := next((f for f, f32, r in arms if f32 and r == rest), None)) is not None]


def precision_gains(arms: dict[str, dict], pairs: list[tuple[str, str]],
                    scale: float = 100.0) -> tuple[list[dict], list[dict]]:
    """Each (fp32, arm) pair's samples/s ratio and mean per-seed metric difference (points); and, for each
    Trainer pair and ampft pair of one precision, the ratio of their gains."""
    gains = [dict(runner=arms[arm]["runner"], fp32=base, arm=arm, precision=arms[arm]["precision"],
                  ratio=arms[arm]["samples_per_second"] / arms[base]["samples_per_second"],
                  metric_difference=mean(d), metric_difference_per_seed=d)
             for base, arm in pairs if arms[arm]["samples_per_second"] and arms[base]["samples_per_second"]
             and (d := [x - y for x, y in _paired(arms[arm], arms[base], scale)])]
    versus = [dict(precision=t["precision"], trainer=t["arm"], trainer_fp32=t["fp32"], ampft=a["arm"],
                   ampft_fp32=a["fp32"], trainer_gain=t["ratio"], ampft_gain=a["ratio"], gain_ratio=a["ratio"] / t["ratio"],
                   gain_at_least_trainer=a["ratio"] >= t["ratio"])
              for t in gains if t["runner"] == Runner.trainer.value
              for a in gains if a["runner"] == Runner.ampft.value and a["precision"] == t["precision"]]
    return gains, versus


# --- claims ---------------------------------------------------------------------------------------

CLAIMS = {
    "mp-time": "Mixed precision trains in about 60% of FP32's time",
    "mp-memory": "Mixed precision needs about 57% of FP32's memory",
    "mp-accuracy": "Mixed precision reaches the same accuracy as FP32",
    "tensor-cores": "Tensor Cores (TF32/FP16/BF16) give 1.5-3x FP32's throughput",
    "bf16-stable": "BF16 is as stable as FP32 (no loss scaling)",
    "fp16-scaling": "FP16 needs loss scaling",
    "anchor-nvidia": "NVIDIA BERT-large SQuAD fine-tuning, one A100-80GB: TF32 61.5 vs FP16 110.5 "
                     "sequences/s (1.79x)",
    "anchor-hf": "Hugging Face: bert-large, seq 512, batch 4, one V100: fp16 2.1x fp32 throughput but only "
                 "7% less memory",
}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _verdict(ok: bool) -> str:
    return REPRODUCED if ok else NOT_REPRODUCED


def _same_accuracy(a: dict) -> tuple[str, str]:
    if a["diff"] is None:
        return NOT_CHECKED, "no accuracy runs for this arm"
    if a["diverged"]:
        return NOT_REPRODUCED, f"{a['diverged']} of {a['runs']} runs diverged"
    d = a["diff"]
    if d["ci_low"] is None:
        return NOT_CHECKED, f"difference {d['mean']:+.4f} from {d['n']} seed(s): too few for an interval"
    contains = d["ci_low"] <= 0 <= d["ci_high"]
    ci = f"{d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"
    return _verdict(contains), (f"difference {ci} (95% CI {'contains' if contains else 'excludes'} 0, "
                                f"{d['n']} seeds)")


def evaluate_claims(results: dict) -> list[dict]:
    """The published claims judged on this run's ampft arms; none for a benchmark with a Trainer arm (a
    comparison has targets instead) or with one precision (the claims compare precisions). A claim is judged
    on each arm it is about, or once as "not checked" with what it would need."""
    b, env = results["benchmark"], results["environment"]
    speed = (results.get("speed") or {}).get("arms", [])
    acc = {a["arm"]: a for a in (results.get("accuracy") or {}).get("arms", [])}
    if (any(a.get("runner") == Runner.trainer.value for a in b["arms"])
            or len({a["precision"] for a in [*speed, *acc.values()]}) < 2):
        return []
    baseline, cpu = b["baseline"], env["device_type"] != "cuda"
    base = next((a for a in speed if a["arm"] == baseline), None)
    # the speed arms that differ from the baseline only in precision (same attention and batch)
    same = [a for a in speed if base is not None and a is not base
            and all(a[k] == base[k] for k in ("attn_implementation", "batch_size", "seq_len"))]
    fp32 = "fp32" in {(base or {}).get("precision"), (acc.get(baseline) or {}).get("precision")}
    where = f"on this {'CPU' if cpu else 'GPU'} ({env['device_name']})"
    claims: list[dict] = []

    def claim(cid: str, verdict: str, measured: str = "", note: str = "", arm: dict | None = None,
              text: str | None = None) -> None:
        claims.append(dict(id=f"{cid}-{arm['arm']}" if arm else cid, claim=text or CLAIMS[cid],
                           verdict=verdict, measured=measured, note=note))

    def judge(cid: str, arms: list[dict], none: str, blocked: str | None = None) -> list[dict]:
        """The arms to judge claim `cid` on; none where it cannot be judged, with one "not checked" saying why:
        `blocked`, or `none` where there are no arms."""
        if missing := blocked or (None if arms else none):
            claim(cid, NOT_CHECKED, note=missing)
            return []
        return arms

    not_fp32 = None if fp32 else f"the baseline arm {baseline} is not fp32"
    mixed = [a for a in same if a["precision"] in MIXED]
    for a in judge("mp-time", mixed, "no fp16/bf16 speed arm comparable with the baseline", not_fp32):
        v = a["time_vs_baseline"]
        claim("mp-time", NOT_CHECKED if cpu else _verdict(v is not None and v <= TIME_CLAIM + SLACK),
              f"{a['arm']}: {_pct(v)} of {baseline}'s time per sample {where}",
              "the claim is about GPUs (Tensor Cores); the CPU number is for the record" if cpu else "", a)
    for a in judge("mp-memory", mixed, "no fp16/bf16 speed arm comparable with the baseline", not_fp32):
        v = a["memory_vs_baseline"]
        claim("mp-memory", NOT_CHECKED if cpu else _verdict(v is not None and v <= MEMORY_CLAIM + SLACK),
              f"{a['arm']}: {_pct(v)} of {baseline}'s peak memory ({a['peak_memory_kind']})",
              "on a CPU the peak RSS of the process includes the interpreter, libraries and data, which no "
              "precision changes, so it cannot show the claimed GPU-memory saving" if cpu else "", a)
    mixed_acc = [a for a in acc.values() if a["precision"] in MIXED]
    for a in judge("mp-accuracy", mixed_acc, "no fp16/bf16 arm in accuracy mode", not_fp32):
        verdict, measured = _same_accuracy(a)
        claim("mp-accuracy", verdict, f"{a['arm']} {a['main_metric']}: {measured}", arm=a)

    tensor_cores = [a for a in same if a["precision"] in ("tf32", *MIXED)]
    if cpu:
        claim("tensor-cores", NOT_CHECKED, "; ".join(f"{a['arm']} {a['speedup']:.2f}x" for a in tensor_cores
                                                     if a["speedup"]),
              "a CPU has no Tensor Cores; speed-ups measured here come from AVX512-BF16/AMX, not from the "
              "hardware the claim is about")
    for a in [] if cpu else judge("tensor-cores", tensor_cores if fp32 else [],
                                  "needs an fp32 baseline and a tf32/fp16/bf16 speed arm"):
        s = a["speedup"]
        claim("tensor-cores", _verdict(s is not None and s >= TENSOR_CORE_SPEEDUP[0]),
              f"{a['arm']}: {s:.2f}x {baseline} {where}",
              "more than the claimed 3x" if s and s > TENSOR_CORE_SPEEDUP[1] else "", a)

    # BF16 as stable as FP32, where FP16 needs loss scaling: two halves, two verdicts
    bf16 = [a for a in acc.values() if a["precision"] == "bf16"]
    for a in judge("bf16-stable", bf16 if baseline in acc else [], "needs bf16 and fp32 arms in accuracy mode"):
        verdict, measured = _same_accuracy(a)
        claim("bf16-stable", verdict, f"{a['arm']}: {a['diverged']} of {a['runs']} runs diverged, "
              f"{a['main_metric']} {measured}", arm=a)
    fp16 = [a for a in acc.values() if a["precision"] == "fp16"]
    for a in judge("fp16-scaling", fp16, "no fp16 arm in accuracy mode"):
        skipped = sum(s for s in a["skipped_steps"] if s)
        scales = ", ".join(f"{s:g}" for s in a["loss_scale_final"] if s is not None) or "n/a"
        claim("fp16-scaling", REPRODUCED if skipped else NOT_CHECKED,
              f"{a['arm']}: {skipped} overflowing steps skipped over {a['runs']} runs, final loss scale {scales}",
              "the dynamic scaler had to back off: fp16's range was exceeded at the initial scale" if skipped
              else "no step overflowed at the initial scale, and no run without scaling was tried, so "
              "whether fp16 needed the scaler here was not exercised", a)

    # Published anchors: the ratio compared where the setting is the anchor's
    by_prec = {a["precision"]: a for a in [base, *same] if a is not None}
    setting = (b["model"], speed[0]["seq_len"], speed[0]["batch_size"]) if speed else None
    nv, hf = NVIDIA_ANCHOR, HF_ANCHOR
    if "tf32" in by_prec and "fp16" in by_prec:
        f16, t32 = (by_prec[p]["samples_per_second"]["median"] for p in ("fp16", "tf32"))
        same_setting = setting == (nv["model"], nv["seq_len"], nv["batch_size"])
        claim("anchor-nvidia", _verdict(f16 / t32 >= 0.8 * nv["fp16"] / nv["tf32"]) if same_setting
              else NOT_CHECKED, f"fp16/tf32 = {f16 / t32:.2f}x ({f16:.1f} vs {t32:.1f} sequences/s) {where}",
              "ratio compared (within 20% or better); absolute numbers depend on the device and NVIDIA's "
              "optimised SQuAD code" if same_setting
              else "a different model/sequence length/batch: not comparable",
              text="NVIDIA BERT-large SQuAD fine-tuning, one A100-80GB, batch 32, seq 384: TF32 61.5 vs FP16 "
                   "110.5 sequences/s (1.79x), F1 90.93 vs 90.96")
    else:
        claim("anchor-nvidia", NOT_CHECKED, note="needs tf32 and fp16 speed arms on a GPU")
    if "fp16" in by_prec and (base or {}).get("precision") == "fp32":
        f = by_prec["fp16"]
        same_setting = setting == (hf["model"], hf["seq_len"], hf["batch_size"]) and not cpu
        claim("anchor-hf", _verdict(f["speedup"] >= 0.8 * hf["speedup"]) if same_setting else NOT_CHECKED,
              f"fp16: {f['speedup']:.2f}x fp32's throughput, {_pct(f['memory_vs_baseline'])} of its peak "
              f"memory {where}",
              "" if same_setting else "a different device/sequence length/batch: shown for comparison only")
    else:
        claim("anchor-hf", NOT_CHECKED, note="needs fp32 and fp16 speed arms")
    return claims


# --- saved results ----------------------------------------------------------------------------------------

def resummarize(res: dict) -> dict:
    """A results.json's accuracy statistics and claims computed again from its config and raw runs (after
    `combine` merged runs, or after a change to this module); its arms are composed and checked again."""
    b = OmegaConf.merge(OmegaConf.structured(BenchmarkConfig), res["benchmark"])
    runs = res["accuracy"]["runs"]
    res = dict(res, benchmark=OmegaConf.to_container(b, resolve=True, enum_to_str=True))
    res["accuracy"] = summarize_accuracy(b, runs, res["environment"], check(b))
    res["claims"] = evaluate_claims(res)
    return res
