"""Raw measurements → per-arm statistics → the claims and the comparison's checks, each with a plain verdict.

Speed arms: `summarize_speed_arm`, `add_speed_ratios`. Accuracy arms (`summarize_accuracy`), whoever trained
them: the metric's mean/std and its paired difference to the baseline with a confidence interval, medians of
the speeds over seeds, model TFLOP/s; then the targets (samples/s ratios), the accuracy checks against the
reference arms, each side's gain from a precision (an fp32 arm and its twin) and ampft against the Trainer per
precision. `evaluate_claims` judges the published mixed-precision claims (ampft arms only).

Everything works on plain dicts (what results.json holds), so a report can be re-rendered without re-measuring.
"""

from __future__ import annotations

from math import sqrt
from statistics import mean, median, stdev

from omegaconf import DictConfig, OmegaConf

from ampft.benchmark import flops, stats
from ampft.benchmark.config import BenchmarkConfig, Mode, Runner, arms_for
from ampft.config import Precision
from ampft.devices import HF_ANCHOR, MEMORY_CLAIM, NVIDIA_ANCHOR, SLACK, TENSOR_CORE_SPEEDUP, TIME_CLAIM

REPRODUCED, NOT_REPRODUCED, NOT_CHECKED = "reproduced", "did not reproduce", "not checked"
MIXED = ("fp16", "bf16")


# --- speed ----------------------------------------------------------------------------------------

def summarize_speed_arm(raw: dict, env: dict, peak_override: dict | None) -> dict:
    """Median and spread of step time; throughput, TFLOP/s and MFU at the median; peak memory."""
    t = stats.describe(raw["step_seconds"])
    bs, tokens = raw["batch_size"], raw["batch_size"] * raw["seq_len"]
    # Throughput quartiles come from the step-time quartiles (a slower step is a lower throughput).
    samples = dict(median=bs / t["median"], q1=bs / t["q3"], q3=bs / t["q1"], min=bs / t["max"], max=bs / t["min"])
    tok = {k: v * raw["seq_len"] for k, v in samples.items()}
    tflops = raw["flops_per_token"] * tokens / t["median"] / 1e12
    peak, source = flops.peak_tflops(raw["precision"], env["device_type"], env["device_name"], peak_override)
    mem = raw["memory_peak"]
    if "peak_allocated_bytes" in mem:
        memory, kind = mem["peak_allocated_bytes"], "cuda_peak_allocated"
    else:
        memory, kind = mem.get("peak_rss_bytes"), "cpu_peak_rss"
    return dict(
        arm=raw["arm"], precision=raw["precision"], precision_requested=raw["precision_requested"],
        attn_implementation=raw["attn_implementation"], batch_size=bs, seq_len=raw["seq_len"],
        step_time=t, samples_per_second=samples, tokens_per_second=tok, tflops=tflops,
        peak_tflops=peak, peak_tflops_source=source, mfu=flops.mfu(tflops, peak),
        peak_memory_bytes=memory, peak_memory_kind=kind,
        peak_reserved_bytes=mem.get("peak_reserved_bytes"),
        skipped_steps=raw["skipped_steps"], flops_per_token=raw["flops_per_token"],
        params=raw["params"], params_nonembedding=raw["params_nonembedding"],
        other_cpu_share=raw.get("other_cpu_share"),
    )


def add_speed_ratios(arms: list[dict], baseline: str) -> None:
    base = next((a for a in arms if a["arm"] == baseline), None)
    for a in arms:
        if base is None:
            a.update(time_vs_baseline=None, memory_vs_baseline=None, speedup=None)
            continue
        # Time per sample, so arms with another batch size compare fairly; equal to the step-time ratio
        # when the batch is the same.
        a["speedup"] = stats.ratio(a["samples_per_second"]["median"], base["samples_per_second"]["median"])
        a["time_vs_baseline"] = None if not a["speedup"] else 1 / a["speedup"]
        a["memory_vs_baseline"] = stats.ratio(a["peak_memory_bytes"], base["peak_memory_bytes"])


# --- accuracy ---------------------------------------------------------------------------------------

def _points(value: float | None) -> float | None:
    """Metrics in [0, 1] (GLUE's fractions) as percentage points; others as they are."""
    return None if value is None else (100 * value if abs(value) <= 1 else value)


def _paired(a: dict, b: dict) -> list[tuple[float, float]]:
    """(a's metric, b's) in points for each seed both arms have a metric for (a diverged or missing run has
    none); `metric_per_seed` follows benchmark.accuracy.seeds."""
    return [(_points(x), _points(y)) for x, y in zip(a["metric_per_seed"], b["metric_per_seed"], strict=True)
            if x is not None and y is not None]


def summarize_accuracy(b: DictConfig | dict, runs: list[dict], env: dict, cfgs: dict | None = None) -> dict:
    """Per arm over its seeds, and the comparison's checks (module docstring). `cfgs` (`config.check`'s) finds
    the precision twins; without it there are no precision gains."""
    b = OmegaConf.merge(OmegaConf.structured(BenchmarkConfig), b)
    names = [a.name for a in arms_for(b, Mode.accuracy) if any(r["arm"] == a.name for r in runs)]
    by_arm = {n: [r for r in runs if r["arm"] == n] for n in names}
    baseline = b.baseline
    base = {r["seed"]: r["metric"] for r in by_arm.get(baseline, []) if r["metric"] is not None}
    base_time = [r["train_seconds"] for r in by_arm.get(baseline, []) if r.get("train_seconds")]
    seed_of = {(r["arm"], r["seed"]): r for r in runs}
    arms = {}
    for arm in (a for a in b.arms if a.name in by_arm):
        rs = by_arm[arm.name]
        ok = [r for r in rs if r["metric"] is not None]
        values = {r["seed"]: r["metric"] for r in ok}
        times = [r["train_seconds"] for r in ok]
        precision = rs[0]["precision"]
        peak, source = flops.peak_tflops(precision, env["device_type"], env["device_name"],
                                         OmegaConf.to_container(b.peak_tflops))
        tflops = [r["model_tflops"] for r in ok if r.get("model_tflops")]
        last = [r["train_loss_last"] for r in ok if r.get("train_loss_last") is not None]

        def med(key: str, rows: list[dict] = ok) -> float | None:
            values_ = [r[key] for r in rows if r.get(key) is not None]
            return median(values_) if values_ else None

        arms[arm.name] = dict(
            arm=arm.name, runner=Runner(arm.runner).value, overrides=list(arm.overrides), precision=precision,
            main_metric=rs[0]["main_metric"], runs=len(rs), diverged=sum(r["diverged"] for r in rs),
            metric=stats.describe(list(values.values())) if values else None,
            metric_per_seed=[seed_of.get((arm.name, s), {}).get("metric") for s in b.accuracy.seeds],
            diff=stats.difference_ci(values, base) if values and base and arm.name != baseline else None,
            train_seconds=stats.describe(times) if times else None,
            time_vs_baseline=stats.ratio(mean(times), mean(base_time)) if times and base_time else None,
            train_samples_per_second=stats.describe([r["train_samples_per_second"] for r in ok]) if ok else None,
            samples_per_second=med("train_samples_per_second"), tokens_per_second=med("train_tokens_per_second"),
            wall_seconds=med("wall_seconds"), setup_seconds=med("setup_seconds"),
            samples_per_second_per_seed=[seed_of.get((arm.name, s), {}).get("train_samples_per_second")
                                         for s in b.accuracy.seeds],
            skipped_steps=[r.get("skipped_steps") for r in rs],
            loss_scale_final=[r.get("loss_scale_final") for r in rs],
            final_train_loss=stats.describe(last) if last else None,
            other_cpu_share=max((r.get("other_cpu_share") or 0.0 for r in rs), default=None),
            peak_memory_bytes=max((r.get("peak_memory_bytes") or 0 for r in rs), default=None) or None,
            peak_memory_kind=rs[0].get("peak_memory_kind"),
            model_tflops=median(tflops) if tflops else None, mfu=flops.mfu(median(tflops), peak) if tflops else None,
            peak_tflops=peak, peak_tflops_source=source, attn_implementation=rs[0].get("attn_implementation"),
            steps=rs[0].get("steps"), train_examples=rs[0].get("train_examples"),
            profile=next((r["profile"] for r in rs if (r.get("profile") or {}).get("steps")), None),
        )
    trainers = [n for n, a in arms.items() if a["runner"] == Runner.trainer.value]

    def ratio(x: str, y: str) -> float | None:
        return stats.ratio(arms[x]["samples_per_second"], arms[y]["samples_per_second"])

    for name, a in arms.items():  # against the Trainer arms of the same precision
        a["speedup"] = {t: ratio(name, t) for t in trainers if arms[t]["precision"] == a["precision"]}
    targets = [dict(arm=t.arm, over=t.over, min_ratio=t.min_ratio, ratio=ratio(t.arm, t.over)) for t in b.targets
               if t.arm in arms and t.over in arms]
    for t in targets:
        t["met"] = t["ratio"] is not None and t["ratio"] >= t["min_ratio"]
    references = [r for r in (list(b.accuracy.reference) or trainers) if r in arms]
    checks = [paired_accuracy(_paired(arms[n], arms[ref]), b.accuracy.tolerance) | dict(arm=n, reference=ref)
              for ref in references for n in arms if n != ref and _paired(arms[n], arms[ref])]
    gains = precision_gains(arms, precision_pairs(b, cfgs, list(arms))) if cfgs else []
    return dict(runs=runs, arms=list(arms.values()), targets=targets, checks=checks,
                tolerance=b.accuracy.tolerance, precision_gains=gains, by_precision=by_precision(arms, gains))


def paired_accuracy(pairs: list[tuple[float, float]], tolerance: float) -> dict:
    """An arm's metric against a reference arm's, paired by seed ((arm, reference) per seed, in points; every
    arm ran the same seeds, so the same initialisation and examples): the per-seed differences, their mean and
    its standard error; whether the mean is within `tolerance` points, and within one seed standard deviation
    of the reference (how far two seeds of the reference itself typically fall apart; None with one seed)."""
    per_seed = [a - r for a, r in pairs]
    difference = mean(per_seed)
    several = len(per_seed) > 1
    reference_std = stdev(r for _, r in pairs) if several else None
    return dict(difference=difference, per_seed=per_seed,
                standard_error=stdev(per_seed) / sqrt(len(per_seed)) if several else None,
                reference_std=reference_std, within=abs(difference) <= tolerance,
                within_reference_std=abs(difference) <= reference_std if several else None)


def precision_pairs(b: DictConfig, cfgs: dict, names: list[str]) -> list[tuple[str, str]]:
    """(fp32 arm, arm) for each arm in another precision whose finetune config is, but for the precision
    group, an fp32 arm's of the same runner: the two differ in nothing else, so their samples/s ratio is
    that side's gain from the precision, and their metrics are paired (same seeds, data and order)."""
    seed = b.accuracy.seeds[0]

    def cfg(name: str) -> DictConfig:
        return cfgs[(Mode.accuracy.value, name, seed)]

    def rest(name: str) -> dict:
        return {k: v for k, v in OmegaConf.to_container(cfg(name), resolve=True).items() if k != "precision"}

    arms = [a for a in b.arms if a.name in names]
    fp32 = [a for a in arms if Precision(cfg(a.name).precision.name) == Precision.fp32]
    pairs = []
    for arm in arms:
        if Precision(cfg(arm.name).precision.name) == Precision.fp32:
            continue
        twin = next((f for f in fp32 if Runner(f.runner) == Runner(arm.runner) and rest(f.name) == rest(arm.name)),
                    None)
        if twin is not None:
            pairs.append((twin.name, arm.name))
    return pairs


def precision_gains(arms: dict[str, dict], pairs: list[tuple[str, str]]) -> list[dict]:
    """Each pair's samples/s ratio (medians over seeds) and metric difference (mean of the per-seed
    differences, in points), from the arms' measured numbers."""
    gains = []
    for base, arm in pairs:
        a, b = arms[arm], arms[base]
        per_seed = [x - y for x, y in _paired(a, b)]
        if not per_seed or not a["samples_per_second"] or not b["samples_per_second"]:
            continue
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
                                 trainer_metric=_points(ta["metric"]["mean"]), ampft_metric=_points(aa["metric"]["mean"]),
                                 metric_difference=mean(x - y for x, y in _paired(aa, ta))))
            out.append(dict(precision=t["precision"], trainer_gain=t["ratio"], ampft_gain=a["ratio"],
                            gain_ratio=a["ratio"] / t["ratio"], gain_at_least_trainer=a["ratio"] >= t["ratio"],
                            rows=rows))
    return out


# --- claims ---------------------------------------------------------------------------------------

def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _comparable(speed: list[dict], baseline: str) -> tuple[dict | None, list[dict]]:
    """The baseline and the arms that differ from it only in precision (same attention and batch)."""
    base = next((a for a in speed if a["arm"] == baseline), None)
    if base is None:
        return None, []
    same = [a for a in speed if a is not base and a["attn_implementation"] == base["attn_implementation"]
            and a["batch_size"] == base["batch_size"] and a["seq_len"] == base["seq_len"]]
    return base, same


def _ci_text(a: dict) -> str:
    d = a["diff"]
    if d is None:
        return "n/a"
    if d["ci_low"] is None:
        return f"{d['mean']:+.4f} (n={d['n']}, no interval)"
    return f"{d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"


def _same_accuracy(a: dict | None) -> tuple[str, str]:
    if a is None or a["diff"] is None:
        return NOT_CHECKED, "no accuracy runs for this arm"
    if a["diverged"]:
        return NOT_REPRODUCED, f"{a['diverged']} of {a['runs']} runs diverged"
    d = a["diff"]
    if d["ci_low"] is None:
        return NOT_CHECKED, f"difference {d['mean']:+.4f} from {d['n']} seed(s): too few for an interval"
    if d["ci_low"] <= 0 <= d["ci_high"]:
        return REPRODUCED, f"difference {_ci_text(a)} (95% CI contains 0, {d['n']} seeds)"
    return NOT_REPRODUCED, f"difference {_ci_text(a)} (95% CI excludes 0, {d['n']} seeds)"


def evaluate_claims(results: dict) -> list[dict]:
    """The published claims judged on this run's ampft arms; none for a benchmark with a Trainer arm (a
    comparison has targets instead) or with one precision (the claims compare precisions)."""
    b, env = results["benchmark"], results["environment"]
    speed = (results.get("speed") or {}).get("arms", [])
    acc = {a["arm"]: a for a in (results.get("accuracy") or {}).get("arms", [])}
    if (any(a.get("runner") == Runner.trainer.value for a in b["arms"])
            or len({a["precision"] for a in [*speed, *acc.values()]}) < 2):
        return []
    baseline = b["baseline"]
    base, same = _comparable(speed, baseline)
    base_acc = acc.get(baseline)
    cpu = env["device_type"] != "cuda"
    where = f"on this {'CPU' if cpu else 'GPU'} ({env['device_name']})"
    claims: list[dict] = []

    def claim(cid: str, text: str, verdict: str, measured: str, note: str = "") -> None:
        claims.append(dict(id=cid, claim=text, verdict=verdict, measured=measured, note=note))

    base_is_fp32 = (base or {}).get("precision") == "fp32" or (base_acc or {}).get("precision") == "fp32"
    mixed = [a for a in same if a["precision"] in MIXED]
    # 1. time, memory, accuracy of mixed precision vs fp32
    text1 = "Mixed precision trains in about 60% of FP32's time"
    text2 = "Mixed precision needs about 57% of FP32's memory"
    text3 = "Mixed precision reaches the same accuracy as FP32"
    if not base_is_fp32:
        for cid, text in (("mp-time", text1), ("mp-memory", text2), ("mp-accuracy", text3)):
            claim(cid, text, NOT_CHECKED, "", f"the baseline arm {baseline} is not fp32")
    else:
        if not mixed:
            claim("mp-time", text1, NOT_CHECKED, "", "no fp16/bf16 speed arm comparable with the baseline")
            claim("mp-memory", text2, NOT_CHECKED, "", "no fp16/bf16 speed arm comparable with the baseline")
        for a in mixed:
            ok = a["time_vs_baseline"] is not None and a["time_vs_baseline"] <= TIME_CLAIM + SLACK
            claim(f"mp-time-{a['arm']}", text1,
                  NOT_CHECKED if cpu else REPRODUCED if ok else NOT_REPRODUCED,
                  f"{a['arm']}: {_pct(a['time_vs_baseline'])} of {baseline}'s time per sample {where}",
                  "the claim is about GPUs (Tensor Cores); the CPU number is for the record" if cpu else "")
            ok = a["memory_vs_baseline"] is not None and a["memory_vs_baseline"] <= MEMORY_CLAIM + SLACK
            claim(f"mp-memory-{a['arm']}", text2,
                  NOT_CHECKED if cpu else REPRODUCED if ok else NOT_REPRODUCED,
                  f"{a['arm']}: {_pct(a['memory_vs_baseline'])} of {baseline}'s peak memory "
                  f"({a['peak_memory_kind']})",
                  "on a CPU the peak RSS of the process includes the interpreter, libraries and data, which no "
                  "precision changes, so it cannot show the claimed GPU-memory saving" if cpu else "")
        acc_mixed = [a for a in acc.values() if a["precision"] in MIXED]
        if not acc_mixed:
            claim("mp-accuracy", text3, NOT_CHECKED, "", "no fp16/bf16 arm in accuracy mode")
        for a in acc_mixed:
            verdict, measured = _same_accuracy(a)
            claim(f"mp-accuracy-{a['arm']}", text3, verdict, f"{a['arm']} {a['main_metric']}: {measured}")

    # 2. Tensor Cores: 1.5-3x throughput
    text = "Tensor Cores (TF32/FP16/BF16) give 1.5-3x FP32's throughput"
    tc = [a for a in same if a["precision"] in ("tf32", "fp16", "bf16")]
    if cpu:
        measured = "; ".join(f"{a['arm']} {a['speedup']:.2f}x" for a in tc if a["speedup"]) or ""
        claim("tensor-cores", text, NOT_CHECKED, measured,
              "a CPU has no Tensor Cores; speed-ups measured here come from AVX512-BF16/AMX, not from the hardware "
              "the claim is about")
    elif not base_is_fp32 or not tc:
        claim("tensor-cores", text, NOT_CHECKED, "", "needs an fp32 baseline and a tf32/fp16/bf16 speed arm")
    else:
        for a in tc:
            s = a["speedup"]
            verdict = REPRODUCED if s is not None and s >= TENSOR_CORE_SPEEDUP[0] else NOT_REPRODUCED
            note = "more than the claimed 3x" if s and s > TENSOR_CORE_SPEEDUP[1] else ""
            claim(f"tensor-cores-{a['arm']}", text, verdict, f"{a['arm']}: {s:.2f}x {baseline} {where}", note)

    # 3. BF16 as stable as FP32, where FP16 needs loss scaling (two halves, two verdicts)
    text = "BF16 is as stable as FP32 (no loss scaling)"
    bf16 = [a for a in acc.values() if a["precision"] == "bf16"]
    fp16 = [a for a in acc.values() if a["precision"] == "fp16"]
    if not bf16 or base_acc is None:
        claim("bf16-stable", text, NOT_CHECKED, "", "needs bf16 and fp32 arms in accuracy mode")
    for a in bf16 if base_acc is not None else []:
        verdict, measured = _same_accuracy(a)
        claim(f"bf16-stable-{a['arm']}", text, verdict, f"{a['arm']}: {a['diverged']} of {a['runs']} runs diverged, "
              f"{a['main_metric']} {measured}")
    text = "FP16 needs loss scaling"
    if not fp16:
        claim("fp16-scaling", text, NOT_CHECKED, "", "no fp16 arm in accuracy mode")
    for a in fp16:
        skipped = sum(s for s in a["skipped_steps"] if s)
        scales = [s for s in a["loss_scale_final"] if s is not None]
        measured = (f"{a['arm']}: {skipped} overflowing steps skipped over {a['runs']} runs, final loss scale "
                    f"{', '.join(f'{s:g}' for s in scales) or 'n/a'}")
        if skipped:
            claim(f"fp16-scaling-{a['arm']}", text, REPRODUCED, measured,
                  "the dynamic scaler had to back off: fp16's range was exceeded at the initial scale")
        else:
            claim(f"fp16-scaling-{a['arm']}", text, NOT_CHECKED, measured,
                  "no step overflowed at the initial scale, and no run without scaling was tried, so whether "
                  "fp16 needed the scaler here was not exercised")

    # Published anchors
    by_prec = {a["precision"]: a for a in [base, *same] if a is not None}
    setting = (b["model"], speed[0]["seq_len"], speed[0]["batch_size"]) if speed else None
    nv = NVIDIA_ANCHOR
    if "tf32" in by_prec and "fp16" in by_prec:
        r = by_prec["fp16"]["samples_per_second"]["median"] / by_prec["tf32"]["samples_per_second"]["median"]
        same_setting = setting == (nv["model"], nv["seq_len"], nv["batch_size"])
        measured = (f"fp16/tf32 = {r:.2f}x ({by_prec['fp16']['samples_per_second']['median']:.1f} vs "
                    f"{by_prec['tf32']['samples_per_second']['median']:.1f} sequences/s) {where}")
        verdict = (REPRODUCED if r >= 0.8 * nv["fp16"] / nv["tf32"] else NOT_REPRODUCED) if same_setting else NOT_CHECKED
        claim("anchor-nvidia", "NVIDIA BERT-large SQuAD fine-tuning, one A100-80GB, batch 32, seq 384: TF32 61.5 vs "
              "FP16 110.5 sequences/s (1.79x), F1 90.93 vs 90.96", verdict, measured,
              ("ratio compared (within 20% or better); absolute numbers depend on the device and NVIDIA's "
               "optimised SQuAD code" if same_setting else "a different model/sequence length/batch: not comparable"))
    else:
        claim("anchor-nvidia", "NVIDIA BERT-large SQuAD fine-tuning, one A100-80GB: TF32 61.5 vs FP16 110.5 "
              "sequences/s (1.79x)", NOT_CHECKED, "", "needs tf32 and fp16 speed arms on a GPU")
    if "fp16" in by_prec and base is not None and base["precision"] == "fp32":
        f = by_prec["fp16"]
        measured = f"fp16: {f['speedup']:.2f}x fp32's throughput, {_pct(f['memory_vs_baseline'])} of its peak memory {where}"
        same_setting = setting == (HF_ANCHOR["model"], HF_ANCHOR["seq_len"], HF_ANCHOR["batch_size"]) and not cpu
        verdict = NOT_CHECKED
        if same_setting:
            verdict = REPRODUCED if f["speedup"] >= 0.8 * HF_ANCHOR["speedup"] else NOT_REPRODUCED
        claim("anchor-hf", "Hugging Face: bert-large, seq 512, batch 4, one V100: fp16 2.1x fp32 throughput but only "
              "7% less memory", verdict, measured,
              "" if same_setting else "a different device/sequence length/batch: shown for comparison only")
    else:
        claim("anchor-hf", "Hugging Face: bert-large, seq 512, batch 4, one V100: fp16 2.1x fp32 throughput but only "
              "7% less memory", NOT_CHECKED, "", "needs fp32 and fp16 speed arms")
    return claims


# --- saved results ----------------------------------------------------------------------------------------

def resummarize(res: dict) -> dict:
    """A results.json's accuracy statistics and claims computed again from its config and raw runs (after
    `combine` merged runs, or after a change to this module); its arms are composed and checked again."""
    from ampft.benchmark.config import check

    b = OmegaConf.merge(OmegaConf.structured(BenchmarkConfig), res["benchmark"])
    runs = res["accuracy"]["runs"]
    res = dict(res, benchmark=OmegaConf.to_container(b, resolve=True, enum_to_str=True))
    res["accuracy"] = summarize_accuracy(b, runs, res["environment"], check(b))
    res["claims"] = evaluate_claims(res)
    return res
