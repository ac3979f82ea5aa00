"""The time model: the device choices, the roofline picks the right peak, the calibration."""

from __future__ import annotations

import pytest

from ampft.devices import GPUS
from ampft.estimate import time as timing
from ampft.estimate.run import trace_all
from tests.helpers import compose_config


def test_this_cpu_is_measured():
    cpu = timing.measure_cpu()
    assert cpu.kind == "cpu" and cpu.tflops["fp32"] > 0 and cpu.bandwidth_gbs > 0 and cpu.memory_gib > 1
    assert cpu.tflops["tf32"] == cpu.tflops["fp32"]  # no TF32 on a CPU


def test_a_matmul_runs_at_the_peak_of_its_dtype_and_precision():
    a100 = GPUS["a100-80gb"]
    flops, moved = int(1e12), 1000
    assert timing.op_seconds(flops, moved, "float32", "fp32", a100) == pytest.approx(1 / 19.5)
    assert timing.op_seconds(flops, moved, "float32", "tf32", a100) == pytest.approx(1 / 156)
    assert timing.op_seconds(flops, moved, "bfloat16", "bf16", a100) == pytest.approx(1 / 312)
    # No FLOPs: bound by memory bandwidth.
    assert timing.op_seconds(0, int(2039e9), "float32", "fp32", a100) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def base_traces():
    cfg = compose_config("estimate", ["model=tiny-bert", "trainer.batch_size=16", "task.max_length=128"])
    return trace_all(cfg, ["fp32", "tf32", "bf16"], "cuda")[0]


def test_tensor_cores_make_steps_faster_and_v100_has_no_bf16(base_traces):
    a100 = GPUS["a100-80gb"]
    t = {p: timing.predict(base_traces[p], p, a100)["seconds"] for p in ("fp32", "tf32", "bf16")}
    assert t["bf16"] < t["tf32"] < t["fp32"]
    assert timing.predict(base_traces["bf16"], "bf16", GPUS["v100-32gb"]) is None
    r = timing.predict(base_traces["bf16"], "bf16", a100)
    assert r["efficiency"] == timing.EFFICIENCY and 0 < r["mfu"] < 1
    assert r["samples_per_second"] == pytest.approx(16 / r["seconds"])


def test_flops_match_flop_counter_mode_and_the_textbook_count():
    """The per-op FLOPs equal FlopCounterMode's total (with CPU's flash attention kernels added), and 6N + 12 L s h
    per token (the benchmark's formula, ampft.benchmark.flops) to within the embedding-gradient and pooler terms."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from ampft.benchmark.flops import training_flops_per_token
    from ampft.estimate.trace import EXTRA_FLOPS, fake_batch, fake_mode, trace_step
    from ampft.tasks import family_for

    mode = fake_mode()
    config = AutoConfig.for_model("bert", hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=512, vocab_size=1000, num_labels=2)
    with mode:
        model = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa")
        batch = fake_batch(family_for("classification"), 4, 256, 1000)
    with mode, FlopCounterMode(display=False, custom_mapping=EXTRA_FLOPS) as counter:
        tr = trace_step(model, batch, "fp32", "cuda")
    assert tr.forward_backward.flops == counter.get_total_flops()
    nonembedding = sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)
    textbook = training_flops_per_token(nonembedding, 2, 256, 128) * 4 * 256
    assert tr.forward_backward.flops == pytest.approx(textbook, rel=0.05)


@pytest.mark.slow
def test_calibration_constant_is_current():
    """EFFICIENCY is what the calibration computes from NVIDIA's two A100 points with this tree (BERT-large traced)."""
    from scripts.validate_estimate import calibration

    c = calibration()
    assert c["efficiency"] == pytest.approx(timing.EFFICIENCY, rel=0.02)
    assert c["model_speedup"] == pytest.approx(timing.CALIBRATION["model_speedup"], rel=0.02)


def test_the_estimate_does_not_import_the_benchmark():
    """The benchmark builds on the estimate (its predicted rows), never the other way round."""
    import subprocess
    import sys

    code = "import sys, ampft.estimate.run, ampft.estimate.report; print('ampft.benchmark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
