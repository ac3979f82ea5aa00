"""The distributed group → Accelerate plugins, and the DeepSpeed config generated from the distributed, trainer
and precision groups (so its precision can never disagree with the run's precision group)."""

from __future__ import annotations

import atexit
import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from accelerate.state import PartialState
from accelerate.utils import (
    DeepSpeedPlugin,
    DistributedType,
    FullyShardedDataParallelPlugin,
    InitProcessGroupKwargs,
)
from omegaconf import DictConfig

from ampft.config import Backend, ConfigError
from ampft.precision import deepspeed_section

log = logging.getLogger(__name__)


@atexit.register
def end_process_group() -> None:
    """The process group outlives each run (export barriers, multirun jobs): destroyed once, at exit, by every
    recipe that starts one. A gloo rank that exits without it can abort in its worker threads' teardown
    ("terminate called without an active exception", SIGABRT) while the interpreter finalizes."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def deepspeed_config(cfg: DictConfig) -> tuple[dict[str, Any], list[str]]:
    """(DeepSpeed config dict, caveats about keys DeepSpeed cannot honour)."""
    d, tr = cfg.distributed, cfg.trainer
    zero: dict[str, Any] = dict(stage=d.zero_stage, overlap_comm=True, contiguous_gradients=True,
                                reduce_bucket_size=d.reduce_bucket_size, allgather_bucket_size=d.allgather_bucket_size)
    if d.zero_stage == 3:  # the export consolidates the shards into one 16-bit (or fp32) state dict
        zero.update(stage3_prefetch_bucket_size=d.stage3_prefetch_bucket_size,
                    stage3_param_persistence_threshold=d.stage3_param_persistence_threshold,
                    stage3_gather_16bit_weights_on_model_save=True)
    for part in ("optimizer", "param"):
        if d[f"offload_{part}"]:
            zero[f"offload_{part}"] = {"device": "cpu", "pin_memory": True}
    section, caveats = deepspeed_section(cfg.precision, d.deepspeed_precision)
    config = dict(train_micro_batch_size_per_gpu=tr.batch_size, gradient_accumulation_steps=tr.grad_accum,
                  gradient_clipping=tr.max_grad_norm, zero_optimization=zero, **section,
                  steps_per_print=2**31 - 1,  # ampft logs; DeepSpeed's own step prints stay off
                  wall_clock_breakdown=False)
    return config, caveats


def _deepspeed(cfg: DictConfig) -> bool:
    """DeepSpeed asked for by the config, or by the launcher (`accelerate launch --use_deepspeed`)."""
    return cfg.distributed.backend == Backend.deepspeed or os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true"


def cpu_world(cfg: DictConfig) -> bool:
    """Several launched ranks on a machine without GPUs: they train as one gloo world (MULTI_CPU, FSDP2 on top
    for distributed=fsdp), where Accelerate would make each a lone process. DeepSpeed gets its world apart."""
    return not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1 and not _deepspeed(cfg)


def accelerator_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """`Accelerator(...)` plugin arguments for the distributed backend (none for single and ddp)."""
    d = cfg.distributed
    kwargs: dict[str, Any] = {}
    if d.backend == Backend.deepspeed:
        config, caveats = deepspeed_config(cfg)
        for caveat in caveats:
            log.warning("DeepSpeed: %s", caveat)
        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=config, zero3_save_16bit_model=d.zero_stage == 3)
    if _deepspeed(cfg) and not torch.cuda.is_available():
        # Accelerate picks no process-group backend for DeepSpeed without GPUs, so every rank would run
        # alone; gloo gives DeepSpeed (its CPU accelerator, without oneCCL) a real world.
        kwargs["kwargs_handlers"] = [InitProcessGroupKwargs(backend="gloo")]
    if d.backend == Backend.fsdp:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            # fp16/bf16 mean autocast here as on every backend: fp32 weights, all-gathers and gradient reductions
            # (Accelerate's default bf16 policy would cast the weights, LayerNorm included).
            mixed_precision_policy=MixedPrecisionPolicy(),
            reshard_after_forward=d.fsdp_reshard_after_forward,
            cpu_offload=d.fsdp_cpu_offload,
            auto_wrap_policy="transformer_based_wrap",
            state_dict_type="SHARDED_STATE_DICT",
            cpu_ram_efficient_loading=False,
            # Activation checkpointing is model.gradient_checkpointing's, never the plugin's: Accelerate's wrapper
            # recomputes without restoring the RNG (other dropout masks). `launcher_checkpointing_problem`
            # refuses FSDP_ACTIVATION_CHECKPOINTING, which False here would ignore.
            activation_checkpointing=False,
        )
    return kwargs


def launcher_checkpointing_problem() -> str | None:
    """Accelerate told to checkpoint activations itself (FSDP_ACTIVATION_CHECKPOINTING, from its flag or config
    file), which ampft's FSDP plugin would silently not do: the refusal names the switch that does."""
    told = os.environ.get("FSDP_ACTIVATION_CHECKPOINTING", "false").strip().lower()
    if told not in ("1", "true", "yes", "on"):
        return None
    return ("Accelerate was told fsdp_activation_checkpointing=true (accelerate launch "
            "--fsdp_activation_checkpointing, its config file, or FSDP_ACTIVATION_CHECKPOINTING): in ampft activation "
            "checkpointing is one switch for every backend, model.gradient_checkpointing=true (it replays the dropout "
            "masks; Accelerate's FSDP wrapper does not). Drop the launcher's setting and pass "
            "model.gradient_checkpointing=true")


def fsdp_on_cpu(accelerator, plugin) -> None:
    """Run FSDP2 on CPU ranks through Accelerate's own FSDP path: Accelerate 1.15 takes an FSDP plugin only for
    GPU-like worlds (on CPU ranks it silently runs DDP), but `fully_shard` runs on gloo, so ampft finishes the
    set-up Accelerate skipped (the FSDP type, the plugin, its mixed-precision policy)."""
    state = accelerator.state
    if plugin is None or state.distributed_type != DistributedType.MULTI_CPU:
        return
    if state.mixed_precision != "no":
        plugin.set_mixed_precision(state.mixed_precision)
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP  # as AcceleratorState does


def transformer_layer_class(model: torch.nn.Module) -> str:
    """The class name of the model's transformer block (BertLayer, ...): the element type of its largest
    ModuleList of identical modules. Not `_no_split_modules`, which for BERT also names the embeddings."""
    lists = [m for m in model.modules()
             if isinstance(m, torch.nn.ModuleList) and len(m) and len({type(x) for x in m}) == 1]
    if not lists:
        raise ValueError(f"{type(model).__name__} has no list of repeated layers for FSDP to wrap")
    return type(max(lists, key=lambda m: sum(p.numel() for p in m.parameters()))[0]).__name__


def set_fsdp_layers(accelerator, model: torch.nn.Module) -> None:
    """FSDP: wrap this model's transformer layer class (chosen per model, before `prepare`)."""
    if accelerator.distributed_type == DistributedType.FSDP:
        plugin = accelerator.state.fsdp_plugin
        plugin.transformer_cls_names_to_wrap = [transformer_layer_class(model)]
        log.info("FSDP: sharding each %s, then the root", plugin.transformer_cls_names_to_wrap[0])


@contextmanager
def whole_model_init(accelerator):
    """Build the model whole on every rank, so that one seed gives the same initial weights on every backend
    (transformers would build ZeRO-3 models under `deepspeed.zero.Init`, initialised differently); ZeRO-3
    partitions it in `prepare`."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        yield
        return
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        plugin.set_deepspeed_weakref()


def quiet_deepspeed() -> None:
    """An installed DeepSpeed, imported by accelerate or transformers, warns "Setting accelerator to CPU" on
    machines without a GPU: say CPU up front (DS_ACCELERATOR), unless the user set it."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


def prepare_environment(cfg: DictConfig, run_dir: Path) -> None:
    """Each DeepSpeed run JIT-builds its ops in its own folder unless TORCH_EXTENSIONS_DIR is set: in the shared
    default, a lock left by a killed build hangs every later run."""
    quiet_deepspeed()
    if cfg.distributed.backend == Backend.deepspeed:
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(run_dir).resolve() / "torch_extensions"))


@contextmanager
def main_process_first(accelerator):
    """Accelerate's `main_process_first` (the main process runs the block, say reading and caching the data, then
    the others), ending every rank when the block fails on the main process: it reports its error, the others exit
    with its code without a word (they would wait at a barrier it never reaches and end in a traceback of the lost
    connection, or hang)."""
    if accelerator.num_processes == 1:
        yield
        return
    code = [0]
    if accelerator.is_main_process:
        try:
            yield
        except BaseException as exc:
            code = [getattr(exc, "exit_code", 1)]
            raise
        finally:
            torch.distributed.broadcast_object_list(code, src=0)
    else:
        torch.distributed.broadcast_object_list(code, src=0)
        if code[0]:  # the launcher stops this rank once the main process has reported and exited (an exit now
            time.sleep(60)  # could make it stop the main process before its report)
            raise SystemExit(code[0])
        yield


def check_world(accelerator) -> None:
    """Refuse a run whose ranks would each train alone: every rank must see the launcher's world size."""
    dist = torch.distributed
    joined = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if joined else int(os.environ.get("WORLD_SIZE", 1))
    if world != accelerator.num_processes:
        raise ConfigError([
            f"the launcher started {world} ranks but Accelerate set up {accelerator.num_processes} process(es) "
            f"({accelerator.distributed_type.value} on {accelerator.device}): each rank would train alone. "
            "Launch with `make finetune distributed=ddp nproc=N` (or distributed=deepspeed-z2, fsdp, ...), "
            "which picks the launcher settings for this machine."
        ])
