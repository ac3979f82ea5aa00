"""The `estimate` keys, added to the composed finetune config by conf/estimate.yaml (`make estimate`): listed
before `finetune` there, so every finetune key composes as for `make finetune` and unknown `estimate.*` keys fail.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from ampft.config import ConfigError, Precision
from ampft.estimate.gpus import CHOICES


@dataclass
class EstimateConfig:
    # The device: a GPU of ampft.devices (h200, h100-sxm, a100-80gb, l4, t4, rtx4090, ...), or cpu
    # (this machine, its rates measured for a few seconds).
    gpu: str = "a100-80gb"
    # Precisions estimated side by side; null: all four. The composed `precision` group is marked in the report.
    precisions: list[Precision] | None = None
    # Ranks for the DDP / ZeRO / FSDP2 columns; null: distributed.num_processes x num_machines, or 8 when that is 1.
    ranks: int | None = None
    # What a GPU holds beyond the step's allocated peak, assumed (docs/benchmarks/estimate.md): the CUDA context,
    # cuBLAS/cuDNN workspaces, the allocator's slack (a fraction of the peak); set from nvidia-smi / memory_reserved.
    cuda_context_gib: float = 0.5
    workspace_mib: float = 32.0
    allocator_overhead: float = 0.05
    # Fraction of the roofline the step reaches; null: ampft.estimate.time.EFFICIENCY (calibrated on NVIDIA's
    # BERT-large A100 figures). Ignored for gpu=cpu, whose rates are measured.
    efficiency: float | None = None


ConfigStore.instance().store(name="estimate_schema", node={"estimate": EstimateConfig})


class EstimateConfigError(ConfigError):
    what = "the estimate config"


def check(e: DictConfig) -> None:
    """Every bad `estimate.*` value at once."""
    problems = [msg for bad, msg in (
        (e.gpu not in CHOICES, f"estimate.gpu={e.gpu}: not a known device; choose one of {', '.join(CHOICES)}"),
        (e.precisions is not None and not e.precisions,
         "estimate.precisions is empty: give some of [fp32,tf32,fp16,bf16], or null for all four"),
        (e.ranks is not None and e.ranks < 1,
         f"estimate.ranks={e.ranks}: must be >= 1, or null (from distributed.num_processes)"),
        *((not e[k] >= 0, f"estimate.{k}={e[k]}: must be >= 0")
          for k in ("cuda_context_gib", "workspace_mib", "allocator_overhead")),
        (e.efficiency is not None and not 0 < e.efficiency <= 1,
         f"estimate.efficiency={e.efficiency}: a fraction in (0, 1], or null (calibrated)"),
    ) if bad]
    if problems:
        raise EstimateConfigError(problems)
