"""Shared data module: raw splits → labels → cached tokenization → dataloaders, for every task family.

What differs per family (file formats, labels, features, collator) is asked of `ampft.tasks.family_for`.
Tokenization runs once per (tokenizer, task, length and family settings, data) and is kept on disk under
`cfg.cache_dir`; a second run of the same recipe loads it in well under a second. Batches are padded
dynamically (to a multiple of 8 under mixed precision, for Tensor Core shapes).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset, DatasetDict, load_from_disk
from omegaconf import DictConfig
from torch.utils.data import DataLoader, RandomSampler
from transformers import PreTrainedTokenizerBase
from transformers.trainer_pt_utils import LengthGroupedSampler

from ampft.config import Precision, TaskFamily, cache_root
from ampft.data import demo
from ampft.data.load import DataError
from ampft.tasks import family_for

__all__ = ["DataError", "TaskData", "prepare_data", "build_dataloaders", "eval_dataloader"]

log = logging.getLogger(__name__)


@dataclass
class TaskData:
    train: Dataset
    validation: Dataset
    labels: list[str] | None  # None for regression and question answering
    cache_path: Path
    extra: dict[str, Dataset] = field(default_factory=dict)  # features of the extra validation splits
    # The raw rows of each validation split ("validation" and the extra ones), which NER and QA score against.
    examples: dict[str, Dataset] = field(default_factory=dict)


def _cache_key(raw: DatasetDict, task: DictConfig, tokenizer: PreTrainedTokenizerBase, labels) -> str:
    key = dict(
        tokenizer=[type(tokenizer).__name__, tokenizer.name_or_path, len(tokenizer), tokenizer.padding_side,
                   getattr(tokenizer, "add_prefix_space", None)],
        family=[TaskFamily(task.family).value, family_for(task.family).cache_settings(task)],
        text_fields=list(task.text_fields),
        max_length=task.max_length,
        labels=labels,
        data=[[s, raw[s]._fingerprint] for s in raw],
        demo=demo.VERSION,
    )
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _tokenize(raw: DatasetDict, task: DictConfig, tokenizer: PreTrainedTokenizerBase, labels) -> DatasetDict:
    return family_for(task.family).tokenize(raw, task, tokenizer, labels)


def prepare_data(cfg: DictConfig, tokenizer: PreTrainedTokenizerBase, main_process_first) -> TaskData:
    """Load, label and tokenize the task's splits; the main process does it first and caches it."""
    task = cfg.task
    with main_process_first():
        raw, labels = family_for(task.family).load(task)
        path = cache_root(cfg) / "tokenized" / f"{task.name}-{_cache_key(raw, task, tokenizer, labels)}"
        if path.is_dir():
            log.info("tokenized %s loaded from cache %s", task.name, path)
        else:
            tokenized = _tokenize(raw, task, tokenizer, labels)
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            tokenized.save_to_disk(str(tmp))
            try:
                tmp.rename(path)  # atomic: a half-written cache is never picked up
            except OSError:  # another process won the race; use its copy
                shutil.rmtree(tmp, ignore_errors=True)
            log.info("tokenized %s cached at %s", task.name, path)
        tokenized = load_from_disk(str(path))
    extra = {s: tokenized[s] for s in raw if s not in ("train", "validation")}
    return TaskData(tokenized["train"], tokenized["validation"], labels, path, extra,
                    examples={s: raw[s] for s in raw if s != "train"})


class EpochLengthGroupedSampler(LengthGroupedSampler):
    """transformers' length-grouped sampler, reseeded per epoch so that data order is reproducible."""

    def __init__(self, batch_size: int, lengths: list[int], seed: int):
        super().__init__(batch_size, lengths=lengths, generator=torch.Generator().manual_seed(seed))
        self.seed = seed

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed(self.seed + epoch)


def model_columns(candidates: tuple[str, ...], available: list[str], model=None) -> list[str]:
    """The feature columns a batch gives the model: the family's inputs that the data has and, given the
    model, that its forward takes. token_type_ids are dropped for models without segment embeddings
    (type_vocab_size < 2: RoBERTa, DeBERTa-v3), where a BERT tokenizer's pair ids would index past them."""
    columns = [c for c in candidates if c in available]
    if model is not None:
        accepted = inspect.signature(model.forward).parameters
        columns = [c for c in columns if c in accepted]
        if getattr(model.config, "type_vocab_size", 2) < 2 and "token_type_ids" in columns:
            columns.remove("token_type_ids")
    return columns


def _loader_parts(cfg: DictConfig, data: TaskData, tokenizer: PreTrainedTokenizerBase, model):
    family = family_for(cfg.task.family)
    mixed = cfg.precision.name in (Precision.fp16, Precision.bf16)
    return family.collator(tokenizer, mixed), model_columns(family.model_inputs, data.train.column_names, model)


def eval_dataloader(cfg: DictConfig, data: TaskData, dataset: Dataset, tokenizer: PreTrainedTokenizerBase,
                    pin_memory: bool, model=None) -> DataLoader:
    """A validation split's loader: file order, model inputs only (NER/QA keep word_ids, offsets in `dataset`)."""
    collate, columns = _loader_parts(cfg, data, tokenizer, model)
    tr = cfg.trainer
    return DataLoader(dataset.select_columns(columns), batch_size=tr.eval_batch_size or 2 * tr.batch_size,
                      generator=torch.Generator().manual_seed(tr.seed), collate_fn=collate,
                      num_workers=tr.num_workers, pin_memory=pin_memory)


def build_dataloaders(cfg: DictConfig, data: TaskData, tokenizer: PreTrainedTokenizerBase,
                      pin_memory: bool, model=None) -> tuple[DataLoader, DataLoader]:
    """Train and validation loaders; `model` (optional) drops the columns its forward does not take."""
    tr = cfg.trainer
    collate, columns = _loader_parts(cfg, data, tokenizer, model)
    train = data.train.select_columns(columns)
    if tr.group_by_length:
        sampler = EpochLengthGroupedSampler(tr.batch_size, data.train["length"][:], tr.seed)
    else:
        sampler = RandomSampler(train)  # Accelerate turns it into a seedable sampler (set_epoch)
    # Own generators: creating an iterator must not draw from the global RNG, or a resumed run's dropout
    # masks (restored RNG state, then a fresh iterator) would differ from the uninterrupted run's.
    train_dl = DataLoader(train, batch_size=tr.batch_size, sampler=sampler, collate_fn=collate,
                          generator=torch.Generator().manual_seed(tr.seed), num_workers=tr.num_workers,
                          pin_memory=pin_memory)
    return train_dl, eval_dataloader(cfg, data, data.validation, tokenizer, pin_memory, model)
