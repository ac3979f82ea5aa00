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


# Names as torch reports them on each card.
@pytest.mark.parametrize("name, key, bf16", [
    ("NVIDIA H200", "h200", 989.5),
    ("NVIDIA H200 NVL", "h200-nvl", 835.5),  # the PCIe card: lower clocks than the SXM part
    ("NVIDIA H100 80GB HBM3", "h100-sxm", 989.5),
    ("NVIDIA H100 PCIe", "h100-pcie", 756.0),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb", 312.0),
    ("NVIDIA A100 80GB PCIe", "a100-80gb", 312.0),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb", 312.0),
    ("NVIDIA A100-PCIE-40GB", "a100-40gb", 312.0),
    ("Tesla V100-SXM2-32GB", "v100-32gb", None),
    ("Tesla V100-SXM2-16GB", "v100-16gb", None),
    ("Tesla V100-PCIE-32GB", "v100-pcie", None),
    ("Tesla V100S-PCIE-32GB", "v100s", None),
    ("NVIDIA L4", "l4", 121.0),
    ("NVIDIA A10G", "a10g", 70.0),
    ("Tesla T4", "t4", None),
    ("NVIDIA GeForce RTX 4090", "rtx4090", 165.2),
])
def test_cuda_names_find_their_card(name, key, bf16):
    device = for_cuda_name(name)
    assert device is GPUS[key] and device.tflops["bf16"] == bf16


@pytest.mark.parametrize("name", ["NVIDIA L40S", "NVIDIA H100 NVL", "NVIDIA B300 SXM6 AC", "NVIDIA A10", ""])
def test_unknown_gpus_are_not_mistaken_for_known_ones(name):
    assert for_cuda_name(name) is None
