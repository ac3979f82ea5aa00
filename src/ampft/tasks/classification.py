"""Sequence classification and regression (GLUE, your own csv/tsv/json/parquet files): one sentence or a
pair per example, one label (an id, or a float for regression). The data and metric code lives in
`ampft.data.load` and `ampft.evaluation`; this wires it into the family interface."""

from __future__ import annotations

from pathlib import Path

from accelerate import Accelerator
from datasets import Dataset, DatasetDict
from omegaconf import DictConfig
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from ampft.data.load import encode_labels, file_format, label_names, load_raw, positive_label
from ampft.evaluation import evaluate_model
from ampft.tasks import Family


def texts(batch: dict, fields: list[str]) -> list[list[str]]:
    """The text columns of a batch of rows, one list per field (a missing value is the empty string): the
    tokenizer's positional arguments for single sentences or pairs."""
    return [[("" if t is None else str(t)) for t in batch[f]] for f in fields]


class Classification(Family):
    def check_file(self, path: str) -> None:
        file_format(path)

    def load(self, task: DictConfig) -> tuple[DatasetDict, list[str] | None]:
        raw = load_raw(task)
        labels = label_names(raw, task)
        positive_label(task, labels)  # refuses an unclear binary F1 now, not after training
        return encode_labels(raw, task, labels), labels

    def tokenize(self, raw: DatasetDict, task: DictConfig, tokenizer: PreTrainedTokenizerBase,
                 labels: list[str] | None) -> DatasetDict:
        fields = list(task.text_fields)

        def fn(batch):
            enc = tokenizer(*texts(batch, fields), truncation=True, max_length=task.max_length)
            enc["length"] = [len(ids) for ids in enc["input_ids"]]
            return enc

        keep = [c for c in raw["train"].column_names if c == "labels"]
        return DatasetDict(
            {s: ds.map(fn, batched=True, remove_columns=[c for c in ds.column_names if c not in keep],
                       desc=f"tokenizing {s}") for s, ds in raw.items()}
        )

    def evaluate(self, accelerator: Accelerator, model, dataloader: DataLoader, features: Dataset,
                 examples: Dataset, task: DictConfig, labels: list[str] | None,
                 out_dir: Path | None = None, name: str = "validation") -> dict[str, float]:
        positive = positive_label(task, labels)
        return evaluate_model(accelerator, model, dataloader, list(task.metrics), None if labels is None else len(labels),
                              1 if positive is None else labels.index(positive))
