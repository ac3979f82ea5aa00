"""PNG plots with matplotlib's object API and the Agg canvas (no display, no global pyplot state).
matplotlib is the `plots` extra, imported when a plot is drawn."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from ampft.extras import require

COLORS = defaultdict(lambda: "#777777", fp32="#4c72b0", tf32="#8172b2", fp16="#dd8452", bf16="#55a868")


def throughput(results: dict, ax) -> None:
    arms = results["speed"]["arms"]
    tps = [a["tokens_per_second"] for a in arms]
    labels = [f"{a['arm']}\n{a['speedup']:.2f}x" if a.get("speedup") else a["arm"] for a in arms]
    yerr = [[t["median"] - t["q1"] for t in tps], [t["q3"] - t["median"] for t in tps]]
    ax.bar(labels, [t["median"] for t in tps], yerr=yerr, capsize=4, color=[COLORS[a["precision"]] for a in arms])
    ax.set(ylabel="tokens / s (median)", title=f"Throughput per arm (x: vs {results['benchmark']['baseline']})")
    ax.margins(y=0.15)


def memory(results: dict, ax) -> None:
    arms, cuda = results["speed"]["arms"], results["environment"]["device_type"] == "cuda"
    alloc = [(a["peak_memory_bytes"] or 0) / 2**30 for a in arms]
    colors = [COLORS[a["precision"]] for a in arms]
    if cuda:
        x = range(len(arms))
        ax.bar([i - 0.2 for i in x], alloc, width=0.4, label="peak allocated", color=colors)
        ax.bar([i + 0.2 for i in x], [(a["peak_reserved_bytes"] or 0) / 2**30 for a in arms], width=0.4,
               label="peak reserved", color="#bbbbbb")
        ax.set_xticks(list(x), [a["arm"] for a in arms])
        ax.legend()
    else:
        ax.bar([a["arm"] for a in arms], alloc, color=colors)
    for i, a in enumerate(arms):
        if a.get("memory_vs_baseline") is not None:
            ax.annotate(f"{100 * a['memory_vs_baseline']:.0f}%", (i, alloc[i]), ha="center", va="bottom",
                        xytext=(0, 4), textcoords="offset points")
    ax.set(ylabel="GiB", title="Peak memory per arm" + ("" if cuda else " (process peak RSS, CPU)"))
    ax.margins(y=0.15)


def memory_vs_batch(results: dict, ax) -> str | None:
    cuda = results["environment"]["device_type"] == "cuda"
    key = "peak_allocated_bytes" if cuda else "peak_rss_bytes"
    sizes = set()
    for r in results["speed"]["raw"]:
        if not (pts := [p for p in r["sweep"] if p["fits"]]):
            continue
        xs, ys = [p["batch_size"] for p in pts], [p[key] / 2**30 for p in pts]
        sizes.update(xs)
        ax.plot(xs, ys, marker="o", label=r["arm"], color=COLORS[r["precision"]],
                linestyle="-" if r["attn_implementation"] == "sdpa" else "--")
        if oom := [p["batch_size"] for p in r["sweep"] if not p["fits"]]:
            ax.annotate(f"OOM at {oom[0]}", (xs[-1], ys[-1]), xytext=(4, -10), textcoords="offset points",
                        fontsize=8)
    if not sizes:
        cut = [c["arm"] for c in (results.get("budget") or {}).get("cuts", []) if c["mode"] == "sweep"]
        return (f"no memory sweep: cut by the time budget ({', '.join(cut)})" if cut
                else "no memory sweep (benchmark.sweep.batch_sizes is empty)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(sizes), [str(n) for n in sorted(sizes)])
    ax.minorticks_off()
    ax.set(xlabel="batch size", ylabel="GiB" + (" (peak allocated)" if cuda else " (process peak RSS)"),
           title="Peak memory versus batch size")
    ax.legend()


def loss_curves(results: dict, ax) -> str | None:
    seen = set()
    for r in (results.get("accuracy") or {}).get("runs", []):
        if r["loss_curve"]:
            ax.plot(*zip(*(point[:2] for point in r["loss_curve"]), strict=True),  # [step, loss, lr]
                    color=COLORS[r["precision"]], alpha=0.7, linewidth=1.2, label=None if r["arm"] in seen else r["arm"])
            seen.add(r["arm"])
    if not seen:
        return "no accuracy runs"
    ax.set(xlabel="optimizer step", ylabel="training loss (logging window mean)",
           title="Loss curves (one line per seed)")
    ax.legend()


def loss_scale(results: dict, ax) -> str | None:
    runs = [r for r in (results.get("accuracy") or {}).get("runs", []) if r["loss_scale_trace"]]
    for r in runs:
        ax.step(*zip(*r["loss_scale_trace"], strict=True), where="post", alpha=0.8,
                label=f"{r['arm']} seed {r['seed']} ({r.get('skipped_steps') or 0} skipped)")
    if not runs:
        return "no fp16 arm in accuracy mode: no loss scale to show\n(bf16 and fp32 need no loss scaling)"
    ax.set_yscale("log", base=2)
    ax.set(xlabel="optimizer step", ylabel="loss scale", title="fp16 dynamic loss scale")
    ax.legend(fontsize=8)


# Each plot draws on `ax`; one without data returns a text to show instead, so that every plot the report
# links explains itself.
PLOTS = {  # file: (the mode whose results it draws, how, its caption in report.md)
    "throughput.png": ("speed", throughput,
                       "Throughput per arm (median tokens/s; bars: interquartile range of the timed steps)"),
    "memory.png": ("speed", memory, "Peak memory per arm"),
    "memory_vs_batch.png": ("speed", memory_vs_batch, "Peak memory versus batch size"),
    "loss_curves.png": ("accuracy", loss_curves, "Training loss per arm and seed (accuracy mode)"),
    "loss_scale.png": ("accuracy", loss_scale, "fp16 dynamic loss scale (accuracy mode)"),
}


def make_plots(results: dict, out_dir: Path) -> list[str]:
    """Write the PNGs that the results have data for; return their file names."""
    made = [name for name, (mode, _, _) in PLOTS.items() if results.get(mode)]
    for name in made:
        feature = "the benchmark's PNG plots"
        fig = require("matplotlib.figure", "plots", feature).Figure(figsize=(7.0, 4.0), dpi=100, layout="constrained")
        require("matplotlib.backends.backend_agg", "plots", feature).FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        if empty := PLOTS[name][1](results, ax):
            ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, wrap=True)
            ax.set_axis_off()
        fig.savefig(Path(out_dir) / name)
    return made
