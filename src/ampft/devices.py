"""The GPUs ampft knows (memory, bandwidth, dense peak TFLOP/s per precision, from the datasheets), the published
claims, and the CPU's features from /proc/cpuinfo. Tensor Core figures are dense ("with sparsity" halved) with fp32
accumulate; fp32 is the CUDA-core rate `precision=fp32` runs at. None: the GPU has no such path."""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Device:
    name: str
    label: str
    memory_gib: float  # what the card has (GB on datasheets are 10^9 bytes; converted)
    bandwidth_gbs: float  # GB/s, 10^9 bytes per second
    tflops: dict[str, float | None]  # dense peak per precision: fp32 (CUDA cores), tf32, fp16, bf16
    source: str
    kind: str = "cuda"  # cuda | cpu: whose autocast op lists apply


GB = 1e9 / 2**30  # GiB per datasheet GB
HOPPER = dict(fp32=67.0, tf32=494.5, fp16=989.5, bf16=989.5)
AMPERE_A100 = dict(fp32=19.5, tf32=156.0, fp16=312.0, bf16=312.0)
VOLTA_SXM2 = dict(fp32=15.7, tf32=None, fp16=125.0, bf16=None)

GPUS: dict[str, Device] = {d.name: d for d in [
    Device("h200", "NVIDIA H200 SXM 141GB", 141 * GB, 4800, HOPPER,
           "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column); nvidia.com/en-us/data-center/h200"),
    Device("h200-nvl", "NVIDIA H200 NVL 141GB", 141 * GB, 4800,
           dict(fp32=60.0, tf32=417.5, fp16=835.5, bf16=835.5),
           "NVIDIA H200 Tensor Core GPU datasheet (H200 NVL column: the PCIe card, lower clocks than the SXM part)"),
    Device("h100-sxm", "NVIDIA H100 SXM5 80GB", 80 * GB, 3350, HOPPER,
           "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column); nvidia.com/en-us/data-center/h100"),
    Device("h100-pcie", "NVIDIA H100 PCIe 80GB", 80 * GB, 2000,
           dict(fp32=51.0, tf32=378.0, fp16=756.0, bf16=756.0),
           "NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe column); nvidia.com/en-us/data-center/h100"),
    Device("a100-80gb", "NVIDIA A100 80GB", 80 * GB, 2039, AMPERE_A100,
           "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column; the PCIe card has the same peaks and "
           "1,935 GB/s); nvidia.com/en-us/data-center/a100"),
    Device("a100-40gb", "NVIDIA A100 40GB", 40 * GB, 1555, AMPERE_A100,
           "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM and PCIe columns); nvidia.com/en-us/data-center/a100"),
    Device("v100-32gb", "NVIDIA V100 SXM2 32GB", 32 * GB, 900, VOLTA_SXM2,
           "NVIDIA V100 Tensor Core GPU datasheet (V100 SXM2 column); nvidia.com/en-us/data-center/v100"),
    Device("v100-16gb", "NVIDIA V100 SXM2 16GB", 16 * GB, 900, VOLTA_SXM2,
           "NVIDIA V100 Tensor Core GPU datasheet (V100 SXM2 column); nvidia.com/en-us/data-center/v100"),
    Device("v100-pcie", "NVIDIA V100 PCIe 32GB", 32 * GB, 900, dict(fp32=14.0, tf32=None, fp16=112.0, bf16=None),
           "NVIDIA V100 Tensor Core GPU datasheet (V100 PCIe column; the 16 GB card has the same rates)"),
    Device("v100s", "NVIDIA V100S PCIe 32GB", 32 * GB, 1134, dict(fp32=16.4, tf32=None, fp16=130.0, bf16=None),
           "NVIDIA V100S Tensor Core GPU datasheet; nvidia.com/en-us/data-center/v100"),
    Device("l4", "NVIDIA L4 24GB", 24 * GB, 300, dict(fp32=30.3, tf32=60.0, fp16=121.0, bf16=121.0),
           "NVIDIA L4 Tensor Core GPU datasheet; nvidia.com/en-us/data-center/l4"),
    Device("a10g", "NVIDIA A10G 24GB", 24 * GB, 600, dict(fp32=35.0, tf32=35.0, fp16=70.0, bf16=70.0),
           "AWS EC2 G5 instance figures (the A10G has no public NVIDIA datasheet)"),
    Device("t4", "NVIDIA T4 16GB", 16 * GB, 320, dict(fp32=8.1, tf32=None, fp16=65.0, bf16=None),
           "NVIDIA T4 Tensor Core GPU datasheet (FP16 mixed precision 65 TFLOPS); nvidia.com/en-us/data-center/tesla-t4"),
    Device("rtx4090", "NVIDIA GeForce RTX 4090 24GB", 24 * GB, 1008,
           dict(fp32=82.6, tf32=82.6, fp16=165.2, bf16=165.2),
           "NVIDIA Ada Lovelace GPU architecture whitepaper, appendix table for the RTX 4090 (Tensor Core rates "
           "with FP32 accumulate, which PyTorch's autocast uses; FP16 accumulate is twice that)"),
]}

# torch.cuda.get_device_name() -> table entry, the first match wins. Not matched on purpose: H100 NVL (its datasheet
# figures changed between revisions: unknown rather than wrong), and any GPU not listed (an L40S is no L4).
CUDA_NAMES = [(r"H200.*NVL", "h200-nvl"), (r"H200", "h200"), (r"H100.*PCIe", "h100-pcie"),
              (r"H100.*(SXM|HBM3)", "h100-sxm"), (r"A100.*80", "a100-80gb"), (r"A100", "a100-40gb"),
              (r"V100S", "v100s"), (r"V100.*PCIE", "v100-pcie"), (r"V100.*16GB", "v100-16gb"), (r"V100", "v100-32gb"),
              (r"\bL4\b", "l4"), (r"A10G", "a10g"), (r"\bT4\b", "t4"), (r"4090", "rtx4090")]


def for_cuda_name(name: str) -> Device | None:
    """The table's entry for a CUDA device name, or None when ampft does not know that GPU."""
    return next((GPUS[key] for pattern, key in CUDA_NAMES if re.search(pattern, name, re.IGNORECASE)), None)


# The published claims both the benchmark (measured) and the estimate (predicted) check: NVIDIA's mixed-precision
# training guide and Hugging Face's performance docs.
TIME_CLAIM, MEMORY_CLAIM, SLACK = 0.60, 0.57, 0.10  # "about": within 10 points, or better
TENSOR_CORE_SPEEDUP = (1.5, 3.0)
NVIDIA_ANCHOR = dict(device="A100-80GB", model="bert-large", seq_len=384, batch_size=32, tf32=61.5, fp16=110.5,
                     f1_tf32=90.93, f1_fp16=90.96)
HF_ANCHOR = dict(device="V100", model="bert-large", seq_len=512, batch_size=4, speedup=2.1, memory_saving=0.07)


# The CPU features without which fp16 autocast on a CPU is many times slower than fp32, and bf16 not fast.
HALF_FLAGS = {"fp16": ("avx512_fp16", "amx_fp16"), "bf16": ("avx512_bf16", "amx_bf16")}
HALF_CPU_FLAGS = (*HALF_FLAGS["fp16"], *HALF_FLAGS["bf16"], "amx_tile")
CPU_SPEED_DOC = "docs/benchmarks/README.md#fp16-and-bf16-speed-by-kind-of-cpu"


def _cpuinfo(field: str, cpuinfo: str | None = None) -> str | None:
    """The first `field` line's value in /proc/cpuinfo (or in the given text); None where there is none."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    found = re.search(rf"^[ \t]*{re.escape(field)}[ \t]*:(.*)$", cpuinfo, re.MULTILINE)
    return found and found.group(1).strip()


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags: the first `flags` line of /proc/cpuinfo (or of the given text), else empty."""
    return set((_cpuinfo("flags", cpuinfo) or "").split())


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name (/proc/cpuinfo's `model name`), else what the platform module says."""
    return _cpuinfo("model name", cpuinfo) or platform.processor() or platform.machine()


def cpu_half_support(flags: set[str]) -> dict[str, list[str]]:
    """{"fp16": the native float16 features present, "bf16": the bfloat16 ones}; empty: no hardware path."""
    return {p: [f for f in names if f in flags] for p, names in HALF_FLAGS.items()}


def cpu_features() -> list[str]:
    """The CPU features a benchmark report lists: those that decide fp32/bf16/fp16 speed on a CPU."""
    return sorted(cpu_flags() & {"avx2", "avx512f", *HALF_CPU_FLAGS})


def cpu_fp16_note(flags: set[str]) -> str:
    """What decides fp16 (and bf16) speed on this CPU, in one sentence, from its flags."""
    have = cpu_half_support(flags)
    fp16 = (f"this CPU has {' and '.join(have['fp16'])}, so fp16 autocast runs at about fp32's speed, not faster"
            if have["fp16"] else
            "this CPU has neither AVX512-FP16 nor AMX-FP16, so fp16 autocast runs many times slower than fp32")
    slow = "either, so it is slow too" if not have["fp16"] else "and is slow"
    bf16 = (f"bf16 has {' and '.join(have['bf16'])} here, the fast CPU path" if have["bf16"] else
            f"bf16 has no AVX512-BF16/AMX-BF16 here {slow}: measure before choosing it")
    return f"{fp16}; {bf16} (measured figures per kind of CPU: {CPU_SPEED_DOC})"
