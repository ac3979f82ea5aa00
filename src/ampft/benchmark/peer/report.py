"""results.json → report.md: the arms side by side, per-seed numbers, FLOP/s, targets and accuracy checks,
and what each fast path contributes. Tables and the busy-machine threshold are the precision benchmark's
(`ampft.benchmark.report`)."""

from __future__ import annotations

from pathlib import Path

from ampft.benchmark.peer.config import Runner
from ampft.benchmark.report import BUSY, table


def render(results: dict) -> str:
    env, setup, arms = results["environment"], results["setup"], results["arms"]
    trainers = [n for n, a in arms.items() if a["runner"] == Runner.trainer.value]
    first = next(iter(arms.values()))
    metric = setup["metric"]
    lines = [
        f"# ampft vs the Hugging Face Trainer: {results['name']}",
        "",
        f"Measured {env['date']} on {env['device_name']} ({env['cpu_count']} CPU cores, torch threads "
        f"{env['torch_threads']}); torch {env['torch']}, transformers {env['transformers']}, accelerate "
        f"{env['accelerate']}, Python {env['python']}.",
        "",
        f"Same for every arm: model {setup['model']}, task {setup['task']} ({setup['train_file'] or 'Hub'}), "
        f"{first['train_examples']} training examples, max length {setup['max_length']}, "
        f"batch {setup['batch_size']}, lr {setup['lr']:g}, {setup['epochs']:g} epoch(s), {setup['precision']}, "
        f"seeds {setup['seeds']}. Each arm runs in its own process, one at a time.",
        "",
        f"Command: `{results['command'] or 'run_peer(...)'}`",
        "",
    ]
    rows = []
    for name, a in arms.items():
        score = f"{a['metric']:.2f}" + ("" if a["metric_std"] is None else f" ± {a['metric_std']:.2f}")
        rows.append([name, a["runner"], ", ".join(a["overrides"]) or "(defaults)", f"{a['samples_per_second']:.1f}",
                     f"{a['tokens_per_second']:.0f}", f"{a['train_seconds']:.1f}", f"{a['wall_seconds']:.1f}", score,
                     f"{a['peak_memory_bytes'] / 2**20:.0f}", *(f"{a['speedup'][t]:.2f}" for t in trainers)])
    lines += table(["arm", "runner", "differs by", "samples/s", "tokens/s", "training s", "wall s", metric, "peak MiB",
                    *(f"x {t}" for t in trainers)], rows, align="lll" + "r" * (6 + len(trainers)))
    lines += ["", "samples/s and tokens/s (non-padding) are over the training loop; wall is the whole process "
              "(imports, model, tokenization, training, evaluation). Peak memory: "
              f"{first['peak_memory_kind']}.", ""]
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
              "", "## Targets", ""]
    for t in results["targets"]:
        lines.append(f"- {t['arm']} at least {t['min_ratio']:g}x the samples/s of {t['over']}: measured "
                     f"{t['ratio']:.2f}x, **{'met' if t['met'] else 'NOT met'}**.")
    tol = results["accuracy_tolerance"]
    for acc in results["accuracy"]:
        lines.append(f"- {acc['arm']} {metric} within {tol:g} point(s) of {acc['reference']}: "
                     f"{acc['difference']:+.2f}, **{'yes' if acc['within'] else 'NO'}**.")
    loaded = {n: a["other_load"] for n, a in arms.items() if a["other_load"] > BUSY}
    if loaded:
        lines += ["", "**Warning**: other processes used CPU while these arms ran (share of the machine): "
                  + ", ".join(f"{n} {v:.0%}" for n, v in loaded.items()) + "; their timings are unreliable."]
    ampft = [n for n, a in arms.items() if a["runner"] == Runner.ampft.value and not a["overrides"]]
    ablations = [a for a in arms.values() if a["runner"] == Runner.ampft.value and a["overrides"]]
    if ampft and ablations:
        base = arms[ampft[0]]
        lines += ["", f"## What each fast path contributes (relative to {ampft[0]})", ""]
        for a in ablations:
            lines.append(f"- {', '.join(a['overrides'])}: {a['samples_per_second'] / base['samples_per_second']:.2f}x "
                         f"the samples/s, {a['wall_seconds'] / base['wall_seconds']:.2f}x the wall time")
    return "\n".join(lines) + "\n"


def write_report(results: dict, out_dir: Path) -> Path:
    path = Path(out_dir) / "report.md"
    path.write_text(render(results))
    return path
