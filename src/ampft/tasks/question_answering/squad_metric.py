"""SQuAD v1.1/v2.0 exact match and F1 with the official evaluation script's normalisation, as an offline
`evaluate.Metric` (`evaluate.load("squad")` needs the Hub)."""

from __future__ import annotations

import re
import string
from collections import Counter, defaultdict

import datasets
import evaluate
import numpy as np

from ampft.tasks.question_answering.squad import ANSWERS


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


class Squad(evaluate.Metric):
    """SQuAD v1.1 exact match and F1 in percent, each the max over the gold answers, as the official script
    computes them; a reference without a prediction scores 0."""

    version_2 = False

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=self.__doc__ or "", citation="",
            inputs_description="predictions {id, prediction_text}; references {id, answers}",
            features=datasets.Features({
                "predictions": {"id": datasets.Value("string"), "prediction_text": datasets.Value("string")},
                "references": {"id": datasets.Value("string"), "answers": ANSWERS},
            }),
        )

    def _compute(self, predictions, references) -> dict[str, float]:
        predicted = {p["id"]: p["prediction_text"] for p in predictions}
        groups: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for ref in references:
            golds = [t for t in ref["answers"]["text"] if normalize_answer(t)] if self.version_2 \
                else list(ref["answers"]["text"])
            group = "HasAns" if golds else "NoAns"
            golds = golds or [""]
            pred = predicted.get(ref["id"])
            if pred is None:
                groups[group].append((0.0, 0.0))
                continue
            em = max(float(normalize_answer(pred) == normalize_answer(g)) for g in golds)
            f1 = max(_f1(pred, g, self.version_2) for g in golds)
            groups[group].append((em, f1))

        def score(rows: list[tuple[float, float]]) -> tuple[float, float]:
            em, f1 = np.mean(rows, axis=0) * 100.0 if rows else (0.0, 0.0)
            return float(em), float(f1)

        everything = [row for rows in groups.values() for row in rows]
        out = dict(zip(("exact_match", "f1"), score(everything), strict=True))
        if self.version_2:
            out["total"] = len(everything)
            for group, rows in sorted(groups.items()):
                out.update(zip((f"{group}_exact_match", f"{group}_f1", f"{group}_total"),
                               (*score(rows), len(rows)), strict=True))
        return out


class SquadV2(Squad):
    """SQuAD v2.0: as Squad, with the v2.0 script's rules (an empty prediction matches an unanswerable
    question, and only it) and HasAns_*/NoAns_* scores for the groups present; `total` counts questions."""

    version_2 = True
