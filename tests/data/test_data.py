"""The data module on real files: formats, labels, clear errors, the tokenization cache, dataloaders, demo."""

from __future__ import annotations

import contextlib
import csv
import math
from collections import Counter
from pathlib import Path

import datasets
import pandas as pd
import pytest
import torch

from ampft.data import LengthGroupedSampler, build_dataloaders, padding, prepare_data
from ampft.data import demo as demo_module
from ampft.data.demo import demo_splits
from ampft.data.load import DataError, file_format
from ampft.tasks.classification import CLASSIFICATION
from ampft.tasks.classification.data import encode_labels, label_names, load_raw
from tests.helpers import compose_config, shared

ROWS = pd.DataFrame({
    # a comma (quoted in CSV), an apostrophe, non-ASCII text; no tab, no double quote (GLUE-style TSV)
    "sentence": ["a fine, sturdy case", "the screen died", "it's great", "naïve but broken", "works well"],
    "label": ["pos", "neg", "pos", "neg", "pos"],
})


@pytest.fixture(autouse=True)
def _own_datasets_cache(tmp_path, monkeypatch):
    """`load_dataset` caches Arrow files per test: every load here reads the real file, nothing in ~/.cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


@pytest.fixture(scope="module")
def tokenizer():
    """The tiny-bert tokenizer (offline WordPiece), loaded once for the module."""
    from ampft.models import load_tokenizer

    return load_tokenizer(compose_config("finetune", ["model=tiny-bert"]).model)


def write(df: pd.DataFrame, path: Path) -> Path:
    """Write `df` in the format named by the extension, the way a user would produce the file."""
    ext = path.suffix
    if ext == ".csv":
        df.to_csv(path, index=False)
    elif ext == ".tsv":
        df.to_csv(path, sep="\t", index=False, quoting=csv.QUOTE_NONE)
    elif ext == ".jsonl":
        df.to_json(path, orient="records", lines=True, force_ascii=False)
    elif ext == ".json":
        df.to_json(path, orient="records", force_ascii=False)  # one JSON array
    elif ext == ".parquet":
        df.to_parquet(path, index=False)
    else:
        raise AssertionError(ext)
    return path


def files_task(compose, train: Path, validation: Path, *overrides: str, task: str = "csv"):
    return compose([f"task={task}", f"task.train_file={train}", f"task.validation_file={validation}",
                    *overrides]).task


def load_encoded(task):
    raw = load_raw(task)
    labels = label_names(raw, task)
    return raw, labels, encode_labels(raw, task, labels)


# ---------------------------------------------------------------------------------------------------------
# file_format


@pytest.mark.parametrize(("name", "fmt"), [
    ("train.csv", "csv"), ("train.tsv", "csv"), ("dev.json", "json"), ("dev.jsonl", "json"),
    ("x.parquet", "parquet"), ("/some/dir/UPPER.TSV", "csv"), ("a.b.csv", "csv"),
])
def test_file_format_by_extension(name, fmt):
    assert file_format(name) == fmt


@pytest.mark.parametrize("name", ["train.txt", "train.xlsx", "train", "train.csv.gz"])
def test_file_format_rejects_other_extensions_naming_the_supported_ones(name):
    with pytest.raises(ValueError, match="unsupported extension") as err:
        file_format(name)
    msg = str(err.value)
    assert name in msg
    assert "['.csv', '.json', '.jsonl', '.parquet', '.tsv']" in msg


# ---------------------------------------------------------------------------------------------------------
# the csv task: same content in every format


@pytest.mark.parametrize("ext", [".csv", ".tsv", ".jsonl", ".json", ".parquet"])
def test_every_format_loads_the_same_rows_with_string_labels(compose, tmp_path, ext):
    train = write(ROWS, tmp_path / f"train{ext}")
    dev = write(ROWS.iloc[::-1], tmp_path / f"dev{ext}")
    raw, labels, enc = load_encoded(files_task(compose, train, dev))
    assert raw["train"]["sentence"] == list(ROWS.sentence)
    assert raw["validation"]["sentence"] == list(ROWS.sentence[::-1])
    assert labels == ["neg", "pos"]  # sorted values of the train split
    assert enc["train"]["labels"] == [1, 0, 1, 0, 1]
    assert enc["validation"]["labels"] == [1, 0, 1, 0, 1][::-1]
    assert enc["train"]["label"] == list(ROWS.label)  # the original column is kept


@pytest.mark.parametrize("ext", [".csv", ".tsv", ".jsonl", ".json"])
def test_a_byte_order_mark_at_the_start_of_a_text_file_is_not_data(compose, tmp_path, ext):
    # Windows tools (Notepad, PowerShell, Excel's "CSV UTF-8") start UTF-8 files with a BOM; the readers skip it.
    train, dev = write(ROWS, tmp_path / f"train{ext}"), write(ROWS, tmp_path / f"dev{ext}")
    for path in (train, dev):
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    raw, labels, enc = load_encoded(files_task(compose, train, dev))
    assert raw["train"].column_names[:2] == ["sentence", "label"]
    assert raw["validation"]["sentence"] == list(ROWS.sentence)
    assert labels == ["neg", "pos"] and enc["train"]["labels"] == [1, 0, 1, 0, 1]


@pytest.mark.parametrize("ext", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_integer_labels_are_used_as_ids(compose, tmp_path, ext):
    df = ROWS.assign(label=[1, 0, 1, 0, 1])
    train, dev = write(df, tmp_path / f"train{ext}"), write(df.iloc[:2], tmp_path / f"dev{ext}")
    raw, labels, enc = load_encoded(files_task(compose, train, dev))
    assert labels == ["0", "1"]
    assert enc["train"]["labels"] == [1, 0, 1, 0, 1]
    assert enc["validation"]["labels"] == [1, 0]


def test_label_order_comes_from_task_labels(compose, tmp_path):
    train, dev = write(ROWS, tmp_path / "train.csv"), write(ROWS, tmp_path / "dev.csv")
    _, labels, enc = load_encoded(files_task(compose, train, dev, "task.labels=[pos,neg]"))
    assert labels == ["pos", "neg"]
    assert enc["train"]["labels"] == [0, 1, 0, 1, 0]


def test_label_names_with_integer_ids_in_the_file_map_ids_directly(compose, tmp_path):
    df = ROWS.assign(label=[1, 0, 1, 0, 1])
    train, dev = write(df, tmp_path / "train.jsonl"), write(df.iloc[1:3], tmp_path / "dev.jsonl")
    _, labels, enc = load_encoded(files_task(compose, train, dev, "task.labels=[negative,positive]"))
    assert labels == ["negative", "positive"]
    assert enc["train"]["labels"] == [1, 0, 1, 0, 1]
    assert enc["validation"]["labels"] == [0, 1]


def test_sentence_pairs(compose, tmp_path):
    df = pd.DataFrame({"s1": ["a man sleeps", "the cat sat", "it rains"],
                       "s2": ["a person rests", "a dog barked", "the ground is wet"],
                       "label": ["entailment", "contradiction", "entailment"]})
    train, dev = write(df, tmp_path / "train.tsv"), write(df, tmp_path / "dev.tsv")
    task = files_task(compose, train, dev, "task.text_fields=[s1,s2]")
    raw, labels, enc = load_encoded(task)
    assert raw["train"]["s1"] == list(df.s1) and raw["train"]["s2"] == list(df.s2)
    assert labels == ["contradiction", "entailment"]
    assert enc["validation"]["labels"] == [1, 0, 1]


def test_max_samples_limit_each_split(compose, tmp_path):
    train, dev = write(ROWS, tmp_path / "train.csv"), write(ROWS, tmp_path / "dev.csv")
    raw = load_raw(files_task(compose, train, dev, "task.max_train_samples=3", "task.max_eval_samples=2"))
    assert (len(raw["train"]), len(raw["validation"])) == (3, 2)
    assert raw["train"]["sentence"] == list(ROWS.sentence[:3])  # the first rows, in file order


def test_tsv_double_quotes_are_text(compose, tmp_path):
    # In a GLUE TSV a quote character is text: an opening quote must not swallow the tab, the newline
    # and the following rows, and surrounding quotes must not be stripped.
    text = (
        'sentence\tlabel\n'
        '"the lens" is superb\tpos\n'
        'he said "it broke\tneg\n'
        'a 12" screen\tpos\n'
        '"fully quoted"\tneg\n'
    )
    path = tmp_path / "quotes.tsv"
    path.write_text(text, encoding="utf-8")
    raw = load_raw(files_task(compose, path, path))
    assert raw["train"]["sentence"] == ['"the lens" is superb', 'he said "it broke', 'a 12" screen',
                                        '"fully quoted"']
    assert raw["train"]["label"] == ["pos", "neg", "pos", "neg"]


def test_tsv_text_that_looks_like_a_missing_value_is_kept(compose, tmp_path):
    path = tmp_path / "na.tsv"
    path.write_text("sentence\tlabel\nNA\tpos\nnull\tneg\nNone\tpos\nnan\tneg\n", encoding="utf-8")
    raw = load_raw(files_task(compose, path, path))
    assert raw["train"]["sentence"] == ["NA", "null", "None", "nan"]


@pytest.mark.parametrize("ext", [".csv", ".tsv"])
def test_csv_text_that_looks_like_a_number_is_kept_as_written(compose, tmp_path, ext):
    # A text column whose every cell looks numeric (codes, years, short answers) would be parsed as numbers:
    # "007" would train as "7", "1e5" as "100000.0".
    sep = "\t" if ext == ".tsv" else ","
    path = tmp_path / f"codes{ext}"
    path.write_text(f"sentence{sep}label\n007{sep}pos\n1e5{sep}neg\n12{sep}pos\n0012{sep}neg\n", encoding="utf-8")
    raw = load_raw(files_task(compose, path, path))
    assert raw["train"]["sentence"] == ["007", "1e5", "12", "0012"]
    with_predict = CLASSIFICATION.read_inputs(files_task(compose, path, path), str(path))
    assert with_predict["sentence"] == ["007", "1e5", "12", "0012"]


# ---------------------------------------------------------------------------------------------------------
# errors that say what is wrong


def test_missing_text_column_names_it_and_lists_the_columns(compose, tmp_path):
    df = ROWS.rename(columns={"sentence": "text"})
    train, dev = write(df, tmp_path / "train.csv"), write(df, tmp_path / "dev.csv")
    with pytest.raises(DataError) as err:
        load_raw(files_task(compose, train, dev))
    msg = str(err.value)
    assert "['sentence']" in msg  # the missing column
    assert "['text', 'label']" in msg  # the columns that exist
    assert "task.text_fields" in msg


def test_missing_second_text_field_of_a_pair(compose, tmp_path):
    df = pd.DataFrame({"s1": ["a", "b"], "label": [0, 1]})
    train, dev = write(df, tmp_path / "train.parquet"), write(df, tmp_path / "dev.parquet")
    with pytest.raises(DataError, match=r"\['s2'\].*\['s1', 'label'\]"):
        load_raw(files_task(compose, train, dev, "task.text_fields=[s1,s2]"))


def test_missing_label_column(compose, tmp_path):
    df = ROWS.rename(columns={"label": "y"})
    train, dev = write(df, tmp_path / "train.jsonl"), write(df, tmp_path / "dev.jsonl")
    with pytest.raises(DataError, match=r"\['label'\].*\['sentence', 'y'\]"):
        load_raw(files_task(compose, train, dev))


def test_missing_column_in_validation_only_is_a_data_error(compose, tmp_path):
    train = write(ROWS, tmp_path / "train.csv")
    dev = write(ROWS.rename(columns={"sentence": "text"}), tmp_path / "dev.csv")
    with pytest.raises(DataError, match=r"\['sentence'\] not in the validation split.*\['text', 'label'\]"):
        load_raw(files_task(compose, train, dev))


def test_validation_file_with_an_extra_column_loads(compose, tmp_path):
    train = write(ROWS, tmp_path / "train.csv")
    dev = write(ROWS.assign(idx=range(len(ROWS))), tmp_path / "dev.csv")
    raw = load_raw(files_task(compose, train, dev))
    assert raw["validation"]["sentence"] == list(ROWS.sentence)


@pytest.mark.parametrize(("train_ext", "dev_ext"), [(".csv", ".tsv"), (".tsv", ".csv")])
def test_csv_and_tsv_pair_is_read_or_rejected_clearly(compose, tmp_path, train_ext, dev_ext):
    train, dev = write(ROWS, tmp_path / f"train{train_ext}"), write(ROWS, tmp_path / f"dev{dev_ext}")
    try:
        raw = load_raw(files_task(compose, train, dev))
    except DataError:
        return  # refusing the mix with a clear message is as good as reading it
    assert raw["validation"]["sentence"] == raw["train"]["sentence"] == list(ROWS.sentence)


def test_train_and_validation_may_differ_in_format(compose, tmp_path):
    train, dev = write(ROWS, tmp_path / "train.csv"), write(ROWS, tmp_path / "dev.jsonl")
    raw = load_raw(files_task(compose, train, dev))
    assert raw["train"]["sentence"] == raw["validation"]["sentence"]


@pytest.mark.parametrize("split", ["train", "validation"])
def test_empty_split_is_a_data_error(compose, tmp_path, split):
    train, dev = write(ROWS, tmp_path / "train.csv"), write(ROWS, tmp_path / "dev.csv")
    key = "max_train_samples" if split == "train" else "max_eval_samples"
    with pytest.raises(DataError, match=f"the {split} split is empty"):
        load_raw(files_task(compose, train, dev, f"task.{key}=0"))


def test_empty_file_is_a_data_error(compose, tmp_path):
    train = write(ROWS, tmp_path / "train.csv")
    dev = tmp_path / "dev.csv"
    dev.write_text("sentence,label\n")
    with pytest.raises(DataError, match="the validation split is empty"):
        load_raw(files_task(compose, train, dev))


def test_validation_label_outside_task_labels_is_named(compose, tmp_path):
    train = write(ROWS, tmp_path / "train.tsv")
    dev = write(ROWS.assign(label=["pos", "neutral", "neg", "pos", "neg"]), tmp_path / "dev.tsv")
    task = files_task(compose, train, dev, "task.labels=[neg,pos]")
    raw = load_raw(task)
    labels = label_names(raw, task)
    with pytest.raises(DataError, match=r"validation split has labels \['neutral'\] outside the label set "
                                        r"\['neg', 'pos'\]"):
        encode_labels(raw, task, labels)


def test_validation_label_unseen_in_train_is_named(compose, tmp_path):
    train = write(ROWS, tmp_path / "train.csv")
    dev = write(ROWS.assign(label=["pos", "neg", "mixed", "pos", "neg"]), tmp_path / "dev.csv")
    with pytest.raises(DataError, match=r"\['mixed'\]"):
        load_encoded(files_task(compose, train, dev))


def test_validation_label_unseen_in_train_names_the_file_and_rows(compose, tmp_path):
    train = write(ROWS, tmp_path / "train.csv")
    dev = write(ROWS.assign(label=["pos", "neg", "mixed", "pos", "mixed"]), tmp_path / "dev.csv")
    with pytest.raises(DataError) as err:
        load_encoded(files_task(compose, train, dev))
    assert f"task.validation_file={dev}" in str(err.value)
    assert "row(s) 3, 5" in str(err.value)


def _int_labels_with_an_out_of_range_id(compose, tmp_path):
    train = write(ROWS.assign(label=[0, 1, 0, 1, 0]), tmp_path / "train.jsonl")
    dev = write(ROWS.assign(label=[0, 1, 2, 1, 0]), tmp_path / "dev.jsonl")
    with pytest.raises(DataError) as err:
        load_encoded(files_task(compose, train, dev, "task.labels=[neg,pos]"))
    return str(err.value)


def test_integer_id_out_of_range_is_named(compose, tmp_path):
    msg = _int_labels_with_an_out_of_range_id(compose, tmp_path)
    assert "the validation split has labels" in msg
    assert "'2'" in msg and "['neg', 'pos']" in msg


def test_integer_id_out_of_range_error_names_only_the_bad_id(compose, tmp_path):
    msg = _int_labels_with_an_out_of_range_id(compose, tmp_path)
    assert "has labels ['2'] outside" in msg


def test_regression_labels_become_floats(compose, tmp_path):
    df = pd.DataFrame({"s1": ["a", "b", "c"], "s2": ["d", "e", "f"], "score": [0.0, 2.5, 5]})
    train, dev = write(df, tmp_path / "train.csv"), write(df, tmp_path / "dev.csv")
    task = files_task(compose, train, dev, "task.family=regression", "task.text_fields=[s1,s2]",
                      "task.label_column=score")
    _, labels, enc = load_encoded(task)
    assert labels is None
    assert enc["train"]["labels"] == [0.0, 2.5, 5.0]


# ---------------------------------------------------------------------------------------------------------
# real GLUE files


@pytest.mark.data
def test_real_sst2(compose):
    train, dev = shared("sst2", "train_first1000.tsv"), shared("sst2", "dev.tsv")
    raw, labels, enc = load_encoded(files_task(compose, train, dev, task="sst2"))
    assert labels == ["negative", "positive"]
    assert (len(enc["train"]), len(enc["validation"])) == (1000, 872)
    # SOURCE.md: dev has 428 negative / 444 positive; the first train row, verbatim with its trailing space.
    assert Counter(enc["validation"]["labels"]) == {0: 428, 1: 444}
    assert raw["train"][0] == {"sentence": "hide new secretions from the parental units ", "label": 0}


@pytest.mark.data
def test_real_rte_string_labels_follow_the_task_label_order(compose):
    train, dev = shared("rte", "train.tsv"), shared("rte", "dev.tsv")
    _, labels, enc = load_encoded(files_task(compose, train, dev, task="rte"))
    assert labels == ["entailment", "not_entailment"]
    assert (len(enc["train"]), len(enc["validation"])) == (2127, 277)
    # train.tsv rows 0 and 1 are not_entailment and entailment; dev has 146 / 131 (SOURCE.md).
    assert enc["train"][:2]["label"] == ["not_entailment", "entailment"]
    assert enc["train"][:2]["labels"] == [1, 0]
    assert Counter(enc["validation"]["labels"]) == {0: 146, 1: 131}


@pytest.mark.data
def test_real_mrpc_with_bom_and_original_column_names(compose):
    train, dev = shared("mrpc", "train.tsv"), shared("mrpc", "dev.tsv")
    task = files_task(compose, train, dev, 'task.text_fields=["#1 String","#2 String"]',
                      "task.label_column=Quality", task="mrpc")
    raw, labels, enc = load_encoded(task)
    assert raw["train"].column_names[0] == "Quality"  # the UTF-8 BOM is not part of the name
    assert labels == ["not_equivalent", "equivalent"]
    assert Counter(enc["train"]["labels"]) == {1: 2474, 0: 1194}
    assert Counter(enc["validation"]["labels"]) == {1: 279, 0: 129}


# ---------------------------------------------------------------------------------------------------------
# prepare_data: tokenization and its on-disk cache


def _pair_files(tmp_path: Path, n: int = 24) -> tuple[Path, Path]:
    words = ["the", "battery", "was", "not", "great", "but", "the", "screen", "is", "superb", "and", "the",
             "case", "feels", "sturdy", "enough"]
    df = pd.DataFrame({
        "s1": [" ".join(words[: 1 + (i * 5) % len(words)]) for i in range(n)],
        "s2": [" ".join(words[-(1 + (i * 3) % len(words)):]) for i in range(n)],
        "label": [["neg", "pos"][i % 2] for i in range(n)],
    })
    return write(df, tmp_path / "train.csv"), write(df.iloc[: n // 2], tmp_path / "dev.csv")


def _cfg(compose, tmp_path, *overrides):
    train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    if not train.exists():  # written once per test: rewriting a file changes its fingerprint
        _pair_files(tmp_path)
    return compose(["model=tiny-bert", "task=csv", f"task.train_file={train}", f"task.validation_file={dev}",
                    "task.text_fields=[s1,s2]", f"cache_dir={tmp_path / 'cache'}", *overrides])


def test_prepare_data_tokenizes_pairs_within_max_length(compose, tmp_path, tokenizer):
    cfg = _cfg(compose, tmp_path, "task.max_length=16")
    data = prepare_data(cfg, CLASSIFICATION, tokenizer, contextlib.nullcontext)
    assert data.labels == ["neg", "pos"]
    assert data.cache_path.parent == tmp_path / "cache" / "tokenized"
    assert data.cache_path.name.startswith("csv-")
    assert (len(data.train), len(data.validation)) == (24, 12)
    for ds in (data.train, data.validation):
        assert {"input_ids", "attention_mask", "labels", "length"} <= set(ds.column_names)
        assert not {"s1", "s2", "label"} & set(ds.column_names)
        assert all(n <= 16 for n in ds["length"])
        assert ds["length"] == [len(ids) for ids in ds["input_ids"]]
    assert max(data.train["length"]) == 16  # the longest pairs were truncated, not dropped
    assert data.train["labels"] == [i % 2 for i in range(24)]
    row = data.train[0]  # "the" / "enough": [CLS] the [SEP] enough [SEP]
    assert tokenizer.decode(row["input_ids"]) == "[CLS] the [SEP] enough [SEP]"
    assert row["token_type_ids"] == [0, 0, 0, 1, 1]


def test_second_prepare_is_served_from_the_disk_cache(compose, tmp_path, tokenizer, monkeypatch):
    cfg = _cfg(compose, tmp_path)
    first = prepare_data(cfg, CLASSIFICATION, tokenizer, contextlib.nullcontext)
    assert first.cache_path.is_dir()

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again although the cache was there")

    monkeypatch.setattr(CLASSIFICATION, "tokenize", no_tokenizing)
    second = prepare_data(_cfg(compose, tmp_path), CLASSIFICATION, tokenizer, contextlib.nullcontext)
    assert second.cache_path == first.cache_path
    assert second.labels == first.labels
    assert second.train[:] == first.train[:]
    assert second.validation[:] == first.validation[:]
    assert [p.name for p in first.cache_path.parent.iterdir()] == [first.cache_path.name]  # no tmp left over


def test_cache_key_changes_with_max_length_and_with_the_data(compose, tmp_path, tokenizer):
    base = prepare_data(_cfg(compose, tmp_path, "task.max_length=64"), CLASSIFICATION, tokenizer, contextlib.nullcontext)
    shorter = prepare_data(_cfg(compose, tmp_path, "task.max_length=8"), CLASSIFICATION, tokenizer, contextlib.nullcontext)
    assert shorter.cache_path != base.cache_path
    assert max(shorter.train["length"]) == 8 < max(base.train["length"])
    # Rewriting the train file with other text must not reuse the old tokenization.
    cfg = _cfg(compose, tmp_path, "task.max_length=64")
    train = Path(cfg.task.train_file)
    train.write_text(train.read_text().replace("battery", "keyboard"))
    edited = prepare_data(cfg, CLASSIFICATION, tokenizer, contextlib.nullcontext)
    assert edited.cache_path != base.cache_path
    assert "keyboard" in tokenizer.decode(edited.train[1]["input_ids"])


def test_demo_task_is_cached_too(compose, tmp_path, tokenizer, monkeypatch):
    cfg = compose(["model=tiny-bert", "task=demo", "task.max_train_samples=64", "task.max_eval_samples=32",
                   f"cache_dir={tmp_path / 'cache'}"])
    first = prepare_data(cfg, CLASSIFICATION, tokenizer, contextlib.nullcontext)
    assert first.labels == ["negative", "positive"]
    assert (len(first.train), len(first.validation)) == (64, 32)
    monkeypatch.setattr(CLASSIFICATION, "tokenize", lambda *a, **k: pytest.fail("demo tokenized twice"))
    assert prepare_data(cfg, CLASSIFICATION, tokenizer, contextlib.nullcontext).cache_path == first.cache_path


# ---------------------------------------------------------------------------------------------------------
# build_dataloaders


def _loaders(compose, tmp_path, tokenizer, *overrides):
    cfg = _cfg(compose, tmp_path, "task.max_length=64", "trainer.batch_size=4", *overrides)
    data = prepare_data(cfg, CLASSIFICATION, tokenizer, contextlib.nullcontext)
    return cfg, data, *build_dataloaders(cfg, data, tokenizer, torch.device("cpu"))


@pytest.mark.parametrize("multiple", [None, 8])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_batches_are_padded_dynamically(compose, tmp_path, tokenizer, precision, multiple):
    _, data, train_dl, eval_dl = _loaders(compose, tmp_path, tokenizer, f"precision={precision}",
                                          f"trainer.pad_to_multiple_of={multiple or 'null'}")
    widths = []
    for dl in (train_dl, eval_dl):
        for batch in (c for b in dl for c in (b if isinstance(b, list) else [b])):  # a training batch's chunks too
            assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels"}  # no `length`
            longest = int(batch["attention_mask"].sum(dim=1).max())
            width = batch["input_ids"].shape[1]
            if multiple:
                assert width == 8 * math.ceil(longest / 8)  # Tensor Core friendly
            else:
                assert width == longest  # padded to the longest row, no further (bf16 too, on a CPU)
            assert batch["attention_mask"].shape == batch["input_ids"].shape
            # padding is [PAD] with mask 0
            assert (batch["input_ids"][batch["attention_mask"] == 0] == tokenizer.pad_token_id).all()
            widths.append(width)
    assert max(widths) <= 64 and min(widths) < 64  # per batch, not to task.max_length
    if not multiple:  # (rounded up, every batch may have the same multiple of 8)
        assert len(set(widths)) > 1 and any(w % 8 for w in widths)


def test_dataloader_sizes_and_eval_order(compose, tmp_path, tokenizer):
    _, data, train_dl, eval_dl = _loaders(compose, tmp_path, tokenizer)
    assert train_dl.batch_size == 4 and eval_dl.batch_size == 8  # eval_batch_size null: 2 x batch_size
    assert sum(len(c["labels"]) for b in train_dl for c in (b if isinstance(b, list) else [b])) == 24
    lengths = data.validation["length"]
    assert lengths == sorted(lengths, reverse=True)  # evaluation in length order, longest first
    labels = torch.cat([b["labels"] for b in eval_dl]).tolist()
    assert labels == data.validation["labels"]  # the loader follows the (sorted) split
    # The same examples as the file (its tokenized cache), reordered, whatever the training batches are.
    file_order = datasets.load_from_disk(str(data.cache_path))["validation"]
    assert file_order["length"] != lengths
    pairs = sorted(zip(data.validation["input_ids"], labels, strict=True))
    assert pairs == sorted(zip(file_order["input_ids"], file_order["labels"], strict=True))
    _, grouped, _, _ = _loaders(compose, tmp_path, tokenizer, "trainer.group_by_length=true")
    assert grouped.validation["input_ids"] == data.validation["input_ids"]


def _waste(order: list[int], lengths: list[int], bs: int) -> int:
    """Padding tokens when `order` is cut into batches of `bs` and each is padded to its longest row."""
    batches = [order[i:i + bs] for i in range(0, len(order), bs)]
    return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)


def test_length_grouped_sampler_groups_shuffles_and_is_reproducible():
    g = torch.Generator().manual_seed(0)
    lengths = torch.exp(2.5 + 0.6 * torch.randn(1003, generator=g)).clamp(3, 128).long().tolist()  # SST-2-like
    bs = 16
    sampler = LengthGroupedSampler(lengths, bs, seed=7, mega_batches=8)

    def order(epoch):
        sampler.set_epoch(epoch)
        return list(sampler)

    e0, e1 = order(0), order(1)
    assert sorted(e0) == sorted(e1) == list(range(1003)) and len(sampler) == 1003
    assert e0 != e1 and order(0) == e0  # a new order per epoch, the same order for the same epoch
    assert list(LengthGroupedSampler(lengths, bs, seed=7, mega_batches=8)) == e0  # a resumed run: same order
    batches = [e0[i:i + bs] for i in range(0, 1003, bs)]
    assert all(len(b) == bs for b in batches[:-1]) and len(batches[-1]) == 1003 % bs  # the partial batch last
    assert max(lengths[i] for i in batches[0]) == max(lengths)  # the longest first: an OOM shows at step 1
    # Batches come shuffled, not in waves of decreasing length.
    tops = [max(lengths[i] for i in b) for b in batches[1:-1]]
    assert tops != sorted(tops, reverse=True) and tops != sorted(tops)
    # Padding nearly vanishes: far less than random batches of the same size (0.23 for this draw; 0.16-0.27
    # over 30 draws, so the lengths come from the test's own generator, not the order tests happen to run in).
    random_order = torch.randperm(1003, generator=g).tolist()
    assert _waste(e0, lengths, bs) < 0.25 * _waste(random_order, lengths, bs)


def test_the_dataloader_follows_the_length_grouped_sampler(compose, tmp_path, tokenizer):
    cfg, data, train_dl, _ = _loaders(compose, tmp_path, tokenizer, "trainer.group_by_length=true",
                                      "trainer.length_chunks=1")  # whole batches, in the sampler's order
    sampler = train_dl.sampler
    assert isinstance(sampler, LengthGroupedSampler)
    sampler.set_epoch(1)
    expected = list(sampler)
    seen = torch.cat([b["labels"] for b in train_dl]).tolist()
    assert seen == [data.train["labels"][i] for i in expected]


def test_length_groups_are_global_batches(compose, tmp_path, tokenizer):
    # Two ranks with batch 4 get, step by step, the examples one process with batch 8 gets: Accelerate deals
    # consecutive loader batches to the ranks in turn, so the sampler groups by the global batch.
    cfg, data, one, _ = _loaders(compose, tmp_path, tokenizer, "trainer.batch_size=8", "trainer.group_by_length=true")
    cfg2 = _cfg(compose, tmp_path, "task.max_length=64", "trainer.batch_size=4", "trainer.group_by_length=true",
                "trainer.length_chunks=1")
    two = build_dataloaders(cfg2, data, tokenizer, torch.device("cpu"), num_processes=2)[0]
    assert list(one.sampler) == list(two.sampler)
    assert [len(b["labels"]) for b in two][:2] == [4, 4]


def test_by_default_the_sampler_is_random(compose, tmp_path, tokenizer):
    _, _, train_dl, _ = _loaders(compose, tmp_path, tokenizer)
    assert isinstance(train_dl.sampler, torch.utils.data.RandomSampler)


@pytest.mark.parametrize(("overrides", "device", "expected"), [
    ([], "cpu", dict(padding="longest", max_length=None, pad_to_multiple_of=None)),
    # Multiples of 8 are Tensor Core shapes: on CUDA under fp16/bf16 only; on a CPU they are extra tokens.
    (["precision=bf16"], "cuda", dict(padding="longest", max_length=None, pad_to_multiple_of=8)),
    (["precision=fp16"], "cuda", dict(padding="longest", max_length=None, pad_to_multiple_of=8)),
    (["precision=bf16"], "cpu", dict(padding="longest", max_length=None, pad_to_multiple_of=None)),
    (["precision=tf32"], "cuda", dict(padding="longest", max_length=None, pad_to_multiple_of=None)),
    (["precision=bf16", "trainer.pad_to_multiple_of=8"], "cpu", dict(padding="longest", max_length=None,
                                                                      pad_to_multiple_of=8)),
    (["precision=fp16", "trainer.pad_to_multiple_of=16"], "cuda", dict(padding="longest", max_length=None,
                                                                       pad_to_multiple_of=16)),
    (["precision=bf16", "trainer.pad_to_multiple_of=1"], "cuda", dict(padding="longest", max_length=None,
                                                                      pad_to_multiple_of=None)),
    # torch.compile: at most compile_buckets lengths (128 / 8 = 16), whatever the precision wants
    (["trainer.compile=true"], "cpu", dict(padding="longest", max_length=None, pad_to_multiple_of=16)),
    (["trainer.compile=true", "trainer.compile_buckets=3", "task.max_length=100"], "cpu",
     dict(padding="longest", max_length=None, pad_to_multiple_of=40)),
    (["trainer.padding=max_length", "precision=bf16"], "cuda", dict(padding="max_length", max_length=128,
                                                                    pad_to_multiple_of=None)),
])
def test_padding_settings(compose, tmp_path, tokenizer, overrides, device, expected):
    cfg = _cfg(compose, tmp_path, "task.max_length=128", *overrides)
    assert padding(cfg, tokenizer, torch.device(device)) == expected


def test_compile_buckets_bound_the_padded_lengths(compose, tmp_path, tokenizer):
    _, _, train_dl, eval_dl = _loaders(compose, tmp_path, tokenizer, "trainer.compile=true",
                                       "trainer.compile_buckets=4")
    widths = {b["input_ids"].shape[1] for dl in (train_dl, eval_dl) for b in dl}
    assert widths <= {16, 32, 48, 64}


def test_padding_to_max_length_pads_every_batch(compose, tmp_path, tokenizer):
    _, _, train_dl, eval_dl = _loaders(compose, tmp_path, tokenizer, "trainer.padding=max_length")
    assert {b["input_ids"].shape[1] for dl in (train_dl, eval_dl) for b in dl} == {64}


# ---------------------------------------------------------------------------------------------------------
# the demo task


def test_demo_splits_are_deterministic_and_sized():
    a, b = demo_splits(), demo_splits()
    assert (len(a["train"]), len(a["validation"])) == (2000, 500)
    for split in ("train", "validation"):
        assert a[split][:] == b[split][:]
        assert a[split].column_names == ["sentence", "label"]
    assert a["train"]["sentence"][:50] != a["validation"]["sentence"][:50]


def test_demo_labels_are_balanced():
    for split, ds in demo_splits().items():
        counts = Counter(ds["label"])
        assert set(counts) == {0, 1}, split
        assert 0.35 <= counts[1] / len(ds) <= 0.65, (split, counts)


def test_demo_label_is_the_deciding_clause_polarity_flipped_by_negation():
    positive, negative = set(demo_module.POSITIVE), set(demo_module.NEGATIVE)
    assert not positive & negative
    seen = Counter()
    for split, ds in demo_splits().items():
        for sentence, label in zip(ds["sentence"], ds["label"], strict=True):
            assert sentence.endswith(".")
            clause = sentence[:-1].split(", but ")[-1]  # with a contrast, the second clause decides
            words = clause.split()
            adjective = words[-1]
            assert adjective in positive | negative, sentence
            negated = bool({"not", "never", "hardly"} & set(words))
            expected = int((adjective in positive) != negated)
            assert label == expected, (split, sentence, label)
            seen[(adjective in positive, negated)] += 1
    # every combination occurs, so negation really flips labels in the data
    assert set(seen) == {(True, False), (True, True), (False, False), (False, True)}
    assert sum(n for (_, negated), n in seen.items() if negated) > 300


def test_demo_task_loads_through_load_raw(compose):
    task = compose(["task=demo"]).task
    raw, labels, enc = load_encoded(task)
    assert labels == ["negative", "positive"]
    assert (len(raw["train"]), len(raw["validation"])) == (2000, 500)
    assert enc["train"]["labels"] == demo_splits()["train"]["label"]
