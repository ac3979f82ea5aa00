"""Distributed-safe evaluation: every rank predicts its shard, `gather_for_metrics` drops the padding
Accelerate adds to even out the last batch, so each example is counted exactly once."""

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


def evaluate_model(accelerator: Accelerator, model, dataloader: DataLoader, metrics: list[str],
                   num_labels: int | None) -> dict[str, float]:
    """Metrics by name, plus `loss` (mean over examples) and `samples`; num_labels None: regression."""
    regression = num_labels is None

    def outputs(batch, out):
        logits = out.logits.float()
        pred = logits.squeeze(-1) if regression else logits.argmax(dim=-1)
        return pred, batch["labels"], out.loss.float().expand(len(pred))  # per-example share of the batch mean

    preds, refs, losses = (torch.cat(parts) for parts in predict(accelerator, model, dataloader, outputs))
    predictions, references = preds.numpy(), refs.numpy()
    results = compute(metrics, predictions, references, num_labels)
    results["loss"] = float(losses.mean())
    results["samples"] = len(references)
    return results
