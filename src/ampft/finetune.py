"""The fine-tuning recipe: validate → build → fit → evaluate → export → summary.

`recipes/finetune.py` composes the config with Hydra and calls `run(cfg, run_dir)`; tests call it too.
"""

from __future__ import annotations

import atexit
import functools
import logging
import math
import time
from pathlib import Path
from typing import Any

import accelerate
import torch
import transformers
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import DataLoaderConfiguration, TorchDynamoPlugin, is_compiled_module, set_seed
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase, get_scheduler

from ampft import checkpointing, distributed, precision, tasks
from ampft.config import (
    ConfigError,
    OptimImplementation,
    flat,
    metric_mode,
    to_plain,
)
from ampft.data import build_dataloaders, eval_dataloader, prepare_data
from ampft.engine import Training, TrainingDiverged, TrainState, fit, weights_finite
from ampft.errors import Preempted
from ampft.models import build_model, load_tokenizer
from ampft.tracking import Tracker, format_summary, log_with, peak_memory_bytes, write_summary
from ampft.validation import validate

log = logging.getLogger(__name__)


def build_optimizer(model: torch.nn.Module, o: DictConfig, device: torch.device,
                    loss_scaling: bool = False) -> torch.optim.AdamW:
    """AdamW without weight decay on biases and LayerNorm weights.

    `auto`: fused kernels on CUDA and CPU (one kernel over all parameters; measured in
    docs/benchmarks/microbench.md#adamw-why-optimimplementationauto-is-fused-on-cpu-too), foreach elsewhere and under fp16 loss scaling: a fused step takes the
    scaler's inf flag inside the kernel instead of being skipped, and the skipped-step accounting (step
    counter, scheduler, telemetry) needs the skip to show."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name.lower() else decay).append(p)
    groups = [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    impl = o.implementation
    if impl == OptimImplementation.auto:
        fused = device.type in ("cuda", "cpu") and not loss_scaling
        impl = OptimImplementation.fused if fused else OptimImplementation.foreach
    flags = {"fused": impl == OptimImplementation.fused, "foreach": impl == OptimImplementation.foreach}
    return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), eps=o.eps, **flags)


def raise_recompile_limit(dynamo_config, limit: int) -> None:
    """At least `limit` compiled variants per function: `recompile_limit`, called `cache_size_limit` before
    torch 2.6 (pyproject allows torch >= 2.4)."""
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    setattr(dynamo_config, name, max(getattr(dynamo_config, name), limit))


def make_accelerator(cfg: DictConfig, run_dir: Path) -> Accelerator:
    tr = cfg.trainer
    if tr.compile:  # static shapes per padded length bucket; room for train and eval variants of each
        raise_recompile_limit(torch._dynamo.config, 4 * (tr.compile_buckets + 1))
    distributed.prepare_environment(cfg, run_dir)
    kwargs = precision.accelerator_kwargs(cfg.precision)
    for key, value in distributed.accelerator_kwargs(cfg).items():  # kwargs_handlers from both
        kwargs[key] = kwargs.get(key, []) + value if key == "kwargs_handlers" else value
    accelerator = Accelerator(
        **kwargs,
        gradient_accumulation_steps=cfg.trainer.grad_accum,
        cpu=cfg.trainer.cpu or distributed.cpu_world(cfg),
        log_with=log_with(cfg.logging.name.value),
        project_dir=str(run_dir),
        # We step the scheduler ourselves, once per applied update (not on skipped fp16 steps).
        step_scheduler_with_optimizer=False,
        # non_blocking: host-to-GPU copies of pinned batches overlap compute (a no-op on CPU).
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, non_blocking=True),
        dynamo_plugin=TorchDynamoPlugin(backend="inductor" if tr.compile else "no", dynamic=False),
    )
    distributed.fsdp_on_cpu(accelerator, kwargs.get("fsdp_plugin"))
    return accelerator


def run(cfg: DictConfig, run_dir: Path, started: float | None = None) -> dict[str, Any]:
    """One fine-tuning run; callable repeatedly in one process (Hydra multirun, tests)."""
    started = time.perf_counter() if started is None else started
    run_dir = Path(run_dir)
    tasks.check_installed(cfg.task.metrics)  # a missing optional library is said now, not after training
    if torch.cuda.is_available():  # this run's peak, not an earlier run's in the same process (multirun)
        torch.cuda.reset_peak_memory_stats()
    try:
        training, tokenizer, ran_precision = build(cfg, run_dir)
        end_process_group_at_exit()
        setup_seconds = time.perf_counter() - started  # to the first training step: model, data, cache
        try:
            fit(training)
        except Preempted as exc:  # for job scripts: launchers do not pass exit code 75 on, the marker says it
            if training.accelerator.is_main_process:
                (run_dir / Preempted.marker).write_text(f"{exc}\n")
            raise
        training.tracker.close()
        summary = summarize(training, ran_precision, started, setup_seconds)
        if cfg.checkpoint.export:  # checkpoint.export_best: the best checkpoint's weights replace the last ones
            ck = cfg.checkpoint
            mode = metric_mode(ck.metric or cfg.task.main_metric, ck.mode)
            best = checkpointing.restore_best(training.accelerator, run_dir, mode) if ck.export_best else None
            export_model(training, tokenizer, summary, best)
        if training.accelerator.is_main_process:
            write_summary(run_dir, summary)
            print(format_summary(summary), flush=True)
        return summary
    finally:
        reset_accelerate()


@functools.cache
def end_process_group_at_exit() -> None:
    """The process group outlives each run (the export, the summary and their barriers need it, and multirun
    jobs in one process share it); it is destroyed once, when the process exits."""
    def end() -> None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    atexit.register(end)


def reset_accelerate() -> None:
    """Accelerate keeps its settings in process-wide singletons; the next run may ask for another
    precision. The process group (PartialState) stays."""
    AcceleratorState._reset_state()
    GradientState._reset_state()


def build(cfg: DictConfig, run_dir: Path) -> tuple[Training, PreTrainedTokenizerBase, str]:
    """Everything the loop needs, after validation; resumed from a checkpoint if asked."""
    for warning in validate(cfg):
        log.warning(warning)
    # Before anything is written, on every rank (they see the same folder): resume target and run dir.
    resume = checkpointing.resolve_resume(run_dir, cfg.checkpoint.resume)
    if resume is not None:
        checkpointing.check_config(resume, to_plain(cfg), cfg.checkpoint.allow_config_change)
    check_run_dir(run_dir, cfg, resume)
    set_seed(cfg.trainer.seed)
    accelerator = make_accelerator(cfg, run_dir)
    distributed.check_world(accelerator)
    ran_precision = precision.setup(accelerator, cfg.precision)
    accelerator.wait_for_everyone()  # every rank has checked the run dir before the main process writes
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(to_plain(cfg)))
    log.info("run dir: %s | precision: %s | device: %s x%d", run_dir, ran_precision, accelerator.device,
             accelerator.num_processes)

    family = tasks.family_for(cfg.task.family)  # the one task family object, passed on from here
    tokenizer = family.adapt_tokenizer(load_tokenizer(cfg.model))
    if accelerator.is_main_process:  # checkpoints of this run can then be evaluated on their own
        tokenizer.save_pretrained(run_dir / "tokenizer")
    data = prepare_data(cfg, family, tokenizer, accelerator.main_process_first)
    with distributed.whole_model_init(accelerator):
        model = build_model(cfg.model, tokenizer, data.labels, family, cfg.precision.name, accelerator.device)
    distributed.set_fsdp_layers(accelerator, model)
    optimizer = build_optimizer(model, cfg.optim, accelerator.device, loss_scaling=accelerator.scaler is not None)
    train_dl, eval_dl = build_dataloaders(cfg, data, tokenizer, accelerator.device, model=model,
                                          num_processes=accelerator.num_processes)
    extra_dls = [eval_dataloader(cfg, data, ds, tokenizer, accelerator.device, model) for ds in data.extra.values()]
    model, optimizer, train_dl, eval_dl, *extra_dls = accelerator.prepare(model, optimizer, train_dl, eval_dl,
                                                                          *extra_dls)
    eval_dls = dict(zip(["validation", *data.extra], [eval_dl, *extra_dls], strict=True))

    tr = cfg.trainer
    steps_per_epoch = math.ceil(len(train_dl) / tr.grad_accum)
    max_steps = tr.max_steps if tr.max_steps > 0 else math.ceil(tr.epochs * steps_per_epoch)
    s = cfg.scheduler
    warmup = s.warmup_steps if s.warmup_steps > 0 else math.ceil(s.warmup_ratio * max_steps)
    scheduler = get_scheduler(s.name.value, optimizer, num_warmup_steps=warmup, num_training_steps=max_steps)
    scheduler = accelerator.prepare(scheduler)
    state = TrainState()  # checkpointed as JSON by checkpointing.save, not registered with Accelerate

    if resume is not None:
        state.load_state_dict(checkpointing.load(accelerator, resume, scheduler))
        log.info("resumed from %s at step %d (epoch %d, batch %d)", resume, state.step, state.epoch,
                 state.batch_in_epoch)

    tracker = Tracker(accelerator, run_dir, cfg.logging.name.value, cfg.logging.project,
                      flat(to_plain(cfg)), max_steps, tr.progress_bar, history_until=state.step)
    # Under torch.compile, evaluation runs the eager module: the compiled graphs are the training step's
    # (eval mode would compile a second set for a few hundred batches).
    eval_model = model._orig_mod if is_compiled_module(model) else model
    training = Training(
        accelerator=accelerator, model=model, optimizer=optimizer, scheduler=scheduler, train_dl=train_dl,
        evaluate=lambda: tasks.evaluate(accelerator, eval_model, data, eval_dls, cfg.task, run_dir),
        tracker=tracker, cfg=cfg, family=family, run_dir=run_dir, max_steps=max_steps, state=state, resumed_from=resume,
    )
    log.info("training: %d optimizer steps (%d per epoch), batch %d x %d processes x %d accumulation",
             max_steps, steps_per_epoch, tr.batch_size, accelerator.num_processes, tr.grad_accum)
    return training, tokenizer, ran_precision


# What a run leaves in its run dir (Hydra's own .hydra/ and <job>.log aside).
RUN_ARTIFACTS = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoints", "model", "tokenizer")


def check_run_dir(run_dir: Path, cfg: DictConfig, resume: Path | None) -> None:
    """A new run never mixes with a previous one in the same folder, unless asked to."""
    found = [n for n in RUN_ARTIFACTS if (run_dir / n).exists()]
    if cfg.checkpoint.resume == "latest" and resume is None:
        log.warning("checkpoint.resume=latest: no checkpoint in %s, so this run STARTS AFRESH from step 0%s",
                    run_dir, "" if found else " (a new run dir: to resume an earlier run, pass hydra.run.dir=<its "
                                               "run dir>)")
    if found and resume is None and not cfg.checkpoint.reuse_run_dir:
        none = " and checkpoint.resume=latest found no checkpoint of it that verifies (see the warnings above)" \
            if cfg.checkpoint.resume == "latest" else ""
        raise ConfigError([
            f"hydra.run.dir={run_dir} holds a previous run ({', '.join(found)}){none}; a new run there would mix "
            "with it. Either resume it (checkpoint.resume=latest, or checkpoint.resume=<a checkpoint>), or start "
            "over in it with checkpoint.reuse_run_dir=true (its checkpoints are rotated out as new ones come, "
            "its metrics history moves to metrics.replaced.jsonl); or leave hydra.run.dir unset for a new folder"])


def summarize(training: Training, ran_precision: str, started: float,
              setup_seconds: float | None = None) -> dict[str, Any]:
    """The run's summary (summary.json): what ran, the final evaluation, counters, throughput, memory."""
    cfg, run_dir, accelerator, model, state = (training.cfg, training.run_dir, training.accelerator, training.model,
                                               training.state)
    family = training.family
    peak, peak_kind = peak_memory_bytes(accelerator.device)
    summary = dict(
        run_dir=str(run_dir),
        model=cfg.model.name,
        task=cfg.task.name,
        task_family=cfg.task.family,
        precision=ran_precision,
        precision_requested=cfg.precision.name.value,
        # DeepSpeed: "autocast" (fp32 weights and gradients, as elsewhere) or "half" (16-bit weights and gradients).
        deepspeed_precision=(precision.deepspeed_mode(cfg.precision, cfg.distributed.deepspeed_precision)
                             if accelerator.distributed_type.value == "DEEPSPEED" else None),
        eval={k: v for k, v in state.eval_results.items() if k != "samples"},
        eval_samples=state.eval_results["samples"],
        main_metric=cfg.task.main_metric,
        positive_label=_positive_label(cfg, family, accelerator.unwrap_model(model)),
        train_loss=state.loss_sum / max(state.loss_batches, 1),
        train_loss_last=state.last_loss,
        train_samples_per_second=state.samples / max(state.train_seconds, 1e-9),
        train_tokens_per_second=state.tokens / max(state.train_seconds, 1e-9),
        train_samples=state.samples,
        train_tokens=state.tokens,
        peak_memory_bytes=peak,
        peak_memory_kind=peak_kind,
        wall_seconds=time.perf_counter() - started,
        setup_seconds=setup_seconds,
        train_seconds=state.train_seconds,
        steps=state.step,
        skipped_steps=state.skipped,
        loss_scale_final=state.loss_scale,
        epochs=state.epoch + state.batch_in_epoch / len(training.train_dl),
        attn_implementation=accelerator.unwrap_model(model).config._attn_implementation,
        compiled=bool(cfg.trainer.compile),
        gradient_checkpointing=bool(cfg.model.gradient_checkpointing),
        early_stopping=_early_stopping(cfg, state),
        num_processes=accelerator.num_processes,
        distributed_type=accelerator.distributed_type.value,
        device=str(accelerator.device),
        device_name=_device_name(accelerator.device),
        export_dir=None,
        exported=None,
        command=_command(run_dir),
        versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                      accelerate=accelerate.__version__),
    )
    return summary


def export_model(training: Training, tokenizer: PreTrainedTokenizerBase, summary: dict[str, Any],
                 best: Path | None) -> None:
    """The model's weights as they are now (the last, or `best`'s once restored) into <run dir>/model with a
    model card; the summary says which."""
    accelerator, model, run_dir = training.accelerator, training.model, training.run_dir
    summary["exported"] = f"last (step {training.state.step})"
    if best is not None:
        m = checkpointing.manifest(best)["metric"]
        summary["exported"] = f"best: {best.name} ({m['name']}={m['value']:.4g})"
    if not weights_finite(model, accelerator):
        raise TrainingDiverged("the final weights are not finite: not exporting them")
    summary["export_dir"] = str(run_dir / "model")
    checkpointing.export(accelerator, model, tokenizer, run_dir / "model", to_plain(training.cfg),
                         model_card(summary, training.family))


def _early_stopping(cfg: DictConfig, st: TrainState) -> dict[str, Any] | None:
    """trainer.early_stopping_patience's record: whether and where it stopped training, and the best evaluation."""
    patience = cfg.trainer.early_stopping_patience
    if not patience:
        return None
    metric = cfg.checkpoint.metric or cfg.task.main_metric
    return dict(patience=patience, metric=metric, mode=metric_mode(metric, cfg.checkpoint.mode),
                stopped=st.stopped_early_at is not None, stopped_step=st.stopped_early_at, best_step=st.best_step,
                best_value=None if st.best_eval is None else st.best_eval[metric],
                evaluations_without_improvement=st.evals_since_best)


def _positive_label(cfg: DictConfig, family: tasks.Family, model) -> str | None:
    """The class binary F1 scored (two-label classification), from the labels the model was trained with."""
    return family.positive_label(cfg.task, family.labels_from_model(model.config))


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return precision.cpu_name()


def _command(run_dir: Path) -> str | None:
    """The command that produced the run, from Hydra's record of the overrides."""
    overrides = run_dir / ".hydra" / "overrides.yaml"
    if not overrides.is_file():
        return None
    args = [a for a in OmegaConf.load(overrides) if not str(a).startswith("hydra.")]
    return " ".join(["python recipes/finetune.py", *map(str, args)])


def model_card(s: dict[str, Any], family: tasks.Family) -> str:
    metrics = "\n".join(f"| {k} | {v:.4f} |" for k, v in s["eval"].items())
    pipeline_tag, auto = family.pipeline_tag, family.model_class.__name__
    return f"""---
library_name: transformers
pipeline_tag: {pipeline_tag}
tags: [ampft]
---

# {s["model"]} fine-tuned on {s["task"]}

Fine-tuned with [ampft](https://github.com/) in **{s["precision"]}** precision for {s["steps"]} optimizer
steps ({s["epochs"]:.2f} epochs); exported weights: {s["exported"]}.

| validation metric | value |
|---|---|
{metrics}

- train loss (mean over the run): {s["train_loss"]:.4f}
- throughput: {s["train_samples_per_second"]:.1f} samples/s, {s["train_tokens_per_second"]:.0f} tokens/s \
  (non-padding) on {s["num_processes"]} x {s["device_name"]} ({s["device"]})
- fp16 steps skipped for overflow: {s["skipped_steps"]}
- versions: {", ".join(f"{k} {v}" for k, v in s["versions"].items())}

Command:

```
{s["command"] or "(not recorded: run outside the recipe)"}
```

```python
from transformers import {auto}, AutoTokenizer, pipeline
model = {auto}.from_pretrained("path/to/this/folder")
tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")
predict = pipeline("{pipeline_tag}", model=model, tokenizer=tokenizer)
```
"""
