"""SQuAD v1.1/v2.0 exact match and F1 with the official evaluation script's normalisation, written here
(`evaluate.load("squad")` needs the Hub)."""

from __future__ import annotations

import re
import string
from collections import Counter, defaultdict

import numpy as np


def normalize_answer(s: str) -> str:
    """The official SQuAD normalisation: lowercase, drop punctuation, drop articles, collapse spaces."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _f1(prediction: str, gold: str, version_2: bool) -> float:
    pred_tokens, gold_tokens = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version_2 and (not pred_tokens or not gold_tokens):  # v2.0 script: "" vs "" is a match
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def scores(predictions: dict[str, str], references: dict[str, dict], version_2: bool = False) -> dict[str, float]:
    """Exact match and F1 in percent of the answer texts `predictions` (by question id) against the gold `answers`
    (`references`, by id), each the max over the gold answers, as the official script computes them; a question
    without a prediction scores 0. `version_2`: the v2.0 script's rules (an empty prediction matches an
    unanswerable question, and only it), HasAns_*/NoAns_* scores for the groups present, `total` questions."""
    groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for question, answers in references.items():
        golds = [t for t in answers["text"] if normalize_answer(t)] if version_2 else list(answers["text"])
        group = "HasAns" if golds else "NoAns"
        golds = golds or [""]
        pred = predictions.get(question)
        if pred is None:
            groups[group].append((0.0, 0.0))
            continue
        em = max(float(normalize_answer(pred) == normalize_answer(g)) for g in golds)
        f1 = max(_f1(pred, g, version_2) for g in golds)
        groups[group].append((em, f1))

    def score(rows: list[tuple[float, float]]) -> tuple[float, float]:
        em, f1 = np.mean(rows, axis=0) * 100.0 if rows else (0.0, 0.0)
        return float(em), float(f1)

    everything = [row for rows in groups.values() for row in rows]
    out = dict(zip(("exact_match", "f1"), score(everything), strict=True))
    if version_2:
        out["total"] = len(everything)
        for group, rows in sorted(groups.items()):
            out.update(zip((f"{group}_exact_match", f"{group}_f1", f"{group}_total"), (*score(rows), len(rows)),
                           strict=True))
    return out
