"""Extractive question answering: `family` (the registered `question_answering` family), `squad` (SQuAD JSON
reader, overlapping windows, n-best span search), `squad_metric` (official EM/F1, v1.1 and v2.0)."""

from ampft.tasks.question_answering.family import QUESTION_ANSWERING, QuestionAnswering

__all__ = ["QUESTION_ANSWERING", "QuestionAnswering"]
