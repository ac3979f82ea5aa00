"""Sweeps as users run them (`python recipes/finetune.py -m ...`): a failed job is recorded and the sweep goes
on, <sweep dir>/summary.md and summary.json hold a row per job, the sweep exits 1 when a job failed; the
Optuna sweeper (hydra/sweeper=optuna) maximises the main metric and survives a failed trial."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, TINY

BASE = [o for o in TINY if not o.startswith("optim.lr=")]  # the sweeps choose the learning rate


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)


def _jobs(sweep_dir: Path) -> list[dict]:
    return json.loads((sweep_dir / "summary.json").read_text())["jobs"]


def _check_table(sweep_dir: Path, jobs: list[dict]) -> None:
    """summary.md has one line per job with its overrides, status, exit code, metric, wall time and run dir."""
    lines = [x for x in (sweep_dir / "summary.md").read_text().splitlines() if x.startswith("| ") and "---" not in x]
    assert len(lines) == len(jobs) + 1, lines
    for job, line in zip(jobs, lines[1:], strict=True):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[0] == str(job["job"]) and cells[2] == job["status"] and cells[3] == str(job["exit_code"])
        assert cells[5] == f"{job['wall_seconds']:.1f} s" and cells[6] == Path(job["run_dir"]).name
        if job["status"] == "completed":
            assert cells[4] == f"{job['metric']}={job['value']:.4g}"
        else:
            assert cells[4] == "" and cells[7] == job["error"]


def _check_completed(job: dict) -> None:
    """A completed job's metric is its run's own final evaluation (summary.json in its run dir)."""
    summary = json.loads((Path(job["run_dir"]) / "summary.json").read_text())
    assert job["metric"] == "accuracy" and job["value"] == summary["eval"]["accuracy"]
    assert job["error"] is None and job["wall_seconds"] > 0


@pytest.mark.slow
def test_failed_jobs_are_recorded_and_the_sweep_goes_on(tmp_path):
    """The README's command: lr=nan is a ConfigError (exit 2), lr=1e4 diverges (exit 3); the jobs after them run."""
    proc = _run(["recipes/finetune.py", "-m", "model=tiny-bert", "trainer.max_steps=10", "optim.lr=1e-3,nan,1e4,5e-4",
                 f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 1, proc.stderr[-3000:]
    jobs = _jobs(tmp_path)
    assert [j["job"] for j in jobs] == [0, 1, 2, 3]
    assert [j["status"] for j in jobs] == ["completed", "failed", "failed", "completed"]
    assert [j["exit_code"] for j in jobs] == [0, 2, 3, 0]
    assert [[o for o in j["overrides"] if o.startswith("optim.lr=")] for j in jobs] == [
        ["optim.lr=0.001"], ["optim.lr=nan"], ["optim.lr=10000.0"], ["optim.lr=0.0005"]]
    for job in (jobs[0], jobs[3]):
        _check_completed(job)
    assert jobs[1]["error"] == "optim.lr=nan: must be a finite number > 0, e.g. 3e-5"
    for job in jobs[1:3]:
        assert job["value"] is None and (Path(job["run_dir"]) / ".hydra" / "overrides.yaml").is_file()
        assert not (Path(job["run_dir"]) / "summary.json").exists()
        assert job["error"] and "\n" not in job["error"] and f"error: {job['message']}" in proc.stderr
    _check_table(tmp_path, jobs)
    # each failure said on stderr as a single run says it, and no traceback
    assert "error: 1 problem(s) in the config: optim.lr=nan" in proc.stderr and "Traceback" not in proc.stderr


CRASH_ON_SEED_2 = """
import runpy, sys
import ampft.finetune

real_run = ampft.finetune.run
def run(cfg, *args, **kwargs):
    if cfg.trainer.seed == 2:
        raise RuntimeError("injected crash")
    return real_run(cfg, *args, **kwargs)
ampft.finetune.run = run
sys.argv = ["recipes/finetune.py", *sys.argv[1:]]
runpy.run_path("recipes/finetune.py", run_name="__main__")
"""


@pytest.mark.slow
def test_a_crashed_job_is_a_row_and_the_summary_stays_whole(tmp_path):
    """A job that raises something unexpected (a bug, stood in for by a RuntimeError) is recorded as crashed;
    the jobs after it run and are recorded; Hydra prints the traceback at the end and the sweep exits 1."""
    proc = _run(["-c", CRASH_ON_SEED_2, "-m", *BASE, "optim.lr=1e-3", "trainer.max_steps=4", "trainer.seed=1,2,3",
                 f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 1, proc.stderr[-3000:]
    jobs = _jobs(tmp_path)
    assert [j["status"] for j in jobs] == ["completed", "crashed", "completed"]
    assert [j["exit_code"] for j in jobs] == [0, 1, 0]
    assert jobs[1]["error"] == "RuntimeError: injected crash"
    _check_completed(jobs[0])
    _check_completed(jobs[2])
    _check_table(tmp_path, jobs)
    assert "Traceback" in proc.stderr and "RuntimeError: injected crash" in proc.stderr


def test_a_single_run_keeps_its_exit_code_and_its_one_line(tmp_path):
    proc = _run(["recipes/finetune.py", *BASE, "optim.lr=nan", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 2
    assert proc.stderr == "error: 1 problem(s) in the config: optim.lr=nan: must be a finite number > 0, e.g. 3e-5\n"
    assert not list(tmp_path.rglob("summary.*"))


def test_a_key_nothing_reads_fails_each_job_of_a_sweep_with_its_one_line(tmp_path):
    """In a multirun the unknown +key is each job's ConfigError (exit 2), recorded; the sweep exits 1 without a
    traceback, no job trains."""
    proc = _run(["recipes/finetune.py", "-m", *BASE, "+trainer.foo=1,2", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    jobs = _jobs(tmp_path)
    assert [(j["status"], j["exit_code"]) for j in jobs] == [("failed", 2), ("failed", 2)]
    for job, value in zip(jobs, (1, 2), strict=True):
        assert job["error"].startswith(f"+trainer.foo={value}: trainer.foo is no key of the config")
        assert f"error: 1 problem(s) in the config: +trainer.foo={value}: " in proc.stderr
    assert not list(tmp_path.rglob("summary.json"))[1:]  # the sweep's own, no run's
    _check_table(tmp_path, jobs)


def _lr(job: dict) -> float:
    return float(next(o for o in job["overrides"] if o.startswith("optim.lr=")).split("=", 1)[1])


@pytest.mark.slow
def test_optuna_study_maximises_the_main_metric(tmp_path):
    proc = _run(["recipes/finetune.py", "-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3",
                 "optim.lr=tag(log, interval(1e-5, 1e-3))", *BASE, "trainer.max_steps=6", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Directions: ['maximize']" in proc.stdout + proc.stderr  # accuracy: higher is better
    jobs = _jobs(tmp_path)
    assert [j["status"] for j in jobs] == ["completed"] * 3
    for job in jobs:
        _check_completed(job)
        assert 1e-5 <= _lr(job) <= 1e-3
    assert len({_lr(j) for j in jobs}) == 3
    _check_table(tmp_path, jobs)
    result = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    best = max(j["value"] for j in jobs)
    assert result["best_value"] == best
    assert result["best_params"]["optim.lr"] in [_lr(j) for j in jobs if j["value"] == best]


@pytest.mark.slow
def test_optuna_failed_trial_is_recorded_and_the_study_goes_on(tmp_path):
    """The first trial draws lr=nan, which fails (exit 2); Optuna counts it as failed and the study goes on.
    (Random sampling with seed 1 draws the choices in the order nan, 1e-3, 5e-4.)"""
    proc = _run(["recipes/finetune.py", "-m", "hydra/sweeper=optuna", "hydra/sweeper/sampler=random",
                 "hydra.sweeper.sampler.seed=1", "hydra.sweeper.n_trials=3", "optim.lr=choice(1e-3, nan, 5e-4)",
                 *BASE, "trainer.max_steps=4", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 1, proc.stderr[-3000:]
    jobs = _jobs(tmp_path)
    assert [str(_lr(j)) for j in jobs] == ["nan", "0.001", "0.0005"]
    for job in jobs:
        if math.isnan(_lr(job)):
            assert job["status"] == "failed" and job["exit_code"] == 2 and job["error"].startswith("optim.lr=nan")
        else:
            _check_completed(job)
    _check_table(tmp_path, jobs)
    assert "Failed experiment: 1 problem(s) in the config" in proc.stdout + proc.stderr  # told to Optuna as failed
    result = yaml.safe_load((tmp_path / "optimization_results.yaml").read_text())
    assert result["best_value"] == max(j["value"] for j in jobs if j["status"] == "completed")


@pytest.mark.slow
def test_a_preempted_job_stops_the_sweep_with_75(tmp_path):
    """SIGTERM during job 1: it checkpoints and is recorded as preempted, no further job starts (the machine is
    going away), and the sweep exits 75 like a preempted single run."""
    sweep = tmp_path / "sweep"
    with (tmp_path / "out").open("w") as out, (tmp_path / "err").open("w") as err:
        proc = subprocess.Popen([sys.executable, "recipes/finetune.py", "-m", *BASE, "optim.lr=1e-3",
                                 "trainer.max_steps=4,400,4", f"hydra.sweep.dir={sweep}"],
                                cwd=ROOT, stdout=out, stderr=err, text=True)
        metrics = sweep / "1-tiny-bert-fp32" / "metrics.jsonl"
        while not (metrics.is_file() and '"step": 10,' in metrics.read_text()):
            assert proc.poll() is None, (tmp_path / "err").read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait() == 75, (tmp_path / "err").read_text()[-3000:]
    jobs = _jobs(sweep)
    assert [(j["status"], j["exit_code"]) for j in jobs] == [("completed", 0), ("preempted", 75)]
    assert "checkpoint.resume=latest" in jobs[1]["message"]
    assert list((Path(jobs[1]["run_dir"]) / "checkpoints").glob("step_*"))
    assert not list(sweep.glob("2-*"))
    _check_table(sweep, jobs)
    assert "preempted: " in (tmp_path / "err").read_text()
