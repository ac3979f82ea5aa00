"""The devices `make estimate` knows: memory, memory bandwidth and dense peak TFLOP/s per precision, with sources.

Tensor Core figures are dense (datasheets print them "with sparsity", twice as high: halved here), the same
convention as `ampft.benchmark.flops.PEAK_TFLOPS` (a test keeps the two tables in agreement). fp32 is the CUDA-core
rate that `precision=fp32` (TF32 off) runs at; None: the GPU has no such path (V100 and T4 have no TF32 or bf16).
`cpu` is this machine, its rates measured by a short microbenchmark (see `measure_cpu`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Device:
    name: str
    label: str
    memory_gib: float  # what the card has (GB on datasheets are 10^9 bytes; converted)
    bandwidth_gbs: float  # GB/s, 10^9 bytes per second
    tflops: dict[str, float | None]  # dense peak per precision: fp32 (CUDA cores), tf32, fp16, bf16
    source: str
    kind: str = "cuda"  # cuda | cpu: whose autocast op lists apply
    notes: list[str] = field(default_factory=list)


GB = 1e9 / 2**30  # GiB per datasheet GB

DEVICES: dict[str, Device] = {d.name: d for d in [
    Device("h200", "NVIDIA H200 SXM 141GB", 141 * GB, 4800,
           dict(fp32=67.0, tf32=494.5, fp16=989.5, bf16=989.5),
           "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column); nvidia.com/en-us/data-center/h200"),
    Device("h100-sxm", "NVIDIA H100 SXM5 80GB", 80 * GB, 3350,
           dict(fp32=67.0, tf32=494.5, fp16=989.5, bf16=989.5),
           "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column); nvidia.com/en-us/data-center/h100"),
    Device("a100-80gb", "NVIDIA A100 SXM4 80GB", 80 * GB, 2039,
           dict(fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0),
           "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column); nvidia.com/en-us/data-center/a100"),
    Device("a100-40gb", "NVIDIA A100 SXM4 40GB", 40 * GB, 1555,
           dict(fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0),
           "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM column); nvidia.com/en-us/data-center/a100"),
    Device("v100-32gb", "NVIDIA V100 SXM2 32GB", 32 * GB, 900,
           dict(fp32=15.7, tf32=None, fp16=125.0, bf16=None),
           "NVIDIA V100 Tensor Core GPU datasheet (V100 SXM2 column); nvidia.com/en-us/data-center/v100"),
    Device("l4", "NVIDIA L4 24GB", 24 * GB, 300,
           dict(fp32=30.3, tf32=60.0, fp16=121.0, bf16=121.0),
           "NVIDIA L4 Tensor Core GPU datasheet; nvidia.com/en-us/data-center/l4"),
    Device("t4", "NVIDIA T4 16GB", 16 * GB, 320,
           dict(fp32=8.1, tf32=None, fp16=65.0, bf16=None),
           "NVIDIA T4 Tensor Core GPU datasheet (FP16 mixed precision 65 TFLOPS); nvidia.com/en-us/data-center/tesla-t4"),
    Device("rtx4090", "NVIDIA GeForce RTX 4090 24GB", 24 * GB, 1008,
           dict(fp32=82.6, tf32=82.6, fp16=165.2, bf16=165.2),
           "NVIDIA Ada Lovelace GPU architecture whitepaper, appendix table for the RTX 4090 (Tensor Core rates "
           "with FP32 accumulate, which PyTorch's autocast uses; FP16 accumulate is twice that)"),
]}
CHOICES = [*DEVICES, "cpu"]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU"


def _rate(fn, work: float, seconds: float = 0.3) -> float:
    fn()  # warm-up (oneDNN primitive creation)
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or n < 2:
        fn()
        n += 1
    return work * n / elapsed


def measure_cpu(tokens: int = 512, width: int = 384) -> Device:
    """This machine as a device: TFLOP/s of a linear layer per dtype (tokens x width into 4 x width, the shape of a
    BERT feed-forward matmul; a square `a @ a` takes another, much slower bf16 path on AVX2-only CPUs) and copy
    bandwidth, measured now (about 2 s), and its RAM. Achieved rates, not datasheet peaks: the time model takes
    them with an efficiency of 1."""
    tflops: dict[str, float | None] = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)):
        x, w = torch.randn(tokens, width, dtype=dtype), torch.randn(4 * width, width, dtype=dtype)
        tflops[name] = _rate(lambda x=x, w=w: torch.nn.functional.linear(x, w), 2 * tokens * width * 4 * width) / 1e12
    tflops["tf32"] = tflops["fp32"]  # no TF32 on a CPU: tf32 runs as fp32
    x = torch.empty(64 * 2**20 // 4)
    y = torch.empty_like(x)
    bandwidth = _rate(lambda: y.copy_(x), 2 * x.nbytes) / 1e9
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    return Device("cpu", f"{cpu_name()} ({torch.get_num_threads()} threads)", pages / 2**30, bandwidth, tflops,
                  "measured on this machine now: a 512x384 by 384x1536 linear layer per dtype and a 64 MiB copy", kind="cpu")


# torch.cuda.get_device_name() of the table's GPUs (first match wins; H100 PCIe/NVL have other rates: not matched).
CUDA_NAMES = [(r"H200", "h200"), (r"H100.*(SXM|HBM3)", "h100-sxm"), (r"A100.*80", "a100-80gb"), (r"A100", "a100-40gb"),
              (r"V100.*32", "v100-32gb"), (r"\bL4\b", "l4"), (r"\bT4\b", "t4"), (r"4090", "rtx4090")]


def for_cuda_name(name: str) -> Device | None:
    """The table's entry for a CUDA device name, or None."""
    import re

    return next((DEVICES[key] for pattern, key in CUDA_NAMES if re.search(pattern, name)), None)


def device(name: str) -> Device:
    """The named device (`estimate.gpu`), or this CPU measured."""
    if name == "cpu":
        return measure_cpu()
    return DEVICES[name]
