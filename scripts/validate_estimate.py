"""Predicted vs measured on this CPU: the step's own peak memory, and the bf16/fp32 step-time ratio. A development
instrument for `make estimate` (docs/benchmarks/estimate.md), outside the package.

    python scripts/validate_estimate.py > rows.jsonl              # measure and predict every setting (minutes)
    python scripts/validate_estimate.py --quick                   # tiny-bert only
    python scripts/validate_estimate.py --render rows.jsonl       # the Markdown table of docs/benchmarks/estimate.md
    python scripts/validate_estimate.py --repredict rows.jsonl    # the same rows, predictions made again now
    python scripts/validate_estimate.py --checkpointing > gc.jsonl  # fp32 with and without gradient checkpointing
    python scripts/validate_estimate.py --checkpointing --setting bert-base,8,384   # one setting (MODEL,BATCH,LENGTH)
    python scripts/validate_estimate.py --calibrate               # ampft.estimate.time.EFFICIENCY, recomputed

Each setting is measured in a fresh process, so nothing of an earlier setting stays in its memory. The step's own
peak: glibc is told to serve every allocation of 64 KiB or more by mmap (MALLOC_MMAP_THRESHOLD_=65536, set before the
process starts), so a freed tensor leaves the resident set at once; after two warm-up steps (the optimizer's state
then exists, as in a steady-state step) the process trims its heap, reads its resident set (VmRSS), resets its
resident peak (writing 5 to /proc/self/clear_refs), runs one step and reads the peak (VmHWM). Measured = peak - what
was resident before: the memory the step itself added, which is what the trace predicts on top of the weights and
optimizer state (the larger of the forward/backward peak and the optimizer step's, less the state). torch's CPU
allocator has no statistics to read, and tracemalloc sees no tensor memory; this reads what the kernel counts.
Step times: the two precisions alternate step by step in the same process (median of the timed steps), so load from
other processes falls on both. `--checkpointing` does the same for fp32 without and with model.gradient_checkpointing,
switched on the one model between steps.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ampft.devices import GPUS, NVIDIA_ANCHOR
from ampft.estimate import time as timing
from ampft.estimate.run import _labels, trace_all
from ampft.finetune import build_optimizer
from ampft.launch import compose
from ampft.models import build_model, load_tokenizer
from ampft.tasks import family_for

SETTINGS = [("tiny-bert", 8, 64), ("tiny-bert", 32, 128), ("minilm-l6", 8, 64), ("minilm-l6", 16, 128),
            ("bert-base", 4, 64), ("bert-base", 8, 128)]
QUICK = [("tiny-bert", 8, 64)]
# With and without model.gradient_checkpointing (fp32): `--checkpointing`.
CHECKPOINTING = [("tiny-bert", 32, 128), ("minilm-l6", 16, 128), ("bert-base", 4, 128), ("bert-base", 8, 384)]


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _overrides(model: str, batch: int, length: int, checkpointing: bool = False) -> list[str]:
    return [f"model={model}", f"trainer.batch_size={batch}", f"task.max_length={length}",
            f"model.gradient_checkpointing={str(checkpointing).lower()}"]


def arm(precision: str, checkpointing: bool) -> str:
    """The name of a measured arm: the precision, with `+checkpointing` for model.gradient_checkpointing=true."""
    return precision + ("+checkpointing" if checkpointing else "")


def measure_here(model: str, batch: int, length: int, precisions: list[str], timed: int,
                 checkpointing: tuple[bool, ...] = (False,)) -> dict:
    """In this (fresh) process: each arm's step peak above the resident baseline, and step times. An arm is a
    precision, with and/or without gradient checkpointing (`checkpointing`), switched on the same model."""
    import torch

    from ampft.models import enable_gradient_checkpointing

    cfg = compose(_overrides(model, batch, length))
    m = cfg.model.copy()
    m.pretrained = False
    tok = load_tokenizer(m)
    labels, _ = _labels(cfg.task)
    torch.manual_seed(0)
    net = build_model(m, tok, labels, family_for(cfg.task.family), "fp32", torch.device("cpu"))
    opt = build_optimizer(net, cfg.optim, torch.device("cpu"))
    shape = (batch, length)
    data = dict(input_ids=torch.randint(1000, net.config.vocab_size, shape), attention_mask=torch.ones(shape, dtype=torch.long),
                token_type_ids=torch.zeros(shape, dtype=torch.long), labels=torch.zeros(batch, dtype=torch.long))
    net.train()

    def step(p: str, gc: bool) -> None:
        if gc != net.is_activation_checkpointing:
            enable_gradient_checkpointing(net, model) if gc else net.activation_checkpointing_disable()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=p == "bf16"):
            loss = net(**data).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), float(cfg.trainer.max_grad_norm))
        opt.step()
        opt.zero_grad(set_to_none=True)

    libc = ctypes.CDLL("libc.so.6")
    arms = [(p, c) for c in checkpointing for p in precisions]
    out: dict = {"peak": {}, "seconds": {arm(p, c): [] for p, c in arms}}
    for p, c in arms:
        step(p, c)
        step(p, c)
        gc.collect()
        libc.malloc_trim(0)
        before = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        step(p, c)
        out["peak"][arm(p, c)] = _status("VmHWM") - before
    for _ in range(timed):
        for p, c in arms:
            start = time.perf_counter()
            step(p, c)
            out["seconds"][arm(p, c)].append(time.perf_counter() - start)
    return out


def measure(model: str, batch: int, length: int, precisions: list[str], timed: int = 3,
            checkpointing: tuple[bool, ...] = (False,)) -> dict:
    """`measure_here` in a fresh process with glibc's mmap threshold at 64 KiB."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
    cmd = [sys.executable, __file__, "--measure", json.dumps([model, batch, length, precisions, timed,
                                                             list(checkpointing)])]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(f"measuring {model} {batch}x{length} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def predict(model: str, batch: int, length: int, precisions: list[str], cpu=None, checkpointing: bool = False) -> dict:
    """The trace's step peak above weights and state, and the predicted step time, per precision, on this CPU."""

    cfg = compose(_overrides(model, batch, length, checkpointing))
    traces = trace_all(cfg, precisions, "cpu")[0]
    cpu = cpu or timing.measure_cpu()
    return {p: dict(peak=max(tr.forward_backward.peak, tr.optimizer_step.peak - tr.optimizer_state),
                    seconds=timing.predict(tr, p, cpu)["seconds"]) for p, tr in traces.items()}


def calibration() -> dict:
    """The efficiency factor: the geometric mean over NVIDIA's TF32 and FP16 points of roofline time / published
    time, for BERT-large with a SQuAD head at 32 x 384 on the A100-80GB, traced for the A100
    (docs/benchmarks/estimate.md, "Time: a roofline with one calibrated factor")."""
    nv = NVIDIA_ANCHOR
    cfg = compose(["model=bert-large", "task=squad", f"trainer.batch_size={nv['batch_size']}",
                   f"task.max_length={nv['seq_len']}"])
    traces = trace_all(cfg, ["tf32", "fp16"], "cuda")[0]
    roof = {p: timing.roofline_seconds(traces[p], p, GPUS["a100-80gb"])["total"] for p in ("tf32", "fp16")}
    ratios = {p: roof[p] / (nv["batch_size"] / nv[p]) for p in roof}
    eff = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    return dict(efficiency=eff, per_point=ratios, published_speedup=nv["fp16"] / nv["tf32"],
                model_speedup=roof["tf32"] / roof["fp16"],
                source="NVIDIA DeepLearningExamples BERT (PyTorch) SQuAD fine-tuning, 1x A100-80GB, batch 32, seq 384: "
                       "TF32 61.5, FP16 110.5 sequences/s")


def validate(settings, timed: int = 3) -> list[dict]:

    cpu = timing.measure_cpu()
    rows = []
    for model, batch, length in settings:
        measured = measure(model, batch, length, ["fp32", "bf16"], timed)
        predicted = predict(model, batch, length, ["fp32", "bf16"], cpu)
        row = dict(model=model, batch=batch, length=length)
        for p in ("fp32", "bf16"):
            row[f"{p}_peak_measured"] = measured["peak"][p]
            row[f"{p}_peak_predicted"] = predicted[p]["peak"]
            row[f"{p}_seconds_measured"] = statistics.median(measured["seconds"][p])
            row[f"{p}_seconds_predicted"] = predicted[p]["seconds"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def validate_checkpointing(settings, timed: int = 3) -> list[dict]:
    """fp32 with and without model.gradient_checkpointing: each one's step peak, and the time ratio of the two
    (alternating step by step in one process), measured and predicted."""
    cpu = timing.measure_cpu()
    rows = []
    for model, batch, length in settings:
        measured = measure(model, batch, length, ["fp32"], timed, checkpointing=(False, True))
        row = dict(kind="checkpointing", model=model, batch=batch, length=length, precision="fp32")
        for c in (False, True):
            predicted = predict(model, batch, length, ["fp32"], cpu, checkpointing=c)["fp32"]
            name = "on" if c else "off"
            row[f"{name}_peak_measured"] = measured["peak"][arm("fp32", c)]
            row[f"{name}_peak_predicted"] = predicted["peak"]
            row[f"{name}_seconds_measured"] = statistics.median(measured["seconds"][arm("fp32", c)])
            row[f"{name}_seconds_predicted"] = predicted["seconds"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def markdown_checkpointing(rows: list[dict]) -> str:
    """Predicted vs measured per setting: the step's own peak (MiB) without and with gradient checkpointing, and
    the with/without step-time ratio."""
    out = ["| model | batch x length | step peak MiB without, predicted / measured (error) | with checkpointing, "
           "predicted / measured (error) | peak with / without, measured | time with / without, predicted / measured "
           "(error) |", "|---|---|---|---|---|---|"]
    for r in rows:
        cells = [_peak_cell(r, "off"), _peak_cell(r, "on"), f"{r['on_peak_measured'] / r['off_peak_measured']:.0%}",
                 _time_ratio_cell(r, "on", "off")]
        out.append(f"| {r['model']} | {r['batch']} x {r['length']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def error(predicted: float, measured: float) -> float:
    return predicted / measured - 1


def _peak_cell(r: dict, arm: str) -> str:
    """An arm's step peak in MiB, predicted / measured (error)."""
    pr, me = r[f"{arm}_peak_predicted"], r[f"{arm}_peak_measured"]
    return f"{pr / 2**20:.1f} / {me / 2**20:.1f} ({error(pr, me):+.1%})"


def _time_ratio_cell(r: dict, arm: str, base: str) -> str:
    """arm's step time over base's, predicted / measured (error)."""
    rp = r[f"{arm}_seconds_predicted"] / r[f"{base}_seconds_predicted"]
    rm = r[f"{arm}_seconds_measured"] / r[f"{base}_seconds_measured"]
    return f"{rp:.2f} / {rm:.2f} ({error(rp, rm):+.0%})"


def markdown(rows: list[dict]) -> str:
    """Predicted vs measured per setting: the step's own peak (MiB) per precision, and the bf16/fp32 time ratio."""
    out = ["| model | batch x length | fp32 peak MiB predicted / measured (error) | bf16 peak MiB predicted / measured "
           "(error) | bf16/fp32 time predicted / measured (error) |", "|---|---|---|---|---|"]
    for r in rows:
        cells = [_peak_cell(r, "fp32"), _peak_cell(r, "bf16"), _time_ratio_cell(r, "bf16", "fp32")]
        out.append(f"| {r['model']} | {r['batch']} x {r['length']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def repredict(rows: list[dict]) -> list[dict]:

    cpu = timing.measure_cpu()
    for r in rows:
        if r.get("kind") == "checkpointing":
            for c in (False, True):
                predicted = predict(r["model"], r["batch"], r["length"], ["fp32"], cpu, checkpointing=c)["fp32"]
                r[f"{'on' if c else 'off'}_peak_predicted"] = predicted["peak"]
                r[f"{'on' if c else 'off'}_seconds_predicted"] = predicted["seconds"]
            print(json.dumps(r), flush=True)
            continue
        predicted = predict(r["model"], r["batch"], r["length"], ["fp32", "bf16"], cpu)
        for p in ("fp32", "bf16"):
            r[f"{p}_peak_predicted"] = predicted[p]["peak"]
            r[f"{p}_seconds_predicted"] = predicted[p]["seconds"]
        print(json.dumps(r), flush=True)
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--measure")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--timed", type=int, default=3)
    ap.add_argument("--checkpointing", action="store_true", help="fp32 with and without gradient checkpointing")
    ap.add_argument("--setting", action="append", help="MODEL,BATCH,LENGTH instead of the built-in list")
    ap.add_argument("--render")
    ap.add_argument("--repredict")
    ap.add_argument("--calibrate", action="store_true", help="recompute ampft.estimate.time.EFFICIENCY")
    args = ap.parse_args()
    chosen = [(m, int(b), int(n)) for m, b, n in (x.split(",") for x in args.setting or [])]
    if args.calibrate:
        print(json.dumps(calibration(), indent=1))
    elif args.render or args.repredict:
        rows = [json.loads(line) for line in Path(args.render or args.repredict).read_text().splitlines() if line]
        if args.render:
            kinds = {r.get("kind") for r in rows}
            print(markdown_checkpointing(rows) if kinds == {"checkpointing"} else markdown(rows))
        if args.repredict:
            repredict(rows)
    elif args.measure:
        import logging

        logging.disable(logging.WARNING)
        print(json.dumps(measure_here(*json.loads(args.measure))))
    elif args.checkpointing:
        validate_checkpointing(chosen or (QUICK if args.quick else CHECKPOINTING), args.timed)
    else:
        validate(chosen or (QUICK if args.quick else SETTINGS), args.timed)
