"""The task families' keys are checked before anything is built, each error naming the key and what works."""

from __future__ import annotations

import pytest

from ampft.config import ConfigError
from ampft.validation import metric_keys, validate


def problems(cfg) -> str:
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    return "\n".join(err.value.problems)


@pytest.mark.parametrize(("task", "family", "main"), [
    ("conll2003", "token_classification", "f1"),
    ("squad", "question_answering", "f1"),
    ("squad_v2", "question_answering", "f1"),
    ("stsb", "regression", "pearson"),
    ("mnli", "classification", "accuracy"),
])
def test_family_task_configs(compose, task, family, main):
    cfg = compose([f"task={task}"])
    validate(cfg)
    assert cfg.task.family == family and cfg.task.main_metric == main
    assert main in metric_keys(cfg.task)


def test_mnli_scores_matched_and_mismatched(compose):
    cfg = compose(["task=mnli"])
    assert (cfg.task.validation_split, list(cfg.task.extra_validation_splits)) == \
        ("validation_matched", ["validation_mismatched"])


def test_metric_results_are_what_main_metric_may_name(compose):
    cfg = compose(["task=conll2003"])
    assert metric_keys(cfg.task) == ["f1", "precision", "recall", "accuracy"]
    text = problems(compose(["task=conll2003", "task.main_metric=exact_match"]))
    assert "task.main_metric=exact_match" in text and "['f1', 'precision', 'recall', 'accuracy']" in text
    validate(compose(["task=squad", "checkpoint.metric=exact_match", "checkpoint.every=10", "checkpoint.keep_best=1"]))
    assert "checkpoint.metric=accuracy" in problems(compose(["task=squad", "checkpoint.metric=accuracy"]))


@pytest.mark.parametrize(("overrides", "needles"), [
    (["task=sst2", "task.metrics=[seqeval]", "task.main_metric=f1"],
     ["['seqeval']", "task.family=classification does not compute", "task.family=token_classification"]),
    (["task=sst2", "task.metrics=[pearson]", "task.main_metric=pearson"], ["task.family=regression"]),
    (["task=squad", "task.metrics=[squad_v2]"], ["task.metrics=[squad_v2] needs task.version_2=true"]),
    (["task=squad_v2", "task.metrics=[squad]"], ["task.version_2=true with task.metrics=[squad]"]),
    (["task=squad", "task.doc_stride=200"], ["task.doc_stride=200", "task.max_length/2 = 192"]),
    (["task=squad", "task.n_best=0", "task.max_answer_length=0"], ["task.n_best=0", "task.max_answer_length=0"]),
    (["task=squad", "task.text_fields=[question]"], ["task.text_fields=['question']", "[question, context]"]),
    (["task=squad", "task.labels=[a,b]"], ["task.labels is set for question answering"]),
    (["task=sst2", "task.text_fields=[sentence,label]"], ["task.text_fields=['sentence', 'label'] has "
                                                           "task.label_column=label: the model would read its label"]),
    (["task=conll2003", "task.text_fields=[tokens,pos_tags]"], ["task.family=token_classification needs one column"]),
    (["model=roberta-base", "task=squad", "task.max_length=600", "task.doc_stride=128"],
     ["task.max_length=600: model=roberta-base has 512 positions"]),
    (["model=bert-large", "task=conll2003", "task.max_length=1024"], ["model=bert-large has 512 positions"]),
])
def test_family_problems_name_the_key(compose, overrides, needles):
    text = problems(compose(overrides))
    for needle in needles:
        assert needle in text, f"{needle!r} not in:\n{text}"


def test_model_positions_limit(compose):
    validate(compose(["model=roberta-base", "task=squad", "task.max_length=512"]))  # 514 positions - 2
    # DeBERTa-v3's relative positions take longer inputs than its max_position_embeddings.
    validate(compose(["model=deberta-v3-base", "task=squad", "task.max_length=1024"]))


def test_local_files_are_checked_by_family(compose, tmp_path):
    tsv, conll, squad, jsonl = (tmp_path / n for n in ("a.tsv", "a.txt", "a.json", "a.jsonl"))
    for path in (tsv, conll, squad, jsonl):
        path.write_text("x")
    text = problems(compose(["task=conll2003", f"task.train_file={tsv}", f"task.validation_file={conll}"]))
    assert "task.train_file" in text and "'.tsv' for token classification" in text and "CoNLL" in text
    assert "validation_file" not in text
    text = problems(compose(["task=squad", f"task.train_file={jsonl}", f"task.validation_file={squad}"]))
    assert "'.jsonl' for question answering" in text and "SQuAD JSON" in text
    text = problems(compose(["task=sst2", f"task.train_file={conll}", f"task.validation_file={tsv}"]))
    assert "task.train_file" in text and "'.txt'" in text
    # With local files the extra validation splits are files, checked the same way.
    text = problems(compose(["task=conll2003", f"task.train_file={conll}", f"task.validation_file={conll}",
                             f"task.extra_validation_splits=[{tmp_path}/test.txt,{tsv}]"]))
    assert "task.extra_validation_splits[0]" in text and "test.txt: no such file" in text
    assert "task.extra_validation_splits[1]: " in text and "'.tsv'" in text
    # Named by their stems: those must not collide.
    text = problems(compose(["task=sst2", f"task.train_file={tsv}", f"task.validation_file={tsv}",
                             f"task.extra_validation_splits=[{tsv},{tmp_path}/a.csv]"]))
    assert "names ['a', 'a'] must be unique" in text


def test_no_data_message_names_the_family_files(compose):
    text = problems(compose(["task=conll2003", "task.dataset=null"]))
    assert "task=conll2003 has no data" in text and "CoNLL files" in text
