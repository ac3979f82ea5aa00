"""Evaluating a saved run or checkpoint uses the training metrics code and writes into the run dir."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from ampft.evaluation.saved import EvaluationError, evaluate_saved
from ampft.finetune import reset_accelerate, run
from tests.conftest import ROOT, shared

EVAL_DEFAULTS = dict(run=None, checkpoint=None, split="validation", file=None, precision=None, batch_size=64,
                     name=None)


def _evaluate(**kwargs):
    try:
        return evaluate_saved(OmegaConf.create({**EVAL_DEFAULTS, **kwargs}))
    finally:
        reset_accelerate()


@pytest.fixture
def trained(tiny, tmp_path):
    summary = run(tiny("trainer.max_steps=12", "checkpoint.every=6", "optim.lr=3e-3"), tmp_path)
    return tmp_path, summary


def test_run_and_its_last_checkpoint_reproduce_the_training_eval(trained):
    run_dir, summary = trained
    from_run = _evaluate(run=str(run_dir))
    assert from_run["metrics"] == pytest.approx(summary["eval"])
    assert from_run["samples"] == summary["eval_samples"] == 101
    assert json.loads((run_dir / "eval_validation.json").read_text())["metrics"] == from_run["metrics"]
    from_ckpt = _evaluate(checkpoint=str(run_dir / "checkpoints" / "step_12"), name="step12")
    assert from_ckpt["metrics"] == pytest.approx(summary["eval"])
    assert (run_dir / "eval_step12.json").is_file()


def test_another_local_file_with_the_run_labels(trained, tmp_path_factory):
    run_dir, _ = trained
    other = tmp_path_factory.mktemp("data") / "reviews.csv"
    # String labels in a different order than the training labels: mapped by name.
    other.write_text("sentence,label\nthe screen is superb.,positive\nthe case felt flimsy.,negative\n"
                     "the fan was not noisy.,positive\n")
    out = _evaluate(run=str(run_dir), file=str(other))
    assert out["samples"] == 3 and set(out["metrics"]) == {"accuracy", "f1", "loss"}
    assert (run_dir / "eval_reviews.json").is_file()


def test_real_sst2_dev_file(trained):
    run_dir, _ = trained
    out = _evaluate(run=str(run_dir), file=str(shared("sst2", "dev.tsv")))
    assert out["samples"] == 872


def test_bad_sources_are_clear_errors(trained, tmp_path_factory):
    run_dir, _ = trained
    with pytest.raises(EvaluationError, match="exactly one of run="):
        _evaluate()
    with pytest.raises(EvaluationError, match="no exported model"):
        _evaluate(run=str(tmp_path_factory.mktemp("empty")))
    (run_dir / "checkpoints" / "step_6" / "manifest.json").unlink()
    with pytest.raises(EvaluationError, match="no manifest.json"):
        _evaluate(checkpoint=str(run_dir / "checkpoints" / "step_6"))


def test_make_evaluate(trained):
    run_dir, _ = trained
    proc = subprocess.run(["make", "--no-print-directory", "evaluate", f"run={run_dir}", "split=train",
                           f"PYTHON={sys.executable}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((run_dir / "eval_train.json").read_text())
    assert out["samples"] == 640 and out["data"] == "demo:train"
