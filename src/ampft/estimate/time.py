"""Step time from a traced step: a roofline per op, one efficiency factor calibrated on NVIDIA's published figures
(docs/benchmarks/estimate.md, "Time: a roofline with one calibrated factor"), applied unchanged to every device,
precision, model and shape: the reason these are predictions.
"""

from __future__ import annotations

import math

from ampft.devices import GPUS, NVIDIA_ANCHOR, Device
from ampft.estimate.trace import StepTrace

# From calibrate() with this tree (torch 2.13): see the module docstring. Recomputed by `python -m ampft.estimate.run`
# and checked by tests/estimate/test_time.py::test_calibration_constant_is_current (slow).
EFFICIENCY = 0.808
CALIBRATION = dict(efficiency=EFFICIENCY, per_point=dict(tf32=0.754, fp16=0.867), published_speedup=1.797,
                   model_speedup=1.563, torch="2.13.0")


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


def supported(precision: str, dev: Device) -> bool:
    """Whether the device runs `precision` at all (V100/T4: no bf16; tf32 without TF32 runs as fp32)."""
    return precision in ("fp32", "tf32") or dev.tflops.get(precision) is not None


def predict(tr: StepTrace, precision: str, dev: Device, efficiency: float | None = None) -> dict:
    """Predicted step time, throughput and the MFU it assumes, for `precision` on `dev`."""
    eff = efficiency if efficiency is not None else (1.0 if dev.kind == "cpu" else EFFICIENCY)
    roof = roofline_seconds(tr, precision, dev)
    seconds = roof["total"] / eff
    ran = precision if precision != "tf32" or dev.tflops.get("tf32") else "fp32"
    peak = dev.tflops.get(ran)
    mfu = tr.flops / seconds / (peak * 1e12) if peak else None
    return dict(precision=precision, runs_as=ran, seconds=seconds, samples_per_second=tr.batch_size / seconds,
                tflops=tr.flops / seconds / 1e12, mfu=mfu, efficiency=eff,
                roofline_seconds=roof["total"], compute_bound_share=roof["compute_bound_share"],
                optimizer_seconds=roof["optimizer_step"] / eff)


def calibrate(traces: dict[str, StepTrace]) -> dict:
    """Efficiency = geometric mean over NVIDIA's TF32 and FP16 points of roofline time / published time, for
    BERT-large with a SQuAD head at 32 x 384 on the A100-80GB (`traces`: its tf32 and fp16 steps, traced by
    `ampft.estimate.run.calibration`)."""
    nv = NVIDIA_ANCHOR
    roof = {p: roofline_seconds(traces[p], p, GPUS["a100-80gb"])["total"] for p in ("tf32", "fp16")}
    ratios = {p: roof[p] / (nv["batch_size"] / nv[p]) for p in roof}
    eff = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    return dict(efficiency=eff, per_point=ratios, published_speedup=nv["fp16"] / nv["tf32"],
                model_speedup=roof["tf32"] / roof["fp16"],
                source="NVIDIA DeepLearningExamples BERT (PyTorch) SQuAD fine-tuning, 1x A100-80GB, batch 32, seq 384: "
                       "TF32 61.5, FP16 110.5 sequences/s")
