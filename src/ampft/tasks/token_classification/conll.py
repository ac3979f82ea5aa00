"""NER data: CoNLL files → word-aligned sub-token labels (`word_ids` kept) → one tag per word back. A word cut
off by truncation is tagged O: truncation costs recall instead of silently shrinking the gold set. Left-padding
tokenizers are padded to `max_length` here, so token positions are final."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import datasets
from transformers import PreTrainedTokenizerBase

IGNORE_INDEX = -100  # PyTorch's cross-entropy ignore_index: no loss, no prediction read
_FIELDS = re.compile(r"[ \t]+")


def read_conll(path: str | Path, token_column: int = 0, tag_column: int | None = -1) -> datasets.Dataset:
    """Sentences of a CoNLL file (one token per line, blank line between sentences) as tokens/tags lists;
    `tag_column=None`: the tokens only (a file to tag, whose lines may hold the token alone)."""
    sentences: list[tuple[list[str], list[str]]] = []
    tokens: list[str] = []
    tags: list[str] = []
    width = None
    with open(path, encoding="utf-8-sig") as f:  # a BOM at the start is not part of the first word
        for lineno, line in enumerate(f, 1):
            line = line.strip(" \t\r\n")
            fields = _FIELDS.split(line) if line else []
            if not fields or fields[0] == "-DOCSTART-":
                if tokens:
                    sentences.append((tokens, tags))
                tokens, tags = [], []
                continue
            n = len(fields)
            width = width or n
            if n != width:
                problem = f"{n} fields where the file's first token line has {width}"
            elif tag_column is None and not -n <= token_column < n:
                problem = f"{n} field(s) have no token column {token_column} (set task.token_column)"
            elif tag_column is not None and (not (-n <= token_column < n and -n <= tag_column < n)
                                             or token_column % n == tag_column % n):
                problem = (f"{n} field(s) have no separate token column {token_column} and tag column "
                           f"{tag_column} (set token_column/tag_column)")
            else:
                problem = None
            if problem:
                raise ValueError(f"{path}:{lineno}: malformed line {line!r}: {problem}")
            tokens.append(fields[token_column])
            if tag_column is not None:
                tags.append(fields[tag_column])
    if tokens:  # a last sentence without a final blank line
        sentences.append((tokens, tags))
    columns = {"tokens": [s[0] for s in sentences]}
    if tag_column is not None:
        columns["tags"] = [s[1] for s in sentences]
    words = datasets.List(datasets.Value("string"))
    return datasets.Dataset.from_dict(columns, features=datasets.Features({c: words for c in columns}))


def label_list(splits: datasets.DatasetDict) -> list[str]:
    """All tags of the splits: O first, then sorted."""
    columns = (ds.select_columns(["tags"]).with_format(None)[:]["tags"] for ds in splits.values())  # one read each
    seen = {tag for rows in columns for row in rows for tag in row}
    return ["O", *sorted(seen - {"O"})]


def tokenize_and_align(batch: Mapping[str, list], tokenizer: PreTrainedTokenizerBase,
                       label2id: Mapping[str, int], max_length: int,
                       label_all_subtokens: bool = False) -> dict[str, list]:
    """For `Dataset.map(batched=True)`: model inputs, `word_ids` and (with `tags`) `labels`: a word's tag on its
    first sub-token, -100 on the rest and on special tokens (`label_all_subtokens`: the tag on every sub-token,
    I-X for B-X after the first where the label list has I-X)."""
    enc = tokenizer(batch["tokens"], is_split_into_words=True, truncation=True, max_length=max_length,
                    padding="max_length" if tokenizer.padding_side == "left" else False)
    out = dict(enc)
    out["word_ids"] = [enc.word_ids(i) for i in range(len(batch["tokens"]))]
    if "tags" not in batch:
        return out
    out["labels"] = []
    for tags, word_ids in zip(batch["tags"], out["word_ids"], strict=True):
        ids = [label2id[t] for t in tags]  # every tag is in the list: the family's `load` checked
        row, prev = [], None
        for w in word_ids:
            if w is None:
                row.append(IGNORE_INDEX)
            elif w != prev:
                row.append(ids[w])
            elif label_all_subtokens:
                inside = "I-" + tags[w][2:] if tags[w].startswith("B-") else tags[w]
                row.append(label2id.get(inside, ids[w]))
            else:
                row.append(IGNORE_INDEX)
            prev = w
        out["labels"].append(row)
    return out


def predictions_to_tags(predictions: Sequence[Sequence[int]], word_ids: Sequence[Sequence[int | None]],
                        id2label: Sequence[str] | Mapping[int, str],
                        num_words: Sequence[int] | None = None) -> list[list[str]]:
    """One tag per word, its first sub-token's, from each feature's predicted label ids (padding past the feature
    ignored). Words cut by truncation are tagged O where `num_words` counts them."""
    out = []
    for i, ids in enumerate(word_ids):
        row = predictions[i]
        n = num_words[i] if num_words is not None else 1 + max((w for w in ids if w is not None), default=-1)
        tags = ["O"] * n
        prev = None
        for j, w in enumerate(ids[: len(row)]):
            if w is not None and w != prev:
                tags[w] = id2label[int(row[j])]
            prev = w
        out.append(tags)
    return out
