"""Predicted vs measured on this CPU: the step's own peak memory, and the bf16/fp32 step-time ratio.

    python -m ampft.estimate.validate > rows.jsonl              # measure and predict every setting (minutes)
    python -m ampft.estimate.validate --quick                   # tiny-bert only
    python -m ampft.estimate.validate --render rows.jsonl       # the Markdown table of docs/benchmarks/estimate.md
    python -m ampft.estimate.validate --repredict rows.jsonl    # the same rows, predictions made again now

Each setting is measured in a fresh process, so nothing of an earlier setting stays in its memory. The step's own
peak: glibc is told to serve every allocation of 64 KiB or more by mmap (MALLOC_MMAP_THRESHOLD_=65536, set before the
process starts), so a freed tensor leaves the resident set at once; after two warm-up steps (the optimizer's state
then exists, as in a steady-state step) the process trims its heap, reads its resident set (VmRSS), resets its
resident peak (writing 5 to /proc/self/clear_refs), runs one step and reads the peak (VmHWM). Measured = peak - what
was resident before: the memory the step itself added, which is what the trace predicts on top of the weights and
optimizer state (the larger of the forward/backward peak and the optimizer step's, less the state). torch's CPU
allocator has no statistics to read, and tracemalloc sees no tensor memory; this reads what the kernel counts.
Step times: the two precisions alternate step by step in the same process (median of the timed steps), so load from
other processes falls on both.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ampft.estimate import gpus
from ampft.estimate import time as timing
from ampft.estimate.run import _labels, compose, trace_all
from ampft.finetune import build_optimizer
from ampft.models import build_model, load_tokenizer
from ampft.tasks import family_for

SETTINGS = [("tiny-bert", 8, 64), ("tiny-bert", 32, 128), ("minilm-l6", 8, 64), ("minilm-l6", 16, 128),
            ("bert-base", 4, 64), ("bert-base", 8, 128)]
QUICK = [("tiny-bert", 8, 64)]


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _overrides(model: str, batch: int, length: int) -> list[str]:
    return [f"model={model}", f"trainer.batch_size={batch}", f"task.max_length={length}", "estimate.gpu=cpu"]


def measure_here(model: str, batch: int, length: int, precisions: list[str], timed: int) -> dict:
    """In this (fresh) process: each precision's step peak above the resident baseline, and step times."""
    import torch


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

    def step(p: str) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=p == "bf16"):
            loss = net(**data).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), float(cfg.trainer.max_grad_norm))
        opt.step()
        opt.zero_grad(set_to_none=True)

    libc = ctypes.CDLL("libc.so.6")
    out: dict = {"peak": {}, "seconds": {p: [] for p in precisions}}
    for p in precisions:
        step(p)
        step(p)
        gc.collect()
        libc.malloc_trim(0)
        before = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")
        step(p)
        out["peak"][p] = _status("VmHWM") - before
    for _ in range(timed):
        for p in precisions:
            start = time.perf_counter()
            step(p)
            out["seconds"][p].append(time.perf_counter() - start)
    return out


def measure(model: str, batch: int, length: int, precisions: list[str], timed: int = 3) -> dict:
    """`measure_here` in a fresh process with glibc's mmap threshold at 64 KiB."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "65536"}
    cmd = [sys.executable, "-m", "ampft.estimate.validate", "--measure", json.dumps([model, batch, length, precisions,
                                                                                      timed])]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(f"measuring {model} {batch}x{length} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def predict(model: str, batch: int, length: int, precisions: list[str], cpu=None) -> dict:
    """The trace's step peak above weights and state, and the predicted step time, per precision, on this CPU."""

    cfg = compose(_overrides(model, batch, length))
    traces = trace_all(cfg, precisions, "cpu")[0]
    cpu = cpu or gpus.measure_cpu()
    return {p: dict(peak=max(tr.forward_backward.peak, tr.optimizer_step.peak - tr.optimizer_state),
                    seconds=timing.predict(tr, p, cpu)["seconds"]) for p, tr in traces.items()}


def validate(settings, timed: int = 3) -> list[dict]:

    cpu = gpus.measure_cpu()
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


def error(predicted: float, measured: float) -> float:
    return predicted / measured - 1


def markdown(rows: list[dict]) -> str:
    """Predicted vs measured per setting: the step's own peak (MiB) per precision, and the bf16/fp32 time ratio."""
    out = ["| model | batch x length | fp32 peak MiB predicted / measured (error) | bf16 peak MiB predicted / measured "
           "(error) | bf16/fp32 time predicted / measured (error) |", "|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for p in ("fp32", "bf16"):
            pr, me = r[f"{p}_peak_predicted"], r[f"{p}_peak_measured"]
            cells.append(f"{pr / 2**20:.1f} / {me / 2**20:.1f} ({error(pr, me):+.1%})")
        rp = r["bf16_seconds_predicted"] / r["fp32_seconds_predicted"]
        rm = r["bf16_seconds_measured"] / r["fp32_seconds_measured"]
        cells.append(f"{rp:.2f} / {rm:.2f} ({error(rp, rm):+.0%})")
        out.append(f"| {r['model']} | {r['batch']} x {r['length']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def repredict(rows: list[dict]) -> list[dict]:

    cpu = gpus.measure_cpu()
    for r in rows:
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
    ap.add_argument("--render")
    ap.add_argument("--repredict")
    args = ap.parse_args()
    if args.render or args.repredict:
        rows = [json.loads(line) for line in Path(args.render or args.repredict).read_text().splitlines() if line]
        print(markdown(rows) if args.render else "", end="\n" if args.render else "")
        if args.repredict:
            repredict(rows)
    elif args.measure:
        import logging

        logging.disable(logging.WARNING)
        print(json.dumps(measure_here(*json.loads(args.measure))))
    else:
        validate(QUICK if args.quick else SETTINGS, args.timed)
