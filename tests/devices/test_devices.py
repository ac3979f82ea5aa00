"""The GPU table: every entry complete, and the names torch.cuda.get_device_name() reports matched to the right card."""

from __future__ import annotations

import pytest

from ampft.devices import GPUS, for_cuda_name


def test_every_gpu_has_memory_bandwidth_peaks_and_a_source():
    for d in GPUS.values():
        assert d.kind == "cuda" and d.memory_gib > 10 and d.bandwidth_gbs > 100 and d.source
        assert set(d.tflops) == {"fp32", "tf32", "fp16", "bf16"} and d.tflops["fp32"] and d.tflops["fp16"]
        # Tensor Cores (where the GPU has them) are never slower than its CUDA cores.
        assert all(d.tflops[p] is None or d.tflops[p] >= d.tflops["fp32"] for p in ("tf32", "fp16", "bf16"))


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


@pytest.mark.parametrize("name", ["NVIDIA L40S", "NVIDIA H100 NVL", "NVIDIA B300 SXM6 AC", "NVIDIA A10", ""])
def test_unknown_gpus_are_not_mistaken_for_known_ones(name):
    assert for_cuda_name(name) is None
