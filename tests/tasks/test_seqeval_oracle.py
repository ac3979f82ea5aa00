"""ampft's entity scores against the seqeval package itself (the `dev` extra), on the real CoNLL-2003
validation tags with corrupted predictions: default (conlleval) mode with either scheme, and strict IOB2."""

from __future__ import annotations

import random

import pytest

from ampft.tasks.token_classification import seqeval as ours
from ampft.tasks.token_classification.conll import read_conll
from tests.helpers import shared

oracle = pytest.importorskip("seqeval.metrics")
scheme_classes = pytest.importorskip("seqeval.scheme")

TAGS = ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


def corrupt(sentences: list[list[str]], rate: float, seed: int) -> list[list[str]]:
    """Each tag replaced by a random one with probability `rate`: stray I- tags, split and merged chunks."""
    rng = random.Random(seed)
    return [[rng.choice(TAGS) if rng.random() < rate else t for t in tags] for tags in sentences]


def seqeval_scores(pred, gold, **kwargs) -> dict[str, float]:
    report = oracle.classification_report(gold, pred, output_dict=True, zero_division=0, **kwargs)
    out = {k: 100 * report["micro avg"][m] for k, m in (("precision", "precision"), ("recall", "recall"),
                                                         ("f1", "f1-score"))}
    for kind, row in report.items():
        if not kind.endswith(" avg"):
            out |= {f"{kind}/f1": 100 * row["f1-score"], f"{kind}/number": row["support"]}
    return out


@pytest.mark.data
@pytest.mark.parametrize("rate", [0.02, 0.2])
def test_default_mode_equals_seqeval_on_corrupted_conll(rate):
    gold = list(read_conll(shared("conll2003", "valid.txt"))["tags"])
    pred = corrupt(gold, rate, seed=int(rate * 100))
    mine, theirs = ours.scores(pred, gold), seqeval_scores(pred, gold)
    assert {k: pytest.approx(v, abs=1e-9) for k, v in theirs.items()} == {k: mine[k] for k in theirs}
    assert mine["accuracy"] == pytest.approx(100 * oracle.accuracy_score(gold, pred))
    # IOB1 reads the same chunks in conlleval's default mode
    assert ours.scores(pred, gold, scheme="IOB1") == mine


@pytest.mark.data
def test_strict_iob2_equals_seqevals_strict_mode():
    gold = list(read_conll(shared("conll2003", "valid.txt"))["tags"])
    pred = corrupt(gold, 0.1, seed=7)
    mine = ours.scores(pred, gold, scheme="IOB2", mode="strict")
    theirs = seqeval_scores(pred, gold, mode="strict", scheme=scheme_classes.IOB2)
    assert {k: pytest.approx(v, abs=1e-9) for k, v in theirs.items()} == {k: mine[k] for k in theirs}
    assert mine["f1"] != ours.scores(pred, gold)["f1"]  # strict ignores the chunks a stray I- would open
