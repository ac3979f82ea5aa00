"""Shared data module: raw splits → labels → cached tokenization → dataloaders.

Tokenization runs once per (tokenizer, task, length settings, data) and is kept on disk under
`cfg.cache_dir`; a second run of the same recipe loads it in well under a second. Batches are padded
dynamically (to a multiple of 8 under mixed precision, for Tensor Core shapes).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset, DatasetDict, load_from_disk
from omegaconf import DictConfig
from torch.utils.data import DataLoader, RandomSampler
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase
from transformers.trainer_pt_utils import LengthGroupedSampler

from ampft.config import Precision, cache_root
from ampft.data import demo
from ampft.data.load import DataError, encode_labels, label_names, load_raw

__all__ = ["DataError", "TaskData", "prepare_data", "build_dataloaders"]

log = logging.getLogger(__name__)
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "labels")


@dataclass
class TaskData:
    train: Dataset
    validation: Dataset
    labels: list[str] | None  # None for regression
    cache_path: Path


def _cache_key(raw: DatasetDict, task: DictConfig, tokenizer: PreTrainedTokenizerBase, labels) -> str:
    key = dict(
        tokenizer=[type(tokenizer).__name__, tokenizer.name_or_path, len(tokenizer)],
        text_fields=list(task.text_fields),
        max_length=task.max_length,
        labels=labels,
        data=[raw[s]._fingerprint for s in ("train", "validation")],
        demo=demo.VERSION,
    )
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _tokenize(raw: DatasetDict, task: DictConfig, tokenizer: PreTrainedTokenizerBase) -> DatasetDict:
    fields = list(task.text_fields)

    def fn(batch):
        texts = [[("" if t is None else str(t)) for t in batch[f]] for f in fields]
        enc = tokenizer(*texts, truncation=True, max_length=task.max_length)
        enc["length"] = [len(ids) for ids in enc["input_ids"]]
        return enc

    keep = [c for c in raw["train"].column_names if c == "labels"]
    return DatasetDict(
        {s: ds.map(fn, batched=True, remove_columns=[c for c in ds.column_names if c not in keep],
                   desc=f"tokenizing {s}") for s, ds in raw.items()}
    )


def prepare_data(cfg: DictConfig, tokenizer: PreTrainedTokenizerBase, main_process_first) -> TaskData:
    """Load, label and tokenize the task's splits; the main process does it first and caches it."""
    task = cfg.task
    with main_process_first():
        raw = load_raw(task)
        labels = label_names(raw, task)
        raw = encode_labels(raw, task, labels)
        path = cache_root(cfg) / "tokenized" / f"{task.name}-{_cache_key(raw, task, tokenizer, labels)}"
        if path.is_dir():
            log.info("tokenized %s loaded from cache %s", task.name, path)
        else:
            tokenized = _tokenize(raw, task, tokenizer)
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            tokenized.save_to_disk(str(tmp))
            try:
                tmp.rename(path)  # atomic: a half-written cache is never picked up
            except OSError:  # another process won the race; use its copy
                shutil.rmtree(tmp, ignore_errors=True)
            log.info("tokenized %s cached at %s", task.name, path)
        tokenized = load_from_disk(str(path))
    return TaskData(tokenized["train"], tokenized["validation"], labels, path)


class EpochLengthGroupedSampler(LengthGroupedSampler):
    """transformers' length-grouped sampler, reseeded per epoch so that data order is reproducible."""

    def __init__(self, batch_size: int, lengths: list[int], seed: int):
        super().__init__(batch_size, lengths=lengths, generator=torch.Generator().manual_seed(seed))
        self.seed = seed

    def set_epoch(self, epoch: int) -> None:
        self.generator.manual_seed(self.seed + epoch)


def build_dataloaders(cfg: DictConfig, data: TaskData, tokenizer: PreTrainedTokenizerBase,
                      pin_memory: bool) -> tuple[DataLoader, DataLoader]:
    tr = cfg.trainer
    mixed = cfg.precision.name in (Precision.fp16, Precision.bf16)
    collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if mixed else None)
    columns = [c for c in MODEL_INPUTS if c in data.train.column_names]
    train, validation = (ds.select_columns(columns) for ds in (data.train, data.validation))
    if tr.group_by_length:
        sampler = EpochLengthGroupedSampler(tr.batch_size, data.train["length"][:], tr.seed)
    else:
        sampler = RandomSampler(train)  # Accelerate turns it into a seedable sampler (set_epoch)
    common = dict(collate_fn=collate, num_workers=tr.num_workers, pin_memory=pin_memory)
    # Own generators: creating an iterator must not draw from the global RNG, or a resumed run's dropout
    # masks (restored RNG state, then a fresh iterator) would differ from the uninterrupted run's.
    train_dl = DataLoader(train, batch_size=tr.batch_size, sampler=sampler,
                          generator=torch.Generator().manual_seed(tr.seed), **common)
    eval_dl = DataLoader(validation, batch_size=tr.eval_batch_size or 2 * tr.batch_size,
                         generator=torch.Generator().manual_seed(tr.seed), **common)
    return train_dl, eval_dl
