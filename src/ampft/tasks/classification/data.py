"""Sequence classification and regression data: columns checked, label names in id order, labels as ids (or
floats), the class binary F1 scores. Errors name the file and rows."""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from pathlib import Path

from datasets import ClassLabel, DatasetDict
from omegaconf import DictConfig

from ampft.data.load import (
    check_columns,
    check_empty_texts,
    load_file,
    load_splits,
    numbered,
    split_files,
    where,
)
from ampft.errors import DataError

log = logging.getLogger(__name__)


def load_raw(task: DictConfig) -> DatasetDict:
    names = None if task.column_names is None else [str(c) for c in task.column_names]
    raw = load_splits(task, lambda path, split: load_file(path, split, names, task.text_fields))
    for split, ds in raw.items():
        if len(ds) == 0:
            raise DataError(f"task={task.name}: the {split} split is empty")
        unlabelled = (" (a file without labels is for predictions: make predict run=RUN_DIR file=PATH)"
                      if task.label_column not in ds.column_names else "")
        check_columns(ds, [*task.text_fields, task.label_column],
                      where(task, split) if split in split_files(task) else f"task={task.name}", split,
                      f"Set task.text_fields=[...] and task.label_column=... to match{unlabelled}.",
                      split_files(task).get(split))
    check_labels(raw, task)
    for split, ds in raw.items():
        empty = [i for i, row in enumerate(zip(*(ds[f] for f in task.text_fields), strict=True))
                 if any(_is_blank(t) for t in row)]
        check_empty_texts(empty, len(ds), task, where(task, split),
                          f"text field(s) {list(task.text_fields)}, {_rows(task, split, empty)}")
    return raw


def _rows(task: DictConfig, split: str, indices: list[int]) -> str:
    """Rows by number from 1; the file line too for csv/tsv (one header line, no blank or multi-line rows)."""
    lines = Path(split_files(task).get(split, "")).suffix.lower() in (".csv", ".tsv")
    return f"row(s) {numbered(indices)}" + (" (file line = row + 1, after the header)" if lines else "")


def _is_blank(v) -> bool:
    return v is None or (isinstance(v, str) and not v.strip())


def check_labels(raw: DatasetDict, task: DictConfig) -> None:
    """Empty labels (and regression non-numbers) are errors naming the file and rows, a label set that looks like a
    mistake (integer-like names mixed with words, a very rare class) a warning: `0,1,neg,pos` would be 4 classes."""
    col = task.label_column
    for split, ds in raw.items():
        if isinstance(ds.features[col], ClassLabel):
            continue  # ids into names already (a Hub dataset); -1 marks an unlabelled test row
        values = ds[col]
        blank = [i for i, v in enumerate(values) if _is_blank(v)]
        if blank:
            raise DataError(f"{where(task, split)}: {len(blank)} empty label(s) in column {col!r}, "
                            f"{_rows(task, split, blank)}. Fill them in or remove those rows.")
        if task.family == "regression":
            bad = [i for i, v in enumerate(values) if not _is_number(v)]
            if bad:
                raise DataError(f"{where(task, split)}: label column {col!r} of a regression task has non-numbers (or nan/inf) "
                                f"{sorted({str(values[i]) for i in bad})[:5]} in {_rows(task, split, bad)}; "
                                "use numbers, or task.family=classification for class labels")
    train = raw["train"]
    if task.family != "classification" or task.labels is not None or isinstance(train.features[col], ClassLabel):
        return
    counts = Counter(str(v) for v in train[col])
    shown = dict(sorted(counts.items()))
    integer = [v for v in counts if re.fullmatch(r"[+-]?\d+", v.strip())]
    if integer and len(integer) < len(counts):
        log.warning("%s: labels mix integer-like and word values %s (counts): %d classes. If these are two "
                    "spellings of the same classes, fix the file; set task.labels=[...] to silence this.",
                    where(task, "train"), shown, len(counts))
    folded: dict[str, list[str]] = {}
    for v in sorted(counts):
        folded.setdefault(v.strip().casefold(), []).append(v)
    if same := [names for names in folded.values() if len(names) > 1]:
        log.warning("%s: labels differ only in case or surrounding spaces: %s (counts %s): %d classes. If they are "
                    "one class, fix the file; set task.labels=[...] to silence this.", where(task, "train"),
                    ", ".join(map(str, same)), shown, len(counts))
    largest = max(counts.values())
    rare = {v: n for v, n in counts.items() if n < max(2, 0.01 * largest)}
    if rare and len(counts) > 1:
        log.warning("%s: label(s) %s have very few examples next to the largest class (%d); label counts %s. "
                    "A typo in a label column makes a class of its own: check them, or set task.labels=[...] to "
                    "silence this.", where(task, "train"), sorted(rare), largest, shown)


def _is_number(v) -> bool:
    try:
        return not isinstance(v, bool) and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def label_names(raw: DatasetDict, task: DictConfig) -> list[str] | None:
    """Label names in id order (None for regression): task.labels, ClassLabel names, or the sorted values."""
    if task.family == "regression":
        return None
    if task.labels is not None:
        return [str(x) for x in task.labels]
    feature = raw["train"].features[task.label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    return [str(v) for v in sorted({v for v in raw["train"][task.label_column] if v is not None})]


POSITIVE_NAMES = ("1", "true", "positive", "pos", "yes")  # tried in order when task.positive_label is null


def positive_label(task: DictConfig, labels: list[str] | None) -> str | None:
    """The class binary F1 scores: task.positive_label, else the first of POSITIVE_NAMES (any case); None without
    exactly two labels. A DataError when F1 is asked for and neither names one of the two labels."""
    if task.family != "classification" or labels is None or len(labels) != 2:
        return None
    if task.positive_label is not None:
        if str(task.positive_label) not in labels:
            raise DataError(f"task.positive_label={task.positive_label} is not one of the task's labels {labels}: "
                            f"set it to the class binary F1 should score, e.g. task.positive_label={labels[1]}")
        return str(task.positive_label)
    for name in POSITIVE_NAMES:
        if found := [x for x in labels if x.lower() == name]:
            return found[0]
    if "f1" in task.metrics:
        raise DataError(f"task={task.name}: task.metrics has f1, and with the labels {labels} it is not clear which "
                        f"class binary F1 should score: set task.positive_label={labels[0]} or "
                        f"task.positive_label={labels[1]}")
    return None


def encode_labels(raw: DatasetDict, task: DictConfig, labels: list[str] | None) -> DatasetDict:
    """Add `labels`: ids into `labels` by name (integers as ids only where task.labels names them), floats for
    regression. Values that are not the label names are an error: reading `0`/`1` as ids would be a guess."""
    col = task.label_column
    if labels is None:
        return raw.map(lambda b: {"labels": [float(v) for v in b[col]]}, batched=True)
    label2id = {name: i for i, name in enumerate(labels)}
    out = {}
    for split, ds in raw.items():
        feature = ds.features[col]
        values = set(ds.unique(col))
        if isinstance(feature, ClassLabel):
            values = {feature.int2str(v) for v in values if v >= 0} | {v for v in values if v < 0}
        ids = all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(labels) for v in values)
        by_name = {str(v) for v in values} <= set(label2id)
        if not by_name and not ids:
            in_range = all(isinstance(v, int) for v in values)
            unknown = sorted(str(v) for v in values
                             if (not 0 <= v < len(labels) if in_range else str(v) not in label2id))
            shown = (lambda v, f=feature: str(v if v < 0 else f.int2str(v))) if isinstance(feature, ClassLabel) else str
            bad = [i for i, v in enumerate(ds[col]) if shown(v) in unknown]
            raise DataError(
                f"{where(task, split)}: the {split} split has labels {unknown[:10]} outside the label set "
                f"{labels}, {_rows(task, split, bad)}. Fix the data, or set task.labels=[...] to the full label "
                "list in id order."
            )
        if not by_name and task.labels is None:  # ids, but into which list of names?
            shown = ", ".join(f"{i} = {name}" for i, name in enumerate(labels))
            raise DataError(
                f"{where(task, split)}: labels {sorted(values)[:10]} in column {col!r} are not the train split's "
                f"label names {labels}, so it is not known which class each stands for. If they are ids, say the "
                f"names in id order, e.g. task.labels=[{','.join(labels)}] (then {shown}); or write the same label "
                "names in every split."
            )
        # By name, or else ids into the label list the user gave.
        name = feature.int2str if isinstance(feature, ClassLabel) else str
        out[split] = ds.map(lambda b, name=name, by_name=by_name: {
            "labels": [label2id[name(v)] if by_name else v for v in b[col]]}, batched=True)
    return DatasetDict(out)
