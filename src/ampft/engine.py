"""The training loop, readable top to bottom: `fit` first, then the step it runs (`train_step`), the window of
what happened since the last logging point (`Window`: losses, throughput, divergence checks), and the state a
checkpoint keeps (`TrainState`). `state.step` counts applied optimizer updates: a step the fp16 loss scaler skips
advances neither it nor the LR scheduler, and is counted in `state.skipped` (docs/architecture.md, Counters).
"""

from __future__ import annotations

import functools
import logging
import math
import signal
import threading
import time
from collections import deque
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from accelerate import Accelerator
from accelerate.utils import is_compiled_module
from omegaconf import DictConfig

from ampft import checkpointing, tasks
from ampft.config import ConfigError, metric_mode, to_plain
from ampft.errors import Preempted, TrainingDiverged
from ampft.tracking import Tracker

if TYPE_CHECKING:
    from ampft.data import TaskData
    from ampft.tasks.base import Family

log = logging.getLogger(__name__)


def fit(t: Training) -> TrainState:
    """Train until `max_steps` updates are applied, `trainer.max_minutes` pass or early stopping ends it, then
    evaluate (unless this step was). SIGTERM, SIGUSR1 or Ctrl-C checkpoint at the next step and raise `Preempted`.
    `t.state` is what a checkpoint keeps, so a resumed run goes on exactly as the uninterrupted one."""
    acc, st, tr, ck = t.accelerator, t.state, t.cfg.trainer, t.cfg.checkpoint
    problem = early_stopping_problem(tr, t.max_steps, math.ceil(len(t.train_dl) / tr.grad_accum))
    if problem is not None:  # early stopping's evaluations, now that the steps per epoch are known
        raise ConfigError([problem])
    window = Window(acc, t.cfg.precision, st, t.run_dir)  # losses, tokens, divergence checks between logging points
    last_checkpoint = t.resumed_from  # the newest checkpoint of this line: saved, or resumed from
    window.track(last_checkpoint)  # its weights are judged by the first update trained from them
    deadline = None if tr.max_minutes is None else time.monotonic() + 60 * tr.max_minutes

    with preemption_signals() as preempt:
        t.model.train()
        t.tracker.advance(st.step)
        done = st.step >= t.max_steps or stop_early(t)  # a checkpoint of the step that stopped: stops again
        while not done:
            for batch in rest_of_epoch(t):
                # Length chunks (trainer.length_chunks): the collator, which knows the rows' lengths before anything
                # reaches the device, hands a split batch as a list (`ampft.data.LengthChunks`).
                chunks = batch if isinstance(batch, list) else [batch]
                result = train_step(acc, t.model, t.optimizer, t.scheduler, chunks, tr.max_grad_norm,
                                    want_grad_norm=(st.step + 1) % tr.log_every == 0)
                st.batch_in_epoch += 1
                window.add(result, chunks)
                if not result.synced:  # inside a gradient accumulation (trainer.grad_accum)
                    continue
                st.skipped += result.skipped  # fp16 overflow: no update, no scheduler step; counted apart
                window.end_step(st.step, result.skipped)  # divergence checks; a new checkpoint's verdict
                if result.skipped:
                    continue
                st.step += 1
                t.tracker.advance()

                # Every N steps, in this order: log, evaluate, checkpoint (which may rank by this evaluation).
                if st.step % tr.log_every == 0 or st.step == t.max_steps:
                    log_window(t, window)
                if tr.eval_every and st.step % tr.eval_every == 0:
                    evaluate(t, window)
                if ck.every and st.step % ck.every == 0:
                    last_checkpoint = checkpoint(t, window, last_checkpoint)

                done = stop_early(t)  # after the checkpoint: its evaluation (checkpoint.keep_best) counts too
                if not done and st.step < t.max_steps and any_rank(acc, preempt["signal"] is not None, st.step,
                                                                   tr.log_every):
                    if last_checkpoint is None or last_checkpoint.name != f"step_{st.step}":
                        last_checkpoint = checkpoint(t, window, last_checkpoint)
                    raise Preempted(f"stopped by {preempt['signal']} at step {st.step}; checkpoint written: "
                                    f"{last_checkpoint}. Resume: hydra.run.dir={t.run_dir} checkpoint.resume=latest")
                done = done or st.step >= t.max_steps or (  # trainer.max_minutes: the slowest rank's clock
                    deadline is not None and any_rank(acc, time.monotonic() > deadline, st.step, tr.log_every))
                if done:
                    break
            if not done:  # the epoch ran out before max_steps
                st.epoch += 1
                st.batch_in_epoch = 0
                if not tr.eval_every and st.eval_step != st.step:  # (evaluated already: a checkpoint's best)
                    evaluate(t, window)
                    done = stop_early(t)

        window.close(st)  # the last, partial logging window
        window.check(st.step, st.last_loss)
        if not weights_finite(t.model, acc):  # a run shorter than the checks' windows never ends on broken weights
            window.fail(st.step, f"the weights are not finite at the end of the run (the last loss: {st.last_loss:g})")
        st.loss_scale = window.scale
        if st.eval_step != st.step:
            evaluate(t, window)
    return st


def rest_of_epoch(t: Training) -> torch.utils.data.DataLoader:
    """The current epoch's batches not consumed yet; resuming mid-epoch jumps over the consumed ones without
    loading them."""
    st, dl = t.state, t.train_dl
    batches = t.accelerator.skip_first_batches(dl, st.batch_in_epoch) if st.batch_in_epoch else dl
    batches.set_epoch(st.epoch)  # the epoch's data order (a fresh skip loader would say epoch 0)
    return batches


def log_window(t: Training, window: Window) -> None:
    """The window since the last logging point into the state and metrics.jsonl, then its divergence checks."""
    st = t.state
    skipped_in_window = window.close(st)
    values = dict(
        loss=st.last_loss,
        lr=window.lr,  # the logged step's, as the Trainer logs it (not the next step's)
        epoch=st.epoch + st.batch_in_epoch / len(t.train_dl),
        samples_per_second=st.samples / max(st.train_seconds, 1e-9),
        tokens_per_second=st.tokens / max(st.train_seconds, 1e-9),
        skipped_steps=st.skipped,
        skipped_in_window=skipped_in_window,
    )
    if window.grad_norm is not None:
        values["grad_norm"] = float(window.grad_norm)
    if window.scale is not None:
        values["loss_scale"] = window.scale
    t.tracker.log("train", st.step, values)  # NaN and inf are logged as they are
    window.check(st.step, st.last_loss)


def evaluate(t: Training, window: Window) -> dict[str, float]:
    """Every validation split (`tasks.evaluate`), folded into the best so far. Under torch.compile the eager module
    evaluates (eval mode would compile a second set of graphs for a few hundred batches)."""
    st, ck = t.state, t.cfg.checkpoint
    window.fold(st)  # evaluation time is not training time
    model = t.model._orig_mod if is_compiled_module(t.model) else t.model
    results = tasks.evaluate(t.accelerator, model, t.data, t.eval_dls, t.cfg.task, t.run_dir)
    st.eval_step, st.eval_results = st.step, results
    metric = ck.metric or t.cfg.task.main_metric
    track_best(st, results, metric, metric_mode(metric, ck.mode))
    t.tracker.log("eval", st.step, results)
    window.restart()
    return results


def checkpoint(t: Training, window: Window, parent: Path | None) -> Path:
    """Save a checkpoint of this step after the divergence checks (never one of broken weights); under
    checkpoint.keep_best/export_best ranked by an evaluation at this very step. Returns it."""
    st, ck = t.state, t.cfg.checkpoint
    name = ck.metric or t.cfg.task.main_metric
    window.fold(st)
    window.check(st.step)
    if not weights_finite(t.model, t.accelerator):  # never overwrite good checkpoints with broken weights
        window.fail(st.step, "the weights are not finite at a checkpoint")
    metric = None
    if ck.keep_best or ck.export_best:
        if st.eval_step != st.step:
            evaluate(t, window)
        metric = {"name": name, "value": st.eval_results[name]}
    info = dict(epoch=st.epoch, batch_in_epoch=st.batch_in_epoch, loss=st.last_loss, metric=metric)
    saved = checkpointing.save(t.accelerator, t.run_dir, st.step, info, st.state_dict(), to_plain(t.cfg),
                               t.accelerator.unwrap_model(t.model).config, ck.keep_last, ck.keep_best,
                               metric_mode(name, ck.mode), parent=parent, scheduler=t.scheduler, run_id=t.run_id)
    window.track(saved)
    window.restart()
    return saved


def stop_early(t: Training) -> bool:
    """trainer.early_stopping_patience evaluations in a row without improvement, the latest at this very step:
    training ends here. The count is in the checkpointed state, so a run resumed from any checkpoint stops
    where the uninterrupted run would."""
    st, patience = t.state, t.cfg.trainer.early_stopping_patience
    if st.stopped_early_at is None and patience and st.eval_step == st.step \
            and st.evals_since_best >= patience and st.step < t.max_steps:
        st.stopped_early_at = st.step
        metric = t.cfg.checkpoint.metric or t.cfg.task.main_metric
        log.info("early stopping at step %d: %s did not improve for %d evaluations; the best, %.4g, was at step %s",
                 st.step, metric, st.evals_since_best, st.best_eval[metric] if st.best_eval else float("nan"),
                 st.best_step)
    return st.stopped_early_at is not None


def any_rank(acc: Accelerator, flag: bool, step: int, log_every: int) -> bool:
    """`flag` on any rank, decided alike by all: one process reads its own flag (no device sync); several
    ranks agree at logging points only (one collective per logging interval)."""
    if acc.num_processes == 1:
        return flag
    if step % log_every:
        return False
    return bool(acc.reduce(torch.tensor(flag, device=acc.device), "max"))


@contextmanager
def preemption_signals():
    """Turn SIGTERM, SIGUSR1 and a first Ctrl-C (SIGINT) into a flag the loop reads at step boundaries (main thread
    only); a second Ctrl-C stops at once (KeyboardInterrupt), without a checkpoint."""
    flag = {"signal": None}

    def handler(signum, frame):
        if signum == signal.SIGINT and flag["signal"] == "SIGINT":
            raise KeyboardInterrupt
        flag["signal"] = signal.Signals(signum).name
        log.warning("%s received: will checkpoint at the next step boundary and exit%s", flag["signal"],
                    " (Ctrl-C again: stop now, without a checkpoint)" if signum == signal.SIGINT else "")

    previous = ({sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
                if threading.current_thread() is threading.main_thread() else {})
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@dataclass(frozen=True)
class StepResult:
    """What one `train_step` did."""

    loss: torch.Tensor  # the micro-batch's loss, detached, on the device (read at logging points only)
    synced: bool  # the last micro-batch of an accumulation: the optimizer step was attempted
    skipped: bool  # that step was skipped by the fp16 loss scaler (overflow): no update, no scheduler step
    grad_norm: torch.Tensor | None  # computed when clipping, or when asked for; else None
    lr: float | None = None  # the learning rate the applied update used (None: no update applied)


def train_step(acc: Accelerator, model: torch.nn.Module, optimizer, scheduler, batch: dict | list[dict],
               max_grad_norm: float, want_grad_norm: bool = False) -> StepResult:
    """One micro-batch of training, the one way ampft trains (`fit` and the speed benchmark both call this).

    Length chunks (a list, `ampft.data.LengthChunks`): one forward and backward each, weighted by its share of the
    loss terms, gradients synced on the last. At the end of an accumulation: clip (which unscales fp16 gradients;
    the norm is inf/NaN on overflow) or only the norm if `want_grad_norm`, the optimizer step (skipped by the loss
    scaler on overflow), the LR scheduler only for an applied update."""
    grad_norm = None
    chunks = batch if isinstance(batch, list) else [batch]
    if len(chunks) > 1:  # each chunk's share of the batch's loss terms (a whole batch needs no weight)
        terms = [loss_terms(c) for c in chunks]
        total = sum(terms)
    with acc.accumulate(model):
        loss = torch.zeros((), device=acc.device)
        for i, chunk in enumerate(chunks):
            with acc.no_sync(model) if i < len(chunks) - 1 else nullcontext():
                part = model(**chunk).loss
                if len(chunks) > 1:  # no terms (a chunk of unlabelled tokens): its NaN mean counts 0
                    part = torch.where(terms[i] > 0, part, 0.0) * (terms[i] / total)
                acc.backward(part)
            loss += part.detach().float()
        if acc.sync_gradients and (max_grad_norm > 0 or want_grad_norm):  # inf: the norm only, no clipping
            grad_norm = acc.clip_grad_norm_(model.parameters(), max_grad_norm if max_grad_norm > 0 else float("inf"))
        optimizer.step()  # Accelerate steps only on the last micro-batch of an accumulation
        optimizer.zero_grad(set_to_none=True)
    synced = acc.sync_gradients
    skipped = bool(synced and optimizer.step_was_skipped)
    lr = scheduler.get_last_lr()[0] if synced and not skipped else None
    if lr is not None:
        scheduler.step()
    return StepResult(loss, synced, skipped, grad_norm, lr)


def loss_terms(batch: dict) -> torch.Tensor:
    """How many terms a batch's mean loss averages, as transformers' heads compute it: labelled tokens for
    token-level labels (2-D integer, -100 ignored by the cross-entropy), else rows (sequence labels,
    regression, multi-label rows, QA start/end positions)."""
    labels = batch.get("labels")
    if labels is not None and labels.dim() == 2 and not labels.is_floating_point():
        return (labels != -100).sum()
    return torch.tensor(batch["input_ids"].shape[0], device=batch["input_ids"].device)


class Window:
    """What happened since the last logging point, kept on the device and read there (one host sync each): losses,
    skipped steps, tokens, samples, time, the newest gradient norm and applied learning rate. The divergence guard
    watches the same losses, without a host sync per step: runs of non-finite steps (a device-side counter read
    every `max_consecutive_nonfinite` attempts and at every `check`), the fp16 loss scale (read after every step:
    GradScaler syncs there anyway), a loss explosion (the window's mean against the first loss). `check` runs at
    logging points and before every checkpoint, so none is written after exploded losses.

    A loss is computed with the weights before the update, so a checkpoint is known good only once the first
    update trained from it passes the same checks (the verdict goes into its manifest); a divergence marks the
    one not judged yet as diverged and names the newest one known good."""

    def __init__(self, acc: Accelerator, p: DictConfig, st: TrainState, run_dir: Path):
        self.acc, self.p, self.st = acc, p, st
        self.own = (Path(run_dir) / "checkpoints").resolve()  # health verdicts are written only in here
        zero = functools.partial(torch.zeros, (), device=acc.device)
        count = functools.partial(torch.zeros, (), dtype=torch.long, device=acc.device)
        # On the device: the loss sums of the window and of the current step attempt (its non-finite check, and a
        # pending checkpoint's verdict), the tokens, the current and the longest run of steps with a non-finite loss.
        self.loss, self.step_loss = zero(), zero()
        self.tokens, self.run, self.worst = count(), count(), count()
        self.batches = self.step_batches = self.skipped = self.samples = self.attempts = 0
        self.first: torch.Tensor | None = None  # the first micro-batch's loss (st.initial_loss at the first check)
        self.grad_norm: torch.Tensor | None = None  # kept across windows: without clipping only logged steps have one
        self.lr: float | None = None
        self.tic = time.perf_counter()
        self.scale = acc.scaler.get_scale() if acc.scaler is not None else None
        self.history: deque[tuple[int, float]] = deque([] if self.scale is None else [(0, self.scale)], maxlen=12)
        self.pending: Path | None = None  # the newest checkpoint, its own weights not judged yet
        self.good: Path | None = None  # the newest checkpoint of this line known good
        self.good_health: dict = {}  # its verdict: the loss its weights produced, and in which step

    def add(self, step: StepResult, chunks: list[dict]) -> None:
        """One micro-batch (no host sync)."""
        loss = step.loss.detach().float()
        self.loss += loss
        self.step_loss += loss
        self.batches += 1
        self.step_batches += 1
        if self.first is None and self.st.initial_loss is None:
            self.first = loss.clone()
        self.grad_norm = self.grad_norm if step.grad_norm is None else step.grad_norm
        self.lr = self.lr if step.lr is None else step.lr
        self.tokens += sum(chunk["attention_mask"].sum() for chunk in chunks)
        self.samples += sum(chunk["input_ids"].shape[0] for chunk in chunks)  # QA batches have no labels

    def end_step(self, step: int, skipped: bool) -> None:
        """After each optimizer step attempt (applied or `skipped`, `step` updates before it): the run of non-finite
        steps, the loss scale; the first update applied from a pending checkpoint judges its weights (one host
        sync per checkpoint)."""
        self.skipped += skipped
        self.attempts += 1
        self.run = (self.run + 1) * ~torch.isfinite(self.step_loss)
        self.worst = torch.maximum(self.worst, self.run)
        if self.scale is not None:
            scale = self.acc.scaler.get_scale()
            if scale != self.scale:
                self.history.append((step, scale))
                self.scale = scale
            if scale < self.p.min_scale:
                self.fail(step, f"the fp16 loss scale collapsed to {scale:g}, below precision.min_scale="
                                 f"{self.p.min_scale:g}")
        if self.attempts % self.p.max_consecutive_nonfinite == 0:
            self.check_nonfinite(step)
        if self.pending is not None and not skipped:  # the verdict is taken from an update that is applied
            loss = float(self.acc.reduce(self.step_loss, reduction="mean")) / self.step_batches
            if why := self.exploded(loss):
                self.fail(step + 1, f"{why} in the first update trained from checkpoint {self.pending.name}", loss)
            self.record(True, loss, step + 1)
            self.good, self.pending, self.good_health = self.pending, None, {"loss": loss, "step": step + 1}
        self.step_loss.zero_()
        self.step_batches = 0

    def fold(self, st: TrainState) -> None:
        """Add the tokens and samples counted and the time since the last fold or restart (one host sync)."""
        st.tokens += int(self.acc.reduce(self.tokens, reduction="sum"))
        st.samples += self.samples * self.acc.num_processes
        st.train_seconds += time.perf_counter() - self.tic
        self.tokens.zero_()
        self.samples = 0
        self.restart()

    def restart(self) -> None:
        """Training time starts again (after an evaluation or a checkpoint, which it does not count)."""
        self.tic = time.perf_counter()

    def mean(self) -> float:
        """The window's mean loss over all ranks (a host sync); NaN for an empty window."""
        return float(self.acc.reduce(self.loss, reduction="mean")) / self.batches if self.batches else math.nan

    def close(self, st: TrainState) -> int:
        """Fold, then the window's losses into the state; a new window starts. Returns the steps it skipped."""
        self.fold(st)
        if self.batches:
            st.last_loss = self.mean()
            st.loss_sum += st.last_loss * self.batches
            st.loss_batches += self.batches
            self.loss.zero_()
        skipped, self.skipped, self.batches = self.skipped, 0, 0
        return skipped

    def check(self, step: int, mean: float | None = None) -> None:
        """The divergence checks: runs of non-finite losses, then the window's `mean` loss (default: read now)
        against the initial loss (a host sync each)."""
        self.check_nonfinite(step)
        if self.st.initial_loss is None and self.first is not None:
            self.st.initial_loss = float(self.acc.reduce(self.first, reduction="mean"))
        mean = self.mean() if mean is None else mean
        if math.isfinite(mean) and (why := self.exploded(mean)):  # non-finite: the run count decides
            self.fail(step, f"{why} (the mean over the last steps)")

    def check_nonfinite(self, step: int) -> None:
        worst = int(self.acc.reduce(self.worst, reduction="max"))
        if worst >= self.p.max_consecutive_nonfinite:
            self.fail(step, f"the loss was not finite for {worst} optimizer steps in a row "
                            f"(precision.max_consecutive_nonfinite={self.p.max_consecutive_nonfinite})")

    def exploded(self, loss: float) -> str | None:
        """Why a mean loss means divergence (None: it does not)."""
        if not math.isfinite(loss):
            return f"the loss was {loss}"
        ratio, initial = self.p.max_loss_ratio, self.st.initial_loss
        if ratio and initial is not None and math.isfinite(initial) and loss > ratio * abs(initial):
            return (f"the loss exploded: {loss:.4g}, more than precision.max_loss_ratio={ratio:g} x the initial loss "
                    f"{initial:.4g}")
        return None

    def track(self, checkpoint: Path | None) -> None:
        """`checkpoint` was just saved, or resumed from: the next update trains from its weights. Resumed from, it
        may be judged already; else the newest known good is among its ancestors."""
        if checkpoint is None:
            return
        self.pending = None if checkpointing.healthy(checkpoint) else checkpoint
        if self.pending is None or self.good is None:
            self.good = checkpointing.known_good(checkpoint)
            self.good_health = {} if self.good is None else checkpointing.manifest(self.good)["health"]

    def record(self, ok: bool, loss: float | None, step: int, why: str | None = None) -> bool:
        """The pending checkpoint's verdict into its manifest, by the main process, only if it is in this run dir
        (never into another run's). True: recorded."""
        ours = self.pending.parent.resolve() == self.own
        if ours and self.acc.is_main_process:
            checkpointing.record_health(self.pending, ok, loss, step, why)
        return ours

    def fail(self, step: int, what: str, loss: float | None = None) -> None:
        history = ", ".join(f"step {s}: {v:g}" for s, v in self.history) or "n/a (no loss scaling)"
        written = "No checkpoint was written from these weights."
        if self.pending is not None:  # its weights produced (some of) the losses that failed
            marked = ("it is marked diverged, and checkpoint.resume=latest skips it" if self.record(False, loss, step, what)
                      else "do not resume from it")
            written = (f"Checkpoint {self.pending} holds the weights that produced these losses (it was written "
                       f"before they were seen): {marked}.")
            self.pending = None
        good, h = self.good, self.good_health
        if good is not None and good.is_dir():
            kept = (f"The newest checkpoint known good is {good} (step {checkpointing.manifest(good)['step']}: the "
                    f"loss its weights produced in step {h.get('step')}, {h.get('loss', float('nan')):.4g}, passed "
                    f"these checks); resume from it with a fix: checkpoint.resume={good} "
                    "checkpoint.allow_config_change=true.")
        else:
            kept = "No checkpoint of this run is known good to go back to."
        raise TrainingDiverged(
            f"training diverged at step {step}: {what}.\n  loss-scale history: {history}\n"
            "  likely fixes: precision=bf16 (fp32's range, no loss scaling); a lower optim.lr or more "
            "scheduler.warmup_steps; trainer.max_grad_norm=1.0; for fp16 a smaller precision.init_scale.\n"
            f"  {written} {kept}")


def weights_finite(model: torch.nn.Module, acc: Accelerator | None = None) -> bool:
    """All weights finite, on every rank. Sharded weights (ZeRO-3 partitions, FSDP2 DTensors) are checked
    shard by shard where they live; the ranks then agree (one all-reduce)."""
    def local(p: torch.Tensor) -> torch.Tensor:
        p = getattr(p, "ds_tensor", p)  # ZeRO-3: this rank's partition (the parameter itself is released)
        return p.to_local() if hasattr(p, "to_local") else p  # FSDP2: this rank's shard

    ok = all(bool(torch.isfinite(local(p).detach()).all()) for p in model.parameters())
    if acc is not None and acc.num_processes > 1:
        ok = bool(acc.reduce(torch.tensor(int(ok), device=acc.device), reduction="sum") == acc.num_processes)
    return ok


@dataclass(frozen=True)
class Training:
    """One run's training as `finetune.build` set it up. Frozen: `fit` changes what is inside these objects
    (weights, optimizer moments, the counters in `state`), never which objects they are."""

    accelerator: Accelerator
    model: torch.nn.Module  # prepared: wrapped for DDP/FSDP/DeepSpeed, compiled under trainer.compile
    optimizer: torch.optim.Optimizer  # prepared: skips its step when the fp16 loss scaler finds an overflow
    scheduler: torch.optim.lr_scheduler.LRScheduler  # prepared; stepped by `train_step`, once per applied update
    train_dl: torch.utils.data.DataLoader
    data: TaskData  # the tokenized splits; evaluation scores the validation splits against their examples
    eval_dls: dict[str, torch.utils.data.DataLoader]  # prepared, "validation" first, then the extra splits
    tracker: Tracker
    cfg: DictConfig
    family: Family  # the task family `build` resolved (tasks.FAMILIES): evaluation, export, model card
    run_dir: Path
    max_steps: int  # optimizer updates to apply in all (trainer.max_steps, or trainer.epochs' worth)
    state: TrainState  # where training stands: checkpointed, restored on resume
    resumed_from: Path | None = None  # the checkpoint `state` was loaded from
    run_id: str | None = None  # this run's identity, in each of its manifests (kept by its resumes)


@dataclass
class TrainState:
    """Everything beyond model/optimizer/scheduler/scaler/RNG that an exact resume needs."""

    step: int = 0  # optimizer updates applied
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of this epoch already consumed
    skipped: int = 0  # optimizer steps skipped by the loss scaler
    samples: int = 0
    tokens: int = 0
    train_seconds: float = 0.0
    last_loss: float = float("nan")  # mean loss of the latest logging window
    loss_sum: float = 0.0  # sum of micro-batch losses, for the run's mean train loss
    loss_batches: int = 0
    eval_step: int = -1  # step of the latest evaluation
    eval_results: dict | None = None
    loss_scale: float | None = None  # fp16: the scale at the end of training
    initial_loss: float | None = None  # the first micro-batch's loss, before any update (divergence guard)
    # The best evaluation so far by checkpoint.metric (null: task.main_metric) in its direction, its step, and the
    # evaluations since it (trainer.early_stopping_patience counts these); the step early stopping ended training.
    best_eval: dict | None = None
    best_step: int | None = None
    evals_since_best: int = 0
    stopped_early_at: int | None = None

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        """Exactly the known fields, each of its type (a checkpoint's train_state.json is data, never code)."""
        known = {f.name: f.type for f in fields(self)}
        if not isinstance(state, dict):
            raise checkpointing.CheckpointError(f"{checkpointing.TRAIN_STATE} holds a {type(state).__name__}, not "
                                                "an ampft training state")
        problems = [f"unknown key {k!r}" for k in state if k not in known]
        problems += [f"missing key {k!r}" for k in known if k not in state]
        problems += [f"{k}={v!r} is not of type {known[k]}" for k, v in state.items()
                     if k in known and not _fits(v, known[k])]
        if problems:
            raise checkpointing.CheckpointError(f"{checkpointing.TRAIN_STATE} does not hold an ampft training state: "
                                                + "; ".join(problems))
        vars(self).update(state)


def _fits(value, annotation: str) -> bool:
    """`value` is JSON data of the annotated type (`int`, `float`, `dict | None`, ...)."""
    if isinstance(value, dict):  # evaluation results: names to numbers
        return "dict" in annotation and all(isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
                                            for k, v in value.items())
    kinds = {"int": (int,), "float": (int, float), "dict": (dict,), "None": (type(None),)}
    return not isinstance(value, bool) and any(isinstance(value, kinds[a.strip()]) for a in annotation.split("|"))


def track_best(st: TrainState, results: dict[str, float], metric: str, mode: str) -> bool:
    """Fold an evaluation into the best so far: strictly better in `mode` (max/min) becomes the best, anything else
    (equal, worse, NaN) counts one more evaluation without improvement. True: it was an improvement."""
    value = results[metric]
    best = None if st.best_eval is None else st.best_eval[metric]
    improved = math.isfinite(value) and (best is None or (value > best if mode == "max" else value < best))
    if improved:
        st.best_eval, st.best_step, st.evals_since_best = dict(results), st.step, 0
    else:
        st.evals_since_best += 1
    return improved


def early_stopping_problem(tr: DictConfig, max_steps: int, steps_per_epoch: int | None) -> str | None:
    """trainer.early_stopping_patience that could never stop training: the first evaluation is the best so far,
    so stopping needs `patience` more before the last step. None where the numbers are not known yet (epochs before
    the data is loaded) or it can stop."""
    patience = tr.early_stopping_patience
    interval = tr.eval_every or steps_per_epoch
    if not patience or not interval or max_steps <= 0:
        return None
    evaluations = (max_steps - 1) // interval
    if evaluations > patience:
        return None
    every = f"trainer.eval_every={tr.eval_every}" if tr.eval_every else f"every epoch ({steps_per_epoch} steps)"
    return (f"trainer.early_stopping_patience={patience}: this run evaluates {evaluations} time(s) before its last "
            f"step ({max_steps} steps, {every}), so it could never stop early; evaluate more often (trainer.eval_every"
            f"={max(1, (max_steps - 1) // (patience + 1))} or less) or lower the patience")
