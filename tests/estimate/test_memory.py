"""Memory per rank: sharding divides what it should and nothing else; the largest batch is the one that fits."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from ampft.estimate import memory
from ampft.estimate.run import trace_all
from tests.helpers import compose_config

N = 4
OVERRIDES = ["model=tiny-bert", "task.max_length=64"]


@pytest.fixture(scope="module")
def cfg():
    return compose_config("estimate", [*OVERRIDES, "trainer.batch_size=8"])


@pytest.fixture(scope="module")
def traces(cfg):
    return trace_all(cfg, ["bf16", "fp16"], "cuda")[0]


def test_sharding_divides_what_it_should(cfg, traces):
    tr = traces["bf16"]
    one = memory.breakdown(tr, "single", cfg, N)
    assert one["ranks"] == 1  # one GPU is one rank whatever N is
    c = {s: memory.breakdown(tr, s, cfg, N)["components"] for s in memory.STRATEGIES}
    # Activations and weight casts are per rank: never divided.
    for s in memory.STRATEGIES:
        assert c[s]["activations"] == c["single"]["activations"] == tr.forward_backward.at_peak["activations"]
        assert c[s]["weight_casts"] == c["single"]["weight_casts"] == tr.saved_weight_casts
    w, st = tr.weights, tr.optimizer_state
    assert c["single"]["weights"] == c["ddp"]["weights"] == c["zero1"]["weights"] == c["zero2"]["weights"] == w
    assert c["zero3"]["weights"] == c["fsdp2"]["weights"] == w / N
    assert c["single"]["optimizer_state"] == c["ddp"]["optimizer_state"] == st
    for s in ("zero1", "zero2", "zero3", "fsdp2"):
        assert c[s]["optimizer_state"] == st / N
    # DDP's buckets: a second copy of the gradients.
    assert c["ddp"]["communication_buffers"] == tr.gradients
    # The optimizer step: gradients whole under ZeRO-1, divided under ZeRO-2/3 and FSDP2.
    opt = {s: memory.breakdown(tr, s, cfg, N) for s in memory.STRATEGIES}
    for s, div in (("zero1", 1), ("zero2", N), ("zero3", N), ("fsdp2", N)):
        b = opt[s]
        bucket = min(500_000_000, tr.trainable_params) * 4 if s.startswith("zero") else 0
        expected = (w / (N if s in ("zero3", "fsdp2") else 1) + st / N + tr.gradients / div
                    + max(0, tr.optimizer_step.peak - tr.gradients - st) / N + bucket)
        assert b["optimizer_step"] == pytest.approx(expected)


def test_zero_peak_falls_with_the_stage(cfg, traces):
    """With buckets small against the model (as DeepSpeed's defaults are against BERT-large; against tiny-bert
    they are not, and ZeRO-3's prefetch bucket then gathers the whole model)."""
    tr = traces["bf16"]
    small = OmegaConf.merge(cfg, {"distributed": {"reduce_bucket_size": 1000, "stage3_prefetch_bucket_size": 1000}})
    peaks = [memory.breakdown(tr, s, small, N)["peak"] for s in ("ddp", "zero1", "zero2", "zero3")]
    assert peaks == sorted(peaks, reverse=True) and peaks[0] > peaks[-1]


def test_deepspeed_half_mode_holds_16_bit_weights_and_an_fp32_master_copy(cfg, traces):
    """fp16 runs in DeepSpeed's own 16-bit mode by default (distributed.deepspeed_precision=auto)."""
    tr = traces["fp16"]
    p = tr.trainable_params
    assert memory.deepspeed_half(cfg, "fp16") and not memory.deepspeed_half(cfg, "bf16")
    c = memory.breakdown(tr, "zero1", cfg, N)["components"]
    assert c["weights"] == tr.weights / 2 and c["fp32_master_copies"] == 4 * p / N
    assert c["weight_casts"] == 0 and c["loss_scaler"] == memory.SCALER_BYTES


def test_fp16_foreach_optimizer_needs_temporaries_that_fused_bf16_does_not(traces):
    """fp16 loss scaling uses foreach AdamW (fused would swallow the skipped steps): full-size temporaries."""
    full = traces
    extra = {p: full[p].optimizer_step.peak - full[p].gradients - full[p].optimizer_state for p in ("bf16", "fp16")}
    assert extra["bf16"] < 0.01 * full["bf16"].weights
    assert extra["fp16"] >= full["fp16"].weights * 0.9


def test_peak_at_another_batch_matches_its_own_trace(traces):
    """The forward/backward peak rescaled to a quarter of the batch is the peak a trace at that batch finds."""
    full, low = traces, trace_all(compose_config("estimate", [*OVERRIDES, "trainer.batch_size=2"]), ["bf16", "fp16"],
                                  "cuda")[0]
    for p in ("bf16", "fp16"):
        scale = low[p].batch_size / full[p].batch_size
        assert full[p].forward_backward.peak_at(scale) == pytest.approx(low[p].forward_backward.peak, rel=0.02)
        assert full[p].forward_backward.peak_at(1.0) == full[p].forward_backward.peak


def test_largest_batch_is_the_last_that_fits(cfg, traces):
    tr = traces["bf16"]
    b = memory.breakdown(tr, "single", cfg, 1)
    usable = b["peak"] * 3
    n = memory.largest_batch(tr, b, usable)
    assert n > tr.batch_size
    assert memory.forward_backward_at(tr, b, n) <= usable < memory.forward_backward_at(tr, b, n + 1)
    assert memory.largest_batch(tr, b, b["optimizer_step"] * 0.5) == 0



def test_cpu_offload_takes_its_part_off_the_gpu(cfg, traces):
    """distributed=deepspeed-z3-offload was counted as plain ZeRO-3: the optimizer state and weights it keeps in CPU
    memory were on the GPU's bill."""
    tr = traces["fp16"]
    off = OmegaConf.merge(cfg, {"distributed": {"offload_optimizer": True, "offload_param": True,
                                                "fsdp_cpu_offload": True}})
    for s in ("zero1", "zero2", "zero3", "fsdp2"):
        on, c = memory.breakdown(tr, s, cfg, N), memory.breakdown(tr, s, off, N)
        assert c["components"]["optimizer_state"] == c["components"].get("fp32_master_copies", 0) == 0
        assert c["peak"] < on["peak"]
    for s in ("zero3", "fsdp2"):
        assert memory.breakdown(tr, s, off, N)["components"]["weights"] == 0
    assert memory.breakdown(tr, "zero2", off, N)["components"]["weights"] > 0
    for s in ("single", "ddp"):
        assert memory.breakdown(tr, s, off, N) == memory.breakdown(tr, s, cfg, N)
