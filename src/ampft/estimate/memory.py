"""Memory per rank of one training step, by component, for each way of spreading the model over ranks.

docs/benchmarks/estimate.md ("Memory: counted from a trace", its "Sharding" table) states what each strategy
divides by N and adds; activations and weight casts (autocast casts the gathered weights) are never divided. With
gradient checkpointing the peak holds the layers' inputs plus one recomputed layer's activations and casts.
"""

from __future__ import annotations

import bisect

from omegaconf import DictConfig, OmegaConf

from ampft.estimate.trace import StepTrace
from ampft.precision import deepspeed_mode

STRATEGIES = ("single", "ddp", "zero1", "zero2", "zero3", "fsdp2")
SCALER_BYTES = 12  # GradScaler: the scale (fp32), the growth tracker (int32), one found-inf flag (fp32)
GIB = 2**30


def deepspeed_half(cfg: DictConfig, precision: str) -> bool:
    """Whether DeepSpeed would run this precision in its own 16-bit mode (`distributed.deepspeed_precision`)."""
    return deepspeed_mode(OmegaConf.create({"name": precision}), cfg.distributed.deepspeed_precision) == "half"


def breakdown(tr: StepTrace, strategy: str, cfg: DictConfig, ranks: int) -> dict:
    """Per-rank bytes of one step of `cfg`'s recipe under `strategy` with `ranks` ranks (the distributed group's
    buckets and resharding, DeepSpeed's own 16-bit mode, fp16's loss scaler): the totals of the forward/backward and
    of the optimizer step, the larger one's components, its peak. With gradient accumulation the gradients of
    earlier micro-batches are there through each later forward/backward."""
    d = cfg.distributed
    n = 1 if strategy == "single" else max(1, ranks)
    p, fb = tr.trainable_params, tr.forward_backward.at_peak
    weights, grads, state = float(tr.weights), float(tr.gradients), float(tr.optimizer_state)
    casts = float(tr.saved_weight_casts)
    if tr.checkpointed_layers:  # the casts of the layer being recomputed at the peak, not only those kept for backward
        casts = max(casts, float(fb.get("weight_casts", 0)))
    master, grad_elem = 0.0, tr.gradients / max(p, 1)
    if strategy.startswith("zero") and deepspeed_half(cfg, tr.precision):
        weights, grads, master, casts, grad_elem = weights / 2, grads / 2, 4.0 * p, 0.0, 2
    grads_fb = grads if cfg.trainer.grad_accum > 1 else float(fb.get("gradients", 0)) * (grads / max(tr.gradients, 1))
    opt_temp = max(0.0, tr.optimizer_step.peak - tr.gradients - tr.optimizer_state)
    weight_elem = weights / max(tr.params, 1)
    block = float(tr.largest_block_params) * weight_elem
    w_div, g_div, s_div = dict(zero1=(1, 1, n), zero2=(1, n, n), zero3=(n, n, n), fsdp2=(n, n, n)).get(
        strategy, (1, 1, 1))  # what the strategy divides: weights, gradients, optimizer state
    comm_fb = comm_opt = 0.0
    if strategy == "ddp":
        comm_fb = comm_opt = grads
    elif strategy.startswith("zero"):
        comm_fb = comm_opt = float(min(d.reduce_bucket_size, p) * grad_elem)  # the gradient reduce bucket
        if strategy == "zero3":
            comm_fb += block + min(d.stage3_prefetch_bucket_size, p) * weight_elem
    elif strategy == "fsdp2":
        comm_fb = 2 * block + block / max(weight_elem, 1) * grad_elem
        if not d.fsdp_reshard_after_forward:
            comm_fb += weights * (n - 1) / n
    # CPU offload (DeepSpeed's offload_optimizer/offload_param, FSDP2's fsdp_cpu_offload): the optimizer state, its
    # fp32 master copies and its step, or the weights' shards, are in CPU memory, not on the GPU.
    off_opt = strategy.startswith("zero") and d.offload_optimizer or strategy == "fsdp2" and d.fsdp_cpu_offload
    off_weights = strategy == "zero3" and d.offload_param or strategy == "fsdp2" and d.fsdp_cpu_offload
    if off_opt:
        state = master = opt_temp = 0.0
    if off_weights:
        weights = 0.0
    resident = dict(weights=weights / w_div, optimizer_state=state / s_div, fp32_master_copies=master / s_div,
                    loss_scaler=SCALER_BYTES if tr.precision == "fp16" else 0)
    at_fb = dict(resident, weight_casts=casts, activations=float(fb.get("activations", 0)),
                 gradients=grads_fb / g_div, temporaries=float(fb.get("temporary", 0)), communication_buffers=comm_fb)
    at_opt = dict(resident, gradients=grads / g_div, temporaries=opt_temp / s_div, communication_buffers=comm_opt)
    fb_total, opt_total = sum(at_fb.values()), sum(at_opt.values())
    return dict(ranks=n, peak=max(fb_total, opt_total), forward_backward=fb_total, optimizer_step=opt_total,
                components=at_fb if fb_total >= opt_total else at_opt)


def forward_backward_at(tr: StepTrace, b: dict, batch_size: int) -> float:
    """The forward/backward total of `b` (a breakdown of `tr`) at another per-rank batch size: the traced timeline
    with every storage whose first dimension is the batch rescaled (nothing else in it depends on the batch)."""
    fb = tr.forward_backward
    return b["forward_backward"] + fb.peak_at(batch_size / tr.batch_size) - fb.peak


def largest_batch(tr: StepTrace, b: dict, usable_bytes: float, limit: int = 1 << 20) -> int:
    """The largest per-rank batch whose step fits in `usable_bytes` (allocated); 0 if not even one sample does."""
    if b["optimizer_step"] > usable_bytes:
        return 0
    # forward_backward_at grows with the batch: the count of batches 1, 2, ... that fit is the largest
    return bisect.bisect_right(range(1, limit), usable_bytes, key=lambda n: forward_backward_at(tr, b, n))
