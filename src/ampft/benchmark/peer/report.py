"""results.json → report.md: the arms side by side, per-seed numbers, FLOP/s, each side's gain from bf16 (or
another precision) over fp32 and ampft/Trainer per precision, targets and accuracy checks, what each fast
path contributes, and the machine (GPU, CPU model and flags). Tables, the busy-machine threshold and the
hardware section are the precision benchmark's (`ampft.benchmark.report`)."""

from __future__ import annotations

from pathlib import Path

from ampft.benchmark.peer.config import Runner
from ampft.benchmark.peer.profile import SKIP, WARMUP
from ampft.benchmark.report import BUSY, hardware, table
from ampft.devices import cpu_half_support


def render(results: dict) -> str:
    env, setup, arms = results["environment"], results["setup"], results["arms"]
    trainers = [n for n, a in arms.items() if a["runner"] == Runner.trainer.value]
    first = next(iter(arms.values()))
    metric = setup["metric"]
    precisions = list(dict.fromkeys(a["precision"] for a in arms.values()))
    precision = setup["precision"] if len(precisions) == 1 else f"{' or '.join(precisions)} (per arm: see differs by)"
    lines = [
        f"# ampft vs the Hugging Face Trainer: {results['name']}",
        "",
        f"Measured {env['date']} on {env['device_name']} ({env['cpu_count']} CPU cores, torch threads "
        f"{env['torch_threads']}); torch {env['torch']}, transformers {env['transformers']}, accelerate "
        f"{env['accelerate']}, Python {env['python']}.",
        "",
        f"Same for every arm: model {setup['model']}, task {setup['task']} ({setup['train_file'] or 'Hub'}), "
        f"{first['train_examples']} training examples, max length {setup['max_length']}, "
        f"batch {setup['batch_size']}, lr {setup['lr']:g}, {setup['epochs']:g} epoch(s), {precision}, "
        f"seeds {setup['seeds']}. Each arm runs in its own process, one at a time.",
        "",
        f"Command: `{results['command'] or 'run_peer(...)'}`",
        "",
    ]
    if sources := results.get("sources"):  # `combine`: seeds measured in separate runs
        lines += [f"Combined from {len(sources)} runs of this setup on this machine "
                  "(`ampft.benchmark.peer.combine`), summarized as one:", ""]
        lines += [f"- `{s['dir']}`: seeds {s['seeds']}, arms {', '.join(s['arms'])}; `{s['command']}`" for s in sources]
        lines.append("")
    if len(results.get("seeds_requested") or setup["seeds"]) > len(setup["seeds"]):
        lines += [f"**Partial**: seeds {setup['seeds']} of the {results['seeds_requested']} asked for were measured "
                  "when this report was written (it is rewritten after every seed; the benchmark stopped or "
                  "was still running).", ""]
    rows = []
    for name, a in arms.items():
        score = f"{a['metric']:.2f}" + ("" if a["metric_std"] is None else f" ± {a['metric_std']:.2f}")
        rows.append([name, a["runner"], ", ".join(a["overrides"]) or "(defaults)", f"{a['samples_per_second']:.1f}",
                     f"{a['tokens_per_second']:.0f}", f"{a['train_seconds']:.1f}", f"{a['wall_seconds']:.1f}", score,
                     f"{a['peak_memory_bytes'] / 2**20:.0f}",
                     *(f"{a['speedup'][t]:.2f}" if t in a["speedup"] else "—" for t in trainers)])
    lines += table(["arm", "runner", "differs by", "samples/s", "tokens/s", "training s", "wall s", metric, "peak MiB",
                    *(f"x {t}" for t in trainers)], rows, align="lll" + "r" * (6 + len(trainers)))
    lines += ["", "samples/s and tokens/s (non-padding) are over the training loop; wall is the whole process "
              "(imports, model, tokenization, training, evaluation). Peak memory: "
              f"{first['peak_memory_kind']}."
              + (" x: samples/s over a Trainer arm's in the same precision (— for another precision)."
                 if len(precisions) > 1 else ""), ""]
    if len(setup["seeds"]) > 1:
        lines += [f"With {len(setup['seeds'])} seeds: samples/s, times and memory are medians, {metric} "
                  "is the mean ± standard deviation. Per seed:", ""]
        lines += table(["arm", *(f"seed {s} {what}" for s in setup["seeds"] for what in ("samples/s", metric))],
                       [[name, *(f"{x:.{d}f}" for v, m in zip(a["samples_per_second_per_seed"], a["metric_per_seed"],
                                                              strict=True) for x, d in ((v, 1), (m, 2)))]
                        for name, a in arms.items()], align="l" + "rr" * len(setup["seeds"]))
        lines.append("")
    mfus = {n: a["mfu"] for n, a in arms.items() if a["mfu"] is not None}
    lines += ["Model FLOP/s over non-padding tokens (6N + 12·L·h·s per token, per example's length): "
              + ", ".join(f"{n} {a['model_tflops'] * 1e3:.2f} GFLOP/s" for n, a in arms.items()) + ". "
              + (("MFU: " + ", ".join(f"{n} {v:.1%}" for n, v in mfus.items()) + f" of {first['peak_tflops']:g} "
                  f"TFLOP/s ({first['peak_tflops_source']}).") if mfus else f"MFU: {first['peak_tflops_source']}."),
              ""]
    lines += _precision_section(results)
    lines += _profile_section(results)
    lines += ["## Targets", ""]
    for t in results["targets"]:
        lines.append(f"- {t['arm']} at least {t['min_ratio']:g}x the samples/s of {t['over']}: measured "
                     f"{t['ratio']:.2f}x, **{'met' if t['met'] else 'NOT met'}**.")
    tol = results["accuracy_tolerance"]
    for acc in results["accuracy"]:
        line = (f"- {acc['arm']} {metric} within {tol:g} point(s) of {acc['reference']}: "
                f"{acc['difference']:+.2f}, **{'yes' if acc['within'] else 'NO'}**.")
        if len(acc["per_seed"]) > 1:
            line += (f" Paired over {len(acc['per_seed'])} seeds: "
                     f"{', '.join(f'{d:+.2f}' for d in acc['per_seed'])}, standard error {acc['standard_error']:.2f};"
                     f" within one seed standard deviation of {acc['reference']} ({acc['reference_std']:.2f}): "
                     f"**{'yes' if acc['within_reference_std'] else 'NO'}**.")
        lines.append(line)
    loaded = {n: a["other_load"] for n, a in arms.items() if a["other_load"] > BUSY}
    if loaded:
        lines += ["", "**Warning**: other processes used CPU while these arms ran (share of the machine): "
                  + ", ".join(f"{n} {v:.0%}" for n, v in loaded.items()) + "; their timings are unreliable."]
    ampft = [n for n, a in arms.items() if a["runner"] == Runner.ampft.value and not a["overrides"]]
    ablations = [a for a in arms.values() if a["runner"] == Runner.ampft.value and a["overrides"]
                 and ampft and a["precision"] == arms[ampft[0]]["precision"]]  # other precisions: their own section
    if ampft and ablations:
        base = arms[ampft[0]]
        lines += ["", f"## What each fast path contributes (relative to {ampft[0]})", ""]
        for a in ablations:
            lines.append(f"- {', '.join(a['overrides'])}: {a['samples_per_second'] / base['samples_per_second']:.2f}x "
                         f"the samples/s, {a['wall_seconds'] / base['wall_seconds']:.2f}x the wall time")
    lines += ["", *hardware(env)]
    return "\n".join(lines).rstrip("\n") + "\n"


def _precision_section(results: dict) -> list[str]:
    """Each side's gain from a lower precision (an fp32 arm and its twin, measured in this run), and ampft
    against the Trainer in each precision; empty where no arm has an fp32 twin."""
    gains, arms, env = results.get("precision_gains") or [], results["arms"], results["environment"]
    if not gains:
        return []
    metric = results["setup"]["metric"]
    ran_in = "each of these runs" if results.get("sources") else "this run"  # `combine`: several runs
    out = []
    for prec in dict.fromkeys(g["precision"] for g in gains):
        out += [f"## {prec} against fp32", "",
                f"Each pair differs only in `precision`; both ran in {ran_in}, with the same seeds and data, so "
                f"the {metric} difference is paired by seed (the mean of the per-seed differences, in points).", ""]
        rows = [[g["runner"], g["fp32"], g["arm"], f"{arms[g['fp32']]['samples_per_second']:.1f}",
                 f"{arms[g['arm']]['samples_per_second']:.1f}", f"{g['ratio']:.2f}x",
                 ", ".join(f"{d:+.2f}" for d in g["metric_difference_per_seed"]), f"{g['metric_difference']:+.2f}"]
                for g in gains if g["precision"] == prec]
        out += table(["side", "fp32 arm", f"{prec} arm", "fp32 samples/s", f"{prec} samples/s", f"{prec} / fp32",
                      f"{metric} Δ per seed", f"{metric} Δ"], rows, align="lllrrrlr") + [""]
        for v in (v for v in results.get("by_precision") or [] if v["precision"] == prec):
            rows = [[r["precision"], r["trainer"], r["ampft"], f"{arms[r['trainer']]['samples_per_second']:.1f}",
                     f"{arms[r['ampft']]['samples_per_second']:.1f}", f"{r['ratio']:.2f}x",
                     f"{arms[r['trainer']]['metric']:.2f}", f"{arms[r['ampft']]['metric']:.2f}",
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
                     "CPU that has it.") + " The CPU's model and flags: Hardware and software, below.", ""]
    return out


def _profile_section(results: dict) -> list[str]:
    """Where a step's time goes, per arm (peer.profile_steps): self time by op category, per step and per
    1,000 real tokens, and each arm's top ops; empty without profiles."""
    profiled = {n: a["profile"] for n, a in results["arms"].items() if a.get("profile")}
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
    out = ["## Where a step's time goes (torch.profiler)", "",
           f"{first['steps']} training steps per arm (the first seed's run, after {SKIP + WARMUP} unrecorded steps), profiled "
           f"the same way for both runners: a global optimizer-step hook advances the profiler, so a step is "
           f"data loading, forward, backward, clipping, optimizer, scheduler and zero_grad. Time is "
           f"{first['clock']} by op, summed into categories by op name (`ampft.benchmark.peer.profile`); "
           "each arm's full table is profile.txt in its directory.", ""]
    out += table(["", *names], rows, align="l" + "r" * len(names)) + [""]
    for name, p in profiled.items():
        key = "gpu_ms" if p["top"] and p["top"][0]["gpu_ms"] is not None else "cpu_ms"
        out.append(f"- {name}: " + ", ".join(f"{o['op']} {o[key]:.1f} ms ({o['calls']:g}x)" for o in p["top"][:6]))
    return out + [""]


def write_report(results: dict, out_dir: Path) -> Path:
    path = Path(out_dir) / "report.md"
    path.write_text(render(results))
    return path
