"""The evaluation loss is a mean over examples (tokens for NER, windows for QA): the same number whatever the
evaluation batch size and the number of ranks, for every task family."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from ampft.evaluation.saved import evaluate_saved
from ampft.finetune import reset_accelerate, run
from tests.helpers import ROOT, TINY, compose_config, shared


def _family_overrides(family: str) -> list[str]:
    if family == "classification":
        return []
    if family == "token_classification":
        conll = shared("conll2003")
        return ["task=conll2003", f"task.train_file={conll / 'train.txt'}", f"task.validation_file={conll / 'valid.txt'}",
                "task.max_length=64", "task.max_train_samples=64", "task.max_eval_samples=45"]
    squad = shared("squad", "expmrc-squad-dev.json")
    return ["task=squad", f"task.train_file={squad}", f"task.validation_file={squad}", "task.max_length=96",
            "task.doc_stride=48", "task.max_train_samples=32", "task.max_eval_samples=23"]


@pytest.fixture(scope="module", params=["classification", "token_classification", "question_answering"])
def trained(request, tmp_path_factory):
    """A briefly trained tiny model of each family, exported; `task.max_eval_samples` is odd on purpose."""
    run_dir = tmp_path_factory.mktemp(request.param)
    cfg = compose_config("finetune", [*TINY, *_family_overrides(request.param), "trainer.max_steps=3",
                                      "checkpoint.every=0"])
    summary = run(cfg, run_dir)
    return run_dir, summary


def _evaluate(run_dir, batch_size):
    e = dict(run=str(run_dir), checkpoint=None, split="validation", file=None, precision=None, batch_size=batch_size,
             name=None)
    try:
        return evaluate_saved(OmegaConf.create(e))
    finally:
        reset_accelerate()


def test_eval_loss_does_not_depend_on_the_eval_batch_size(trained):
    run_dir, summary = trained
    by_size = {b: _evaluate(run_dir, b)["metrics"] for b in (1, 7, 32)}
    for b in (7, 32):
        assert by_size[b]["loss"] == pytest.approx(by_size[1]["loss"], abs=1e-5), b
        for key, value in by_size[1].items():
            assert by_size[b][key] == pytest.approx(value, abs=1e-5), (b, key)
    # The training run's own evaluation (its eval batch size) reports the same loss.
    assert summary["eval"]["loss"] == pytest.approx(by_size[1]["loss"], abs=1e-5)


@pytest.mark.distributed
def test_two_ranks_evaluate_exactly_as_one_process(trained):
    """Two gloo ranks: the odd split pads the last batch with duplicates, which must count once."""
    run_dir, _ = trained
    one = _evaluate(run_dir, 4)
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                           "recipes/eval.py", f"run={run_dir}", "batch_size=4", "name=two-ranks"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = run_dir / "evaluations" / "two-ranks" / "eval.json"
    printed = [line for line in proc.stdout.splitlines() if line.endswith(f"examples) -> {path}")]
    assert len(printed) == 1 and "-> None" not in proc.stdout, proc.stdout  # the result line: the main process's
    assert len([line for line in proc.stdout.splitlines() if line.startswith("tokenized ")]) == 1, proc.stdout
    two = json.loads(path.read_text())
    assert (two["num_processes"], one["num_processes"]) == (2, 1)
    assert two["samples"] == one["samples"]
    assert two["metrics"].keys() == one["metrics"].keys()
    for key, value in one["metrics"].items():
        assert two["metrics"][key] == pytest.approx(value, abs=1e-5), key
