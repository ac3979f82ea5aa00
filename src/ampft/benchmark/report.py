"""results.json, results.csv (every raw measurement, one per row), report.md (`render`) and the PNGs (`plots`)."""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

from ampft.benchmark.config import Runner
from ampft.benchmark.plots import PLOTS, make_plots
from ampft.benchmark.profile import SKIP, WARMUP
from ampft.benchmark.results import NOT_CHECKED, NOT_REPRODUCED, REPRODUCED
from ampft.benchmark.stats import ratio
from ampft.devices import cpu_half_support
from ampft.extras import MissingExtraError
from ampft.files import markdown_table

log = logging.getLogger(__name__)

BUSY = 0.1  # other processes' share of the machine's CPU above which timings are flagged
CSV_FIELDS = ["mode", "arm", "precision", "seed", "batch_size", "seq_len", "index", "quantity", "value"]
ACC_RUN_FIELDS = ("train_loss", "train_loss_last", "steps", "skipped_steps", "loss_scale_final", "train_seconds",
                  "wall_seconds", "train_samples_per_second", "train_tokens_per_second")


def _clean(value):
    """JSON without NaN/inf (written as null), recursively."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_json(results: dict, path: Path) -> None:
    Path(path).write_text(json.dumps(_clean(results), indent=2, default=str) + "\n")


def csv_rows(results: dict) -> list[dict]:
    rows: list[dict] = []

    def add(common: tuple, items) -> None:  # items: (index, quantity, value)
        rows.extend(dict(zip(CSV_FIELDS, (*common, *item), strict=True)) for item in items)

    seed = results["benchmark"]["seed"]
    for r in (results.get("speed") or {}).get("raw", []):
        add(("speed", r["arm"], r["precision"], seed, r["batch_size"], r["seq_len"]), [
            *((i, q, v) for q, key in (("warmup_step_seconds",) * 2, ("step_seconds",) * 2, ("loss", "losses"))
              for i, v in enumerate(r[key])),
            *((None, k, v) for k, v in r["memory_peak"].items()),
            *((None, k, r[k]) for k in ("skipped_steps", "flops_per_token", "params", "params_nonembedding"))])
        for p in r["sweep"]:
            add(("sweep", r["arm"], r["precision"], seed, p["batch_size"], r["seq_len"]), [
                (None, "fits", int(p["fits"])),
                *((None, k, v) for k, v in p.items() if k not in ("batch_size", "fits"))])
    for r in (results.get("accuracy") or {}).get("runs", []):
        add(("accuracy", r["arm"], r["precision"], r["seed"], None, None), [
            *((None, f"eval_{k}", v) for k, v in (r.get("eval") or {}).items()),
            *((None, k, r[k]) for k in ACC_RUN_FIELDS if r.get(k) is not None), (None, "diverged", int(r["diverged"])),
            *((step, "train_loss_window", loss) for step, loss, *_ in r["loss_curve"]),  # [step, loss, lr]
            *((step, "loss_scale", scale) for step, scale in r["loss_scale_trace"])])
    return rows


def write_csv(results: dict, path: Path) -> None:
    with open(path, "w", newline="") as f:
        (w := csv.DictWriter(f, fieldnames=CSV_FIELDS)).writeheader()
        w.writerows(csv_rows(results))


# --- report.md ------------------------------------------------------------------------------------

def _f(x, fmt=".1f") -> str:
    return "—" if x is None else format(x, fmt)


def _mib(x) -> str:
    return "—" if x is None else f"{x / 2**20:,.0f} MiB"


def _join(xs, fmt="") -> str:
    return ", ".join(_f(x, fmt) for x in xs)


def fmt_seconds(s: float | None) -> str:
    """'45 s', '3 min 05 s', 'unknown'."""
    if s is None or not math.isfinite(s):
        return "unknown"
    s = max(0, round(s))
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60:02d} s"


def _acc_text(a: dict) -> str:
    if (m := a["metric"]) is None:
        return f"diverged ({a['diverged']}/{a['runs']})"
    return f"{m['mean']:.4f}" + ("" if m["std"] is None else f" ± {m['std']:.4f}") + f" (n={m['n']})"


def _diff_text(a: dict) -> str:
    if (d := a["diff"]) is None:
        return "—"
    return f"{d['mean']:+.4f} " + (f"(no CI, n={d['n']})" if d["ci_low"] is None
                                   else f"[{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]")


def _budget(bud: dict, base: str) -> tuple[str, list[str]]:
    """The sentence at the top (the budget, the time taken, what was cut) and the "Time budget" section."""
    if bud.get("minutes") is None:
        return "", []
    took, cuts = fmt_seconds(bud["seconds_used"]), bud["cuts"]
    line = (f"**Time budget:** {fmt_seconds(60 * bud['minutes'])}; took {took}, "
            f"{'within it' if bud['within'] else '**over it**'}.")
    line += (" Cut to keep it: " + "; ".join(f"`{c['arm']}` {c['mode']} {c['action']} ({c['detail']})" for c in cuts)
             + " ([why](#time-budget))." if cuts else " Nothing was cut.")
    out = ["## Time budget", "",
           f"`benchmark.budget_minutes: {bud['minutes']:g}`; the benchmark took {took}. Speed mode may use half of "
           "the budget when accuracy mode follows, shared equally by the speed arms not yet measured: two pilot "
           "steps at a quarter of the batch project an arm's step, then it takes the timed steps and the memory "
           "sweep that fit (the baseline at least its warm-up and two timed steps; another arm stops after its "
           "pilot if even those do not fit). Before each accuracy run the rest is projected from the runs so far, "
           "and the slowest arms' remaining runs are cut until it fits (`docs/benchmarks/README.md#the-time-budget`).",
           ""]
    if ratios := bud.get("step_time_vs_baseline"):
        out += [f"Step time relative to `{base}` in speed mode (where an arm went no further than its pilot, the "
                "pilot's projection, a rougher figure: at a quarter of the batch, per-step overheads weigh more): "
                + ", ".join(f"`{k}` {v:.2f}x" for k, v in ratios.items()) + ".", ""]
    if cuts:
        out += [*markdown_table(["arm", "mode", "cut", "what remains", "why", "at"], [
            [f"`{c['arm']}`", c["mode"], c["action"], c["detail"], c["reason"], fmt_seconds(c["at_seconds"])]
            for c in cuts]), ""]
    return line, out


def device_text(env: dict) -> str:
    """The device measured on, in a few words: the GPU's name, memory and compute capability, or the CPU's."""
    return (f"{env['device_name']} ({env['device_memory_bytes'] / 2**30:.0f} GiB, compute capability "
            f"{env['compute_capability']})" if env["device_type"] == "cuda" else
            f"{env['device_name']}, {env['cpu_count']} cores, CPU only (no GPU)")


def hardware(env: dict) -> list[str]:
    """The "Hardware and software" section: the GPU if any, always the CPU and its half-precision flags."""
    cpu = [["CPU features", ", ".join(env["cpu_features"]) or "—"], ["torch threads", str(env["torch_threads"])]]
    gpu = ([["driver", env["driver"] or "unknown"], ["CUDA / cuDNN", f"{env['cuda']} / {env['cudnn']}"],
            ["host CPU", f"{env['cpu']} ({env['cpu_count']} cores)"], *cpu] if env["device_type"] == "cuda"
           else [*cpu, ["driver", "n/a (no GPU)"]])
    rows = [["date", env["date"]], ["device", device_text(env)], *gpu,
            ["load average at start", "—" if (load := env.get("load_average")) is None else f"{load} (1 min)"],
            *([k, env[k]] for k in ("torch", "transformers", "accelerate", "python")), ["OS", env["os"]]]
    return ["## Hardware and software", "", *markdown_table(["", ""], rows), ""]


def render(results: dict, plots: list[str] | None = None) -> str:
    b, env, acc = results["benchmark"], results["environment"], results.get("accuracy") or {}
    measured = results.get("speed") or {}
    speed, speed_raw = measured.get("arms", []), measured.get("raw", [])
    acc_arms = acc.get("arms", [])
    trainers = [a["arm"] for a in acc_arms if a["runner"] == Runner.trainer.value]
    precisions = {a["precision"] for a in [*speed, *acc_arms]}
    what = ": ampft vs the Hugging Face Trainer" if trainers else ": precision A/B" if len(precisions) > 1 else ""
    out = [f"# Benchmark `{b['name']}`{what}", "",
           f"Measured {env['date']} on {device_text(env)}. Command: `{results.get('command', '')}`.", ""]
    if sources := results.get("sources"):  # `combine`: seeds measured in separate runs
        out += [f"Combined from {len(sources)} runs of this setup on this machine (`ampft.benchmark.combine`), "
                "summarized as one:", "",
                *(f"- `{s['dir']}`: seeds {s['seeds']}, arms {', '.join(s['arms'])}; `{s['command']}`"
                  for s in sources), ""]
    if results.get("partial_seeds"):
        out += [f"**Partial**: seeds {results['partial_seeds']} of the {b['accuracy']['seeds']} asked for were "
                "measured when this report was written (it is rewritten after every seed; the benchmark stopped or "
                "was still running).", ""]
    if busy := [f"`{a['arm']}`" + (f" seed {a['seed']}" if "seed" in a else "") + f" ({a['other_cpu_share']:.0%}"
                " of the machine)" for a in [*speed_raw, *acc.get("runs", [])] if (a.get("other_cpu_share") or 0) > BUSY]:
        out += ["**Warning:** other processes used the CPU while these were measured, so their timings are "
                "unreliable: " + ", ".join(busy) + ".", ""]
    budget_line, budget_section = _budget(results.get("budget") or {}, b["baseline"])
    out += [budget_line, ""] if budget_line else []
    out += hardware(env) + _setup(results, trainers) + budget_section
    if cut := [a["name"] for a in b["arms"] if not any(x["arm"] == a["name"] for x in [*speed, *acc_arms])]:
        out += [f"Not measured (cut by the time budget): {', '.join(f'`{n}`' for n in cut)}.", ""]
    out += _speed(results) if speed else []
    out += _accuracy(results, {a["arm"]: a for a in acc_arms}, trainers) if acc_arms else []
    if claims := results.get("claims", []):
        order = [NOT_REPRODUCED, NOT_CHECKED, REPRODUCED]
        out += ["## Claims", "", *markdown_table(["claim", "verdict", "measured", "note"], [
            [c["claim"], f"**{c['verdict']}**", c["measured"] or "—", c["note"] or ""]
            for c in sorted(claims, key=lambda c: order.index(c["verdict"]))]), ""]
    if plots:
        out += ["## Plots", "", *(x for p in plots for x in (f"![{PLOTS[p][2] if p in PLOTS else p}]({p})", ""))]
    out += ["Raw measurements: `results.csv` (one per row) and `results.json` (with the statistics above)."]
    return "\n".join(out) + "\n"


def _setup(results: dict, trainers: list[str]) -> list[str]:
    b = results["benchmark"]
    s, sw, acc, cuda = b["speed"], b["sweep"], b["accuracy"], results["environment"]["device_type"] == "cuda"
    out = ["## Setup", "",
           f"- model `{b['model']}`, task `{b['task']}`, sequence length {b['seq_len']}, batch {b['batch_size']}, "
           f"baseline arm `{b['baseline']}`; shared overrides {[*b['overrides'], *b.get('extra', [])]}; arms: "
           + ", ".join(f"`{a['name']}` ({a.get('runner', 'ampft')}: {' '.join(a['overrides']) or 'defaults'})"
                       for a in b["arms"])]
    if "speed" in b["modes"]:
        pilot = "two pilot steps at a quarter of the batch (for the time budget), then " if "budget" in results else ""
        out.append(f"- speed/memory: {pilot}{s['warmup_steps']} warm-up steps (not timed), then up to "
                   f"{s['timed_steps']} timed optimizer steps per arm on synthetic batches of exactly {b['seq_len']} "
                   f"tokens (random ids, seed {b['seed']}, the same for every arm)"
                   f"{', device synchronised around each step' if cuda else ''}; overrides {s['overrides']}")
        if sw["batch_sizes"]:
            more = (f", then doubling until out of memory (at most {sw['max_batch_size']})"
                    if cuda and sw["until_oom"] else "")
            out.append(f"- memory sweep: batch sizes {sw['batch_sizes']}{more}, {sw['steps']} step(s) each, on "
                       f"{'every speed arm' if sw['arms'] is None else ', '.join(sw['arms'])}, with the arm's own "
                       "model and optimizer after its timed steps")
    if "accuracy" in b["modes"]:
        isolated = ("each run in its own process, one at a time, with a cold tokenization cache; wall time is the "
                    "process's (imports, model, tokenization, training, evaluation)" if acc.get("isolate") else
                    "ampft's runs in this process" + (", the Trainer's each in its own" if trainers else ""))
        out.append(f"- accuracy: full fine-tuning runs per arm for seeds {acc['seeds']} (the seed fixes "
                   f"initialisation and data order, the same in every arm); overrides {acc['overrides']}; {isolated}")
    return out + [""]


def _speed(results: dict) -> list[str]:
    """Speed mode's table (step time, throughput, MFU, memory per arm), the estimate's predictions, the sweep."""
    b, cuda = results["benchmark"], results["environment"]["device_type"] == "cuda"
    speed, speed_raw = results["speed"]["arms"], results["speed"]["raw"]
    base, first, ms = b["baseline"], speed[0], lambda t: 1000 * t
    out = ["## Speed and memory", "", *markdown_table([
        "arm", "precision", "attention", "batch×seq", "step ms median [IQR]", f"time (% of {base})", "samples/s",
        "tokens/s", "TFLOP/s", "MFU", "peak allocated (reserved)" if cuda else "peak RSS", f"memory (% of {base})",
        "skipped steps", "other processes' CPU"], [
        [f"`{a['arm']}`", a["precision"] + ("" if a["precision"] == a["precision_requested"]
                                            else f" (asked {a['precision_requested']})"),
         a["attn_implementation"], f"{a['batch_size']}×{a['seq_len']}",
         f"{ms(t['median']):.1f} [{ms(t['q1']):.1f}–{ms(t['q3']):.1f}]", _f(a["time_vs_baseline"], ".0%"),
         f"{a['samples_per_second']['median']:.1f}", f"{a['tokens_per_second']['median']:,.0f}",
         f"{a['tflops']:.3g}", _f(a["mfu"], ".0%") if a["mfu"] is not None else (
             "peak unknown" if a["peak_tflops_source"].startswith("peak unknown") else "—"),
         _mib(a["peak_memory_bytes"]) + (f" ({_mib(a['peak_reserved_bytes'])})" if cuda else ""),
         _f(a["memory_vs_baseline"], ".0%"), str(a["skipped_steps"]), _f(a.get("other_cpu_share"), ".0%")]
        for a in speed for t in [a["step_time"]]], align="llll" + "r" * 10), ""]
    out += [f"Time is per sample, so arms with another batch compare fairly. FLOPs per token (training, forward + "
            f"backward) = 6·N + 12·L·s·h = {first['flops_per_token']:,} for `{b['model']}` (N = "
            f"{first['params_nonembedding']:,} non-embedding of {first['params']:,} parameters, s = "
            f"{first['seq_len']}). MFU = achieved TFLOP/s / dense peak TFLOP/s of the precision that ran: "
            + "; ".join(sorted({f"{a['precision']}: {a['peak_tflops_source']}" for a in speed})) + ".", ""]
    if not cuda:
        out += ["CPU memory is the peak RSS of the whole process during the arm's steps (its peak is reset per "
                "arm): it includes the interpreter, torch, the tokenizer and the data, the same for every arm.", ""]
    if predicted := results["speed"].get("predicted"):  # from ampft.estimate (make estimate): its error, arm by arm
        out += [f"Predicted by `make estimate` for {next(iter(predicted.values()))['device']} (a trace of the "
                "same step on fake tensors; docs/benchmarks/estimate.md):", "",
                *markdown_table(["arm", "predicted step ms", "measured step ms", "predicted peak", "measured peak"], [
                    [f"`{a['arm']}`", _f(p["step_seconds"] and ms(p["step_seconds"])),
                     f"{ms(a['step_time']['median']):.1f}", _mib(p["peak_bytes"]),
                     _mib(a["peak_memory_bytes"]) if cuda else "—"]
                    for a in speed if (p := predicted.get(a["arm"]))]), ""]
    if not (sweeps := {r["arm"]: r["sweep"] for r in speed_raw if r["sweep"]}):
        return out
    sizes = sorted({p["batch_size"] for pts in sweeps.values() for p in pts})
    key = "peak_allocated_bytes" if cuda else "peak_rss_bytes"
    ref = {p["batch_size"]: p[key] for p in sweeps.get(base, []) if p["fits"]}
    rows = []
    for name, pts in sweeps.items():
        by, fit = {p["batch_size"]: p for p in pts}, [p["batch_size"] for p in pts if p["fits"]]
        cells = ["—" if p is None else "OOM" if not p["fits"] else _mib(p[key]) + (
            f" ({p[key] / ref[n]:.0%})" if n in ref and name != base else "") for n in sizes for p in [by.get(n)]]
        largest = f"{max(fit)}" + ("" if any(not p["fits"] for p in pts) else " (largest tried)") if fit else "none"
        rows.append([f"`{name}`", *cells, largest])
    return out + ["### Peak memory versus batch size", "",
                  *markdown_table(["arm", *[f"batch {n}" for n in sizes], "largest that fits"], rows), "",
                  f"Percentages: of `{base}` at the same batch size.", ""]


def _accuracy(results: dict, arms: dict[str, dict], trainers: list[str]) -> list[str]:
    """Accuracy mode's table (the metric with its paired difference, the runs' speed and memory per arm), each
    seed, FLOP/s, precision gains, profiles, targets, checks and ablations."""
    acc, b = results["accuracy"], results["benchmark"]
    base, seeds, first = b["baseline"], b["accuracy"]["seeds"], next(iter(arms.values()))
    metric, kind = first["main_metric"], next((a["peak_memory_kind"] for a in arms.values() if a["peak_memory_kind"]), None)
    out = ["## Accuracy", "", *markdown_table([
        "arm", *(["runner"] if trainers else []), "precision", "runs", f"{metric} mean ± std", f"Δ vs {base} [95% CI]",
        "skipped steps per seed", "samples/s", "tokens/s", "train s (mean)", f"time (% of {base})", "wall s",
        "peak memory", *(f"x {t}" for t in trainers), "other processes' CPU"], [
        [f"`{n}`", *([a["runner"]] if trainers else []), a["precision"] or "—", f"{a['runs']} ({a['diverged']} diverged)",
         _acc_text(a), _diff_text(a), _join(a["skipped_steps"]), _f(a["samples_per_second"]),
         _f(a["tokens_per_second"], ",.0f"), _f(a["train_seconds"] and a["train_seconds"]["mean"]),
         _f(a["time_vs_baseline"], ".0%"), _f(a["wall_seconds"]), _mib(a["peak_memory_bytes"]),
         *(_f(a["speedup"].get(t), ".2f") for t in trainers), _f(a.get("other_cpu_share"), ".0%")]
        for n, a in arms.items()], align="l" * (6 + bool(trainers)) + "r" * (7 + len(trainers))), "",
        "Δ: the mean of the per-seed differences to the baseline, with a t-based 95% confidence interval (paired by "
        "seed). samples/s, tokens/s (non-padding) and wall s are medians over seeds, over the training loop and the "
        f"whole run; time is the training time's; peak memory: {kind or '—'}; other processes' CPU: the most any "
        "run saw." + (" x: samples/s over a Trainer arm's in the same precision." if trainers else ""), ""]
    if len(seeds) > 1:
        out += ["Per seed:", "", *markdown_table(["arm", *(f"seed {s} {w}" for s in seeds for w in ("samples/s", metric))], [
            [f"`{n}`", *(x for v, m in zip(a["samples_per_second_per_seed"], a["metric_per_seed"], strict=True)
                         for x in (_f(v), _f(m, ".4f")))] for n, a in arms.items()], align="l" + "rr" * len(seeds)), ""]
    if counted := {n: a for n, a in arms.items() if a["model_tflops"]}:
        mfus = {n: a["mfu"] for n, a in counted.items() if a["mfu"] is not None}
        one = next(iter(counted.values()))
        out += ["Model FLOP/s over non-padding tokens (6N + 12·L·h·s per token, per example's length): "
                + ", ".join(f"`{n}` {a['model_tflops'] * 1e3:.2f} GFLOP/s" for n, a in counted.items()) + ". "
                + (("MFU: " + ", ".join(f"`{n}` {v:.1%}" for n, v in mfus.items()) + f" of {one['peak_tflops']:g} "
                    f"TFLOP/s ({one['peak_tflops_source']}).") if mfus else f"MFU: {one['peak_tflops_source']}."), ""]
    out += _precision_section(results, arms, metric) + _profile_section(arms)
    if acc["targets"] or acc["checks"]:
        out += ["### Targets", "", *(f"- {t['arm']} at least {t['min_ratio']:g}x the samples/s of {t['over']}: "
                f"measured {_f(t['ratio'], '.2f')}x, **{'met' if t['met'] else 'NOT met'}**." for t in acc["targets"]),
                *(f"- {c['arm']} {metric} within {acc['tolerance']:g} point(s) of {c['reference']}: "
                  f"{c['difference']:+.2f}, **{'yes' if c['within'] else 'NO'}**."
                  + (f" Paired over {len(c['per_seed'])} seeds: {_join(c['per_seed'], '+.2f')}, standard error "
                     f"{c['standard_error']:.2f}; within one seed standard deviation of {c['reference']} "
                     f"({c['reference_std']:.2f}): **{'yes' if c['within_reference_std'] else 'NO'}**."
                     if len(c["per_seed"]) > 1 else "") for c in acc["checks"]), ""]
    ampft = [a for a in arms.values() if a["runner"] == Runner.ampft.value]
    ref = next((a for a in ampft if not a["overrides"]), None)  # ablations in other precisions: their own section
    ablations = [a for a in ampft if ref and a["overrides"] and a["precision"] == ref["precision"]]
    if ablations and ref["samples_per_second"]:
        out += [f"### What each fast path contributes (relative to {ref['arm']})", "",
                *(f"- {', '.join(a['overrides'])}: "
                  f"{_f(ratio(a['samples_per_second'], ref['samples_per_second']), '.2f')}x the samples/s, "
                  f"{_f(ratio(a['wall_seconds'], ref['wall_seconds']), '.2f')}x the wall time"
                  for a in ablations), ""]
    return out


def _precision_section(results: dict, arms: dict[str, dict], metric: str) -> list[str]:
    """Each side's gain from a lower precision over its fp32 twin, and ampft against the Trainer per precision."""
    acc, env = results["accuracy"], results["environment"]
    gains, sps = acc["precision_gains"], lambda arm: f"{arms[arm]['samples_per_second']:.1f}"
    ran_in = "each of these runs" if results.get("sources") else "this run"  # `combine`: several runs
    out = []
    for prec in dict.fromkeys(g["precision"] for g in gains):
        out += [f"### {prec} against fp32", "",
                f"Each pair differs only in `precision`; both ran in {ran_in}, with the same seeds and data, so "
                f"the {metric} difference is paired by seed (the mean of the per-seed differences, in points).", "",
                *markdown_table(["side", "fp32 arm", f"{prec} arm", "fp32 samples/s", f"{prec} samples/s", f"{prec} / fp32",
                      f"{metric} Δ per seed", f"{metric} Δ"], [
            [g["runner"], g["fp32"], g["arm"], sps(g["fp32"]), sps(g["arm"]), f"{g['ratio']:.2f}x",
             _join(g["metric_difference_per_seed"], "+.2f"), f"{g['metric_difference']:+.2f}"]
            for g in gains if g["precision"] == prec], align="lllrrrlr"), ""]
        for v in (v for v in acc["by_precision"] if v["precision"] == prec):  # ampft x Trainer: the accuracy table
            out += [f"- ampft's {prec}/fp32 gain {v['ampft_gain']:.2f}x against the Trainer's {v['trainer_gain']:.2f}x "
                    f"({v['ampft']} over {v['ampft_fp32']}, {v['trainer']} over {v['trainer_fp32']}): "
                    f"{v['gain_ratio']:.2f}x, "
                    f"**{'at least the Trainer' if v['gain_at_least_trainer'] else 'less than the Trainer'}'s**.", ""]
        if env["device_type"] == "cpu" and prec in ("fp16", "bf16"):
            have = cpu_half_support(set(env.get("cpu_features") or []))[prec]
            native = "AVX512-BF16 or AMX-BF16" if prec == "bf16" else "AVX512-FP16 or AMX-FP16"
            out += [(f"This CPU has {' and '.join(have)}, native {prec} arithmetic." if have else
                     f"This CPU has no native {prec} arithmetic (no {native}): its {prec} gains say little about a "
                     "CPU that has it.") + " The CPU's model and flags: Hardware and software, above.", ""]
    return out


def _profile_section(arms: dict[str, dict]) -> list[str]:
    """Where a step's time goes per arm (benchmark.accuracy.profile_steps): op categories and top ops."""
    if not (profiled := {n: a["profile"] for n, a in arms.items() if a.get("profile")}):
        return []
    first, ps = next(iter(profiled.values())), list(profiled.values())
    rows = [["padded tokens / step", *(f"{p['padded_tokens_per_step']:.0f}" for p in ps)],
            ["real tokens / step", *(f"{p['real_tokens_per_step']:.0f}" for p in ps)],
            ["padding share", *(f"{1 - p['real_tokens_per_step'] / p['padded_tokens_per_step']:.0%}" for p in ps)],
            ["**ms / step**", *(f"**{p['ms_per_step']:.1f}**" for p in ps)],
            ["**ms / 1k real tokens**", *(f"**{p['ms_per_1k_real_tokens']:.1f}**" for p in ps)],
            *([f"{c} (ms / step)", *(f"{p['categories'].get(c, 0.0):.1f}" for p in ps)]
              for c in dict.fromkeys(c for p in ps for c in p["categories"]))]
    out = ["### Where a step's time goes (torch.profiler)", "",
           f"{first['steps']} training steps per arm (the first seed's run, after {SKIP + WARMUP} unrecorded steps), "
           "profiled the same way for both runners: a global optimizer-step hook advances the profiler, so a step is "
           "data loading, forward, backward, clipping, optimizer, scheduler and zero_grad. Time is "
           f"{first['clock']} by op, summed into categories by op name (`ampft.benchmark.profile`); "
           "each arm's full table is profile.txt in its directory.", ""]
    out += [*markdown_table(["", *profiled], rows, align="l" + "r" * len(profiled)), ""]
    for name, p in profiled.items():
        key = "gpu_ms" if p["top"] and p["top"][0]["gpu_ms"] is not None else "cpu_ms"
        out.append(f"- {name}: " + ", ".join(f"{o['op']} {o[key]:.1f} ms ({o['calls']:g}x)" for o in p["top"][:6]))
    return out + [""]


def write_outputs(res: dict, out_dir: Path) -> Path:
    """results.json, results.csv, report.md and the PNGs into out_dir; return report.md (`rerender`, `combine`)."""
    (out_dir := Path(out_dir)).mkdir(parents=True, exist_ok=True)
    write_json(res, out_dir / "results.json")
    write_csv(res, out_dir / "results.csv")
    try:
        made = make_plots(res, out_dir)
    except MissingExtraError as exc:
        log.warning("no PNG plots (report.md has every number): %s", exc)
        made = []
    (path := out_dir / "report.md").write_text(render(res, made))
    log.info("report: %s", path)
    return path


def rerender(out_dir: str | Path) -> Path:
    """Every output of a saved run again from its results.json (after a change to the report code)."""
    return write_outputs(json.loads((Path(out_dir) / "results.json").read_text()), out_dir)
