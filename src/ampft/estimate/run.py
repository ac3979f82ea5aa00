"""`make estimate`: compose → check → trace each precision's step on fake tensors → memory, time, verdicts."""

from __future__ import annotations

import dataclasses
import logging
import time

import torch
from omegaconf import DictConfig, OmegaConf

from ampft import devices
from ampft.config import Backend, Precision
from ampft.devices import HF_ANCHOR, MEMORY_CLAIM, NVIDIA_ANCHOR, SLACK, TENSOR_CORE_SPEEDUP, TIME_CLAIM
from ampft.estimate import memory
from ampft.estimate import time as timing
from ampft.estimate.config import check
from ampft.estimate.trace import StepTrace, fake_batch, fake_mode, trace_step
from ampft.finetune import build_optimizer
from ampft.models import build_model, load_tokenizer
from ampft.tasks import family_for
from ampft.validation import validate

log = logging.getLogger(__name__)

# StepTrace fields copied into estimate.json (`seconds` follows, rounded).
TRACE_FIELDS = ("params", "weights", "gradients", "optimizer_state", "saved_activations", "saved_weight_casts",
                "saved_by_dtype", "flops", "checkpointed_layers")


def _labels(task: DictConfig) -> tuple[list[str] | None, str]:
    n = family_for(task.family).typical_label_count
    if n is None:  # regression, QA: no label set
        return None, ""
    if task.labels is not None:
        return [str(x) for x in task.labels], ""
    return [str(i) for i in range(n)], (f"task.labels is unset (the labels come from the data): estimated with {n} "
                                        "labels; the head is a negligible part of the model")


def trace_all(cfg: DictConfig, precisions: list[str], target: str) -> tuple[dict[str, StepTrace], list[str]]:
    """({precision: StepTrace} of the recipe's step, notes). tf32 reuses fp32's trace: the same dtypes."""
    m = OmegaConf.merge(cfg.model, {"pretrained": False})  # the architecture is all an estimate needs
    tokenizer = load_tokenizer(m)
    labels, note = _labels(cfg.task)
    notes = [note] if note else []
    family = family_for(cfg.task.family)
    # A pretrained run has the checkpoint's vocabulary (model.arch.vocab_size where it differs from the offline
    # tokenizer's: cased BERT, RoBERTa, DeBERTa-v3), random init the tokenizer's.
    vocab = cfg.model.arch.get("vocab_size") if cfg.model.pretrained else None
    with (mode := fake_mode()):
        model = build_model(m, tokenizer, labels, family, Precision.fp32, torch.device("cpu"), vocab)
        batch = fake_batch(family, int(cfg.trainer.batch_size), int(cfg.task.max_length), model.config.vocab_size)
    if model.config.problem_type is None and model.config.num_labels > 1 and cfg.task.family == "classification":
        # What BERT's forward sets from integer labels. Without it DeBERTa-v2 picks the labelled rows with nonzero(),
        # whose shape depends on the values: a fake tensor has none (the same loss on real labels, all >= 0).
        model.config.problem_type = "single_label_classification"
    if model.config._attn_implementation != "sdpa":
        notes.append(f"attention traced as {model.config._attn_implementation}")
    elif target == "cuda" and cfg.model.attn_implementation == "auto":
        notes.append("model.attn_implementation=auto: traced with SDPA (memory-efficient kernel); FlashAttention-2, "
                     "chosen on Ampere+ GPUs in fp16/bf16 where flash-attn is installed, keeps the same tensors")
    device = torch.device(target)
    traced = {}  # by the precision traced: tf32 runs fp32's dtypes
    for p in precisions:
        if (t := "fp32" if p == "tf32" else p) not in traced:
            deepspeed_half = cfg.distributed.backend == Backend.deepspeed and memory.deepspeed_half(cfg, p)
            scaling = p == "fp16" and not deepspeed_half
            traced[t] = trace_step(model, batch, t, target, lambda mod, s=scaling: build_optimizer(
                mod, cfg.optim, device, s), float(cfg.trainer.max_grad_norm), mode)
            log.info("traced %s: %.1f s", p, traced[t].seconds)
    return {p: dataclasses.replace(traced["fp32" if p == "tf32" else p], precision=p) for p in precisions}, notes


def _at_anchor(cfg: DictConfig, anchor: dict) -> bool:
    """Whether the recipe is the published figure's model, sequence length and batch size."""
    return (cfg.model.name == anchor["model"] and int(cfg.task.max_length) == anchor["seq_len"]
            and int(cfg.trainer.batch_size) == anchor["batch_size"])


def verdicts(rows: dict, dev: devices.Device, cfg: DictConfig) -> list[dict]:
    """Each seed claim, judged on the predictions for this device and recipe (holds: None for not applicable)."""
    out, base = [], "fp32" in rows

    def add(claim, holds, predicted="", note=""):
        verdict = "not applicable" if holds is None else "holds" if holds else "does not hold"
        out.append(dict(claim=claim, verdict=verdict, predicted=predicted, note=note))

    sec = {p: r["time"]["seconds"] for p, r in rows.items() if r["time"]}
    peak = {p: r["memory"]["single"]["peak"] for p, r in rows.items()}
    mixed = [p for p, r in rows.items() if p in ("fp16", "bf16") and r["supported"]] if base else []
    if not mixed:
        add("Mixed precision trains in about 60% of FP32's time, with about 57% of its memory", None, "",
            "needs fp32 and fp16/bf16 in estimate.precisions on a device that runs them")
    cpu_note = "the claim is about GPUs; on this CPU for the record" if dev.kind == "cpu" else ""
    for p in mixed:
        t, mem = sec[p] / sec["fp32"], peak[p] / peak["fp32"]
        add(f"Mixed precision ({p}) trains in about 60% of FP32's time", t <= TIME_CLAIM + SLACK,
            f"{t:.0%} of true fp32's time", cpu_note)
        add(f"Mixed precision ({p}) needs about 57% of FP32's memory", mem <= MEMORY_CLAIM + SLACK,
            f"{mem:.0%} of fp32's peak",
            cpu_note or "weights, gradients and AdamW state stay fp32 under autocast; only activations shrink")
        add(f"BERT fine-tuning in {p}: about 2x faster with half the memory", t <= 0.5 + SLACK and mem <= 0.5 + SLACK,
            f"{1 / t:.2f}x faster, {mem:.0%} memory")
    for p in ("tf32", "fp16", "bf16") if base else ():
        if (r := rows.get(p)) is None:
            continue
        claim = f"Tensor Cores ({p}) give 1.5-3x FP32's throughput"
        if dev.kind == "cpu":
            add(claim, None, "", "a CPU has no Tensor Cores")
        elif r["time"] is None or r["time"]["runs_as"] != p:
            add(claim, None, "", f"{dev.label} has no {p} Tensor Core path")
        else:
            s = sec["fp32"] / sec[p]
            add(claim, s >= TENSOR_CORE_SPEEDUP[0], f"{s:.2f}x",
                "more than the claimed 3x: true fp32 runs on CUDA cores" if s > TENSOR_CORE_SPEEDUP[1] else "")
    nv = NVIDIA_ANCHOR
    if dev.name == "a100-80gb" and _at_anchor(cfg, nv) and "tf32" in rows and "fp16" in rows:
        a, b = rows["tf32"]["time"]["samples_per_second"], rows["fp16"]["time"]["samples_per_second"]
        add("NVIDIA: BERT-large SQuAD, one A100-80GB, 32 x 384: TF32 61.5, FP16 110.5 sequences/s (1.79x)",
            b / a >= 0.8 * nv["fp16"] / nv["tf32"], f"TF32 {a:.1f}, FP16 {b:.1f} sequences/s ({b / a:.2f}x)",
            "the efficiency factor is calibrated on these two points, so this is a consistency check, not a test")
    if dev.name.startswith("v100") and _at_anchor(cfg, HF_ANCHOR) and "fp16" in rows and base:
        s, saving = sec["fp32"] / sec["fp16"], 1 - peak["fp16"] / peak["fp32"]
        add("Hugging Face: bert-large, seq 512, batch 4, one V100: fp16 2.1x fp32 throughput, 7% less memory",
            s >= 0.8 * HF_ANCHOR["speedup"], f"{s:.2f}x, {saving:.0%} less memory")
    return out


def estimate(cfg: DictConfig, command: str = "") -> dict:
    """Everything `make estimate` reports, as plain data (estimate.json)."""
    started = time.perf_counter()
    e = cfg.estimate
    check(e)
    # The recipe's own checks, as on a machine without a GPU: this machine's GPU (if any) is not the one estimated,
    # so its hardware warnings (fp16 on CPU, no TF32 here) are left out.
    local = cfg.copy()
    local.trainer.cpu = True
    warnings = [w for w in validate(local) if not w.startswith(("precision=fp16 on CPU", "precision=tf32:"))]
    dev = timing.measure_cpu() if e.gpu == "cpu" else devices.GPUS[e.gpu]
    precisions = [Precision(p).value for p in (e.precisions or Precision)]
    traces, notes = trace_all(cfg, precisions, dev.kind)
    d = cfg.distributed
    world = int(d.num_processes) * int(d.num_machines)
    ranks = int(e.ranks or (world if world > 1 else 8))
    # What a GPU holds beyond the step's allocated peak (the estimate.* keys; nothing on a CPU): the CUDA context,
    # workspaces, and the allocator's slack, a fraction of the peak.
    over = {k: float(e[k]) for k in ("cuda_context_gib", "workspace_mib", "allocator_overhead")}
    fixed, slack = (over["cuda_context_gib"] * memory.GIB + over["workspace_mib"] * 2**20,
                    over["allocator_overhead"]) if dev.kind == "cuda" else (0.0, 0.0)
    usable = (dev.memory_gib * memory.GIB - fixed) / (1 + slack)
    rows = {}
    for p, tr in traces.items():
        mem = {s: memory.breakdown(tr, s, cfg, ranks) for s in memory.STRATEGIES}
        for b in mem.values():
            b.update(device_total=b["peak"] * (1 + slack) + fixed, fits=b["peak"] <= usable,
                     largest_batch=memory.largest_batch(tr, b, usable))
        t = timing.predict(tr, p, dev, e.efficiency)
        rows[p] = dict(precision=p, supported=t is not None, memory=mem, time=t,
                       trace={**{k: getattr(tr, k) for k in TRACE_FIELDS}, "seconds": round(tr.seconds, 2)})
        if t is None:
            notes.append(f"{dev.label} has no {p} support: its memory is shown, no time")
    if (n := int(cfg.trainer.grad_accum)) > 1:
        notes.append(f"trainer.grad_accum={n}: step ms is one micro-batch of {cfg.trainer.batch_size} and an "
                     f"optimizer step, and samples/s is from it; the run takes {n} micro-batches per optimizer "
                     "step, so its samples/s is a little higher")
    chosen = {Backend.single: "single", Backend.ddp: "ddp", Backend.fsdp: "fsdp2"}.get(
        Backend(d.backend), f"zero{d.zero_stage}" if d.zero_stage else "ddp")
    return dict(
        command=command, model=cfg.model.name, task=cfg.task.name, family=cfg.task.family,
        batch_size=int(cfg.trainer.batch_size), seq_len=int(cfg.task.max_length),
        grad_accum=int(cfg.trainer.grad_accum), precision=Precision(cfg.precision.name).value,
        precisions=precisions, strategy=chosen, ranks=ranks,
        gradient_checkpointing=bool(cfg.model.gradient_checkpointing),
        device=dataclasses.asdict(dev), usable_bytes=usable, overheads=over,
        efficiency=(rows[precisions[0]]["time"] or {}).get("efficiency"), calibration=timing.CALIBRATION,
        rows=rows, verdicts=verdicts(rows, dev, cfg), notes=notes, warnings=warnings,
        seconds=round(time.perf_counter() - started, 1), torch=torch.__version__,
    )


def predict_arms(cfgs: dict[str, DictConfig], env: dict) -> dict[str, dict]:
    """For `make benchmark` reports: each speed arm's predicted step time (and peak allocated on a GPU) on the device
    the benchmark ran on, next to what it measured. An arm that cannot be predicted is left out, with a warning."""
    cuda = env.get("device_type") == "cuda"
    dev = devices.for_cuda_name(env.get("device_name", "")) if cuda else timing.measure_cpu()
    if dev is None:
        log.warning("no prediction next to the measurements: %s is not in ampft.devices", env.get("device_name"))
        return {}
    out = {}
    for arm, cfg in cfgs.items():
        p = Precision(cfg.precision.name).value
        try:
            tr = trace_all(cfg, [p], dev.kind)[0][p]
        except Exception as exc:  # a prediction must never cost the measurement
            log.warning("no prediction for arm %s: %s", arm, exc)
            continue
        t = timing.predict(tr, p, dev)
        out[arm] = dict(device=dev.label, step_seconds=t and t["seconds"],
                        peak_bytes=memory.breakdown(tr, "single", cfg, 1)["peak"] if dev.kind == "cuda" else None)
    return out

