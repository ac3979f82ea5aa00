"""Sequence classification and regression (GLUE, your own csv/tsv/json/parquet files): one sentence or a
pair per example, one label (an id, or a float for regression)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from datasets import Dataset, DatasetDict
from omegaconf import DictConfig
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerBase

from ampft.data.load import FORMATS, PREDICT, DataError, load_file
from ampft.tasks.base import Family, column_names_unread, gather, register
from ampft.tasks.classification import metrics as glue
from ampft.tasks.classification.data import encode_labels, label_names, load_raw, positive_label


def texts(batch: dict, fields: list[str]) -> list[list[str]]:
    """The text columns of a batch of rows, one list per field (a missing value is the empty string): the
    tokenizer's positional arguments for single sentences or pairs."""
    return [[("" if t is None else str(t)) for t in batch[f]] for f in fields]


def example_losses(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    """Each example's loss as the model's own loss computes it for the batch (mean squared error for one
    regression output, cross-entropy otherwise), unreduced."""
    if regression:
        return (logits.squeeze(-1) - labels.float()) ** 2
    return torch.nn.functional.cross_entropy(logits, labels, reduction="none")


def _logits(accelerator: Accelerator, model, dataloader: DataLoader) -> torch.Tensor:
    (parts,) = gather(accelerator, model, dataloader, lambda batch, out: (out.logits.float(),))
    return torch.cat(parts)


def column_names_problems(task: DictConfig, files: list[tuple[str, str]]) -> list[str]:
    """task.column_names names the columns of headerless local .csv/.tsv files."""
    names = task.column_names
    if names is None or not files:
        return column_names_unread(task)
    problems = [f"{key if key == 'file' else 'task.' + key}={path}: task.column_names is for headerless .csv/.tsv "
                f"files, not {Path(path).suffix}" for key, path in files if Path(path).suffix.lower() not in (".csv", ".tsv")]
    if len(set(names)) != len(names):
        problems.append(f"task.column_names={list(names)}: names must be unique")
    # A file given as file= (make predict, make evaluate) may have no label column; evaluate says so when it reads it.
    needed = [*task.text_fields, *([] if all(key == "file" for key, _ in files) else [task.label_column])]
    missing = [c for c in needed if c not in names]
    if missing:
        problems.append(f"task.column_names={list(names)} lacks {missing}, which task.text_fields/task.label_column "
                        "name: name the file's columns in order, including those")
    return problems


# The model card's example (`usage`): a sentence, or a pair for two text fields.
EXAMPLE = ("The film is a joy to watch from start to finish.", "Watching the film is a pleasure.")


class Classification(Family):
    name = "classification"
    metrics = {"accuracy": ("accuracy",), "f1": ("f1",), "mcc": ("mcc",)}
    model_class = AutoModelForSequenceClassification
    pipeline_tag = "text-classification"
    extensions = tuple(FORMATS)
    files = "csv, tsv, json, jsonl or parquet"
    one_feature_per_example = True
    scores_in_percent = False
    typical_label_count = 2

    def check(self, task: DictConfig, files: list[tuple[str, str]]) -> list[str]:
        problems = column_names_problems(task, files)
        if not 1 <= len(task.text_fields) <= 2:
            problems.append(f"task.text_fields={list(task.text_fields)}: give one column (single sentence) or two "
                            "(pair)")
        if task.label_column in task.text_fields:
            problems.append(f"task.text_fields={list(task.text_fields)} has task.label_column={task.label_column}: "
                            "the model would read its label; give the text columns only")
        return problems

    def load(self, task: DictConfig) -> tuple[DatasetDict, list[str] | None]:
        raw = load_raw(task)
        labels = label_names(raw, task)
        positive_label(task, labels)  # refuses an unclear binary F1 now, not after training
        return encode_labels(raw, task, labels), labels

    def encoder(self, task: DictConfig, tokenizer: PreTrainedTokenizerBase, labels: list[str] | None, split: str):
        fields = list(task.text_fields)

        def encode(batch):
            out = tokenizer(*texts(batch, fields), truncation=True, max_length=task.max_length)
            return out if split == PREDICT else {**out, "labels": batch["labels"]}  # `load` made them ids

        return encode

    def fake_targets(self, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
        return dict(labels=torch.zeros(batch_size, dtype=torch.long))

    def positive_label(self, task: DictConfig, labels: list[str] | None) -> str | None:
        return positive_label(task, labels)

    def read_inputs(self, task: DictConfig, path: str) -> Dataset:
        names = None if task.column_names is None else [str(c) for c in task.column_names]
        ds = load_file(path, PREDICT, names, task.text_fields)
        missing = [c for c in task.text_fields if c not in ds.column_names]
        if missing:
            raise DataError(f"file={path}: column(s) {missing} not in the file, whose columns are {ds.column_names} "
                            f"(line 1{' names them' if names is None else ': task.column_names'}). Set "
                            "task.text_fields=[...] to the file's text columns" +
                            (", or task.column_names=null for a file with a header line" if names is not None else ""))
        if len(ds) == 0:
            raise DataError(f"file={path}: no rows to predict (the file has its header line only)")
        return ds

    def predict(self, accelerator: Accelerator, model, dataloader: DataLoader, features: Dataset,
                inputs: Dataset, task: DictConfig, labels: list[str] | None) -> list[dict[str, Any]]:
        logits = _logits(accelerator, model, dataloader)
        if labels is None:  # regression: the one output
            return [{"value": float(v)} for v in logits[:, 0]]
        return [{"label": labels[int(p.argmax())], "probabilities": dict(zip(labels, p.tolist(), strict=True))}
                for p in logits.softmax(-1)]

    def usage_example(self, task: DictConfig) -> str:
        text = ", ".join(json.dumps(t) for t in EXAMPLE[:len(task.text_fields)])
        return f"""inputs = tokenizer({text}, truncation=True, max_length={task.max_length}, return_tensors="pt")
with torch.inference_mode():
    logits = model(**inputs).logits[0]
{self._usage_result()}"""

    def _usage_result(self) -> str:
        return """probabilities = logits.softmax(-1).tolist()
labels = [model.config.id2label[i] for i in range(len(probabilities))]
print({"label": labels[int(logits.argmax())], "probabilities": dict(zip(labels, probabilities))})
"""

    def evaluate(self, accelerator: Accelerator, model, dataloader: DataLoader, features: Dataset,
                 examples: Dataset, task: DictConfig, labels: list[str] | None,
                 out_dir: Path | None = None, name: str = "validation") -> dict[str, float]:
        logits, refs = _logits(accelerator, model, dataloader), torch.tensor(features["labels"])
        regression, positive = labels is None, positive_label(task, labels)
        preds = logits[:, 0] if regression else logits.argmax(dim=-1)
        results = glue.compute(list(task.metrics), preds.numpy(), refs.numpy(), None if regression else len(labels),
                               1 if positive is None else labels.index(positive))
        return {**results, "loss": float(example_losses(logits, refs, regression).mean()), "samples": len(refs)}


class Regression(Classification):
    """One output per example, a float label (STS-B): the classification pipeline without a label set."""

    name = "regression"
    metrics = {"pearson": ("pearson",), "spearman": ("spearman",)}
    typical_label_count = None

    def fake_targets(self, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
        return dict(labels=torch.zeros(batch_size))

    def check(self, task: DictConfig, files: list[tuple[str, str]]) -> list[str]:
        problems = super().check(task, files)
        if task.labels is not None:
            problems.append("task.labels is set for a regression task: remove it (regression has one output)")
        return problems

    def model_kwargs(self, labels: list[str] | None) -> dict:
        return dict(num_labels=1, problem_type="regression")

    def _usage_result(self) -> str:
        return 'print({"value": logits[0].item()})\n'


CLASSIFICATION = register(Classification())
REGRESSION = register(Regression())
