"""Raw splits for a task: a Hub dataset, local files (by extension), or the built-in demo task.

Everything returned has the columns the task config names, checked here with errors that say which
column is missing and which ones exist, and labels already mapped to ids (or floats for regression).
"""

from __future__ import annotations

import csv
import logging
import re
from collections.abc import Callable
from pathlib import Path

from datasets import ClassLabel, Dataset, DatasetDict, load_dataset
from omegaconf import DictConfig

from ampft.config import TaskFamily

log = logging.getLogger(__name__)

FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


class DataError(ValueError):
    pass


def file_format(path: str) -> str:
    ext = Path(path).suffix.lower()
    if ext not in FORMATS:
        raise ValueError(f"{path}: unsupported extension {ext!r}; use one of {sorted(FORMATS)}")
    return FORMATS[ext]


def split_key(split: str) -> str:
    """The config key that names a split's file, for error messages."""
    return f"task.{split}_file" if split in ("train", "validation") else "task.extra_validation_splits"


def extra_split_names(task: DictConfig) -> list[str]:
    """Names of the extra validation splits: the Hub split names, or the files' stems (as split names)."""
    if task.train_file is None:
        return [str(s) for s in task.extra_validation_splits]
    return [re.sub(r"[^\w.]", "_", Path(p).stem) for p in task.extra_validation_splits]


def _load_file(path: str, split: str, column_names: list[str] | None = None) -> Dataset:
    """One split from one file; each file is read on its own terms (format, delimiter, columns).
    `column_names`: the file (csv/tsv) has no header row, these name its columns."""
    fmt, kwargs = file_format(path), {}
    if fmt == "csv":
        # Text is text: "NA" or "null" in a sentence stays a word, not a missing value.
        kwargs = dict(keep_default_na=False)
        if column_names is not None:
            _check_field_count(path, split, column_names)
            kwargs.update(column_names=list(column_names), header=None)
        if Path(path).suffix.lower() == ".tsv":  # GLUE-style TSV: quotes are text, not delimiters
            kwargs.update(delimiter="\t", quoting=csv.QUOTE_NONE)
    try:
        return load_dataset(fmt, data_files={split: path}, split=split, **kwargs)
    except Exception as exc:  # datasets wraps parse errors in several exception types
        if "corresponds to no data" in str(exc):
            raise DataError(f"{split_key(split)}={path}: the file has no rows (the {split} split is empty)") from exc
        raise DataError(f"{split_key(split)}={path}: could not be read as {fmt}: {exc}") from exc


def _check_field_count(path: str, split: str, column_names: list[str]) -> None:
    """A headerless file's first row has as many fields as task.column_names names (pandas would otherwise
    turn the surplus leading fields into an index, silently)."""
    with open(path, encoding="utf-8-sig") as f:
        first = f.readline().rstrip("\r\n")
    tsv = Path(path).suffix.lower() == ".tsv"
    fields = first.split("\t") if tsv else next(csv.reader([first]), [])
    if first and len(fields) != len(column_names):
        raise DataError(f"{split_key(split)}={path}: its first row has {len(fields)} fields ({first[:80]!r}) but "
                        f"task.column_names names {len(column_names)}: {column_names}. Name every column, in order.")


def _load_files(task: DictConfig, read_file: Callable[[str, str], Dataset]) -> DatasetDict:
    raw = DatasetDict(train=read_file(task.train_file, "train"), validation=read_file(task.validation_file, "validation"))
    for name, path in zip(extra_split_names(task), task.extra_validation_splits, strict=True):
        raw[name] = read_file(path, name)
    return raw


def _load_hub(task: DictConfig) -> DatasetDict:
    from ampft.models import _hub_reachable

    try:
        raw = load_dataset(task.dataset, task.subset)
    except Exception as exc:  # datasets raises several types for "not cached and offline"
        if _hub_reachable():
            raise
        raise DataError(
            f"task={task.name}: dataset {task.dataset}{'/' + task.subset if task.subset else ''} is not in the "
            "local cache and the Hub is unreachable. Use local files instead: "
            f"task.train_file=PATH task.validation_file=PATH (columns {list(task.text_fields)} and "
            f"{task.label_column!r})."
        ) from exc
    missing = [s for s in (task.train_split, task.validation_split, *task.extra_validation_splits) if s not in raw]
    if missing:
        raise DataError(f"task.train_split/validation_split/extra_validation_splits {missing} not in {task.dataset}: "
                        f"splits are {list(raw)}")
    out = DatasetDict(train=raw[task.train_split], validation=raw[task.validation_split])
    for name in task.extra_validation_splits:
        out[name] = raw[name]
    return out


def load_splits(task: DictConfig, read_file: Callable[[str, str], Dataset] = _load_file) -> DatasetDict:
    """train, validation and the extra validation splits: local files (each read by `read_file(path, split)`),
    a Hub dataset, or the demo task; task.max_train_samples/max_eval_samples applied."""
    if task.train_file is not None:
        raw = _load_files(task, read_file)
    elif task.dataset is not None:
        raw = _load_hub(task)
    elif task.name == "demo":
        from ampft.data.demo import demo_splits

        raw = demo_splits()
    else:
        raise DataError(f"task={task.name}: set task.train_file/validation_file or task.dataset")
    for split in raw:
        limit = task.max_train_samples if split == "train" else task.max_eval_samples
        if limit is not None and len(raw[split]) > limit:
            raw[split] = raw[split].select(range(limit))
    return raw


def load_raw(task: DictConfig) -> DatasetDict:
    """Sequence classification/regression splits, with the configured columns checked."""
    names = None if task.column_names is None else [str(c) for c in task.column_names]
    raw = load_splits(task, lambda path, split: _load_file(path, split, names))
    _check_columns(raw, task)
    return raw


def _check_columns(raw: DatasetDict, task: DictConfig) -> None:
    for split, ds in raw.items():
        if len(ds) == 0:
            raise DataError(f"task={task.name}: the {split} split is empty")
        wanted = [*task.text_fields, task.label_column]
        missing = [c for c in wanted if c not in ds.column_names]
        if missing:
            raise DataError(
                f"task={task.name}: column(s) {missing} not in the {split} split, whose columns are "
                f"{ds.column_names}. Set task.text_fields=[...] and task.label_column=... to match."
            )


def label_names(raw: DatasetDict, task: DictConfig) -> list[str] | None:
    """Label names in id order (None for regression): config, ClassLabel names, or sorted values."""
    if task.family == TaskFamily.regression:
        return None
    if task.labels is not None:
        return [str(x) for x in task.labels]
    feature = raw["train"].features[task.label_column]
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    values = sorted({v for v in raw["train"][task.label_column] if v is not None})
    return [str(v) for v in values]


POSITIVE_NAMES = ("1", "true", "positive", "pos", "yes")  # tried in order when task.positive_label is null


def positive_label(task: DictConfig, labels: list[str] | None) -> str | None:
    """The class binary F1 scores: task.positive_label, else the label named 1, true, positive, pos or yes (any case);
    None when the task does not have exactly two labels. Raises DataError when F1 is asked for and neither
    names one of the two labels."""
    if task.family != TaskFamily.classification or labels is None or len(labels) != 2:
        return None
    if task.positive_label is not None:
        if str(task.positive_label) not in labels:
            raise DataError(f"task.positive_label={task.positive_label} is not one of the task's labels {labels}: "
                            f"set it to the class binary F1 should score, e.g. task.positive_label={labels[1]}")
        return str(task.positive_label)
    for name in POSITIVE_NAMES:
        found = [x for x in labels if x.lower() == name]
        if found:
            return found[0]
    if "f1" in task.metrics:
        raise DataError(f"task={task.name}: task.metrics has f1, and with the labels {labels} it is not clear which "
                        f"class binary F1 should score: set task.positive_label={labels[0]} or "
                        f"task.positive_label={labels[1]}")
    return None


def encode_labels(raw: DatasetDict, task: DictConfig, labels: list[str] | None) -> DatasetDict:
    """Add `labels`: ids into `labels` (by name, or integer ids already in range), floats for regression."""
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
        if {str(v) for v in values} <= set(label2id):
            def to_id(v, feature=feature):
                return label2id[feature.int2str(v) if isinstance(feature, ClassLabel) else str(v)]
        elif all(isinstance(v, int) and 0 <= v < len(labels) for v in values):
            def to_id(v):
                return v
        else:
            in_range = all(isinstance(v, int) for v in values)
            unknown = sorted(str(v) for v in values
                             if (not 0 <= v < len(labels) if in_range else str(v) not in label2id))
            raise DataError(
                f"task={task.name}: the {split} split has labels {unknown[:10]} outside the label set "
                f"{labels}. Fix the data, or set task.labels=[...] to the full label list in id order."
            )
        out[split] = ds.map(lambda b, f=to_id: {"labels": [f(v) for v in b[col]]}, batched=True)
    return DatasetDict(out)
