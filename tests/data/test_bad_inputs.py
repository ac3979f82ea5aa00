"""Fault injection, inputs: hostile command-line values, malformed data files, bad labels and answers, a data
file rewritten behind the cache's back, out-of-range config values. Each test asserts what the user sees (the
exit code or exception, a message naming the file/line/key and the fix) and that nothing went on silently."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import yaml

from ampft.config import ConfigError
from ampft.data import prepare_data
from ampft.data.load import DataError
from ampft.tasks import family_for
from ampft.tasks.classification.data import load_raw
from ampft.validation import validate
from tests.helpers import ROOT, TINY, compose_config, shared


@pytest.fixture(autouse=True)
def _own_datasets_cache(tmp_path, monkeypatch):
    """datasets' Arrow cache per test: nothing read here comes from (or goes to) ~/.cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


def _run(args: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)


# ---------------------------------------------------------------------------------------------------------
# 1. Command-line values never reach a shell (or make) unquoted

HOSTILE = [  # distinct keys: a key given twice on make's command line keeps its last value only
    "optim.lr=1e-4';touch {x}1;'",  # the reported case: a quote breaks out of the Makefile's quoting
    "task.name=$(shell touch {x}2)",  # make's own function syntax
    "task.dataset=`touch {x}3`",
    "task.subset=$(touch {x}4) a;b",
    'model.name="it\'s #1 \\"q\\" \\\\ $$HOME ${{HOME}}"',
    'benchmark.extra=["a=b","c d"]',  # list values with quotes keep working
    "benchmark.accuracy.overrides=[trainer.max_steps=5,'optim.lr=1e-4']",
    "task.text_fields=[a,b]",
]


@pytest.fixture
def argv_dump(tmp_path):
    """A PYTHON for make that prints the argv it gets as JSON instead of running anything."""
    script = tmp_path / "argv.py"
    script.write_text("import json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    return f"{sys.executable} {script}"


@pytest.mark.parametrize(("target", "prefix", "suffix"), [
    ("finetune", ["-m", "ampft.launch", "--dry-run"], []),
    ("print-config", ["recipes/finetune.py"], ["--cfg", "job", "--resolve"]),
    ("evaluate", ["recipes/eval.py"], []),
])
def test_make_passes_hostile_values_verbatim_and_runs_nothing(tmp_path, argv_dump, target, prefix, suffix):
    x = tmp_path / "pwned"
    values = [v.format(x=x) for v in HOSTILE]
    proc = _run(["make", "-s", "--no-print-directory", target, f"PYTHON={argv_dump}", *values,
                 f"nproc=2';touch {x}5;'", f"dry_run=$(shell touch {x}6)", f"run=$(shell touch {x}7)",
                 f"ARGS=-m precision=fp32,bf16 k=$(touch {x}8) `touch {x}9`"])
    assert proc.returncode == 0, proc.stderr
    argv = json.loads(proc.stdout)
    assert argv[:len(prefix)] == prefix and argv[len(argv) - len(suffix):] == suffix
    rest = argv[len(prefix):len(argv) - len(suffix)]
    expected = {*values, f"run=$(shell touch {x}7)", f"distributed.num_processes=2';touch {x}5;'"}
    assert set(rest[:len(expected)]) == expected  # make lists the variables in its own order
    assert rest[len(expected):] == ["-m", "precision=fp32,bf16", "k=$(touch", f"{x}8)", "`touch", f"{x}9`"]
    assert not list(tmp_path.glob("pwned*"))


def test_a_make_variable_name_is_make_s_business_and_what_it_became_is_refused(tmp_path):
    """What docs/configuration.md says: whether make expands a variable *name* depends on make itself (GNU make
    4.3 does, before it reads any Makefile, so no Makefile can stop the $(shell ...) in it; other builds may not);
    whatever the name became reaches Hydra and is refused."""
    x = tmp_path / "by-make"
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "Makefile").write_text("all:\n\t@true\n")
    assert _run(["make", "-s", "-C", str(empty), f"a$(shell touch {x})=1"]).returncode == 0
    make_expands_names = x.exists()  # make's own doing (or not), with a Makefile that does nothing
    x.unlink(missing_ok=True)
    proc = _run(["make", "-s", "--no-print-directory", "finetune", f"x$(shell touch {x})=1"])
    assert x.exists() == make_expands_names  # the Makefile adds nothing to what make itself does
    assert proc.returncode == 2
    assert "error: 1 problem(s) in the config: x" in proc.stderr and "Traceback" not in proc.stderr


def test_make_rejects_a_line_break_in_a_value(tmp_path, argv_dump):
    x = tmp_path / "pwned"
    proc = _run(["make", "-s", "finetune", f"PYTHON={argv_dump}", f"task.name=a\n';touch {x};'"])
    assert proc.returncode != 0
    assert "line break" in proc.stderr and proc.stdout == ""
    assert not x.exists()


def test_hostile_value_reaches_hydra_intact_or_is_rejected(tmp_path):
    x = tmp_path / "pwned"
    name = f"it's; $(touch {x}) `touch {x}`"
    proc = _run(["make", "-s", "--no-print-directory", "print-config", f"PYTHON={sys.executable}",
                 f'task.name="{name}"'])
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["task"]["name"] == name  # Hydra got the double-quoted string as typed
    proc = _run(["make", "-s", "--no-print-directory", "print-config", f"PYTHON={sys.executable}",
                 f"optim.lr=1e-4';touch {x};'"])
    assert proc.returncode != 0 and "optim.lr=1e-4';touch" in proc.stderr  # Hydra's parse error names it
    assert not x.exists()


# ---------------------------------------------------------------------------------------------------------
# 2. Malformed rows: an error naming the file, the line and the field counts

def _csv_task(train: Path, validation: Path, *overrides: str):
    return compose_config("finetune", ["task=csv", f"task.train_file={train}", f"task.validation_file={validation}",
                                       *overrides]).task


def _tsv(path: Path, rows: list[str]) -> Path:
    path.write_text("".join(r + "\n" for r in rows), encoding="utf-8")
    return path


GOOD = ["sentence\tlabel", "a fine case\tpos", "the screen died\tneg", "works well\tpos", "broken\tneg"]


@pytest.mark.parametrize(("bad_line", "found"), [("12\ta good one\tpos", 3), ("no label here", 1)])
def test_tsv_row_with_a_wrong_field_count_is_an_error_with_file_and_line(tmp_path, bad_line, found):
    train = _tsv(tmp_path / "train.tsv", [*GOOD[:3], bad_line, *GOOD[3:]])
    dev = _tsv(tmp_path / "dev.tsv", GOOD)
    with pytest.raises(DataError) as err:
        load_raw(_csv_task(train, dev))
    msg = str(err.value)
    assert f"task.train_file={train}" in msg and "line 4 " in msg
    assert f"has {found} fields where the header (the first line) has 2" in msg and "fix the line" in msg


def test_csv_row_with_an_unquoted_comma_is_an_error_but_quoted_commas_and_newlines_are_fine(tmp_path):
    good = tmp_path / "good.csv"
    good.write_text('sentence,label\n"a fine, sturdy case",pos\n"two\nlines",neg\n\nok,pos\n')
    raw = load_raw(_csv_task(good, good))
    assert raw["train"]["sentence"] == ["a fine, sturdy case", "two\nlines", "ok"]
    bad = tmp_path / "bad.csv"
    bad.write_text('sentence,label\n"two\nlines",neg\na fine, sturdy case,pos\n')
    with pytest.raises(DataError, match=r"task.validation_file=.*bad.csv: line 4 has 3 fields .* has 2.*quote"):
        load_raw(_csv_task(good, bad))


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_megabyte_line_is_read_whole_and_its_row_still_checked(tmp_path, suffix):
    """The pre-check reads what the reader reads: a 1 MB field (past Python csv's 128 KiB default limit)."""
    import csv

    sep, big = ("," if suffix == ".csv" else "\t"), "word " * 200_000
    good = tmp_path / f"good{suffix}"
    good.write_text(f"sentence{sep}label\n{big}{sep}pos\nshort{sep}neg\n")
    limit = csv.field_size_limit()
    raw = load_raw(_csv_task(good, good))
    assert [len(x) for x in raw["train"]["sentence"]] == [len(big), 5]
    assert csv.field_size_limit() == limit  # the module's limit is put back
    bad = tmp_path / f"bad{suffix}"
    bad.write_text(f"sentence{sep}label\nshort{sep}neg\n{big}{sep}pos{sep}extra\n")
    with pytest.raises(DataError, match=rf"bad{suffix}: line 3 has 3 fields"):
        load_raw(_csv_task(good, bad))


def test_shifted_tsv_never_trains_end_to_end(tmp_path):
    """The reported case as the user runs it: an extra tab in most rows; exit 2, no model, the line named."""
    train = _tsv(tmp_path / "train.tsv", ["sentence\tlabel"] + [f"{i}\tsentence {i}\t{i % 2}" for i in range(20)])
    dev = _tsv(tmp_path / "dev.tsv", ["sentence\tlabel", "a\t0", "b\t1"])
    run_dir = tmp_path / "run"
    proc = _run([sys.executable, "recipes/finetune.py", *TINY, "task=csv", f"task.train_file={train}",
                 f"task.validation_file={dev}", "trainer.max_steps=2", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"task.train_file={train}: line 2 has 3 fields where the header (the first line) has 2" in proc.stderr
    assert not (run_dir / "model").exists() and not (run_dir / "summary.json").exists()


def test_jsonl_line_that_does_not_parse_is_named(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text('{"sentence": "good", "label": "pos"}\n{"sentence": "bad", "label": "neg"\n')
    with pytest.raises(DataError, match=r"train.jsonl: line 2 is not valid JSON .*one JSON object"):
        load_raw(_csv_task(train, train))


def test_jsonl_line_missing_a_key_is_named(tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text('{"sentence": "good", "label": "pos"}\n\n{"sentence": "bad"}\n')
    with pytest.raises(DataError, match=r"train.jsonl: line 3 lacks key\(s\) \['label'\] that line 1 has"):
        load_raw(_csv_task(train, train))


def test_json_array_files_are_read_and_a_row_missing_a_key_is_named(tmp_path):
    train = tmp_path / "train.json"
    train.write_text(json.dumps([{"sentence": "good", "label": "pos"}, {"sentence": "bad", "label": "neg"}]))
    assert load_raw(_csv_task(train, train))["validation"]["label"] == ["pos", "neg"]
    train.write_text(json.dumps([{"sentence": "good", "label": "pos"}, {"label": "neg"}]))
    with pytest.raises(DataError, match=r"train.json: row 2 of the JSON list lacks key\(s\) \['sentence'\]"):
        load_raw(_csv_task(train, train))


def test_conll_line_with_a_wrong_field_count_names_file_and_line(tmp_path):
    train = tmp_path / "train.txt"
    train.write_text("EU B-ORG\nrejects O\n\nGerman B-MISC\ncall\n")
    task = compose_config("finetune", ["task=conll2003", f"task.train_file={train}",
                                       f"task.validation_file={train}"]).task
    with pytest.raises(DataError, match=rf"task.train_file={train}: .*train.txt:5: malformed line 'call': 1 fields"):
        family_for(task.family).load(task)


def test_conll_tag_outside_task_labels_names_file_and_sentences(tmp_path):
    train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
    train.write_text("EU B-ORG\nrejects O\n\nGerman B-MISC\ncall O\n")
    dev.write_text("EU B-ORG\n\nMonday B-DATE\n\ncall O\n\nFriday B-DATE\n")
    task = compose_config("finetune", ["task=conll2003", f"task.train_file={train}",
                                       f"task.validation_file={dev}"]).task
    with pytest.raises(DataError, match=rf"task.validation_file={dev}: tag\(s\) \['B-DATE'\] not in the label list "
                                        r"\['O', .*\], in sentence\(s\) 2, 4 \(counted from 1\)"):
        family_for(task.family).load(task)


@pytest.mark.parametrize(("drop", "where"), [
    ("context", r"data\[0\].paragraphs\[0\], key 'context' missing"),
    ("answers", r"data\[0\].paragraphs\[0\].qas\[1\] \(id 'q2'\), key 'answers' missing"),
    ("answer_start", r"data\[0\].paragraphs\[0\].qas\[0\] \(id 'q1'\), ValueError: answers\[0\] needs a string 'text' and an integer"),
])
def test_squad_json_missing_a_key_names_where(tmp_path, drop, where):
    data = _squad([("q1", "Paris", 0), ("q2", "France", 19)])
    paragraph = data["data"][0]["paragraphs"][0]
    if drop == "context":
        del paragraph["context"]
    elif drop == "answers":
        del paragraph["qas"][1]["answers"]
    else:
        del paragraph["qas"][0]["answers"][0]["answer_start"]
    path = tmp_path / "train.json"
    path.write_text(json.dumps(data))
    task = compose_config("finetune", ["task=squad", f"task.train_file={path}", f"task.validation_file={path}"]).task
    with pytest.raises(DataError, match=rf"task.train_file={path}: .*not SQuAD JSON .*at {where}"):
        family_for(task.family).load(task)


# ---------------------------------------------------------------------------------------------------------
# 3. Labels: empty ones are errors; suspicious sets are warned about with the counts

def test_an_empty_data_file_is_said_to_be_empty(tmp_path):
    train = _tsv(tmp_path / "train.tsv", GOOD)
    for name in ("dev.csv", "dev.jsonl"):
        (tmp_path / name).write_text("")
        with pytest.raises(DataError, match=rf"task.validation_file={tmp_path / name}: the file is empty \(0 bytes\)"):
            load_raw(_csv_task(train, tmp_path / name))


def test_empty_label_is_an_error_naming_file_and_rows(tmp_path):
    train = _tsv(tmp_path / "train.tsv", [*GOOD, "no label\t", "blank label\t  "])
    with pytest.raises(DataError) as err:
        load_raw(_csv_task(train, _tsv(tmp_path / "dev.tsv", GOOD)))
    msg = str(err.value)
    assert f"task.train_file={train}: 2 empty label(s) in column 'label', row(s) 5, 6" in msg
    assert "Fill them in or remove those rows" in msg


def test_many_bad_rows_are_named_by_the_first_eight_and_a_count(tmp_path):
    train = _tsv(tmp_path / "train.tsv", [*GOOD, *(f"no label {i}\t" for i in range(11))])
    with pytest.raises(DataError) as err:
        load_raw(_csv_task(train, _tsv(tmp_path / "dev.tsv", GOOD)))
    assert "11 empty label(s) in column 'label', row(s) 5, 6, 7, 8, 9, 10, 11, 12 and 3 more (file line" \
        in str(err.value)


def test_mixed_integer_and_word_labels_are_warned_about_with_counts(tmp_path, caplog):
    rows = ["sentence\tlabel"] + [f"s{i}\t{['0', '1', 'neg', 'pos'][i % 4]}" for i in range(40)]
    train = _tsv(tmp_path / "train.tsv", rows)
    with caplog.at_level(logging.WARNING, logger="ampft.data.load"):
        load_raw(_csv_task(train, train))
    assert "labels mix integer-like and word values {'0': 10, '1': 10, 'neg': 10, 'pos': 10} (counts): 4 classes" \
        in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ampft.data.load"):
        load_raw(_csv_task(train, train, "task.labels=[0,1,neg,pos]"))  # said explicitly: no warning
    assert caplog.text == ""


def test_labels_differing_only_in_case_or_spaces_are_warned_about_with_counts(tmp_path, caplog):
    # "pos " (a trailing space from a spreadsheet) or "Pos" would be classes of their own, silently.
    rows = ["sentence\tlabel"] + [f"s{i}\t{['neg', 'pos', 'pos ', 'Neg'][i % 4]}" for i in range(40)]
    train = _tsv(tmp_path / "train.tsv", rows)
    with caplog.at_level(logging.WARNING, logger="ampft.data.load"):
        load_raw(_csv_task(train, train))
    assert ("labels differ only in case or surrounding spaces: ['Neg', 'neg'], ['pos', 'pos '] (counts "
            "{'Neg': 10, 'neg': 10, 'pos': 10, 'pos ': 10}): 4 classes") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ampft.data.load"):
        load_raw(_csv_task(train, train, "task.labels=[neg,pos,'pos ',Neg]"))  # said explicitly: no warning
    assert caplog.text == ""


def test_a_json_column_mixing_value_types_is_an_error_naming_the_column_and_rows(tmp_path):
    """datasets reads such a column untyped (its `Json` feature), which the label encoding cannot take."""
    rows = [{"sentence": "fine", "label": "pos"}, {"sentence": "broken", "label": "neg"},
            {"sentence": "works", "label": 1}, {"sentence": ["two", "texts"], "label": "pos"}]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as err:
        load_raw(_csv_task(train, train))
    assert (f"task.train_file={train}: column(s) ['sentence', 'label'] of the train split mix value types across "
            "rows ('sentence': string in row 1, list in row 4)") in str(err.value)

    # Strings that read as numbers next to numbers: datasets decodes the strings, the file says what they were.
    rows = [{"sentence": "a", "score": "3.5"}, {"sentence": "b", "score": "1"}, {"sentence": "c", "score": 2}]
    for name, text in (("train.jsonl", "".join(json.dumps(r) + "\n" for r in rows)), ("train.json", json.dumps(rows))):
        (tmp_path / name).write_text(text)
        with pytest.raises(DataError, match=r"\('score': string in row 1, number in row 3\)"):
            load_raw(_csv_task(tmp_path / name, tmp_path / name, "task.label_column=score"))


def test_a_rare_class_is_warned_about(tmp_path, caplog):
    rows = ["sentence\tlabel"] + [f"s{i}\t{'pos' if i % 2 else 'neg'}" for i in range(200)] + ["typo\tposs"]
    train = _tsv(tmp_path / "train.tsv", rows)
    with caplog.at_level(logging.WARNING, logger="ampft.data.load"):
        load_raw(_csv_task(train, train))
    assert "label(s) ['poss'] have very few examples next to the largest class (100)" in caplog.text
    assert "{'neg': 100, 'pos': 100, 'poss': 1}" in caplog.text


def test_balanced_real_data_gives_no_label_warning(tmp_path, caplog):
    sst2 = shared("sst2")
    with caplog.at_level(logging.WARNING, logger="ampft.data.load"):
        load_raw(_csv_task(sst2 / "train_first1000.tsv", sst2 / "dev.tsv"))
    assert caplog.text == ""


def test_labels_read_two_ways_are_an_error_unless_task_labels_says_how_they_map(tmp_path):
    """Train labels are words, validation labels integers: never silently taken as ids into the sorted names
    (which would flip every validation label here); an error naming both label sets and task.labels, and with
    task.labels the integers are ids into it."""
    train = _tsv(tmp_path / "train.tsv", ["sentence\tlabel", "much worse\tworse", "far better\tbetter",
                                          "worse again\tworse", "better now\tbetter"])
    dev = _tsv(tmp_path / "dev.tsv", ["sentence\tlabel", "bad\t0", "good\t1", "good too\t1"])
    with pytest.raises(DataError) as err:
        family_for("classification").load(_csv_task(train, dev, "task.metrics=[accuracy]"))
    msg = str(err.value)
    assert f"task.validation_file={dev}: labels [0, 1] in column 'label' are not the train split's label names " \
           "['better', 'worse']" in msg
    assert "task.labels=[better,worse] (then 0 = better, 1 = worse)" in msg
    raw, labels = family_for("classification").load(_csv_task(train, dev, "task.metrics=[accuracy]",
                                                              "task.labels=[worse,better]"))
    assert labels == ["worse", "better"]
    assert raw["validation"]["labels"] == [0, 1, 1] and raw["train"]["labels"] == [0, 1, 0, 1]


@pytest.mark.parametrize(("cell", "what"), [("", "1 empty label(s) in column 'label', row(s) 3"),
                                            ("high", "has non-numbers (or nan/inf) ['high'] in row(s) 3"),
                                            ("nan", "has non-numbers (or nan/inf) ['nan'] in row(s) 3")])
def test_bad_regression_label_is_an_error_with_the_row(tmp_path, cell, what):
    train = _tsv(tmp_path / "train.tsv", ["sentence\tlabel", "a\t0.5", "b\t4.0", f"c\t{cell}", "d\t1"])
    task = _csv_task(train, train, "task.family=regression", "task.metrics=[pearson]", "task.main_metric=pearson")
    with pytest.raises(DataError) as err:
        family_for(task.family).load(task)
    assert f"task.train_file={train}: " in str(err.value) and what in str(err.value)


# ---------------------------------------------------------------------------------------------------------
# 4. A data file rewritten with its mtime kept is not served from a stale cache

def test_rewrite_keeping_mtime_and_size_is_not_served_stale(tmp_path):
    tokenizer = _tokenizer()
    train = _tsv(tmp_path / "train.tsv", GOOD)
    dev = _tsv(tmp_path / "dev.tsv", GOOD)
    cfg = compose_config("finetune", ["model=tiny-bert", "task=csv", f"task.train_file={train}",
                                      f"task.validation_file={dev}", f"cache_dir={tmp_path / 'cache'}"])
    first = prepare_data(cfg, family_for("classification"), tokenizer, contextlib.nullcontext)
    # A file of the same size with other text and labels, put in place with the old mtime (as cp -p would).
    before = os.stat(train)
    other = _tsv(tmp_path / "other.tsv", [GOOD[0], "a fine case\tneg", "the wires fried\tpos", *GOOD[3:]])
    assert other.stat().st_size == before.st_size
    shutil.copyfile(other, train)
    os.utime(train, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (os.stat(train).st_mtime_ns, os.stat(train).st_size) == (before.st_mtime_ns, before.st_size)
    second = prepare_data(cfg, family_for("classification"), tokenizer, contextlib.nullcontext)
    assert second.cache_path != first.cache_path
    assert second.train["labels"][:2] == [0, 1] and first.train["labels"][:2] == [1, 0]
    assert "wires" in tokenizer.decode(second.train[1]["input_ids"])


def _tokenizer():
    from ampft.models import load_tokenizer

    return load_tokenizer(compose_config("finetune", ["model=tiny-bert"]).model)


# ---------------------------------------------------------------------------------------------------------
# 5. SQuAD answers whose answer_start misses the text

def _squad(qas: list[tuple[str, str, int]]) -> dict:
    context = "Paris is the capital of France, a country in Europe."
    return {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": i, "question": f"what {i}?", "answers": [{"text": t, "answer_start": s}]} for i, t, s in qas]}]}]}


def _squad_task(tmp_path: Path, qas, *overrides: str):
    path = tmp_path / "train.json"
    path.write_text(json.dumps(_squad(qas)))
    return compose_config("finetune", ["task=squad", f"task.train_file={path}", f"task.validation_file={path}",
                                       *overrides]).task


def test_misaligned_answers_past_the_threshold_are_an_error(tmp_path):
    task = _squad_task(tmp_path, [("q1", "Paris", 0), ("q2", "France", 20), ("q3", "Europe", 45)])
    with pytest.raises(DataError) as err:
        family_for(task.family).load(task)
    msg = str(err.value)
    assert "task.train_file=" in msg and "1 of 3 answered questions have an answer_start" in msg
    assert "ids ['q2']" in msg and "task.max_misaligned_answers=0.01" in msg


def test_misaligned_answers_within_the_threshold_are_warned_about(tmp_path, caplog):
    task = _squad_task(tmp_path, [("q1", "Paris", 0), ("q2", "France", 20), ("q3", "Europe", 45)],
                       "task.max_misaligned_answers=0.5")
    with caplog.at_level(logging.WARNING, logger="ampft.tasks.question_answering"):
        raw, _ = family_for(task.family).load(task)
    assert len(raw["train"]) == 3
    assert "1 of 3 answered questions" in caplog.text and "['q2']" in caplog.text


def test_squad_v1_questions_without_answers_are_counted_not_trained_as_no_answer_silently(tmp_path, caplog):
    """SQuAD v1.1 has an answer for every question: `answers: []` would train "no answer". Past the threshold a
    DataError naming the ids and task.version_2; within it a warning; under v2.0 they are its unanswerable
    questions."""
    doc = _squad([("q1", "Paris", 0), ("q2", "France", 24), ("q3", "Europe", 45)])
    doc["data"][0]["paragraphs"][0]["qas"][1]["answers"] = []
    path = tmp_path / "train.json"
    path.write_text(json.dumps(doc))

    def task(*overrides):
        return compose_config("finetune", ["task=squad", f"task.train_file={path}", f"task.validation_file={path}",
                                           *overrides]).task

    with pytest.raises(DataError) as err:
        family_for("question_answering").load(task())
    msg = str(err.value)
    assert f"task.train_file={path}: 1 of 3 questions have no answer (answers: [], ids ['q2'])" in msg
    assert "task.version_2=true (task=squad_v2)" in msg and "task.max_misaligned_answers=0.01" in msg
    with caplog.at_level(logging.WARNING):
        raw, _ = family_for("question_answering").load(task("task.max_misaligned_answers=0.5"))
    assert len(raw["train"]) == 3 and "1 of 3 questions have no answer" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        family_for("question_answering").load(task("task.version_2=true", "task.metrics=[squad_v2]"))
    assert "no answer" not in caplog.text


def test_empty_or_missing_texts_are_counted_warned_about_and_an_error_past_the_threshold(tmp_path, caplog):
    """An empty sentence (or a JSON null) trains as the empty string: named with its rows, a warning within
    task.max_empty_texts, a DataError past it; a QA question that is only spaces counts too."""
    rows = [{"sentence": f"sentence {i}", "label": "pos" if i % 2 else "neg"} for i in range(200)]
    rows[7]["sentence"] = None
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dev = _tsv(tmp_path / "dev.tsv", [*GOOD, " \tpos"])
    with caplog.at_level(logging.WARNING), pytest.raises(DataError) as err:  # dev: 1 of 5 rows, past 0.01
        load_raw(_csv_task(train, dev))
    assert f"task.train_file={train}: 1 of 200 rows have an empty or missing text in text field(s) ['sentence'], " \
           "row(s) 8; they would be trained and evaluated as the empty string (within task.max_empty_texts=0.01)" \
           in caplog.text
    assert f"task.validation_file={dev}: 1 of 5 rows have an empty or missing text" in str(err.value)
    assert "row(s) 5 (file line = row + 1, after the header)" in str(err.value)
    assert "task.max_empty_texts=0.01" in str(err.value)
    assert len(load_raw(_csv_task(train, dev, "task.max_empty_texts=0.25"))["validation"]) == 5
    doc = _squad([("q1", "Paris", 0), ("q2", "Europe", 45)])
    doc["data"][0]["paragraphs"][0]["qas"][1]["question"] = "   "
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(doc))
    squad = compose_config("finetune", ["task=squad", f"task.train_file={path}", f"task.validation_file={path}"]).task
    with pytest.raises(DataError, match=r"1 of 2 rows have an empty or missing text in question or context \(ids "
                                        r"\['q2'\]\)"):
        family_for("question_answering").load(squad)


def test_official_squad_dev_subset_has_no_misaligned_answers(caplog):
    path = shared("squad") / "expmrc-squad-dev.json"
    task = compose_config("finetune", ["task=squad", f"task.train_file={path}", f"task.validation_file={path}",
                                       "task.max_misaligned_answers=0"]).task
    with caplog.at_level(logging.WARNING):
        raw, _ = family_for(task.family).load(task)
    assert len(raw["train"]) == 501 and "answer_start" not in caplog.text


# ---------------------------------------------------------------------------------------------------------
# 6. Every field's range is checked in validate(), all problems at once, before anything is built

BAD_VALUES = [
    ("trainer.eval_batch_size=-1", "trainer.eval_batch_size=-1"),
    ("optim.betas=[2,3]", "optim.betas=[2.0, 3.0]"),
    ("optim.betas=[0.9]", "optim.betas=[0.9]"),
    ("optim.eps=0", "optim.eps=0.0"),
    ("optim.weight_decay=-0.1", "optim.weight_decay=-0.1"),
    ("optim.lr=nan", "optim.lr=nan"),
    ("optim.name=sgd", "optim.name=sgd"),
    ("trainer.max_grad_norm=-1", "trainer.max_grad_norm=-1.0"),
    ("trainer.seed=-3", "trainer.seed=-3"),
    ("trainer.length_chunks=0", "trainer.length_chunks=0"),
    ("trainer.length_chunk_cost=-1", "trainer.length_chunk_cost=-1"),
    ("trainer.epochs=inf", "trainer.epochs=inf"),
    ("scheduler.warmup_steps=-5", "scheduler.warmup_steps=-5"),
    ("task.max_train_samples=0", "task.max_train_samples=0"),
    ("task.max_eval_samples=-2", "task.max_eval_samples=-2"),
    ("task.labels=[pos,pos]", "task.labels=['pos', 'pos']"),
    ("task.label_column=''", "task.label_column="),
    ("task.max_misaligned_answers=2", "task.max_misaligned_answers=2.0"),
    ("precision.min_scale=0", "precision.min_scale=0.0"),
    ("precision.static_scale=-1", "precision.static_scale=-1.0"),
    ("precision.hysteresis=0", "precision.hysteresis=0"),
    ("distributed.main_process_port=70000", "distributed.main_process_port=70000"),
    ("distributed.reduce_bucket_size=0", "distributed.reduce_bucket_size=0"),
    ("distributed.stage3_param_persistence_threshold=-1", "distributed.stage3_param_persistence_threshold=-1"),
    ("logging.project=' '", "logging.project= "),
    ("model.name_or_path=''", "model.name_or_path="),
    ("cache_dir=''", "cache_dir="),
]


ONE_PER_KEY = list({o.split("=")[0]: (o, named) for o, named in reversed(BAD_VALUES)}.values())


@pytest.mark.parametrize(("override", "named"), BAD_VALUES)
def test_out_of_range_value_is_a_config_error_naming_the_key(override, named):
    with pytest.raises(ConfigError) as err:
        validate(compose_config("finetune", [override]))
    assert any(p.startswith(named + ":") and "must be" in p for p in err.value.problems), err.value.problems


def test_all_bad_values_are_reported_together():
    with pytest.raises(ConfigError) as err:
        validate(compose_config("finetune", [o for o, _ in ONE_PER_KEY]))
    for _, named in ONE_PER_KEY:
        assert any(p.startswith(named + ":") for p in err.value.problems), named


def test_bad_values_fail_before_data_or_model_loading(tmp_path):
    proc = _run([sys.executable, "recipes/finetune.py", *TINY, "trainer.eval_batch_size=-1", "optim.betas=[2,3]",
                 f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 2
    assert "trainer.eval_batch_size=-1: must be null (2 x batch_size) or >= 1" in proc.stderr
    assert "optim.betas=[2.0, 3.0]: must be two numbers in [0, 1)" in proc.stderr
    assert "Traceback" not in proc.stderr and "tokeniz" not in proc.stderr + proc.stdout
    assert not (tmp_path / "model").exists()


# ---------------------------------------------------------------------------------------------------------
# 7. Loss-scaling keys set under a precision without loss scaling are warned about

@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_fp16_keys_under_another_precision_are_warned_about(precision):
    warnings = validate(compose_config("finetune", [f"precision={precision}", "precision.init_scale=1024",
                                                    "precision.growth_interval=100"]))
    assert [w for w in warnings if "precision.init_scale=1024.0, precision.growth_interval=100: loss scaling is "
            f"for precision=fp16 only; precision={precision} ignores them" in w]


def test_fp16_keys_under_fp16_are_not_warned_about():
    warnings = validate(compose_config("finetune", ["precision=fp16", "precision.init_scale=1024"]))
    assert not [w for w in warnings if "loss scaling is for precision=fp16 only" in w]
