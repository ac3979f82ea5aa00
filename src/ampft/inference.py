"""The one inference loop under every task family's `evaluate` and `predict`: each example counts once on any
number of ranks, and losses are gathered per example (a mean of per-batch means would weight a short last batch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

__all__ = ["predict", "rows"]


@torch.inference_mode()
def predict(accelerator: Accelerator, model, dataloader: DataLoader,
            outputs: Callable[[dict, Any], tuple[torch.Tensor, ...]]) -> list[list[torch.Tensor]]:
    """Per output of `outputs(batch, model_output)` (per-example tensors), its per-batch tensors gathered across
    ranks, on the CPU: widths may differ by batch (NER, QA). The model's train/eval mode is restored afterwards."""
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


def rows(parts: list[torch.Tensor]) -> list:
    """The per-example rows of `predict`'s per-batch tensors, as numpy arrays (widths may differ by batch)."""
    return [row for batch in parts for row in batch.numpy()]
