"""One full fine-tuning run (`ampft.finetune.run`) of an arm and seed, read back from the run's summary and
metrics.jsonl (loss curve with the learning rate; fp16: loss-scale trace and skipped steps): accuracy mode's
runs, and the ampft runner of a comparison with the Trainer (`trainer.main`). The Trainer runner returns the
same keys (`trainer.run_trainer`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig

from ampft.engine import TrainingDiverged
from ampft.finetune import run

log = logging.getLogger(__name__)


def read_events(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_seed(cfg: DictConfig, run_dir: Path, arm: str, seed: int) -> dict:
    """Train one (arm, seed); a diverged run is a result (metric None, the error kept), not a crash."""
    run_dir = Path(run_dir)
    error = None
    try:
        summary = run(cfg, run_dir)
    except TrainingDiverged as exc:
        log.warning("arm %s seed %d diverged: %s", arm, seed, str(exc).splitlines()[0])
        summary, error = None, str(exc)
    events = read_events(run_dir)
    train = [e for e in events if e["event"] == "train"]
    main = cfg.task.main_metric
    record = dict(
        arm=arm,
        seed=seed,
        run_dir=str(run_dir),
        precision_requested=cfg.precision.name.value,
        main_metric=main,
        diverged=error is not None,
        error=error,
        loss_curve=[[e["step"], e["loss"], e["lr"]] for e in train],
        loss_scale_trace=[[e["step"], e["loss_scale"]] for e in train if "loss_scale" in e],
        eval_curve=[{k: v for k, v in e.items() if k != "event"} for e in events if e["event"] == "eval"],
    )
    if summary is not None:
        record.update(
            precision=summary["precision"],
            metric=summary["eval"].get(main),
            eval=summary["eval"],
            train_loss=summary["train_loss"],
            train_loss_last=summary["train_loss_last"],
            steps=summary["steps"],
            skipped_steps=summary["skipped_steps"],
            loss_scale_final=summary["loss_scale_final"],
            train_seconds=summary["train_seconds"],
            wall_seconds=summary["wall_seconds"],
            train_samples_per_second=summary["train_samples_per_second"],
            train_tokens_per_second=summary["train_tokens_per_second"],
            **{k: summary[k] for k in ("setup_seconds", "epochs", "attn_implementation", "device",
                                       "peak_memory_bytes", "peak_memory_kind")},
        )
    else:
        record.update(precision=cfg.precision.name.value, metric=None, eval={},
                      skipped_steps=train[-1]["skipped_steps"] if train else None)
    log.info("  %s seed %d: %s=%s, skipped steps %s", arm, seed, main, record["metric"],
             record.get("skipped_steps"))
    return record
