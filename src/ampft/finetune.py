"""The fine-tuning recipe: validate → build → fit → evaluate → export → summary.

`recipes/finetune.py` composes the config with Hydra and calls `run(cfg, run_dir)`; tests call it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import shlex
import socket
import time
import uuid
from pathlib import Path
from typing import Any

import accelerate
import torch
import transformers
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import DataLoaderConfiguration, TorchDynamoPlugin, broadcast_object_list, set_seed
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedTokenizerBase, get_scheduler

from ampft import checkpointing, distributed, precision, tasks
from ampft.config import ConfigError, OptimImplementation, flat, metric_mode, process_start, to_plain
from ampft.data import build_dataloaders, eval_dataloader, prepare_data
from ampft.data.load import extra_split_names
from ampft.devices import cpu_name
from ampft.engine import Training, TrainState, fit
from ampft.errors import Preempted
from ampft.models import build_model, load_tokenizer
from ampft.tracking import Tracker, format_summary, log_with, peak_memory_bytes, write_summary
from ampft.validation import validate

log = logging.getLogger(__name__)


def build_optimizer(model: torch.nn.Module, o: DictConfig, device: torch.device,
                    loss_scaling: bool = False) -> torch.optim.AdamW:
    """AdamW without weight decay on biases and LayerNorm weights. `auto`: fused on CUDA and CPU (docs/benchmarks/
    microbench.md), else foreach, and foreach under fp16 loss scaling (a fused step would not show its skip)."""
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
    """At least `limit` compiled variants per function (`cache_size_limit` before torch 2.6)."""
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
        gradient_accumulation_steps=tr.grad_accum,
        cpu=tr.cpu or distributed.cpu_world(cfg),
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


def run(cfg: DictConfig, run_dir: Path, started: float | None = None, validated: bool = False) -> dict[str, Any]:
    """One fine-tuning run; callable repeatedly in one process. `validated`: by `ampft.launch` already."""
    started = time.perf_counter() if started is None else started
    run_dir = Path(run_dir)
    tasks.check_installed(cfg.task.metrics)  # a missing optional library is said now, not after training
    if torch.cuda.is_available():  # this run's peak, not an earlier run's in the same process (multirun)
        torch.cuda.reset_peak_memory_stats()
    held = contextlib.ExitStack()  # the run dir's lock, released when the run ends however it ends
    try:
        training, tokenizer, ran_precision = build(cfg, run_dir, held, validated)
        held.callback(training.tracker.bar.close)  # however the run ends: an error line never shares the bar's
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
            best = (checkpointing.restore_best(training.accelerator, run_dir, mode, training.run_id)
                    if ck.export_best else None)
            export_model(training, tokenizer, summary, best)
        if training.accelerator.is_main_process:
            write_summary(run_dir, summary)
            print(format_summary(summary), flush=True)
        return summary
    finally:
        held.close()
        reset_accelerate()


def reset_accelerate() -> None:
    """Accelerate's process-wide settings, for a next run of another precision (PartialState stays)."""
    AcceleratorState._reset_state()
    GradientState._reset_state()


def build(cfg: DictConfig, run_dir: Path, held: contextlib.ExitStack | None = None,
          validated: bool = False) -> tuple[Training, PreTrainedTokenizerBase, str]:
    """Everything the loop needs, validated (unless `validated`) and resumed if asked; `held` takes the run dir's
    lock (`run` passes it; the speed benchmark and tests that only build do not)."""
    if not validated:
        for warning in validate(cfg):
            log.warning(warning)
    set_seed(cfg.trainer.seed)
    accelerator = make_accelerator(cfg, run_dir)
    distributed.check_world(accelerator)
    if held is not None:  # before anything reads the folder: another run may be saving or rotating there
        held.enter_context(hold_run_dir(accelerator, run_dir))
    # Before anything is written, on every rank (they see the same folder): resume target and run dir.
    resume = checkpointing.resolve_resume(run_dir, cfg.checkpoint.resume)
    changed = [] if resume is None else checkpointing.check_config(
        resume, to_plain(cfg), cfg.checkpoint.allow_config_change, accelerator.num_processes)
    check_run_dir(run_dir, cfg, resume)
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
    data = prepare_data(cfg, family, tokenizer, lambda: distributed.main_process_first(accelerator))
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
    # transformers' "constant" ignores num_warmup_steps; "constant_with_warmup" is the same schedule with it
    name = "constant_with_warmup" if s.name.value == "constant" else s.name.value
    scheduler = get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=max_steps)
    scheduler = accelerator.prepare(scheduler)
    state = TrainState()  # checkpointed as JSON by checkpointing.save, not registered with Accelerate

    if resume is not None:
        groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]  # as configured
        scaler_state = None if accelerator.scaler is None else accelerator.scaler.state_dict()
        state.load_state_dict(checkpointing.load(accelerator, resume, scheduler))
        schedule_lr(optimizer, scheduler)  # trainer.max_steps (and so the warm-up) may have changed
        if changed:
            apply_changes(accelerator, optimizer, scheduler, cfg, changed, groups, scaler_state)
        continue_epoch(state, resume, cfg, accelerator.num_processes)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", resume, state.step, state.epoch,
                 state.batch_in_epoch)

    run_id = run_identity(accelerator, resume)
    if accelerator.is_main_process:  # with the history trimmed below: this run's line is the one going on
        checkpointing.mark_line(run_dir, resume, run_id)
    tracker = Tracker(accelerator, run_dir, cfg.logging.name.value, cfg.logging.project,
                      flat(to_plain(cfg)), max_steps, tr.progress_bar, history_until=state.step,
                      evaluated=state.eval_step == state.step)
    training = Training(
        accelerator=accelerator, model=model, optimizer=optimizer, scheduler=scheduler, train_dl=train_dl,
        data=data, eval_dls=eval_dls, tracker=tracker, cfg=cfg, family=family, run_dir=run_dir, max_steps=max_steps,
        state=state, resumed_from=resume, run_id=run_id,
    )
    log.info("training: %d optimizer steps (%d per epoch), batch %d x %d processes x %d accumulation",
             max_steps, steps_per_epoch, tr.batch_size, accelerator.num_processes, tr.grad_accum)
    return training, tokenizer, ran_precision


def apply_changes(accelerator: Accelerator, optimizer, scheduler, cfg: DictConfig, changed: list[str],
                  groups: list[dict], scaler_state: dict | None) -> None:
    """An allowed config change takes effect on resume: the checkpoint put back the optimizer's settings, the
    schedule's base lr and the loss scaler's. `groups` and `scaler_state` are those as built from the config,
    re-applied here; the scale itself only when `changed` names init_scale/static_scale, else it goes on from the
    checkpoint's. What cannot be applied `check_config` refuses."""
    sched = getattr(scheduler, "scheduler", scheduler)  # Accelerate's wrapper, or the bare one (DeepSpeed)
    sched.base_lrs = [cfg.optim.lr] * len(optimizer.param_groups)
    for group, built in zip(optimizer.param_groups, groups, strict=True):
        group.update(built)  # as built (initial_lr: the new optim.lr)
    schedule_lr(optimizer, scheduler)  # the new base lr at the schedule's current step
    if (scaler := accelerator.scaler) is not None:
        if not any(c.startswith(("precision.init_scale:", "precision.static_scale:")) for c in changed):
            loaded = scaler.state_dict()
            scaler_state = {**scaler_state, "scale": loaded["scale"], "_growth_tracker": loaded["_growth_tracker"]}
        scaler.load_state_dict(scaler_state)
    log.info("resumed with the config as given: lr %s (schedule step %d), loss scale %s", sched._last_lr[0],
             sched.last_epoch, None if scaler is None else scaler.get_scale())


def schedule_lr(optimizer, scheduler) -> None:
    """The lr of the schedule as built now at the checkpoint's step, into the optimizer, which the checkpoint gave
    the lr of the schedule it was saved under (the same value unless its length changed)."""
    sched = getattr(scheduler, "scheduler", scheduler)  # Accelerate's wrapper, or the bare one (DeepSpeed)
    sched._last_lr = [base * factor(sched.last_epoch) for base, factor in zip(sched.base_lrs, sched.lr_lambdas,
                                                                               strict=True)]
    for group, lr in zip(optimizer.param_groups, sched._last_lr, strict=True):
        group["lr"] = lr


def continue_epoch(state: TrainState, resume: Path, cfg: DictConfig, world_size: int) -> None:
    """When the examples per micro-batch step (batch_size x processes) changed, skip the examples already
    trained on, not the same number of batches (which would skip or repeat others): ranks take consecutive
    batches of one order, so that count is batches x batch size x processes."""
    saved = OmegaConf.load(Path(resume) / "config.yaml").trainer.batch_size
    before = saved * checkpointing.manifest(resume).get("world_size", world_size)
    now = cfg.trainer.batch_size * world_size
    if before == now or not state.batch_in_epoch:
        return
    consumed = state.batch_in_epoch * before
    state.batch_in_epoch, again = divmod(consumed, now)
    log.warning("the epoch goes on after its %d examples already trained on (%d per step before, %d now)%s%s",
                consumed, before, now,
                f"; the next {again} of them are trained on again" if again else "",
                "; with trainer.group_by_length the rest of the epoch is in another order (its length groups are "
                "of the global batch)" if cfg.trainer.group_by_length else "")


def run_identity(accelerator: Accelerator, resume: Path | None) -> str:
    """The run's id for its checkpoints (`checkpointing.of_run`): a resume continues its checkpoint's; a new run
    (also in a reused folder) draws one, the same on every rank."""
    if resume is not None and (found := checkpointing.manifest(resume).get("run_id")):
        return found
    return broadcast_object_list([uuid.uuid4().hex[:12]])[0]  # a no-op on one process


LOCK = "run.lock"  # <run dir>/run.lock: held (flock) by the run training there


def _gone(holder: dict) -> bool:
    """A lock's holder is known to be gone: on this host, and its pid is not running (or is another process)."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    started = process_start(holder["pid"])
    return started is not None and holder.get("started") is not None and started != holder["started"]


def _is_file_of(path: Path, fd: int) -> bool:
    """`path` is still the file `fd` has open (not removed, or replaced, by another run)."""
    with contextlib.suppress(OSError):
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    return False


def _lock(path: Path) -> tuple[int | None, dict | None]:
    """(an fd holding `path`'s lock, None) or (None, the holder's record). The kernel's flock is the lock, so a
    killed run's lock is free again; where the filesystem has no locks, the record's pid and host decide."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:  # held (BlockingIOError), or no locks on this filesystem (ENOLCK, EOPNOTSUPP, ...)
            holder = _read_lock(fd)
            if isinstance(exc, BlockingIOError) or (holder and holder.get("pid") != os.getpid()
                                                     and not _gone(holder)):
                os.close(fd)
                return None, holder or {}
            log.warning("%s: the filesystem does not lock files (%s): relying on the pid and host in it", path, exc)
        if _is_file_of(path, fd):
            break
        os.close(fd)  # released and removed by its holder between our open and flock: take the new file
    previous = _read_lock(fd)
    if previous and previous.get("pid") != os.getpid():
        log.warning("%s: taking over the lock of a run that is gone (pid %s on %s)", path, previous.get("pid"),
                    previous.get("host"))
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": process_start(os.getpid()),
          "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    os.fsync(fd)
    return fd, None


def _read_lock(fd: int) -> dict | None:
    with contextlib.suppress(ValueError):
        body = json.loads(os.pread(fd, 4096, 0) or b"null")
        return body if isinstance(body, dict) else None
    return None


@contextlib.contextmanager
def hold_run_dir(accelerator: Accelerator, run_dir: Path):
    """The main process locks <run dir>/run.lock, every rank learns the verdict: a second run there is refused,
    naming the first. Removed at the end; a run killed with -9 leaves a file the kernel has already unlocked."""
    path, fd, holder = run_dir / LOCK, None, None
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd, holder = _lock(path)
    if (h := broadcast_object_list([holder])[0]) is not None:
        raise ConfigError([
            f"hydra.run.dir={run_dir} is in use by another run (pid {h.get('pid', '?')} on {h.get('host', '?')}, "
            f"since {h.get('since', '?')}; lock {path}): two runs in one folder would mix their checkpoints and "
            "metrics. Wait for it to end (then resume it with checkpoint.resume=latest), or leave hydra.run.dir "
            "unset for a new folder"])
    try:
        yield
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                if _is_file_of(path, fd):
                    path.unlink()
            os.close(fd)


# What a run leaves in its run dir (Hydra's own .hydra/ and <job>.log aside); those of them that show it trained.
RUN_ARTIFACTS = ("config.yaml", "metrics.jsonl", "summary.json", "checkpoints", "model", "tokenizer")


def _trained(run_dir: Path) -> list[str]:
    """What shows a run trained there (one that failed before its first step leaves only config.yaml and
    tokenizer/: nothing to lose)."""
    shows = {"metrics.jsonl": lambda p: p.is_file() and p.stat().st_size > 0, "summary.json": Path.exists,
             "model": Path.exists, "checkpoints": lambda p: any(p.glob("step_*"))}
    return [name for name, trained in shows.items() if trained(run_dir / name)]


def check_run_dir(run_dir: Path, cfg: DictConfig, resume: Path | None) -> None:
    """A new run never mixes with a previous one in the same folder, unless asked to; a folder whose run never
    trained is taken over. Resuming another folder's checkpoint here is a new run in this folder."""
    found = [n for n in RUN_ARTIFACTS if (run_dir / n).exists()]
    # By the folder it sits in: a checkpoint of this run may be a symbolic link to elsewhere.
    foreign = resume is not None and resume.absolute().parent.resolve() != (run_dir / "checkpoints").resolve()
    fresh, latest = resume is None or foreign, cfg.checkpoint.resume == "latest"
    if found and not _trained(run_dir) and fresh:
        log.info("hydra.run.dir=%s holds only %s of a run that never trained: this run takes it over", run_dir,
                 ", ".join(found))
    elif found and fresh and not cfg.checkpoint.reuse_run_dir:
        if foreign:
            raise ConfigError([
                f"hydra.run.dir={run_dir} holds a previous run ({', '.join(found)}), and checkpoint.resume={resume} "
                "is a checkpoint of another folder: resumed here, this run would rotate out that run's checkpoints "
                "and replace its files. Leave hydra.run.dir unset (the resume goes on in a new folder), or start "
                "over in it with checkpoint.reuse_run_dir=true"])
        if latest:
            others = [str(p) for p in checkpointing.checkpoints(run_dir)]
            raise ConfigError([
                f"hydra.run.dir={run_dir} holds a previous run ({', '.join(found)}), and checkpoint.resume=latest "
                "found no checkpoint of it that verifies and continues its line (see the warnings above). "
                + (f"Complete checkpoints there: {others}; resume one by its path (checkpoint.resume=<it>), "
                   if others else "")
                + "or start over in it with checkpoint.reuse_run_dir=true (its checkpoints are rotated out as new "
                "ones come), or leave hydra.run.dir unset for a new folder"])
        raise ConfigError([
            f"hydra.run.dir={run_dir} holds a previous run ({', '.join(found)}); a new run there would mix "
            "with it. Either resume it (checkpoint.resume=latest, or checkpoint.resume=<a checkpoint>), or start "
            "over in it with checkpoint.reuse_run_dir=true (its checkpoints are rotated out as new ones come, "
            "its metrics history moves to metrics.replaced.jsonl); or leave hydra.run.dir unset for a new folder"])
    if latest and resume is None:
        log.warning("checkpoint.resume=latest: no checkpoint in %s, so this run STARTS AFRESH from step 0%s",
                    run_dir, " (a new run dir: to resume an earlier run, pass hydra.run.dir=<its run dir>)"
                    if not found else "")


def summarize(training: Training, ran_precision: str, started: float, setup_seconds: float) -> dict[str, Any]:
    """The run's summary (summary.json): what ran, the final evaluation, counters, throughput, memory."""
    cfg, run_dir, accelerator, model, state = (training.cfg, training.run_dir, training.accelerator, training.model,
                                               training.state)
    unwrapped, device = accelerator.unwrap_model(model), accelerator.device
    peak, peak_kind = peak_memory_bytes(device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    seconds = max(state.train_seconds, 1e-9)
    return dict(
        run_dir=str(run_dir), model=cfg.model.name, task=cfg.task.name, task_family=cfg.task.family,
        precision=ran_precision, precision_requested=cfg.precision.name.value,
        # DeepSpeed: "autocast" (fp32 weights and gradients, as elsewhere) or "half" (16-bit weights and gradients).
        deepspeed_precision=(precision.deepspeed_mode(cfg.precision, cfg.distributed.deepspeed_precision)
                             if accelerator.distributed_type.value == "DEEPSPEED" else None),
        eval={k: v for k, v in state.eval_results.items() if k != "samples"},
        eval_samples=state.eval_results["samples"], main_metric=cfg.task.main_metric,
        # the class binary F1 scored, from the labels the model was trained with
        positive_label=training.family.positive_label(cfg.task, training.family.labels_from_model(unwrapped.config)),
        train_loss=state.loss_sum / max(state.loss_batches, 1), train_loss_last=state.last_loss,
        train_samples_per_second=state.samples / seconds, train_tokens_per_second=state.tokens / seconds,
        train_samples=state.samples, train_tokens=state.tokens, peak_memory_bytes=peak, peak_memory_kind=peak_kind,
        wall_seconds=time.perf_counter() - started, setup_seconds=setup_seconds, train_seconds=state.train_seconds,
        resumed_from=None if training.resumed_from is None else str(training.resumed_from),  # train_seconds: since step 0
        steps=state.step, skipped_steps=state.skipped, loss_scale_final=state.loss_scale,
        epochs=state.epoch + state.batch_in_epoch / len(training.train_dl),
        attn_implementation=unwrapped.config._attn_implementation, compiled=bool(cfg.trainer.compile),
        gradient_checkpointing=bool(cfg.model.gradient_checkpointing), early_stopping=_early_stopping(cfg, state),
        num_processes=accelerator.num_processes, distributed_type=accelerator.distributed_type.value,
        device=str(device), device_name=device_name, export_dir=None, exported=None, command=_command(run_dir),
        versions=dict(torch=torch.__version__, transformers=transformers.__version__,
                      accelerate=accelerate.__version__),
    )


def export_model(training: Training, tokenizer: PreTrainedTokenizerBase, summary: dict[str, Any],
                 best: Path | None) -> None:
    """Export the weights as they are now (the last, or `best`'s once restored) to <run dir>/model."""
    accelerator, model, run_dir = training.accelerator, training.model, training.run_dir
    summary["exported"] = f"last (step {training.state.step})"
    if best is not None:
        m = checkpointing.manifest(best)["metric"]
        summary["exported"] = f"best: {best.name} ({m['name']}={m['value']:.4g})"
    summary["export_dir"] = str(run_dir / "model")
    card = summary
    if best is not None:  # the card gives the exported weights' scores: the evaluation their checkpoint was ranked by
        scored = json.loads((best / checkpointing.TRAIN_STATE).read_text())["eval_results"]
        card = {**summary, "eval": {k: v for k, v in scored.items() if k != "samples"}}
    checkpointing.export(accelerator, model, tokenizer, run_dir / "model", to_plain(training.cfg),
                         model_card(card, training.cfg, training.family), step=training.state.step, source=best)


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


def _command(run_dir: Path) -> str | None:
    """The command that produced the run, from Hydra's record of the overrides."""
    overrides = run_dir / ".hydra" / "overrides.yaml"
    if not overrides.is_file():
        return None
    args = [str(a) for a in OmegaConf.load(overrides) if not str(a).startswith("hydra.")]
    return shlex.join(["python", "recipes/finetune.py", *args])  # as a shell reads it: [0.9, 0.98] is one word


def _base_model(m: DictConfig) -> str | None:
    """The Hub id the run started from; None for random weights, pkg:// and local folders (not on the Hub)."""
    path = m.name_or_path
    if not m.pretrained or path.startswith("pkg://") or Path(path).expanduser().exists():
        return None
    with contextlib.suppress(HFValidationError):
        validate_repo_id(path)  # refuses absolute, ./, ../ and ~ paths and anything deeper than org/name
        return path
    return None


def _eval_results(s: dict[str, Any], cfg: DictConfig, family: tasks.Family, dataset: str | None) -> list[EvalResult]:
    """The final validation metrics as a model-index: the main split's, and each extra split's (`<split>/<key>`)."""
    task = cfg.task
    main, extra = (task.validation_split if dataset else "validation"), set(extra_split_names(task))
    results = []
    for key, value in s["eval"].items():
        head, _, rest = key.partition("/")  # NER's per-type keys (PER/f1) are the main split's
        split, metric = (head, rest) if head in extra else (main, key)
        results.append(EvalResult(task_type=family.pipeline_tag, dataset_type=dataset or task.name,
                                  dataset_name=task.name, dataset_config=task.subset if dataset else None,
                                  dataset_split=split, metric_type=metric, metric_name=metric,
                                  metric_value=float(value)))
    return results


def model_card(s: dict[str, Any], cfg: DictConfig, family: tasks.Family) -> str:
    """The export's README.md: Hub metadata (base model, dataset, pipeline tag, metrics as a model-index), what
    the run was, and Python that runs the model on one example."""
    task, base = cfg.task, _base_model(cfg.model)
    dataset = task.dataset if task.train_file is None and task.dataset is not None else None  # read from the Hub
    data = ModelCardData(model_name=f"{s['model']} fine-tuned on {s['task']}", base_model=base,
                         datasets=[dataset] if dataset else None, library_name="transformers",
                         pipeline_tag=family.pipeline_tag, tags=["ampft"],
                         eval_results=_eval_results(s, cfg, family, dataset) or None)
    if base is not None:
        start = f"`{base}` (Hugging Face Hub)"
    elif cfg.model.pretrained:
        start = f"the pretrained weights in `{cfg.model.name_or_path}`"
    else:
        start = f"random weights (the `{cfg.model.name}` architecture)"
    metrics = "\n".join(f"| {k} | {v:.4f} |" for k, v in s["eval"].items())
    data_source = (f"`{dataset}`" + (f" ({task.subset})" if task.subset else "") if dataset
                   else f"local files (`{Path(task.train_file).name}`, `{Path(task.validation_file).name}`)"
                   if task.train_file else f"the built-in `{task.name}` data")
    body = f"""
# {s["model"]} fine-tuned on {s["task"]}

Fine-tuned with ampft from {start} on {data_source},
in **{s["precision"]}** precision for {s["steps"]} optimizer steps ({s["epochs"]:.2f} epochs); exported weights:
{s["exported"]}.

| validation metric | value |
|---|---|
{metrics}

- train loss (mean over the run): {s["train_loss"]:.4f}
- throughput: {s["train_samples_per_second"]:.1f} samples/s, {s["train_tokens_per_second"]:.0f} tokens/s
  (non-padding) on {s["num_processes"]} x {s["device_name"]} ({s["device"]})
- fp16 steps skipped for overflow: {s["skipped_steps"]}
- versions: {", ".join(f"{k} {v}" for k, v in s["versions"].items())}

Command:

```
{s["command"] or "(not recorded: run outside the recipe)"}
```

## Usage

With transformers alone (this prints what the model predicts for one example):

```python
{family.usage(task).rstrip()}
```

With ampft, on a whole file (one prediction per input, in its order): `make predict run=<run dir> file=<file>`.
"""
    return str(ModelCard(f"---\n{data.to_yaml()}\n---\n{body}"))
