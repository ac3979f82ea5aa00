"""GLUE metrics computed in-process (no Hub script), checked against numbers worked out by hand."""

from __future__ import annotations

import math
import os
import socket

import numpy as np
import pytest

from ampft.tasks.classification.metrics import compute, f1, mcc, pearson, spearman

# A binary case with every cell of the confusion matrix different from the others' roles:
#   index:       0  1  2  3  4  5  6  7  8  9
#   reference:   1  1  1  1  0  0  0  0  0  0
#   prediction:  1  1  1  0  1  0  0  0  0  0
#   TP = 3 (0, 1, 2)   FN = 1 (3)   FP = 1 (4)   TN = 5 (5..9)
#   accuracy  = (TP + TN) / 10 = 8 / 10 = 0.8
#   precision = TP / (TP + FP) = 3/4, recall = TP / (TP + FN) = 3/4  ->  F1(positive) = 0.75
#   F1 of class 0: precision 5/6, recall 5/6 -> 5/6; macro F1 would be (0.75 + 5/6) / 2 = 0.7917
#   MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (15 - 1) / sqrt(4*4*6*6) = 14/24
BIN_REFS = [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
BIN_PREDS = [1, 1, 1, 0, 1, 0, 0, 0, 0, 0]

# Three classes:
#   index:       0  1  2  3  4  5
#   reference:   0  0  1  1  2  2
#   prediction:  0  1  1  1  2  0
#   class 0: TP 1 (0), FP 1 (5), FN 1 (1) -> P 1/2, R 1/2, F1 1/2
#   class 1: TP 2 (2, 3), FP 1 (1), FN 0  -> P 2/3, R 1,   F1 2*(2/3)/(5/3) = 4/5
#   class 2: TP 1 (4), FP 0, FN 1 (5)     -> P 1,   R 1/2, F1 2/3
#   macro F1 = (1/2 + 4/5 + 2/3) / 3 = 59/90 = 0.6556   (micro F1 = accuracy = 4/6 = 0.6667)
#   multiclass MCC = (c*s - sum_k p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2)) with
#   c = 4 correct, s = 6, true counts t = (2, 2, 2), predicted counts p = (2, 3, 1):
#   (24 - (4 + 6 + 2)) / sqrt((36 - 14)(36 - 12)) = 12 / sqrt(528)
TRI_REFS = [0, 0, 1, 1, 2, 2]
TRI_PREDS = [0, 1, 1, 1, 2, 0]


def test_perfect_binary_predictions():
    refs = [0, 1, 1, 0, 1, 0]
    assert compute(["accuracy", "f1", "mcc"], refs, refs, num_labels=2) == {"accuracy": 1.0, "f1": 1.0, "mcc": 1.0}


def test_perfect_multiclass_predictions():
    refs = [0, 1, 2, 2, 1, 0]
    assert compute(["accuracy", "f1", "mcc"], refs, refs, num_labels=3) == {"accuracy": 1.0, "f1": 1.0, "mcc": 1.0}


def test_known_binary_case():
    out = compute(["accuracy", "f1", "mcc"], BIN_PREDS, BIN_REFS)
    assert out["accuracy"] == pytest.approx(0.8)
    assert out["f1"] == pytest.approx(0.75)
    assert out["mcc"] == pytest.approx(14 / 24)


def test_f1_is_binary_positive_class_for_0_1_labels():
    binary = f1(BIN_REFS, BIN_PREDS)
    assert binary == pytest.approx(0.75)  # the positive class only
    assert binary != pytest.approx((0.75 + 5 / 6) / 2)  # not the macro average
    assert f1(BIN_REFS, BIN_PREDS, positive=0) == pytest.approx(5 / 6)  # task.positive_label names the other


def test_f1_is_macro_for_three_classes():
    macro = f1(TRI_REFS, TRI_PREDS, num_labels=3)
    assert macro == pytest.approx(59 / 90)
    assert macro != pytest.approx(4 / 6)  # not micro (= accuracy)


def test_f1_averaging_follows_the_task_not_the_data_seen():
    # A 3-class task whose evaluation data happens to hold only classes 0 and 1 still gets macro F1
    # over all three classes (class 2: no support, no predictions → F1 0 with zero_division=0).
    assert f1(BIN_REFS, BIN_PREDS, num_labels=3) == pytest.approx((5 / 6 + 0.75 + 0.0) / 3)


def test_known_three_class_case():
    out = compute(["accuracy", "mcc"], TRI_PREDS, TRI_REFS)
    assert out["accuracy"] == pytest.approx(4 / 6)
    assert out["mcc"] == pytest.approx(12 / math.sqrt(528))


def test_mcc_of_inverted_predictions_is_minus_one():
    refs = [0, 1, 0, 1, 1, 0]
    preds = [1 - r for r in refs]  # TP = TN = 0, FP = FN = 3: (0 - 9) / sqrt(3*3*3*3) = -1
    assert mcc(refs, preds) == pytest.approx(-1.0)


def test_numpy_inputs_like_the_evaluation_loop_passes():
    # Classification.evaluate hands over numpy arrays (argmax ids, int64 labels; float32 for regression).
    out = compute(["accuracy", "f1", "mcc"], np.array(BIN_PREDS, dtype=np.int64),
                  np.array(BIN_REFS, dtype=np.int64))
    assert out == pytest.approx({"accuracy": 0.8, "f1": 0.75, "mcc": 14 / 24})
    x = np.arange(1, 6, dtype=np.float32)
    out = compute(["pearson", "spearman"], 2 * x + 1, x)
    assert out == pytest.approx({"pearson": 1.0, "spearman": 1.0})


def test_pearson_and_spearman_on_a_monotone_nonlinear_series():
    # references x = 1..5, predictions x^2: ranks agree exactly -> spearman = 1.
    # Pearson by hand: mean x = 3, mean y = 11; dx = (-2,-1,0,1,2), dy = (-10,-7,-2,5,14);
    # sum dx*dy = 60, sum dx^2 = 10, sum dy^2 = 374 -> r = 60 / sqrt(3740) = 0.98110 < 1.
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    y = [v * v for v in x]
    out = compute(["pearson", "spearman"], y, x)
    assert out["spearman"] == pytest.approx(1.0)
    assert out["pearson"] == pytest.approx(60 / math.sqrt(3740))
    assert out["pearson"] < 1.0


def test_spearman_of_a_decreasing_series_is_minus_one():
    x = [0.5, 1.0, 2.5, 4.0]
    assert spearman(x, [-(v ** 3) for v in x]) == pytest.approx(-1.0)
    assert pearson(x, [3.0 - 2 * v for v in x]) == pytest.approx(-1.0)


def test_compute_merges_every_metric_once():
    out = compute(["accuracy", "f1"], BIN_PREDS, BIN_REFS)
    assert set(out) == {"accuracy", "f1"}
    assert all(isinstance(v, float) for v in out.values())
    assert compute([], BIN_PREDS, BIN_REFS) == {}


def test_unknown_metric_raises_key_error_naming_the_choices():
    with pytest.raises(KeyError, match=r"unknown metric 'bleu'.*\['accuracy', 'f1', 'mcc', 'pearson', 'spearman'\]"):
        compute(["bleu"], BIN_PREDS, BIN_REFS)
    with pytest.raises(KeyError, match="glue_score"):
        compute(["accuracy", "glue_score"], BIN_PREDS, BIN_REFS)


def test_metrics_need_no_network(monkeypatch):
    # conftest sets the Hub offline; on top of that, any socket connection now fails loudly.
    assert os.environ["HF_HUB_OFFLINE"] == "1"

    def no_network(*args, **kwargs):
        raise AssertionError("a metric tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket.socket, "connect_ex", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    out = compute(["accuracy", "f1", "mcc"], BIN_PREDS, BIN_REFS)
    out.update(compute(["pearson", "spearman"], [1.0, 4.0, 9.0, 16.0, 25.0], [1.0, 2.0, 3.0, 4.0, 5.0]))
    assert out == pytest.approx({"accuracy": 0.8, "f1": 0.75, "mcc": 14 / 24,
                                 "pearson": 60 / math.sqrt(3740), "spearman": 1.0})
