"""Step time from a traced step: a roofline per op, one efficiency factor calibrated on NVIDIA's published figures
(docs/benchmarks/estimate.md, "Time: a roofline with one calibrated factor"), applied unchanged to every device,
precision, model and shape: the reason these are predictions. For `estimate.gpu=cpu` the rates are this machine's,
measured (`measure_cpu`).
"""

from __future__ import annotations

import os
import time

import torch

from ampft.devices import Device, cpu_name
from ampft.estimate.trace import StepTrace

# From the calibration with this tree (torch 2.13): see the module docstring. Recomputed by
# `python scripts/validate_estimate.py --calibrate` and checked by
# tests/estimate/test_time.py::test_calibration_constant_is_current (slow).
EFFICIENCY = 0.808
CALIBRATION = dict(efficiency=EFFICIENCY, per_point=dict(tf32=0.754, fp16=0.867), published_speedup=1.797,
                   model_speedup=1.563, torch="2.13.0")


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


def op_seconds(flops: int, moved: int, dtype: str, precision: str, dev: Device) -> float:
    """Roofline time of one op at datasheet rates (efficiency 1)."""
    t_mem = moved / (dev.bandwidth_gbs * 1e9)
    if not flops:
        return t_mem
    key = {"float32": "tf32" if precision == "tf32" else "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, "fp32")
    peak = dev.tflops.get(key) or dev.tflops.get("fp32")
    return max(flops / (peak * 1e12), t_mem)


def roofline_seconds(tr: StepTrace, precision: str, dev: Device) -> dict[str, float]:
    """Seconds per phase at datasheet rates, and the share bound by compute."""
    out, compute = {}, 0.0
    for name, phase in (("forward_backward", tr.forward_backward), ("optimizer_step", tr.optimizer_step)):
        total = 0.0
        for flops, moved, dtype in phase.ops:
            t = op_seconds(flops, moved, dtype, precision, dev)
            total += t
            if flops and t > moved / (dev.bandwidth_gbs * 1e9):
                compute += t
        out[name] = total
    out["total"] = out["forward_backward"] + out["optimizer_step"]
    out["compute_bound_share"] = compute / out["total"] if out["total"] else 0.0
    return out


def predict(tr: StepTrace, precision: str, dev: Device, efficiency: float | None = None) -> dict | None:
    """Predicted step time, throughput and the MFU it assumes, for `precision` on `dev`; None where the device does
    not run `precision` (V100/T4: no bf16; tf32 without TF32 runs as fp32)."""
    ran = precision if precision != "tf32" or dev.tflops.get("tf32") else "fp32"
    peak = dev.tflops.get(ran)
    if peak is None:
        return None
    eff = efficiency if efficiency is not None else (1.0 if dev.kind == "cpu" else EFFICIENCY)
    roof = roofline_seconds(tr, precision, dev)
    seconds = roof["total"] / eff
    return dict(precision=precision, runs_as=ran, seconds=seconds, samples_per_second=tr.batch_size / seconds,
                tflops=tr.flops / seconds / 1e12, mfu=tr.flops / seconds / (peak * 1e12), efficiency=eff,
                roofline_seconds=roof["total"], compute_bound_share=roof["compute_bound_share"],
                optimizer_seconds=roof["optimizer_step"] / eff)
