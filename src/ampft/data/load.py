"""Raw splits for a task: a Hub dataset, local files (by extension), or the built-in demo task.

Everything returned has the columns the task config names, checked here with errors that say which
column is missing and which ones exist, and labels already mapped to ids (or floats for regression).
"""

from __future__ import annotations

import csv
import functools
import json
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from datasets import ClassLabel, Dataset, DatasetDict, load_dataset
from omegaconf import DictConfig

from ampft import files
from ampft.config import TaskFamily
from ampft.errors import DataError

log = logging.getLogger(__name__)

FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


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
    check_rows(path, split, column_names)
    # datasets keys its own cache of a local file by path and mtime only: a file rewritten with its mtime
    # kept (cp -p, rsync -a, tar x) would be served stale. The content digest in the builder's config id
    # (`description` is a field of every BuilderConfig) makes its cache follow the content.
    fmt, kwargs = file_format(path), {"description": f"ampft content {file_digest(path)}"}
    if fmt == "csv":
        # Text is text: "NA" or "null" in a sentence stays a word, not a missing value.
        kwargs.update(keep_default_na=False)
        if column_names is not None:
            kwargs.update(column_names=list(column_names), header=None)
        if Path(path).suffix.lower() == ".tsv":  # GLUE-style TSV: quotes are text, not delimiters
            kwargs.update(delimiter="\t", quoting=csv.QUOTE_NONE)
    try:
        return load_dataset(fmt, data_files={split: path}, split=split, **kwargs)
    except Exception as exc:  # datasets wraps parse errors in several exception types
        if "corresponds to no data" in str(exc):
            raise DataError(f"{split_key(split)}={path}: the file has no rows (the {split} split is empty)") from exc
        raise DataError(f"{split_key(split)}={path}: could not be read as {fmt}: {exc}") from exc


def file_digest(path: str | os.PathLike) -> str:
    """`<size>-<sha256 prefix>` of a file's content: what caches of data read from it are keyed by.

    Hashing is cheap next to reading and tokenizing (docs/benchmarks/microbench.md#hashing-data-files).
    Memoized per process by (path, size, mtime, ctime, inode): ctime changes with any rewrite, even one
    that restores the mtime, so a memo is never stale."""
    st = os.stat(path)
    return _digest(os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, *stamp: int) -> str:
    return f"{size}-{files.sha256(path)[:20]}"


def check_rows(path: str, split: str, column_names: list[str] | None = None) -> None:
    """Rows of a csv/tsv file with as many fields as the header (or, for a headerless file, as
    `task.column_names` names), lines of a JSON-lines file that parse as
    objects with the first line's keys: a DataError naming the file, line and what was found otherwise.

    pandas reads a row with one field too many by taking its first field as an index, shifting every
    column (a label digit becomes the sentence, with no error); a json reader names no line."""
    key, fmt = f"{split_key(split)}={path}", file_format(path)
    try:
        if fmt == "csv":
            _check_csv(path, key, column_names)
        elif fmt == "json":
            _check_json(path, key)
    except UnicodeDecodeError as exc:
        raise DataError(f"{key}: not UTF-8 text ({exc}); convert it, e.g. iconv -t utf-8") from exc


def _check_csv(path: str, key: str, names: list[str] | None = None) -> None:
    tsv = Path(path).suffix.lower() == ".tsv"
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else csv.reader(f)
        width, start = (None if names is None else len(names)), 1
        try:
            for row in reader:
                if row:  # blank lines are skipped, as pandas does
                    if width is None:
                        width = len(row)
                    elif len(row) != width and names is not None:
                        raise DataError(f"{key}: line {start} has {len(row)} fields ({row[:6]!r}) but task.column_names "
                                        f"names {len(names)}: {list(names)}. Name every column, in order (or fix the line)")
                    elif len(row) != width:
                        what = "tab" if tsv else "comma"
                        raise DataError(
                            f"{key}: line {start} has {len(row)} fields where the header (the first line) has "
                            f"{width}: {row[:6]!r}. A {what} too many or too few in that line shifts or drops "
                            "columns; fix the line" + (" (quote fields that contain commas)" if not tsv else "")
                        )
                start = reader.line_num + 1
        except csv.Error as exc:
            raise DataError(f"{key}: line {reader.line_num}: {exc}") from exc


def _check_json(path: str, key: str) -> None:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.strip():
        return  # the empty-file error comes from the reader
    if not path.lower().endswith(".jsonl"):
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            pass  # JSON lines in a .json file, or a broken document: check line by line
        else:  # one JSON document: a list of rows (checked here), or an object the reader checks
            rows = doc if isinstance(doc, list) and all(isinstance(r, dict) for r in doc) else []
            for i, row in enumerate(rows[1:], 2):
                if missing := sorted(set(rows[0]) - set(row)):
                    raise DataError(f"{key}: row {i} of the JSON list lacks key(s) {missing} that row 1 has; every "
                                    "row needs every column (a missing value would silently become null)")
            return
    first: tuple[int, set[str]] | None = None
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{key}: line {lineno} is not valid JSON ({exc.msg} at column {exc.colno}): "
                            f"{line[:80]!r}; each line must be one JSON object") from exc
        if not isinstance(row, dict):
            raise DataError(f"{key}: line {lineno} is a JSON {type(row).__name__}, not an object "
                            f"({{\"column\": value, ...}})")
        if first is None:
            first = lineno, set(row)
        elif missing := sorted(first[1] - set(row)):
            raise DataError(f"{key}: line {lineno} lacks key(s) {missing} that line {first[0]} has; every row "
                            "needs every column (a missing value would silently become null)")


def _load_files(task: DictConfig, read_file: Callable[[str, str], Dataset]) -> DatasetDict:
    raw = DatasetDict(train=read_file(task.train_file, "train"), validation=read_file(task.validation_file, "validation"))
    for name, path in zip(extra_split_names(task), task.extra_validation_splits, strict=True):
        raw[name] = read_file(path, name)
    return raw


def _load_hub(task: DictConfig) -> DatasetDict:
    from ampft.models import hub_reachable

    try:
        raw = load_dataset(task.dataset, task.subset)
    except Exception as exc:  # datasets raises several types for "not cached and offline"
        if hub_reachable():
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
    check_labels(raw, task)
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


def _path(task: DictConfig, split: str) -> str | None:
    """The file a split was read from (None for Hub and demo data)."""
    if task.train_file is None:
        return None
    paths = {"train": task.train_file, "validation": task.validation_file,
             **dict(zip(extra_split_names(task), task.extra_validation_splits, strict=True))}
    return paths[split]


def _where(task: DictConfig, split: str) -> str:
    """A split's source for messages: its file (local files) or the split name."""
    path = _path(task, split)
    return f"task={task.name}, {split} split" if path is None else f"{split_key(split)}={path}"


def _rows(task: DictConfig, split: str, indices: list[int]) -> str:
    """Rows by number from 1; the file line too for csv/tsv (one header line, no blank or multi-line rows)."""
    shown = ", ".join(str(i + 1) for i in indices[:8]) + (", ..." if len(indices) > 8 else "")
    path = _path(task, split)
    lines = path is not None and Path(path).suffix.lower() in (".csv", ".tsv")
    return f"row(s) {shown}" + (" (file line = row + 1, after the header)" if lines else "")


def _is_blank(v) -> bool:
    return v is None or (isinstance(v, str) and not v.strip())


def check_labels(raw: DatasetDict, task: DictConfig) -> None:
    """Empty labels (and non-numbers for regression) are errors naming the file and rows; a label set that
    looks like a mistake (integer-like names mixed with words, a class far rarer than the others) is logged
    as a warning with the counts. An empty csv cell would otherwise become a class '' and `0,1,neg,pos` four
    classes, silently."""
    col = task.label_column
    for split, ds in raw.items():
        if isinstance(ds.features[col], ClassLabel):
            continue  # ids into names already (a Hub dataset); -1 marks an unlabelled test row
        values = ds[col]
        blank = [i for i, v in enumerate(values) if _is_blank(v)]
        if blank:
            raise DataError(f"{_where(task, split)}: {len(blank)} empty label(s) in column {col!r}, "
                            f"{_rows(task, split, blank)}. Fill them in or remove those rows.")
        if task.family == TaskFamily.regression:
            bad = [i for i, v in enumerate(values) if not _is_number(v)]
            if bad:
                raise DataError(f"{_where(task, split)}: label column {col!r} of a regression task has non-numbers (or nan/inf) "
                                f"{sorted({str(values[i]) for i in bad})[:5]} in {_rows(task, split, bad)}; "
                                "use numbers, or task.family=classification for class labels")
    train = raw["train"]
    if task.family != TaskFamily.classification or task.labels is not None or isinstance(train.features[col],
                                                                                         ClassLabel):
        return
    counts = Counter(str(v) for v in train[col])
    shown = dict(sorted(counts.items()))
    integer = [v for v in counts if re.fullmatch(r"[+-]?\d+", v.strip())]
    if integer and len(integer) < len(counts):
        log.warning("%s: labels mix integer-like and word values %s (counts): %d classes. If these are two "
                    "spellings of the same classes, fix the file; set task.labels=[...] to silence this.",
                    _where(task, "train"), shown, len(counts))
    largest = max(counts.values())
    rare = {v: n for v, n in counts.items() if n < max(2, 0.01 * largest)}
    if rare and len(counts) > 1:
        log.warning("%s: label(s) %s have very few examples next to the largest class (%d); label counts %s. "
                    "A typo in a label column makes a class of its own: check them, or set task.labels=[...] to "
                    "silence this.", _where(task, "train"), sorted(rare), largest, shown)


def _is_number(v) -> bool:
    if isinstance(v, bool):
        return False
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


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
