"""Task families: what differs between sequence classification, regression, NER and extractive QA, behind one
interface (`base.Family`), one registered object per family:

    classification.Classification            task.family=classification
    classification.Regression                task.family=regression
    token_classification.TokenClassification  task.family=token_classification
    question_answering.QuestionAnswering      task.family=question_answering

Each family package holds all of its code: the family object (metric table, model class, pipeline tag,
config checks, loading, tokenization, collation, evaluation) and the libraries under it, which read their
data format and score predictions without depending on the training loop. `family_for(task.family)` looks
the object up in `FAMILIES`; `ampft.finetune.build` does so once and passes it on to the shared modules
(`ampft.data`, `ampft.models.build_model`, `evaluate` here). Importing this package imports every family
package in it (each registers its family), so a new family is a new package here plus its conf/task/ YAML.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from accelerate import Accelerator
from omegaconf import DictConfig
from torch.utils.data import DataLoader

from ampft.tasks.base import FAMILIES, Family, family_for, register

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


def check_installed(metrics: list[str], key: str = "task.metrics") -> None:
    """A ConfigError (naming `key` and the pip command) when a metric in `metrics` needs an optional library that
    is not installed, before anything is trained."""
    for family in FAMILIES.values():
        family.check_installed(list(metrics), key)


def evaluate(accelerator: Accelerator, model, data, dataloaders: dict[str, DataLoader], task: DictConfig,
             out_dir: Path | None = None, main_name: str = "validation") -> dict[str, float]:
    """The validation split's results, then each extra validation split's as `<name>/<key>`.

    `data` is the `ampft.data.TaskData` the dataloaders were built from (it carries the family), `dataloaders`
    maps split names ("validation" first) to prepared loaders. Prediction files (QA) are named by the split,
    the main one by `main_name`."""
    results: dict[str, float] = {}
    for name, dataloader in dataloaders.items():
        features = data.validation if name == "validation" else data.extra[name]
        split = data.family.evaluate(accelerator, model, dataloader, features, data.examples[name], task,
                                     data.labels, out_dir, main_name if name == "validation" else name)
        if name == "validation":
            results.update(split)
        else:
            results.update({f"{name}/{k}": v for k, v in split.items() if k != "samples"})
    return results
