"""An accuracy run in its own process (`python -m ampft.benchmark.trainer SPEC OUT`, started by
`accuracy.run_isolated`): the spec holds the runner, the arm, its resolved finetune config, its directory and
`profile_steps` (a `profile.StepProfiler` window, under `profile`); the run's record goes to OUT as JSON.
`run_trainer` is the run_glue-style Trainer script (what it shares with ampft: docs/benchmarks/README.md,
"Arms"); its record has `accuracy.run_seed`'s keys.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from ampft.benchmark.accuracy import run_seed
from ampft.benchmark.config import Runner
from ampft.benchmark.profile import StepProfiler
from ampft.config import FinetuneConfig, Padding, Precision
from ampft.models import build_model, load_tokenizer
from ampft.tasks import family_for
from ampft.tasks.classification import texts
from ampft.tracking import peak_memory_bytes


def run_trainer(cfg: DictConfig, out_dir: Path, arm: str) -> dict:
    """A run_glue-style fine-tuning with transformers.Trainer (see the module docstring)."""
    import numpy as np
    import transformers
    from transformers import DataCollatorWithPadding, Trainer, TrainingArguments, default_data_collator

    started = time.perf_counter()
    tr, task, o, sch, precision = cfg.trainer, cfg.task, cfg.optim, cfg.scheduler, cfg.precision.name
    transformers.set_seed(tr.seed)  # as run_glue: before the model (the classifier's initialisation)
    tokenizer = load_tokenizer(cfg.model)
    family = family_for(task.family)
    raw, labels = family.load(task)
    model = build_model(cfg.model, tokenizer, labels, family, precision)
    pad = tr.padding == Padding.max_length
    fields = list(task.text_fields)

    def preprocess(batch):
        enc = tokenizer(*texts(batch, fields), padding="max_length" if pad else False, max_length=task.max_length,
                        truncation=True)
        enc["length"] = [sum(m) for m in enc["attention_mask"]]
        return enc

    data = {s: raw[s].map(preprocess, batched=True) for s in ("train", "validation")}
    fp16, bf16 = precision == Precision.fp16, precision == Precision.bf16
    collator = (default_data_collator if pad  # run_glue rounds to multiples of 8 under --fp16 only
                else DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if fp16 else None))
    cpu = tr.cpu or not torch.cuda.is_available()
    args = TrainingArguments(
        output_dir=str(out_dir / "trainer"), per_device_train_batch_size=tr.batch_size,
        per_device_eval_batch_size=tr.eval_batch_size or 2 * tr.batch_size, gradient_accumulation_steps=tr.grad_accum,
        learning_rate=o.lr, weight_decay=o.weight_decay, adam_beta1=o.betas[0], adam_beta2=o.betas[1],
        adam_epsilon=o.eps, max_grad_norm=tr.max_grad_norm, num_train_epochs=tr.epochs, max_steps=tr.max_steps,
        lr_scheduler_type=sch.name.value, warmup_steps=sch.warmup_steps if sch.warmup_steps > 0 else sch.warmup_ratio,
        seed=tr.seed, bf16=bf16, fp16=fp16, tf32=None if precision == Precision.fp32 else precision == Precision.tf32,
        use_cpu=cpu, logging_steps=tr.log_every, save_strategy="no", eval_strategy="no", report_to="none",
        disable_tqdm=True, train_sampling_strategy="group_by_length" if tr.group_by_length else "random",
        length_column_name="length", torch_compile=bool(tr.compile),
    )
    trainer = Trainer(model=model, args=args, train_dataset=data["train"], eval_dataset=data["validation"],
                      data_collator=collator, processing_class=tokenizer,
                      compute_metrics=lambda p: {"accuracy": float((np.argmax(p.predictions, -1) == p.label_ids)
                                                                   .mean())})
    ran = trainer.accelerator.mixed_precision  # what the Trainer will autocast to: "no", "bf16" or "fp16"
    if ran != (precision.value if fp16 or bf16 else "no"):
        raise RuntimeError(f"precision={precision.value}, but the Trainer set up mixed_precision={ran}")
    setup_seconds = time.perf_counter() - started
    train = trainer.train().metrics
    ev = trainer.evaluate()
    epochs = float(train.get("epoch", tr.epochs))
    tokens = sum(data["train"]["length"]) * epochs
    device = trainer.args.device
    peak, peak_kind = peak_memory_bytes(device)
    curve = [[h["step"], h["loss"], h["learning_rate"]] for h in trainer.state.log_history if "loss" in h]
    evals = {k.removeprefix("eval_"): v for k, v in ev.items() if k in ("eval_accuracy", "eval_loss")}
    return dict(
        arm=arm, seed=tr.seed, runner=Runner.trainer.value, run_dir=str(out_dir / "trainer"),
        precision_requested=precision.value, main_metric=task.main_metric, diverged=False, error=None,
        metric=evals.get(task.main_metric), loss_scale_trace=[], eval_curve=[], train_loss=train["train_loss"],
        train_loss_last=curve[-1][1] if curve else None, skipped_steps=None, loss_scale_final=None,
        train_samples_per_second=train["train_samples_per_second"],
        train_tokens_per_second=tokens / train["train_runtime"], train_seconds=train["train_runtime"],
        setup_seconds=setup_seconds, steps=trainer.state.global_step, epochs=epochs, eval=evals, loss_curve=curve,
        attn_implementation=model.config._attn_implementation, device=str(device), precision=precision.value,
        peak_memory_bytes=peak, peak_memory_kind=peak_kind,
    )


def main(spec_path: str, out_path: str) -> None:
    """The child's side of the protocol: run the arm the spec describes, write its measurements to out_path."""
    spec = json.loads(Path(spec_path).read_text())
    cfg = OmegaConf.merge(OmegaConf.structured(FinetuneConfig), OmegaConf.create(spec["cfg"]))
    out_dir = Path(spec["out_dir"])
    steps = spec.get("profile_steps")
    with StepProfiler(steps) if steps else contextlib.nullcontext() as prof:
        if Runner(spec["runner"]) == Runner.trainer:
            result = run_trainer(cfg, out_dir, spec["arm"])
        else:
            result = run_seed(cfg, out_dir / "run", spec["arm"], cfg.trainer.seed)
    if prof is not None:
        result["profile"] = prof.save(out_dir)
    Path(out_path).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main(*sys.argv[1:3])
