"""Distributed-safe evaluation: every rank predicts its shard, `gather_for_metrics` drops the padding
Accelerate adds to even out the last batch, so each example is counted exactly once.

Evaluation losses are computed per example (per token for NER) and gathered like the predictions, then
averaged over the split: the same number whatever the evaluation batch size and the number of ranks (a mean
of per-batch means would weight a short last batch, and the duplicates that pad it under several ranks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from ampft.evaluation.metrics import compute, load_metric

__all__ = ["evaluate_model", "predict", "compute", "load_metric"]


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


def example_losses(logits: torch.Tensor, labels: torch.Tensor, regression: bool) -> torch.Tensor:
    """Each example's loss as the model's own loss computes it for the batch (mean squared error for one
    regression output, cross-entropy otherwise), unreduced."""
    logits = logits.float()
    if regression:
        return (logits.squeeze(-1) - labels.float()) ** 2
    return torch.nn.functional.cross_entropy(logits, labels, reduction="none")


def evaluate_model(accelerator: Accelerator, model, dataloader: DataLoader, metrics: list[str],
                   num_labels: int | None, positive: int = 1) -> dict[str, float]:
    """Metrics by name, plus `loss` (mean over examples) and `samples`; num_labels None: regression.
    `positive`: the label id binary F1 scores (two labels)."""
    regression = num_labels is None

    def outputs(batch, out):
        logits = out.logits.float()
        pred = logits.squeeze(-1) if regression else logits.argmax(dim=-1)
        return pred, batch["labels"], example_losses(logits, batch["labels"], regression)

    preds, refs, losses = (torch.cat(parts) for parts in predict(accelerator, model, dataloader, outputs))
    predictions, references = preds.numpy(), refs.numpy()
    results = compute(metrics, predictions, references, num_labels, positive)
    results["loss"] = float(losses.mean())
    results["samples"] = len(references)
    return results
