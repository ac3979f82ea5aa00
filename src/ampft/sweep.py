"""A multirun (`python recipes/finetune.py -m ...`) that survives its jobs and says how each one ended:
`SweepSummary`, the Hydra callback of conf/finetune.yaml (`hydra.callbacks`; nothing in a single run). What it
writes and how the sweep exits: docs/architecture.md (`sweep`). An expected failure (an `AmpftError`, which
`ampft.errors.exit_on_error` re-raises inside a sweep) is a row and the sweep goes on; so is a crash.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from ampft import files
from ampft.config import metric_mode
from ampft.errors import AmpftError, EvaluationError, Preempted

log = logging.getLogger(__name__)

# Hydra's own sweeper re-raises, after its batch, the first job that failed, which would end the sweep with a
# traceback; under it a recorded failure is handed on as a completed job without a value. Other sweepers
# (Optuna) are handed the failure itself, so that they can count it as a failed trial.
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
FAILED_EXIT_CODE = 1


def _given(config: DictConfig, key: str) -> bool:
    """Whether `key` was set on the command line, e.g. hydra.sweeper.direction=maximize."""
    return any(o.lstrip("+~").split("=", 1)[0] == key for o in config.hydra.overrides.hydra)


def _one_line(exc: BaseException) -> str:
    """A ConfigError's problems (without the count line); else the first line of the message."""
    problems = getattr(exc, "problems", None)
    text = "; ".join(" ".join(p.split()) for p in problems) if problems else (str(exc).strip().splitlines() or [""])[0]
    return text if isinstance(exc, AmpftError) else f"{type(exc).__name__}: {text}"


class SweepSummary(Callback):
    """Records every job of a multirun in the sweep dir as it ends; see the module docstring."""

    def __init__(self) -> None:
        self.sweep_dir: Path | None = None  # set in a multirun only
        self.rows: list[dict[str, Any]] = []
        self.fixed: list[str] = []  # the overrides every job has (shown once, above the table)
        self.basic = True
        self.started = 0.0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.sweep_dir = Path(config.hydra.sweep.dir).absolute()
        parsed = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
        self.fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
        self.basic = OmegaConf.select(config, "hydra.sweeper._target_") == BASIC_SWEEPER
        sweeper = config.hydra.sweeper
        with read_write(sweeper), open_dict(sweeper):  # before the sweeper is instantiated from it
            if "direction" in sweeper and not _given(config, "hydra.sweeper.direction"):
                sweeper.direction = "maximize" if metric_mode(config.task.main_metric, None) == "max" else "minimize"
            if "max_failure_rate" in sweeper and not _given(config, "hydra.sweeper.max_failure_rate"):
                sweeper.max_failure_rate = 1.0

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.perf_counter()

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if self.sweep_dir is None:
            return
        wall = time.perf_counter() - self.started
        metric = OmegaConf.select(config, "task.main_metric", default="metric")
        row: dict[str, Any] = dict(
            job=config.hydra.job.num, overrides=list(job_return.overrides or []),
            status="completed", exit_code=0, metric=metric, value=None, wall_seconds=round(wall, 3),
            run_dir=config.hydra.runtime.output_dir, error=None, message=None)
        if job_return.status == JobStatus.COMPLETED:
            value = job_return.return_value
            row["value"] = value
            if not self.basic and not (isinstance(value, int | float) and math.isfinite(value)):
                # Optuna cannot rank it (its sweeper would end the study on a NaN): a failed trial.
                job_return.status = JobStatus.FAILED
                job_return.return_value = EvaluationError(f"{metric}={value}: not a number a sweep can rank")
        else:
            exc = job_return._return_value
            expected = isinstance(exc, AmpftError)
            status = ("preempted" if isinstance(exc, Preempted) else "failed") if expected else "crashed"
            row.update(status=status, exit_code=exc.exit_code if expected else 1, error=_one_line(exc),
                       message=str(exc))
            if expected and self.basic:
                job_return.status, job_return.return_value = JobStatus.COMPLETED, None
        self.rows.append(row)
        self._write()
        log.info("job %d %s%s in %.1f s: %s", row["job"], row["status"],
                 f" (exit {row['exit_code']})" if row["exit_code"] else "", wall,
                 row["error"] or f"{metric}={_fmt(row['value'])}")
        if row["status"] == "preempted":
            log.error("sweep stopped at job %d (preempted); resume it with checkpoint.resume=latest "
                      "hydra.run.dir=%s and its overrides; %s", row["job"], row["run_dir"],
                      self.sweep_dir / "summary.md")
            raise SystemExit(Preempted.exit_code)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.sweep_dir is None:
            return
        failed = [r for r in self.rows if r["exit_code"]]
        log.info("sweep summary: %s\n%s", self.sweep_dir / "summary.md", self._table())
        if failed:
            log.error("%d of %d jobs failed (%s): the sweep exits %d", len(failed), len(self.rows),
                      ", ".join(f"#{r['job']} exit {r['exit_code']}" for r in failed), FAILED_EXIT_CODE)
            raise SystemExit(FAILED_EXIT_CODE)

    def _table(self) -> str:
        fixed = {o.split("=", 1)[0] for o in self.fixed}
        rows = []
        for r in self.rows:
            run_dir = Path(r["run_dir"])
            shown = run_dir.relative_to(self.sweep_dir) if run_dir.is_relative_to(self.sweep_dir) else run_dir
            value = "" if r["status"] != "completed" else f"{r['metric']}={_fmt(r['value'])}"
            varying = " ".join(o for o in r["overrides"] if o.split("=", 1)[0] not in fixed)
            rows.append([r["job"], varying, r["status"], r["exit_code"], value, f"{r['wall_seconds']:.1f} s", shown,
                         r["error"] or ""])
        return "\n".join(files.markdown_table(
            ["job", "overrides", "status", "exit", "main metric", "wall time", "run dir", "error"], rows))

    def _write(self) -> None:
        """summary.json and summary.md, each replaced whole; by rank 0 only (`accelerate launch
        recipes/finetune.py -m ...` runs the sweep on every rank)."""
        if int(os.environ.get("RANK", "0")) != 0:
            return
        done = sum(r["status"] == "completed" for r in self.rows)
        head = (f"# Sweep {self.sweep_dir}\n\nCommon overrides: {' '.join(self.fixed) or '(none)'}\n\n"
                f"{len(self.rows)} job(s) so far: {done} completed, {len(self.rows) - done} failed.\n\n")
        data = dict(sweep_dir=str(self.sweep_dir), common_overrides=self.fixed, jobs=self.rows)
        for name, text in (("summary.json", json.dumps(data, indent=2) + "\n"),
                           ("summary.md", head + self._table() + "\n")):
            files.write_atomic(self.sweep_dir / name, text)


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
