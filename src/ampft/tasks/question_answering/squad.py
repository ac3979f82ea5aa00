"""Extractive QA (SQuAD v1.1/v2.0): JSON, its answers checked → windows overlapping by `doc_stride` (as run_qa.py)
→ span search over an example's windows → answer cut out of the original context (detokenized ids would lose case
and spacing). Left-padding tokenizers put the context first and are padded to `max_length` here, so positions are
final."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
from omegaconf import DictConfig
from transformers import PreTrainedTokenizerBase

from ampft.data.load import check_empty_texts, refuse_or_warn, where

COLUMNS = ["id", "question", "context", "answers"]
FEATURES = datasets.Features({
    "id": datasets.Value("string"), "title": datasets.Value("string"), "context": datasets.Value("string"),
    "question": datasets.Value("string"),
    "answers": {"text": datasets.List(datasets.Value("string")), "answer_start": datasets.List(datasets.Value("int32"))},
})


def read_squad(path: str | Path, answers: bool = True) -> datasets.Dataset:
    """One row per question; v2.0 unanswerable questions (`is_impossible`) get empty answer lists, as do questions
    without `answers` when `answers=False` (to predict). A missing or mistyped key is a ValueError naming where."""
    rows = []
    where = "the top level"
    try:
        with open(path, encoding="utf-8-sig") as f:  # a BOM at the start is not an error
            articles = json.load(f)["data"]
        for a, article in enumerate(articles):
            where = f"data[{a}]"
            for p, paragraph in enumerate(article["paragraphs"]):
                where = f"data[{a}].paragraphs[{p}]"
                context = paragraph["context"]
                for q, qa in enumerate(paragraph["qas"]):
                    where = f"data[{a}].paragraphs[{p}].qas[{q}]"
                    where += f" (id {qa['id']!r})"  # in two steps: a missing id is reported at its question
                    given = [] if qa.get("is_impossible", False) else qa["answers"] if answers else qa.get("answers", [])
                    for i, answer in enumerate(given):
                        if not isinstance(answer.get("text"), str) or not isinstance(answer.get("answer_start"), int):
                            raise ValueError(f"answers[{i}] needs a string 'text' and an integer 'answer_start', "
                                             f"got {answer!r}")
                    rows.append({
                        "id": qa["id"], "title": article.get("title", ""), "context": context,
                        "question": qa["question"],
                        "answers": {"text": [a["text"] for a in given],
                                    "answer_start": [a["answer_start"] for a in given]},
                    })
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        what = f"key {exc} missing" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise ValueError(f"{path}: not SQuAD JSON ({{'data': [{{'paragraphs': [{{'context': ..., 'qas': [{{'id', "
                         f"'question', 'answers': [{{'text', 'answer_start'}}]}}]}}]}}]}}): at {where}, {what}") from exc
    return datasets.Dataset.from_list(rows, features=FEATURES)


def misaligned_answers(ds: datasets.Dataset) -> list[str]:
    """Ids of questions whose first answer's `answer_start` does not point at its `text` in the context.
    Training positions come from the first answer: such a question would silently train "no answer"."""
    bad = []
    for row in ds.select_columns(["id", "context", "answers"]):
        texts, starts = row["answers"]["text"], row["answers"]["answer_start"]
        if texts and row["context"][starts[0]:starts[0] + len(texts[0])] != texts[0]:
            bad.append(row["id"])
    return bad


def _ids(ids: list[str]) -> str:
    return f"ids {ids[:5]}{', ...' if len(ids) > 5 else ''}"


def check_answers(ds: datasets.Dataset, task: DictConfig, split: str) -> None:
    """Questions that would silently train "no answer" (an answer_start off its text; in SQuAD v1.1, no answer): a
    DataError past task.max_misaligned_answers (a fraction), a warning below; empty texts: task.max_empty_texts."""
    source = where(task, split)
    rows = ds.select_columns(COLUMNS)
    empty = [r["id"] for r in rows if not r["question"].strip() or not r["context"].strip()]
    check_empty_texts(empty, len(ds), task, source, f"question or context ({_ids(empty)})")

    def no_answer(ids: list[str], among: int, what: str, fix: str) -> None:
        refuse_or_warn(len(ids), among, task, "max_misaligned_answers",
                       f"{source}: {what}; they would be trained as \"no answer\"",
                       f"{fix}, or raise task.max_misaligned_answers to train with them as they are")

    if bad := misaligned_answers(ds):
        answered = sum(1 for a in ds["answers"] if a["text"])
        no_answer(bad, answered,
                  f"{len(bad)} of {answered} answered questions have an answer_start that does not point at their "
                  f"answer text in the context ({_ids(bad)})",
                  "fix answer_start (character offsets into the context, counted from 0)")
    unanswered = [] if task.version_2 else [r["id"] for r in rows if not r["answers"]["text"]]
    if unanswered:
        no_answer(unanswered, len(ds),
                  f"{len(unanswered)} of {len(ds)} questions have no answer (answers: [], {_ids(unanswered)}), which "
                  "SQuAD v1.1 (task.version_2=false) does not have",
                  "give them their answers, or use task.version_2=true (task=squad_v2) for a file with unanswerable "
                  "questions")


def _cls_index(input_ids: list[int], tokenizer: PreTrainedTokenizerBase) -> int:
    """Where "no answer" points: the CLS token (BOS for models without one), as run_qa.py does."""
    for special in (tokenizer.cls_token_id, tokenizer.bos_token_id):
        if special is not None and special in input_ids:
            return input_ids.index(special)
    return 0


def _positions(answers: Mapping[str, list], offsets: list, seq: list, ctx: int, cls: int) -> tuple[int, int]:
    """The first gold answer's start and end token in a window, or the CLS index where it does not hold all of it."""
    if not answers["answer_start"]:
        return cls, cls
    start_char = answers["answer_start"][0]
    end_char = start_char + len(answers["text"][0])
    first = seq.index(ctx)
    last = len(seq) - 1 - seq[::-1].index(ctx)
    if offsets[first][0] > start_char or offsets[last][1] < end_char:
        return cls, cls
    start, end = first, last
    while start < last and offsets[start + 1][0] <= start_char:
        start += 1
    while end > first and offsets[end - 1][1] >= end_char:
        end -= 1
    return start, end


def prepare_features(batch: Mapping[str, list], tokenizer: PreTrainedTokenizerBase, max_length: int,
                     doc_stride: int, evaluation: bool = True) -> dict[str, list]:
    """For `Dataset.map(batched=True, remove_columns=<all>)`: one row per window; with `answers`, their
    `start_positions`/`end_positions` (`_positions`); for `evaluation`, the span search's `example_id`,
    `offset_mapping` ((start, end) characters for context tokens, None elsewhere) and `cls_index`."""
    right = tokenizer.padding_side == "right"
    ctx = 1 if right else 0  # the context's sequence id
    questions = [q.lstrip() for q in batch["question"]]  # some SQuAD questions start with spaces
    pair = (questions, batch["context"]) if right else (batch["context"], questions)
    enc = tokenizer(*pair, truncation="only_second" if right else "only_first", max_length=max_length,
                    stride=doc_stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                    padding=False if right else "max_length")
    sample = enc.pop("overflow_to_sample_mapping")
    all_offsets = enc.pop("offset_mapping")
    out = dict(enc)
    seqs = [enc.sequence_ids(i) for i in range(len(sample))]
    cls = [_cls_index(ids, tokenizer) for ids in enc["input_ids"]]
    if "answers" in batch:
        positions = [_positions(batch["answers"][s], o, q, ctx, c)
                     for s, o, q, c in zip(sample, all_offsets, seqs, cls, strict=True)]
        out["start_positions"] = [start for start, _ in positions]
        out["end_positions"] = [end for _, end in positions]
    if evaluation:
        out["example_id"] = [batch["id"][s] for s in sample]
        out["offset_mapping"] = [[o if s == ctx else None for o, s in zip(offsets, seq, strict=True)]
                                 for offsets, seq in zip(all_offsets, seqs, strict=True)]
        out["cls_index"] = cls
    return out


def _probability(logits: np.ndarray, allowed: np.ndarray, i: int) -> float:
    """softmax(logits over the `allowed` positions)[i]."""
    x = logits[allowed]
    return float(np.exp(logits[i] - x.max()) / np.exp(x - x.max()).sum())


def scored_answers(examples: datasets.Dataset, features: datasets.Dataset, start_logits: Sequence[Any],
                   end_logits: Sequence[Any], n_best: int = 20, max_answer_length: int = 30,
                   version_2: bool = False, null_threshold: float = 0.0) -> dict[str, tuple[str, float]]:
    """(answer text, score) per example id from per-feature logits (row i: `features[i]`, padding ignored).

    Over an example's windows, the best start + end logit among the `n_best` starts and ends in the context
    (start <= end, at most `max_answer_length` tokens); "" without a valid span, or under `version_2` when the
    null score (CLS logits, the lowest over the windows) beats it by more than `null_threshold`. The score is
    the transformers QA pipeline's: start times end probability, softmaxes over the window's context (and CLS).
    """
    columns = features.select_columns(["example_id", "offset_mapping", "cls_index"]).with_format(None)[:]  # one read
    all_offsets, cls_index = columns["offset_mapping"], columns["cls_index"]
    by_example: dict[str, list[int]] = defaultdict(list)
    for i, example_id in enumerate(columns["example_id"]):
        by_example[example_id].append(i)
    answers = {}
    examples = examples.select_columns(["id", "context"]).with_format(None)[:]
    for example_id, context in zip(examples["id"], examples["context"], strict=True):
        best_score, best, null_score, null = -np.inf, None, np.inf, None
        for i in by_example[example_id]:
            starts, ends = (np.asarray(x[i], dtype=np.float64) for x in (start_logits, end_logits))
            offsets = all_offsets[i]
            in_context = np.array([o is not None for o in offsets[: len(starts)]] + [False] * (len(starts) - len(offsets)))
            allowed = in_context.copy()
            if version_2:
                allowed[cls_index[i]] = True
            if starts[cls_index[i]] + ends[cls_index[i]] < null_score:
                null_score = starts[cls_index[i]] + ends[cls_index[i]]
                null = (i, starts, ends, allowed)
            candidates = np.flatnonzero(in_context)
            if not len(candidates):
                continue
            top_s = candidates[np.argsort(-starts[candidates], kind="stable")[:n_best]]
            top_e = candidates[np.argsort(-ends[candidates], kind="stable")[:n_best]]
            length = top_e[None, :] - top_s[:, None] + 1
            scores = np.where((length >= 1) & (length <= max_answer_length),
                              starts[top_s][:, None] + ends[top_e][None, :], -np.inf)
            s, e = np.unravel_index(np.argmax(scores), scores.shape)
            if scores[s, e] > best_score:
                best_score = scores[s, e]
                best = (offsets[top_s[s]][0], offsets[top_e[e]][1],
                        _probability(starts, allowed, top_s[s]) * _probability(ends, allowed, top_e[e]))
        if version_2 and (best is None or null_score - best_score > null_threshold):
            i, starts, ends, allowed = null
            c = cls_index[i]
            answers[example_id] = ("", _probability(starts, allowed, c) * _probability(ends, allowed, c))
        elif best is None:
            answers[example_id] = ("", 0.0)
        else:
            answers[example_id] = (context[best[0]: best[1]], best[2])
    return answers
