"""The one inference loop under every task family's `evaluate` and `predict`: `gather_for_metrics` drops the
padding Accelerate adds to even out the last batch, so each example counts exactly once on any number of ranks.
Losses are gathered per example like the predictions (a mean of per-batch means would weight a short last
batch), so they do not depend on the evaluation batch size or the number of ranks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

__all__ = ["predict"]


@torch.inference_mode()
def predict(accelerator: Accelerator, model, dataloader: DataLoader,
            outputs: Callable[[dict, Any], tuple[torch.Tensor, ...]]) -> list[list[torch.Tensor]]:
    """Run `model` in eval mode over `dataloader`; `outputs(batch, model_output)` picks per-example tensors
    (dim 0 is the batch), which are gathered across ranks (each example once) and moved to the CPU.
    Returns, per output, its list of per-batch tensors: rows of different batches may differ in width (NER,
    QA), so concatenating is the caller's choice. The model's train/eval mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        gathered: list[list[torch.Tensor]] = []
        for batch in dataloader:
            values = accelerator.gather_for_metrics(outputs(batch, model(**batch)))
            gathered = gathered or [[] for _ in values]
            for parts, value in zip(gathered, values, strict=True):
                parts.append(value.cpu())
        return gathered
    finally:
        model.train(was_training)
