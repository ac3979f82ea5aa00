"""End-to-end runs on CPU with a tiny BERT that trains for real: loss goes down, the exported model
reloads with `from_pretrained` and predicts the same, and every run artifact is written."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from ampft.finetune import run
from tests.helpers import assert_export_reproduces


def _events(run_dir, kind):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_tiny_bert_trains_and_exports(tiny, tmp_path, precision):
    # A randomly initialised tiny BERT sits on the 0.693 plateau for ~150 steps, then learns the task.
    cfg = tiny(f"precision={precision}", "trainer.max_steps=300", "trainer.eval_every=150",
               "task.max_train_samples=2000", "trainer.log_every=20")
    summary = run(cfg, tmp_path)

    assert summary["precision"] == precision
    assert summary["steps"] == 300 and summary["skipped_steps"] == 0
    train = _events(tmp_path, "train")
    assert [e["step"] for e in train] == list(range(20, 301, 20))
    assert all({"loss", "lr", "step"} <= set(e) for e in train)
    first, last = train[0]["loss"], train[-1]["loss"]
    assert last < 0.7 * first, f"loss did not go down: {first} -> {last}"
    evals = _events(tmp_path, "eval")
    assert [e["step"] for e in evals] == [150, 300]
    assert evals[-1]["samples"] == 101  # odd-sized split, each example counted once
    assert summary["eval"]["accuracy"] > 0.7  # chance is 0.5 on the demo task

    for key in ("train_loss", "train_samples_per_second", "train_tokens_per_second", "peak_memory_bytes",
                "wall_seconds"):
        assert summary[key] > 0 and math.isfinite(summary[key]), key
    # tokens/s counts non-padding tokens only: fewer than samples x padded length.
    assert summary["train_tokens"] < summary["train_samples"] * cfg.task.max_length
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["eval"] == summary["eval"]
    assert (tmp_path / "config.yaml").is_file()

    # The export reloads with plain transformers and predicts exactly what the trained model predicted.
    export = tmp_path / "model"
    assert (export / "model.safetensors").is_file() and (export / "ampft_config.yaml").is_file()
    model = AutoModelForSequenceClassification.from_pretrained(export).eval()
    tok = AutoTokenizer.from_pretrained(export)
    assert model.config.id2label == {0: "negative", 1: "positive"}
    texts = ["the battery was not great, but the screen is superb.", "the case felt flimsy."]
    with torch.inference_mode():
        logits = model(**tok(texts, padding=True, return_tensors="pt")).logits
    assert logits.shape == (2, 2) and torch.isfinite(logits).all()


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_the_export_reloads_to_the_runs_final_evaluation(tiny, tmp_path, precision):
    """Reloaded with from_pretrained (`make evaluate run=`), the export scores exactly the run's final metrics and
    loss, in each precision."""
    run(tiny(f"precision={precision}", "trainer.max_steps=12", "task.max_train_samples=192"), tmp_path)
    assert_export_reproduces(tmp_path)


def test_grad_accum_counts_optimizer_steps(tiny, tmp_path):
    summary = run(tiny("trainer.max_steps=10", "trainer.grad_accum=3", "trainer.batch_size=8"), tmp_path)
    assert summary["steps"] == 10
    assert summary["train_samples"] == 10 * 3 * 8  # every micro-batch of 8 counted, 3 per update


def test_epochs_drive_the_length_and_eval_runs_each_epoch(tiny, tmp_path):
    summary = run(tiny("trainer.epochs=2", "task.max_train_samples=160"), tmp_path)
    assert summary["steps"] == 20  # 160 / 16 per epoch
    assert [e["step"] for e in _events(tmp_path, "eval")] == [10, 20]
    assert summary["epochs"] == pytest.approx(2.0)


def test_checkpoints_rotate_and_resume_continues(tiny, tmp_path):
    from ampft.checkpointing import checkpoints

    run(tiny("trainer.max_steps=20", "checkpoint.every=5", "checkpoint.keep_last=2"), tmp_path)
    kept = checkpoints(tmp_path)
    assert [p.name for p in kept] == ["step_15", "step_20"]
    manifest = json.loads((kept[-1] / "manifest.json").read_text())
    assert manifest["step"] == 20 and manifest["files"]

    # Resume the same run dir and train 10 more steps from the newest checkpoint.
    summary = run(tiny("trainer.max_steps=30", "checkpoint.every=5", "checkpoint.resume=latest"), tmp_path)
    assert summary["steps"] == 30
    steps = [e["step"] for e in _events(tmp_path, "train")]
    assert steps[-2:] == [25, 30] and 20 in steps


def test_csv_task_on_real_sst2(tiny, tmp_path):
    from tests.helpers import shared

    train, dev = shared("sst2", "train_first1000.tsv"), shared("sst2", "dev.tsv")
    cfg = tiny("task=csv", f"task.train_file={train}", f"task.validation_file={dev}", "trainer.max_steps=20",
               "task.max_eval_samples=200")
    summary = run(cfg, tmp_path)
    assert summary["task"] == "csv" and summary["eval_samples"] == 200
    assert set(summary["eval"]) == {"accuracy", "f1", "loss"}
