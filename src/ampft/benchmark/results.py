"""Raw measurements → per-arm statistics → the claims, each with a plain verdict.

Everything here works on plain dicts (what results.json holds), so a report can be re-rendered from a
results.json without re-measuring: `render(json.load(open("results.json")))`.
"""

from __future__ import annotations

from ampft.benchmark import flops, stats
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
