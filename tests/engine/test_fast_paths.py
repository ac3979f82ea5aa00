"""The fast paths change how fast, not what: evaluation in length order scores exactly as in file order,
dataloader workers give the same losses, and torch.compile trains with a bounded number of compilations
and writes checkpoints and exports that load into an ordinary model."""

from __future__ import annotations

import contextlib
import dataclasses
import json

import pytest
import torch
from accelerate import Accelerator
from datasets import load_from_disk

from ampft import tasks
from ampft.data import eval_dataloader, prepare_data
from ampft.finetune import reset_accelerate, run
from ampft.models import build_model, load_tokenizer
from tests.helpers import assert_export_reproduces, shared


def _evaluations(compose, overrides: list[str]) -> list[tuple[dict, list[int]]]:
    """Evaluate one randomly initialised model on the validation split in length order (as ampft does) and
    in file order (the tokenized cache and the raw rows as the file has them)."""
    out = []
    accelerator = Accelerator(cpu=True)
    try:
        cfg = compose(["model=tiny-bert", "trainer.batch_size=8", *overrides])
        family = tasks.family_for(cfg.task.family)
        tok = family.adapt_tokenizer(load_tokenizer(cfg.model))
        data = prepare_data(cfg, family, tok, contextlib.nullcontext)
        raw, _ = family.load(cfg.task)
        file_order = dataclasses.replace(data, validation=load_from_disk(str(data.cache_path))["validation"],
                                         examples={"validation": raw["validation"]})
        for d in (data, file_order):
            torch.manual_seed(0)
            model = build_model(cfg.model, tok, d.labels, family).eval()
            dl = eval_dataloader(cfg, d, d.validation, tok, accelerator.device, model)
            results = tasks.evaluate(accelerator, model, d, {"validation": dl}, cfg.task)
            out.append((results, d.validation["length"]))
    finally:
        reset_accelerate()
    return out


@pytest.mark.data
@pytest.mark.parametrize("family", ["classification", "token_classification", "question_answering"])
def test_evaluation_in_length_order_scores_exactly_as_in_file_order(compose, family, tmp_path):
    overrides = {
        "classification": ["task=sst2", f"task.train_file={shared('sst2', 'train_first1000.tsv')}",
                           f"task.validation_file={shared('sst2', 'dev.tsv')}", "task.max_eval_samples=301"],
        "token_classification": ["task=conll2003", f"task.train_file={shared('conll2003', 'valid.txt')}",
                                 f"task.validation_file={shared('conll2003', 'valid.txt')}",
                                 "task.max_train_samples=16", "task.max_eval_samples=301"],
        "question_answering": ["task=squad", f"task.train_file={shared('squad', 'expmrc-squad-dev.json')}",
                               f"task.validation_file={shared('squad', 'expmrc-squad-dev.json')}",
                               "task.max_train_samples=16", "task.max_eval_samples=120", "task.max_length=128",
                               "task.doc_stride=32"],
    }[family]
    (ordered, lengths), (plain, file_lengths) = _evaluations(compose, [f"cache_dir={tmp_path}", *overrides])
    assert lengths == sorted(lengths, reverse=True) and file_lengths != lengths  # really reordered
    assert ordered["samples"] == plain["samples"]
    if family == "question_answering":  # transformers' QA loss is a softmax over every position, padding
        ordered.pop("loss"), plain.pop("loss")  # included: it depends on the batch's width; EM/F1 do not
    assert ordered == pytest.approx(plain, rel=1e-4, abs=1e-4)
    # Predictions that depend on the model (not all one class / all O / all empty) make the check meaningful.
    main = {"classification": "accuracy", "token_classification": "accuracy", "question_answering": "f1"}[family]
    assert 0 < ordered[main] < (1 if family == "classification" else 100)


def _losses(run_dir) -> list[float]:
    events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [e["loss"] for e in events if e["event"] == "train"]


def test_dataloader_workers_change_nothing_but_speed(tiny, tmp_path):
    base = ["trainer.max_steps=6", "trainer.log_every=1", "checkpoint.export=false"]
    inline = run(tiny(*base, "trainer.num_workers=0"), tmp_path / "inline")
    workers = run(tiny(*base, "trainer.num_workers=1"), tmp_path / "workers")
    assert _losses(tmp_path / "workers") == _losses(tmp_path / "inline")
    assert workers["eval"] == inline["eval"]
    # What ran is recorded: attention implementation (auto: SDPA on CPU), setup time to the first step.
    assert inline["attn_implementation"] == "sdpa" and inline["compiled"] is False
    assert 0 < inline["setup_seconds"] < inline["wall_seconds"]


@pytest.mark.slow
def test_compiled_training_recompiles_a_bounded_number_of_times_and_exports_plain_weights(tiny, tmp_path):
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    # Two buckets (lengths padded to 16 or 32): whatever the batches' lengths, at most two training shapes.
    cfg = tiny("trainer.compile=true", "trainer.compile_buckets=2", "task.max_length=32", "trainer.max_steps=12",
               "trainer.log_every=4", "checkpoint.every=6", "task.max_eval_samples=37")
    summary = run(cfg, tmp_path)
    assert summary["compiled"] is True and summary["steps"] == 12
    graphs = counters["stats"]["unique_graphs"]
    assert 0 < graphs <= 2 * 2, f"{graphs} graphs compiled for 2 length buckets"  # (+ a graph break each)
    losses = _losses(tmp_path)
    assert all(map(torch.isfinite, torch.tensor(losses)))
    # Checkpoints and the export hold the plain model's keys (no `_orig_mod.` prefix): they load anywhere.
    from safetensors.torch import load_file

    keys = set(load_file(tmp_path / "checkpoints" / "step_12" / "model.safetensors"))
    assert keys and not any("_orig_mod" in k for k in keys)
    assert_export_reproduces(tmp_path)  # the export too: reloaded, it scores the run's final evaluation
