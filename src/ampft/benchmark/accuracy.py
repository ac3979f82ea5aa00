"""Accuracy mode's runs, one record per (arm, seed) whoever trains it: `run_seed` (ampft in this process),
`run_isolated` (that run or the Trainer's in its own process, cold tokenization cache, timed from outside), and
`epoch_flops` (an epoch's model FLOPs over the non-padding tokens, for model TFLOP/s and MFU).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ampft.benchmark.config import Runner
from ampft.benchmark.environment import OtherLoad
from ampft.benchmark.flops import training_flops
from ampft.config import to_plain
from ampft.engine import TrainingDiverged
from ampft.finetune import run
from ampft.models import build_model, load_tokenizer
from ampft.tasks import family_for
from ampft.tasks.classification import texts

log = logging.getLogger(__name__)


def run_seed(cfg: DictConfig, run_dir: Path, arm: str, seed: int) -> dict:
    """Train one (arm, seed) with ampft in this process: the loss curve with the learning rate, fp16's loss-scale
    trace; a diverged run is a result (metric None, the error kept), not a crash."""
    run_dir = Path(run_dir)
    error = None
    try:
        summary = run(cfg, run_dir)
    except TrainingDiverged as exc:
        log.warning("arm %s seed %d diverged: %s", arm, seed, str(exc).splitlines()[0])
        summary, error = None, str(exc)
    path = run_dir / "metrics.jsonl"
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    train = [e for e in events if e["event"] == "train"]
    record = dict(
        arm=arm, seed=seed, runner=Runner.ampft.value, run_dir=str(run_dir),
        precision_requested=cfg.precision.name.value, main_metric=cfg.task.main_metric,
        diverged=error is not None, error=error,
        loss_curve=[[e["step"], e["loss"], e["lr"]] for e in train],
        loss_scale_trace=[[e["step"], e["loss_scale"]] for e in train if "loss_scale" in e],
        eval_curve=[{k: v for k, v in e.items() if k != "event"} for e in events if e["event"] == "eval"],
    )
    if summary is not None:
        record.update(metric=summary["eval"].get(cfg.task.main_metric), **{k: summary[k] for k in (
            "precision", "eval", "train_loss", "train_loss_last", "steps", "skipped_steps", "loss_scale_final",
            "train_seconds", "wall_seconds", "train_samples_per_second", "train_tokens_per_second", "setup_seconds",
            "epochs", "attn_implementation", "device", "peak_memory_bytes", "peak_memory_kind")})
    else:
        record.update(precision=cfg.precision.name.value, metric=None, eval={},
                      skipped_steps=train[-1]["skipped_steps"] if train else None)
    log.info("  %s seed %d: %s=%s, skipped steps %s", arm, seed, cfg.task.main_metric, record["metric"],
             record.get("skipped_steps"))
    return record


def run_isolated(arm: DictConfig, cfg: DictConfig, arm_dir: Path, profile_steps: int = 0) -> dict:
    """The parent's side of the protocol: spec.json in, result.json out (`trainer.main`), timed from outside."""
    arm_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ampft-benchmark-cache-") as cache:
        plain = to_plain(cfg)
        plain["cache_dir"] = cache  # a cold tokenization cache: ampft pays for tokenizing, as the Trainer does
        spec = arm_dir / "spec.json"
        spec.write_text(json.dumps(dict(runner=Runner(arm.runner).value, arm=arm.name, cfg=plain, out_dir=str(arm_dir),
                                        profile_steps=profile_steps)))
        out = arm_dir / "result.json"
        env = dict(os.environ, HF_DATASETS_CACHE=str(Path(cache) / "datasets"), TOKENIZERS_PARALLELISM="false")
        with OtherLoad() as load:
            tic = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "ampft.benchmark.trainer", str(spec), str(out)],
                                  env=env, capture_output=True, text=True)
            wall = time.perf_counter() - tic
    (arm_dir / "log.txt").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"arm {arm.name} failed (exit {proc.returncode}); its log: {arm_dir / 'log.txt'}\n{tail}")
    return dict(json.loads(out.read_text()), wall_seconds=wall, other_cpu_share=load.share)


def epoch_flops(cfg: DictConfig) -> tuple[int, float] | None:
    """(training examples, training FLOPs of one epoch over their non-padding tokens) for an arm's config;
    None for a task that is not sequence classification (not counted)."""
    if cfg.task.family != "classification":
        return None
    tokenizer = load_tokenizer(cfg.model)
    family = family_for(cfg.task.family)
    raw, labels = family.load(cfg.task)
    encoded = tokenizer(*texts(raw["train"], list(cfg.task.text_fields)), truncation=True,
                        max_length=cfg.task.max_length)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    shape_only = OmegaConf.merge(cfg.model, {"pretrained": False})  # the parameter count, no weights needed
    model = build_model(shape_only, tokenizer, labels, family)
    return len(lengths), float(training_flops(model, lengths))
