"""GLUE metrics, the numbers the Hub's `evaluate` scripts give (`evaluate.load("accuracy")` needs the Hub): functions
of (references, predictions), with scikit-learn and SciPy (the `metrics` extra, imported when a metric is computed)."""

from __future__ import annotations

import numpy as np

from ampft.config import ConfigError
from ampft.extras import MissingExtraError, require

# metric -> the optional module it computes with (the `metrics` extra); accuracy needs none.
NEEDS = {"f1": "sklearn.metrics", "mcc": "sklearn.metrics", "pearson": "scipy.stats", "spearman": "scipy.stats"}


def _lib(metric: str):
    return require(NEEDS[metric], "metrics", f"the {metric!r} metric (task.metrics)")


def accuracy_score(references, predictions) -> float:
    return float(np.mean(np.asarray(references) == np.asarray(predictions)))


def f1(references, predictions, num_labels: int = 2, positive: int = 1) -> float:
    """F1 of the positive class (`positive`, a label id) for two-class tasks, as GLUE reports it for MRPC and
    QQP; macro F1 when the task (its label count, not the data seen) has more classes."""
    if num_labels == 2:
        return float(_lib("f1").f1_score(references, predictions, pos_label=positive, zero_division=0))
    return float(_lib("f1").f1_score(references, predictions, average="macro", labels=list(range(num_labels)),
                                     zero_division=0))


def mcc(references, predictions) -> float:
    """Matthews correlation coefficient (CoLA's official metric)."""
    return float(_lib("mcc").matthews_corrcoef(references, predictions))


def pearson(references, predictions) -> float:
    return float(_lib("pearson").pearsonr(np.asarray(references, float), np.asarray(predictions, float))[0])


def spearman(references, predictions) -> float:
    return float(_lib("spearman").spearmanr(np.asarray(references, float), np.asarray(predictions, float))[0])


METRICS = {"accuracy": accuracy_score, "f1": f1, "mcc": mcc, "pearson": pearson, "spearman": spearman}


def check_installed(names, key: str = "task.metrics") -> None:
    """A ConfigError before any training when a metric in `names` needs a library that is not installed."""
    for name in names:
        if name in NEEDS:
            try:
                _lib(name)
            except MissingExtraError as exc:
                raise ConfigError([f"{key}={list(names)}: {exc}"]) from exc


def compute(names: list[str], predictions, references, num_labels: int | None = None,
            positive: int = 1) -> dict[str, float]:
    """All named metrics; `num_labels` decides binary vs macro F1, `positive` is the label id binary F1 scores."""
    if unknown := [name for name in names if name not in METRICS]:
        raise KeyError(f"unknown metric {unknown[0]!r}: choose from {sorted(METRICS)}")
    f1_kwargs = {"num_labels": num_labels, "positive": positive} if num_labels else {}
    return {name: METRICS[name](references, predictions, **(f1_kwargs if name == "f1" else {})) for name in names}
