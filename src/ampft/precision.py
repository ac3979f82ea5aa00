"""The one place where the precision group becomes Accelerate / torch settings.

fp32 and tf32 differ only in the TF32 switches, set explicitly either way so that "fp32" means true fp32.
fp16 gets a dynamic GradScaler from the precision group's keys; bf16 runs autocast with no scaler.

Accelerate on CPU silently runs fp32 when asked for fp16, so on CPU this module turns on real fp16 autocast
and `torch.amp.GradScaler("cpu")` (slow, but numerically fp16), and `check_effective` refuses to start a run
whose precision is not the one requested.
"""

from __future__ import annotations

import logging
import math
import os

import torch
from accelerate import Accelerator
from accelerate.utils import GradScalerKwargs
from omegaconf import DictConfig

from ampft.config import Precision
from ampft.devices import CPU_SPEED_DOC, cpu_flags, cpu_fp16_note, cpu_half_support

log = logging.getLogger(__name__)


def mixed_precision(name: Precision) -> str:
    """Accelerate's `mixed_precision` for a precision group name."""
    return {"fp32": "no", "tf32": "no", "fp16": "fp16", "bf16": "bf16"}[Precision(name).value]


def tf32_supported() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


def _fp32_precision_api() -> bool:
    """torch >= 2.9 has per-backend `fp32_precision` switches. Once they are set, reading a legacy flag
    (`allow_tf32`, `get_float32_matmul_precision`) raises on torch 2.13, so one API is used, never both."""
    cudnn = torch.backends.cudnn
    return hasattr(torch.backends.cuda.matmul, "fp32_precision") and hasattr(cudnn, "conv") and hasattr(cudnn, "rnn")


def set_tf32(enabled: bool) -> None:
    """TF32 for CUDA matmuls and cuDNN convolutions (and RNNs); off means IEEE fp32 everywhere."""
    if _fp32_precision_api():
        for backend in (torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn):
            backend.fp32_precision = "tf32" if enabled else "ieee"
        return
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    torch.set_float32_matmul_precision("high" if enabled else "highest")


def tf32_enabled() -> bool:
    """Whether CUDA fp32 matmuls run on TF32 Tensor Cores, read through the same API `set_tf32` writes."""
    if _fp32_precision_api():
        return torch.backends.cuda.matmul.fp32_precision == "tf32"
    return bool(torch.backends.cuda.matmul.allow_tf32)


def grad_scaler_kwargs(p: DictConfig) -> dict:
    return dict(init_scale=float(p.init_scale), growth_factor=float(p.growth_factor),
                backoff_factor=float(p.backoff_factor), growth_interval=int(p.growth_interval))


def accelerator_kwargs(p: DictConfig) -> dict:
    """Keyword arguments for `Accelerator(...)` that carry the precision."""
    handlers = [GradScalerKwargs(**grad_scaler_kwargs(p))] if p.name == Precision.fp16 else []
    return {"mixed_precision": mixed_precision(p.name), "kwargs_handlers": handlers}


class StaticGradScaler(torch.amp.GradScaler):
    """A fixed loss scale (`precision.static_scale`): overflowing steps are still skipped, the scale stays."""

    def __init__(self, device: str, scale: float):
        super().__init__(device, init_scale=scale, growth_interval=2**31 - 1)
        self.static_scale = scale

    def update(self, new_scale=None) -> None:
        super().update(self.static_scale)


def setup(accelerator: Accelerator, p: DictConfig) -> str:
    """Apply the precision group to a fresh Accelerator (before `prepare`); return what will run (tf32 asked
    for where there is none runs as fp32)."""
    set_tf32(p.name == Precision.tf32 and tf32_supported())
    if p.name == Precision.fp16 and accelerator.distributed_type.value != "DEEPSPEED":
        device = accelerator.device.type
        if p.static_scale is not None:
            accelerator.native_amp = True
            accelerator.scaler = StaticGradScaler(device, float(p.static_scale))
        elif device == "cpu" and accelerator.scaler is None:
            # Accelerate would run fp32 here. Turn on what fp16 means: autocast to float16 for the
            # forward pass (Accelerate wraps forward when native_amp is set) and a dynamic loss scaler
            # that prepare() hands to the optimizer, backward() and clip_grad_norm_().
            accelerator.native_amp = True
            accelerator.scaler = torch.amp.GradScaler("cpu", **grad_scaler_kwargs(p))
    check_effective(accelerator, p)
    return "fp32" if p.name == Precision.tf32 and not tf32_enabled() else Precision(p.name).value


def deepspeed_mode(p: DictConfig, mode: str = "auto") -> str | None:
    """How a 16-bit precision runs under DeepSpeed: "autocast" (fp32 weights and gradients, as on every other
    backend) or "half" (DeepSpeed's fp16/bf16 sections, fp32 master weights). `auto`: autocast for bf16, half
    for fp16 (its loss scaler honours the precision keys and reports skipped steps). None for fp32/tf32."""
    if p.name not in (Precision.fp16, Precision.bf16):
        return None
    mode = getattr(mode, "value", mode)
    return ("autocast" if p.name == Precision.bf16 else "half") if mode == "auto" else mode


def deepspeed_section(p: DictConfig, mode: str = "auto") -> tuple[dict, list[str]]:
    """The fp16/bf16 part of a DeepSpeed config, from the same keys; plus what DeepSpeed cannot honour."""
    fp16 = p.name == Precision.fp16
    if deepspeed_mode(p, mode) == "autocast":
        # fp32 weights, gradients and gradient reduction (no lower-precision communication), 16-bit
        # autocast in the forward pass: the same arithmetic as torch autocast with one process or DDP.
        return {"fp16": {"enabled": False}, "bf16": {"enabled": False}, "torch_autocast": {
            "enabled": True, "dtype": "float16" if fp16 else "bfloat16", "lower_precision_safe_modules": []}}, []
    section: dict = {"fp16": {"enabled": fp16}, "bf16": {"enabled": p.name == Precision.bf16}}
    caveats = []
    if fp16:
        power = math.log2(p.init_scale)
        if power != int(power):
            caveats.append(f"precision.init_scale={p.init_scale:g}: DeepSpeed takes a power of two; using "
                           f"2^{round(power)}")
        section["fp16"].update(
            loss_scale=0 if p.static_scale is None else float(p.static_scale),  # 0 means dynamic
            initial_scale_power=int(round(power)),
            loss_scale_window=int(p.growth_interval),
            hysteresis=int(p.hysteresis),
            min_loss_scale=float(p.min_scale),
        )
        if p.growth_factor != 2.0 or p.backoff_factor != 0.5:
            caveats.append(f"precision.growth_factor={p.growth_factor:g} / backoff_factor={p.backoff_factor:g}: "
                           "DeepSpeed always grows x2 and backs off x0.5")
    return section, caveats


def check_effective(accelerator: Accelerator, p: DictConfig) -> None:
    """Refuse to train in a precision other than the one asked for."""
    if accelerator.distributed_type.value == "DEEPSPEED":
        return  # DeepSpeed's engine owns autocast and scaling; its config is generated from `p`.
    want = mixed_precision(p.name)
    amp = want == "no" or accelerator.native_amp and (want != "fp16" or accelerator.scaler is not None)
    if accelerator.mixed_precision != want or not amp:
        raise RuntimeError(f"precision={p.name.value} was requested but Accelerate set up mixed_precision="
                           f"{accelerator.mixed_precision!r} (autocast={accelerator.native_amp}, "
                           f"scaler={accelerator.scaler is not None}) on {accelerator.device}. Refusing to run in a "
                           "precision other than the one asked for: check the accelerate launch config "
                           "(`mixed_precision` there must not be set; the precision group decides).")


def launcher_precision_problem(name: Precision) -> str | None:
    """Accelerate told (ACCELERATE_MIXED_PRECISION, from the launcher's flag or config file) a mixed precision
    other than the group's, which ampft's own `Accelerator` argument would silently win over: refused instead.
    `no` is what `accelerate launch` sets when told nothing, so it never conflicts."""
    told = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    want = mixed_precision(name)
    if told in ("", "no", want):
        return None
    fix = f"precision={told}" if told in ("fp16", "bf16") else None
    return (f"Accelerate was told mixed_precision={told} (accelerate launch --mixed_precision, mixed_precision in "
            f"its config file, or ACCELERATE_MIXED_PRECISION) but the precision group says precision="
            f"{Precision(name).value} (Accelerate's mixed_precision={want}). In ampft the precision group is the one "
            "place precision is set: " + (f"pass {fix}, or " if fix else f"ampft has no {told}: ")
            + f"drop the launcher's mixed_precision to run precision={Precision(name).value}")


def preflight(cfg: DictConfig) -> tuple[list[str], list[str]]:
    """Hardware/precision problems (errors) and caveats (warnings), found before any model is built."""
    errors, warnings, p = [], [], cfg.precision
    if problem := launcher_precision_problem(p.name):
        errors.append(problem)
    cuda = torch.cuda.is_available() and not cfg.trainer.cpu
    gpu = torch.cuda.get_device_name() if cuda else None
    if p.name == Precision.bf16 and cuda and not torch.cuda.is_bf16_supported():
        errors.append(f"precision=bf16 but {gpu} has no bf16 support: use precision=fp16 (dynamic loss scaling)")
    if p.name == Precision.bf16 and not cuda and not cpu_half_support(cpu_flags())["bf16"]:
        warnings.append("precision=bf16 on a CPU without AVX512-BF16 or AMX-BF16: its bf16 matrix products have no "
                        f"hardware path, so training runs many times slower than fp32 ({CPU_SPEED_DOC}). Use "
                        "precision=fp32 on this CPU; bf16 pays on a CPU with those flags or on a GPU.")
    if p.name == Precision.tf32 and not (cuda and tf32_supported()):
        warnings.append(f"precision=tf32: {gpu or 'CPU'} has no TF32 tensor cores, so this runs as plain fp32")
    if p.name == Precision.fp16:
        if not cuda:
            warnings.append("precision=fp16 on CPU runs real float16 autocast with a dynamic GradScaler: correct, but "
                            "its speed depends on native float16 support (AVX512-FP16 or AMX-FP16): "
                            f"{cpu_fp16_note(cpu_flags())}. For speed on a CPU use precision=bf16 where it has "
                            "AVX512-BF16/AMX-BF16.")
        if p.hysteresis != 1:
            warnings.append(f"precision.hysteresis={p.hysteresis} is honoured by DeepSpeed only; torch's GradScaler "
                            "backs off on the first overflow")
    return errors, warnings
