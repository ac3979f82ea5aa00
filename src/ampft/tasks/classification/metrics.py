"""GLUE metrics as offline `evaluate` modules (`evaluate.load("accuracy")` needs the Hub): the Hub scripts'
numbers, with scikit-learn and SciPy (the `metrics` extra, imported when a metric is computed; accuracy with
numpy). `load_metric(name)` is the entry point; `check_installed` says before training when a library is missing.
"""

from __future__ import annotations

import datasets
import evaluate
import numpy as np

from ampft.config import ConfigError
from ampft.extras import MissingExtraError, require

# metric -> the optional module it computes with (the `metrics` extra); accuracy needs none.
NEEDS = {"f1": "sklearn.metrics", "mcc": "sklearn.metrics", "pearson": "scipy.stats", "spearman": "scipy.stats"}


def _lib(metric: str):
    return require(NEEDS[metric], "metrics", f"the {metric!r} metric (task.metrics)")


def accuracy_score(references, predictions) -> float:
    return float(np.mean(np.asarray(references) == np.asarray(predictions)))


class _Metric(evaluate.Metric):
    value_type = "int64"

    def _info(self) -> evaluate.MetricInfo:
        value = datasets.Value(self.value_type)
        return evaluate.MetricInfo(description=self.__doc__ or "", citation="",
                                   inputs_description="predictions and references, one per example",
                                   features=datasets.Features({"predictions": value, "references": value}))


class Accuracy(_Metric):
    """Fraction of predictions equal to the reference."""

    def _compute(self, predictions, references):
        return {"accuracy": accuracy_score(references, predictions)}


class F1(_Metric):
    """F1 of the positive class (`positive`, a label id; the recipe passes task.positive_label's id) for
    two-class tasks, as GLUE reports it for MRPC and QQP; macro F1 over all classes when the task has more
    (decided by the task's label count, not by the data seen)."""

    def _compute(self, predictions, references, num_labels: int = 2, positive: int = 1):
        average = "binary" if num_labels == 2 else "macro"
        labels = None if num_labels == 2 else list(range(num_labels))
        f1 = _lib("f1").f1_score(references, predictions, average=average, labels=labels, zero_division=0,
                      pos_label=positive if num_labels == 2 else 1)
        return {"f1": float(f1)}


class MatthewsCorrelation(_Metric):
    """Matthews correlation coefficient (CoLA's official metric)."""

    def _compute(self, predictions, references):
        return {"mcc": float(_lib("mcc").matthews_corrcoef(references, predictions))}


class Pearson(_Metric):
    """Pearson correlation (STS-B)."""

    value_type = "float32"

    def _compute(self, predictions, references):
        return {"pearson": float(_lib("pearson").pearsonr(np.asarray(references), np.asarray(predictions))[0])}


class Spearman(_Metric):
    """Spearman rank correlation (STS-B)."""

    value_type = "float32"

    def _compute(self, predictions, references):
        return {"spearman": float(_lib("spearman").spearmanr(np.asarray(references), np.asarray(predictions))[0])}


METRICS: dict[str, type[_Metric]] = {"accuracy": Accuracy, "f1": F1, "mcc": MatthewsCorrelation, "pearson": Pearson,
                                     "spearman": Spearman}


def check_installed(names, key: str = "task.metrics") -> None:
    """A ConfigError before any training when a metric in `names` needs a library that is not installed."""
    for name in names:
        if name in NEEDS:
            try:
                _lib(name)
            except MissingExtraError as exc:
                raise ConfigError([f"{key}={list(names)}: {exc}"]) from exc


def load_metric(name: str) -> evaluate.Metric:
    if name not in METRICS:
        raise KeyError(f"unknown metric {name!r}: choose from {sorted(METRICS)}")
    return METRICS[name]()


def compute(names: list[str], predictions, references, num_labels: int | None = None,
            positive: int = 1) -> dict[str, float]:
    """All named metrics; `num_labels` decides binary vs macro F1, `positive` is the label id binary F1 scores."""
    out: dict[str, float] = {}
    for name in names:
        kwargs = {"num_labels": num_labels, "positive": positive} if name == "f1" and num_labels else {}
        out.update(load_metric(name).compute(predictions=predictions, references=references, **kwargs))
    return out
