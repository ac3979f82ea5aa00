"""The `estimate` keys, added to the composed finetune config by conf/estimate.yaml (`make estimate`): listed
before `finetune` there, so every finetune key composes as for `make finetune` and unknown `estimate.*` keys fail.
Each key's range is declared as the finetune schema's are (`ampft.config.setting`) and checked by `check`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from ampft.config import ConfigError, Precision, at_least, optional, schema_fields, setting
from ampft.devices import GPUS

CHOICES = [*GPUS, "cpu"]


@dataclass
class EstimateConfig:
    # The device: a GPU of ampft.devices (h200, h100-sxm, a100-80gb, l4, t4, rtx4090, ...), or cpu
    # (this machine, its rates measured for a few seconds).
    gpu: str = setting("a100-80gb", range=(lambda x: x in CHOICES, f"a known device: one of {', '.join(CHOICES)}"))
    # Precisions estimated side by side; null: all four. The composed `precision` group is marked in the report.
    precisions: list[Precision] | None = setting(None, range=(lambda x: x is None or len(x) > 0,
                                                                "some of [fp32,tf32,fp16,bf16], or null for all four"))
    # Ranks for the DDP / ZeRO / FSDP2 columns; null: distributed.num_processes x num_machines, or 8 when that is 1.
    ranks: int | None = setting(None, range=(optional(at_least(1)), ">= 1, or null (from distributed.num_processes)"))
    # What a GPU holds beyond the step's allocated peak, assumed (docs/benchmarks/estimate.md): the CUDA context,
    # cuBLAS/cuDNN workspaces, the allocator's slack (a fraction of the peak); set from nvidia-smi / memory_reserved.
    cuda_context_gib: float = setting(0.5, range=(at_least(0), ">= 0"))
    workspace_mib: float = setting(32.0, range=(at_least(0), ">= 0"))
    allocator_overhead: float = setting(0.05, range=(at_least(0), ">= 0"))
    # Fraction of the roofline the step reaches; null: ampft.estimate.time.EFFICIENCY (calibrated on NVIDIA's
    # BERT-large A100 figures). Ignored for gpu=cpu, whose rates are measured.
    efficiency: float | None = setting(None, range=(optional(lambda x: 0 < x <= 1),
                                                    "a fraction in (0, 1], or null (calibrated)"))


ConfigStore.instance().store(name="estimate_schema", node={"estimate": EstimateConfig})


def check(e: DictConfig) -> None:
    """Every `estimate.*` value outside its range, at once."""
    problems = [f"estimate.{key}={e[key]}: must be {f.metadata['range'][1]}"
                for key, f in schema_fields(EstimateConfig).items() if not f.metadata["range"][0](e[key])]
    if problems:
        raise ConfigError(problems)
