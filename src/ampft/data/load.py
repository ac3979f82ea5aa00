"""Raw splits for every task family: a Hub dataset, local files (checked line by line) or the demo task."""

from __future__ import annotations

import csv
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset
from omegaconf import DictConfig

from ampft.data.demo import demo_splits
from ampft.errors import DataError
from ampft.files import file_digest
from ampft.models import hub_reachable

log = logging.getLogger(__name__)

FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def file_format(path: str) -> str:
    ext = Path(path).suffix.lower()
    if ext not in FORMATS:
        raise ValueError(f"{path}: unsupported extension {ext!r}; use one of {sorted(FORMATS)}")
    return FORMATS[ext]


PREDICT = "predict"  # the split name of the file `make predict` reads (its key: file=PATH)


def split_key(split: str) -> str:
    """The config key that names a split's file, for error messages."""
    if split == PREDICT:
        return "file"
    return f"task.{split}_file" if split in ("train", "validation") else "task.extra_validation_splits"


def extra_split_names(task: DictConfig) -> list[str]:
    """Names of the extra validation splits: the Hub split names, or the files' stems (as split names)."""
    if task.train_file is None:
        return [str(s) for s in task.extra_validation_splits]
    return [re.sub(r"[^\w.]", "_", Path(p).stem) for p in task.extra_validation_splits]


def split_files(task: DictConfig) -> dict[str, str]:
    """Each split's local file by split name (none for Hub and demo data)."""
    if task.train_file is None:
        return {}
    return {"train": task.train_file, "validation": task.validation_file,
            **dict(zip(extra_split_names(task), task.extra_validation_splits, strict=True))}


def where(task: DictConfig, split: str) -> str:
    """A split's source for messages: its file (local files) or the split name."""
    path = split_files(task).get(split)
    return f"task={task.name}, {split} split" if path is None else f"{split_key(split)}={path}"


def numbered(indices: list[int]) -> str:
    """0-based indices for a message, counted from 1: the first eight, then how many more."""
    return ", ".join(str(i + 1) for i in indices[:8]) + (f" and {len(indices) - 8} more" if len(indices) > 8 else "")


def check_columns(ds: Dataset, wanted: list[str], where: str, split: str, fix: str, path: str | None = None) -> None:
    """A DataError naming the `wanted` columns a split lacks, the columns it has, and `fix`; or the `wanted`
    columns whose rows mix value types (datasets reads such a JSON column as its `Json` feature, untyped), with
    each type's first row, read from the split's JSON file `path` where there is one."""
    if missing := [c for c in wanted if c not in ds.column_names]:
        raise DataError(f"{where}: column(s) {missing} not in the {split} split, whose columns are {ds.column_names}. "
                        + fix)
    if mixed := [c for c in wanted if type(ds.features[c]).__name__ == "Json"]:
        # The `Json` feature decodes a string that reads as JSON ("3.5") into its value: the file's rows say the types
        values = [row.get(mixed[0]) for row in _json_rows(path)] if path else ds[mixed[0]]
        first: dict[str, int] = {}  # each type's first row
        for i, value in enumerate(values, 1):
            if value is not None:
                first.setdefault(_JSON_TYPES.get(type(value), type(value).__name__), i)
        raise DataError(f"{where}: column(s) {mixed} of the {split} split mix value types across rows "
                        f"({mixed[0]!r}: " + ", ".join(f"{k} in row {i}" for k, i in first.items())
                        + "); write each column's values one way, e.g. every label as a string, every text as one string")


_JSON_TYPES = {str: "string", int: "number", float: "number", bool: "boolean", list: "list", dict: "object"}


def _json_rows(path: str) -> list[dict]:
    """The rows of a JSON file (a list of objects) or JSON-lines file that `_check_json` passed."""
    text = Path(path).read_text(encoding="utf-8-sig")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None  # JSON lines
    return doc if isinstance(doc, list) else [json.loads(line) for line in text.split("\n") if line.strip()]


def read_checked(read: Callable[[], Dataset], path: str, split: str, what: str, prefix: str = "") -> Dataset:
    """`read()` of a family's own format, with its ValueError (or a file holding no `what`) a DataError naming
    the file."""
    try:
        ds = read()
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{split_key(split)}={path}: {prefix}{exc}") from exc
    if len(ds) == 0:
        raise DataError(f"{split_key(split)}={path}: no {what} in the file")
    return ds


def load_file(path: str, split: str, column_names: list[str] | None = None, text_columns=()) -> Dataset:
    """One split from one file, read on its own terms; `column_names` name a headerless csv/tsv's columns, and
    csv/tsv `text_columns` are read as written (pandas would make a column of "007", "1e5" the numbers 7, 1e5)."""
    check_rows(path, split, column_names)
    # datasets keys its own cache of a local file by path and mtime only: a file rewritten with its mtime
    # kept (cp -p, rsync -a, tar x) would be served stale. The content digest in the builder's config id
    # (`description` is a field of every BuilderConfig) makes its cache follow the content.
    fmt, kwargs = file_format(path), {"description": f"ampft content {file_digest(path)}"}
    if fmt == "csv":
        # Text is text: "NA" or "null" in a sentence stays a word, not a missing value.
        kwargs.update(keep_default_na=False, converters={str(c): str for c in text_columns})
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


def check_rows(path: str, split: str, column_names: list[str] | None = None) -> None:
    """A DataError naming the line of a csv/tsv row whose field count is off or a JSON-lines line that is not an
    object with the first line's keys: pandas silently shifts the columns of such a row; a json reader names no line."""
    key, fmt = f"{split_key(split)}={path}", file_format(path)
    if fmt in ("csv", "json") and Path(path).is_file() and not Path(path).stat().st_size:
        raise DataError(f"{key}: the file is empty (0 bytes)")
    try:
        if fmt == "csv":
            _check_csv(path, key, column_names)
        elif fmt == "json":
            _check_json(path, key)
    except UnicodeDecodeError as exc:
        raise DataError(f"{key}: not UTF-8 text ({exc}); convert it, e.g. iconv -t utf-8") from exc


def _check_csv(path: str, key: str, names: list[str] | None = None) -> None:
    tsv = Path(path).suffix.lower() == ".tsv"
    # The reader (pandas' C parser) takes fields of any length; Python's csv module stops at 128 KiB unless told.
    limit = csv.field_size_limit(2**31 - 1)  # a C long on every platform
    try:
        with open(path, encoding="utf-8", newline="") as f:
            reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE) if tsv else csv.reader(f)
            width, start = (None if names is None else len(names)), 1
            for row in reader:
                if not row:  # blank lines are skipped, as pandas does
                    pass
                elif width is None:
                    width = len(row)
                elif len(row) != width and names is not None:
                    raise DataError(f"{key}: line {start} has {len(row)} fields ({row[:6]!r}) but "
                                    f"task.column_names names {len(names)}: {list(names)}. Name every column, in "
                                    "order, or fix the line (a file with a header line: task.column_names=null)")
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
    finally:
        csv.field_size_limit(limit)


def _check_json(path: str, key: str) -> None:
    with open(path, encoding="utf-8-sig") as f:  # a BOM at the start is not data (the reader skips it too)
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


def refuse_or_warn(bad: int, among: int, task: DictConfig, key: str, msg: str, fix: str) -> None:
    """`bad` of `among` rows would train as something else than meant: a warning, or a DataError (`msg`, then
    `fix`) past task.<key>, a fraction."""
    if bad > task[key] * among:
        raise DataError(f"{msg}. That is more than task.{key}={task[key]} of them: {fix}")
    log.warning("%s (within task.%s=%s)", msg, key, task[key])


def check_empty_texts(empty: list, rows: int, task: DictConfig, where: str, what: str) -> None:
    """Rows with an empty text train as the empty string: a warning, or a DataError past task.max_empty_texts."""
    if empty:
        refuse_or_warn(len(empty), rows, task, "max_empty_texts",
                       f"{where}: {len(empty)} of {rows} rows have an empty or missing text in {what}; they would be "
                       "trained and evaluated as the empty string",
                       "fill them in or remove those rows (or check task.text_fields), or raise task.max_empty_texts "
                       "to use them as they are")


def _load_hub(task: DictConfig) -> DatasetDict:
    try:
        return load_dataset(task.dataset, task.subset)
    except Exception as exc:  # datasets raises several types for "not cached and offline"
        if hub_reachable():
            raise
        raise DataError(
            f"task={task.name}: dataset {task.dataset}{'/' + task.subset if task.subset else ''} is not in the "
            "local cache and the Hub is unreachable. Use local files instead: "
            f"task.train_file=PATH task.validation_file=PATH (columns {list(task.text_fields)} and "
            f"{task.label_column!r})."
        ) from exc


def load_splits(task: DictConfig, read_file: Callable[[str, str], Dataset] = load_file) -> DatasetDict:
    """train, validation and the extra splits (files read by `read_file(path, split)`, or the splits of a Hub
    dataset or the demo that task.train_split/validation_split name), sample limits applied."""
    if task.train_file is not None:
        raw = DatasetDict({split: read_file(path, split) for split, path in split_files(task).items()})
    elif task.dataset is not None or task.name == "demo":
        source = _load_hub(task) if task.dataset is not None else demo_splits()
        names = {"train": task.train_split, "validation": task.validation_split,
                 **{name: name for name in task.extra_validation_splits}}
        if missing := [s for s in names.values() if s not in source]:
            raise DataError(f"task.train_split/validation_split/extra_validation_splits {missing} not in "
                            f"{task.dataset or task.name}: splits are {list(source)}")
        raw = DatasetDict({name: source[split] for name, split in names.items()})
    else:
        raise DataError(f"task={task.name}: set task.train_file/validation_file or task.dataset")
    for split in raw:
        limit = task.max_train_samples if split == "train" else task.max_eval_samples
        if limit is not None and len(raw[split]) > limit:
            raw[split] = raw[split].select(range(limit))
    return raw
