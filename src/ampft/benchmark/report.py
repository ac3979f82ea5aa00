"""results.json, results.csv (every raw measurement, one per row) and report.md."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from ampft.benchmark.budget import fmt_seconds
from ampft.benchmark.results import NOT_CHECKED, NOT_REPRODUCED, REPRODUCED

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
    Path(path).write_text(json.dumps(_clean(results), indent=2) + "\n")


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
        for step, loss in r["loss_curve"]:
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
    out: list[str] = [f"# Benchmark `{b['name']}`: precision A/B", ""]
    out += [f"Measured {env['date']} on {device_text(env)}. Command: `{results.get('command', '')}`.", ""]
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
             f"baseline arm `{base}`; arms: " + ", ".join(f"`{a['name']}` ({' '.join(a['overrides'])})" for a in b["arms"])]
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
        lines.append(f"- accuracy: full fine-tuning runs per arm for seeds {b['accuracy']['seeds']} "
                     f"(the seed fixes initialisation and data order, the same in every arm); overrides "
                     f"{b['accuracy']['overrides']}")
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
        rows.append([f"`{name}`", (a or c)["precision"] or "—",
                     _pct(time_pct), _pct(a["memory_vs_baseline"]) if a else "—",
                     _f(a["samples_per_second"]["median"]) if a else "—",
                     _f(a["tokens_per_second"]["median"], ",.0f") if a else "—",
                     _acc_text(c), _diff_text(c)])
    metric = acc_arms[0]["main_metric"] if acc_arms else "accuracy"
    out += table(["arm", "precision", f"time (% of {base})", f"memory (% of {base})", "samples/s", "tokens/s",
                   f"{metric} (mean ± std)", f"Δ {metric} vs {base} [95% CI]"], rows)
    out += ["", f"Time and memory are from speed mode (time per sample; memory: "
            f"{'peak allocated on the GPU' if cuda else 'peak resident set size of the process'}); where an arm "
            "has no speed run its time comes from its accuracy runs' training time.", ""]

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
                         ", ".join(str(x) for x in a["skipped_steps"]),
                         ", ".join("—" if x is None else f"{x:g}" for x in a["loss_scale_final"]),
                         _pct(a.get("other_cpu_share"))])
        out += table(["arm", "precision", "runs", f"{metric} mean ± std", "min–max",
                       f"Δ vs {base} [95% CI]", "train s (mean)", f"time % of {base}", "skipped steps per seed",
                       "final loss scale", "other processes' CPU (max)"], rows)
        out += ["", "Δ: mean of the per-seed differences to the baseline with a t-based 95% confidence interval "
                "(paired by seed).", ""]

    out += ["## Claims", ""]
    claims = results.get("claims", [])
    rows = [[c["claim"], f"**{c['verdict']}**", c["measured"] or "—", c["note"] or ""] for c in claims]
    out += table(["claim", "verdict", "measured", "note"], rows) + [""]
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
