"""Shared data package: raw splits → labels → cached tokenization → dataloaders, for every task family.

`load` reads the raw splits (Hub, local files, the `demo` task), `prepare` labels and tokenizes them (cached
on disk) into `TaskData`, `batches` forms training batches by length (length-grouped sampler, length chunks)
and `loaders` builds the dataloaders. What differs per family (file formats, labels, features, collator) is
asked of the task family object (`ampft.tasks`), which the caller resolves once and passes in. The names
callers use are importable from here.
"""

from ampft.data.batches import LengthChunks, LengthGroupedSampler, chunk_cost, length_chunks, split_by_length
from ampft.data.load import DataError
from ampft.data.loaders import build_dataloaders, eval_dataloader, inference_dataloader, padding
from ampft.data.prepare import TaskData, length_order, prepare_data

__all__ = ["DataError", "TaskData", "LengthGroupedSampler", "LengthChunks", "chunk_cost", "split_by_length", "prepare_data",
           "build_dataloaders", "eval_dataloader", "inference_dataloader", "length_order", "padding", "length_chunks"]
