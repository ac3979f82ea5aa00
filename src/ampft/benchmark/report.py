"""results.json, results.csv (every raw measurement, one per row), report.md (`render`) and the PNGs (`plots`)."""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

from ampft.benchmark import plots
from ampft.benchmark.budget import fmt_seconds
from ampft.benchmark.config import Runner
from ampft.benchmark.profile import SKIP, WARMUP
from ampft.benchmark.results import NOT_CHECKED, NOT_REPRODUCED, REPRODUCED
from ampft.benchmark.stats import ratio
from ampft.devices import cpu_half_support
from ampft.extras import MissingExtraError

log = logging.getLogger(__name__)

BUSY = 0.1  # other processes' share of the machine's CPU above which timings are flagged
CSV_FIELDS = ["mode", "arm", "precision", "seed", "batch_size", "seq_len", "index", "quantity", "value"]
PLOTS = {
    "throughput.png": "Throughput per arm (median tokens/s; bars: interquartile range of the timed steps)",
    "memory.png": "Peak memory per arm",
    "memory_vs_batch.png": "Peak memory versus batch size",
    "loss_curves.png": "Training loss per arm and seed (accuracy mode)",
    "loss_scale.png": "fp16 dynamic loss scale (accuracy mode)",
}


def _clean(value):
    """JSON without NaN/inf (written as null), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json(results: dict, path: Path) -> None:
    Path(path).write_text(json.dumps(_clean(results), indent=2, default=str) + "\n")


def csv_rows(results: dict) -> list[dict]:
    rows: list[dict] = []

    def add(mode, arm, precision, seed, bs, seq, index, quantity, value):
        rows.append(dict(mode=mode, arm=arm, precision=precision, seed=seed, batch_size=bs, seq_len=seq,
                         index=index, quantity=quantity, value=value))

    for r in (results.get("speed") or {}).get("raw", []):
        common = ("speed", r["arm"], r["precision"], results["benchmark"]["seed"], r["batch_size"], r["seq_len"])
        for i, s in enumerate(r["warmup_step_seconds"]):
            add(*common, i, "warmup_step_seconds", s)
        for i, s in enumerate(r["step_seconds"]):
            add(*common, i, "step_seconds", s)
        for i, loss in enumerate(r["losses"]):
            add(*common, i, "loss", loss)
        for k, v in {**r["memory_after_build"], **r["memory_peak"]}.items():
            add(*common, None, k if k.startswith("peak") else f"after_build_{k}", v)
        for k in ("skipped_steps", "flops_per_token", "params", "params_nonembedding"):
            add(*common, None, k, r[k])
        for p in r["sweep"]:
            c = ("sweep", r["arm"], r["precision"], results["benchmark"]["seed"], p["batch_size"], r["seq_len"])
            add(*c, None, "fits", int(p["fits"]))
            for k, v in p.items():
                if k not in ("batch_size", "fits"):
                    add(*c, None, k, v)
    for r in (results.get("accuracy") or {}).get("runs", []):
        common = ("accuracy", r["arm"], r["precision"], r["seed"], None, None)
        for k, v in (r.get("eval") or {}).items():
            add(*common, None, f"eval_{k}", v)
        for k in ("train_loss", "train_loss_last", "steps", "skipped_steps", "loss_scale_final", "train_seconds",
                  "wall_seconds", "train_samples_per_second", "train_tokens_per_second"):
            if r.get(k) is not None:
                add(*common, None, k, r[k])
        add(*common, None, "diverged", int(r["diverged"]))
        for step, loss, *_ in r["loss_curve"]:  # [step, loss, lr]
            add(*common, step, "train_loss_window", loss)
        for step, scale in r["loss_scale_trace"]:
            add(*common, step, "loss_scale", scale)
    return rows


def write_csv(results: dict, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        w.writerows(csv_rows(results))


# --- report.md ------------------------------------------------------------------------------------

def _f(x, fmt=".1f", none="—") -> str:
    return none if x is None else format(x, fmt)


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def _mib(x) -> str:
    return "—" if x is None else f"{x / 2**20:,.0f} MiB"


def table(header: list[str], rows: list[list[str]], align: str = "") -> list[str]:
    """A Markdown table; align: one letter per column, l (the default) or r (right-aligned numbers)."""
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(header), "l"))
    return ["| " + " | ".join(header) + " |", rule] + ["| " + " | ".join(r) + " |" for r in rows]


def _acc_text(a: dict | None) -> str:
    if a is None or a["metric"] is None:
        return "—" if a is None else f"diverged ({a['diverged']}/{a['runs']})"
    m = a["metric"]
    std = "" if m["std"] is None else f" ± {m['std']:.4f}"
    return f"{m['mean']:.4f}{std} (n={m['n']})"


def _diff_text(a: dict | None) -> str:
    if a is None or a.get("diff") is None:
        return "—"
    d = a["diff"]
    if d["ci_low"] is None:
        return f"{d['mean']:+.4f} (no CI, n={d['n']})"
    return f"{d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}]"


def _budget_line(bud: dict) -> str:
    """One sentence at the top: the budget, the time taken, and what was cut."""
    took = fmt_seconds(bud.get("seconds_used"))
    if bud.get("minutes") is None:
        head = f"**Time budget:** none (`benchmark.budget_minutes: null`); took {took}."
    else:
        verdict = "within it" if bud["within"] else "**over it**"
        head = f"**Time budget:** {fmt_seconds(60 * bud['minutes'])}; took {took}, {verdict}."
    cuts = bud.get("cuts") or []
    if not cuts:
        return head + " Nothing was cut."
    return head + " Cut to keep it: " + "; ".join(f"`{c['arm']}` {c['mode']} {c['action']} ({c['detail']})"
                                                  for c in cuts) + " ([why](#time-budget))."


def _budget_section(bud: dict, base: str) -> list[str]:
    out = ["## Time budget", ""]
    if bud.get("minutes") is None:
        out += ["No budget (`benchmark.budget_minutes: null`): every arm ran in full.", ""]
    else:
        out += [f"`benchmark.budget_minutes: {bud['minutes']:g}`; the benchmark took "
                f"{fmt_seconds(bud['seconds_used'])}. Each speed arm is measured before anything is cut: two pilot "
                "steps at a quarter of the batch (the second timed), then its warm-up and two timed steps; speed "
                f"mode may use {100 * bud['speed_share']:.0f}% of the budget when accuracy mode follows. Arms that would blow the "
                "budget lose their memory sweep, then timed steps, then accuracy runs (slowest arm first, then "
                "seeds); the policy: `docs/benchmarks/README.md#the-time-budget` (`ampft.benchmark.budget`).", ""]
    ratios = bud.get("step_time_vs_baseline") or {}
    if ratios:
        out += [f"Step time relative to `{base}` (timed steps; where an arm went no further than its pilot, the "
                "pilot steps', a rougher figure: at a quarter of the batch, per-step overheads weigh more): "
                + ", ".join(f"`{k}` {v:.2f}x" for k, v in ratios.items()) + ".", ""]
    cuts = bud.get("cuts") or []
    if cuts:
        out += table(["arm", "mode", "cut", "what remains", "why", "at"],
                      [[f"`{c['arm']}`", c["mode"], c["action"], c["detail"], c["reason"], fmt_seconds(c["at_seconds"])]
                       for c in cuts]) + [""]
    elif bud.get("minutes") is not None:
        out += ["Nothing was cut: every arm ran in full.", ""]
    return out


def device_text(env: dict) -> str:
    """The device measured on, in a few words: the GPU's name, memory and compute capability, or the CPU's."""
    if env["device_type"] == "cuda":
        return (f"{env['device_name']} ({env['device_memory_bytes'] / 2**30:.0f} GiB, compute capability "
                f"{env['compute_capability']})")
    return f"{env['device_name']}, {env['cpu_count']} cores, CPU only (no GPU)"


def hardware(env: dict) -> list[str]:
    """The "Hardware and software" section (`environment.describe`): the GPU if any, and always the CPU's
    model and the flags that decide half-precision speed on it (AVX512-BF16/FP16, AMX)."""
    load = env.get("load_average")
    rows = [["date", env["date"]], ["device", device_text(env)]]
    if env["device_type"] == "cuda":
        rows += [["driver", env["driver"] or "unknown"], ["CUDA / cuDNN", f"{env['cuda']} / {env['cudnn']}"],
                 ["host CPU", f"{env['cpu']} ({env['cpu_count']} cores)"],
                 ["CPU features", ", ".join(env["cpu_features"]) or "—"], ["torch threads", str(env["torch_threads"])]]
    else:
        rows += [["CPU features", ", ".join(env["cpu_features"]) or "—"], ["torch threads", str(env["torch_threads"])],
                 ["driver", "n/a (no GPU)"]]
    rows += [["load average at start", "—" if load is None else f"{load} (1 min)"]]
    rows += [["torch", env["torch"]], ["transformers", env["transformers"]], ["accelerate", env["accelerate"]],
             ["python", env["python"]], ["OS", env["os"]]]
    return ["## Hardware and software", "", *table(["", ""], rows), ""]


def render(results: dict, plots: list[str] | None = None) -> str:
    b, env = results["benchmark"], results["environment"]
    speed = (results.get("speed") or {}).get("arms", [])
    raw = {r["arm"]: r for r in (results.get("speed") or {}).get("raw", [])}
    acc_arms = (results.get("accuracy") or {}).get("arms", [])
    acc = {a["arm"]: a for a in acc_arms}
    base = b["baseline"]
    cuda = env["device_type"] == "cuda"
    trainers = [a["arm"] for a in acc_arms if a["runner"] == Runner.trainer.value]
    precisions = {a["precision"] for a in [*speed, *acc_arms]}
    what = ": ampft vs the Hugging Face Trainer" if trainers else ": precision A/B" if len(precisions) > 1 else ""
    out: list[str] = [f"# Benchmark `{b['name']}`{what}", ""]
    out += [f"Measured {env['date']} on {device_text(env)}. Command: `{results.get('command', '')}`.", ""]
    if sources := results.get("sources"):  # `combine`: seeds measured in separate runs
        out += [f"Combined from {len(sources)} runs of this setup on this machine (`ampft.benchmark.combine`), "
                "summarized as one:", ""]
        out += [f"- `{s['dir']}`: seeds {s['seeds']}, arms {', '.join(s['arms'])}; `{s['command']}`" for s in sources]
        out.append("")
    if results.get("partial_seeds"):
        out += [f"**Partial**: seeds {results['partial_seeds']} of the {b['accuracy']['seeds']} asked for were "
                "measured when this report was written (it is rewritten after every seed; the benchmark stopped or "
                "was still running).", ""]
    busy = [(f"`{a['arm']}`" + (f" seed {a['seed']}" if "seed" in a else ""), a["other_cpu_share"])
            for a in [*(results.get("speed") or {}).get("raw", []), *(results.get("accuracy") or {}).get("runs", [])]
            if (a.get("other_cpu_share") or 0) > BUSY]
    if busy:
        out += ["**Warning:** other processes used the CPU while these were measured, so their timings are "
                "unreliable: " + ", ".join(f"{name} ({_pct(share)} of the machine)" for name, share in busy) + ".", ""]

    bud = results.get("budget") or {}
    if bud.get("minutes") is not None or bud.get("cuts"):
        out += [_budget_line(bud), ""]

    out += hardware(env)

    out += ["## Setup", ""]
    s, sw = b["speed"], b["sweep"]
    lines = [f"- model `{b['model']}`, task `{b['task']}`, sequence length {b['seq_len']}, batch {b['batch_size']}, "
             f"baseline arm `{base}`; shared overrides {[*b['overrides'], *b.get('extra', [])]}; arms: "
             + ", ".join(f"`{a['name']}` ({a.get('runner', 'ampft')}: {' '.join(a['overrides']) or 'defaults'})"
                         for a in b["arms"])]
    if "speed" in b["modes"]:
        pilot = "two pilot steps at a quarter of the batch (for the time budget), then " if "budget" in results else ""
        lines.append(f"- speed/memory: {pilot}{s['warmup_steps']} warm-up steps (not timed), then up to "
                     f"{s['timed_steps']} timed "
                     f"optimizer steps per arm on synthetic batches of exactly {b['seq_len']} tokens (random ids, seed "
                     f"{b['seed']}, the same for every arm){', device synchronised around each step' if cuda else ''}; "
                     f"overrides {s['overrides']}")
        if sw["batch_sizes"]:
            more = (f", then doubling until out of memory (at most {sw['max_batch_size']})"
                    if cuda and sw["until_oom"] else "")
            lines.append(f"- memory sweep: batch sizes {sw['batch_sizes']}{more}, {sw['steps']} step(s) each, on "
                         f"{'every speed arm' if sw['arms'] is None else ', '.join(sw['arms'])}, with the arm's own "
                         "model and optimizer after its timed steps")
    if "accuracy" in b["modes"]:
        isolated = "each run in its own process, one at a time, with a cold tokenization cache; wall time is the " \
            "process's (imports, model, tokenization, training, evaluation)" if b["accuracy"].get("isolate") else \
            "ampft's runs in this process" + (", the Trainer's each in its own" if trainers else "")
        lines.append(f"- accuracy: full fine-tuning runs per arm for seeds {b['accuracy']['seeds']} "
                     f"(the seed fixes initialisation and data order, the same in every arm); overrides "
                     f"{b['accuracy']['overrides']}; {isolated}")
    out += lines + [""]
    if bud:
        out += _budget_section(bud, base)

    out += ["## Results", ""]
    names = [a["name"] for a in b["arms"]]
    sp = {a["arm"]: a for a in speed}
    rows = []
    for name in names:
        a, c = sp.get(name), acc.get(name)
        if a is None and c is None:
            if any(x["arm"] == name for x in bud.get("cuts", [])):
                rows.append([f"`{name}`", "—", "skipped by the time budget (see above)", "—", "—", "—", "—", "—"])
            continue
        time_pct = a["time_vs_baseline"] if a else None
        if time_pct is None and c is not None:
            time_pct = c["time_vs_baseline"]
        rows.append([f"`{name}`", *([c["runner"] if c else "ampft"] if trainers else []), (a or c)["precision"] or "—",
                     _pct(time_pct), _pct(a["memory_vs_baseline"]) if a else "—",
                     _f(a["samples_per_second"]["median"] if a else c["samples_per_second"]),
                     _f(a["tokens_per_second"]["median"] if a else c["tokens_per_second"], ",.0f"),
                     _acc_text(c), _diff_text(c)])
    metric = acc_arms[0]["main_metric"] if acc_arms else "accuracy"
    out += table(["arm", *(["runner"] if trainers else []), "precision", f"time (% of {base})",
                  f"memory (% of {base})", "samples/s", "tokens/s", f"{metric} (mean ± std)",
                  f"Δ {metric} vs {base} [95% CI]"], rows)
    out += ["", f"Time, memory and speeds are from speed mode (time per sample; memory: "
            f"{'peak allocated on the GPU' if cuda else 'peak resident set size of the process'}); where an arm "
            "has no speed run they come from its accuracy runs (training time; samples/s and non-padding tokens/s "
            "over the training loop, medians over seeds).", ""]

    if speed:
        out += ["## Speed and memory", ""]
        rows = []
        for a in speed:
            t = a["step_time"]
            rows.append([f"`{a['arm']}`", a["precision"] + ("" if a["precision"] == a["precision_requested"]
                                                              else f" (asked {a['precision_requested']})"),
                         a["attn_implementation"], f"{a['batch_size']}×{a['seq_len']}",
                         f"{1000 * t['median']:.1f} [{1000 * t['q1']:.1f}–{1000 * t['q3']:.1f}]",
                         f"{1000 * t['min']:.1f}–{1000 * t['max']:.1f}",
                         f"{a['samples_per_second']['median']:.1f}", f"{a['tokens_per_second']['median']:,.0f}",
                         f"{a['tflops']:.3g}", _pct(a["mfu"]) if a["mfu"] is not None else (
                             "peak unknown" if a["peak_tflops_source"].startswith("peak unknown") else "—"),
                         _mib(a["peak_memory_bytes"]), _mib(a["peak_reserved_bytes"]) if cuda else "—",
                         str(a["skipped_steps"]), _pct(a.get("other_cpu_share"))])
        out += table(["arm", "precision", "attention", "batch×seq", "step ms median [IQR]", "min–max ms",
                       "samples/s", "tokens/s", "TFLOP/s", "MFU", "peak allocated" if cuda else "peak RSS",
                       "peak reserved", "skipped steps", "other processes' CPU"], rows)
        first = speed[0]
        out += ["", f"FLOPs per token (training, forward + backward) = 6·N + 12·L·s·h = "
                f"{first['flops_per_token']:,} for `{b['model']}` (N = {first['params_nonembedding']:,} "
                f"non-embedding of {first['params']:,} parameters, s = {first['seq_len']}). "
                "MFU = achieved TFLOP/s / dense peak TFLOP/s of the precision that ran: "
                + "; ".join(sorted({f"{a['precision']}: {a['peak_tflops_source']}" for a in speed})) + ".", ""]
        predicted = (results.get("speed") or {}).get("predicted") or {}
        if predicted:  # from ampft.estimate (make estimate): the model's error, arm by arm
            ms = {k: None if v["step_seconds"] is None else 1000 * v["step_seconds"] for k, v in predicted.items()}
            rows = [[f"`{a['arm']}`", _f(ms[a["arm"]]),
                     f"{1000 * a['step_time']['median']:.1f}", _mib(predicted[a["arm"]]["peak_bytes"]),
                     _mib(a["peak_memory_bytes"]) if cuda else "—"] for a in speed if a["arm"] in predicted]
            out += [f"Predicted by `make estimate` for {next(iter(predicted.values()))['device']} (a trace of the "
                    "same step on fake tensors; docs/benchmarks/estimate.md):", ""]
            out += table(["arm", "predicted step ms", "measured step ms", "predicted peak", "measured peak"], rows) + [""]
        if not cuda:
            out += ["CPU memory is the peak RSS of the whole process during the arm's steps (its peak is reset per "
                    "arm): it includes the interpreter, torch, the tokenizer and the data, the same for every arm.", ""]

        sweeps = {name: r["sweep"] for name, r in raw.items() if r["sweep"]}
        if sweeps:
            out += ["### Peak memory versus batch size", ""]
            sizes = sorted({p["batch_size"] for pts in sweeps.values() for p in pts})
            key = "peak_allocated_bytes" if cuda else "peak_rss_bytes"
            base_pts = {p["batch_size"]: p for p in sweeps.get(base, []) if p["fits"]}
            rows = []
            for name, pts in sweeps.items():
                by = {p["batch_size"]: p for p in pts}
                cells = []
                for size in sizes:
                    p = by.get(size)
                    if p is None:
                        cells.append("—")
                    elif not p["fits"]:
                        cells.append("OOM")
                    else:
                        rel = base_pts.get(size)
                        rel_txt = f" ({_pct(p[key] / rel[key])})" if rel and name != base else ""
                        cells.append(_mib(p[key]) + rel_txt)
                fit = [p["batch_size"] for p in pts if p["fits"]]
                oom = any(not p["fits"] for p in pts)
                largest = f"{max(fit)}" + ("" if oom else " (largest tried)") if fit else "none"
                rows.append([f"`{name}`", *cells, largest])
            out += table(["arm", *[f"batch {n}" for n in sizes], "largest that fits"], rows)
            out += ["", f"Percentages: of `{base}` at the same batch size.", ""]

    if acc_arms:
        out += ["## Accuracy", ""]
        rows = []
        for a in acc_arms:
            m = a["metric"]
            rows.append([f"`{a['arm']}`", a["precision"] or "—", f"{a['runs']} ({a['diverged']} diverged)",
                         _acc_text(a), f"{m['min']:.4f}–{m['max']:.4f}" if m else "—", _diff_text(a),
                         _f(a["train_seconds"]["mean"]) if a["train_seconds"] else "—", _pct(a["time_vs_baseline"]),
                         ", ".join("—" if x is None else str(x) for x in a["skipped_steps"]),
                         ", ".join("—" if x is None else f"{x:g}" for x in a["loss_scale_final"]),
                         _pct(a.get("other_cpu_share"))])
        out += table(["arm", "precision", "runs", f"{metric} mean ± std", "min–max",
                       f"Δ vs {base} [95% CI]", "train s (mean)", f"time % of {base}", "skipped steps per seed",
                       "final loss scale", "other processes' CPU (max)"], rows)
        out += ["", "Δ: mean of the per-seed differences to the baseline with a t-based 95% confidence interval "
                "(paired by seed).", ""]
        out += _comparison(results, acc_arms, trainers, metric)

    claims = results.get("claims", [])
    if claims:
        out += ["## Claims", ""]
    rows = [[c["claim"], f"**{c['verdict']}**", c["measured"] or "—", c["note"] or ""] for c in claims]
    out += table(["claim", "verdict", "measured", "note"], rows) + [""] if claims else []
    failed = [c for c in claims if c["verdict"] == NOT_REPRODUCED]
    unchecked = [c for c in claims if c["verdict"] == NOT_CHECKED]
    ok = [c for c in claims if c["verdict"] == REPRODUCED]
    def bullet(c: dict, why: bool) -> str:
        text = f"- {c['claim']}" + (f" — measured {c['measured']}" if c["measured"] else "")
        return text + (f" ({c['note']})" if why and c["note"] else "") + "."

    if failed:
        out += ["**Did not reproduce here:**", ""] + [bullet(c, True) for c in failed] + [""]
    if unchecked:
        out += ["**Could not be checked here:**", ""] + [bullet(c, True) for c in unchecked] + [""]
    if ok:
        out += ["**Reproduced here:**", ""] + [bullet(c, False) for c in ok] + [""]

    if plots:
        out += ["## Plots", ""]
        for p in plots:
            out += [f"![{PLOTS.get(p, p)}]({p})", ""]
    out += ["Raw measurements: `results.csv` (one per row) and `results.json` (with the statistics above)."]
    return "\n".join(out) + "\n"


def _comparison(results: dict, acc_arms: list[dict], trainers: list[str], metric: str) -> list[str]:
    """The accuracy runs' speeds (against the Trainer's), each seed, model FLOP/s, precision gains, step
    profiles, targets and accuracy checks, and what each fast path contributes."""
    acc, seeds = results["accuracy"], results["benchmark"]["accuracy"]["seeds"]
    arms = {a["arm"]: a for a in acc_arms}
    out = ["### Speed of the accuracy runs", ""]
    rows = [[f"`{n}`", a["runner"], ", ".join(a["overrides"]) or "(defaults)", _f(a["samples_per_second"]),
             _f(a["tokens_per_second"], ".0f"), _f(a["train_seconds"] and a["train_seconds"]["median"]),
             _f(a["wall_seconds"]), _mib(a["peak_memory_bytes"]), *(_f(a["speedup"].get(t), ".2f") for t in trainers)]
            for n, a in arms.items()]
    out += table(["arm", "runner", "differs by", "samples/s", "tokens/s", "training s", "wall s", "peak memory",
                  *(f"x {t}" for t in trainers)], rows, align="lll" + "r" * (5 + len(trainers)))
    kind = next((a["peak_memory_kind"] for a in acc_arms if a["peak_memory_kind"]), "—")
    out += ["", "Medians over seeds. samples/s and tokens/s (non-padding) are over the training loop; wall is the "
            f"run's. Peak memory: {kind}." + (" x: samples/s over a Trainer arm's in the same precision."
                                              if trainers else ""), ""]
    if len(seeds) > 1:
        out += ["Per seed:", ""]
        out += table(["arm", *(f"seed {s} {w}" for s in seeds for w in ("samples/s", metric))],
                     [[f"`{n}`", *(_f(x, d) for v, m in zip(a["samples_per_second_per_seed"], a["metric_per_seed"],
                                                              strict=True) for x, d in ((v, ".1f"), (m, ".4f")))]
                      for n, a in arms.items()], align="l" + "rr" * len(seeds)) + [""]
    counted = {n: a for n, a in arms.items() if a["model_tflops"]}
    if counted:
        mfus = {n: a["mfu"] for n, a in counted.items() if a["mfu"] is not None}
        first = next(iter(counted.values()))
        out += ["Model FLOP/s over non-padding tokens (6N + 12·L·h·s per token, per example's length): "
                + ", ".join(f"`{n}` {a['model_tflops'] * 1e3:.2f} GFLOP/s" for n, a in counted.items()) + ". "
                + (("MFU: " + ", ".join(f"`{n}` {v:.1%}" for n, v in mfus.items()) + f" of {first['peak_tflops']:g} "
                    f"TFLOP/s ({first['peak_tflops_source']}).") if mfus else f"MFU: {first['peak_tflops_source']}."),
                ""]
    out += _precision_section(results, arms, metric)
    out += _profile_section(arms)
    if acc["targets"] or acc["checks"]:
        out += ["### Targets", ""]
    for t in acc["targets"]:
        out.append(f"- {t['arm']} at least {t['min_ratio']:g}x the samples/s of {t['over']}: measured "
                   f"{_f(t['ratio'], '.2f')}x, **{'met' if t['met'] else 'NOT met'}**.")
    for c in acc["checks"]:
        line = (f"- {c['arm']} {metric} within {acc['tolerance']:g} point(s) of {c['reference']}: "
                f"{c['difference']:+.2f}, **{'yes' if c['within'] else 'NO'}**.")
        if len(c["per_seed"]) > 1:
            line += (f" Paired over {len(c['per_seed'])} seeds: "
                     f"{', '.join(f'{d:+.2f}' for d in c['per_seed'])}, standard error {c['standard_error']:.2f};"
                     f" within one seed standard deviation of {c['reference']} ({c['reference_std']:.2f}): "
                     f"**{'yes' if c['within_reference_std'] else 'NO'}**.")
        out.append(line)
    if acc["targets"] or acc["checks"]:
        out.append("")
    plain = [n for n, a in arms.items() if a["runner"] == Runner.ampft.value and not a["overrides"]]
    ablations = [a for a in arms.values() if a["runner"] == Runner.ampft.value and a["overrides"]
                 and plain and a["precision"] == arms[plain[0]]["precision"]]  # other precisions: their own section
    if plain and ablations and arms[plain[0]]["samples_per_second"]:
        ref = arms[plain[0]]
        out += [f"### What each fast path contributes (relative to {plain[0]})", ""]
        out += [f"- {', '.join(a['overrides'])}: {_f(ratio(a['samples_per_second'], ref['samples_per_second']), '.2f')}x "
                f"the samples/s, {_f(ratio(a['wall_seconds'], ref['wall_seconds']), '.2f')}x the wall time" for a in ablations]
        out.append("")
    return out


def _precision_section(results: dict, arms: dict[str, dict], metric: str) -> list[str]:
    """Each side's gain from a lower precision (an fp32 arm and its twin, measured in this run), and ampft
    against the Trainer in each precision; empty where no arm has an fp32 twin."""
    acc, env = results["accuracy"], results["environment"]
    gains = acc["precision_gains"]
    ran_in = "each of these runs" if results.get("sources") else "this run"  # `combine`: several runs
    out = []
    for prec in dict.fromkeys(g["precision"] for g in gains):
        out += [f"### {prec} against fp32", "",
                f"Each pair differs only in `precision`; both ran in {ran_in}, with the same seeds and data, so "
                f"the {metric} difference is paired by seed (the mean of the per-seed differences, in points).", ""]
        rows = [[g["runner"], g["fp32"], g["arm"], f"{arms[g['fp32']]['samples_per_second']:.1f}",
                 f"{arms[g['arm']]['samples_per_second']:.1f}", f"{g['ratio']:.2f}x",
                 ", ".join(f"{d:+.2f}" for d in g["metric_difference_per_seed"]), f"{g['metric_difference']:+.2f}"]
                for g in gains if g["precision"] == prec]
        out += table(["side", "fp32 arm", f"{prec} arm", "fp32 samples/s", f"{prec} samples/s", f"{prec} / fp32",
                      f"{metric} Δ per seed", f"{metric} Δ"], rows, align="lllrrrlr") + [""]
        for v in (v for v in acc["by_precision"] if v["precision"] == prec):
            rows = [[r["precision"], r["trainer"], r["ampft"], f"{arms[r['trainer']]['samples_per_second']:.1f}",
                     f"{arms[r['ampft']]['samples_per_second']:.1f}", f"{r['ratio']:.2f}x",
                     f"{r['trainer_metric']:.2f}", f"{r['ampft_metric']:.2f}",
                     f"{r['metric_difference']:+.2f}"] for r in v["rows"]]
            out += table(["precision", "Trainer arm", "ampft arm", "Trainer samples/s", "ampft samples/s",
                          "ampft / Trainer", f"Trainer {metric}", f"ampft {metric}", f"{metric} Δ"], rows,
                         align="lllrrrrrr")
            out += ["", f"- ampft's {prec}/fp32 gain {v['ampft_gain']:.2f}x against the Trainer's "
                    f"{v['trainer_gain']:.2f}x ({v['rows'][1]['ampft']} over {v['rows'][0]['ampft']}, "
                    f"{v['rows'][1]['trainer']} over {v['rows'][0]['trainer']}): {v['gain_ratio']:.2f}x, "
                    f"**{'at least the Trainer' if v['gain_at_least_trainer'] else 'less than the Trainer'}'s**.", ""]
        if env["device_type"] == "cpu" and prec in ("fp16", "bf16"):
            have = cpu_half_support(set(env.get("cpu_features") or []))[prec]
            native = "AVX512-BF16 or AMX-BF16" if prec == "bf16" else "AVX512-FP16 or AMX-FP16"
            out += [(f"This CPU has {' and '.join(have)}, native {prec} arithmetic." if have else
                     f"This CPU has no native {prec} arithmetic (no {native}): its {prec} gains say little about a "
                     "CPU that has it.") + " The CPU's model and flags: Hardware and software, above.", ""]
    return out


def _profile_section(arms: dict[str, dict]) -> list[str]:
    """Where a step's time goes, per arm (benchmark.accuracy.profile_steps): self time by op category, per step
    and per 1,000 real tokens, and each arm's top ops; empty without profiles."""
    profiled = {n: a["profile"] for n, a in arms.items() if a.get("profile")}
    if not profiled:
        return []
    first = next(iter(profiled.values()))
    cats = list(dict.fromkeys(c for p in profiled.values() for c in p["categories"]))
    names = list(profiled)
    rows = [["padded tokens / step", *(f"{p['padded_tokens_per_step']:.0f}" for p in profiled.values())],
            ["real tokens / step", *(f"{p['real_tokens_per_step']:.0f}" for p in profiled.values())],
            ["padding share", *(f"{1 - p['real_tokens_per_step'] / p['padded_tokens_per_step']:.0%}"
                                for p in profiled.values())],
            ["**ms / step**", *(f"**{p['ms_per_step']:.1f}**" for p in profiled.values())],
            ["**ms / 1k real tokens**", *(f"**{p['ms_per_1k_real_tokens']:.1f}**" for p in profiled.values())]]
    rows += [[f"{c} (ms / step)", *(f"{p['categories'].get(c, 0.0):.1f}" for p in profiled.values())] for c in cats]
    out = ["### Where a step's time goes (torch.profiler)", "",
           f"{first['steps']} training steps per arm (the first seed's run, after {SKIP + WARMUP} unrecorded steps), profiled "
           f"the same way for both runners: a global optimizer-step hook advances the profiler, so a step is "
           f"data loading, forward, backward, clipping, optimizer, scheduler and zero_grad. Time is "
           f"{first['clock']} by op, summed into categories by op name (`ampft.benchmark.profile`); "
           "each arm's full table is profile.txt in its directory.", ""]
    out += table(["", *names], rows, align="l" + "r" * len(names)) + [""]
    for name, p in profiled.items():
        key = "gpu_ms" if p["top"] and p["top"][0]["gpu_ms"] is not None else "cpu_ms"
        out.append(f"- {name}: " + ", ".join(f"{o['op']} {o[key]:.1f} ms ({o['calls']:g}x)" for o in p["top"][:6]))
    return out + [""]


def write_outputs(res: dict, out_dir: Path) -> Path:
    """results.json, results.csv, report.md and the PNGs into out_dir; return report.md. Also for re-rendering a
    saved run (`rerender`) and for `combine`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(res, out_dir / "results.json")
    path = out_dir / "report.md"
    write_csv(res, out_dir / "results.csv")
    try:
        made = plots.make_plots(res, out_dir)
    except MissingExtraError as exc:
        log.warning("no PNG plots (report.md has every number): %s", exc)
        made = []
    path.write_text(render(res, made))
    log.info("report: %s", path)
    return path


def rerender(out_dir: str | Path) -> Path:
    """Every output of a saved run again from its results.json (after a change to the report code)."""
    return write_outputs(json.loads((Path(out_dir) / "results.json").read_text()), out_dir)
