"""GLUE metrics as offline `evaluate` modules (`evaluate.load("accuracy")` needs the Hub), the Hub scripts'
numbers, with scikit-learn and SciPy (the `metrics` extra, imported when a metric is computed)."""

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
    """F1 of the positive class (`positive`, a label id) for two-class tasks, as GLUE reports it for MRPC and
    QQP; macro F1 when the task (its label count, not the data seen) has more classes."""

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

    value_type, key, function = "float32", "pearson", "pearsonr"

    def _compute(self, predictions, references):
        correlation = getattr(_lib(self.key), self.function)
        return {self.key: float(correlation(np.asarray(references), np.asarray(predictions))[0])}


class Spearman(Pearson):
    """Spearman rank correlation (STS-B)."""

    key, function = "spearman", "spearmanr"


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
