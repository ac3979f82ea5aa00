"""Entity-level scores for word tags as conlleval and seqeval compute them (default or strict mode), written
here: `evaluate`'s seqeval needs the Hub and the seqeval package."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

SCHEMES = ("IOB1", "IOB2")


def _parse(tag: str, scheme: str) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    prefix, _, kind = tag.partition("-")
    if prefix not in ("B", "I") or not kind:
        raise ValueError(f"tag {tag!r} is not valid in {scheme}: use O, B-<type> or I-<type>")
    return prefix, kind


def entities(tags: Sequence[str], scheme: str = "IOB2", mode: str = "default") -> list[tuple[str, int, int]]:
    """The (type, start, end) chunks of one tag sequence, end exclusive.

    default (conlleval, seqeval's default mode; the same for IOB1 and IOB2): a chunk starts at B-X, or
    at I-X after O or after a tag of another type; it ends before any tag that is not I- of its type.
    strict (seqeval's mode="strict"): only chunks well-formed in the scheme count. IOB2: B-X I-X*, a
    chunk opened by I-X is dropped. IOB1: I-X opens a chunk after O, B-, or I- of another type; B-X only
    right after a chunk of type X. Ill-formed sequences are read exactly as seqeval 1.2 reads them.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r}: use one of {SCHEMES}")
    seq = [_parse(t, scheme) for t in tags] + [("O", "")]
    chunks: list[tuple[str, int, int]] = []
    if mode == "default":
        start, prev_kind = None, ""
        for i, (prefix, kind) in enumerate(seq):
            if start is not None and (prefix != "I" or kind != prev_kind):
                chunks.append((prev_kind, start, i))
                start = None
            if prefix == "B" or (prefix == "I" and start is None):
                start = i
            prev_kind = kind
        return chunks
    if mode != "strict":
        raise ValueError(f"mode={mode!r}: use 'default' (conlleval) or 'strict'")

    def starts(prev, cur):
        if scheme == "IOB2":
            return cur[0] == "B"
        if cur[0] == "I":
            return prev[0] in ("O", "B") or prev[1] != cur[1]
        return cur[0] == "B" and prev[0] != "O" and prev[1] == cur[1]

    def inside(prev, cur):
        return cur[0] == "I" and prev[0] != "O" and prev[1] == cur[1]

    i, prev = 0, ("O", "")
    while i < len(seq):
        if starts(prev, seq[i]):
            end = i + 1
            while inside(seq[end - 1], seq[end]):
                end += 1
            last, after = seq[end - 1], seq[end]
            # seqeval's IOB1 end patterns leave out a lone B-X followed by B-Y of another type
            if not (scheme == "IOB1" and last[0] == after[0] == "B" and last[1] != after[1]):
                chunks.append((seq[i][1], i, end))
            i = end
        else:
            i += 1
        prev = seq[i - 1]
    return chunks


def _prf(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    p = 100.0 * correct / predicted if predicted else 0.0
    r = 100.0 * correct / gold if gold else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def scores(predictions: Sequence[Sequence[str]], references: Sequence[Sequence[str]], scheme: str = "IOB2",
           mode: str = "default") -> dict[str, float]:
    """Entity-level precision, recall and F1 (micro, and per type) and token accuracy, in percent as conlleval
    prints them, from one list of tags per sentence. Keys: precision, recall, f1, accuracy, <TYPE>/precision,
    /recall, /f1, /number (gold count)."""
    gold: set[tuple] = set()
    pred: set[tuple] = set()
    right = total = 0
    for i, (p, g) in enumerate(zip(predictions, references, strict=True)):
        if len(p) != len(g):
            raise ValueError(f"sentence {i}: {len(p)} predicted tags for {len(g)} reference tags")
        gold.update((i, *c) for c in entities(g, scheme, mode))
        pred.update((i, *c) for c in entities(p, scheme, mode))
        right += sum(a == b for a, b in zip(p, g, strict=True))
        total += len(g)
    correct = gold & pred
    p, r, f = _prf(len(correct), len(pred), len(gold))
    out: dict[str, float] = {"precision": p, "recall": r, "f1": f, "accuracy": 100.0 * right / total if total else 0.0}
    n_gold, n_pred, n_correct = (Counter(c[1] for c in s) for s in (gold, pred, correct))
    for kind in sorted(n_gold | n_pred):
        p, r, f = _prf(n_correct[kind], n_pred[kind], n_gold[kind])
        out.update({f"{kind}/precision": p, f"{kind}/recall": r, f"{kind}/f1": f, f"{kind}/number": n_gold[kind]})
    return out
