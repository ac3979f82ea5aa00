"""Raw measurements → per-arm statistics → the claims, each with a plain verdict; for the precision benchmark
(`summarize_speed_arm`, `summarize_accuracy`, `evaluate_claims`) and for the comparison with the Trainer
(`summarize_peer`: medians over seeds, targets, accuracy paired by seed, each side's gain from a precision).

Everything here works on plain dicts (what results.json holds), so a report can be re-rendered from a
results.json without re-measuring: `render(json.load(open("results.json")))`.
"""

from __future__ import annotations

from math import sqrt
from statistics import mean, median, stdev

from omegaconf import DictConfig, OmegaConf

from ampft.benchmark import flops, stats
from ampft.benchmark.config import PeerConfig, Runner, check_peer
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


# --- accuracy -------------------------------------------------------------------------------------

def summarize_accuracy(runs: list[dict], arm_names: list[str], baseline: str) -> list[dict]:
    by_arm = {name: [r for r in runs if r["arm"] == name] for name in arm_names}
    base = {r["seed"]: r["metric"] for r in by_arm.get(baseline, []) if r["metric"] is not None}
    base_time = [r["train_seconds"] for r in by_arm.get(baseline, []) if r.get("train_seconds")]
    out = []
    for name, rs in by_arm.items():
        ok = [r for r in rs if r["metric"] is not None]
        values = {r["seed"]: r["metric"] for r in ok}
        times = [r["train_seconds"] for r in ok]
        a = dict(
            arm=name,
            precision=rs[0]["precision"] if rs else None,
            main_metric=rs[0]["main_metric"] if rs else None,
            runs=len(rs),
            diverged=sum(r["diverged"] for r in rs),
            metric=stats.describe(list(values.values())) if values else None,
            diff=stats.difference_ci(values, base) if values and base and name != baseline else None,
            train_seconds=stats.describe(times) if times else None,
            time_vs_baseline=stats.ratio(sum(times) / len(times), sum(base_time) / len(base_time))
            if times and base_time else None,
            train_samples_per_second=stats.describe([r["train_samples_per_second"] for r in ok]) if ok else None,
            skipped_steps=[r.get("skipped_steps") for r in rs],
            loss_scale_final=[r.get("loss_scale_final") for r in rs],
            final_train_loss=stats.describe([r["train_loss_last"] for r in ok]) if ok else None,
            other_cpu_share=max((r.get("other_cpu_share") or 0.0 for r in rs), default=None),
        )
        out.append(a)
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
    b, env = results["benchmark"], results["environment"]
    speed = (results.get("speed") or {}).get("arms", [])
    acc = {a["arm"]: a for a in (results.get("accuracy") or {}).get("arms", [])}
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


# --- the comparison with the Trainer (`make benchmark-peer`) ---------------------------------------


def _points(value: float | None) -> float | None:
    """Metrics in [0, 1] (GLUE's fractions) as percentage points; others as they are."""
    return None if value is None else (100 * value if abs(value) <= 1 else value)


def summarize_peer(p: DictConfig, cfgs: dict[str, DictConfig], runs: list[dict], env: dict, command: str | None) -> dict:
    """Per arm over seeds (medians for speed, means for the metric), speed ratios, targets and accuracy checks."""
    first = cfgs[p.arms[0].name]
    metric = first.task.main_metric
    arms = {}
    for arm in p.arms:
        rs = [r for r in runs if r["arm"] == arm.name]
        cfg = cfgs[arm.name]
        peak, peak_source = flops.peak_tflops(rs[0]["precision"], env["device_type"], env["device_name"],
                                        {rs[0]["precision"]: p.peak_tflops})
        tflops = median(r["model_tflops"] for r in rs)
        arms[arm.name] = dict(
            runner=Runner(arm.runner).value, overrides=list(arm.overrides),
            samples_per_second=median(r["train_samples_per_second"] for r in rs),
            tokens_per_second=median(r["train_tokens_per_second"] for r in rs),
            train_seconds=median(r["train_seconds"] for r in rs),
            wall_seconds=median(r["wall_seconds"] for r in rs),
            setup_seconds=median(r["setup_seconds"] for r in rs),
            metric=mean(_points(r["eval"][metric]) for r in rs),
            metric_per_seed=[_points(r["eval"][metric]) for r in rs],
            metric_std=stdev(_points(r["eval"][metric]) for r in rs) if len(rs) > 1 else None,
            samples_per_second_per_seed=[r["train_samples_per_second"] for r in rs],
            peak_memory_bytes=max(r["peak_memory_bytes"] for r in rs), peak_memory_kind=rs[0]["peak_memory_kind"],
            model_tflops=tflops, mfu=flops.mfu(tflops, peak), peak_tflops=peak,
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


def resummarize_peer(old: dict) -> dict:
    """A saved comparison's results.json summarized again from its config, environment and raw runs."""
    p = OmegaConf.merge(OmegaConf.structured(PeerConfig), old["config"])
    res = summarize_peer(p, check_peer(p), upgrade_runs(old["runs"]), old["environment"], old["command"])
    res["seeds_requested"] = old.get("seeds_requested", list(p.seeds))
    if "sources" in old:  # `combine`d from several runs
        res["sources"] = old["sources"]
    return res


OLD_NAMES = {"samples_per_second": "train_samples_per_second", "tokens_per_second": "train_tokens_per_second",
             "train_log": "loss_curve"}


def upgrade_runs(runs: list[dict]) -> list[dict]:
    """A saved comparison's runs with the record keys of today (`accuracy.run_seed`'s): results.json files
    written before the two runners shared them keep re-rendering and combining."""
    return [{OLD_NAMES.get(k, k): v for k, v in r.items()} for r in runs]


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
