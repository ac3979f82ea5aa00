"""Sequence classification and regression: `family` (the registered `classification` and `regression`
families), `data` (columns, labels, the positive class), `metrics` (GLUE metrics, offline)."""

from ampft.tasks.classification.family import CLASSIFICATION, REGRESSION, Classification, Regression, texts

__all__ = ["CLASSIFICATION", "REGRESSION", "Classification", "Regression", "texts"]
