"""Shared data module: raw splits → labels → cached tokenization → dataloaders, for every task family.

What differs per family (file formats, labels, features, collator) is asked of the task family object
(`ampft.tasks`), which the caller resolves once and passes in; `TaskData` carries it on.
Tokenization runs once per (tokenizer, task, length and family settings, data) and is kept on disk under
`cfg.cache_dir`; a second run of the same recipe loads it in well under a second.

Fast paths (trainer group): batches padded dynamically to their longest row (rounded up to a multiple of
8 under mixed precision on CUDA, for Tensor Core shapes; to one of `trainer.compile_buckets` lengths under
torch.compile), validation splits evaluated in length order (scored exactly as in file order), training
batches split into chunks of similar lengths (`LengthChunks`: the same examples and loss, less padding),
and, with `trainer.group_by_length`, training batches grouped by length (`LengthGroupedSampler`; off by
default: it costs accuracy, see `TrainerConfig.group_by_length`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from datasets import Dataset, DatasetDict, load_from_disk
from omegaconf import DictConfig
from torch.utils.data import DataLoader, RandomSampler, Sampler
from transformers import PreTrainedTokenizerBase

from ampft.config import Backend, Padding, Precision, cache_root
from ampft.data import demo
from ampft.data.load import DataError, file_digest

if TYPE_CHECKING:  # the families import this package's loaders
    from ampft.tasks.base import Family

__all__ = ["DataError", "TaskData", "LengthGroupedSampler", "LengthChunks", "chunk_cost", "split_by_length", "prepare_data",
           "build_dataloaders", "eval_dataloader", "inference_dataloader", "length_order", "padding", "num_workers",
           "length_chunks"]

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
    """Load, label and tokenize the task's splits with `family` (`ampft.tasks.family_for(cfg.task.family)`);
    the main process does it first and caches it."""
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
    # Evaluate in length order: little padding in the larger eval batches, the same scores as in file order.
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


class LengthGroupedSampler(Sampler[int]):
    """Random batches of similar lengths, reproducible per epoch (`set_epoch`).

    Shuffle, cut into mega-batches of `mega_batches` batches, sort each by length, cut into batches, then
    shuffle the batches so that lengths do not come in waves. The full batch holding the longest example
    goes first (an out-of-memory error shows up at step 1, not hours in); the one partial batch, if any,
    goes last, so the DataLoader's fixed-size chunks of this order are exactly these batches.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int, mega_batches: int = 8):
        self.lengths, self.batch_size, self.seed, self.mega = list(lengths), batch_size, seed, mega_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        perm = torch.randperm(len(self.lengths), generator=g).tolist()
        bs, span = self.batch_size, self.batch_size * self.mega
        batches = []
        for start in range(0, len(perm), span):
            group = sorted(perm[start:start + span], key=self.lengths.__getitem__, reverse=True)
            batches += [group[i:i + bs] for i in range(0, len(group), bs)]
        partial = [batches.pop()] if batches and len(batches[-1]) < bs else []
        if batches:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
            first = max(range(len(batches)), key=lambda i: self.lengths[batches[i][0]])
            batches.insert(0, batches.pop(first))
        for batch in batches + partial:
            yield from batch


MINILM_CHUNK_COST, MINILM_PARAMS = 144, 22.7e6  # chunk_cost's reference: MiniLM-L6, measured


def chunk_cost(model=None) -> int:
    """What one more forward and backward costs beyond its tokens, in tokens: the per-call work that does not
    shrink with the chunk (every weight's gradient written and accumulated, the embedding's dense gradient,
    each op's dispatch). It grows more slowly with the model than the work per token does, so the bigger the
    model, the fewer tokens a chunk costs: 144 for MiniLM-L6 (22.7M parameters), times (parameters /
    22.7M)^-0.43. `python scripts/microbench.py chunks` on the development CPU measured 144 tokens for MiniLM-L6
    and, in another run, tiny-bert 345, MiniLM-L6 124 and BERT-base 62: the exponent is the fit to those three
    (docs/benchmarks/microbench.md). Without a model: MiniLM-L6's."""
    if model is None:
        return MINILM_CHUNK_COST
    params = sum(p.numel() for p in model.parameters())
    return round(MINILM_CHUNK_COST * (params / MINILM_PARAMS) ** -0.43)


def split_by_length(lengths: list[int], max_chunks: int, multiple: int | None = None,
                    overhead: int = 0) -> list[list[int]]:
    """Split one batch (positions into `lengths`) into at most `max_chunks` chunks of consecutive rows of the
    batch sorted longest first, choosing the cuts that minimise the padded tokens (each chunk padded to its
    longest row, rounded up to `multiple`) plus `overhead` tokens per chunk. Longest chunk first; ties
    between equally cheap splits go to fewer chunks."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)
    m = multiple or 1
    width = [-(-lengths[i] // m) * m for i in order]
    n, inf = len(order), float("inf")
    best = [[0.0] + [inf] * n]  # best[k][j]: the cheapest split of the j longest rows into k chunks
    cut = [[0] * (n + 1)]
    for k in range(1, max_chunks + 1):
        best.append([inf] * (n + 1))
        cut.append([0] * (n + 1))
        for j in range(k, n + 1):
            for i in range(k - 1, j):  # the k-th chunk is rows i..j-1, padded to row i's width
                cost = best[k - 1][i] + (j - i) * width[i] + overhead
                if cost < best[k][j]:
                    best[k][j], cut[k][j] = cost, i
    count = min(range(1, min(max_chunks, n) + 1), key=lambda k: best[k][n]) if n else 0
    chunks, j = [], n
    for k in range(count, 0, -1):  # walk the cuts back from the last row
        chunks.append(order[cut[k][j]:j])
        j = cut[k][j]
    return chunks[::-1]


class LengthChunks:
    """A training collator: each batch as up to `max_chunks` chunks of similar lengths (`split_by_length`),
    each padded to its own longest row, or as one batch where splitting would not pay. The chunks hold the
    batch's examples, and `ampft.engine.train_step` weighs their losses so that the update is the whole
    batch's: the same examples and gradient as the unsplit batch (up to float rounding and the dropout
    masks), with less padding. A list of chunks is what the engine takes as one batch."""

    def __init__(self, collate, max_chunks: int, multiple: int | None, cost: int):
        self.collate, self.max_chunks, self.multiple, self.cost = collate, max_chunks, multiple, cost

    def __call__(self, features: list[dict]):
        chunks = split_by_length([len(f["input_ids"]) for f in features], self.max_chunks, self.multiple, self.cost)
        if len(chunks) <= 1:
            return self.collate(features)
        return [self.collate([features[i] for i in chunk]) for chunk in chunks]


def length_chunks(cfg: DictConfig, device: torch.device) -> int:
    """trainer.length_chunks, or (null) 4 on CPU and 1 on CUDA (measured on CPU only; on a GPU try it with
    the peer benchmark). 1 under DeepSpeed, whose engine counts micro-batches itself; under torch.compile,
    whose static shapes would recompile for every new chunk size; and with padding=max_length, where every
    chunk would be as wide as the batch."""
    tr = cfg.trainer
    if cfg.distributed.backend == Backend.deepspeed or tr.compile or tr.padding == Padding.max_length:
        return 1
    if tr.length_chunks is not None:
        return tr.length_chunks
    return 4 if device.type == "cpu" else 1


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


def padding(cfg: DictConfig, tokenizer: PreTrainedTokenizerBase, device: torch.device) -> dict:
    """The collators' padding arguments (DataCollatorWithPadding's `padding`, `max_length`, `pad_to_multiple_of`).

    Dynamic padding rounds each batch up to a multiple: trainer.pad_to_multiple_of, else 8 under fp16/bf16 on
    CUDA (Tensor Core shapes) and 1 elsewhere: a CPU has no such shapes, and the extra tokens are extra work
    (bf16 on SST-2: docs/benchmarks/peer-sst2-bf16). Under torch.compile the multiple is task.max_length /
    trainer.compile_buckets (a multiple of 8), so there are at most that many sequence lengths and as many
    compilations. Left-padding tokenizers get no rounding: their NER/QA features are padded to
    task.max_length at tokenization."""
    tr, max_length = cfg.trainer, cfg.task.max_length
    if tr.padding == Padding.max_length:
        return dict(padding="max_length", max_length=max_length, pad_to_multiple_of=None)
    tensor_cores = device.type == "cuda" and cfg.precision.name in (Precision.fp16, Precision.bf16)
    multiple = tr.pad_to_multiple_of or (8 if tensor_cores else 1)
    if tr.compile:
        multiple = max(multiple, 8 * math.ceil(max_length / tr.compile_buckets / 8))
    if tokenizer.padding_side != "right" or multiple == 1:
        multiple = None
    return dict(padding="longest", max_length=None, pad_to_multiple_of=multiple)


def num_workers(cfg: DictConfig, device: torch.device) -> int:
    """trainer.num_workers, or (null) 2 on CUDA, where collating next batches overlaps GPU work, and 0 on CPU,
    where the cores that would collate are the ones training."""
    if cfg.trainer.num_workers is not None:
        return cfg.trainer.num_workers
    return 2 if device.type == "cuda" else 0


def _loader_parts(cfg: DictConfig, data: TaskData, tokenizer: PreTrainedTokenizerBase, device: torch.device,
                  model):
    family = data.family
    return (family.collator(tokenizer, **padding(cfg, tokenizer, device)),
            model_columns(family.model_inputs, data.train.column_names, model))


def _loader_kwargs(cfg: DictConfig, device: torch.device) -> dict:
    workers = num_workers(cfg, device)
    return dict(num_workers=workers, pin_memory=device.type == "cuda", persistent_workers=workers > 0,
                generator=torch.Generator().manual_seed(cfg.trainer.seed))


def inference_dataloader(cfg: DictConfig, family: Family, dataset: Dataset, tokenizer: PreTrainedTokenizerBase,
                         device: torch.device, model=None) -> DataLoader:
    """Features in `dataset`'s order, in evaluation batches (trainer.eval_batch_size) with the family's
    collator; model inputs only (NER/QA keep word_ids, offsets in `dataset`). Evaluation and `make predict`."""
    collate = family.collator(tokenizer, **padding(cfg, tokenizer, device))
    tr = cfg.trainer
    return DataLoader(dataset.select_columns(model_columns(family.model_inputs, dataset.column_names, model)),
                      batch_size=tr.eval_batch_size or 2 * tr.batch_size, collate_fn=collate,
                      **_loader_kwargs(cfg, device))


def eval_dataloader(cfg: DictConfig, data: TaskData, dataset: Dataset, tokenizer: PreTrainedTokenizerBase,
                    device: torch.device, model=None) -> DataLoader:
    """A validation split's loader, in the split's order (length order, see `prepare_data`)."""
    return inference_dataloader(cfg, data.family, dataset, tokenizer, device, model)


def build_dataloaders(cfg: DictConfig, data: TaskData, tokenizer: PreTrainedTokenizerBase,
                      device: torch.device, model=None, num_processes: int = 1) -> tuple[DataLoader, DataLoader]:
    """Train and validation loaders for `device` (pinned memory and workers on CUDA); `model` (optional)
    drops the columns its forward does not take.

    Batches are random (the Trainer's), or with `trainer.group_by_length` grouped by length. Either way
    Accelerate deals the sampler's consecutive batches to the ranks in turn, so length groups are global
    batches (`batch_size` x `num_processes`): each optimizer step sees the examples that one process with
    the whole global batch would."""
    tr = cfg.trainer
    collate, columns = _loader_parts(cfg, data, tokenizer, device, model)
    train = data.train.select_columns(columns)
    if tr.group_by_length:
        sampler = LengthGroupedSampler(data.train["length"][:], tr.batch_size * num_processes, tr.seed,
                                       tr.length_group_size)
    else:
        sampler = RandomSampler(train)  # Accelerate turns it into a seedable sampler (set_epoch)
    # Own generators: creating an iterator must not draw from the global RNG, or a resumed run's dropout
    # masks (restored RNG state, then a fresh iterator) would differ from the uninterrupted run's.
    chunks = length_chunks(cfg, device)
    train_collate = collate
    if chunks > 1:  # the model's parameters are counted only when batches are split
        cost = tr.length_chunk_cost if tr.length_chunk_cost is not None else chunk_cost(model)
        train_collate = LengthChunks(collate, chunks, padding(cfg, tokenizer, device)["pad_to_multiple_of"], cost)
    train_dl = DataLoader(train, batch_size=tr.batch_size, sampler=sampler, collate_fn=train_collate,
                          **_loader_kwargs(cfg, device))
    return train_dl, eval_dataloader(cfg, data, data.validation, tokenizer, device, model)
