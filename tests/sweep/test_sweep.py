"""ampft.sweep: the Optuna study's direction and failure budget from the recipe's config, and a value Optuna
cannot rank told to the real plugin as a failed trial. (Sweeps of real fine-tuning runs: tests/e2e/test_sweep.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from ampft.sweep import SweepSummary
from tests.helpers import ROOT, compose_config


def _started(tmp_path, *overrides: str):
    cfg = compose_config("finetune", [f"hydra.sweep.dir={tmp_path}", *overrides], return_hydra_config=True)
    SweepSummary().on_multirun_start(config=cfg)
    return cfg.hydra.sweeper


@pytest.mark.parametrize("metric,direction", [("accuracy", "maximize"), ("f1", "maximize"),
                                              ("loss", "minimize"), ("validation/error", "minimize")])
def test_the_study_direction_follows_the_main_metric(tmp_path, metric, direction):
    sweeper = _started(tmp_path, "hydra/sweeper=optuna", f"task.main_metric={metric}")
    assert sweeper.direction == direction
    assert sweeper.max_failure_rate == 1.0  # a failed trial does not end the study


def test_what_the_command_line_sets_wins(tmp_path):
    sweeper = _started(tmp_path, "hydra/sweeper=optuna", "hydra.sweeper.direction=minimize",
                       "hydra.sweeper.max_failure_rate=0.5")
    assert sweeper.direction == "minimize" and sweeper.max_failure_rate == 0.5


def test_hydras_own_sweeper_is_left_as_it_is(tmp_path):
    assert dict(_started(tmp_path)) == dict(compose_config("finetune", return_hydra_config=True).hydra.sweeper)


APP = """
import math
import hydra
from hydra.core.hydra_config import HydraConfig
import ampft.errors

@hydra.main(version_base="1.3", config_path=".", config_name="app")
@ampft.errors.exit_on_error
def main(cfg):
    job = HydraConfig.get().job.num
    if cfg.fail == "data" and job == 2 or cfg.fail == "all" and job == 1:
        raise ampft.errors.DataError(f"job {job}: no such data")
    if cfg.fail == "all" and job == 2:
        raise ampft.errors.TrainingDiverged("job 2: the loss is nan")
    if cfg.fail == "all" and job == 3:
        raise KeyError("a bug")
    return math.nan if job == 1 and cfg.fail == "data" else cfg.x

main()
"""
CONFIG = """
defaults:
  - override hydra/sweeper: ${sweeper}
  - _self_
x: 0
fail: data
task:
  main_metric: accuracy
hydra:
  callbacks:
    sweep_summary:
      _target_: ampft.sweep.SweepSummary
"""


def _sweep(tmp_path, sweeper: str, *overrides: str) -> subprocess.CompletedProcess:
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    (tmp_path / "app.yaml").write_text(textwrap.dedent(CONFIG).replace("${sweeper}", sweeper))
    return subprocess.run([sys.executable, str(tmp_path / "app.py"), "-m", *overrides,
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=ROOT,
                          env={**os.environ, "HYDRA_FULL_ERROR": "0"}, capture_output=True, text=True)


def test_each_job_is_recorded_as_it_ends_and_a_crash_keeps_the_rows(tmp_path):
    """Hydra's own sweeper: a DataError (2) and a TrainingDiverged (3) are recorded with their one-line error
    and the sweep goes on; a job that crashes (a KeyError) is a row too, and the job after it still runs.
    Hydra then ends the sweep with the crash's traceback (exit 1); summary.json is whole."""
    proc = _sweep(tmp_path, "basic", "x=0,1,2,3,4", "fail=all")
    assert proc.returncode == 1, proc.stderr[-3000:]
    jobs = json.loads((tmp_path / "sweep" / "summary.json").read_text())["jobs"]
    assert [(j["job"], j["status"], j["exit_code"], j["error"]) for j in jobs] == [
        (0, "completed", 0, None), (1, "failed", 2, "job 1: no such data"),
        (2, "failed", 3, "job 2: the loss is nan"), (3, "crashed", 1, "KeyError: 'a bug'"), (4, "completed", 0, None)]
    assert [j["value"] for j in jobs] == [0, None, None, None, 4]
    assert [j["overrides"] for j in jobs] == [[f"x={i}", "fail=all"] for i in range(5)]
    assert all(j["run_dir"] == str(tmp_path / "sweep" / str(j["job"])) for j in jobs)
    rows = [x for x in (tmp_path / "sweep" / "summary.md").read_text().splitlines() if x.startswith("| ")]
    assert rows[2].startswith("| 1 | x=1 | failed | 2 |  | ") and rows[2].endswith(" | 1 | job 1: no such data |")
    assert "error: job 1: no such data\nerror: job 2: the loss is nan\n" in proc.stderr
    assert "KeyError: 'a bug'" in proc.stderr  # Hydra's report of the crash, after the last job


def test_a_sweep_of_expected_failures_exits_1_without_a_traceback(tmp_path):
    proc = _sweep(tmp_path, "basic", "x=0,1,2", "fail=all")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "2 of 3 jobs failed (#1 exit 2, #2 exit 3): the sweep exits 1" in proc.stdout + proc.stderr


def test_optuna_counts_a_nan_or_failed_trial_as_failed_and_finishes_the_study(tmp_path):
    """The plugin would end the study on a NaN objective (it tells Optuna the failure with the NaN value, which
    Optuna refuses) or, by its default max_failure_rate=0, on any failed trial."""
    proc = _sweep(tmp_path, "optuna", "x=interval(0, 1)", "hydra.sweeper.n_trials=4")
    sweep = tmp_path / "sweep"
    assert proc.returncode == 1, proc.stderr[-3000:]  # job 2 failed
    jobs = json.loads((sweep / "summary.json").read_text())["jobs"]
    assert [(j["job"], j["status"], j["exit_code"]) for j in jobs] == [
        (0, "completed", 0), (1, "completed", 0), (2, "failed", 2), (3, "completed", 0)]
    out = proc.stdout + proc.stderr
    assert "Failed experiment: accuracy=nan: not a number a sweep can rank" in out
    assert "Failed experiment: job 2: no such data" in out
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())  # the study finished
    best = max(jobs[0]["value"], jobs[3]["value"])  # maximize: accuracy is higher-is-better
    assert result["best_value"] == best and result["best_params"] == {"x": best}
