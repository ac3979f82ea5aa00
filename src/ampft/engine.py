"""The training loop, readable top to bottom.

Counters: `state.step` counts optimizer updates that were applied. A step skipped by the fp16 loss
scaler (overflow) advances neither `state.step` nor the LR scheduler, so evaluation, checkpoint and
logging intervals and `trainer.max_steps` are all in applied updates; skipped steps are counted apart
in `state.skipped`. Losses and token counts stay on the device and are read only at logging intervals.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from accelerate import Accelerator
from omegaconf import DictConfig

from ampft import checkpointing
from ampft.config import metric_mode, to_plain
from ampft.errors import Preempted, TrainingDiverged
from ampft.tracking import Tracker

log = logging.getLogger(__name__)


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

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        """Exactly the known fields, each of its type (a checkpoint's train_state.json is data, never code)."""
        known = {f.name: f.type for f in fields(self)}
        problems = [f"unknown key {k!r}" for k in state if k not in known]
        problems += [f"missing key {k!r}" for k in known if k not in state]
        problems += [f"{k}={v!r} is not of type {known[k]}" for k, v in state.items()
                     if k in known and not _fits(v, known[k])]
        if problems:
            raise checkpointing.CheckpointError(f"{checkpointing.TRAIN_STATE} does not hold an ampft training state: "
                                                + "; ".join(problems))
        for k, v in state.items():
            setattr(self, k, v)


def _fits(value, annotation: str) -> bool:
    """`value` is JSON data of the annotated type (`int`, `float`, `dict | None`, ...); a dict maps names to
    numbers (evaluation results)."""
    kinds = {"int": (int,), "float": (int, float), "dict": (dict,), "None": (type(None),)}
    if isinstance(value, bool):
        return False
    if isinstance(value, dict) and not all(isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
                                           for k, v in value.items()):
        return False
    return any(isinstance(value, kinds[a.strip()]) for a in annotation.split("|"))


@dataclass
class Loop:
    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    train_dl: torch.utils.data.DataLoader
    evaluate: Callable[[], dict[str, float]]
    tracker: Tracker
    cfg: DictConfig
    run_dir: Path
    max_steps: int
    state: TrainState
    last_checkpoint: Path | None = None  # the newest checkpoint of this line (saved, or resumed from)


class Meters:
    """Token and sample counts kept on the device; folded into the state at logging points."""

    def __init__(self, acc: Accelerator):
        self.acc = acc
        self.tokens = torch.zeros((), dtype=torch.long, device=acc.device)
        self.samples = 0
        self.tic = time.perf_counter()

    def count(self, batch: dict) -> None:
        self.tokens += batch["attention_mask"].sum()
        self.samples += batch["input_ids"].shape[0]  # QA batches have start/end positions, no labels

    def fold(self, st: TrainState) -> None:
        """Add what was counted and the time since the last fold or restart (one host sync)."""
        st.tokens += int(self.acc.reduce(self.tokens, reduction="sum"))
        st.samples += self.samples * self.acc.num_processes
        st.train_seconds += time.perf_counter() - self.tic
        self.tokens.zero_()
        self.samples = 0
        self.restart()

    def restart(self) -> None:
        self.tic = time.perf_counter()


class Guard:
    """Watches for divergence without a host sync per step.

    Per optimizer step, a device-side counter tracks the current run of steps whose loss was not finite
    (and its maximum); it is read every `max_consecutive_nonfinite` attempts and at logging points. Under
    fp16 the loss scale is read after every step (GradScaler already syncs there) and its changes are
    kept as the scale history that the error message shows.

    A loss explosion (a logging window's mean loss above `precision.max_loss_ratio` times the loss of the
    run's first micro-batch, taken before any update) also stops the run; it is checked at logging points
    and before every checkpoint, so no checkpoint is written from exploded weights.
    """

    def __init__(self, acc: Accelerator, p: DictConfig, st: TrainState | None = None,
                 last_checkpoint: Callable[[], Path | None] = lambda: None):
        self.acc, self.p, self.st, self.last_checkpoint = acc, p, st, last_checkpoint
        self.window_sum = torch.zeros((), device=acc.device)
        self.window_n = 0
        self.first: torch.Tensor | None = None
        self.step_bad = torch.zeros((), dtype=torch.bool, device=acc.device)
        self.run = torch.zeros((), dtype=torch.long, device=acc.device)
        self.worst = torch.zeros((), dtype=torch.long, device=acc.device)
        self.attempts = 0
        self.history: deque[tuple[int, float]] = deque(maxlen=12)
        self.scale = acc.scaler.get_scale() if acc.scaler is not None else None
        if self.scale is not None:
            self.history.append((0, self.scale))

    def see_loss(self, loss: torch.Tensor) -> None:
        loss = loss.detach()
        self.step_bad |= ~torch.isfinite(loss)
        self.window_sum += loss.float()
        self.window_n += 1
        if self.first is None and self.st is not None and self.st.initial_loss is None:
            self.first = loss.float().clone()

    def check_loss(self, step: int) -> None:
        """The window since the last call against the initial loss (one host sync; at logging points and
        checkpoints)."""
        if self.st is None or not self.window_n:
            return
        window = float(self.acc.reduce(self.window_sum, reduction="mean")) / self.window_n
        self.window_sum.zero_()
        self.window_n = 0
        if self.st.initial_loss is None and self.first is not None:
            self.st.initial_loss = float(self.acc.reduce(self.first, reduction="mean"))
        ratio, initial = self.p.max_loss_ratio, self.st.initial_loss
        if ratio and initial is not None and math.isfinite(window) and math.isfinite(initial) \
                and window > ratio * abs(initial):
            self.fail(step, f"the loss exploded: {window:.4g} over the last steps, more than precision.max_loss_ratio="
                            f"{ratio:g} x the initial loss {initial:.4g}")

    def end_step(self, step: int) -> None:
        """After each optimizer step attempt (applied or skipped)."""
        self.attempts += 1
        self.run = torch.where(self.step_bad, self.run + 1, torch.zeros_like(self.run))
        self.worst = torch.maximum(self.worst, self.run)
        self.step_bad.zero_()
        if self.scale is not None:
            scale = self.acc.scaler.get_scale()
            if scale != self.scale:
                self.history.append((step, scale))
                self.scale = scale
            if scale < self.p.min_scale:
                self.fail(step, f"the fp16 loss scale collapsed to {scale:g}, below precision.min_scale="
                                 f"{self.p.min_scale:g}")
        if self.attempts % self.p.max_consecutive_nonfinite == 0:
            self.check(step)

    def check(self, step: int) -> None:
        worst = int(self.acc.reduce(self.worst, reduction="max"))
        if worst >= self.p.max_consecutive_nonfinite:
            self.fail(step, f"the loss was not finite for {worst} optimizer steps in a row "
                             f"(precision.max_consecutive_nonfinite={self.p.max_consecutive_nonfinite})")

    def fail(self, step: int, what: str) -> None:
        history = ", ".join(f"step {s}: {v:g}" for s, v in self.history) or "n/a (no loss scaling)"
        last = self.last_checkpoint()
        if last is not None:
            m = checkpointing.manifest(last)
            kept = (f"The last checkpoint, {last} (step {m['step']}, loss {m.get('loss', float('nan')):.4g}), "
                    "passed these checks and is intact; resume from it with a fix: "
                    f"checkpoint.resume={last} checkpoint.allow_config_change=true.")
        else:
            kept = "There is no checkpoint of this run to go back to."
        raise TrainingDiverged(
            f"training diverged at step {step}: {what}.\n"
            f"  loss-scale history: {history}\n"
            "  likely fixes: precision=bf16 (fp32's range, no loss scaling); a lower optim.lr or more "
            "scheduler.warmup_steps; trainer.max_grad_norm=1.0; for fp16 a smaller precision.init_scale.\n"
            f"  No checkpoint was written from these weights. {kept}"
        )


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


def fit(loop: Loop) -> TrainState:
    with preemption_signals() as preempt:
        return _fit(loop, preempt)


def _fit(loop: Loop, preempt: dict) -> TrainState:
    acc, model, opt, sched, st = loop.accelerator, loop.model, loop.optimizer, loop.scheduler, loop.state
    tr, ck = loop.cfg.trainer, loop.cfg.checkpoint
    meters = Meters(acc)
    guard = Guard(acc, loop.cfg.precision, st, lambda: loop.last_checkpoint)
    window_loss = torch.zeros((), device=acc.device)
    window_batches, window_skipped = 0, 0
    grad_norm = None

    deadline = None if tr.max_minutes is None else time.monotonic() + 60 * tr.max_minutes

    model.train()
    loop.tracker.advance(st.step)
    while st.step < loop.max_steps:
        batches = loop.train_dl
        if st.batch_in_epoch:  # resuming mid-epoch: jump over consumed batches without loading them
            batches = acc.skip_first_batches(loop.train_dl, st.batch_in_epoch)
        batches.set_epoch(st.epoch)  # the epoch's data order (a fresh skip loader would say epoch 0)
        for batch in batches:
            with acc.accumulate(model):
                loss = model(**batch).loss
                acc.backward(loss)
                if acc.sync_gradients:
                    # Unscales fp16 gradients first; inf/NaN when the step overflowed. Without clipping
                    # the norm is only computed on steps that are logged.
                    if tr.max_grad_norm > 0:
                        grad_norm = acc.clip_grad_norm_(model.parameters(), tr.max_grad_norm)
                    elif (st.step + 1) % tr.log_every == 0:
                        grad_norm = acc.clip_grad_norm_(model.parameters(), float("inf"))
                opt.step()
                opt.zero_grad(set_to_none=True)
            st.batch_in_epoch += 1
            window_loss += loss.detach().float()
            window_batches += 1
            guard.see_loss(loss)
            meters.count(batch)
            if not acc.sync_gradients:
                continue
            skipped = opt.step_was_skipped
            if skipped:  # fp16 overflow: no update, so no scheduler step and no step count
                st.skipped += 1
                window_skipped += 1
            guard.end_step(st.step)
            if skipped:
                continue
            sched.step()
            st.step += 1
            loop.tracker.advance()

            if st.step % tr.log_every == 0 or st.step == loop.max_steps:
                meters.fold(st)
                _close_window(st, acc, window_loss, window_batches)
                values = dict(
                    loss=st.last_loss,
                    lr=sched.get_last_lr()[0],
                    epoch=st.epoch + st.batch_in_epoch / len(loop.train_dl),
                    samples_per_second=st.samples / max(st.train_seconds, 1e-9),
                    tokens_per_second=st.tokens / max(st.train_seconds, 1e-9),
                    skipped_steps=st.skipped,
                    skipped_in_window=window_skipped,
                )
                if grad_norm is not None:
                    values["grad_norm"] = float(grad_norm)
                if guard.scale is not None:
                    values["loss_scale"] = guard.scale
                loop.tracker.log("train", st.step, values)  # NaN and inf are logged as they are
                window_loss.zero_()
                window_batches, window_skipped = 0, 0
                guard.check(st.step)
                guard.check_loss(st.step)
            if tr.eval_every and st.step % tr.eval_every == 0:
                evaluate(loop, meters)
            if ck.every and st.step % ck.every == 0:
                _checkpoint(loop, meters, guard)
            if st.step < loop.max_steps and _preempted(loop, preempt, meters, guard):
                raise Preempted(f"stopped by {preempt['signal']} at step {st.step}; checkpoint written: "
                                f"{loop.last_checkpoint}. Resume: hydra.run.dir={loop.run_dir} "
                                "checkpoint.resume=latest")
            if st.step >= loop.max_steps or _out_of_time(acc, deadline, st.step, tr.log_every):
                break
        else:  # the epoch ran out before max_steps
            st.epoch += 1
            st.batch_in_epoch = 0
            if not tr.eval_every:
                evaluate(loop, meters)
            continue
        break
    meters.fold(st)
    if window_batches:  # the last, partial logging window
        _close_window(st, acc, window_loss, window_batches)
    guard.check(st.step)
    guard.check_loss(st.step)
    st.loss_scale = guard.scale
    if st.eval_step != st.step:
        evaluate(loop, meters)
    return st


def _out_of_time(acc: Accelerator, deadline: float | None, step: int, log_every: int) -> bool:
    """trainer.max_minutes has passed (the slowest rank's clock counts)."""
    return deadline is not None and _any_rank(acc, time.monotonic() > deadline, step, log_every)


def _any_rank(acc: Accelerator, flag: bool, step: int, log_every: int) -> bool:
    """`flag` on any rank, decided alike by all: one process reads its own flag (no device sync); several
    ranks agree at logging points only (one collective per logging interval)."""
    if acc.num_processes == 1:
        return flag
    if step % log_every:
        return False
    return bool(acc.reduce(torch.tensor(flag, device=acc.device), "max"))


def _close_window(st: TrainState, acc: Accelerator, window_loss: torch.Tensor, batches: int) -> None:
    total = float(acc.reduce(window_loss, reduction="mean"))  # the host sync for the loss
    st.loss_sum += total
    st.loss_batches += batches
    st.last_loss = total / batches


def evaluate(loop: Loop, meters: Meters) -> dict[str, float]:
    meters.fold(loop.state)  # evaluation time is not training time
    results = loop.evaluate()
    loop.state.eval_step, loop.state.eval_results = loop.state.step, results
    loop.tracker.log("eval", loop.state.step, results)
    meters.restart()
    return results


def _checkpoint(loop: Loop, meters: Meters, guard: Guard) -> None:
    meters.fold(loop.state)
    st, ck = loop.state, loop.cfg.checkpoint
    guard.check(st.step)
    guard.check_loss(st.step)
    if not weights_finite(loop.model, loop.accelerator):  # never overwrite good checkpoints with broken weights
        guard.fail(st.step, "the weights are not finite at a checkpoint")
    metric = None
    if ck.keep_best or ck.export_best:  # rank checkpoints by an evaluation at this very step
        if st.eval_step != st.step:
            evaluate(loop, meters)
        name = ck.metric or loop.cfg.task.main_metric
        metric = {"name": name, "value": st.eval_results[name]}
    info = dict(epoch=st.epoch, batch_in_epoch=st.batch_in_epoch, loss=st.last_loss, metric=metric)
    loop.last_checkpoint = checkpointing.save(
        loop.accelerator, loop.run_dir, st.step, info, st.state_dict(), to_plain(loop.cfg),
        loop.accelerator.unwrap_model(loop.model).config, ck.keep_last, ck.keep_best,
        metric_mode(ck.metric or loop.cfg.task.main_metric, ck.mode), parent=loop.last_checkpoint,
        scheduler=loop.scheduler)
    meters.restart()


@contextmanager
def preemption_signals():
    """Turn SIGTERM and SIGUSR1 into a flag the loop reads at step boundaries (main thread only)."""
    flag = {"signal": None}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        flag["signal"] = signal.Signals(signum).name
        log.warning("%s received: will checkpoint at the next step boundary and exit", flag["signal"])

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _preempted(loop: Loop, flag: dict, meters: Meters, guard: Guard) -> bool:
    st = loop.state
    requested = _any_rank(loop.accelerator, flag["signal"] is not None, st.step, loop.cfg.trainer.log_every)
    saved = loop.last_checkpoint is not None and loop.last_checkpoint.name == f"step_{st.step}"
    if requested and not saved:  # a checkpoint step already saved this step
        _checkpoint(loop, meters, guard)
    return requested
