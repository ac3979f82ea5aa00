"""`make predict`: a saved run on a file without labels gives one row per input, in the input's order, equal to
what the exported model itself computes for that input alone; the GLUE server's files; bad and empty files
as DataErrors naming file and line; nothing the training run wrote is touched."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from transformers import (
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
)

from ampft.config import PredictConfig
from ampft.errors import DataError, EvaluationError
from ampft.evaluation.predictions import predict_saved
from ampft.finetune import reset_accelerate
from ampft.tasks.classification import glue
from tests.helpers import ROOT, shared


def _predict(**kwargs) -> dict:
    try:
        return predict_saved(OmegaConf.merge(OmegaConf.structured(PredictConfig), kwargs))
    finally:
        reset_accelerate()


def _rows(out: dict) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out["path"], "predictions.jsonl"))]


def _written(run_dir) -> list[str]:
    return sorted(p.name for p in (run_dir / "predictions").glob("*"))


def _md5s(run_dir) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*")) if p.is_file() and "predictions" not in p.relative_to(run_dir).parts}


# Inputs of very different lengths in no length order: batches run longest first, rows come back in file order.
SENTENCES = ["ok", "the battery lasts all day long and the screen is superb , but the case felt flimsy and it "
             "broke within a week", "service was quick", "the case felt flimsy", "superb",
             "the screen is superb and the battery lasts all day long . service was quick too", "it broke"]


def _length_ordered(lengths: list[int]) -> bool:
    return lengths == sorted(lengths, reverse=True)


def test_classification_rows_are_the_models_own_probabilities_in_file_order(family_run, tmp_path):
    run_dir = family_run("sst2")
    test = tmp_path / "test.tsv"  # GLUE's SST-2 test file layout: no label column
    test.write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, s in enumerate(SENTENCES)))
    before = _md5s(run_dir)
    out = _predict(run=str(run_dir), file=str(test))
    rows = _rows(out)
    assert _md5s(run_dir) == before  # the training run's files: not one byte changed
    # Named by the file: another test.tsv predicted with this run before (the fixture is shared) took final_test.
    assert re.fullmatch(str(run_dir / "predictions" / r"final_test(-\d+)?"), out["path"])
    assert out["samples"] == len(SENTENCES)
    assert [r["index"] for r in rows] == list(range(len(SENTENCES)))

    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    model = AutoModelForSequenceClassification.from_pretrained(run_dir / "model").eval()
    assert not _length_ordered([len(tokenizer(s)["input_ids"]) for s in SENTENCES])
    labels = [model.config.id2label[i] for i in range(model.config.num_labels)]
    for sentence, row in zip(SENTENCES, rows, strict=True):
        with torch.inference_mode():  # each input alone: no padding, no batch
            p = model(**tokenizer(sentence, truncation=True, max_length=128, return_tensors="pt")).logits[0].softmax(-1)
        assert row["label"] == labels[int(p.argmax())]
        assert list(row["probabilities"]) == labels == ["negative", "positive"]
        assert list(row["probabilities"].values()) == pytest.approx(p.tolist(), abs=1e-5)
    assert len({round(r["probabilities"]["positive"], 5) for r in rows}) > 1  # inputs differ: so do outputs

    # The same weights from the step-6 checkpoint, another batch size, bf16: each into its own folder.
    from_ckpt = _rows(_predict(checkpoint=str(run_dir / "checkpoints" / "step_6"), file=str(test)))
    assert [r["label"] for r in from_ckpt] == [r["label"] for r in rows]
    for a, b in zip(from_ckpt, rows, strict=True):
        assert list(a["probabilities"].values()) == pytest.approx(list(b["probabilities"].values()), abs=1e-5)
    batched = _rows(_predict(run=str(run_dir), file=str(test), batch_size=2))
    for a, b in zip(batched, rows, strict=True):
        assert list(a["probabilities"].values()) == pytest.approx(list(b["probabilities"].values()), abs=1e-5)
    bf16 = _predict(run=str(run_dir), file=str(test), precision="bf16")
    assert json.loads((run_dir / "predictions" / "final_test_precision-bf16" / "predict.json").read_text())[
        "precision"] == bf16["precision"] == "bf16"
    assert {"final_test", "final_test_batch-2", "final_test_precision-bf16", "step_6_test"} <= {
        p.name for p in (run_dir / "predictions").iterdir()}
    assert _md5s(run_dir) == before


def test_a_headerless_file_of_texts_alone_is_predicted_with_task_column_names(family_run, tmp_path):
    """A file to predict has no label column: task.column_names names the text columns only."""
    run_dir = family_run("sst2")
    test = tmp_path / "texts.tsv"
    test.write_text("".join(f"{s}\n" for s in SENTENCES))
    out = _predict(run=str(run_dir), file=str(test), task={"column_names": ["sentence"]})
    assert out["samples"] == len(SENTENCES)
    with_header = tmp_path / "with_header.tsv"
    with_header.write_text("sentence\n" + test.read_text())
    assert [r["probabilities"] for r in _rows(out)] == [r["probabilities"] for r in
                                                        _rows(_predict(run=str(run_dir), file=str(with_header)))]


def test_regression_rows_are_the_models_values(family_run, tmp_path):
    run_dir = family_run("stsb")
    pairs = [(s, SENTENCES[-1 - i]) for i, s in enumerate(SENTENCES)]
    test = tmp_path / "stsb-test.tsv"
    test.write_text("index\tsentence1\tsentence2\n" + "".join(f"{i}\t{a}\t{b}\n" for i, (a, b) in enumerate(pairs)))
    rows = _rows(_predict(run=str(run_dir), file=str(test)))
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    model = AutoModelForSequenceClassification.from_pretrained(run_dir / "model").eval()
    for (a, b), row in zip(pairs, rows, strict=True):
        with torch.inference_mode():
            value = model(**tokenizer(a, b, truncation=True, max_length=128, return_tensors="pt")).logits[0, 0]
        assert set(row) == {"index", "value"} and row["value"] == pytest.approx(float(value), abs=1e-5)


def test_ner_tags_each_word_by_its_first_subtoken_and_truncated_words_o(family_run, tmp_path):
    run_dir = family_run("ner")  # task.max_length=32: the long sentence is cut
    sentences = [["EU", "rejects", "German", "call"], ["Peter"], ["BRUSSELS", "1996-08-22", *["Blackburn"] * 40],
                 ["Peter", "Blackburn", "rejects", "Brussels"]]
    test = tmp_path / "words.txt"  # words only: one per line, a blank line between sentences
    test.write_text("".join("\n".join(s) + "\n\n" for s in sentences))
    rows = _rows(_predict(run=str(run_dir), file=str(test)))
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    model = AutoModelForTokenClassification.from_pretrained(run_dir / "model").eval()
    for words, row in zip(sentences, rows, strict=True):
        enc = tokenizer(words, is_split_into_words=True, truncation=True, max_length=32, return_tensors="pt")
        with torch.inference_mode():
            ids = model(**enc).logits[0].argmax(-1).tolist()
        first = {}
        for position, word in enumerate(enc.word_ids()):
            if word is not None:
                first.setdefault(word, position)
        expected = [model.config.id2label[ids[first[w]]] if w in first else "O" for w in range(len(words))]
        assert row["tokens"] == words and row["tags"] == expected
    assert len(rows[2]["tags"]) == 42 and set(rows[2]["tags"][30:]) == {"O"}  # cut by max_length: O, not dropped


def test_qa_answers_are_the_best_span_over_every_window(family_run, tmp_path):
    run_dir = family_run("squad")  # task.max_length=48, doc_stride=16: the long context spans several windows
    context = "Apollo 11 landed on the Moon in 1969. " + "The crew trained for years. " * 12
    questions = [("a", "When did Apollo 11 land?", context), ("b", "Who trained?", "The crew trained for years."),
                 ("c", "Where did it land?", context)]
    test = tmp_path / "questions.json"  # SQuAD JSON without answers
    test.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [{"context": c, "qas": [{"id": i, "question": q}]}
                                                                       for i, q, c in questions]}]}))
    rows = _rows(_predict(run=str(run_dir), file=str(test), **{"task": {"n_best": 64}}))  # every token a candidate
    assert [r["id"] for r in rows] == ["a", "b", "c"]
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    model = AutoModelForQuestionAnswering.from_pretrained(run_dir / "model").eval()
    for (_, question, ctx), row in zip(questions, rows, strict=True):
        enc = tokenizer(question, ctx, truncation="only_second", max_length=48, stride=16,
                        return_overflowing_tokens=True, return_offsets_mapping=True)
        best = (-np.inf, None, None)
        assert len(enc["input_ids"]) > 1 or ctx != context
        for w in range(len(enc["input_ids"])):  # each window alone, every span by brute force
            inputs = {k: torch.tensor([enc[k][w]]) for k in ("input_ids", "attention_mask", "token_type_ids")}
            with torch.inference_mode():
                out = model(**inputs)
            starts, ends = out.start_logits[0].numpy(), out.end_logits[0].numpy()
            ctx_tokens = [i for i, s in enumerate(enc.sequence_ids(w)) if s == 1]
            for s in ctx_tokens:
                for e in ctx_tokens:
                    if s <= e < s + 30 and starts[s] + ends[e] > best[0]:
                        p_start = np.exp(starts[s]) / np.exp(starts[ctx_tokens]).sum()
                        p_end = np.exp(ends[e]) / np.exp(ends[ctx_tokens]).sum()
                        offsets = enc["offset_mapping"][w]
                        best = (starts[s] + ends[e], ctx[offsets[s][0]:offsets[e][1]], p_start * p_end)
        assert row["answer"] == best[1] and row["score"] == pytest.approx(best[2], rel=1e-4)


def test_glue_format_writes_the_servers_file_with_the_test_files_index(family_run, tmp_path):
    run_dir = family_run("sst2")
    test = tmp_path / "test.tsv"
    test.write_text("index\tsentence\n" + "".join(f"{100 + i}\t{s}\n" for i, s in enumerate(SENTENCES)))
    out = _predict(run=str(run_dir), file=str(test), format="glue")
    rows = _rows(out)
    lines = (Path(out["path"]) / "SST-2.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == len(SENTENCES) + 1
    ids = {"negative": "0", "positive": "1"}  # SST-2's server reads label ids
    assert lines[1:] == [f"{100 + i}\t{ids[r['label']]}" for i, r in enumerate(rows)]
    assert out["files"] == ["predictions.jsonl", "SST-2.tsv"]

    stsb = family_run("stsb")
    pairs = tmp_path / "sts.tsv"
    pairs.write_text("index\tsentence1\tsentence2\n0\tit broke\tthe case felt flimsy\n1\tok\tsuperb\n")
    values = [r["value"] for r in _rows(_predict(run=str(stsb), file=str(pairs), format="glue"))]
    assert (stsb / "predictions" / "final_sts" / "STS-B.tsv").read_text() == (
        f"index\tprediction\n0\t{values[0]:.3f}\n1\t{values[1]:.3f}\n")


def test_glue_labels_and_file_names():
    assert glue.submission("rte", [{"label": "not_entailment"}, {"label": "entailment"}], [7, 8],
                           ["entailment", "not_entailment"]) == "index\tprediction\n7\tnot_entailment\n8\tentailment\n"
    assert glue.submission("cola", [{"label": "acceptable"}], [0], ["unacceptable", "acceptable"]) == (
        "index\tprediction\n0\t1\n")
    assert glue.submission("sst2", [{"label": "1"}], [0], ["0", "1"]) == "index\tprediction\n0\t1\n"  # ids as labels
    assert [glue.submission_file("mnli", f"glue/MNLI/{n}.tsv", ["entailment", "neutral", "contradiction"])
            for n in ("test_matched", "test_mismatched", "diagnostic")] == ["MNLI-m.tsv", "MNLI-mm.tsv", "AX.tsv"]
    assert glue.submission_file("qqp", "test.tsv", ["not_duplicate", "duplicate"]) == "QQP.tsv"
    with pytest.raises(EvaluationError, match="test_matched.tsv, test_mismatched.tsv, or diagnostic.tsv"):
        glue.submission_file("mnli", "mnli.tsv", None)
    with pytest.raises(EvaluationError, match=r"labels \['bad', 'good'\] are not GLUE's sst2 labels"):
        glue.submission_file("sst2", "test.tsv", ["bad", "good"])


def test_glue_format_for_a_task_outside_glue_is_refused_before_anything_runs(family_run, tmp_path):
    run_dir = family_run("ner")
    test = tmp_path / "words.txt"
    test.write_text("EU\nrejects\n")
    before = _written(run_dir)
    with pytest.raises(EvaluationError, match=r"format=glue: the run's task is 'conll2003', not a GLUE task"):
        _predict(run=str(run_dir), file=str(test), format="glue")
    assert _written(run_dir) == before


@pytest.mark.slow
@pytest.mark.data
def test_the_real_glue_test_files(family_run, tmp_path):
    """GLUE's SST-2 and RTE test files as distributed: every row predicted, the server's file complete."""
    sst2 = shared("sst2", "test.tsv")
    out = _predict(run=str(family_run("sst2")), file=str(sst2), format="glue")
    lines = (Path(out["path"]) / "SST-2.tsv").read_text().splitlines()
    assert out["samples"] == 1821 and lines[1:] == [f"{i}\t{v}" for i, v in
                                                    zip(range(1821), [x.split("\t")[1] for x in lines[1:]], strict=True)]
    assert {x.split("\t")[1] for x in lines[1:]} <= {"0", "1"}
    rte = shared("rte", "test.tsv")
    out = _predict(run=str(family_run("rte")), file=str(rte), format="glue")
    lines = (Path(out["path"]) / "RTE.tsv").read_text().splitlines()
    assert out["samples"] == 3000 == len(lines) - 1 and lines[1].startswith("0\t")
    assert {x.split("\t")[1] for x in lines[1:]} <= {"entailment", "not_entailment"}


def _bad(tmp_path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(path)


def test_bad_and_empty_files_are_data_errors_naming_file_and_line(family_run, tmp_path):
    cases = [
        ("sst2", _bad(tmp_path, "empty.tsv", ""), r"file=.*empty.tsv: the file is empty"),
        ("sst2", _bad(tmp_path, "blank.tsv", "\n  \n"), r"file=.*blank.tsv: the file is empty"),
        ("sst2", _bad(tmp_path, "header.tsv", "index\tsentence\n"), r"file=.*header.tsv: the file has no rows"),
        ("sst2", _bad(tmp_path, "shifted.tsv", "index\tsentence\n0\tok\n1\tbad\textra field\n"),
         r"file=.*shifted.tsv: line 3 has 3 fields where the header .* has 2"),
        ("sst2", _bad(tmp_path, "other.tsv", "index\treview\n0\tok\n"),
         r"file=.*other.tsv: column\(s\) \['sentence'\] not in the file, whose columns are \['index', 'review'\]"
         r".*task.text_fields="),
        ("sst2", _bad(tmp_path, "latin1.tsv", "sentence\nna\xefve\n".encode("latin-1")), r"file=.*latin1.tsv: not UTF-8"),
        ("sst2", str(tmp_path / "missing.tsv"), r"file=.*missing.tsv: no such file"),
        ("sst2", _bad(tmp_path, "words.txt", "a\n"), r"file=.*words.txt: unsupported extension '.txt'"),
        ("ner", _bad(tmp_path, "ragged.txt", "EU B-ORG\nrejects\n"), r"file=.*ragged.txt: not a CoNLL file: .*:2: "
                                                                     r"malformed line 'rejects': 1 fields where"),
        ("ner", _bad(tmp_path, "nothing.txt", "-DOCSTART- -X- O\n\n"), r"file=.*nothing.txt: no sentences"),
        ("squad", _bad(tmp_path, "broken.json", '{"data": [\n{"paragraphs": }]}'),
         r"file=.*broken.json: .*not valid JSON: .*line 2"),
        ("squad", _bad(tmp_path, "noid.json", json.dumps({"data": [{"paragraphs": [{"context": "c", "qas": [
            {"question": "q"}]}]}]})), r"file=.*noid.json: not SQuAD JSON .* at data\[0\].paragraphs\[0\].qas\[0\], "
                                       r"key 'id' missing"),
        ("squad", _bad(tmp_path, "twice.json", json.dumps({"data": [{"paragraphs": [{"context": "c", "qas": [
            {"id": "x", "question": "q"}, {"id": "x", "question": "r"}]}]}]})), r"question ids \['x'\] appear more"),
    ]
    for kind, path, message in cases:
        before = _written(family_run(kind))
        with pytest.raises(DataError, match=message):
            _predict(run=str(family_run(kind)), file=path)
        assert _written(family_run(kind)) == before, path  # nothing written for a refused file
    with pytest.raises(EvaluationError, match="file=PATH is needed"):
        _predict(run=str(family_run("sst2")))


def test_the_recipes_take_the_task_keys_of_a_file_and_refuse_others():
    """Composed as `make evaluate` and `make predict` compose their configs: task keys that describe a file are
    accepted (typed), a task key that is not one of them fails at compose time naming it."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    for recipe in ("evaluate", "predict"):
        with initialize_config_dir(config_dir=str(ROOT / "conf" / recipe), version_base="1.3"):
            cfg = compose(config_name=recipe, overrides=["run=r", "task.text_fields=[a,b]", "task.label_column=y",
                                                         "task.column_names=null", "task.max_length=64"])
            assert (cfg.task.text_fields, cfg.task.label_column, cfg.task.max_length) == (["a", "b"], "y", 64)
            assert cfg.task.doc_stride is None  # unset: the run's value
            for bad, says in (("task.family=x", "Key 'family' not in 'SavedRunTask'"),
                              ("task.max_length=long", "task.max_length")):
                with pytest.raises(ConfigCompositionException) as err:
                    compose(config_name=recipe, overrides=[bad])
                assert says in str(err.value.__cause__ or err.value)
    with initialize_config_dir(config_dir=str(ROOT / "conf" / "predict"), version_base="1.3"):
        assert compose(config_name="predict", overrides=["format=glue"]).format == "glue"


@pytest.mark.slow
def test_make_predict_as_the_readme_types_it(family_run, tmp_path):
    """`make predict ... format=glue`, and the task keys for a file whose columns are named otherwise (others are
    refused at once)."""
    run_dir = family_run("sst2")
    env = {**os.environ, "HYDRA_FULL_ERROR": "0"}

    def make(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["make", "--no-print-directory", "predict", f"run={run_dir}", *args,
                               f"PYTHON={sys.executable}"], cwd=ROOT, env=env, capture_output=True, text=True)

    test = tmp_path / "test.tsv"
    test.write_text("index\tsentence\n0\tsuperb\n1\tthe case felt flimsy and it broke\n")
    proc = make(f"file={test}", "format=glue")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 predictions" in proc.stdout and "SST-2.tsv" in proc.stdout
    written = Path(proc.stdout.split(" -> ")[-1].split("/predictions.jsonl")[0])  # the folder the recipe names
    assert (written / "SST-2.tsv").read_text().startswith("index\tprediction\n0\t")

    reviews = tmp_path / "reviews.csv"
    reviews.write_text("id,review\n0,superb\n1,the case felt flimsy and it broke within a week\n2,ok\n")
    proc = make(f"file={reviews}", "task.text_fields=[review]")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (run_dir / "predictions" / "final_reviews" / "predictions.jsonl").open()]
    assert [r["index"] for r in rows] == [0, 1, 2]
    proc = make(f"file={reviews}", "task.family=x")
    assert proc.returncode == 2 and "error: 1 problem(s) in the config: task.family: no such key" in proc.stderr


@pytest.mark.distributed
@pytest.mark.parametrize("kind", ["sst2", "ner", "squad"])
def test_two_ranks_predict_each_input_once_as_one_process_does(kind, family_run, tmp_path):
    """Under `accelerate launch` each rank predicts its share (an odd count: the last batch is padded across
    ranks and the padding dropped; NER/QA rows of another width on each rank): the rows are one process's."""
    run_dir = family_run(kind)
    if kind == "sst2":
        test = tmp_path / "test.tsv"
        test.write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, s in enumerate(SENTENCES)))
    elif kind == "ner":
        test = tmp_path / "words.txt"
        test.write_text("".join(f"{s}\n\n".replace(" ", "\n") for s in SENTENCES))
    else:
        test = tmp_path / "questions.json"
        context = "Apollo 11 landed on the Moon in 1969. " + "The crew trained for years. " * 12
        test.write_text(json.dumps({"data": [{"paragraphs": [{"context": context if i % 2 else s, "qas": [
            {"id": f"q{i}", "question": s}]} for i, s in enumerate(SENTENCES)]}]}))
    one = _rows(_predict(run=str(run_dir), file=str(test), batch_size=2))
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                           "recipes/predict.py", f"run={run_dir}", f"file={test}", "batch_size=2", "name=two-ranks"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = run_dir / "predictions" / "two-ranks"
    printed = [line for line in proc.stdout.splitlines() if " predictions (" in line]
    assert len(printed) == 1 and printed[0].endswith(f" -> {folder}/predictions.jsonl"), proc.stdout  # main's only
    two = [json.loads(x) for x in (folder / "predictions.jsonl").read_text().splitlines()]
    assert json.loads((folder / "predict.json").read_text())["num_processes"] == 2
    assert len(two) == len(one) == len(SENTENCES)
    for a, b in zip(two, one, strict=True):
        for key, value in b.items():
            assert a[key] == (pytest.approx(value, abs=1e-5) if isinstance(value, float | dict) else value), key
