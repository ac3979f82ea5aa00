"""Dataloaders: the family's collator, the model inputs its forward takes, padding, workers."""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING

import torch
from datasets import Dataset
from omegaconf import DictConfig
from torch.utils.data import DataLoader, RandomSampler
from transformers import PreTrainedTokenizerBase

from ampft.config import Padding, Precision
from ampft.data.batches import LengthChunks, LengthGroupedSampler, chunk_cost, length_chunks
from ampft.data.prepare import TaskData

if TYPE_CHECKING:  # the families import this package's loaders
    from ampft.tasks.base import Family


def model_columns(candidates: tuple[str, ...], available: list[str], model=None) -> list[str]:
    """The family's inputs that the data has and (given the model) its forward takes. token_type_ids are
    dropped for models without segment embeddings (RoBERTa, DeBERTa-v3): pair ids would index past them."""
    columns = [c for c in candidates if c in available]
    if model is not None:
        accepted = inspect.signature(model.forward).parameters
        columns = [c for c in columns if c in accepted]
        if getattr(model.config, "type_vocab_size", 2) < 2 and "token_type_ids" in columns:
            columns.remove("token_type_ids")
    return columns


def padding(cfg: DictConfig, tokenizer: PreTrainedTokenizerBase, device: torch.device) -> dict:
    """The collators' `padding`, `max_length` and `pad_to_multiple_of`: 8 under fp16/bf16 on CUDA (Tensor Core
    shapes), 1 on CPU where extra tokens are only work (docs/benchmarks/peer-sst2-bf16); under torch.compile at
    most trainer.compile_buckets lengths. Left-padding tokenizers' NER/QA features are padded at tokenization."""
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


def _loader_kwargs(cfg: DictConfig, device: torch.device) -> dict:
    # trainer.num_workers null: 2 on CUDA (collating overlaps GPU work), 0 on CPU (its cores train).
    workers = cfg.trainer.num_workers
    if workers is None:
        workers = 2 if device.type == "cuda" else 0
    # Own generators: creating an iterator must not draw from the global RNG, or a resumed run's dropout
    # masks (restored RNG state, then a fresh iterator) would differ from the uninterrupted run's.
    return dict(num_workers=workers, pin_memory=device.type == "cuda", persistent_workers=workers > 0,
                generator=torch.Generator().manual_seed(cfg.trainer.seed))


def inference_dataloader(cfg: DictConfig, family: Family, dataset: Dataset, tokenizer: PreTrainedTokenizerBase,
                         device: torch.device, model=None) -> DataLoader:
    """Features in `dataset`'s order, in evaluation batches, model inputs only: evaluation and `make predict`."""
    collate = family.collator_class(tokenizer, **padding(cfg, tokenizer, device))
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
    """Train and validation loaders; `model` drops the columns its forward does not take. Length groups are
    global batches (`batch_size` x `num_processes`): Accelerate deals consecutive batches to the ranks in turn."""
    tr = cfg.trainer
    pad = padding(cfg, tokenizer, device)
    collate = data.family.collator_class(tokenizer, **pad)
    train = data.train.select_columns(model_columns(data.family.model_inputs, data.train.column_names, model))
    if tr.group_by_length:
        sampler = LengthGroupedSampler(data.train["length"][:], tr.batch_size * num_processes, tr.seed,
                                       tr.length_group_size)
    else:
        sampler = RandomSampler(train)  # Accelerate turns it into a seedable sampler (set_epoch)
    chunks = length_chunks(cfg, device)
    train_collate = collate
    if chunks > 1:  # the model's parameters are counted only when batches are split
        cost = tr.length_chunk_cost if tr.length_chunk_cost is not None else chunk_cost(model)
        train_collate = LengthChunks(collate, chunks, pad["pad_to_multiple_of"], cost)
    train_dl = DataLoader(train, batch_size=tr.batch_size, sampler=sampler, collate_fn=train_collate,
                          **_loader_kwargs(cfg, device))
    return train_dl, eval_dataloader(cfg, data, data.validation, tokenizer, device, model)
