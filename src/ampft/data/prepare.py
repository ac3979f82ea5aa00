"""Raw splits → labels → tokenization cached on disk → `TaskData`; validation splits in length order (less
padding, same scores)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from datasets import Dataset, DatasetDict, load_from_disk
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from ampft.config import cache_root
from ampft.data import demo
from ampft.files import file_digest

if TYPE_CHECKING:  # the families import this package's loaders
    from ampft.tasks.base import Family

log = logging.getLogger(__name__)


@dataclass
class TaskData:
    train: Dataset
    validation: Dataset
    labels: list[str] | None  # None for regression and question answering
    cache_path: Path
    family: Family  # the task family that loaded, tokenizes, collates and evaluates this data
    extra: dict[str, Dataset] = field(default_factory=dict)  # features of the extra validation splits
    # The raw rows of each validation split ("validation" and the extra ones), which NER and QA score against.
    examples: dict[str, Dataset] = field(default_factory=dict)


def _cache_key(raw: DatasetDict, task: DictConfig, family: Family, tokenizer: PreTrainedTokenizerBase, labels) -> str:
    key = dict(
        tokenizer=[type(tokenizer).__name__, tokenizer.name_or_path, len(tokenizer), tokenizer.padding_side,
                   getattr(tokenizer, "add_prefix_space", None)],
        family=[family.name, family.cache_settings(task)],
        text_fields=list(task.text_fields),
        max_length=task.max_length,
        labels=labels,
        data=[[s, raw[s]._fingerprint] for s in raw],
        # The files' content, not only datasets' fingerprints (which follow a local file's path and mtime).
        files=[file_digest(p) for p in (task.train_file, task.validation_file, *task.extra_validation_splits)
               if p is not None and task.train_file is not None],
        demo=demo.VERSION,
    )
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def prepare_data(cfg: DictConfig, family: Family, tokenizer: PreTrainedTokenizerBase, main_process_first) -> TaskData:
    """Load, label and tokenize the task's splits with `family`; the main process does it first and caches it."""
    task = cfg.task
    with main_process_first():
        raw, labels = family.load(task)
        path = cache_root(cfg) / "tokenized" / f"{task.name}-{_cache_key(raw, task, family, tokenizer, labels)}"
        if path.is_dir():
            log.info("tokenized %s loaded from cache %s", task.name, path)
        else:
            tokenized = family.tokenize(raw, task, tokenizer, labels)
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            try:
                tokenized.save_to_disk(str(tmp))
            except OSError as exc:  # a full or read-only disk: the cache only saves time, train without it
                shutil.rmtree(tmp, ignore_errors=True)
                free = shutil.disk_usage(cache_root(cfg)).free if cache_root(cfg).exists() else 0
                log.warning("could not write the tokenization cache %s (%s; %.1f MiB free there): training from "
                            "memory, tokenizing again next time; free some space or set cache_dir= (or "
                            "$AMPFT_CACHE) to a disk with room", path, exc, free / 2**20)
            else:
                try:
                    tmp.rename(path)  # atomic: a half-written cache is never picked up
                except OSError:  # another process won the race; use its copy
                    shutil.rmtree(tmp, ignore_errors=True)
                log.info("tokenized %s cached at %s", task.name, path)
        if path.is_dir():
            tokenized = load_from_disk(str(path))
    features = {s: tokenized[s] for s in raw if s != "train"}
    examples = {s: raw[s] for s in raw if s != "train"}
    for s, ds in features.items():
        order = length_order(ds["length"][:])
        features[s] = ds.select(order)
        if family.one_feature_per_example:  # features[i] scores against examples[i] (QA: by example id)
            examples[s] = examples[s].select(order)
    extra = {s: ds for s, ds in features.items() if s != "validation"}
    return TaskData(tokenized["train"], features["validation"], labels, path, family, extra, examples=examples)


def length_order(lengths: list[int]) -> list[int]:
    """Indices longest first (an out-of-memory batch shows up at once), ties in file order."""
    return np.argsort(-np.asarray(lengths), kind="stable").tolist()
