"""The built-in `demo` task: review sentiment with negation and contrast ("the battery was not great, but the
screen is superb": the clause after ", but" decides), generated deterministically. A bag of words cannot solve
it, chance is 50%, a pretrained encoder learns it in a few hundred steps; no download."""

from __future__ import annotations

import random

from datasets import Dataset, DatasetDict

LABELS = ["negative", "positive"]
VERSION = 1  # bump when the generator changes, so cached tokenizations are not reused

NOUNS = ["battery", "screen", "keyboard", "camera", "speaker", "charger", "case", "app", "manual",
         "delivery", "price", "design", "sound", "display", "fan", "hinge", "cable", "lens", "menu", "strap"]
POSITIVE = ["great", "excellent", "superb", "reliable", "wonderful", "sturdy", "brilliant", "solid",
            "pleasant", "impressive", "fantastic", "good", "lovely", "smooth", "flawless"]
NEGATIVE = ["terrible", "awful", "flimsy", "poor", "disappointing", "broken", "useless", "bad",
            "horrible", "weak", "noisy", "cheap", "slow", "faulty", "annoying"]
VERBS = ["was", "is", "seemed", "felt", "turned out"]
INTENSIFIERS = ["", "", "really ", "very ", "quite ", "rather ", "truly "]
NEGATIONS = ["not ", "never ", "hardly "]
OPENERS = ["", "", "honestly, ", "overall ", "after a week, ", "to be fair, "]


def _clause(rng: random.Random) -> tuple[str, int]:
    positive = rng.random() < 0.5
    negated = rng.random() < 0.3
    adj = rng.choice(POSITIVE if positive else NEGATIVE)
    text = f"the {rng.choice(NOUNS)} {rng.choice(VERBS)} {rng.choice(NEGATIONS) if negated else ''}" \
           f"{rng.choice(INTENSIFIERS)}{adj}"
    return text, int(positive != negated)


def example(rng: random.Random) -> tuple[str, int]:
    first, label = _clause(rng)
    if rng.random() < 0.4:
        second, label = _clause(rng)
        first = f"{first}, but {second}"
    return f"{rng.choice(OPENERS)}{first}.", label


def demo_splits(num_train: int = 2000, num_validation: int = 500, seed: int = 1234) -> DatasetDict:
    rng = random.Random(seed)
    out = {}
    for split, n in (("train", num_train), ("validation", num_validation)):
        rows = [example(rng) for _ in range(n)]
        out[split] = Dataset.from_dict({"sentence": [r[0] for r in rows], "label": [r[1] for r in rows]})
    return DatasetDict(out)
