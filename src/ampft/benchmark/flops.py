"""Training FLOPs of an encoder, 6N + 12·L·s·h per token (N: non-embedding parameters; the count and what it
leaves out: docs/benchmarks/README.md#flops-tflops-and-mfu), peak TFLOP/s of known devices (the table in
`ampft.devices`), and MFU = achieved FLOP/s / dense peak FLOP/s of the precision that ran, on that device.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ampft.devices import for_cuda_name


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
    return 6 * n_params_nonembedding + 12 * n_layers * seq_len * hidden


def training_flops(model: torch.nn.Module, lengths: Iterable[int]) -> int:
    """Training FLOPs of one pass over examples of these non-padding lengths, sum of s · (6N + 12·L·s·h).
    Padding costs nothing here, so runs that pad differently are credited with the same useful work."""
    layers, hidden, n = *encoder_dims(model.config), nonembedding_params(model)
    return sum(s * training_flops_per_token(n, layers, s, hidden) for s in lengths)


def model_flops_per_token(model: torch.nn.Module, seq_len: int) -> dict[str, int]:
    layers, hidden, n = *encoder_dims(model.config), nonembedding_params(model)
    return dict(params=sum(p.numel() for p in model.parameters()), params_nonembedding=n, n_layers=layers,
                hidden=hidden, flops_per_token=training_flops_per_token(n, layers, seq_len, hidden))


def peak_tflops(precision: str, device_type: str, device_name: str,
                override: dict[str, float | None] | None = None) -> tuple[float | None, str]:
    """Dense peak TFLOP/s of `precision` (what ran) and where the number came from."""
    if override and override.get(precision) is not None:
        return float(override[precision]), "config (benchmark.peak_tflops)"
    if device_type != "cuda":
        return None, f"peak unknown: no peak table for {device_type} (set benchmark.peak_tflops.{precision})"
    if (device := for_cuda_name(device_name)) is None:
        return None, (f"peak unknown: {device_name} is not in ampft's table (set benchmark.peak_tflops.{precision} "
                      "to its dense peak TFLOP/s from the datasheet)")
    if device.tflops.get(precision) is None:
        return None, f"none: {device.label} has no {precision} peak"
    return device.tflops[precision], f"datasheet: {device.label}"


def mfu(tflops_achieved: float | None, peak: float | None) -> float | None:
    return tflops_achieved / peak if tflops_achieved is not None and peak else None
