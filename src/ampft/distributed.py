"""The distributed group → Accelerate plugins, and the DeepSpeed config generated from Hydra.

The DeepSpeed config is built here from the distributed group (ZeRO stage, buckets, offload), the trainer
group (micro-batch, accumulation, clipping) and the precision group (`precision.deepspeed_section`), so
precision is never written in two places and never disagrees with the run's precision group.
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import DictConfig

from ampft.config import Backend
from ampft.precision import deepspeed_section

log = logging.getLogger(__name__)


def deepspeed_config(cfg: DictConfig) -> tuple[dict[str, Any], list[str]]:
    """(DeepSpeed config dict, caveats about keys DeepSpeed cannot honour)."""
    d, tr = cfg.distributed, cfg.trainer
    zero: dict[str, Any] = {
        "stage": d.zero_stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": d.reduce_bucket_size,
        "allgather_bucket_size": d.allgather_bucket_size,
    }
    if d.zero_stage == 3:
        zero.update(
            stage3_prefetch_bucket_size=d.stage3_prefetch_bucket_size,
            stage3_param_persistence_threshold=d.stage3_param_persistence_threshold,
            # The export consolidates the shards into one 16-bit (or fp32) state dict.
            stage3_gather_16bit_weights_on_model_save=True,
        )
    if d.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if d.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    section, caveats = deepspeed_section(cfg.precision)
    config = {
        "train_micro_batch_size_per_gpu": tr.batch_size,
        "gradient_accumulation_steps": tr.grad_accum,
        "gradient_clipping": tr.max_grad_norm,
        "zero_optimization": zero,
        **section,
        "steps_per_print": 2**31 - 1,  # ampft logs; DeepSpeed's own step prints stay off
        "wall_clock_breakdown": False,
    }
    return config, caveats


def accelerator_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """`Accelerator(...)` plugin arguments for the distributed backend (none for single and ddp)."""
    d = cfg.distributed
    if d.backend == Backend.deepspeed:
        from accelerate.utils import DeepSpeedPlugin

        config, caveats = deepspeed_config(cfg)
        for caveat in caveats:
            log.warning("DeepSpeed: %s", caveat)
        return {"deepspeed_plugin": DeepSpeedPlugin(hf_ds_config=config, zero3_save_16bit_model=d.zero_stage == 3)}
    if d.backend == Backend.fsdp:
        from accelerate.utils import FullyShardedDataParallelPlugin

        return {"fsdp_plugin": FullyShardedDataParallelPlugin(
            fsdp_version=2,
            reshard_after_forward=d.fsdp_reshard_after_forward,
            cpu_offload=d.fsdp_cpu_offload,
            auto_wrap_policy="transformer_based_wrap",
            state_dict_type="SHARDED_STATE_DICT",
            cpu_ram_efficient_loading=False,
        )}
    return {}


def check_world(accelerator) -> None:
    """Refuse a run whose ranks would each train alone: every rank must see the same world size.

    Measured with accelerate 1.15 + DeepSpeed 0.19 on a machine without GPUs: `accelerate launch
    --use_deepspeed --num_processes 2` starts a DeepSpeed world of 2, yet Accelerate sets up each rank as a
    single process (no data sharding, every rank "main"), i.e. two copies of the same run writing one folder.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() != accelerator.num_processes:
        from ampft.config import ConfigError

        raise ConfigError([
            f"the process group has {dist.get_world_size()} ranks but Accelerate runs "
            f"{accelerator.num_processes} process(es) ({accelerator.distributed_type.value} on "
            f"{accelerator.device}). On a machine without GPUs DeepSpeed can only run with nproc=1; for several "
            "CPU processes use distributed=ddp."
        ])
