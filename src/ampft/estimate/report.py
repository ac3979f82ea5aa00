"""estimate.json (everything, plain data), estimate.md (the same for people) and the console summary."""

from __future__ import annotations

import json
from pathlib import Path

from ampft.files import markdown_table

GIB = 2**30
LABELS = dict(weights="weights", fp32_master_copies="fp32 master copies", gradients="gradients",
              optimizer_state="optimizer state (AdamW)", weight_casts="16-bit weight casts kept for backward",
              activations="activations saved for backward", temporaries="temporaries at the peak",
              communication_buffers="communication buffers / gathered layers", loss_scaler="loss scaler")
STRATEGY_NAMES = dict(single="1 GPU", ddp="DDP", zero1="ZeRO-1", zero2="ZeRO-2", zero3="ZeRO-3", fsdp2="FSDP2")
SUMMARY_HEADER = ["precision", "step peak GiB", "device needs GiB", "fits", "largest batch", "memory vs fp32",
                  "step ms", "samples/s", "MFU", "time vs fp32"]


def gib(x: float) -> str:
    return f"{x / GIB:.2f}"


def _asked(r: dict) -> dict:
    """The row of the composed precision, or the first estimated where that one was left out."""
    return r["rows"].get(r["precision"]) or r["rows"][r["precisions"][0]]


def summary_rows(r: dict, strategy: str = "single") -> list[list[str]]:
    """Per precision: peak, fits, largest batch, step time, throughput, MFU, ratios to fp32."""
    base = r["rows"].get("fp32")
    rows = []
    for p in r["precisions"]:
        m, t = r["rows"][p]["memory"][strategy], r["rows"][p]["time"]
        mem_ratio = f"{m['peak'] / base['memory'][strategy]['peak']:.0%}" if base else "—"
        if t:
            time_ratio = f"{t['seconds'] / base['time']['seconds']:.0%}" if base and base["time"] else "—"
            timing = [f"{t['seconds'] * 1e3:.0f}", f"{t['samples_per_second']:.1f}",
                      f"{t['mfu']:.0%}" if t["mfu"] is not None else "—", time_ratio]
        else:
            timing = ["not supported", "—", "—", "—"]
        rows.append([p + (" (asked)" if p == r["precision"] else ""), gib(m["peak"]), gib(m["device_total"]),
                     "yes" if m["fits"] else "**no**", str(m["largest_batch"]), mem_ratio, *timing])
    return rows


def markdown(r: dict) -> str:
    dev, asked = r["device"], _asked(r)
    out = [f"# Estimate: {r['model']} on {r['task']}, batch {r['batch_size']} x {r['seq_len']} tokens, {dev['label']}"
           + (", gradient checkpointing" if r.get("gradient_checkpointing") else ""),
           "", "**Predictions**, not measurements: memory counted from a trace of one training step on fake tensors, "
           "time from a roofline with an efficiency factor calibrated on NVIDIA's published BERT-large A100 figures "
           "(docs/benchmarks/estimate.md states how far both have been off).", ""]
    if r["command"]:
        out += [f"Command: `{r['command']}`", ""]
    out += [f"## One device ({gib(r['usable_bytes'])} GiB usable of {dev['memory_gib']:.1f} GiB)", "",
            *markdown_table(SUMMARY_HEADER, summary_rows(r)), "",
            "`largest batch`: per device, at this sequence length (below the recipe's batch: it does not fit). "
            "`device needs`: the step's peak plus the allocator's slack, the CUDA context and workspaces (estimate.* "
            "keys).", "",
            f"## Memory per rank ({r['ranks']} ranks where sharded): {asked['precision']} at its peak, by component",
            ""]
    mem, rows = asked["memory"], []
    strategies = list(mem)
    for c in LABELS:
        vals = [mem[s]["components"].get(c, 0) for s in strategies]
        if any(vals):
            rows.append([LABELS[c], *[gib(v) if v >= 1 << 20 or not v else f"{v:.0f} B" for v in vals]])
    for p in r["precisions"]:
        cells = [f"{gib(r['rows'][p]['memory'][s]['peak'])} / {r['rows'][p]['memory'][s]['largest_batch']}"
                 for s in strategies]
        rows.append([f"**{p}: step peak / largest batch**", *(f"**{c}**" for c in cells)] if p == asked["precision"]
                    else [f"{p}: step peak / largest batch", *cells])
    names = [STRATEGY_NAMES[s] + (" (recipe)" if s == r["strategy"] else "") for s in strategies]
    out += [*markdown_table(["GiB per rank", *names], rows), "", "## Seed claims, judged on these predictions", "",
            *markdown_table(["claim", "verdict", "predicted", "note"],
                            [[v["claim"], f"**{v['verdict']}**", v["predicted"], v["note"]] for v in r["verdicts"]]), ""]
    t = asked["trace"]
    checkpointed = (f"- gradient checkpointing (model.gradient_checkpointing=true): {t['checkpointed_layers']} layers "
                    "keep only their inputs and are recomputed in the backward pass; the FLOPs and the time include "
                    "the recomputed forward" if t.get("checkpointed_layers")
                    else "- gradient checkpointing: off (model.gradient_checkpointing)")
    out += ["## The trace", "",
            f"- {t['params'] / 1e6:.1f}M parameters; {t['flops'] / 1e12:.2f} TFLOP per step "
            f"(torch.utils.flop_counter's formulas); traced in {t['seconds']} s",
            "- saved for backward by dtype (GiB): "
            + ", ".join(f"{k} {gib(v)}" for k, v in t["saved_by_dtype"].items()),
            checkpointed,
            f"- device: {dev['label']}, {dev['bandwidth_gbs']:.0f} GB/s, peak TFLOP/s "
            + ", ".join(f"{k} {v:g}" for k, v in dev["tflops"].items() if v) + f" ({dev['source']})",
            f"- efficiency: {r['efficiency']:.3f} of the roofline" if r["efficiency"] else "- efficiency: —",
            "- every batch padded to task.max_length (the worst case; with trainer.padding=longest most are shorter)"]
    out += [*(f"- {n}" for n in r["notes"] + r["warnings"]), "",
            f"estimated in {r['seconds']} s with torch {r['torch']}"]
    return "\n".join(out) + "\n"


def console(r: dict) -> str:
    """The short version for the terminal: the recipe's strategy (per rank where it shards)."""
    s = r["strategy"]
    ckpt = ", gradient checkpointing" if r.get("gradient_checkpointing") else ""
    where = "one device" if s == "single" else f"per rank, {STRATEGY_NAMES[s]} on {r['ranks']} ranks"
    lines = [f"{r['model']} / {r['task']}, batch {r['batch_size']} x {r['seq_len']}, on {r['device']['label']} "
             f"({gib(r['usable_bytes'])} GiB usable){ckpt}, {where} -- PREDICTED"]
    lines += [row.replace("**", "") for row in markdown_table(SUMMARY_HEADER, summary_rows(r, s))]
    c = _asked(r)["memory"][s]["components"]
    lines.append(f"{r['precision']}, {where}: "
                 + ", ".join(f"{LABELS[k]} {gib(v)}" for k, v in c.items() if v >= 1 << 20))
    lines += [f"  [{v['verdict']}] {v['claim']}: {v['predicted']}" for v in r["verdicts"]]
    return "\n".join(lines)


def write(r: dict, out_dir: Path) -> Path:
    (out_dir := Path(out_dir)).mkdir(parents=True, exist_ok=True)
    (out_dir / "estimate.json").write_text(json.dumps(r, indent=1, default=str))
    (out_dir / "estimate.md").write_text(markdown(r))
    return out_dir / "estimate.md"
