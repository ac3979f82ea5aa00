"""Raw splits (`load`) → labels and cached tokenization (`prepare`) → batches by length (`batches`) →
dataloaders (`loaders`), for every task family."""

from ampft.data.batches import LengthChunks, LengthGroupedSampler, chunk_cost, length_chunks, split_by_length
from ampft.data.load import DataError
from ampft.data.loaders import build_dataloaders, eval_dataloader, inference_dataloader, padding
from ampft.data.prepare import TaskData, length_order, prepare_data

__all__ = ["DataError", "TaskData", "LengthGroupedSampler", "LengthChunks", "chunk_cost", "split_by_length",
           "prepare_data", "build_dataloaders", "eval_dataloader", "inference_dataloader", "length_order", "padding",
           "length_chunks"]
