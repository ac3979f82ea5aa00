"""Evaluating a saved run or checkpoint uses the training metrics code and writes into its own folder of the run
dir, RUN_DIR/evaluations/<name>/, never over what the training run wrote."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from ampft.config import ConfigError
from ampft.evaluation.saved import EvaluationError, evaluate_saved
from ampft.finetune import reset_accelerate, run
from tests.helpers import ROOT, shared

EVAL_DEFAULTS = dict(run=None, checkpoint=None, split="validation", file=None, precision=None, batch_size=None,
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
    evaluations = run_dir / "evaluations"
    assert json.loads((evaluations / "final_validation" / "eval.json").read_text())["metrics"] == from_run["metrics"]
    from_ckpt = _evaluate(checkpoint=str(run_dir / "checkpoints" / "step_12"), name="step12")
    assert from_ckpt["metrics"] == pytest.approx(summary["eval"])
    assert (evaluations / "step12" / "eval.json").is_file()


def _md5s(run_dir):
    return {str(p.relative_to(run_dir)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and "evaluations" not in p.parts}


def test_evaluations_never_replace_what_the_training_run_wrote(tiny, tmp_path):
    # QA writes predictions_validation.json at the end of training: the file an evaluation used to replace.
    context = "Apollo 11 landed on the Moon in 1969. " + "The crew trained for years. " * 12
    qas = [{"id": f"q{i}", "question": q, "answers": [{"text": a, "answer_start": context.index(a)}]}
           for i, (q, a) in enumerate([("When did Apollo 11 land?", "1969"), ("Where did it land?", "the Moon")] * 8)]
    squad = tmp_path / "data" / "squad.json"
    squad.parent.mkdir()
    squad.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}))
    run_dir = tmp_path / "run"
    run(tiny("task=squad", f"task.train_file={squad}", f"task.validation_file={squad}", "task.max_length=48",
             "task.doc_stride=16", "trainer.max_steps=4", "checkpoint.every=2"), run_dir)
    tmp_path = run_dir
    before = _md5s(tmp_path)
    assert "predictions_validation.json" in before and "summary.json" in before
    ckpt = _evaluate(checkpoint=str(tmp_path / "checkpoints" / "step_2"))
    final = _evaluate(run=str(tmp_path), precision="bf16")
    again = _evaluate(run=str(tmp_path), precision="bf16", batch_size=3)
    assert _md5s(tmp_path) == before
    names = sorted(p.name for p in (tmp_path / "evaluations").iterdir())
    assert names == ["final_validation_precision-bf16", "final_validation_precision-bf16_batch-3",
                     "step_2_validation"] == sorted(x["name"] for x in (ckpt, final, again))
    for name in names:
        folder = tmp_path / "evaluations" / name
        assert json.loads((folder / "eval.json").read_text())["samples"] == 16
        assert len(json.loads((folder / "predictions_validation.json").read_text())) == 16
    assert final["metrics"]["loss"] == pytest.approx(again["metrics"]["loss"], abs=1e-5)  # batch size: no effect
    with pytest.raises(EvaluationError, match="name=../x"):
        _evaluate(run=str(tmp_path), name="../x")


def test_another_local_file_with_the_run_labels(trained, tmp_path_factory):
    run_dir, _ = trained
    other = tmp_path_factory.mktemp("data") / "reviews.csv"
    # String labels in a different order than the training labels: mapped by name.
    other.write_text("sentence,label\nthe screen is superb.,positive\nthe case felt flimsy.,negative\n"
                     "the fan was not noisy.,positive\n")
    out = _evaluate(run=str(run_dir), file=str(other))
    assert out["samples"] == 3 and set(out["metrics"]) == {"accuracy", "f1", "loss"}
    assert (run_dir / "evaluations" / "final_reviews" / "eval.json").is_file()
    # Another file of the same name keeps the first one's evaluation; a rerun of either replaces its own.
    same_name = tmp_path_factory.mktemp("other") / "reviews.csv"
    same_name.write_text("sentence,label\nthe screen is superb.,positive\n")
    second = _evaluate(run=str(run_dir), file=str(same_name))
    assert (second["name"], second["samples"]) == ("final_reviews-2", 1)
    assert [_evaluate(run=str(run_dir), file=str(f))["name"] for f in (other, same_name)] == [
        "final_reviews", "final_reviews-2"]
    held = {p.parent.name: json.loads(p.read_text())["data"] for p in (run_dir / "evaluations").glob("*/eval.json")}
    assert held == {"final_reviews": str(other), "final_reviews-2": str(same_name)}


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
    with pytest.raises(ConfigError, match=r"batch_size=0: must be >= 1"):
        _evaluate(run=str(run_dir), batch_size=0)
    with pytest.raises(EvaluationError, match=rf"is a run dir: run={run_dir} evaluates its export"):
        _evaluate(checkpoint=str(run_dir))
    (run_dir / "checkpoints" / "step_6" / "manifest.json").unlink()
    with pytest.raises(EvaluationError, match="no manifest.json"):
        _evaluate(checkpoint=str(run_dir / "checkpoints" / "step_6"))


def test_make_evaluate(trained):
    run_dir, _ = trained
    proc = subprocess.run(["make", "--no-print-directory", "evaluate", f"run={run_dir}", "split=train",
                           f"PYTHON={sys.executable}"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((run_dir / "evaluations" / "final_train" / "eval.json").read_text())
    assert out["samples"] == 640 and out["data"] == "demo:train"


def test_a_file_with_other_column_names_takes_the_task_keys_the_error_suggests(trained, tmp_path_factory):
    """The error names task.text_fields/task.label_column; the recipe then accepts exactly those keys."""
    from ampft.errors import DataError

    run_dir, _ = trained
    other = tmp_path_factory.mktemp("data") / "reviews.csv"
    other.write_text("review,stars\nthe screen is superb.,positive\nthe case felt flimsy.,negative\n")
    with pytest.raises(DataError, match=rf"^file={other}: column\(s\) \['sentence', 'label'\] not in the file, whose "
                                        r"columns are \['review', 'stars'\]. Set task.text_fields=\[...\] and "
                                        r"task.label_column=... to match"):
        _evaluate(run=str(run_dir), file=str(other))
    unseen = tmp_path_factory.mktemp("data") / "neutral.csv"
    unseen.write_text("sentence,label\nthe screen is fine.,neutral\n")
    with pytest.raises(DataError, match=r"the file has labels \['neutral'\] outside the label set .* The model was "
                                        r"trained on these labels only: fix the file"):
        _evaluate(run=str(run_dir), file=str(unseen))
    proc = subprocess.run([sys.executable, "recipes/eval.py", f"run={run_dir}", f"file={other}",
                           "task.text_fields=[review]", "task.label_column=stars"], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads((run_dir / "evaluations" / "final_reviews" / "eval.json").read_text())
    assert out["samples"] == 2 and set(out["metrics"]) == {"accuracy", "f1", "loss"}
    proc = subprocess.run([sys.executable, "recipes/eval.py", f"run={run_dir}", f"file={other}",
                           "task.text_fields=[review]"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "make predict run=RUN_DIR file=PATH" in proc.stderr  # no label column
