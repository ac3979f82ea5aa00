"""Speed/memory mode: `ampft.engine.train_step` (the function `fit` calls) timed on synthetic batches of exactly
`seq_len` tokens from the benchmark seed (every arm the same data), each arm built by `ampft.finetune.build` as a
real run would be (docs/benchmarks/README.md#modes). Memory: on CUDA the allocator's peak allocated and reserved
bytes; on CPU the peak resident set size (VmHWM).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import inspect
import logging
import math
import re
import statistics
import time
from pathlib import Path

import torch
from accelerate.utils.memory import clear_device_cache
from omegaconf import DictConfig

from ampft.benchmark.config import BenchmarkConfigError
from ampft.benchmark.flops import model_flops_per_token
from ampft.engine import Training, train_step
from ampft.finetune import build, reset_accelerate
from ampft.tasks.base import Family
from ampft.tracking import peak_memory_bytes

log = logging.getLogger(__name__)


def synthetic_batches(n: int, batch_size: int, seq_len: int, vocab_size: int, family: Family, num_labels: int,
                      seed: int, device: torch.device, token_type_ids: bool = True) -> list[dict]:
    """n batches of random ids (from the ordinary vocabulary range) and random targets in the task family's shapes
    (a label per sequence or per token, a value, answer positions), deterministic in `seed`."""
    g = torch.Generator().manual_seed(seed)
    low = 1000 if vocab_size > 2000 else 1  # above BERT's [PAD]/[unused]/special ids
    ones = torch.ones(batch_size, seq_len, dtype=torch.long)
    targets = family.fake_targets(batch_size, seq_len)  # zeros in the loss's shapes and dtypes
    high = dict(labels=num_labels)  # answer positions: anywhere in the sequence

    def batch() -> dict:
        ids = torch.randint(low, vocab_size, (batch_size, seq_len), generator=g)
        return dict(input_ids=ids, attention_mask=ones, **{
            k: torch.rand(t.shape, generator=g) if t.is_floating_point()
            else torch.randint(0, high.get(k, seq_len), t.shape, generator=g) for k, t in targets.items()},
            **({"token_type_ids": torch.zeros_like(ones)} if token_type_ids else {}))

    return [{k: v.to(device) for k, v in batch().items()} for _ in range(n)]


# --- memory ---------------------------------------------------------------------------------------

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> bool:
    """Start a new peak-memory window; False where the CPU peak cannot be reset (it is then the process's)."""
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        return True
    with contextlib.suppress(OSError):  # Linux: "5" resets the peak RSS (VmHWM) to the current RSS
        Path("/proc/self/clear_refs").write_text("5")
        return True
    return False


def memory_peak(device: torch.device) -> dict[str, int | None]:
    if device.type == "cuda":
        _sync(device)
        return dict(peak_allocated_bytes=torch.cuda.max_memory_allocated(device),
                    peak_reserved_bytes=torch.cuda.max_memory_reserved(device))
    with contextlib.suppress(OSError):
        status = Path("/proc/self/status").read_text()
        return dict(peak_rss_bytes=int(re.search(r"^VmHWM:\s+(\d+)", status, re.MULTILINE)[1]) * 1024)
    return dict(peak_rss_bytes=peak_memory_bytes(device)[0])  # not Linux: the process's peak


def free(device: torch.device) -> None:
    """Drop garbage and hand cached memory back (on CPU glibc's, which would count in the next arm's RSS)."""
    clear_device_cache(garbage_collection=True)
    if device.type == "cpu":
        with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
            ctypes.CDLL("libc.so.6").malloc_trim(0)


# --- one arm --------------------------------------------------------------------------------------

def _run_steps(training: Training, batches: list[dict]) -> tuple[list[float], list[torch.Tensor], int]:
    """One optimizer step a batch (speed mode has trainer.grad_accum=1), timed between device synchronisations:
    (seconds, losses, steps the fp16 loss scaler skipped)."""
    t, device = training, training.accelerator.device
    seconds, losses, skipped = [], [], 0
    for batch in batches:
        _sync(device)
        tic = time.perf_counter()
        step = train_step(t.accelerator, t.model, t.optimizer, t.scheduler, batch, t.cfg.trainer.max_grad_norm)
        _sync(device)
        seconds.append(time.perf_counter() - tic)
        losses.append(step.loss)
        skipped += int(step.skipped)
    return seconds, losses, skipped


def is_oom(exc: BaseException) -> bool:
    """CUDA out of memory, whether torch raised OutOfMemoryError or a library (cuBLAS) failed to allocate."""
    return isinstance(exc, torch.cuda.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and ("out of memory" in str(exc) or "ALLOC_FAILED" in str(exc)))


def sweep_batch_sizes(try_size, batch_sizes: list[int], until_oom: bool, max_batch_size: int) -> list[dict]:
    """Each listed batch size in order, then (until_oom) the last one doubled up to max_batch_size, until one does
    not fit. try_size(bs) returns a measurement dict, or None when out of memory."""
    sizes, points = list(batch_sizes), []
    while sizes:
        bs = sizes.pop(0)
        point = try_size(bs)
        if point is None:
            return points + [dict(batch_size=bs, fits=False)]
        points.append(dict(batch_size=bs, fits=True, **point))
        if not sizes and until_oom and bs * 2 <= max_batch_size:
            sizes.append(bs * 2)
    return points


def _sweep(training: Training, sweep: DictConfig, make_batches, seq_len: int) -> list[dict]:
    """Peak memory per batch size on the arm's own model and optimizer; only CUDA doubles until out of memory
    (a CPU swaps rather than running out cleanly)."""
    device = training.accelerator.device

    def try_size(bs: int) -> dict | None:
        training.optimizer.zero_grad(set_to_none=True)
        free(device)
        reset_peak(device)
        try:
            seconds = _run_steps(training, make_batches(sweep.steps, bs))[0]
        except RuntimeError as exc:
            if not is_oom(exc):
                raise
            seconds = None
        if seconds is None:  # outside the except block, so the traceback's tensors are gone before emptying the cache
            training.optimizer.zero_grad(set_to_none=True)
            free(device)
            log.info("  sweep batch %d: out of memory", bs)
            return None
        point = dict(step_seconds=seconds[-1], tokens_per_second=bs * seq_len / seconds[-1], **memory_peak(device))
        log.info("  sweep batch %d: %s", bs, _fmt_mem(point))
        return point

    return sweep_batch_sizes(try_size, list(sweep.batch_sizes), device.type == "cuda" and sweep.until_oom,
                             sweep.max_batch_size)


def _fmt_mem(m: dict) -> str:
    return ", ".join(f"{k.removesuffix('_bytes')}={v / 2**20:.0f} MiB" for k, v in m.items()
                     if k.endswith("_bytes") and v is not None)


def measure_arm(cfg: DictConfig, run_dir: Path, warmup_steps: int, timed_steps: int, seed: int,
                sweep: DictConfig | None = None, seconds: float | None = None, skippable: bool = False) -> dict:
    """Build one arm, time its steps, measure its memory (and sweep batch sizes); free everything.

    seconds: the arm's share of the time budget (None: no budget). Two pilot steps at a quarter of the batch come
    first (the second timed: the first pays one-time costs) and project a full step, linearly in the batch; a
    `skippable` arm whose warm-up and two timed steps would not fit stops there. Then the warm-up and two timed
    steps (the probe), the further timed steps that fit at the probe's median, and the sweep if it fits in what
    is left."""
    tic = time.perf_counter()
    training, _, ran_precision = build(cfg, Path(run_dir))
    built = time.perf_counter() - tic
    acc, device = training.accelerator, training.accelerator.device
    try:
        model = acc.unwrap_model(training.model)
        requested, bs, seq_len = cfg.precision.name.value, int(cfg.trainer.batch_size), int(cfg.task.max_length)
        make_batches = functools.partial(  # (n, batch_size) -> batches
            synthetic_batches, seq_len=seq_len, vocab_size=model.config.vocab_size, family=training.family,
            num_labels=model.config.num_labels, seed=seed, device=device,
            token_type_ids="token_type_ids" in inspect.signature(model.forward).parameters)
        training.model.train()
        free(device)
        head = dict(precision=ran_precision, precision_requested=requested, batch_size=bs, seq_len=seq_len,
                    pilot_step_seconds=None)
        left = math.inf if seconds is None else seconds - built  # the build counts against the arm's share
        if seconds is not None:
            pilot_bs = max(1, bs // 4)
            pilot = head["pilot_step_seconds"] = _run_steps(training, make_batches(2, pilot_bs))[0][1]
            head["projected_step_seconds"] = pilot * bs / pilot_bs
            log.info("  %s: pilot step (batch %d) %.2f s, a full step projected at %.2f s", requested, pilot_bs, pilot,
                     head["projected_step_seconds"])
            left -= 2 * pilot
            if skippable and (warmup_steps + 2) * head["projected_step_seconds"] > left:
                return dict(head, skipped=True)
        batches = make_batches(warmup_steps + timed_steps, bs)
        peak_reset = reset_peak(device)
        try:
            probe = min(warmup_steps + 2, len(batches))
            times, losses, skipped = _run_steps(training, batches[:probe])
            step = statistics.median(times[warmup_steps:])
            left -= sum(times)
            more = len(batches) - probe if math.isinf(left) else max(0, int(left // step))
            s2, l2, k2 = _run_steps(training, batches[probe:probe + more])
            times, losses, skipped, left = times + s2, losses + l2, skipped + k2, left - sum(s2)
        except RuntimeError as exc:
            if not is_oom(exc):
                raise
            raise BenchmarkConfigError([
                f"arm {requested} ({cfg.model.name}, batch {bs} x {seq_len}) ran out of memory on "
                f"{device}: lower benchmark.batch_size (the memory sweep finds the largest that fits)"]) from None
        peak = memory_peak(device)
        del batches
        result = dict(
            head, attn_implementation=model.config._attn_implementation, model=cfg.model.name,
            pretrained=bool(cfg.model.pretrained), device=str(device), build_seconds=built,
            warmup_step_seconds=times[:warmup_steps], step_seconds=times[warmup_steps:],
            losses=torch.stack(losses).float().tolist(), skipped_steps=skipped,
            loss_scale=acc.scaler.get_scale() if acc.scaler is not None else None,
            memory_peak=peak, peak_window="timed+warmup steps" if peak_reset else "process lifetime (reset not supported)",
            **model_flops_per_token(model, seq_len))
        log.info("  %s: median step %.3f s, %s", requested, statistics.median_high(result["step_seconds"]),
                 _fmt_mem(peak))
        # the sweep's cost projected from the step time, linearly in the batch
        fits = sweep is not None and step * sum(sweep.batch_sizes) / bs * sweep.steps <= left
        result["sweep"] = _sweep(training, sweep, make_batches, seq_len) if fits else []
        return result
    finally:
        training.tracker.close()
        acc.free_memory()
        del training, acc
        reset_accelerate()
        free(device)
