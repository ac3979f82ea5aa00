"""The task family interface and its registry: one object per `task.family` name owns everything that differs
between task kinds. `ampft.finetune.build` looks it up once per run (`family_for`) and passes it on. Also the one
inference loop under every family's `evaluate` and `predict` (`gather`): each example counts once on any number of
ranks, and losses are gathered per example (a mean of per-batch means would weight a short last batch)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch
from accelerate import Accelerator
from datasets import Dataset, DatasetDict
from omegaconf import DictConfig
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, PretrainedConfig, PreTrainedTokenizerBase

from ampft.data.load import PREDICT


class Family:
    """What the shared modules ask of a task family: each sets the class attributes annotated here."""

    #: the task.family value that selects it
    name: ClassVar[str]
    #: metric name (task.metrics) -> the result keys it produces (what task.main_metric / checkpoint.metric name)
    metrics: ClassVar[dict[str, tuple[str, ...]]]
    #: the transformers Auto class of the model it trains (and `make evaluate` reloads)
    model_class: ClassVar[type]
    #: the Hugging Face pipeline that runs an exported model
    pipeline_tag: ClassVar[str]
    #: the transformers collator that pads its batches (as `ampft.data.padding` says)
    collator_class: ClassVar[type] = DataCollatorWithPadding
    #: the columns a batch gives the model (those the model's forward takes are kept)
    model_inputs: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask", "token_type_ids", "labels")
    #: local files it reads, for messages
    files: ClassVar[str]
    #: the extensions of the local files it reads (`check_file`)
    extensions: ClassVar[tuple[str, ...]] = ()
    #: validation feature i belongs to example i (false for QA: an example may span several windows)
    one_feature_per_example: ClassVar[bool]
    #: its metrics report percent (seqeval, SQuAD) rather than fractions (GLUE)
    scores_in_percent: ClassVar[bool]
    #: labels to build the model with when no data is read (`make estimate`); None: the family has no label set
    typical_label_count: ClassVar[int | None]

    def check(self, task: DictConfig, files: list[tuple[str, str]]) -> list[str]:
        """The family's problems with the task group (`files`: (key, path)), each naming the key and a fix."""
        raise NotImplementedError

    def check_file(self, path: str) -> None:
        """Raise ValueError naming the file and what would work when it is not in a format read here."""
        ext = Path(path).suffix.lower()
        if ext not in self.extensions:
            raise ValueError(f"{path}: unsupported extension {ext!r} for {self.name.replace('_', ' ')}; use {self.files}")

    def adapt_tokenizer(self, tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
        """The tokenizer this family needs (e.g. byte-level BPE with a prefix space for pre-split words)."""
        return tokenizer

    def load(self, task: DictConfig) -> tuple[DatasetDict, list[str] | None]:
        """Raw splits (train, validation, extra validation splits by name) and the label names in id order."""
        raise NotImplementedError

    def cache_settings(self, task: DictConfig) -> dict[str, Any]:
        """Every setting the tokenized features depend on besides tokenizer, max_length, labels and data."""
        return {}

    def encoder(self, task: DictConfig, tokenizer: PreTrainedTokenizerBase, labels: list[str] | None,
                split: str) -> Callable[[dict], dict]:
        """A batch of a split's examples -> model features: the train split's with their targets, a validation
        split's with what `evaluate` reads back too, a file to predict's (split `PREDICT`) without targets."""
        raise NotImplementedError

    def tokenize(self, raw: DatasetDict, task: DictConfig, tokenizer: PreTrainedTokenizerBase,
                 labels: list[str] | None) -> DatasetDict:
        """Model features per split, with a `length` column (tokens) for the length-grouped sampler."""
        return DatasetDict({split: _encoded(ds, self.encoder(task, tokenizer, labels, split), f"tokenizing {split}")
                            for split, ds in raw.items()})

    def fake_targets(self, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
        """A batch's training targets as zeros in the loss's shapes and dtypes (`make estimate` traces with them)."""
        raise NotImplementedError

    def model_kwargs(self, labels: list[str] | None) -> dict[str, Any]:
        """The model config's task settings (number of outputs, label names) for `labels`."""
        if labels is None:
            raise ValueError(f"{self.name.replace('_', ' ')} needs its labels (the label list)")
        return dict(num_labels=len(labels), id2label=dict(enumerate(labels)),
                    label2id={name: i for i, name in enumerate(labels)})

    def labels_from_model(self, config: PretrainedConfig) -> list[str] | None:
        """The label names in id order that a saved model was trained with (None: the family has no label set)."""
        if self.typical_label_count is None:
            return None
        return [config.id2label[i] for i in range(config.num_labels)]

    def positive_label(self, task: DictConfig, labels: list[str] | None) -> str | None:
        """The class binary F1 scores, where the family has one."""
        return None

    def evaluate(self, accelerator: Accelerator, model, dataloader: DataLoader, features: Dataset,
                 examples: Dataset, task: DictConfig, labels: list[str] | None,
                 out_dir: Path | None = None, name: str = "validation") -> dict[str, float]:
        """Metrics, `loss` and `samples` (examples scored) on one split (`dataloader` yields `features` in order);
        any predictions the family writes go to `out_dir`."""
        raise NotImplementedError

    def read_inputs(self, task: DictConfig, path: str) -> Dataset:
        """The examples of a file to predict, labels not needed; a DataError naming `file=PATH` and line when it is
        malformed or holds none."""
        raise NotImplementedError

    def input_features(self, inputs: Dataset, task: DictConfig, tokenizer: PreTrainedTokenizerBase) -> Dataset:
        """Model features of `inputs` (`read_inputs`), with what `predict` reads back and a `length` column."""
        return _encoded(inputs, self.encoder(task, tokenizer, task.labels, PREDICT), "tokenizing")

    def predict(self, accelerator: Accelerator, model, dataloader: DataLoader, features: Dataset,
                inputs: Dataset, task: DictConfig, labels: list[str] | None) -> list[dict[str, Any]]:
        """One JSON-able row per example of `inputs`, in that order (`dataloader` yields `features` in order)."""
        raise NotImplementedError

    def usage(self, task: DictConfig) -> str:
        """The model card's Python: load the export from "path/to/this/folder" with transformers alone and print
        what `predict` would for one example."""
        model_class = self.model_class.__name__
        return f"""import torch
from transformers import {model_class}, AutoTokenizer

path = "path/to/this/folder"
tokenizer = AutoTokenizer.from_pretrained(path)
model = {model_class}.from_pretrained(path).eval()
{self.usage_example(task)}"""

    def usage_example(self, task: DictConfig) -> str:
        """`usage` past loading the model: the example's inputs, the model's call, what it prints."""
        raise NotImplementedError

    def metric_keys(self, metrics: list[str]) -> list[str]:
        """The result keys that `metrics` produce (seqeval -> f1, precision, ...; accuracy -> accuracy)."""
        return list(dict.fromkeys(k for m in metrics for k in self.metrics.get(m, (m,))))


def _encoded(inputs: Dataset, encode: Callable[[dict], dict], desc: str) -> Dataset:
    """`inputs` as model features only (`encode`: a batch of examples -> features), with their `length` in tokens."""

    def fn(batch):
        out = encode(batch)
        return {**out, "length": [len(ids) for ids in out["input_ids"]]}

    return inputs.map(fn, batched=True, remove_columns=inputs.column_names, desc=desc)


@torch.no_grad()  # not inference_mode: ZeRO-3 would keep inference tensors from it, which training cannot use
def gather(accelerator: Accelerator, model, dataloader: DataLoader,
           outputs: Callable[[dict, Any], tuple[torch.Tensor, ...]],
           pad: float | None = None) -> list[list[torch.Tensor]]:
    """Per output of `outputs(batch, model_output)` (per-example tensors), its per-batch tensors gathered across
    ranks, on the CPU. Widths may differ by batch (NER, QA) and by rank: `pad` fills per-token outputs to the
    widest rank's. The model's train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        gathered: list[list[torch.Tensor]] = []
        for batch in dataloader:
            values = outputs(batch, model(**batch))
            if pad is not None:
                values = [accelerator.pad_across_processes(v, dim=1, pad_index=pad) if v.dim() > 1 else v
                          for v in values]
            values = accelerator.gather_for_metrics(tuple(values))
            gathered = gathered or [[] for _ in values]
            for parts, value in zip(gathered, values, strict=True):
                parts.append(value.cpu())
        return gathered
    finally:
        model.train(was_training)


def rows(parts: list[torch.Tensor]) -> list:
    """The per-example rows of `gather`'s per-batch tensors, as numpy arrays (widths may differ by batch)."""
    return [row for batch in parts for row in batch.numpy()]


def column_names_unread(task: DictConfig) -> list[str]:
    """task.column_names names the columns of headerless csv/tsv files, which only sequence tasks read."""
    if task.column_names is None:
        return []
    return [f"task.column_names={list(task.column_names)}: only for local .csv/.tsv files of a classification or "
            "regression task (task.train_file=...)"]


FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    if family.name in FAMILIES:
        raise ValueError(f"task family {family.name!r} is registered twice ({type(FAMILIES[family.name]).__name__}, "
                         f"{type(family).__name__})")
    FAMILIES[family.name] = family
    return family


def family_for(name: str) -> Family:
    try:
        return FAMILIES[str(name)]
    except KeyError:
        raise KeyError(f"task.family={name}: not a task family; registered are {sorted(FAMILIES)}") from None
