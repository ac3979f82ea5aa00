"""Training FLOPs of an encoder, peak TFLOP/s of known devices, and MFU.

Per token, one training step (forward + backward) of a Transformer encoder costs

    6 * N  +  12 * n_layers * seq_len * hidden

N is the number of non-embedding parameters (every parameter outside `nn.Embedding` modules). A weight
matrix of n parameters costs 2n FLOPs per token in the forward pass (one multiply and one add per
weight) and 4n in the backward pass (gradients of the input and of the weight): 6n. Attention adds two
matmuls per layer that have no parameters: Q·Kᵀ and A·V, each 2 * seq_len * hidden FLOPs per token
forward, so 3 * 4 * seq_len * hidden per layer for training. (PaLM, Chowdhery et al. 2022, appendix B;
the same count as Kaplan et al. 2020 with both attention matmuls.) Biases, LayerNorm, softmax, GELU and
the optimizer are not counted, as usual. The pooler and classifier run once per sequence but are counted
per token, which overstates 6N by their share of N: 0.35% for BERT-large, 6% for the 64-wide tiny-bert.

MFU = achieved FLOP/s / dense peak FLOP/s of the precision that ran, on that device.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

# Dense (no structured sparsity) peak TFLOP/s from the vendors' datasheets. fp32: CUDA cores (what
# `precision=fp32` with TF32 switched off uses); tf32/fp16/bf16: Tensor Cores. None: not supported.
# Matched against torch.cuda.get_device_name() in order; the first pattern that matches wins.
# Tensor Core figures on the datasheets are "with sparsity": halved here.
# H200 (SXM and NVL): NVIDIA H200 Tensor Core GPU datasheet / nvidia.com/en-us/data-center/h200 ("H200 SXM"
# and "H200 NVL" columns). torch names the SXM part "NVIDIA H200" and the PCIe card "NVIDIA H200 NVL".
PEAK_TFLOPS: list[tuple[str, str, dict[str, float | None]]] = [
    (r"H200.*NVL", "NVIDIA H200 NVL", dict(fp32=60.0, tf32=417.5, fp16=835.5, bf16=835.5)),
    (r"H200", "NVIDIA H200 SXM", dict(fp32=67.0, tf32=494.5, fp16=989.5, bf16=989.5)),
    (r"H100.*PCIe", "NVIDIA H100 PCIe", dict(fp32=51.0, tf32=378.0, fp16=756.0, bf16=756.0)),
    (r"H100(?!.*NVL)", "NVIDIA H100 SXM", dict(fp32=67.0, tf32=494.5, fp16=989.5, bf16=989.5)),
    (r"A100", "NVIDIA A100 (SXM4/PCIe, 40/80 GB)", dict(fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0)),
    (r"V100S", "NVIDIA V100S PCIe", dict(fp32=16.4, tf32=None, fp16=130.0, bf16=None)),
    (r"V100.*PCIE", "NVIDIA V100 PCIe", dict(fp32=14.0, tf32=None, fp16=112.0, bf16=None)),
    (r"V100", "NVIDIA V100 SXM2", dict(fp32=15.7, tf32=None, fp16=125.0, bf16=None)),
    (r"\bL4\b", "NVIDIA L4", dict(fp32=30.3, tf32=60.0, fp16=121.0, bf16=121.0)),
    # A10G (AWS G5) has no public NVIDIA datasheet; these are the figures AWS/NVIDIA give for it.
    (r"A10G", "NVIDIA A10G", dict(fp32=35.0, tf32=35.0, fp16=70.0, bf16=70.0)),
]
# H100 NVL runs at lower clocks than the SXM part and its datasheet figures changed between revisions:
# unknown here rather than wrong (set benchmark.peak_tflops).
_NOT_IN_TABLE = re.compile(r"H100.*NVL")


def nonembedding_params(model: torch.nn.Module) -> int:
    """Parameters outside nn.Embedding modules (lookups cost no matmul FLOPs)."""
    embedding = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in embedding)


def encoder_dims(config) -> tuple[int, int]:
    """(n_layers, hidden) of a transformers config (BERT/RoBERTa/DeBERTa names, or DistilBERT's)."""
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "dim", None)
    if not layers or not hidden:
        raise ValueError(f"cannot read the layer count and width from a {type(config).__name__}")
    return int(layers), int(hidden)


def training_flops_per_token(n_params_nonembedding: int, n_layers: int, seq_len: int, hidden: int) -> int:
    """6N + 12·L·s·h: forward + backward FLOPs per token (see the module docstring)."""
    return 6 * n_params_nonembedding + 12 * n_layers * seq_len * hidden


def training_flops(model: torch.nn.Module, lengths: Iterable[int]) -> int:
    """Training FLOPs of one pass over examples of these (non-padding) lengths: each example's tokens at the
    per-token count for its own length, sum over s of s · (6N + 12·L·s·h). Padding costs nothing here, so
    runs that pad differently are credited with the same useful work."""
    layers, hidden = encoder_dims(model.config)
    n = nonembedding_params(model)
    return sum(s * training_flops_per_token(n, layers, s, hidden) for s in lengths)


def model_flops_per_token(model: torch.nn.Module, seq_len: int) -> dict[str, int]:
    layers, hidden = encoder_dims(model.config)
    n = nonembedding_params(model)
    return dict(
        params=sum(p.numel() for p in model.parameters()),
        params_nonembedding=n,
        n_layers=layers,
        hidden=hidden,
        flops_per_token=training_flops_per_token(n, layers, seq_len, hidden),
    )


def lookup_peak(device_name: str) -> tuple[str | None, dict[str, float | None]]:
    """(table entry, peaks per precision) for a CUDA device name; (None, {}) when unknown."""
    if _NOT_IN_TABLE.search(device_name):
        return None, {}
    for pattern, label, peaks in PEAK_TFLOPS:
        if re.search(pattern, device_name):
            return label, dict(peaks)
    return None, {}


def peak_tflops(precision: str, device_type: str, device_name: str,
                override: dict[str, float | None] | None = None) -> tuple[float | None, str]:
    """Dense peak TFLOP/s of `precision` (what ran) and where the number came from."""
    if override and override.get(precision) is not None:
        return float(override[precision]), "config (benchmark.peak_tflops)"
    if device_type != "cuda":
        return None, f"peak unknown: no peak table for {device_type} (set benchmark.peak_tflops.{precision})"
    label, peaks = lookup_peak(device_name)
    if label is None:
        return None, (f"peak unknown: {device_name} is not in ampft's table (set benchmark.peak_tflops.{precision} "
                      "to its dense peak TFLOP/s from the datasheet)")
    if peaks.get(precision) is None:
        return None, f"none: {label} has no {precision} peak"
    return peaks[precision], f"datasheet: {label}"


def mfu(tflops_achieved: float | None, peak: float | None) -> float | None:
    if tflops_achieved is None or not peak:
        return None
    return tflops_achieved / peak
