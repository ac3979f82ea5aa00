"""The FLOPs formula against a hand count, and against torch's own FLOP counter; peaks and MFU."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from ampft.benchmark import flops
from ampft.devices import GPUS
from ampft.models import build_model, load_tokenizer
from ampft.tasks.classification import CLASSIFICATION

# tiny-bert (conf/model/tiny-bert.yaml): h=64, L=2, intermediate FF=128, 2 labels.
H, L, FF, LABELS = 64, 2, 128, 2


def hand_count_nonembedding() -> int:
    """Every parameter outside the three embedding tables, counted by hand."""
    linear = lambda fan_in, fan_out: fan_in * fan_out + fan_out  # noqa: E731  weight + bias
    layernorm = 2 * H
    layer = 4 * linear(H, H) + layernorm + linear(H, FF) + linear(FF, H) + layernorm  # Q K V O, LN, FFN, LN
    return layernorm + L * layer + linear(H, H) + linear(H, LABELS)  # embedding LN, layers, pooler, classifier


@pytest.fixture(scope="module")
def tiny_model():
    from tests.helpers import compose_config

    cfg = compose_config("finetune", ["model=tiny-bert", "model.attn_implementation=eager"])
    return build_model(cfg.model, load_tokenizer(cfg.model), ["negative", "positive"], CLASSIFICATION)


def test_hand_count_of_tiny_bert(tiny_model):
    assert hand_count_nonembedding() == 71_362  # 128 + 2 * 33_472 + 4_160 + 130
    assert flops.nonembedding_params(tiny_model) == 71_362
    # 6N + 12·L·s·h at s = 128: 6 * 71_362 + 12 * 2 * 128 * 64
    assert flops.training_flops_per_token(71_362, L, 128, H) == 428_172 + 196_608 == 624_780
    got = flops.model_flops_per_token(tiny_model, 128)
    assert (got["flops_per_token"], got["n_layers"], got["hidden"]) == (624_780, L, H)
    assert got["params"] == 71_362 + (30522 + 512 + 2) * H  # + word, position, token-type tables


def test_training_flops_over_lengths_is_the_hand_count(tiny_model):
    """An accuracy run's useful work (model TFLOP/s): each example at its own length, 6N·s + 12·L·h·s² (no padding)."""
    n, lengths = hand_count_nonembedding(), [3, 5, 13]
    assert flops.training_flops(tiny_model, lengths) == sum(6 * n * s + 12 * L * H * s * s for s in lengths)
    # Examples that all have the same length cost what the per-token formula says for that length.
    assert flops.training_flops(tiny_model, [32] * 4) == 4 * 32 * flops.model_flops_per_token(tiny_model, 32)[
        "flops_per_token"]
    assert flops.training_flops(tiny_model, []) == 0


def test_formula_matches_torch_flop_counter(tiny_model):
    """torch counts the matmuls of a real forward + backward: per token 3 · 2 · (4h² + 2hI) per layer for
    the weights plus 3 · 4·s·h per layer for QKᵀ and AV; the pooler and classifier once per sequence.
    The formula also counts biases, LayerNorms, pooler and classifier per token: ~6% more on this tiny
    model (their share of N), 0.35% on BERT-large."""
    batch, seq = 4, 32
    ids = torch.randint(1000, 30000, (batch, seq))
    tiny_model.train()
    with FlopCounterMode(display=False) as counter:
        out = tiny_model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.zeros(batch, dtype=torch.long))
        out.loss.backward()
    counted = counter.get_total_flops()
    per_layer_token = 2 * (4 * H * H + 2 * H * FF) + 4 * seq * H
    hand = 3 * (batch * seq * L * per_layer_token + batch * 2 * (H * H + H * LABELS))
    assert counted == hand
    formula = batch * seq * flops.training_flops_per_token(flops.nonembedding_params(tiny_model), L, seq, H)
    assert 1.0 < formula / counted < 1.08


def test_bert_large_formula():
    # BERT-large: 24 layers, h=1024, I=4096; N from the same count as above.
    h, n_layers, inter = 1024, 24, 4096
    layer = 4 * (h * h + h) + 2 * h + (h * inter + inter) + (inter * h + h) + 2 * h
    n = 2 * h + n_layers * layer + (h * h + h) + (h * 2 + 2)
    assert n == 303_363_074  # + 31.8M embedding parameters = the 335M of BERT-large
    per_token = flops.training_flops_per_token(n, n_layers, 384, h)
    assert per_token == 6 * n + 12 * 24 * 384 * 1024
    assert per_token == pytest.approx(1.93e9, rel=0.01)


def test_peaks_come_from_the_device_table():
    assert flops.peak_tflops("bf16", "cuda", "NVIDIA A100-SXM4-80GB") == (GPUS["a100-80gb"].tflops["bf16"],
                                                                           "datasheet: NVIDIA A100 80GB")


def test_unknown_devices_and_cpus_have_no_mfu_unless_configured():
    assert flops.peak_tflops("bf16", "cuda", "NVIDIA L40S")[1].startswith("peak unknown")  # not mistaken for an L4
    assert flops.peak_tflops("bf16", "cuda", "NVIDIA H100 NVL")[1].startswith("peak unknown")
    peak, source = flops.peak_tflops("bf16", "cpu", "Intel Xeon")
    assert peak is None and "benchmark.peak_tflops.bf16" in source
    peak, source = flops.peak_tflops("bf16", "cuda", "NVIDIA B300 SXM6 AC")
    assert peak is None and source.startswith("peak unknown") and "set benchmark.peak_tflops.bf16" in source
    assert flops.peak_tflops("bf16", "cuda", "NVIDIA B300 SXM6 AC", {"bf16": 2250.0})[0] == 2250.0
    assert flops.peak_tflops("bf16", "cpu", "Intel Xeon", {"bf16": 2.0}) == (2.0, "config (benchmark.peak_tflops)")
    assert flops.peak_tflops("fp32", "cuda", "NVIDIA A100-SXM4-80GB")[0] == 19.5  # TF32 off: CUDA cores
    assert flops.peak_tflops("bf16", "cuda", "Tesla V100-SXM2-16GB")[0] is None
    assert flops.mfu(156.0, 312.0) == 0.5 and flops.mfu(1.0, None) is None
