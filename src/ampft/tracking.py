"""What a run reports: metrics.jsonl, Accelerate trackers, the progress bar, summary.json and the printed
summary. Only the main process writes; every value is written as measured (a NaN loss stays NaN)."""

from __future__ import annotations

import json
import logging
import os
import resource
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import accelerate.tracking
import datasets
import torch
import transformers
from accelerate import Accelerator
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ampft import files

log = logging.getLogger(__name__)


def log_with(logger: str) -> str | None:
    """Accelerate's `log_with` for logging.name; None for `none`, or with a warning when the tracker's package
    is missing (Accelerate would drop it without a word)."""
    if logger == "none":
        return None
    if logger not in {str(t) for t in accelerate.tracking.get_available_trackers()}:
        log.warning("logging=%s: the %s package is not installed, so nothing is sent to %s (Accelerate drops a "
                    "tracker whose package is missing, silently); metrics.jsonl and summary.json are written "
                    "as always. Install it (pip install 'ampft[%s]', or pip install %s) or set logging=none.",
                    logger, logger, logger, logger, logger)
        return None
    return logger


def clean_console() -> AbstractContextManager:
    """One console for a run: only rank 0 reports (the other ranks log warnings and errors only, for the rest of
    the recipe's process), log lines go through tqdm (never inside the bar's line), and the only bar is ampft's
    own (datasets' and transformers' bars are off for the rest of the recipe's process)."""
    if int(os.environ.get("RANK", "0")) != 0:
        logging.getLogger().setLevel(logging.WARNING)
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()
    return logging_redirect_tqdm()


def tracker_kwargs(logger: str, run_dir: Path) -> dict[str, dict]:
    """Every output of a run inside its run dir: W&B's files unless WANDB_DIR is set, MLflow's store
    (<run dir>/mlflow.db) unless MLFLOW_TRACKING_URI is set."""
    if logger == "wandb" and "WANDB_DIR" not in os.environ:
        return {"wandb": {"dir": str(Path(run_dir).resolve())}}
    if logger == "mlflow" and "MLFLOW_TRACKING_URI" not in os.environ:
        import mlflow

        mlflow.set_tracking_uri(f"sqlite:///{Path(run_dir).resolve() / 'mlflow.db'}")  # per run: multirun jobs differ
    return {}


def peak_memory_bytes(device: torch.device) -> tuple[int, str]:
    """Peak memory of this process: CUDA allocator peak on GPU, peak resident set size on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_peak_rss"


class Tracker:
    def __init__(self, accelerator: Accelerator, run_dir: Path, logger: str, project: str,
                 hparams: dict[str, Any], total_steps: int, progress_bar: bool, history_until: int,
                 evaluated: bool):
        """`history_until`, `evaluated`: the step training starts from and whether its checkpoint holds that
        step's evaluation (see `trim_history`)."""
        self.accelerator, self.main, self.run_dir = accelerator, accelerator.is_main_process, run_dir
        if logger != "none":  # trackers take numbers, strings and booleans: anything else (lists, None) as its text
            config = {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in hparams.items()}
            accelerator.init_trackers(project, config=config, init_kwargs=tracker_kwargs(logger, run_dir))
        if self.main:
            trim_history(run_dir / "metrics.jsonl", history_until, evaluated)
        self.jsonl = (run_dir / "metrics.jsonl").open("a") if self.main else None
        self.bar = tqdm(total=total_steps, desc="train", dynamic_ncols=True, disable=not (self.main and progress_bar))

    def log(self, event: str, step: int, values: dict[str, Any]) -> None:
        values = {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in values.items()}
        self.accelerator.log({f"{event}/{k}": v for k, v in values.items() if isinstance(v, int | float)}, step=step)
        if event == "train":
            self.bar.set_postfix(loss=f"{values['loss']:.4f}", lr=f"{values['lr']:.2e}", refresh=False)
        if self.main:
            self.jsonl.write(json.dumps({"event": event, "step": step, **values}) + "\n")
            self.jsonl.flush()
            log.info("[%s step %d] %s", event, step, " ".join(f"{k}={_fmt(v)}" for k, v in values.items()))

    def advance(self, n: int = 1) -> None:
        self.bar.update(n)

    def close(self) -> None:
        """Finish the trackers, not the process group (as `accelerator.end_training()` would): the export and
        the summary still need it."""
        self.bar.close()
        if self.main:
            self.jsonl.close()
        for tracker in self.accelerator.trackers:  # none under logging=none
            tracker.finish()


REPLACED = "metrics.replaced.jsonl"


def trim_history(path: Path, step: int, evaluated: bool) -> None:
    """Make metrics.jsonl the history of the run resuming at `step`: entries past it, a torn last line and
    (with `evaluated` false) an evaluation at `step` itself move to metrics.replaced.jsonl, so nothing is
    lost."""
    if not path.is_file():
        return
    keep, moved = [], []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
            entry_step = entry["step"]
        except (ValueError, KeyError, TypeError):
            entry, entry_step = {}, None
        kept = isinstance(entry_step, int) and (entry_step < step or entry_step == step and (
            evaluated or entry.get("event") != "eval"))
        (keep if kept else moved).append(line + "\n")
    if not moved:
        return
    with (path.parent / REPLACED).open("a") as f:  # first: a kill between the two leaves a copy, not a loss
        f.writelines(moved)
        f.flush()
        os.fsync(f.fileno())
    files.write_atomic(path, "".join(keep))
    log.info("%s: %d entries past step %d moved to %s (a replaced timeline)", path, len(moved), step, REPLACED)


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)  # nan and inf as such


def write_summary(run_dir: Path, summary: dict[str, Any]) -> None:
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


def format_summary(summary: dict[str, Any]) -> str:
    ev = ", ".join(f"{k}={_fmt(v)}" for k, v in summary["eval"].items())
    rows = [
        ("run dir", summary["run_dir"]),
        ("precision", f"{summary['precision']} (requested {summary['precision_requested']})"),
        ("validation", ev),
        ("train loss", _fmt(summary["train_loss"])),
        ("steps", f"{summary['steps']} optimizer steps, {summary['epochs']:.2f} epochs"),
        ("throughput", f"{summary['train_samples_per_second']:.1f} samples/s, "
                       f"{summary['train_tokens_per_second']:.0f} tokens/s (non-padding)"),
        ("peak memory", f"{summary['peak_memory_bytes'] / 2**20:.0f} MiB ({summary['peak_memory_kind']})"),
        ("wall time", f"{summary['wall_seconds']:.1f} s (training {summary['train_seconds']:.1f} s)"
         if not summary.get("resumed_from") else  # the training time of the whole line, from step 0
         f"{summary['wall_seconds']:.1f} s since resuming from {Path(summary['resumed_from']).name} (training "
         f"{summary['train_seconds']:.1f} s from step 0)"),
    ]
    early = summary.get("early_stopping")
    if early and early["stopped"]:
        rows.insert(5, ("early stop", f"at step {early['stopped_step']}: {early['metric']} did not improve for "
                                      f"{early['patience']} evaluations; best {_fmt(early['best_value'])} at step "
                                      f"{early['best_step']}"))
    if summary.get("export_dir"):
        rows.append(("model", f"{summary['export_dir']} ({summary['exported']})" if early else summary["export_dir"]))
    width = max(len(k) for k, _ in rows)
    return "\n".join(["== ampft summary =="] + [f"{k:<{width}}  {v}" for k, v in rows])
