"""Distributed-safe evaluation: every rank predicts its shard, `gather_for_metrics` drops the padding
Accelerate adds to even out the last batch, so each example is counted exactly once."""

from __future__ import annotations

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from ampft.evaluation.metrics import compute, load_metric

__all__ = ["evaluate_model", "compute", "load_metric"]


@torch.inference_mode()
def evaluate_model(accelerator: Accelerator, model, dataloader: DataLoader, metrics: list[str],
                   num_labels: int | None) -> dict[str, float]:
    """Metrics by name, plus `loss` (mean over examples) and `samples`; num_labels None: regression."""
    regression = num_labels is None
    was_training = model.training
    model.eval()
    preds, refs, losses = [], [], []
    for batch in dataloader:
        out = model(**batch)
        logits = out.logits.float()
        pred = logits.squeeze(-1) if regression else logits.argmax(dim=-1)
        batch_loss = out.loss.float().expand(len(pred))  # per-example share of the batch mean
        pred, ref, batch_loss = accelerator.gather_for_metrics((pred, batch["labels"], batch_loss))
        preds.append(pred.cpu())
        refs.append(ref.cpu())
        losses.append(batch_loss.cpu())
    model.train(was_training)
    predictions, references = torch.cat(preds).numpy(), torch.cat(refs).numpy()
    results = compute(metrics, predictions, references, num_labels)
    results["loss"] = float(torch.cat(losses).mean())
    results["samples"] = len(references)
    return results
