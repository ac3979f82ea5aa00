"""The devices `make estimate` can be asked about: the GPUs of `ampft.devices` (datasheet figures, with sources) and
`cpu`, this machine, its rates measured by a short microbenchmark (see `measure_cpu`).
"""

from __future__ import annotations

import os
import time

import torch

from ampft.devices import GPUS, Device, cpu_name

CHOICES = [*GPUS, "cpu"]


def _rate(fn, work: float, seconds: float = 0.3) -> float:
    fn()  # warm-up (oneDNN primitive creation)
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or n < 2:
        fn()
        n += 1
    return work * n / elapsed


def measure_cpu(tokens: int = 512, width: int = 384) -> Device:
    """This machine as a device: achieved TFLOP/s of a BERT feed-forward-shaped linear per dtype (a square `a @ a`
    takes a much slower bf16 path on AVX2-only CPUs), copy bandwidth (about 2 s in all), and its RAM."""
    tflops: dict[str, float | None] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        x, w = torch.randn(tokens, width, dtype=dtype), torch.randn(4 * width, width, dtype=dtype)
        tflops[name] = _rate(lambda x=x, w=w: torch.nn.functional.linear(x, w), 2 * tokens * width * 4 * width) / 1e12
    tflops["tf32"] = tflops["fp32"]  # no TF32 on a CPU: tf32 runs as fp32
    x, y = torch.empty(64 * 2**20 // 4), torch.empty(64 * 2**20 // 4)  # 64 MiB of fp32 each
    bandwidth = _rate(lambda: y.copy_(x), 2 * x.nbytes) / 1e9
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    return Device("cpu", f"{cpu_name()} ({torch.get_num_threads()} threads)", pages / 2**30, bandwidth, tflops,
                  "measured on this machine now: a 512x384 by 384x1536 linear layer per dtype and a 64 MiB copy", kind="cpu")


def device(name: str) -> Device:
    """The named device (`estimate.gpu`), or this CPU measured."""
    return measure_cpu() if name == "cpu" else GPUS[name]
