"""Task families: what differs between sequence classification, NER and extractive QA, behind one interface.

`ner` (token classification, CoNLL files) and `qa` (extractive QA, SQuAD JSON) are libraries of plain
functions over `datasets.Dataset`: they read their data format, turn examples into model features (and
back), and score predictions with an offline `evaluate.Metric`, without depending on the training loop.
The family objects wire them (and the sequence classification code in `ampft.data.load` and
`ampft.evaluation`) into the recipe: `family_for(task.family)` returns one of

    classification.Classification        task.family=classification | regression
    token_classification.TokenClassification   task.family=token_classification
    question_answering.QuestionAnswering       task.family=question_answering

each with the `Family` interface below. The shared modules call it: `ampft.data` (load, label, tokenize into
the on-disk cache, collate), `ampft.models.build_model` (the head, by family), `ampft.validation.validate`
(file formats), and `evaluate` here (metrics on the validation split and the extra ones).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accelerate import Accelerator
from datasets import Dataset, DatasetDict
from omegaconf import DictConfig
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from ampft.config import TaskFamily


class Family:
    """What the shared modules ask of a task family; the defaults are sequence classification's."""

    #: the columns a batch gives the model (those the model's forward takes are kept)
    model_inputs: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids", "labels")
    #: local files this family reads, for messages
    files: str = "csv, tsv, json, jsonl or parquet"
    #: the Hugging Face pipeline that runs an exported model
    pipeline_tag: str = "text-classification"
    #: validation feature i belongs to example i (false for QA: an example may span several windows)
    one_feature_per_example: bool = True

    def check_file(self, path: str) -> None:
        """Raise ValueError naming the file and what would work when it is not in a format read here."""
        raise NotImplementedError

    def adapt_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
        """The tokenizer this family needs (e.g. byte-level BPE with a prefix space for pre-split words)."""
        return tokenizer

    def load(self, task: DictConfig) -> tuple[DatasetDict, list[str] | None]:
        """Raw splits (train, validation, extra validation splits by name) and the label names in id order."""
        raise NotImplementedError

    def cache_settings(self, task: DictConfig) -> dict[str, Any]:
        """Every setting the tokenized features depend on besides tokenizer, max_length, labels and data."""
        return {}

    def tokenize(self, raw: DatasetDict, task: DictConfig, tokenizer: PreTrainedTokenizerBase,
                 labels: list[str] | None) -> DatasetDict:
        """Model features per split; a `length` column (tokens) for the length-grouped sampler."""
        raise NotImplementedError

    def collator(self, tokenizer: PreTrainedTokenizerBase, padding: str = "longest", max_length: int | None = None,
                 pad_to_multiple_of: int | None = None):
        """Batches padded as `ampft.data.padding` says."""
        return DataCollatorWithPadding(tokenizer, padding=padding, max_length=max_length,
                                       pad_to_multiple_of=pad_to_multiple_of)

    def evaluate(self, accelerator: Accelerator, model, dataloader: DataLoader, features: Dataset,
                 examples: Dataset, task: DictConfig, labels: list[str] | None,
                 out_dir: Path | None = None, name: str = "validation") -> dict[str, float]:
        """Metrics (keys as validation.FAMILY_METRICS says), `loss` and `samples` (examples scored) on one split;
        `dataloader` yields `features` in order. Predictions go to `out_dir` where the family writes any."""
        raise NotImplementedError


def family_for(family: TaskFamily | str) -> Family:
    family = TaskFamily(family)
    if family in (TaskFamily.classification, TaskFamily.regression):
        from ampft.tasks.classification import Classification

        return Classification()
    if family == TaskFamily.token_classification:
        from ampft.tasks.token_classification import TokenClassification

        return TokenClassification()
    from ampft.tasks.question_answering import QuestionAnswering

    return QuestionAnswering()


def evaluate(accelerator: Accelerator, model, data, dataloaders: dict[str, DataLoader], task: DictConfig,
             out_dir: Path | None = None, main_name: str = "validation") -> dict[str, float]:
    """The validation split's results, then each extra validation split's as `<name>/<key>`.

    `data` is the `ampft.data.TaskData` the dataloaders were built from, `dataloaders` maps split names
    ("validation" first) to prepared loaders. Prediction files (QA) are named by the split, the main one
    by `main_name`."""
    family = family_for(task.family)
    results: dict[str, float] = {}
    for name, dataloader in dataloaders.items():
        features = data.validation if name == "validation" else data.extra[name]
        split = family.evaluate(accelerator, model, dataloader, features, data.examples[name], task, data.labels,
                                out_dir, main_name if name == "validation" else name)
        if name == "validation":
            results.update(split)
        else:
            results.update({f"{name}/{k}": v for k, v in split.items() if k != "samples"})
    return results
