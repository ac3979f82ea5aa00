"""Task families (classification, regression, token_classification, question_answering) behind one interface,
`base.Family`. Importing this package imports (and so registers) every family package in it: a new family is a
new package here plus its conf/task/ YAML."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from accelerate import Accelerator
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from ampft.tasks.base import FAMILIES, Family, family_for, register
from ampft.tasks.classification.metrics import check_installed  # the one family whose metrics need extras

for _package in pkgutil.iter_modules(__path__):  # in name order; each family package registers its family
    if _package.ispkg:
        importlib.import_module(f"{__name__}.{_package.name}")

__all__ = ["FAMILIES", "Family", "family_for", "register", "evaluate", "check_installed", "supported_metrics"]


def supported_metrics() -> dict[str, list[str]]:
    """Every metric a registered family computes -> the families that compute it."""
    out: dict[str, list[str]] = {}
    for family in FAMILIES.values():
        for metric in family.metrics:
            out.setdefault(metric, []).append(family.name)
    return out


def evaluate(accelerator: Accelerator, model, data, dataloaders: dict[str, DataLoader], task: DictConfig,
             out_dir: Path | None = None, main_name: str = "validation") -> dict[str, float]:
    """The validation split's results, then each extra split's as `<name>/<key>`, from the `dataloaders` (by
    split name) of `data` (`ampft.data.TaskData`); prediction files are named by the split, the main one `main_name`."""
    results: dict[str, float] = {}
    for name, dataloader in dataloaders.items():
        features = data.validation if name == "validation" else data.extra[name]
        main = name == "validation"
        split = data.family.evaluate(accelerator, model, dataloader, features, data.examples[name], task,
                                     data.labels, out_dir, main_name if main else name)
        results.update(split if main else {f"{name}/{k}": v for k, v in split.items() if k != "samples"})
    return results
