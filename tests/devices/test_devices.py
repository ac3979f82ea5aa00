"""The GPU table in use: the names torch.cuda.get_device_name() reports find their card, a GPU the table does not
know gets no prediction and is named, and every card's figures give an estimate."""

from __future__ import annotations

import logging

import pytest

from ampft.devices import GPUS, for_cuda_name
from ampft.estimate import time as timing
from ampft.estimate.run import predict_arms, trace_all
from tests.helpers import compose_config

PRECISIONS = ["fp32", "tf32", "fp16", "bf16"]


# Names as torch.cuda.get_device_name() reports them on each card, and the card each one is.
@pytest.mark.parametrize("name, key", [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200-nvl"),  # the PCIe card: lower clocks than the SXM part
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100 80GB PCIe", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
    ("Tesla V100-SXM2-32GB", "v100-32gb"),
    ("Tesla V100-SXM2-16GB", "v100-16gb"),
    ("Tesla V100-PCIE-32GB", "v100-pcie"),
    ("Tesla V100S-PCIE-32GB", "v100s"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA A10G", "a10g"),
    ("Tesla T4", "t4"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
])
def test_cuda_names_find_their_card(name, key):
    assert for_cuda_name(name) is GPUS[key]


@pytest.fixture(scope="module")
def tiny():
    cfg = compose_config("estimate", ["model=tiny-bert", "precision=bf16", "trainer.batch_size=4",
                                      "task.max_length=32"])
    return cfg, trace_all(cfg, PRECISIONS, "cuda")[0]


def test_the_benchmark_prediction_is_for_the_card_it_ran_on(tiny):
    cfg, _ = tiny
    predicted = predict_arms({"bf16": cfg}, {"device_type": "cuda", "device_name": "NVIDIA A100-SXM4-80GB"})["bf16"]
    assert predicted["device"] == GPUS["a100-80gb"].label
    assert predicted["step_seconds"] > 0 and predicted["peak_bytes"] > 0


@pytest.mark.parametrize("name", ["NVIDIA L40S", "NVIDIA H100 NVL", "NVIDIA B300 SXM6 AC", "NVIDIA A10", ""])
def test_an_unknown_gpu_gets_no_prediction_and_is_named(name, caplog):
    """Not mistaken for a known card (an L40S is no L4, an A10 no A10G): no prediction rather than a wrong one."""
    with caplog.at_level(logging.WARNING):
        assert predict_arms({"bf16": None}, {"device_type": "cuda", "device_name": name}) == {}
    assert f"{name} is not in ampft.devices" in caplog.text


def test_every_card_predicts_each_precision_it_runs_against_its_own_peak(tiny):
    """A time for every precision a card runs (tf32 as fp32 where it has no TF32), none for one it lacks, and the
    MFU against the card's datasheet peak for the precision that runs."""
    _, traces = tiny
    for d in GPUS.values():
        for p in PRECISIONS:
            r = timing.predict(traces[p], p, d)
            if d.tflops[p] is None and p != "tf32":
                assert r is None, (d.name, p)
                continue
            assert r["runs_as"] == (p if d.tflops[p] else "fp32") and r["seconds"] > 0
            assert r["mfu"] == pytest.approx(r["tflops"] / d.tflops[r["runs_as"]]) and 0 < r["mfu"] < 1
